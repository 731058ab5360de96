// KV events from NATS: the router subscribes to the worker component's event subjects
// (`namespace.{ns}.component.{comp}.kv-events`, the older `kv_events`, and every endpoint's
// `…component.{comp}.endpoint.{e}.kv-events`) and hands every
// message to its shard untouched: a RouterEvent or the event-plane envelope around one, in
// MessagePack (what current Dynamo workers publish) or JSON (Dynamo's first event plane, and
// `kv-router mocker` engines). O(1) main-thread work per message (ShardPool.push). Worker load metrics (`kv_metrics`, namespace
// scope) are decoded here, as they are few and small.
//
// The connection reconnects forever; losing it is visible in `connected` (readiness) and in the
// counters, and nothing needs a restart. A start against an unreachable server fails with an
// error naming the URL.
import { kvEventSubjects, kvMetricsSubject } from './dynamo-names.js'
import type { NatsConnection, Subscription } from 'nats'
import { EventEmitter } from 'node:events'
import type { ShardPool } from '../shards/pool.js'
import { urlList } from '../core/endpoints.js'
import { KvrError } from '../errors.js'
import { parseJsonExact, readU64 } from '../codec/json.js'
import { limited } from '../runtime/log.js'

export interface NatsIntakeOptions {
  url: string
  namespace: string
  component: string
  pool: ShardPool
  /** Client name shown by the server. */
  name?: string
  /** Messages queued behind full rings above which the intake counts itself a slow consumer. */
  slowConsumerBacklog?: number
  connectTimeoutMs?: number
  /** Subscribe to the KV-event subjects (false: worker load only, the index being remote). */
  kvEvents?: boolean
}

/** A worker's load as it publishes it on `kv_metrics`, reduced to what routing uses. */
export interface WorkerLoad {
  workerId: bigint
  dpRank: number
  activeBlocks: number | null
  totalBlocks: number | null
  requestsWaiting: number | null
}

export interface NatsIntakeCounters {
  messages: number
  bytes: number
  metricsMessages: number
  metricsMalformed: number
  disconnects: number
  reconnects: number
  slowConsumer: number
  errors: number
}

const NAME_RE = /^[A-Za-z0-9_-]+$/

export class NatsIntake extends EventEmitter {
  readonly counters: NatsIntakeCounters = {
    messages: 0,
    bytes: 0,
    metricsMessages: 0,
    metricsMalformed: 0,
    disconnects: 0,
    reconnects: 0,
    slowConsumer: 0,
    errors: 0,
  }
  private subs: Subscription[] = []
  private isUp = true
  private slow = false

  private constructor(
    private readonly nc: NatsConnection,
    private readonly opts: NatsIntakeOptions,
  ) {
    super()
  }

  static async start(opts: NatsIntakeOptions): Promise<NatsIntake> {
    for (const [k, v] of [
      ['namespace', opts.namespace],
      ['component', opts.component],
    ] as const) {
      if (!NAME_RE.test(v)) throw new KvrError('KVR_ERR_INVALID_OPTION', `${k} must match ${NAME_RE.source}, got "${v}"`)
    }
    // loaded here, not at startup: a router without NATS (the default) need not load the client
    const { connect } = await import('nats')
    let nc: NatsConnection
    try {
      nc = await connect({
        servers: urlList(opts.url),
        name: opts.name ?? 'kv-router',
        maxReconnectAttempts: -1,
        reconnectTimeWait: 250,
        timeout: opts.connectTimeoutMs ?? 5000,
      })
    } catch (err) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot connect to NATS at ${opts.url}: ${(err as Error).message}`, { cause: err })
    }
    const intake = new NatsIntake(nc, opts)
    intake.subscribe()
    void intake.watchStatus()
    return intake
  }

  /** The connection, shared with the durable intake (src/transport/durable.ts). */
  get connection(): NatsConnection {
    return this.nc
  }

  /** True while connected; false from a disconnect until the client has reconnected. */
  get connected(): boolean {
    return this.isUp && !this.nc.isClosed()
  }

  private subscribe(): void {
    const { pool } = this.opts
    const backlog = this.opts.slowConsumerBacklog ?? 10_000
    const c = this.counters
    for (const subject of this.opts.kvEvents === false ? [] : kvEventSubjects(this.opts.namespace, this.opts.component)) {
      this.subs.push(
        this.nc.subscribe(subject, {
          callback: (err, msg) => {
            if (err !== null) {
              c.errors++
              limited.warn('nats_error', { subject, error: err.message }, 'a NATS subscription reported an error')
              return
            }
            c.messages++
            c.bytes += msg.data.length
            if (!pool.offer(msg.data) && pool.pendingMessages > backlog && !this.slow) {
              // Core NATS cannot be paused: the backlog waits here, counted, until the shards
              // catch up ('drain'); past the pool's maxPendingBytes, offer() drops and counts
              this.slow = true
              c.slowConsumer++
              limited.warn(
                'nats_slow_consumer',
                { pending_messages: pool.pendingMessages, pending_bytes: pool.pendingBytes },
                'KV events arrive faster than the shards apply them: they wait in memory, and past 256 MiB are dropped',
              )
              this.emit('slowConsumer', pool.pendingMessages)
              pool.once('drain', () => (this.slow = false))
            }
          },
        }),
      )
    }
    const metrics = kvMetricsSubject(this.opts.namespace)
    this.subs.push(
      this.nc.subscribe(metrics, {
        callback: (err, msg) => {
          if (err !== null) {
            c.errors++
            limited.warn('nats_error', { subject: metrics, error: err.message }, 'a NATS subscription reported an error')
            return
          }
          c.metricsMessages++
          const load = parseLoadEvent(msg.data)
          if (load === null) {
            c.metricsMalformed++
            limited.warn('nats_metrics_malformed', { subject: metrics, bytes: msg.data.length }, "a worker's load report (kv_metrics) did not decode: skipped")
          } else this.emit('load', load)
        },
      }),
    )
  }

  private watchStatus(): Promise<void> {
    return watchNatsStatus(this.nc, {
      disconnected: (server) => {
        this.counters.disconnects++
        this.isUp = false
        limited.warn('nats_disconnected', { server }, 'the NATS connection is lost: KV events and load reports stop until it is back; reconnecting')
        this.emit('disconnected')
      },
      reconnected: (server) => {
        this.counters.reconnects++
        this.isUp = true
        limited.info('nats_reconnected', { server }, 'the NATS connection is back')
        this.emit('reconnected')
      },
      error: (error) => {
        this.counters.errors++
        limited.warn('nats_error', { error }, 'the NATS client reported an error')
      },
    })
  }

  async close(): Promise<void> {
    for (const s of this.subs) s.unsubscribe()
    // drain() can give up without closing when the server is gone, and the client's reconnect
    // loop would then keep the process alive: always close after it
    if (!this.nc.isClosed()) await this.nc.drain().catch(() => undefined)
    if (!this.nc.isClosed()) await this.nc.close().catch(() => undefined)
  }
}

const dec = new TextDecoder()

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : null
}

/**
 * `LoadEvent { worker_id, data: ForwardPassMetrics }` or the newer `ActiveLoad` shape; null when
 * it is neither. Worker ids are read from the text so ids above 2^53 stay exact.
 */
export function parseLoadEvent(bytes: Uint8Array): WorkerLoad | null {
  // the top-level worker_id, exactly: a pattern over the text would take `1.9` as worker 1, or
  // an id nested in another member
  let obj: Record<string, unknown>
  let workerId: bigint
  try {
    const v = parseJsonExact(dec.decode(bytes))
    if (typeof v !== 'object' || v === null || Array.isArray(v)) return null
    obj = v as Record<string, unknown>
    workerId = readU64(obj['worker_id'], 'worker_id')
  } catch {
    return null
  }
  const data = obj['data'] as Record<string, unknown> | undefined
  if (data !== undefined && typeof data === 'object' && data !== null) {
    const ws = (data['worker_stats'] ?? {}) as Record<string, unknown>
    const ks = (data['kv_stats'] ?? {}) as Record<string, unknown>
    return {
      workerId,
      dpRank: num(ws['data_parallel_rank']) ?? 0,
      activeBlocks: num(ks['kv_active_blocks']),
      totalBlocks: num(ks['kv_total_blocks']),
      requestsWaiting: num(ws['num_requests_waiting']),
    }
  }
  if ('active_decode_blocks' in obj) {
    return { workerId, dpRank: num(obj['dp_rank']) ?? 0, activeBlocks: num(obj['active_decode_blocks']), totalBlocks: null, requestsWaiting: null }
  }
  return null
}

/** What a NATS connection's owner does when the connection is lost, when it is back, and on a client error. */
export interface NatsStatusHandlers {
  disconnected(server: string): void
  reconnected(server: string): void
  error?(error: string): void
}

/** Calls `on` for each of the connection's status changes, until it closes. */
export async function watchNatsStatus(nc: NatsConnection, on: NatsStatusHandlers): Promise<void> {
  // listening before the await: a change the client reports meanwhile is not missed
  const changes = nc.status()
  const { Events } = await import('nats')
  for await (const s of changes) {
    if (s.type === Events.Disconnect) on.disconnected(String(s.data))
    else if (s.type === Events.Reconnect) on.reconnected(String(s.data))
    else if (s.type === Events.Error) on.error?.(String(s.data))
  }
}
