// The open worker-ranks (registered, not held, their worker not busy by the load-shedding
// thresholds) sorted by load, kept up to date as bookings and loads change, so that a decision
// finds the best candidates that hold none of its prompt without scoring every worker-rank
// (PrunedSelector). To such a candidate the cost depends on its load alone:
//
//   family  capacity (total KV blocks) and max_num_batched_tokens: fixed at registration, few
//   group   a family at one count of requests in flight: one chunk size, one slowdown term
//   class   a group's worker-ranks with the same booked prefill tokens q and active blocks a:
//           one cost for such a request, so one evaluation; members in slot order, for the
//           tie-break, which counts and picks among them without visiting them
//
// Each group lists its classes twice over:
//   Z  q = 0, by a: either cost grows with a, so the first class is the group's cheapest
//   Q  q > 0, by a key the cost's lower bound grows with: under the latency cost the wait T(q)
//      with the group's decode step (latencyLowerBound), under Dynamo's the logit's varying
//      part, weight × q / block size + a
// and the groups are listed by requests in flight. Beside them, sums over the open set: in
// flight and KV usage (the latency cost's fleet terms, exact in integer units), queue-busy ranks
// (the queue check) and ranks with nothing queued (the credit decay's minimum).
//
// Every update is a few binary searches and array moves within one group, class or list; the
// arrays of freed classes are reused, so a steady state allocates nothing.
import type { ActiveSequences, LoadListener } from './active-sequences.js'
import type { Eligibility } from './busy.js'
import { chunkTokens, kvUsage, prefillSteps, prefillTimeMs, queueAtLeast, usageUnits } from './cost.js'
import type { EngineModels } from './engine-estimator.js'
import type { EngineModel } from './engine-model.js'
import type { CostModel } from './options.js'
import { grow, growTo } from './typed-arrays.js'
import type { WorkerRanks } from './worker-ranks.js'

export interface LoadIndexOptions {
  cost: CostModel
  blockSize: number
  /** Dynamo's weight, for the Q lists' key under its cost. */
  overlapScoreWeight: number
  queueThreshold: number | null
}

const EMPTY = new Int32Array(0)

export class LoadIndex implements LoadListener {
  /** Per slot: its class, or -1 while it is not open. */
  classOf = new Int32Array(8).fill(-1)
  /** Open worker-ranks, and live ones whose worker is not held. */
  openCount = 0
  unheldCount = 0
  /** Over the open set: requests in flight, KV usage units (usageUnits), queue-busy ranks, ranks with no booked prefill. */
  sumInFlight = 0
  sumUnits = 0
  queueBusyCount = 0
  unqueuedCount = 0

  // families
  famTotal = new Float64Array(4)
  famMaxBatched = new Float64Array(4)
  /** Per family: its engine model. */
  famModel: EngineModel[] = []
  private famGroups: Int32Array[] = []
  private famCount = 0
  private readonly famIds = new Map<string, number>()

  // groups
  groupR = new Int32Array(16)
  groupFam = new Int32Array(16)
  /** Open worker-ranks in the group. */
  groupCount = new Int32Array(16)
  groupZ: Int32Array[] = []
  groupZn = new Int32Array(16)
  groupQ: Int32Array[] = []
  groupQn = new Int32Array(16)
  private groupTop = 0
  /** Groups with open worker-ranks, by requests in flight then family; valid up to activeN. */
  active: Int32Array = new Int32Array(16)
  activeN = 0

  // classes
  classGroup = new Int32Array(64)
  classQ = new Float64Array(64)
  classA = new Int32Array(64)
  /** The Q list's sort key (see the header); the Z list sorts by classA. */
  classKey = new Float64Array(64)
  /** Latency cost, Q classes: the least queue behind the class's wait at the group's longest step (queueAtLeast), for its bound. */
  classQ0 = new Float64Array(64)
  classCount = new Int32Array(64)
  /** Member slots, ascending, valid up to classCount. */
  classMembers: Int32Array[] = []
  private freeClasses: number[] = []
  private classTop = 0

  /** Per slot: 1 while held out of routing; 1 while over a load-shedding threshold; the family. */
  private held = new Uint8Array(8)
  private over = new Uint8Array(8)
  private famOf = new Int32Array(8).fill(-1)
  /** Per slot: 1 while it counts in unheldCount. */
  private unheldOf = new Uint8Array(8)
  /** Per worker index: its live ranks over a load-shedding threshold. */
  private busyRanks = new Int32Array(8)

  constructor(
    private readonly workers: WorkerRanks,
    private readonly seqs: ActiveSequences,
    private readonly eligibility: Eligibility,
    private readonly models: EngineModels,
    private readonly opts: LoadIndexOptions,
  ) {}

  /** Capacity of the per-class arrays (selection scratch sizes itself by it). */
  get classCapacity(): number {
    return this.classGroup.length
  }

  isOpen(slot: number): boolean {
    return slot < this.classOf.length && (this.classOf[slot] as number) >= 0
  }

  /** Whether an open worker-rank is queue-busy (see busy.ts's queueBusy). */
  queueBusy(slot: number): boolean {
    const c = this.classOf[slot] as number
    return c >= 0 && this.isQueueBusy(this.classQ[c] as number, this.famMaxBatched[this.groupFam[this.classGroup[c] as number] as number] as number)
  }

  /** An open worker-rank's KV usage units (its share of sumUnits). */
  unitsOf(slot: number): number {
    const c = this.classOf[slot] as number
    return usageUnits(this.classA[c] as number, this.famTotal[this.groupFam[this.classGroup[c] as number] as number] as number)
  }

  /** LoadListener: a booking, prefill completion or release changed the slot's load. */
  loadChanged(slot: number): void {
    this.refresh(slot)
  }

  /** The worker-rank's worker is held out of routing (or let back). */
  setHeld(slot: number, on: boolean): void {
    this.ensureSlots(slot + 1)
    this.held[slot] = on ? 1 : 0
    this.refresh(slot)
  }

  /** Every rank of a worker: after one was added or removed, or it was held, its busy state may have changed. */
  refreshWorker(workerId: bigint): void {
    for (const s of this.workers.slotsOf(workerId)) this.refresh(s)
  }

  /** Everything again: the load-shedding thresholds changed. */
  refreshAll(): void {
    const w = this.workers
    this.ensureSlots(w.slotCapacity)
    if (this.busyRanks.length < w.rankCount.length) this.busyRanks = growTo(this.busyRanks, w.rankCount.length)
    this.busyRanks.fill(0)
    for (let i = 0; i < w.liveCount; i++) {
      const s = w.liveSlots[i] as number
      const o = this.eligibility.overloaded(s) ? 1 : 0
      this.over[s] = o
      if (o === 1) this.busyRanks[w.workerIndex[s] as number] = (this.busyRanks[w.workerIndex[s] as number] as number) + 1
    }
    for (let s = 0; s < w.slotCapacity; s++) this.place(s)
  }

  /**
   * After a slot's load or registration changed (or it was removed): its overload state, its
   * worker's busy state, and its class.
   */
  refresh(slot: number): void {
    this.ensureSlots(slot + 1)
    const w = this.workers
    if (w.live[slot] === 1) {
      const o = this.eligibility.overloaded(slot) ? 1 : 0
      if (o !== this.over[slot]) {
        const wi = w.workerIndex[slot] as number
        if (this.busyRanks.length <= wi) this.busyRanks = grow(this.busyRanks, wi + 1)
        const before = this.workerBusy(wi)
        this.over[slot] = o
        this.busyRanks[wi] = (this.busyRanks[wi] as number) + (o === 1 ? 1 : -1)
        if (this.workerBusy(wi) !== before) {
          // the worker's other ranks open or close with it
          this.refreshWorker(w.workerIdOf(slot))
          return
        }
      }
    }
    this.place(slot)
  }

  /**
   * A rank was removed (after WorkerRanks.remove): it leaves the index, and its worker index's
   * count of overloaded ranks, before the index can be handed to another worker.
   */
  removed(slot: number, workerIndex: number): void {
    this.ensureSlots(slot + 1)
    if (this.over[slot] === 1) {
      this.over[slot] = 0
      this.busyRanks[workerIndex] = (this.busyRanks[workerIndex] as number) - 1
    }
    this.held[slot] = 0
    this.place(slot)
  }

  private workerBusy(wi: number): boolean {
    const ranks = this.workers.rankCount[wi] as number
    return ranks > 0 && (this.busyRanks[wi] as number) >= ranks
  }

  private isQueueBusy(q: number, maxBatched: number): boolean {
    const t = this.opts.queueThreshold
    return t !== null && q > t * maxBatched
  }

  /** Files the slot where its current state puts it (or nowhere). */
  private place(slot: number): void {
    const w = this.workers
    const live = w.live[slot] === 1
    const unheld = live && this.held[slot] === 0
    const open = unheld && !this.workerBusy(w.workerIndex[slot] as number)
    const c = this.classOf[slot] as number
    if (!open) {
      if (c >= 0) this.detach(slot, c)
      this.setUnheld(slot, unheld)
      return
    }
    this.setUnheld(slot, true)
    const fam = this.familyOf(slot)
    const seqs = this.seqs
    const r = seqs.inFlight[slot] as number
    const q = seqs.prefillTokens[slot] as number
    const a = seqs.activeBlocks[slot] as number
    const g = this.groupOf(fam, r)
    if (c >= 0 && this.classGroup[c] === g && this.classQ[c] === q && this.classA[c] === a) return
    if (c >= 0) this.detach(slot, c)
    this.attach(slot, g, q, a)
  }

  private setUnheld(slot: number, on: boolean): void {
    const v = on ? 1 : 0
    if (this.unheldOf[slot] === v) return
    this.unheldOf[slot] = v
    this.unheldCount += on ? 1 : -1
  }

  private attach(slot: number, g: number, q: number, a: number): void {
    const cid = q === 0 ? this.findZ(g, a) : this.findQ(g, q, a)
    const n = this.classCount[cid] as number
    let members = this.classMembers[cid] as Int32Array
    if (members.length === n) {
      members = growTo(members, Math.max(4, n * 2))
      this.classMembers[cid] = members
    }
    insertSorted(members, n, slot)
    this.classCount[cid] = n + 1
    this.classOf[slot] = cid
    const gc = this.groupCount[g] as number
    this.groupCount[g] = gc + 1
    if (gc === 0) this.activate(g)
    const fam = this.groupFam[g] as number
    const r = this.groupR[g] as number
    this.openCount++
    this.sumInFlight += r
    this.sumUnits += usageUnits(a, this.famTotal[fam] as number)
    if (this.isQueueBusy(q, this.famMaxBatched[fam] as number)) this.queueBusyCount++
    if (q === 0) this.unqueuedCount++
  }

  private detach(slot: number, cid: number): void {
    const g = this.classGroup[cid] as number
    const q = this.classQ[cid] as number
    const a = this.classA[cid] as number
    const n = this.classCount[cid] as number
    removeSorted(this.classMembers[cid] as Int32Array, n, slot)
    this.classCount[cid] = n - 1
    this.classOf[slot] = -1
    if (n === 1) this.dropClass(g, cid, q === 0)
    const gc = (this.groupCount[g] as number) - 1
    this.groupCount[g] = gc
    if (gc === 0) this.deactivate(g)
    const fam = this.groupFam[g] as number
    this.openCount--
    this.sumInFlight -= this.groupR[g] as number
    this.sumUnits -= usageUnits(a, this.famTotal[fam] as number)
    if (this.isQueueBusy(q, this.famMaxBatched[fam] as number)) this.queueBusyCount--
    if (q === 0) this.unqueuedCount--
  }

  /** The decode step a worker-rank of group g may have, least and most: none with nothing in flight, one with its capacity unknown. */
  stepMin(g: number): number {
    return (this.groupR[g] as number) > 0 ? this.modelOfGroup(g).stepMin : 0
  }

  stepMax(g: number): number {
    if ((this.groupR[g] as number) === 0) return 0
    const e = this.modelOfGroup(g)
    return (this.famTotal[this.groupFam[g] as number] as number) > 0 ? e.stepMax : e.stepMin
  }

  /** The engine model of group g's worker-ranks (their family's). */
  modelOfGroup(g: number): EngineModel {
    return this.famModel[this.groupFam[g] as number] as EngineModel
  }

  /** The Q list's key of a class (see the header). */
  qKey(g: number, q: number, a: number): number {
    const fam = this.groupFam[g] as number
    const r = this.groupR[g] as number
    if (this.opts.cost === 'dynamo') return this.opts.overlapScoreWeight * (q / this.opts.blockSize) + a
    // the wait of latencyTerms: T(q) with the worker-rank's decode step
    const chunk = chunkTokens(this.famMaxBatched[fam] as number, r)
    const e = this.famModel[fam] as EngineModel
    const step = r > 0 ? e.decodeMs(kvUsage(a, this.famTotal[fam] as number)) : 0
    return prefillTimeMs(q, chunk, e) + prefillSteps(q, chunk) * step
  }

  private findZ(g: number, a: number): number {
    const list = this.groupZ[g] as Int32Array
    const n = this.groupZn[g] as number
    const i = this.zIndex(g, a)
    if (i < n && this.classA[list[i] as number] === a) return list[i] as number
    const cid = this.newClass(g, 0, a, 0)
    this.groupZ[g] = insertAt(list, n, i, cid)
    this.groupZn[g] = n + 1
    return cid
  }

  /** Where a class of a active blocks is, or goes, in the group's Z list. */
  private zIndex(g: number, a: number): number {
    const list = this.groupZ[g] as Int32Array
    const classA = this.classA
    let lo = 0
    let hi = this.groupZn[g] as number
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if ((classA[list[mid] as number] as number) < a) lo = mid + 1
      else hi = mid
    }
    return lo
  }

  private findQ(g: number, q: number, a: number): number {
    const key = this.qKey(g, q, a)
    const list = this.groupQ[g] as Int32Array
    const n = this.groupQn[g] as number
    let lo = 0
    let hi = n
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (this.qBefore(list[mid] as number, key, q, a)) lo = mid + 1
      else hi = mid
    }
    if (lo < n) {
      const c = list[lo] as number
      if (this.classKey[c] === key && this.classQ[c] === q && this.classA[c] === a) return c
    }
    const cid = this.newClass(g, q, a, key)
    this.groupQ[g] = insertAt(list, n, lo, cid)
    this.groupQn[g] = n + 1
    return cid
  }

  /** Whether class c sorts before (key, q, a) in a Q list. */
  private qBefore(c: number, key: number, q: number, a: number): boolean {
    const k = this.classKey[c] as number
    if (k !== key) return k < key
    const cq = this.classQ[c] as number
    if (cq !== q) return cq < q
    return (this.classA[c] as number) < a
  }

  private dropClass(g: number, cid: number, z: boolean): void {
    if (z) {
      const n = this.groupZn[g] as number
      removeAt(this.groupZ[g] as Int32Array, n, this.zIndex(g, this.classA[cid] as number))
      this.groupZn[g] = n - 1
    } else {
      const list = this.groupQ[g] as Int32Array
      const n = this.groupQn[g] as number
      let lo = 0
      let hi = n
      const key = this.classKey[cid] as number
      const q = this.classQ[cid] as number
      const a = this.classA[cid] as number
      while (lo < hi) {
        const mid = (lo + hi) >>> 1
        if (this.qBefore(list[mid] as number, key, q, a)) lo = mid + 1
        else hi = mid
      }
      removeAt(list, n, lo)
      this.groupQn[g] = n - 1
    }
    this.freeClasses.push(cid)
  }

  private newClass(g: number, q: number, a: number, key: number): number {
    let cid = this.freeClasses.pop()
    if (cid === undefined) {
      cid = this.classTop++
      if (cid >= this.classGroup.length) {
        const cap = this.classGroup.length * 2
        this.classGroup = growTo(this.classGroup, cap)
        this.classQ = growTo(this.classQ, cap)
        this.classA = growTo(this.classA, cap)
        this.classKey = growTo(this.classKey, cap)
        this.classQ0 = growTo(this.classQ0, cap)
        this.classCount = growTo(this.classCount, cap)
      }
      this.classMembers[cid] = EMPTY
    }
    this.classGroup[cid] = g
    this.classQ[cid] = q
    this.classA[cid] = a
    this.classKey[cid] = key
    this.classQ0[cid] =
      q > 0 && this.opts.cost === 'latency'
        ? queueAtLeast(
            key,
            chunkTokens(this.famMaxBatched[this.groupFam[g] as number] as number, this.groupR[g] as number),
            this.stepMax(g),
            this.modelOfGroup(g),
          )
        : 0
    this.classCount[cid] = 0
    return cid
  }

  /** The slot's family, looked up again only when its capacity, batch budget or engine model changed. */
  private familyOf(slot: number): number {
    const w = this.workers
    const total = w.totalKvBlocks[slot] as number
    const batched = w.maxNumBatchedTokens[slot] as number
    const model = this.models.modelOf[slot] ?? 0
    const e = this.models.model(model)
    const f = this.famOf[slot] as number
    // the model itself, not its id: an id freed is handed to the next new model
    if (f >= 0 && this.famTotal[f] === total && this.famMaxBatched[f] === batched && this.famModel[f] === e) return f
    const key = `${total}/${batched}/${e.a}/${e.b}/${e.c}/${e.base}/${e.rise}`
    let id = this.famIds.get(key)
    if (id === undefined) {
      id = this.famCount++
      this.famIds.set(key, id)
      this.famTotal = grow(this.famTotal, id + 1)
      this.famMaxBatched = grow(this.famMaxBatched, id + 1)
      this.famTotal[id] = total
      this.famMaxBatched[id] = batched
      this.famModel[id] = e
      this.famGroups[id] = EMPTY
    }
    this.famOf[slot] = id
    return id
  }

  private groupOf(fam: number, r: number): number {
    let byR = this.famGroups[fam] as Int32Array
    if (r >= byR.length) {
      byR = growTo(byR, Math.max(16, r + 1, byR.length * 2))
      this.famGroups[fam] = byR
    }
    const g = (byR[r] as number) - 1
    if (g >= 0) return g
    const id = this.groupTop++
    if (id >= this.groupR.length) {
      const cap = this.groupR.length * 2
      this.groupR = growTo(this.groupR, cap)
      this.groupFam = growTo(this.groupFam, cap)
      this.groupCount = growTo(this.groupCount, cap)
      this.groupZn = growTo(this.groupZn, cap)
      this.groupQn = growTo(this.groupQn, cap)
    }
    this.groupR[id] = r
    this.groupFam[id] = fam
    this.groupZ[id] = new Int32Array(4)
    this.groupQ[id] = new Int32Array(4)
    byR[r] = id + 1
    return id
  }

  /** Adds a group to the active list, in order of requests in flight, then family. */
  private activate(g: number): void {
    const n = this.activeN
    let lo = 0
    let hi = n
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (this.groupBefore(this.active[mid] as number, g)) lo = mid + 1
      else hi = mid
    }
    this.active = insertAt(this.active, n, lo, g)
    this.activeN = n + 1
  }

  private deactivate(g: number): void {
    const i = this.active.indexOf(g)
    removeAt(this.active, this.activeN, i)
    this.activeN--
  }

  private groupBefore(x: number, y: number): boolean {
    const rx = this.groupR[x] as number
    const ry = this.groupR[y] as number
    return rx !== ry ? rx < ry : (this.groupFam[x] as number) < (this.groupFam[y] as number)
  }

  private ensureSlots(n: number): void {
    if (n <= this.classOf.length) return
    const cap = Math.max(n, this.classOf.length * 2)
    const old = this.classOf.length
    this.classOf = growTo(this.classOf, cap)
    this.classOf.fill(-1, old)
    this.famOf = growTo(this.famOf, cap)
    this.famOf.fill(-1, old)
    this.held = growTo(this.held, cap)
    this.over = growTo(this.over, cap)
    this.unheldOf = growTo(this.unheldOf, cap)
  }
}

/** Inserts v into the ascending first n entries of a (which has room for one more). */
function insertSorted(a: Int32Array, n: number, v: number): void {
  let lo = 0
  let hi = n
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if ((a[mid] as number) < v) lo = mid + 1
    else hi = mid
  }
  a.copyWithin(lo + 1, lo, n)
  a[lo] = v
}

/** Removes v from the ascending first n entries of a. */
function removeSorted(a: Int32Array, n: number, v: number): void {
  let lo = 0
  let hi = n
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if ((a[mid] as number) < v) lo = mid + 1
    else hi = mid
  }
  a.copyWithin(lo, lo + 1, n)
}

/** Inserts v at position i of the first n entries; returns the array (grown when full). */
function insertAt(a: Int32Array, n: number, i: number, v: number): Int32Array {
  const b = n === a.length ? growTo(a, Math.max(4, n * 2)) : a
  b.copyWithin(i + 1, i, n)
  b[i] = v
  return b
}

function removeAt(a: Int32Array, n: number, i: number): void {
  a.copyWithin(i, i + 1, n)
}
