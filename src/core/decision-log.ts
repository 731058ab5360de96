// The last routing decisions, for the status page (GET /v1/status). A ring of entries made once
// and overwritten in place, so recording a decision allocates nothing: it keeps references to
// what the route already made (the decision's candidate rows exist only when it was explained).
// While someone watches (watch(), hold()) the router explains every decision, so the page sees
// each candidate's cost terms; otherwise only /v1/route's own explained decisions carry them.
import type { RouteDecision } from '../scheduler/scheduler.js'
import type { Candidate } from '../scheduler/selector.js'

export interface DecisionEntry {
  /** 1, 2, … in the order recorded; 0 while the entry was never written. */
  seq: number
  /** performance.now() of the decision (the route's own reading: a clock read costs 0.1–0.3 µs on a VM). */
  at: number
  requestId: string | undefined
  workerId: bigint
  dpRank: number
  overlapBlocks: number
  /** The prompt's complete blocks. */
  blocks: number
  isl: number
  booked: boolean
  waitedMs: number
  candidates: Candidate[] | undefined
}

export class DecisionLog {
  private readonly ring: DecisionEntry[]
  private last = 0
  private watchedUntil = 0
  private holders = 0

  constructor(readonly capacity = 64) {
    this.ring = []
    for (let i = 0; i < capacity; i++)
      this.ring.push({
        seq: 0,
        at: 0,
        requestId: undefined,
        workerId: 0n,
        dpRank: 0,
        overlapBlocks: 0,
        blocks: 0,
        isl: 0,
        booked: false,
        waitedMs: 0,
        candidates: undefined,
      })
  }

  /** Whether a reader is watching at `now` (performance.now()): routing then explains every decision. */
  watchingAt(now: number): boolean {
    return this.holders > 0 || now < this.watchedUntil
  }

  get watching(): boolean {
    return this.watchingAt(performance.now())
  }

  /** The sequence number of the newest decision (0: none yet). */
  get newest(): number {
    return this.last
  }

  /** A poller read: decisions are explained for the next `ms`. */
  watch(ms: number): void {
    this.watchedUntil = Math.max(this.watchedUntil, performance.now() + ms)
  }

  /** A stream opens: decisions are explained until the returned release is called. */
  hold(): () => void {
    this.holders++
    let held = true
    return () => {
      if (held) this.holders--
      held = false
    }
  }

  /** `now`: performance.now() at the decision. */
  record(d: RouteDecision, blocks: number, isl: number, now: number): void {
    const seq = ++this.last
    const e = this.ring[seq % this.capacity] as DecisionEntry
    e.seq = seq
    e.at = now
    e.requestId = d.requestId
    e.workerId = d.workerId
    e.dpRank = d.dpRank
    e.overlapBlocks = d.overlapBlocks
    e.blocks = blocks
    e.isl = isl
    e.booked = d.booked
    e.waitedMs = d.waitedMs
    e.candidates = d.candidates
  }

  /** The decisions after `seq`, oldest first, at most `limit` (the newest ones). */
  since(seq: number, limit = this.capacity): DecisionEntry[] {
    const from = Math.max(seq + 1, this.last - Math.min(limit, this.capacity) + 1, 1)
    const out: DecisionEntry[] = []
    for (let s = from; s <= this.last; s++) out.push(this.ring[s % this.capacity] as DecisionEntry)
    return out
  }
}
