// The local event ring and Dynamo's worker query: an engine keeps its last 1,024 KV
// events (consecutive event ids, first id 1, as the block pool numbers them) so a router that
// sees a gap in a worker's ids can fetch the missing range; a range older than the ring (or no
// start at all) is answered with a tree dump that rebuilds the engine's whole cached set.
//
// The dump comes from a local indexer: a KvIndex fed the engine's own events, exactly what
// Dynamo's LocalKvIndexer is. KvIndex.dump() already emits parents before children with
// synthetic ids from 0, which is the TreeDump contract.
import type { RouterEvent } from '../../codec/events.js'
import { encodeRouterEvent, toDecoded } from '../../codec/events.js'
import { DecodedEvent } from '../../codec/event-decoder.js'
import { KvIndex } from '../../index/kv-index.js'

/** Dynamo's WORKER_KV_INDEXER_BUFFER_SIZE. */
export const EVENT_RING_SIZE = 1024

export interface KvQueryRequest {
  worker_id: bigint
  /** Inclusive; null asks for the whole state (a tree dump). */
  start_event_id: bigint | null
  /** Inclusive; null means "up to the newest". */
  end_event_id: bigint | null
}

/** The response enum of the query, externally tagged as serde writes it. */
export type KvQueryResponse =
  | { Events: RouterEvent[] }
  | { TreeDump: RouterEvent[] }
  | { TooNew: { requested_start: bigint; requested_end: bigint | null; newest_available: bigint } }
  | { InvalidRange: { start_id: bigint; end_id: bigint } }
  | { Error: string }

export class EventRing {
  readonly size: number
  private readonly slots: (RouterEvent | undefined)[]
  /** Events ever pushed; the newest id is `firstId + count - 1`. */
  private count = 0
  private firstId = 0n
  private readonly index = new KvIndex()
  private readonly decoded = new DecodedEvent()

  constructor(size = EVENT_RING_SIZE) {
    if (!Number.isInteger(size) || size < 1) throw new RangeError(`event ring size must be a positive integer, got ${String(size)}`)
    this.size = size
    this.slots = new Array<RouterEvent | undefined>(size)
  }

  /** Records one event; ids must be consecutive (the pool guarantees it). */
  push(ev: RouterEvent): void {
    if (this.count === 0) this.firstId = ev.event.event_id
    else if (ev.event.event_id !== this.firstId + BigInt(this.count)) {
      throw new Error(`event ring: event id ${ev.event.event_id} does not follow ${this.firstId + BigInt(this.count) - 1n}`)
    }
    this.slots[this.count % this.size] = ev
    this.count++
    this.index.apply(toDecoded(ev, this.decoded))
  }

  /** Id of the newest event, 0 when none was recorded yet. */
  get newestId(): bigint {
    return this.count === 0 ? 0n : this.firstId + BigInt(this.count - 1)
  }

  /** Id of the oldest event still held, 0 when none. */
  get oldestId(): bigint {
    if (this.count === 0) return 0n
    return this.firstId + BigInt(Math.max(0, this.count - this.size))
  }

  get length(): number {
    return Math.min(this.count, this.size)
  }

  /** Events with ids in [from, to] (both held). */
  range(from: bigint, to: bigint): RouterEvent[] {
    const out: RouterEvent[] = []
    for (let id = from; id <= to; id++) out.push(this.slots[Number(id - this.firstId) % this.size] as RouterEvent)
    return out
  }

  /** The cached set as events that rebuild it: parents first, synthetic ids from 0. */
  treeDump(): RouterEvent[] {
    return this.index.dump()
  }

  /** Answers a worker query for this engine. */
  query(q: KvQueryRequest, workerId: bigint): KvQueryResponse {
    if (q.worker_id !== workerId) return { Error: `worker ${q.worker_id} is not served here (this is worker ${workerId})` }
    const start = q.start_event_id
    const end = q.end_event_id
    if (start !== null && end !== null && start > end) return { InvalidRange: { start_id: start, end_id: end } }
    if (start === null) return { TreeDump: this.treeDump() }
    const newest = this.newestId
    if (start > newest) return { TooNew: { requested_start: start, requested_end: end, newest_available: newest } }
    if (start < this.oldestId) return { TreeDump: this.treeDump() }
    // A range reaching past the newest event is answered with what exists; the rest arrives
    // as live events.
    const last = end === null || end > newest ? newest : end
    return { Events: this.range(start, last) }
  }
}

/** JSON text of a query response, u64 values as exact integers. */
export function encodeKvQueryResponse(r: KvQueryResponse): string {
  if ('Events' in r) return `{"Events":[${r.Events.map(encodeRouterEvent).join(',')}]}`
  if ('TreeDump' in r) return `{"TreeDump":[${r.TreeDump.map(encodeRouterEvent).join(',')}]}`
  if ('TooNew' in r) {
    const t = r.TooNew
    return (
      `{"TooNew":{"requested_start":${t.requested_start},"requested_end":${t.requested_end === null ? 'null' : String(t.requested_end)},` +
      `"newest_available":${t.newest_available}}}`
    )
  }
  if ('InvalidRange' in r) return `{"InvalidRange":{"start_id":${r.InvalidRange.start_id},"end_id":${r.InvalidRange.end_id}}}`
  return JSON.stringify({ Error: r.Error })
}
