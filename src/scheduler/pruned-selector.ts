// kv mode's selection at temperature 0 without scoring every worker-rank: the same choice as
// Selector's full scan (test/scheduler/pruned-selection.test.ts holds them to it), found from
//
//   matched    the candidates holding part of the prompt (a non-zero overlap) or some of its
//              blocks active (countPresent): each scored exactly, as the full scan scores it
//   the rest   to whom the request adds its whole prompt and all its blocks: their cost depends on
//              their load alone, and LoadIndex keeps them in classes of equal load, sorted by what
//              the cost or its bound grows with (see there); the classes that matched or excluded
//              worker-ranks belong to count without them this once
//
// Dynamo's cost, minimum: every class whose bound does not exceed the best found is scored, so
// every exact tie is found. Latency cost: the least cost C first, then, in order of requests in
// flight, the least loaded candidate within NEAR_TIE of C (as nearTiePick). A decision scores the
// matched candidates, the first classes of each group (distinct counts of requests in flight)
// and the classes whose bound comes under what it has found: never the worker-ranks one by one.
// The latency bounds are computed once a decision where they repeat across groups (groupBound),
// and a queued class is first held to its group's bound grown with its wait (qBeyond).
//
// Exact ties: the full scan's rule (Selector's header), one draw among the k equal candidates;
// the j-th from the last is found by counting over the tied classes' sorted members, not by
// listing them. Bounds are compared with a relative slack far above the rounding of the
// costs' arithmetic (~1e-15), so a rounding error can never prune a class that a full scan would
// have chosen.
import type { ActiveSequences } from './active-sequences.js'
import { TRACK_NONE, TRACK_SHARED } from './active-sequences.js'
import { chunkTokens, FleetLoad, kvSlowdownMs, kvUsage, LatencyTerms, latencyLowerBoundFrom, ownAtLeast, USAGE_SCALE } from './cost.js'
import type { LoadIndex } from './load-index.js'
import type { EngineModels } from './engine-estimator.js'
import type { EngineModel } from './engine-model.js'
import type { CostModel } from './options.js'
import type { Rng } from './rng.js'
import type { CostInputs } from './selector.js'
import { decodeBlocks, dynamoLogit, latencyCost, nearTieLimit, prefillTokens, uncachedTokens } from './selector.js'
import { growTo } from './typed-arrays.js'
import type { WorkerRanks } from './worker-ranks.js'

/** Relative slack of every bound comparison (see the header). */
const SLACK = 1e-7

/** One decision's candidate set as the index sees it: the open worker-ranks less the request's exclusions. */
export interface IndexView {
  /** Candidates. */
  readonly m: number
  /** Their summed requests in flight and KV usage units. */
  readonly sumInFlight: number
  readonly sumUnits: number
  /** The open worker-ranks the request excludes. */
  readonly excluded: Int32Array
  readonly excludedN: number
  isExcluded(slot: number): boolean
}

export class PrunedSelector {
  /** Per slot: 1 while listed in `special`. */
  private mark = new Uint8Array(8)
  /** Slots with a cached prefix or request blocks active there, each once. */
  private special = new Int32Array(8)
  private specialN = 0
  /** Per slot: request blocks active there; all zeros between decisions. */
  private present = new Int32Array(8)
  private touched = new Int32Array(8)
  /** Matched candidates (special, open, not excluded) and their costs. */
  private mSlot = new Int32Array(8)
  private mCost = new Float64Array(8)
  private mN = 0
  private touchedN = 0
  /** Per class and group: members this decision takes out (matched or excluded). */
  private classMask = new Int32Array(64)
  private groupMask = new Int32Array(16)
  private masked = new Int32Array(64)
  private maskedN = 0
  /** Per class: its cost this decision, valid while costStamp equals stamp. */
  private costCache = new Float64Array(64)
  private costStamp = new Int32Array(64)
  private stamp = 0
  /** Per class and group: its bound this decision, valid while boundStamp / groupStamp equals stamp. */
  private boundCache = new Float64Array(64)
  private boundStamp = new Int32Array(64)
  private groupCache = new Float64Array(16)
  private groupStamp = new Int32Array(16)
  /** Per group: what its Q classes' bound grows by at least per ms of wait (ownAtLeast), with the slack; set with groupCache. */
  private groupSlope = new Float64Array(16)
  /**
   * A prompt within the chunk, per family (for its engine model), with nothing in flight and with
   * some ([2·family], [2·family + 1]): the bound at no wait less the KV term, its own time, and (capacity unknown,
   * nothing queued) the cost itself; valid while idleStamp / zeroStamp equals stamp.
   */
  private idle = new Float64Array(2)
  private idleOwn = new Float64Array(2)
  private idleStamp = new Int32Array(2)
  private zero = new Float64Array(2)
  private zeroStamp = new Int32Array(2)
  /** Per class: a matched member's cost, the overlap and active request blocks it was scored with, valid while mStamp equals stamp. */
  private mShared = new Float64Array(64)
  private mOverlap = new Float64Array(64)
  private mPresent = new Int32Array(64)
  private mStamp = new Int32Array(64)
  /** The equal best: matched slots, classes, how many candidates in all. */
  private tieSlots = new Int32Array(8)
  private tieSlotN = 0
  private tieClasses = new Int32Array(64)
  private tieClassN = 0
  private tieCount = 0
  /** Tie pick scratch: each tied class's masked members, sorted, at tieOff[i] for tieLen[i]. */
  private tieMasked = new Int32Array(8)
  private tieOff = new Int32Array(64)
  private tieLen = new Int32Array(64)
  private readonly fleet = new FleetLoad()
  private readonly terms = new LatencyTerms()
  // the request's terms for a class (set per decision)
  private uncached = 0
  private extra = 0
  private decay = 0
  private reqBlocks = 1
  private view: IndexView | null = null
  /** Per family: the pass (passStamp) in which one of its groups was found beyond the pass's limit. */
  private famBeyond = new Int32Array(4)
  private passStamp = 0

  constructor(
    private readonly index: LoadIndex,
    private readonly workers: WorkerRanks,
    private readonly seqs: ActiveSequences,
    private readonly rng: Rng,
    private readonly blockSize: number,
    private readonly cost: CostModel,
    private readonly models: EngineModels,
  ) {}

  /**
   * The chosen slot. `matched`: the first matchedN entries list every slot whose c.overlap entry
   * is not 0 (and may list others). The fast path's preconditions are the scheduler's: kv mode,
   * temperature 0, no replica spread; Dynamo's cost at the options' weight, and with a credit
   * decay only when some candidate has no prefill booked. -1 when no candidate has a comparable
   * cost (every one NaN): the caller scores them all.
   */
  select(c: CostInputs, matched: ArrayLike<number>, matchedN: number, view: IndexView): number {
    this.prepare(c, matched, matchedN, view)
    this.view = view
    try {
      if (this.cost === 'latency') this.latency(c, view)
      else this.dynamo(c)
      return this.pickTie()
    } finally {
      this.cleanup()
      this.view = null
    }
  }

  private prepare(c: CostInputs, matched: ArrayLike<number>, matchedN: number, view: IndexView): void {
    const cap = this.workers.slotCapacity
    if (this.mark.length < cap) {
      const n = Math.max(cap, this.mark.length * 2)
      this.mark = growTo(this.mark, n)
      this.present = growTo(this.present, n)
      this.touched = growTo(this.touched, n)
      this.special = growTo(this.special, n)
      this.mSlot = growTo(this.mSlot, n)
      this.mCost = growTo(this.mCost, n)
      this.tieSlots = growTo(this.tieSlots, n)
      this.tieMasked = growTo(this.tieMasked, n)
    }
    const classes = this.index.classCapacity
    if (this.classMask.length < classes) {
      this.classMask = growTo(this.classMask, classes)
      this.masked = growTo(this.masked, classes)
      this.costCache = growTo(this.costCache, classes)
      this.costStamp = growTo(this.costStamp, classes)
      this.boundCache = growTo(this.boundCache, classes)
      this.boundStamp = growTo(this.boundStamp, classes)
      this.mShared = growTo(this.mShared, classes)
      this.mOverlap = growTo(this.mOverlap, classes)
      this.mPresent = growTo(this.mPresent, classes)
      this.mStamp = growTo(this.mStamp, classes)
      this.tieClasses = growTo(this.tieClasses, classes)
      this.tieOff = growTo(this.tieOff, classes)
      this.tieLen = growTo(this.tieLen, classes)
    }
    if (this.groupMask.length < this.index.groupR.length) {
      const n = this.index.groupR.length
      this.groupMask = growTo(this.groupMask, n)
      this.groupCache = growTo(this.groupCache, n)
      this.groupStamp = growTo(this.groupStamp, n)
      this.groupSlope = growTo(this.groupSlope, n)
    }
    if (this.famBeyond.length < this.index.famTotal.length) this.famBeyond = growTo(this.famBeyond, this.index.famTotal.length)
    this.nextPass()
    if (++this.stamp === 0x40000000) {
      this.costStamp.fill(0)
      this.mStamp.fill(0)
      this.boundStamp.fill(0)
      this.groupStamp.fill(0)
      this.idleStamp.fill(0)
      this.zeroStamp.fill(0)
      this.stamp = 1
    }
    this.specialN = 0
    this.mN = 0
    this.maskedN = 0
    let touchedN = 0
    if (c.track === TRACK_SHARED && c.lo !== undefined && c.hi !== undefined && c.n > 0) {
      touchedN = this.seqs.countPresent(c.lo, c.hi, c.n, this.present, this.touched)
    }
    for (let k = 0; k < view.excludedN; k++) this.maskOut(view.excluded[k] as number)
    const ov = c.overlap
    // slots past the registered ones hold no worker-rank (an overlap for one removed since)
    const ovLen = ov === undefined ? 0 : Math.min(ov.length, cap)
    for (let k = 0; k < matchedN; k++) {
      const s = matched[k] as number
      if (s >= 0 && s < ovLen && (ov as ArrayLike<number>)[s] !== 0) this.addSpecial(s, view)
    }
    const touched = this.touched
    for (let k = 0; k < touchedN; k++) this.addSpecial(touched[k] as number, view)
    // present's entries are read through `special`; touched is free again once they are listed
    this.touchedN = touchedN
    this.uncached = uncachedTokens(c, 0, this.blockSize)
    this.extra = c.track === TRACK_NONE ? 0 : c.n
    this.decay = c.trackPrefill ? c.creditDecay : 0
    this.reqBlocks = Math.max(1, Math.ceil(c.isl / this.blockSize))
    this.tieSlotN = 0
    this.tieClassN = 0
    this.tieCount = 0
  }

  private addSpecial(s: number, view: IndexView): void {
    if (this.mark[s] === 1) return
    this.mark[s] = 1
    this.special[this.specialN++] = s
    const cid = this.index.classOf[s] as number
    if (cid < 0 || (view.excludedN > 0 && view.isExcluded(s))) return
    this.mask(cid)
    this.mSlot[this.mN++] = s
  }

  /** Takes an open slot out of its class's count for this decision. */
  private maskOut(s: number): void {
    const cid = this.index.classOf[s] as number
    if (cid >= 0) this.mask(cid)
  }

  private mask(cid: number): void {
    const g = this.index.classGroup[cid] as number
    if ((this.classMask[cid] as number) === 0) this.masked[this.maskedN++] = cid
    this.classMask[cid] = (this.classMask[cid] as number) + 1
    this.groupMask[g] = (this.groupMask[g] as number) + 1
  }

  private cleanup(): void {
    for (let k = 0; k < this.specialN; k++) this.mark[this.special[k] as number] = 0
    for (let k = 0; k < this.touchedN; k++) this.present[this.touched[k] as number] = 0
    const index = this.index
    for (let k = 0; k < this.maskedN; k++) {
      const cid = this.masked[k] as number
      this.classMask[cid] = 0
      this.groupMask[index.classGroup[cid] as number] = 0
    }
    this.touchedN = 0
  }

  /** Members of a class that are candidates and not matched this decision. */
  private effective(cid: number): number {
    return (this.index.classCount[cid] as number) - (this.classMask[cid] as number)
  }

  // ---- Dynamo's cost ----

  private dynamo(c: CostInputs): void {
    const index = this.index
    const seqs = this.seqs
    const bs = this.blockSize
    const w = c.weight
    const rw = c.requestWeight
    const ov = c.overlap
    const ovLen = ov === undefined ? 0 : ov.length
    let best = Infinity
    for (let k = 0; k < this.mN; k++) {
      const s = this.mSlot[k] as number
      const overlap = s < ovLen ? ((ov as ArrayLike<number>)[s] as number) : 0
      const present = this.present[s] as number
      const cid = this.index.classOf[s] as number
      let l = this.sharedCost(cid, overlap, present)
      if (Number.isNaN(l)) {
        const prefill = prefillTokens(c, seqs.prefillTokens[s] as number, overlap, bs, this.decay, 0, this.reqBlocks) / bs
        l = dynamoLogit(w, prefill, decodeBlocks(seqs.activeBlocks[s] as number, this.extra, present), rw, seqs.inFlight[s] as number)
        this.share(cid, overlap, present, l)
      }
      if (l < best) {
        best = l
        this.resetTies()
      }
      if (l === best) this.tieSlot(s)
    }
    // the logit's part every class shares: the prompt's prefill (tracked) and the request's blocks
    const shared = (c.trackPrefill ? w * (c.isl / bs) : 0) + this.extra
    for (let i = 0; i < index.activeN; i++) {
      const g = index.active[i] as number
      if ((index.groupCount[g] as number) === (this.groupMask[g] as number)) continue
      const r = index.groupR[g] as number
      const rPart = rw !== 0 ? rw * r : 0
      // every class of the group costs at least the shared part (its key is not negative)
      if (shared + rPart > best * (1 + SLACK)) continue
      // Z: the logit grows with a in every rounding step, so the first above the best ends the list
      const z = index.groupZ[g] as Int32Array
      for (let k = 0, n = index.groupZn[g] as number; k < n; k++) {
        const cid = z[k] as number
        if (this.effective(cid) === 0) continue
        const l = this.dynamoClass(c, cid, r)
        if (l > best) break
        if (l < best) {
          best = l
          this.resetTies()
        }
        this.tieClass(cid)
      }
      const q = index.groupQ[g] as Int32Array
      for (let k = 0, n = index.groupQn[g] as number; k < n; k++) {
        const cid = q[k] as number
        if ((index.classKey[cid] as number) + shared + rPart > best * (1 + SLACK)) break
        if (this.effective(cid) === 0) continue
        const l = this.dynamoClass(c, cid, r)
        if (l < best) {
          best = l
          this.resetTies()
        }
        if (l === best) this.tieClass(cid)
      }
    }
  }

  private dynamoClass(c: CostInputs, cid: number, r: number): number {
    if (this.costStamp[cid] === this.stamp) return this.costCache[cid] as number
    const bs = this.blockSize
    const q = this.index.classQ[cid] as number
    const prefill = prefillTokens(c, q, 0, bs, this.decay, 0, this.reqBlocks) / bs
    const l = dynamoLogit(c.weight, prefill, decodeBlocks(this.index.classA[cid] as number, this.extra, 0), c.requestWeight, r)
    this.costStamp[cid] = this.stamp
    this.costCache[cid] = l
    return l
  }

  // ---- the latency cost ----

  private latency(c: CostInputs, view: IndexView): void {
    const index = this.index
    const seqs = this.seqs
    const workers = this.workers
    const fleet = this.fleet
    fleet.set(view.sumInFlight, view.sumUnits / USAGE_SCALE, view.m, this.models.fleet)
    const ov = c.overlap
    const ovLen = ov === undefined ? 0 : ov.length
    // the least cost, C
    let best = Infinity
    for (let k = 0; k < this.mN; k++) {
      const s = this.mSlot[k] as number
      const overlap = s < ovLen ? ((ov as ArrayLike<number>)[s] as number) : 0
      const r = seqs.inFlight[s] as number
      const total = workers.totalKvBlocks[s] as number
      // the blocks already active there enter only the slowdown of its requests in flight, over a known capacity
      const present = r > 0 && total > 0 ? (this.present[s] as number) : 0
      const cid = this.index.classOf[s] as number
      let cost = this.sharedCost(cid, overlap, present)
      if (Number.isNaN(cost)) {
        const uncached = uncachedTokens(c, overlap, this.blockSize)
        const extra = this.extra - (this.present[s] as number)
        cost = latencyCost(
          seqs.prefillTokens[s] as number,
          uncached,
          r,
          workers.maxNumBatchedTokens[s] as number,
          seqs.activeBlocks[s] as number,
          extra,
          total,
          fleet,
          this.terms,
          this.models.of(s),
        )
        this.share(cid, overlap, present, cost)
      }
      this.mCost[k] = cost
      if (cost < best) best = cost
    }
    for (let i = 0; i < index.activeN; i++) {
      const g = index.active[i] as number
      if ((index.groupCount[g] as number) === (this.groupMask[g] as number) || this.beyond(g, best)) continue
      best = this.leastInZ(g, best)
      const q = index.groupQ[g] as Int32Array
      for (let k = 0, n = index.groupQn[g] as number; k < n; k++) {
        const cid = q[k] as number
        if (this.qBeyond(g, cid, best)) break
        if (this.effective(cid) === 0) continue
        const cost = this.latencyClass(cid, g)
        if (cost < best) best = cost
      }
    }
    // within NEAR_TIE of C: fewest in flight, then fewest active blocks, then the lower cost
    const limit = nearTieLimit(best)
    this.nextPass()
    let bestR = Infinity
    let bestA = Infinity
    let bestL = Infinity
    for (let k = 0; k < this.mN; k++) {
      const cost = this.mCost[k] as number
      if (!(cost <= limit)) continue
      const s = this.mSlot[k] as number
      const r = seqs.inFlight[s] as number
      const a = seqs.activeBlocks[s] as number
      if (r < bestR || (r === bestR && (a < bestA || (a === bestA && cost < bestL)))) {
        bestR = r
        bestA = a
        bestL = cost
        this.resetTies()
      }
      if (r === bestR && a === bestA && cost === bestL) this.tieSlot(s)
    }
    for (let i = 0; i < index.activeN; i++) {
      const g = index.active[i] as number
      const r = index.groupR[g] as number
      if (r > bestR) break
      if ((index.groupCount[g] as number) === (this.groupMask[g] as number) || this.beyond(g, limit)) continue
      const z = this.firstInZ(g, limit, r === bestR ? bestA : Infinity)
      if (z >= 0) {
        const a = index.classA[z] as number
        const cost = this.costCache[z] as number
        if (r < bestR || a < bestA || (a === bestA && cost < bestL)) {
          bestR = r
          bestA = a
          bestL = cost
          this.resetTies()
        }
        if (a === bestA && cost === bestL) this.tieClass(z)
      }
      const q = index.groupQ[g] as Int32Array
      for (let k = 0, n = index.groupQn[g] as number; k < n; k++) {
        const cid = q[k] as number
        if (this.qBeyond(g, cid, limit)) break
        const a = index.classA[cid] as number
        if ((r === bestR && a > bestA) || this.effective(cid) === 0) continue
        const cost = this.latencyClass(cid, g)
        if (!(cost <= limit)) continue
        if (r < bestR || a < bestA || (a === bestA && cost < bestL)) {
          bestR = r
          bestA = a
          bestL = cost
          this.resetTies()
        }
        if (a === bestA && cost === bestL) this.tieClass(cid)
      }
    }
  }

  /**
   * The least of `best` and the costs of a group's Z list. The cost grows with a; it depends on a
   * only through the KV usage (and not at all with nothing in flight), so classes of equal usage
   * cost exactly the same and one of them is scored; once the usage is 0 for all (capacity
   * unknown, nothing in flight) or full, the rest of the list is of that usage.
   */
  private leastInZ(g: number, best: number): number {
    const index = this.index
    const z = index.groupZ[g] as Int32Array
    const total = this.usageTotal(g)
    let seen = Number.NaN
    for (let k = 0, n = index.groupZn[g] as number; k < n; k++) {
      const cid = z[k] as number
      if (this.effective(cid) === 0) continue
      const u = kvUsage(index.classA[cid] as number, total)
      if (u === seen) continue
      seen = u
      const cost = this.latencyClass(cid, g)
      if (cost < best) best = cost
      else if (cost * (1 - SLACK) > best) break
      if (total === 0 || u === 1) break
    }
    return best
  }

  /**
   * The first class of a group's Z list whose cost is within `limit` and whose active blocks are at
   * most `maxA` (scored, in costCache), or -1.
   */
  private firstInZ(g: number, limit: number, maxA: number): number {
    const index = this.index
    const z = index.groupZ[g] as Int32Array
    const total = this.usageTotal(g)
    let seen = Number.NaN
    for (let k = 0, n = index.groupZn[g] as number; k < n; k++) {
      const cid = z[k] as number
      const a = index.classA[cid] as number
      if (a > maxA) return -1
      if (this.effective(cid) === 0) continue
      const u = kvUsage(a, total)
      if (u === seen) continue
      seen = u
      const cost = this.latencyClass(cid, g)
      if (cost <= limit) return cid
      if (cost * (1 - SLACK) > limit || total === 0 || u === 1) return -1
    }
    return -1
  }

  /** The capacity a Z class's KV usage is taken against; 0 (no usage, one cost) with nothing in flight. */
  private usageTotal(g: number): number {
    return (this.index.groupR[g] as number) > 0 ? (this.index.famTotal[this.index.groupFam[g] as number] as number) : 0
  }

  /**
   * latencyLowerBound over a whole group (no wait at all: its Z classes, and below every Q class),
   * with the slack. With the prompt within the group's chunk it depends on the group only through
   * whether it has requests in flight, and the KV term (linear in them): the rest is computed once
   * a decision.
   */
  private groupBound(g: number): number {
    if (this.groupStamp[g] === this.stamp) return this.groupCache[g] as number
    const index = this.index
    const fam = index.groupFam[g] as number
    const total = index.famTotal[fam] as number
    const r = index.groupR[g] as number
    const chunk = chunkTokens(index.famMaxBatched[fam] as number, r)
    const e = index.famModel[fam] as EngineModel
    let b: number
    let own: number
    if (this.uncached <= chunk) {
      const i = this.familySlot(fam, r)
      if (this.idleStamp[i] !== this.stamp) {
        this.idle[i] = latencyLowerBoundFrom(0, 0, this.uncached, r, chunk, index.stepMin(g), 0, 0, this.fleet, e)
        this.idleOwn[i] = ownAtLeast(0, this.uncached, chunk, index.stepMin(g), e)
        this.idleStamp[i] = this.stamp
      }
      b = this.idle[i] as number
      own = this.idleOwn[i] as number
      if (total > 0 && this.extra > 0 && r > 0) b += kvSlowdownMs(r, this.extra, total, e) / 1000
    } else {
      b = latencyLowerBoundFrom(0, 0, this.uncached, r, chunk, index.stepMin(g), this.extra, total, this.fleet, e)
      own = ownAtLeast(0, this.uncached, chunk, index.stepMin(g), e)
    }
    b *= 1 - SLACK
    this.groupStamp[g] = this.stamp
    this.groupCache[g] = b
    this.groupSlope[g] = ((1 + this.fleet.arrivalsFor(e) * own) / 1000) * (1 - SLACK)
    return b
  }

  /**
   * Whether a Q class, and every one after it in its group's list, costs more than `limit`: first
   * by the group's bound grown linearly with the wait (ownAtLeast), then by the class's own bound.
   */
  private qBeyond(g: number, cid: number, limit: number): boolean {
    const wait = this.index.classKey[cid] as number
    if (this.groupBound(g) + wait * (this.groupSlope[g] as number) > limit) return true
    return this.boundOf(g, cid) > limit
  }

  /**
   * Whether every class of group g costs more than `limit`. A family's groups come in order of
   * requests in flight, and while the prompt fits the group's chunk the group's bound grows with
   * them (more slowdown, the same own time); so once one group of a family is beyond the limit,
   * so are the family's next ones whose chunk the prompt fits, unscored. The limit of a pass
   * (passStamp) only falls.
   */
  private nextPass(): void {
    if (++this.passStamp === 0x40000000) {
      this.famBeyond.fill(0)
      this.passStamp = 1
    }
  }

  private beyond(g: number, limit: number): boolean {
    const index = this.index
    const fam = index.groupFam[g] as number
    const chunk = chunkTokens(index.famMaxBatched[fam] as number, index.groupR[g] as number)
    if (this.famBeyond[fam] === this.passStamp && this.uncached <= chunk) return true
    if (!(this.groupBound(g) > limit)) return false
    if (this.uncached <= chunk) this.famBeyond[fam] = this.passStamp
    return true
  }

  /** latencyLowerBound of a Q class, with the slack. */
  private boundOf(g: number, cid: number): number {
    if (this.boundStamp[cid] === this.stamp) return this.boundCache[cid] as number
    const index = this.index
    const fam = index.groupFam[g] as number
    const r = index.groupR[g] as number
    const chunk = chunkTokens(index.famMaxBatched[fam] as number, r)
    const wait = index.classKey[cid] as number
    const q0 = index.classQ0[cid] as number
    const e = index.famModel[fam] as EngineModel
    const b = latencyLowerBoundFrom(wait, q0, this.uncached, r, chunk, index.stepMin(g), this.extra, index.famTotal[fam] as number, this.fleet, e) * (1 - SLACK)
    this.boundStamp[cid] = this.stamp
    this.boundCache[cid] = b
    return b
  }

  private latencyClass(cid: number, g: number): number {
    if (this.costStamp[cid] === this.stamp) return this.costCache[cid] as number
    const index = this.index
    const fam = index.groupFam[g] as number
    const r = index.groupR[g] as number
    // nothing queued, capacity unknown and the prompt within the chunk: the cost's inputs are the
    // same but for r > 0 (active blocks and the chunk drop out), so it is computed once a decision
    const e = index.famModel[fam] as EngineModel
    if ((index.classQ[cid] as number) === 0 && (index.famTotal[fam] as number) === 0 && this.uncached <= chunkTokens(index.famMaxBatched[fam] as number, r)) {
      const i = this.familySlot(fam, r)
      if (this.zeroStamp[i] !== this.stamp) {
        this.zero[i] = latencyCost(
          0,
          this.uncached,
          r,
          index.famMaxBatched[fam] as number,
          index.classA[cid] as number,
          this.extra,
          0,
          this.fleet,
          this.terms,
          e,
        )
        this.zeroStamp[i] = this.stamp
      }
      this.costStamp[cid] = this.stamp
      this.costCache[cid] = this.zero[i] as number
      return this.zero[i] as number
    }
    const cost = latencyCost(
      index.classQ[cid] as number,
      this.uncached,
      r,
      index.famMaxBatched[fam] as number,
      index.classA[cid] as number,
      this.extra,
      index.famTotal[fam] as number,
      this.fleet,
      this.terms,
      e,
    )
    this.costStamp[cid] = this.stamp
    this.costCache[cid] = cost
    return cost
  }

  /** The idle / zero caches' entry of a family (its engine model) with or without requests in flight (grown to hold it). */
  private familySlot(fam: number, r: number): number {
    const i = fam * 2 + (r > 0 ? 1 : 0)
    if (i >= this.idle.length) {
      const n = Math.max(i + 1, this.idle.length * 2)
      this.idle = growTo(this.idle, n)
      this.idleOwn = growTo(this.idleOwn, n)
      this.idleStamp = growTo(this.idleStamp, n)
      this.zero = growTo(this.zero, n)
      this.zeroStamp = growTo(this.zeroStamp, n)
    }
    return i
  }

  /**
   * The cost of a matched candidate from the scores of its class's others this decision: members of
   * a class with the same overlap and the same blocks active there cost the same. NaN when none was
   * scored (a class remembers the last overlap and active blocks it was scored with).
   */
  private sharedCost(cid: number, overlap: number, present: number): number {
    return this.mStamp[cid] === this.stamp && this.mOverlap[cid] === overlap && this.mPresent[cid] === present ? (this.mShared[cid] as number) : Number.NaN
  }

  private share(cid: number, overlap: number, present: number, cost: number): void {
    this.mStamp[cid] = this.stamp
    this.mOverlap[cid] = overlap
    this.mPresent[cid] = present
    this.mShared[cid] = cost
  }

  // ---- exact ties ----

  private resetTies(): void {
    this.tieSlotN = 0
    this.tieClassN = 0
    this.tieCount = 0
  }

  private tieSlot(s: number): void {
    this.tieSlots[this.tieSlotN++] = s
    this.tieCount++
  }

  private tieClass(cid: number): void {
    this.tieClasses[this.tieClassN++] = cid
    this.tieCount += this.effective(cid)
  }

  /**
   * One draw j among the k tied candidates; the j-th from the last in slot order, found by
   * searching the slot whose rank among them is k − 1 − j: the tied classes' members up to a slot
   * are counted by binary search, less their masked members.
   */
  private pickTie(): number {
    const k = this.tieCount
    if (k === 0) return -1
    const j = k > 1 ? this.rng.int(k) : 0
    const want = k - 1 - j
    sortRange(this.tieSlots, 0, this.tieSlotN)
    if (this.tieClassN === 0) return this.tieSlots[want] as number
    if (this.tieClassN === 1 && this.tieSlotN === 0) {
      const cid = this.tieClasses[0] as number
      if ((this.classMask[cid] as number) === 0) return (this.index.classMembers[cid] as Int32Array)[want] as number
    }
    // each tied class's masked members, sorted
    let off = 0
    for (let i = 0; i < this.tieClassN; i++) {
      const cid = this.tieClasses[i] as number
      this.tieOff[i] = off
      if ((this.classMask[cid] as number) > 0) {
        for (let k2 = 0; k2 < this.specialN; k2++) {
          const s = this.special[k2] as number
          if (this.index.classOf[s] === cid) this.tieMasked[off++] = s
        }
        // excluded members are masked too
        off = this.addExcludedOf(cid, off)
        sortRange(this.tieMasked, this.tieOff[i] as number, off)
      }
      this.tieLen[i] = off - (this.tieOff[i] as number)
    }
    let lo = 0
    let hi = this.workers.slotCapacity - 1
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (this.countUpTo(mid) > want) hi = mid
      else lo = mid + 1
    }
    return lo
  }

  private addExcludedOf(cid: number, off: number): number {
    const v = this.view
    if (v === null) return off
    for (let k = 0; k < v.excludedN; k++) {
      const s = v.excluded[k] as number
      // a slot both excluded and special is listed once, through `special`
      if (this.index.classOf[s] === cid && this.mark[s] !== 1) this.tieMasked[off++] = s
    }
    return off
  }

  /** Tied candidates at slots ≤ x. */
  private countUpTo(x: number): number {
    let n = upperBound(this.tieSlots, 0, this.tieSlotN, x)
    for (let i = 0; i < this.tieClassN; i++) {
      const cid = this.tieClasses[i] as number
      n += upperBound(this.index.classMembers[cid] as Int32Array, 0, this.index.classCount[cid] as number, x)
      const off = this.tieOff[i] as number
      n -= upperBound(this.tieMasked, off, off + (this.tieLen[i] as number), x) - off
    }
    return n
  }
}

/** Index of the first entry in a[from, to) above x (ascending). */
function upperBound(a: Int32Array, from: number, to: number, x: number): number {
  let lo = from
  let hi = to
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if ((a[mid] as number) <= x) lo = mid + 1
    else hi = mid
  }
  return lo
}

/** Sorts a[from, to) ascending in place; the ranges here are a decision's ties, mostly a few. */
function sortRange(a: Int32Array, from: number, to: number): void {
  if (to - from > 32) {
    a.subarray(from, to).sort()
    return
  }
  for (let i = from + 1; i < to; i++) {
    const v = a[i] as number
    let k = i - 1
    while (k >= from && (a[k] as number) > v) {
      a[k + 1] = a[k] as number
      k--
    }
    a[k + 1] = v
  }
}
