// Worker discovery through etcd, as Dynamo does it. A worker process holds an etcd lease (its id is the
// worker id) and writes two keys under it; when it dies the lease expires and both vanish:
//
//   v1/instances/{ns}/{component}/{endpoint}/{worker_id as hex}
//     { "http_url": "http://10.0.0.5:8000", "device_type": "cuda" }        (also "transport": {"http": …})
//     optionally the engine's own KV-event publisher (vLLM, SGLang), as POST /v1/workers names it:
//     "kv_events_endpoint": "tcp://10.0.0.5:5557", "replay_endpoint": "tcp://10.0.0.5:5558",
//     "kv_events_topic": "kv-events"
//   v1/mdc/{ns}/{component}/{endpoint}/{worker_id as hex}
//     { "kv_cache_block_size": 64,
//       "runtime_config": { "total_kv_blocks": 16384, "max_num_batched_tokens": 8192,
//                           "data_parallel_size": 1, "data_parallel_start_rank": 0 } }
//
// The worker id is read from the key (hex), never from a JSON number, so ids above 2^53 stay
// exact. A worker is routable once its instance key exists; the model card adds its runtime
// config when present. Start lists both prefixes, then watches them from the listed revision;
// after a lost connection the watch resumes and a full re-list reconciles anything missed
// (removals of vanished workers, additions and changes), so a restarted etcd is caught up with.
//
// The kv-events fields belong to the instance record, not the card: they say where this process
// publishes, like its URL. Fields that are not valid leave the worker registered without events
// (it is still routable), counted and warned about once per value.
import { cardsPrefix, instancesPrefix } from './dynamo-names.js'
import type { Etcd3, IKeyValue } from 'etcd3'
import { EventEmitter } from 'node:events'
import { engineEventsSpec, RECORD_FIELDS, urlList } from '../core/endpoints.js'
import type { EngineEventsSpec } from '../core/endpoints.js'
import { isKvrError, KvrError, Warn } from '../errors.js'
import { parseInstanceAddress } from '../request-plane/address.js'
import { limited, log } from '../runtime/log.js'

export interface EtcdDiscoveryOptions {
  url: string
  namespace: string
  component: string
  endpoint: string
  dialTimeoutMs?: number
}

/**
 * The etcd3 client's hosts and password auth for a --etcd-url value. Credentials in a URL
 * (`http://user:password@host:2379`) are etcd's user and password: handed over as the URL, the
 * client would take them for part of the host name, and its errors would show them.
 */
export function etcdConnection(url: string): { hosts: string[]; auth?: { username: string; password: string } } {
  let auth: { username: string; password: string } | undefined
  const hosts = urlList(url).map((h) => {
    try {
      const u = new URL(h)
      if (u.username === '' && u.password === '') return h
      auth ??= { username: decodeURIComponent(u.username), password: decodeURIComponent(u.password) }
      u.username = ''
      u.password = ''
      return u.href.replace(/\/$/, '')
    } catch {
      return h
    }
  })
  return auth === undefined ? { hosts } : { hosts, auth }
}

export interface DiscoveredWorker {
  workerId: bigint
  url: string
  deviceType: 'cpu' | 'gpu'
  blockSize: number | null
  totalKvBlocks: number | null
  maxNumBatchedTokens: number | null
  dpStart: number
  dpSize: number
  /** The engine's own KV-event publisher, rank r on port + r; null without one or when invalid. */
  kvEvents: EngineEventsSpec | null
  /** Its Dynamo TCP request-plane address (`host:port/…`), or null without a valid one. */
  requestPlane: string | null
  /** The model its card names (`display_name`), or null. */
  model: string | null
}

interface Parts {
  instance?: Record<string, unknown>
  card?: Record<string, unknown>
}

function nonNegInt(v: unknown): number | null {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0 ? v : null
}

const ETCD_FIELDS = { ...RECORD_FIELDS, dpSize: 'data_parallel_size' }

/**
 * The TCP request-plane address of an instance record, `"transport":{"tcp":"host:port/…"}`
 * (Dynamo's TransportType, snake_case: lib/runtime/src/component.rs@01207e79), in either form:
 * `host:port/{endpoint}` or `host:port/{instance_id:x}/{endpoint}`. Null when the record names
 * another transport; throws KVR_ERR_INSTANCE_ADDRESS for a `tcp` value that is not an address.
 */
export function instanceTcpAddress(inst: Record<string, unknown>): string | null {
  const transport = inst['transport']
  if (typeof transport !== 'object' || transport === null) return null
  const tcp = (transport as Record<string, unknown>)['tcp']
  if (tcp === undefined) return null
  if (typeof tcp !== 'string') throw new KvrError('KVR_ERR_INSTANCE_ADDRESS', `transport.tcp must be a string, got ${JSON.stringify(tcp)}`)
  const a = parseInstanceAddress(tcp)
  return `${a.hostPort}/${a.endpointPath}`
}

/**
 * The worker record of one worker's keys, or null while its instance key is missing or bad.
 * Invalid kv-events fields are left out, and `invalid` is told why.
 */
export function toWorker(workerId: bigint, parts: Parts, invalid?: (why: string) => void, badTcp?: (why: string) => void): DiscoveredWorker | null {
  const inst = parts.instance
  if (inst === undefined) return null
  const transport = inst['transport'] as Record<string, unknown> | undefined
  const http = inst['http_url'] ?? (typeof transport === 'object' && transport !== null ? transport['http'] : undefined)
  const hasHttp = typeof http === 'string' && /^https?:\/\//.test(http)
  let requestPlane: string | null = null
  try {
    requestPlane = instanceTcpAddress(inst)
  } catch (err) {
    if (!isKvrError(err, 'KVR_ERR_INSTANCE_ADDRESS')) throw err
    badTcp?.(err.message)
  }
  // a worker reached only over the request plane has no URL ('')
  if (!hasHttp && requestPlane === null) return null
  const url = hasHttp ? (http as string) : ''
  const device = String(inst['device_type'] ?? 'gpu').toLowerCase()
  // current Dynamo wraps the card in a DiscoveryInstance::Model record, under card_json
  const record = parts.card ?? {}
  const wrapped = record['card_json']
  const card = typeof wrapped === 'object' && wrapped !== null && !Array.isArray(wrapped) ? (wrapped as Record<string, unknown>) : record
  const rc = (card['runtime_config'] ?? {}) as Record<string, unknown>
  const dpSize = Math.max(1, nonNegInt(rc['data_parallel_size']) ?? 1)
  let kvEvents: EngineEventsSpec | null = null
  try {
    kvEvents = engineEventsSpec({ endpoint: inst['kv_events_endpoint'], replay: inst['replay_endpoint'], topic: inst['kv_events_topic'] }, dpSize, ETCD_FIELDS)
  } catch (err) {
    if (!isKvrError(err, 'KVR_ERR_INVALID_ENDPOINT')) throw err
    invalid?.(err.message)
  }
  const name = card['display_name']
  return {
    workerId,
    url,
    requestPlane,
    model: typeof name === 'string' && name !== '' ? name : null,
    deviceType: device === 'cpu' ? 'cpu' : 'gpu',
    blockSize: nonNegInt(card['kv_cache_block_size']),
    totalKvBlocks: nonNegInt(rc['total_kv_blocks']),
    maxNumBatchedTokens: nonNegInt(rc['max_num_batched_tokens']),
    dpStart: nonNegInt(rc['data_parallel_start_rank']) ?? 0,
    dpSize,
    kvEvents,
  }
}

function sameWorker(a: DiscoveredWorker, b: DiscoveredWorker): boolean {
  return (
    a.url === b.url &&
    a.deviceType === b.deviceType &&
    a.blockSize === b.blockSize &&
    a.totalKvBlocks === b.totalKvBlocks &&
    a.maxNumBatchedTokens === b.maxNumBatchedTokens &&
    a.dpStart === b.dpStart &&
    a.dpSize === b.dpSize &&
    a.kvEvents?.endpoint === b.kvEvents?.endpoint &&
    a.kvEvents?.replay === b.kvEvents?.replay &&
    a.kvEvents?.topic === b.kvEvents?.topic &&
    a.requestPlane === b.requestPlane &&
    a.model === b.model
  )
}

export interface EtcdDiscoveryEvents {
  added: [DiscoveredWorker]
  updated: [DiscoveredWorker]
  removed: [bigint]
}

export class EtcdDiscovery extends EventEmitter {
  /** Current workers by id. */
  readonly workers = new Map<bigint, DiscoveredWorker>()
  /**
   * `bad_kv_events`: workers whose kv-events fields turned invalid (each warned about once);
   * `bad_tcp_address`: records whose `transport.tcp` is not an address (their worker query stays on HTTP).
   */
  readonly counters = { puts: 0, deletes: 0, resyncs: 0, disconnects: 0, malformed: 0, bad_kv_events: 0, bad_tcp_address: 0 }
  /** Per worker, why its kv-events fields are invalid, while they are. */
  private readonly badKvEvents = new Map<bigint, string>()
  private parts = new Map<bigint, Parts>()
  private client: Etcd3
  private watchers: { cancel(): Promise<void> }[] = []
  private up = true
  private readonly instances: string
  private readonly cards: string
  private closed = false

  private constructor(opts: EtcdDiscoveryOptions, client: Etcd3) {
    super()
    this.client = client
    this.instances = instancesPrefix(opts.namespace, opts.component, opts.endpoint)
    this.cards = cardsPrefix(opts.namespace, opts.component, opts.endpoint)
  }

  static async start(opts: EtcdDiscoveryOptions): Promise<EtcdDiscovery> {
    // loaded here, not at startup: a router that does not use etcd (the default) starts sooner
    // and smaller without the etcd client and its gRPC stack
    const { Etcd3 } = await import('etcd3')
    const d = new EtcdDiscovery(opts, new Etcd3({ ...etcdConnection(opts.url), dialTimeout: opts.dialTimeoutMs ?? 3000 }))
    let revision: string
    try {
      revision = await d.resync()
    } catch (err) {
      d.client.close()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot reach etcd at ${opts.url}: ${(err as Error).message}`, { cause: err })
    }
    await d.watch(revision)
    return d
  }

  get connected(): boolean {
    return this.up
  }

  private idOf(key: string): { id: bigint; kind: keyof Parts } | null {
    const kind: keyof Parts | null = key.startsWith(this.instances) ? 'instance' : key.startsWith(this.cards) ? 'card' : null
    if (kind === null) return null
    const rest = key.slice(kind === 'instance' ? this.instances.length : this.cards.length)
    // the card key may carry a LoRA suffix after the id
    const hex = rest.split('/')[0] ?? ''
    if (!/^[0-9a-fA-F]{1,16}$/.test(hex)) return null
    return { id: BigInt(`0x${hex}`), kind }
  }

  private parse(kv: IKeyValue): { id: bigint; kind: keyof Parts; value: Record<string, unknown> } | null {
    const where = this.idOf(kv.key.toString())
    if (where === null) return null
    try {
      const value = JSON.parse(kv.value.toString()) as unknown
      if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('not an object')
      return { ...where, value: value as Record<string, unknown> }
    } catch (err) {
      this.counters.malformed++
      limited.warn(
        'etcd_malformed',
        { key: kv.key.toString(), error: (err as Error).message },
        'an etcd record under the discovery prefixes is not a JSON object: skipped',
      )
      return null
    }
  }

  /** Recomputes one worker from its parts and emits what changed. */
  private refresh(id: bigint): void {
    const parts = this.parts.get(id)
    const bad = { why: null as string | null }
    const next =
      parts === undefined
        ? null
        : toWorker(
            id,
            parts,
            (why) => (bad.why = why),
            (why) => {
              this.counters.bad_tcp_address++
              limited.warn('etcd_bad_tcp_address', { worker_id: id.toString(), error: why }, 'an instance record names a TCP address kv-router cannot read')
            },
          )
    const prev = this.workers.get(id)
    this.noteKvEvents(id, next === null ? null : bad.why)
    if (next === null) {
      if (prev !== undefined) {
        this.workers.delete(id)
        this.emit('removed', id)
      }
      return
    }
    this.workers.set(id, next)
    if (prev === undefined) this.emit('added', next)
    else if (!sameWorker(prev, next)) this.emit('updated', next)
  }

  /** Counts and warns about a worker's invalid kv-events fields once per value; valid ones forget it. */
  private noteKvEvents(id: bigint, why: string | null): void {
    if (why === null) {
      this.badKvEvents.delete(id)
      return
    }
    if (this.badKvEvents.get(id) === why) return
    this.badKvEvents.set(id, why)
    this.counters.bad_kv_events++
    log.warn({ code: Warn.KVR_KV_EVENTS_INVALID, worker_id: id.toString() }, `worker ${id} from etcd is registered without its engine's KV events: ${why}`)
  }

  /** Lists both prefixes and reconciles; returns the revision the listing reflects. */
  async resync(): Promise<string> {
    const [inst, cards] = await Promise.all([this.client.getAll().prefix(this.instances).exec(), this.client.getAll().prefix(this.cards).exec()])
    const fresh = new Map<bigint, Parts>()
    for (const kv of [...(inst.kvs ?? []), ...(cards.kvs ?? [])]) {
      const p = this.parse(kv)
      if (p === null) continue
      const parts = fresh.get(p.id) ?? {}
      parts[p.kind] = p.value
      fresh.set(p.id, parts)
    }
    const ids = new Set([...this.parts.keys(), ...fresh.keys()])
    this.parts = fresh
    for (const id of ids) this.refresh(id)
    this.counters.resyncs++
    const rev = BigInt(inst.header?.revision ?? 0)
    const rev2 = BigInt(cards.header?.revision ?? 0)
    return String(rev > rev2 ? rev : rev2)
  }

  private async watch(revision: string): Promise<void> {
    const next = String(BigInt(revision) + 1n)
    for (const prefix of [this.instances, this.cards]) {
      const w = await this.client.watch().prefix(prefix).startRevision(next).create()
      w.on('put', (kv) => {
        this.counters.puts++
        const p = this.parse(kv)
        if (p === null) return
        const parts = this.parts.get(p.id) ?? {}
        parts[p.kind] = p.value
        this.parts.set(p.id, parts)
        this.refresh(p.id)
      })
      w.on('delete', (kv) => {
        this.counters.deletes++
        const where = this.idOf(kv.key.toString())
        if (where === null) return
        const parts = this.parts.get(where.id)
        if (parts === undefined) return
        delete parts[where.kind]
        if (parts.instance === undefined && parts.card === undefined) this.parts.delete(where.id)
        this.refresh(where.id)
      })
      w.on('disconnected', () => {
        if (this.up) {
          this.counters.disconnects++
          limited.warn('etcd_disconnected', {}, 'the etcd watch lost its connection: workers that come or go meanwhile are seen when it is back')
        }
        this.up = false
        this.emit('disconnected')
      })
      w.on('connected', () => {
        if (this.up || this.closed) return
        this.up = true
        // whatever happened while we were away: list again and reconcile
        this.resync().then(
          () => {
            limited.info('etcd_reconnected', { workers: this.workers.size }, 'the etcd watch is back; the workers were listed again')
            this.emit('reconnected')
          },
          (err: unknown) => limited.warn('etcd_error', { error: (err as Error).message }, 'listing the workers in etcd again failed'),
        )
      })
      w.on('error', (err: Error) => limited.warn('etcd_error', { error: err.message }, 'the etcd watch reported an error'))
      this.watchers.push(w)
    }
  }

  async close(): Promise<void> {
    this.closed = true
    await Promise.all(this.watchers.map((w) => w.cancel().catch(() => undefined)))
    this.client.close()
  }
}
