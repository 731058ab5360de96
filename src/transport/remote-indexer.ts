// The client of a shared remote index (`--indexer-url`): a `kv-router indexer` or Dynamo's
// standalone indexer (`python -m dynamo.indexer`), whose HTTP API this speaks. Each route decision
// asks POST /query_by_hash with the prompt's local block hashes under a deadline; one keep-alive
// pool per URL, and a URL that fails is skipped for a backoff period while the next one is tried
// within the same deadline. A query that gets no answer in time returns null: the route path then
// routes on the local index (approximate: the router's own predictions), so the indexer is never
// on the availability path. The workers the router knows with ZMQ endpoints are registered with
// every indexer (POST /register), again whenever one comes back, since a restarted one forgets them.
//
// Wire facts (Dynamo lib/kv-router/src/services/indexer/server.rs, services/overlap.rs):
// - block_hashes are i64: a u64 local hash is written as its two's-complement signed value;
// - the answer keys worker ids and dp ranks as decimal strings (lossless above 2^53) and counts
//   matched TOKENS (blocks × the indexer's block size), not blocks;
// - instances[w].cpu / .disk are cumulative through the tiers before them, per worker (the
//   largest over its ranks), not per rank.
import { Pool } from 'undici'
import type { Registry } from 'prom-client'
import { Counter, Gauge, Histogram } from 'prom-client'
import type { OverlapResult } from '../shards/pool.js'
import type { EngineEventsSpec } from '../core/endpoints.js'
import { limited, log } from '../runtime/log.js'

/** A worker as the indexer is told of it. */
export interface IndexedWorker {
  id: bigint
  dpRanks: number
  kvEvents: EngineEventsSpec
}

export interface RemoteIndexerOptions {
  urls: readonly string[]
  /** Deadline of one query, all URLs tried included. */
  timeoutMs: number
  modelName: string
  routingGroup?: string
  blockSize: number
  /** How long a failing URL is skipped; also the period of the health probe. */
  backoffMs?: number
  registry?: Registry
}

export type QueryResult = 'ok' | 'timeout' | 'error' | 'unavailable'

interface Target {
  url: string
  pool: Pool
  /** performance.now() until which the URL is skipped; 0 = usable. */
  downUntil: number
  /** The last health probe or query succeeded. */
  up: boolean
  /** Up since it was last (re)told of the workers. */
  registered: boolean
  /** Queries in a row that missed their deadline. */
  lateInARow: number
}

/**
 * Deadlines missed in a row before a URL is skipped for its backoff. One late answer is a slow
 * moment of a busy indexer, not a dead one: skipping it for a second would route a second's
 * decisions on predictions, and telling it the workers again would load it further.
 */
const LATE_BEFORE_DOWN = 3

const EMPTY = new Uint32Array(0)

/** Decimal text of a u64 given as halves, signed (i64) when `signed`: no BigInt on the way. */
export function u64Text(lo: number, hi: number, signed: boolean): string {
  let neg = false
  if (signed && hi >= 0x80000000) {
    // two's complement magnitude: ~v + 1
    neg = true
    lo = ~lo >>> 0
    hi = ~hi >>> 0
    lo = (lo + 1) >>> 0
    if (lo === 0) hi = (hi + 1) >>> 0
  }
  // v = hi·2^32 + lo = hi·4294·10^6 + (hi·967296 + lo): both parts stay below 2^53
  const low = hi * 967296 + lo
  const high = hi * 4294 + Math.floor(low / 1e6)
  const d0 = low % 1e6
  const s = high === 0 ? String(d0) : String(high) + String(d0).padStart(6, '0')
  return neg ? '-' + s : s
}

/** The halves of a worker id written in decimal (a JSON object key). */
function idHalves(key: string, out: Uint32Array, at: number, hiOut: Uint32Array): boolean {
  if (!/^[0-9]{1,20}$/.test(key)) return false
  if (key.length <= 15) {
    const v = Number(key)
    out[at] = v % 4294967296
    hiOut[at] = Math.floor(v / 4294967296)
    return true
  }
  const v = BigInt(key)
  if (v > 0xffffffffffffffffn) return false
  out[at] = Number(v & 0xffffffffn)
  hiOut[at] = Number(v >> 32n)
  return true
}

function tokens(v: unknown): number {
  return typeof v === 'number' && Number.isFinite(v) && v > 0 ? v : 0
}

/**
 * An indexer's /query or /query_by_hash answer as an OverlapResult in blocks of `blockSize`.
 * Worker-ranks with nothing matched on any tier are left out. A worker's host and disk overlaps
 * are given to its rank when it has one rank; a worker of several ranks gets them per rank only
 * as far as its device overlap (the answer does not say which rank holds the lower tiers).
 * Returns null for an answer of the wrong shape.
 */
export function parseIndexerAnswer(text: string, blockSize: number): OverlapResult | null {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    return null
  }
  if (typeof body !== 'object' || body === null) return null
  const scores = (body as { scores?: unknown }).scores
  const instances = (body as { instances?: unknown }).instances
  if (typeof scores !== 'object' || scores === null || Array.isArray(scores)) return null
  const inst = typeof instances === 'object' && instances !== null && !Array.isArray(instances) ? (instances as Record<string, unknown>) : null
  // ranks per worker: from scores (device), and from instances[w].dp for workers matched only on lower tiers
  const ranks = new Map<string, Record<string, unknown>>()
  for (const [w, r] of Object.entries(scores as Record<string, unknown>)) {
    if (typeof r !== 'object' || r === null || Array.isArray(r)) return null
    ranks.set(w, r as Record<string, unknown>)
  }
  if (inst !== null) {
    for (const [w, s] of Object.entries(inst)) {
      if (ranks.has(w) || typeof s !== 'object' || s === null) continue
      const dp = (s as { dp?: unknown }).dp
      if (typeof dp === 'object' && dp !== null && !Array.isArray(dp)) ranks.set(w, dp as Record<string, unknown>)
    }
  }
  let count = 0
  for (const r of ranks.values()) count += Object.keys(r).length
  const lo = new Uint32Array(count)
  const hi = new Uint32Array(count)
  const dpRank = new Uint32Array(count)
  const overlap = new Uint32Array(count)
  const host = new Uint32Array(count)
  const disk = new Uint32Array(count)
  let lower = false
  let k = 0
  for (const [w, r] of ranks) {
    const summary = inst?.[w] as { cpu?: unknown; disk?: unknown } | undefined
    const keys = Object.keys(r)
    const cpuTokens = tokens(summary?.cpu)
    const diskTokens = tokens(summary?.disk)
    for (const rank of keys) {
      if (!/^[0-9]{1,10}$/.test(rank) || Number(rank) > 0xffffffff) return null
      if (!idHalves(w, lo, k, hi)) return null
      const dev = Math.floor(tokens(r[rank]) / blockSize)
      let h = dev
      let d = dev
      if (keys.length === 1) {
        h = Math.max(dev, Math.floor(cpuTokens / blockSize))
        d = Math.max(h, Math.floor(diskTokens / blockSize))
      }
      if (dev === 0 && d === 0) continue
      dpRank[k] = Number(rank)
      overlap[k] = dev
      host[k] = h
      disk[k] = d
      if (d > dev) lower = true
      k++
    }
  }
  const out: OverlapResult = {
    count: k,
    workerIdLo: lo.subarray(0, k),
    workerIdHi: hi.subarray(0, k),
    dpRank: dpRank.subarray(0, k),
    overlap: overlap.subarray(0, k),
    // the answer has no tree sizes (older servers' tree_sizes is gone from the newest)
    treeSize: k === 0 ? EMPTY : new Uint32Array(k),
    recoveringShards: [],
  }
  if (lower) {
    out.overlapHost = host.subarray(0, k)
    out.overlapDisk = disk.subarray(0, k)
  }
  return out
}

/** The body of POST /query_by_hash for the first n local block hashes. */
export function queryByHashBody(lo: Uint32Array, hi: Uint32Array, n: number, modelName: string, routingGroup: string): string {
  const parts: string[] = new Array<string>(n)
  for (let i = 0; i < n; i++) parts[i] = u64Text(lo[i] as number, hi[i] as number, true)
  return `{"block_hashes":[${parts.join(',')}],"model_name":${JSON.stringify(modelName)},"routing_group":${JSON.stringify(routingGroup)}}`
}

/** The bodies of POST /register for a worker: one per dp rank, rank r on port + r as vLLM offsets them. */
export function registerBodies(w: IndexedWorker, modelName: string, routingGroup: string, blockSize: number): string[] {
  const out: string[] = []
  const offset = (endpoint: string, r: number): string => {
    const u = new URL(endpoint)
    return `tcp://${u.hostname.includes(':') ? `[${u.hostname}]` : u.hostname}:${Number(u.port) + r}`
  }
  for (let r = 0; r < w.dpRanks; r++) {
    let s =
      `{"instance_id":${w.id},"endpoint":${JSON.stringify(offset(w.kvEvents.endpoint, r))},"model_name":${JSON.stringify(modelName)},` +
      `"routing_group":${JSON.stringify(routingGroup)},"block_size":${blockSize},"dp_rank":${r}`
    if (w.kvEvents.replay !== null) s += `,"replay_endpoint":${JSON.stringify(offset(w.kvEvents.replay, r))}`
    out.push(s + '}')
  }
  return out
}

export class RemoteIndexer {
  private readonly targets: Target[]
  private readonly routingGroup: string
  private readonly backoffMs: number
  private readonly workers = new Map<bigint, IndexedWorker>()
  private readonly probe: NodeJS.Timeout
  private closed = false
  /** Queries by result, for the status page and tests. */
  readonly counts: Record<QueryResult, number> = { ok: 0, timeout: 0, error: 0, unavailable: 0 }
  private readonly latency: Histogram<'result'> | null
  private lastResult: QueryResult | null = null

  constructor(private readonly o: RemoteIndexerOptions) {
    this.routingGroup = o.routingGroup ?? 'default'
    this.backoffMs = o.backoffMs ?? 1000
    this.targets = o.urls.map((url) => ({
      url,
      // keep-alive connections: a query costs one round trip, not a handshake
      pool: new Pool(url, { connections: 16, pipelining: 1, keepAliveTimeout: 60_000, connectTimeout: Math.max(100, o.timeoutMs * 5) }),
      downUntil: 0,
      up: false,
      registered: false,
      lateInARow: 0,
    }))
    this.latency = o.registry === undefined ? null : this.registerMetrics(o.registry)
    this.probe = setInterval(() => void this.probeAll(), this.backoffMs)
    this.probe.unref()
    void this.probeAll()
  }

  private registerMetrics(reg: Registry): Histogram<'result'> {
    const counts = this.counts
    new Counter({
      name: 'kvrouter_indexer_queries_total',
      help: 'overlap queries to the remote indexer by result (ok; timeout, error, unavailable: routed on the local approximate index)',
      labelNames: ['result'],
      registers: [reg],
      collect() {
        this.reset()
        for (const r of ['ok', 'timeout', 'error', 'unavailable'] as const) this.inc({ result: r }, counts[r])
      },
    })
    const targets = this.targets
    new Gauge({
      name: 'kvrouter_indexer_up',
      help: 'remote indexer URLs answering (health probe or last query), by url',
      labelNames: ['url'],
      registers: [reg],
      collect() {
        this.reset()
        for (const t of targets) this.set({ url: t.url }, t.up ? 1 : 0)
      },
    })
    return new Histogram({
      name: 'kvrouter_indexer_query_seconds',
      help: 'time of one overlap query to the remote indexer, failovers included, by result',
      labelNames: ['result'],
      buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25],
      registers: [reg],
    })
  }

  /** Some URL answered its last probe or query. */
  get reachable(): boolean {
    return this.targets.some((t) => t.up)
  }

  /** Routing on the remote index: reachable and the last query answered. */
  get exact(): boolean {
    return this.reachable && this.lastResult !== 'timeout' && this.lastResult !== 'error' && this.lastResult !== 'unavailable'
  }

  status(): { urls: { url: string; up: boolean }[]; reachable: boolean; exact: boolean; queries: Record<QueryResult, number> } {
    return { urls: this.targets.map((t) => ({ url: t.url, up: t.up })), reachable: this.reachable, exact: this.exact, queries: { ...this.counts } }
  }

  private count(r: QueryResult, t0: number): void {
    this.counts[r]++
    this.lastResult = r
    this.latency?.observe({ result: r }, (performance.now() - t0) / 1000)
  }

  /** `gone`: it refused or broke the connection, so it may come back a new process that must be told the workers. */
  private fail(t: Target, now: number, why: string, gone = true): void {
    if (t.up) limited.warn('remote_indexer_down', { url: t.url, error: why }, 'a remote indexer stopped answering: skipped for its backoff, routing fails over')
    t.up = false
    if (gone) t.registered = false
    t.downUntil = now + this.backoffMs
  }

  /**
   * The remote index's overlap of the first n local block hashes, or null when no URL answered
   * within the deadline (the caller routes on its local index).
   */
  async query(lo: Uint32Array, hi: Uint32Array, n: number): Promise<OverlapResult | null> {
    const t0 = performance.now()
    const deadline = t0 + this.o.timeoutMs
    let body: string | null = null
    let tried = false
    let timedOut = false
    for (const t of this.targets) {
      const now = performance.now()
      if (t.downUntil > now) continue
      const left = deadline - now
      if (left <= 0) {
        timedOut = true
        break
      }
      body ??= queryByHashBody(lo, hi, n, this.o.modelName, this.routingGroup)
      tried = true
      const signal = AbortSignal.timeout(Math.max(1, Math.ceil(left)))
      try {
        const r = await t.pool.request({ path: '/query_by_hash', method: 'POST', headers: { 'content-type': 'application/json' }, body, signal })
        const text = await r.body.text()
        if (r.statusCode === 200) {
          const parsed = parseIndexerAnswer(text, this.o.blockSize)
          if (parsed !== null) {
            if (!t.up) t.up = true
            t.lateInARow = 0
            this.count('ok', t0)
            return parsed
          }
          limited.warn('remote_indexer_answer', { url: t.url, bytes: text.length }, 'a remote indexer answer has the wrong shape: routed on the local index')
        } else if (r.statusCode === 404) {
          // up, but no index for the model: it lost (or never got) the registrations
          t.up = true
          if (t.registered) t.registered = false
          void this.registerAll(t)
        } else if (r.statusCode >= 500) this.fail(t, performance.now(), `status ${r.statusCode}`)
        else limited.warn('remote_indexer_status', { url: t.url, status: r.statusCode, body: text.slice(0, 200) }, 'a remote indexer refused a query')
      } catch (err) {
        const now2 = performance.now()
        const late = signal.aborted || now2 >= deadline
        if (late) timedOut = true
        if (!late) this.fail(t, now2, (err as Error).message)
        else if (++t.lateInARow >= LATE_BEFORE_DOWN) {
          t.lateInARow = 0
          this.fail(t, now2, `${LATE_BEFORE_DOWN} deadlines missed in a row`, false)
        }
      }
    }
    this.count(!tried ? (timedOut ? 'timeout' : 'unavailable') : timedOut ? 'timeout' : 'error', t0)
    return null
  }

  /** Tells every indexer of a worker (its engine's ZMQ endpoints), now and whenever one comes back. */
  addWorker(w: IndexedWorker): void {
    this.workers.set(w.id, w)
    for (const t of this.targets) if (t.registered) void this.register(t, w)
  }

  removeWorker(id: bigint): void {
    if (!this.workers.delete(id)) return
    const body = `{"instance_id":${id},"model_name":${JSON.stringify(this.o.modelName)},"routing_group":${JSON.stringify(this.routingGroup)}}`
    for (const t of this.targets) {
      if (!t.up) continue
      t.pool
        .request({ path: '/unregister', method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: AbortSignal.timeout(2000) })
        .then((r) => r.body.dump())
        .catch(() => undefined)
    }
  }

  private async register(t: Target, w: IndexedWorker): Promise<boolean> {
    for (const body of registerBodies(w, this.o.modelName, this.routingGroup, this.o.blockSize)) {
      try {
        const r = await t.pool.request({
          path: '/register',
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body,
          signal: AbortSignal.timeout(2000),
        })
        const text = await r.body.text()
        // 409: registered already (by this replica, another, or an operator)
        if (r.statusCode !== 201 && r.statusCode !== 200 && r.statusCode !== 409) {
          limited.warn(
            'remote_indexer_register',
            { url: t.url, worker: String(w.id), status: r.statusCode, body: text.slice(0, 200) },
            'a remote indexer refused a worker',
          )
          return false
        }
      } catch {
        return false
      }
    }
    return true
  }

  private async registerAll(t: Target): Promise<void> {
    if (t.registered) return
    t.registered = true
    let ok = true
    for (const w of this.workers.values()) if (!(await this.register(t, w))) ok = false
    // tried again at the next probe
    if (!ok) t.registered = false
  }

  private async probeAll(): Promise<void> {
    if (this.closed) return
    await Promise.all(
      this.targets.map(async (t) => {
        try {
          const r = await t.pool.request({ path: '/health', method: 'GET', signal: AbortSignal.timeout(Math.max(500, this.o.timeoutMs * 10)) })
          await r.body.dump()
          if (r.statusCode !== 200) throw new Error(`status ${r.statusCode}`)
          if (!t.up) log.info({ url: t.url }, 'remote indexer answering: routing on its index')
          t.up = true
          t.downUntil = 0
          if (!t.registered) await this.registerAll(t)
        } catch (err) {
          this.fail(t, performance.now(), (err as Error).message)
        }
      }),
    )
  }

  async close(): Promise<void> {
    this.closed = true
    clearInterval(this.probe)
    await Promise.all(this.targets.map((t) => t.pool.destroy().catch(() => undefined)))
  }
}
