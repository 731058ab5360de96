// A request's cached prefixes in the forms the selection reads: per slot (dense, what Selector
// indexes) and as the list of slots that have one (what PrunedSelector scores one by one). A
// caller may give either or both (ScheduleRequest's overlapBlocks, overlapSlots, overlapValues);
// the route path gives the list, so no array per slot is built per request.
import type { CandidateSets } from './candidates.js'
import type { WorkerRanks } from './worker-ranks.js'

/** What of a request this reads. */
export interface OverlapRequest {
  overlapBlocks?: ArrayLike<number>
  overlapSlots?: ArrayLike<number>
  overlapValues?: ArrayLike<number>
}

const NONE = new Int32Array(0)

export class OverlapInput {
  /** Slots that may hold a cached prefix (every one that does), valid up to matchedN once matchedSlots() ran. */
  matched: ArrayLike<number> = NONE
  matchedN = 0
  /** The request's own overlap per slot (before predict-on-route raises it), or undefined. */
  private own: ArrayLike<number> | undefined = undefined
  private ownSlots: ArrayLike<number> | undefined = undefined
  private list = new Int32Array(8)
  /** overlapValues spread over the slots; all zeros between decisions. */
  private sparse = new Float64Array(8)
  private spreadSlots: ArrayLike<number> | undefined = undefined

  constructor(private readonly workers: WorkerRanks) {}

  /** The request's overlap per slot (spread into a reused array when it came as a list: clear() after the decision). */
  dense(req: OverlapRequest): ArrayLike<number> | undefined {
    const slots = req.overlapSlots
    this.matched = slots ?? NONE
    this.matchedN = slots === undefined ? -1 : slots.length
    this.ownSlots = slots
    this.own = req.overlapBlocks
    if (req.overlapBlocks !== undefined || slots === undefined || req.overlapValues === undefined) return req.overlapBlocks
    if (this.sparse.length < this.workers.slotCapacity) this.sparse = new Float64Array(Math.max(this.workers.slotCapacity, this.sparse.length * 2))
    const sparse = this.sparse
    const values = req.overlapValues
    const n = Math.min(slots.length, values.length)
    for (let i = 0; i < n; i++) {
      const s = slots[i] as number
      if (s >= 0 && s < sparse.length) sparse[s] = values[i] as number
    }
    this.spreadSlots = slots
    this.own = sparse
    return sparse
  }

  /** The overlap the selection sees is not the request's alone (predict-on-route raised it): its slots are read from it. */
  raised(): void {
    this.matchedN = -1
  }

  /** Fills matched/matchedN, reading `overlap` for its non-zero slots when the request did not list them. */
  matchedSlots(overlap: ArrayLike<number> | undefined): void {
    if (this.matchedN >= 0) return
    let k = 0
    if (overlap !== undefined) {
      if (this.list.length < overlap.length) this.list = new Int32Array(Math.max(overlap.length, this.list.length * 2))
      for (let s = 0; s < overlap.length; s++) if (overlap[s] !== 0) this.list[k++] = s
    }
    this.matched = this.list
    this.matchedN = k
  }

  /** Zeroes what dense() spread. */
  clear(): void {
    const slots = this.spreadSlots
    if (slots === undefined) return
    for (let i = 0; i < slots.length; i++) {
      const s = slots[i] as number
      if (s >= 0 && s < this.sparse.length) this.sparse[s] = 0
    }
    this.spreadSlots = undefined
  }

  /** The request's best cached prefix, in blocks, among the candidates of the last collect() (wspt's key); before clear(). */
  best(cands: CandidateSets): number {
    const own = this.own
    if (own === undefined) return 0
    let best = 0
    const slots = this.ownSlots
    if (cands.listed) {
      const e = cands.eligibility
      for (let i = 0; i < e.count; i++) {
        const s = e.slots[i] as number
        const v = s < own.length ? (own[s] as number) : 0
        if (v > best) best = v
      }
    } else if (slots !== undefined) {
      for (let i = 0; i < slots.length; i++) {
        const s = slots[i] as number
        const v = s >= 0 && s < own.length ? (own[s] as number) : 0
        if (v > best && cands.isCandidate(s)) best = v
      }
    } else {
      for (let s = 0; s < own.length; s++) if ((own[s] as number) > best && cands.isCandidate(s)) best = own[s] as number
    }
    return best
  }
}
