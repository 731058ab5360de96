// Where an engine's KV events and load reports go. Four transports here, one interface (a fifth,
// vLLM's own ZMQ publisher, is zmq-publisher.ts):
//   - in process: a callback (the embedded fleet of `kv-router serve`, tests);
//   - HTTP ingest: POST /v1/kv-events on a router, batched, strictly in order;
//   - NATS: Dynamo's subjects, the exact subjects and shapes the router's
//     src/transport/nats.ts subscribes to and decodes (its helpers name the subjects here too);
//   - JetStream (--durable-kv-events): Dynamo's durable stream, which the router reads with
//     --router-durable-kv-events (src/transport/durable.ts).
// Delivery is at most once on the first three, as on a NATS core subject: a router that is away
// loses events, and the engine's event ring (event-ring.ts) is what a router recovers them from.
// The stream keeps them, each exactly once and in order.
import { randomBytes } from 'node:crypto'
import type { JetStreamClient, NatsConnection } from 'nats'
import { encodeRouterEvent } from '../../codec/events.js'
import type { RouterEvent } from '../../codec/events.js'
import { KvrError } from '../../errors.js'
import type { EngineLoad } from './engine.js'
import { LoadReports } from './load-reports.js'
import type { LoadReportOptions } from './load-reports.js'

export interface EventPublisher {
  /** `tokens`: a Stored event's token ids (see BlockPoolSink), for publishers whose wire carries them. */
  publish(ev: RouterEvent, tokens?: Uint32Array): void
  /** Resolves once everything published so far has been handed over. */
  flush(): Promise<void>
  close(): Promise<void>
}

/** In-process delivery. */
export class CallbackPublisher implements EventPublisher {
  constructor(private readonly fn: (ev: RouterEvent) => void) {}
  publish(ev: RouterEvent): void {
    this.fn(ev)
  }
  async flush(): Promise<void> {}
  async close(): Promise<void> {}
}

/**
 * Events queued and handed over by one send loop at a time, so they leave in order; whatever
 * piles up while it sends is taken by the same loop.
 */
abstract class QueuedPublisher<T> implements EventPublisher {
  protected outbox: T[] = []
  /** Set while a run of sends fails: the first failure of a run is told, the rest are not. */
  protected failing = false
  private sending: Promise<void> | null = null

  abstract publish(ev: RouterEvent): void

  async flush(): Promise<void> {
    while (this.sending !== null) await this.sending
  }

  async close(): Promise<void> {
    await this.flush()
  }

  protected enqueue(item: T): void {
    this.outbox.push(item)
    this.sending ??= this.drain()
  }

  /** Sends what the outbox holds until it is empty (or there is nowhere left to send). */
  protected abstract send(): Promise<void>

  private async drain(): Promise<void> {
    try {
      await this.send()
    } finally {
      this.sending = null
    }
  }
}

export interface HttpEventPublisherOptions {
  routerUrl: string
  apiKey?: string
  /** Events per POST at most. */
  batch?: number
  /** Told once per run of failures (the router is away, or refuses the events). */
  onError?: (message: string) => void
}

/**
 * POSTs events to a router's /v1/kv-events as JSON arrays, one request at a time so the router
 * sees them in order; whatever piles up during a request goes in the next one.
 */
export class HttpEventPublisher extends QueuedPublisher<string> {
  private readonly url: string
  private readonly headers: Record<string, string>
  /** Events the router accepted, and events lost to failed POSTs. */
  delivered = 0
  lost = 0

  constructor(private readonly o: HttpEventPublisherOptions) {
    super()
    this.url = `${o.routerUrl.replace(/\/+$/, '')}/v1/kv-events`
    this.headers = { 'content-type': 'application/json' }
    if (o.apiKey !== undefined) this.headers.authorization = `Bearer ${o.apiKey}`
  }

  publish(ev: RouterEvent): void {
    this.enqueue(encodeRouterEvent(ev))
  }

  protected async send(): Promise<void> {
    while (this.outbox.length > 0) {
      const batch = this.outbox.splice(0, this.o.batch ?? 512)
      let problem: string | null = null
      try {
        const res = await fetch(this.url, { method: 'POST', headers: this.headers, body: `[${batch.join(',')}]` })
        if (!res.ok) problem = `the router answered ${res.status} to ${batch.length} KV event(s): ${(await res.text()).slice(0, 200)}`
        else await res.arrayBuffer()
      } catch (err) {
        problem = `cannot post KV events to ${this.url}: ${(err as Error).message}`
      }
      if (problem === null) {
        this.delivered += batch.length
        this.failing = false
      } else {
        this.lost += batch.length
        if (!this.failing) this.o.onError?.(problem)
        this.failing = true
      }
    }
  }
}

const utf8 = new TextEncoder()

/** NATS connection with endless reconnects; an unreachable server at start is a KvrError naming it. */
export async function connectNats(url: string, name = 'kv-router-mocker'): Promise<NatsConnection> {
  // loaded on first use, as the router's intake does (src/transport/nats.ts); outside the try, so a
  // broken install is not reported as an unreachable server
  const { connect } = await import('nats')
  try {
    return await connect({ servers: url, name, maxReconnectAttempts: -1, reconnectTimeWait: 250, timeout: 5000 })
  } catch (err) {
    throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot connect to NATS at ${url}: ${(err as Error).message}`, { cause: err })
  }
}

export class NatsEventPublisher implements EventPublisher {
  constructor(
    private readonly nc: NatsConnection,
    readonly subject: string,
  ) {}
  publish(ev: RouterEvent): void {
    // while reconnecting, the client buffers; once closed, events have nowhere to go
    if (!this.nc.isClosed()) this.nc.publish(this.subject, utf8.encode(encodeRouterEvent(ev)))
  }
  async flush(): Promise<void> {
    if (!this.nc.isClosed()) await this.nc.flush()
  }
  async close(): Promise<void> {
    await this.flush().catch(() => undefined)
  }
}

/**
 * Events into the durable stream, as a Dynamo worker started with --durable-kv-events publishes
 * them (a RouterEvent JSON per message on `{stream}.queue`). Each is stored before the next is
 * sent, and sent again until it is, under a message id the server de-duplicates on: none lost,
 * none twice, in order, across a server restart. Given up only once the connection is closed.
 */
export class JetStreamEventPublisher extends QueuedPublisher<{ id: string; data: Uint8Array }> {
  private head = 0
  /** Distinguishes this publisher's message ids from an earlier run's with the same event ids. */
  private readonly run = randomBytes(6).toString('hex')
  /** Events the stream stored, and sends that failed and were retried. */
  delivered = 0
  retries = 0

  constructor(
    private readonly nc: NatsConnection,
    private readonly js: JetStreamClient,
    readonly subject: string,
    private readonly onError?: (message: string) => void,
  ) {
    super()
  }

  publish(ev: RouterEvent): void {
    this.enqueue({ id: `${this.run}:${ev.worker_id}:${ev.event.dp_rank}:${ev.event.event_id}`, data: utf8.encode(encodeRouterEvent(ev)) })
  }

  protected async send(): Promise<void> {
    while (this.head < this.outbox.length && !this.nc.isClosed()) {
      const m = this.outbox[this.head] as { id: string; data: Uint8Array }
      try {
        await this.js.publish(this.subject, m.data, { msgID: m.id, timeout: 2000 })
      } catch (err) {
        this.retries++
        if (!this.failing) this.onError?.(`cannot store a KV event in ${this.subject} (retrying): ${(err as Error).message}`)
        this.failing = true
        await new Promise((r) => setTimeout(r, 100))
        continue
      }
      this.failing = false
      this.delivered++
      this.head++
      if (this.head > 1024 && this.head * 2 > this.outbox.length) {
        this.outbox = this.outbox.slice(this.head)
        this.head = 0
      }
    }
  }
}

/** Dynamo's `LoadEvent { worker_id, data: ForwardPassMetrics }` as JSON text. */
export function loadEventJson(l: EngineLoad): string {
  const usage = l.totalBlocks > 0 ? l.activeBlocks / l.totalBlocks : 0
  return (
    `{"worker_id":${l.workerId},"data":{"worker_stats":{"data_parallel_rank":0,"request_active_slots":${l.running},"request_total_slots":` +
    `${l.maxNumSeqs},"num_requests_waiting":${l.waiting}},` +
    `"kv_stats":{"kv_active_blocks":${l.activeBlocks},"kv_total_blocks":${l.totalBlocks},"gpu_cache_usage_perc":${usage},` +
    `"gpu_prefix_cache_hit_rate":${l.prefixHitRate}},"spec_decode_stats":null}}`
  )
}

export type LoadPublisherOptions = LoadReportOptions

/** kv_metrics for one engine on NATS: a report whenever active blocks or the waiting count change (load-reports.ts says when). */
export class LoadPublisher {
  private readonly reportsOf: LoadReports

  constructor(
    private readonly nc: NatsConnection,
    readonly subject: string,
    load: () => EngineLoad,
    o: LoadPublisherOptions = {},
  ) {
    this.reportsOf = new LoadReports(
      load,
      (l) => `${l.activeBlocks}/${l.waiting}`,
      (l) => {
        if (this.nc.isClosed()) return false
        this.nc.publish(this.subject, utf8.encode(loadEventJson(l)))
        return true
      },
      o,
    )
  }

  get reports(): number {
    return this.reportsOf.reports
  }

  /** The engine's state may have changed (called after every step). */
  update(): void {
    this.reportsOf.update()
  }

  close(): void {
    this.reportsOf.close()
  }
}
