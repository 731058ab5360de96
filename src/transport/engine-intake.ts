// KV events from engines' own publishers (vLLM, SGLang: ZMQ + MessagePack), for the workers
// registered with a kv-events endpoint: one ZmqListener per dp rank (rank r on port + r, as
// vLLM offsets its publishers). The listener orders the batches, fills gaps from the replay
// socket and reports restarts; this module hands each batch's MessagePack, as it came, to the
// worker's shard, which decodes it there at the router's block size (workers/shard/engine.ts):
// the main thread does no per-event work. A restart of one engine rank resets that worker-rank
// alone, in order with its batches. What the shards count (events skipped, de-duplicated,
// batches refused) is read from their shared counters, and their note of an engine of another
// block size becomes a warning here, once per worker-rank.
import { rankEndpoint } from '../core/endpoints.js'
import type { EngineEventsSpec } from '../core/endpoints.js'
import type { EngineSkip } from '../codec/engine-events.js'
import type { EngineCounters, EngineNote, ShardPool } from '../shards/pool.js'
import { EngineReset } from '../thread/protocol.js'
import { ZmqListener, zeroZmqCounters } from './zmq.js'
import { log } from '../runtime/log.js'
import { Warn } from '../errors.js'
import type { ZmqCounters, ZmqListenerOptions, ZmqRankState, ZmqSink, ZmqSource } from './zmq.js'

interface WorkerListeners {
  readonly spec: EngineEventsSpec
  readonly listeners: ZmqListener[]
}

export class EngineIntake implements ZmqSink {
  private readonly workers = new Map<bigint, WorkerListeners>()
  /** Counts of listeners already stopped, so the totals never go down. */
  private readonly retired: ZmqCounters = zeroZmqCounters()
  /** Worker-ranks warned about a block-size mismatch (once each). */
  private readonly warned = new Set<string>()
  private closed = false
  /** True once any listener was started: the metrics are absent before. */
  used = false
  /**
   * Told of an engine whose events carry another block size, and of a worker's engine read afresh
   * (listeners started or stopped, a rank restarted), whose next events say its size again.
   */
  blockSizes: { mismatch(workerId: bigint, dpRank: number, eventBlockSize: number): void; reset(workerId: bigint, dpRank?: number): void } | null = null

  constructor(
    private readonly blockSize: number,
    private readonly pool: ShardPool,
    private readonly opts: ZmqListenerOptions = {},
  ) {
    pool.on('engineNote', (n: EngineNote) => this.warnMismatch(n))
  }

  /** What the shards made of the engines' batches, summed over the shards. */
  engineCounters(): EngineCounters {
    const sum: EngineCounters = { batches: 0, events: 0, skipped: {}, duplicateStores: 0, suppressedRemovals: 0, malformed: {} }
    for (const c of this.pool.counters()) {
      const e = c.engine
      sum.batches += e.batches
      sum.events += e.events
      sum.duplicateStores += e.duplicateStores
      sum.suppressedRemovals += e.suppressedRemovals
      for (const [k, v] of Object.entries(e.skipped)) sum.skipped[k] = (sum.skipped[k] ?? 0) + v
      for (const [k, v] of Object.entries(e.malformed)) sum.malformed[k] = (sum.malformed[k] ?? 0) + v
    }
    return sum
  }

  /** Events not applied, by reason. */
  get skipped(): Readonly<Record<EngineSkip, number>> {
    const s = this.engineCounters().skipped
    return { block_size_mismatch: s.block_size_mismatch ?? 0, attention_kind: s.attention_kind ?? 0, unknown_event: s.unknown_event ?? 0, empty: s.empty ?? 0 }
  }

  /**
   * The listeners' counters, summed over every listener ever started; sinkErrors adds the
   * batches the shards refused as malformed.
   */
  counters(): ZmqCounters {
    const sum = { ...this.retired }
    for (const w of this.workers.values()) for (const l of w.listeners) addInto(sum, l.counters)
    for (const v of Object.values(this.engineCounters().malformed)) sum.sinkErrors += v
    return sum
  }

  /** Whether the worker has listeners with this spec and rank count. */
  private same(id: bigint, spec: EngineEventsSpec, dpRanks: number): boolean {
    const w = this.workers.get(id)
    return (
      w !== undefined && w.listeners.length === dpRanks && w.spec.endpoint === spec.endpoint && w.spec.replay === spec.replay && w.spec.topic === spec.topic
    )
  }

  /**
   * Listens to the worker's engine ranks (a registration with other endpoints or ranks replaces the
   * listeners; the same one keeps them). What the index holds of the worker is cleared first: the
   * replay that starts each listener brings back what the engine holds.
   */
  async start(workerId: bigint, dpRanks: number, spec: EngineEventsSpec): Promise<void> {
    if (this.closed || this.same(workerId, spec, dpRanks)) return
    await this.stop(workerId)
    this.used = true
    const w: WorkerListeners = { spec, listeners: [] }
    this.workers.set(workerId, w)
    this.pool.resetEngine(workerId, 0, EngineReset.Worker)
    this.blockSizes?.reset(workerId)
    for (let r = 0; r < dpRanks; r++) {
      const source: ZmqSource = {
        workerId,
        dpRank: r,
        endpoint: rankEndpoint(spec.endpoint, r),
        replay: spec.replay === null ? null : rankEndpoint(spec.replay, r),
        topic: spec.topic,
      }
      w.listeners.push(ZmqListener.start(source, this, this.opts))
    }
  }

  /** Stops the worker's listeners (it left, or no longer names an endpoint). */
  async stop(workerId: bigint): Promise<void> {
    const w = this.workers.get(workerId)
    if (w === undefined) return
    this.workers.delete(workerId)
    for (const key of [...this.warned]) if (key.startsWith(`${workerId}:`)) this.warned.delete(key)
    this.blockSizes?.reset(workerId)
    await Promise.all(w.listeners.map((l) => l.close()))
    for (const l of w.listeners) addInto(this.retired, l.counters)
    // the shard forgets the decoding state of the worker; its blocks stay until it is removed
    if (!this.closed) this.pool.resetEngine(workerId, 0, EngineReset.State)
  }

  /** The listener's state of a worker-rank, or null when the worker has no listener. */
  stateOf(workerId: bigint, dpRank: number): ZmqRankState | null {
    return this.workers.get(workerId)?.listeners[dpRank]?.state ?? null
  }

  has(workerId: bigint): boolean {
    return this.workers.has(workerId)
  }

  async close(): Promise<void> {
    this.closed = true
    await Promise.all([...this.workers.keys()].map((id) => this.stop(id)))
  }

  // ---- ZmqSink ----

  /** One batch, in order: to the worker's shard, undecoded. */
  batch(source: ZmqSource, _seq: bigint, payload: Uint8Array): void {
    if (!this.workers.has(source.workerId)) return
    this.pool.pushEngineBatch(source.workerId, source.dpRank, this.blockSize, payload)
  }

  /**
   * A restarted engine rank cached nothing yet: what the index holds of that worker-rank is stale
   * (and of the ranks its batches named). The other ranks keep theirs.
   */
  restarted(source: ZmqSource): void {
    if (!this.workers.has(source.workerId)) return
    this.pool.resetEngine(source.workerId, source.dpRank, EngineReset.Rank)
    this.blockSizes?.reset(source.workerId, source.dpRank)
  }

  state(_source: ZmqSource, _state: ZmqRankState): void {
    // read through stateOf when asked (GET /v1/workers)
  }

  private warnMismatch(n: EngineNote): void {
    const key = `${n.workerId}:${n.dpRank}`
    if (!this.workers.has(n.workerId)) return
    // the shard notes it again after each reset, the warning is said once
    this.blockSizes?.mismatch(n.workerId, n.dpRank, n.eventBlockSize)
    if (this.warned.has(key)) return
    this.warned.add(key)
    log.warn(
      { code: Warn.KVR_BLOCK_SIZE_MISMATCH, worker_id: n.workerId.toString(), dp_rank: n.dpRank },
      `worker ${n.workerId} rank ${n.dpRank} publishes KV events of block size ${n.eventBlockSize}, the router hashes with ${n.routerBlockSize}: ` +
        `they are not applied`,
    )
  }
}

function addInto(sum: ZmqCounters, c: ZmqCounters): void {
  for (const k of Object.keys(sum) as (keyof ZmqCounters)[]) sum[k] += c[k]
}
