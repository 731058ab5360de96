// KV events from engines' own publishers (vLLM, SGLang: ZMQ + MessagePack), for the workers
// registered with a kv-events endpoint: one ZmqListener per dp rank (rank r on port + r, as
// vLLM offsets its publishers), its batches decoded at the router's block size and pushed to the
// shards as Dynamo RouterEvents. The listener orders the batches, fills gaps from the replay
// socket and reports restarts; this module numbers the events it pushes per worker-rank without
// gaps, so the shards' own gap detection never fires for them.
//
// The events are re-encoded as RouterEvent JSON on the main thread and decoded again in the
// shard: simple, and correct, at the cost of one encode per event here. A shard that took the
// engine's MessagePack itself would save it.
import { rankEndpoint } from '../config.js'
import type { EngineEventsSpec } from '../config.js'
import { DecodedEvent } from '../codec/event-decoder.js'
import { EngineEventDecoder } from '../codec/engine-events.js'
import type { EngineSkip } from '../codec/engine-events.js'
import { toRouterEvent } from '../codec/events.js'
import type { RouterEvent } from '../codec/events.js'
import { ZmqListener } from './zmq.js'
import type { ZmqCounters, ZmqListenerOptions, ZmqRankState, ZmqSink, ZmqSource } from './zmq.js'

/** Where the converted events go: the router core's ingestEvent. */
export type EventTarget = (ev: RouterEvent) => unknown

interface WorkerListeners {
  readonly spec: EngineEventsSpec
  readonly listeners: ZmqListener[]
  /** Per rank, the id of the last event pushed. */
  readonly eventIds: bigint[]
}

const ZERO_COUNTERS: ZmqCounters = { batches: 0, bytes: 0, badFrames: 0, gaps: 0, replays: 0, replayedBatches: 0, replaysIncomplete: 0, restarts: 0, sinkErrors: 0 }

export class EngineIntake implements ZmqSink {
  private readonly decoder: EngineEventDecoder
  private readonly workers = new Map<bigint, WorkerListeners>()
  /** Counts of listeners already stopped, so the totals never go down. */
  private readonly retired: ZmqCounters = { ...ZERO_COUNTERS }
  private readonly out = new DecodedEvent()
  /** Worker-ranks warned about a block-size mismatch (once each). */
  private readonly warned = new Set<string>()
  private closed = false
  /** True once any listener was started: the metrics are absent before. */
  used = false

  constructor(
    blockSize: number,
    private readonly push: EventTarget,
    private readonly opts: ZmqListenerOptions = {},
  ) {
    this.decoder = new EngineEventDecoder(blockSize)
  }

  /** Events not applied, by reason. */
  get skipped(): Readonly<Record<EngineSkip, number>> {
    return this.decoder.skipped
  }

  /** The listeners' counters, summed over every listener ever started. */
  counters(): ZmqCounters {
    const sum = { ...this.retired }
    for (const w of this.workers.values()) for (const l of w.listeners) addInto(sum, l.counters)
    return sum
  }

  /** Whether the worker has listeners with this spec and rank count. */
  private same(id: bigint, spec: EngineEventsSpec, dpRanks: number): boolean {
    const w = this.workers.get(id)
    return w !== undefined && w.listeners.length === dpRanks && w.spec.endpoint === spec.endpoint && w.spec.replay === spec.replay && w.spec.topic === spec.topic
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
    const w: WorkerListeners = { spec, listeners: [], eventIds: new Array<bigint>(dpRanks).fill(0n) }
    this.workers.set(workerId, w)
    // a cleared event drops every rank of the worker (KvIndex)
    this.pushCleared(workerId, 0, w)
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
    await Promise.all(w.listeners.map((l) => l.close()))
    for (const l of w.listeners) addInto(this.retired, l.counters)
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

  /**
   * One batch, in order. Every event is converted before any is pushed: a malformed one throws
   * (the listener counts it as a sink error) and leaves none of its batch applied.
   */
  batch(source: ZmqSource, _seq: bigint, payload: Uint8Array): void {
    const w = this.workers.get(source.workerId)
    if (w === undefined) return
    const b = this.decoder.decodeBatch(payload)
    // the batch's own rank names the engine's; a batch without one is the listener's rank
    const rank = b.dpRank ?? source.dpRank
    const lo = Number(source.workerId & 0xffffffffn)
    const hi = Number(source.workerId >> 32n)
    const events: RouterEvent[] = []
    for (const ev of b.events) {
      const skip = this.decoder.convert(ev, lo, hi, rank, this.out)
      if (skip !== null) {
        this.decoder.skipped[skip]++
        if (skip === 'block_size_mismatch') this.warnMismatch(source.workerId, rank)
        continue
      }
      events.push(toRouterEvent(this.out))
    }
    for (const ev of events) {
      ev.event.event_id = this.nextId(w, rank)
      this.push(ev)
    }
  }

  /**
   * A restarted engine cached nothing yet: what the index holds of the worker is stale. The index
   * clears a worker whole, so a restart of one dp rank forgets the other ranks' blocks too, until
   * their next events: fewer hits for a while, never a hit on a block that is gone.
   */
  restarted(source: ZmqSource): void {
    const w = this.workers.get(source.workerId)
    if (w !== undefined) this.pushCleared(source.workerId, source.dpRank, w)
  }

  state(_source: ZmqSource, _state: ZmqRankState): void {
    // read through stateOf when asked (GET /v1/workers)
  }

  private pushCleared(workerId: bigint, rank: number, w: WorkerListeners): void {
    this.push({ worker_id: workerId, event: { event_id: this.nextId(w, rank), data: 'cleared', dp_rank: rank } })
  }

  /** Ids per worker-rank from 1, without gaps (a rank beyond the registered ones gets its own count). */
  private nextId(w: WorkerListeners, rank: number): bigint {
    const id = (w.eventIds[rank] ?? 0n) + 1n
    w.eventIds[rank] = id
    return id
  }

  private warnMismatch(workerId: bigint, rank: number): void {
    const key = `${workerId}:${rank}`
    const m = this.decoder.lastMismatch
    if (this.warned.has(key) || m === null) return
    this.warned.add(key)
    process.emitWarning(`worker ${workerId} rank ${rank} publishes KV events of block size ${m.eventBlockSize}, the router hashes with ${m.routerBlockSize}: they are not applied`, {
      code: 'KVR_BLOCK_SIZE_MISMATCH',
    })
  }
}

function addInto(sum: ZmqCounters, c: ZmqCounters): void {
  for (const k of Object.keys(sum) as (keyof ZmqCounters)[]) sum[k] += c[k]
}
