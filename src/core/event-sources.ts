// Which registered workers the index knows from their own KV events, and which it does not.
//
// In KV-events mode a worker that has no event source, or has sent no event since it registered,
// is `no-events`: the index would call it empty, and a prompt sharing a prefix with one just sent
// there would be routed as if nothing were cached. Such a worker is routed on predictions, as in
// approximate mode (the blocks of the prompts routed to it count as cached for the approximate
// TTL), so a static fleet still gets cache-aware routing. Its first real event (or an answer to
// the worker query, whose dump replaces what the index holds) ends that: the predictions are
// forgotten and its ranks reset in the index, in order before that event, and from then on it is
// exact. A warning says once per worker why it is predicted.
import type { WorkerInfo } from './worker-registry.js'

export interface EventSourcesDeps {
  /** Turns the predictions for the worker's ranks on or off (off forgets them). */
  setPredicted(workerId: bigint, on: boolean): void
  /** Watch the worker's event messages, to hear of its first one (off: stop watching). */
  watch(workerId: bigint, on: boolean): void
  /** Drops what the index holds of a worker-rank, in order with its events. */
  resetRank(workerId: bigint, dpRank: number): void
  warn(message: string): void
  /** Milliseconds, monotonic. */
  now(): number
}

/** After this long routed to with no event in return, a worker with an event source is warned about. */
export const SILENT_AFTER_MS = 30_000

interface Silent {
  readonly ranks: number
  readonly hasSource: boolean
  /** now() of the first request routed to it while it was no-events, or -1. */
  firstRoutedAt: number
}

export class EventSources {
  private readonly silent = new Map<bigint, Silent>()
  private readonly warned = new Set<bigint>()
  /** Workers that left the no-events state on their first event (metrics). */
  firstEventsTotal = 0

  constructor(private readonly deps: EventSourcesDeps) {}

  /** True while the worker has sent no event since it registered. */
  has(workerId: bigint): boolean {
    return this.silent.has(workerId)
  }

  get size(): number {
    return this.silent.size
  }

  /** Worker-ranks with no events. */
  get ranks(): number {
    let n = 0
    for (const s of this.silent.values()) n += s.ranks
    return n
  }

  /**
   * A worker registered (or registered again). `evented`: the index already holds its events
   * (sent before it registered). `hasSource`: something can bring its events (NATS, Dynamo's ZMQ
   * event plane, its engine's ZMQ publisher, this process). A worker already waiting for its first event keeps waiting,
   * its new ranks predicted too.
   */
  registered(info: WorkerInfo, evented: boolean, hasSource: boolean): void {
    const id = info.id
    const prev = this.silent.get(id)
    if (prev === undefined && evented) return
    this.silent.set(id, { ranks: info.dpRanks, hasSource, firstRoutedAt: prev?.firstRoutedAt ?? -1 })
    this.deps.setPredicted(id, true)
    if (prev === undefined) this.deps.watch(id, true)
    if (!hasSource && !this.warned.has(id)) {
      this.warned.add(id)
      this.deps.warn(
        `worker ${id} has no KV event source (no --nats-url, no --etcd-url event plane, no kv-events= endpoint, nothing posted to /v1/kv-events ` +
          `yet): it is routed on predictions of its cache, made from the router's own decisions, until its events arrive (GET /v1/workers shows ` +
          `it as no-events)`,
      )
    }
  }

  /** Its first event is about to be queued (or a dump of its cache): it is exact from here. */
  evented(workerId: bigint): void {
    const s = this.silent.get(workerId)
    if (s === undefined) return
    this.silent.delete(workerId)
    this.deps.watch(workerId, false)
    this.deps.setPredicted(workerId, false)
    for (let r = 0; r < s.ranks; r++) this.deps.resetRank(workerId, r)
    this.firstEventsTotal++
  }

  removed(workerId: bigint): void {
    if (this.silent.delete(workerId)) this.deps.watch(workerId, false)
    this.warned.delete(workerId)
  }

  /** A request was routed to the worker. Cheap when it has events. */
  routed(workerId: bigint): void {
    const s = this.silent.get(workerId)
    if (s === undefined || s.firstRoutedAt >= 0) return
    s.firstRoutedAt = this.deps.now()
  }

  /**
   * Warns once about each worker that has an event source, was routed to long enough ago to have
   * cached something, and has still published nothing: its events are not reaching the router.
   */
  check(): void {
    const now = this.deps.now()
    for (const [id, s] of this.silent) {
      if (!s.hasSource || s.firstRoutedAt < 0 || now - s.firstRoutedAt < SILENT_AFTER_MS || this.warned.has(id)) continue
      this.warned.add(id)
      this.deps.warn(
        `worker ${id} was sent requests ${Math.round((now - s.firstRoutedAt) / 1000)} s ago and has published no KV events since it registered: ` +
          `check its KV event publisher (vLLM/SGLang --kv-events-config, the kv-events= endpoint, the NATS subject); it is routed on predictions ` +
          `meanwhile`,
      )
    }
  }
}
