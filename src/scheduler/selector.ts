// Cost and selection. Works on a candidate list of slots prepared by
// Eligibility and on the load arrays of ActiveSequences; nothing here allocates per decision
// unless an explanation is asked for.
//
//   kv, latency cost (the default): the seconds of cost.ts; costs within NEAR_TIE of the
//         cheapest go to the least loaded (in flight, then active blocks, then cost), random among equals.
//   kv, dynamo cost: Dynamo's
//         logit(w) = weight × prefill_blocks(w) + decode_blocks(w) + request_weight × in_flight(w)
//         prefill_blocks = max(0, active_prefill_tokens(w) + isl − credit(w) × overlap(w) × block_size) / block_size
//         credit(w)      = credit / (1 + decay × ((active_prefill_tokens(w) − min over candidates) / block_size) / ceil(isl / block_size))
//         decode_blocks  = active_blocks(w) + request blocks not yet active on w
//         With credit 1, decay 0 and request weight 0 (the defaults) this is Dynamo's original cost
//         exactly; the three knobs are those of Dynamo 1.2 and later, weight being its prefill scale.
//         T = 0: minimum, exact ties broken uniformly at random; T > 0: softmax sample.
//   Random among equals, under either cost: the k equal candidates are counted and one draw j in
//   [0, k) takes the j-th of them from the last (slot order). One draw whatever k is, and it depends
//   on the equal candidates alone, so a selection that never looks at the others (PrunedSelector)
//   makes the same choice and leaves the generator in the same state.
//   Replica spread, either cost (setSpread, replica sync with R ≥ 2 routing replicas), T = 0: replica k
//         of R assumes the replicas ranked before it whose latest booking is not just in (within
//         the sync delay, spreadSeen) route a request like its own at this very moment, and takes
//         the worker a single router would give the next one after theirs: greedily,
//         each earlier one booked on the cheapest with what such a request adds there (its
//         latency cost again; under Dynamo's, prefill not cached there and blocks neither active
//         nor cached there); at equal cost (within NEAR_TIE under the latency cost) a worker no
//         earlier one took wins, then (latency cost) the least loaded, then the smaller identity
//         hash, which every replica computes alike. Replicas facing the same state then choose apart where they would all have
//         taken the same cheapest worker; a worker cheaper by more than a request's own cost (a
//         long cached prefix) still takes them all.
import type { ActiveSequences, Booking, TrackMode } from './active-sequences.js'
import { TRACK_NONE, TRACK_SHARED } from './active-sequences.js'
import { chunkTokens, FleetLoad, kvUsage, LatencyTerms, latencyTerms, NEAR_TIE, USAGE_SCALE, usageUnits } from './cost.js'
import type { CostModel, RouterMode } from './options.js'
import { EngineModels } from './engine-estimator.js'
import type { EngineModel } from './engine-model.js'
import type { Rng } from './rng.js'
import type { WorkerRanks } from './worker-ranks.js'
import { DEVICE_CPU } from './worker-ranks.js'

/**
 * The per-decision inputs, held in one reusable object so the hot path passes no literals. Once
 * a slot is chosen the scheduler fills in slot, overlapBlocks and prefillTokens, and the same
 * object is the request's Booking.
 */
export class CostInputs implements Booking {
  isl = 0
  overlap: ArrayLike<number> | undefined = undefined
  lo: ArrayLike<number> | undefined = undefined
  hi: ArrayLike<number> | undefined = undefined
  /** Request blocks for decode tracking (hash count, or complete blocks when hashes are random). */
  n = 0
  track: TrackMode = TRACK_NONE
  trackPrefill = true
  weight = 1
  /** Dynamo's overlap_score_credit: how many prefill blocks one cached block is worth. */
  credit = 1
  /** Dynamo's overlap_score_credit_decay: shrinks the credit of workers with more queued prefill. */
  creditDecay = 0
  /** Dynamo's decode_active_request_weight: cost per request already in flight on the worker. */
  requestWeight = 0
  temperature = 0
  /** The scheduler's clock at this decision (the replica spread reads it). */
  now = 0
  /** The request's latency objectives, ms; 0 = none (see Selector.objectiveSelect). */
  ttftObjectiveMs = 0
  tpotObjectiveMs = 0
  /** The booking's, set after the selection: the chosen slot, its cached prefix in blocks, the prefill tokens booked there. */
  slot = -1
  overlapBlocks = 0
  prefillTokens = 0
}

/** One row of a decision's explanation. */
export interface Candidate {
  workerId: bigint
  dpRank: number
  slot: number
  overlapBlocks: number
  prefillBlocks: number
  decodeBlocks: number
  logit: number
  inFlight: number
  treeSize?: number
  /** Latency cost only: the time to first token the request would get there, seconds. */
  ttftSecs?: number
  /** Latency cost only: the delay it would add to the requests decoding there, seconds. */
  slowdownSecs?: number
  /** Latency cost only: the delay it would add to the requests arriving there after it, seconds. */
  queueingSecs?: number
  /** Latency cost, a request with objectives: its predicted time per output token there, seconds. */
  tpotSecs?: number
  /** Latency cost, a request with objectives: whether both predictions there are within them. */
  meetsObjectives?: boolean
}

export class Selector {
  /** Per candidate index: the kv logit computed by computeLogits(). */
  logits = new Float64Array(8)
  /** Per candidate index: the prefill blocks and decode blocks behind logits[i], for explain(). */
  private prefillBlocks = new Float64Array(8)
  private decodeBlocks = new Float64Array(8)
  /** Per candidate index, latency cost only: its two terms in seconds, for explain(). */
  private ttft = new Float64Array(8)
  private slowdown = new Float64Array(8)
  private queueing = new Float64Array(8)
  /** Per candidate index, a request with objectives: its predicted TPOT (ms) and whether it meets them (markObjectives). */
  private tpot = new Float64Array(8)
  private meets = new Uint8Array(8)
  private readonly terms = new LatencyTerms()
  private readonly fleet = new FleetLoad()
  private weights = new Float64Array(8)
  /** Per slot: request blocks already active there (filled by countPresent). */
  private present = new Int32Array(8)
  private rrLast = -1
  /** Replica spread (setSpread): this replica's rank among the routing replicas, their number. */
  private spreadRank = 0
  private spreadCount = 1
  private spreadLoad = new Float64Array(8)
  private spreadOwn = new Float64Array(8)
  private spreadUsed = new Int32Array(8)
  /** Per replica ranked before this one: until when its latest booking here is recent (clock ms). */
  private spreadSeenUntil = new Float64Array(8)

  constructor(
    private readonly workers: WorkerRanks,
    private readonly seqs: ActiveSequences,
    private readonly rng: Rng,
    private readonly blockSize: number,
    private readonly cudaToCpuRatio: number,
    readonly cost: CostModel = 'dynamo',
    /** Each slot's engine model for the latency cost (the default one for every slot when not given). */
    private readonly models: EngineModels = new EngineModels(),
  ) {}

  /** Picks one of the m candidate slots; returns the slot. m must be ≥ 1. */
  select(mode: RouterMode, c: CostInputs, slots: Int32Array, m: number): number {
    switch (mode) {
      case 'kv':
        this.computeLogits(c, slots, m)
        if (c.temperature > 0) return slots[this.softmaxPick(m, c.temperature)] as number
        if (this.spreadCount > 1 && m > 1) return slots[this.spreadPick(c, slots, m)] as number
        return slots[this.cost === 'latency' ? this.nearTiePick(slots, m) : this.minPick(m)] as number
      case 'round-robin':
        return this.roundRobin(slots, m)
      case 'random':
        return slots[this.rng.int(m)] as number
      case 'power-of-two':
        return this.powerOfTwo(slots, m)
      case 'device-aware-weighted':
        return this.deviceAware(slots, m)
      case 'least-loaded':
      case 'direct':
        // direct: the request already named its worker; when it named no rank, the least
        // loaded of that worker's ranks takes it.
        return this.leastLoaded(slots, 0, m, -1)
    }
  }

  /** logits[i] for each candidate: the cost model's, as in the header. */
  computeLogits(c: CostInputs, slots: Int32Array, m: number): void {
    if (this.logits.length < m) {
      this.logits = new Float64Array(Math.max(m, this.logits.length * 2))
      this.weights = new Float64Array(this.logits.length)
      this.prefillBlocks = new Float64Array(this.logits.length)
      this.decodeBlocks = new Float64Array(this.logits.length)
      this.ttft = new Float64Array(this.logits.length)
      this.slowdown = new Float64Array(this.logits.length)
      this.queueing = new Float64Array(this.logits.length)
      this.tpot = new Float64Array(this.logits.length)
      this.meets = new Uint8Array(this.logits.length)
    }
    // the request's blocks already active on a worker-rank add no load there
    const present = c.track === TRACK_SHARED && c.lo !== undefined && c.hi !== undefined && c.n > 0 ? this.countPresent(c, slots, m) : null
    const extra = c.track === TRACK_NONE ? 0 : c.n
    if (this.cost === 'latency') this.latencyLogits(c, slots, m, present, extra)
    else this.dynamoLogits(c, slots, m, present, extra)
  }

  /**
   * Dynamo's logit, with the credit, decay and request weight of its later releases. `present`: per slot, the
   * request's blocks already active there (null unless they are shared); `extra`: the blocks it adds.
   */
  private dynamoLogits(c: CostInputs, slots: Int32Array, m: number, present: Int32Array | null, extra: number): void {
    const seqs = this.seqs
    const bs = this.blockSize
    const ovLen = c.overlap === undefined ? 0 : c.overlap.length
    const w = c.weight
    const rw = c.requestWeight
    const logits = this.logits
    const pb = this.prefillBlocks
    const db = this.decodeBlocks
    const decay = c.trackPrefill ? c.creditDecay : 0
    const minQueued = decay > 0 ? this.minQueued(slots, m) : 0
    const reqBlocks = Math.max(1, Math.ceil(c.isl / bs))
    const ov = c.overlap
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      const overlap = s < ovLen ? ((ov as ArrayLike<number>)[s] as number) : 0
      const decode = decodeBlocks(seqs.activeBlocks[s] as number, extra, present === null ? 0 : (present[s] as number))
      const prefill = prefillTokens(c, seqs.prefillTokens[s] as number, overlap, bs, decay, minQueued, reqBlocks) / bs
      pb[i] = prefill
      db[i] = decode
      logits[i] = dynamoLogit(w, prefill, decode, rw, seqs.inFlight[s] as number)
    }
  }

  /** The latency cost of cost.ts, seconds; Dynamo's weight, credit and request weight do not apply. `present`, `extra`: as for dynamoLogits. */
  private latencyLogits(c: CostInputs, slots: Int32Array, m: number, present: Int32Array | null, extra: number): void {
    const seqs = this.seqs
    const workers = this.workers
    const bs = this.blockSize
    const ov = c.overlap
    const ovLen = ov === undefined ? 0 : ov.length
    const terms = this.terms
    let sumInFlight = 0
    let sumUnits = 0
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      sumInFlight += seqs.inFlight[s] as number
      sumUnits += usageUnits(seqs.activeBlocks[s] as number, workers.totalKvBlocks[s] as number)
    }
    const fleet = this.fleet
    const models = this.models
    fleet.set(sumInFlight, sumUnits / USAGE_SCALE, m, models.fleet)
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      const added = extra - (present === null ? 0 : (present[s] as number))
      const active = seqs.activeBlocks[s] as number
      const queued = seqs.prefillTokens[s] as number
      const inFlight = seqs.inFlight[s] as number
      const uncached = uncachedTokens(c, s < ovLen ? ((ov as ArrayLike<number>)[s] as number) : 0, bs)
      this.logits[i] = latencyCost(
        queued,
        uncached,
        inFlight,
        workers.maxNumBatchedTokens[s] as number,
        active,
        added,
        workers.totalKvBlocks[s] as number,
        fleet,
        terms,
        models.of(s),
      )
      this.ttft[i] = terms.ttft
      this.slowdown[i] = terms.slowdown
      this.queueing[i] = terms.queueing
      this.prefillBlocks[i] = (queued + uncached) / bs
      this.decodeBlocks[i] = active + added
    }
  }

  /** The least queued prefill among the candidates: the credit decay's reference point. */
  private minQueued(slots: Int32Array, m: number): number {
    let min = Infinity
    for (let i = 0; i < m; i++) min = Math.min(min, this.seqs.prefillTokens[slots[i] as number] as number)
    return min
  }

  /** Builds the explanation rows (allocates; only when asked). */
  explain(c: CostInputs, slots: Int32Array, m: number, treeSizes?: ArrayLike<number>): Candidate[] {
    this.computeLogits(c, slots, m)
    const objectives = this.cost === 'latency' && (c.ttftObjectiveMs > 0 || c.tpotObjectiveMs > 0)
    if (objectives) this.markObjectives(c, slots, m)
    const out: Candidate[] = []
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      const overlap = c.overlap !== undefined && s < c.overlap.length ? (c.overlap[s] as number) : 0
      const row: Candidate = {
        workerId: this.workers.workerIdOf(s),
        dpRank: this.workers.dpRankOf(s),
        slot: s,
        overlapBlocks: overlap,
        prefillBlocks: this.prefillBlocks[i] as number,
        decodeBlocks: this.decodeBlocks[i] as number,
        logit: this.logits[i] as number,
        inFlight: this.seqs.inFlight[s] as number,
      }
      if (treeSizes !== undefined && s < treeSizes.length) row.treeSize = treeSizes[s] as number
      if (this.cost === 'latency') {
        row.ttftSecs = this.ttft[i] as number
        row.slowdownSecs = this.slowdown[i] as number
        row.queueingSecs = this.queueing[i] as number
        if (objectives) {
          row.tpotSecs = (this.tpot[i] as number) / 1000
          row.meetsObjectives = this.meets[i] === 1
        }
      }
      out.push(row)
    }
    return out
  }

  /**
   * Latency cost, a request with objectives (CostInputs.ttftObjectiveMs, tpotObjectiveMs): the
   * candidate predicted to meet every objective it carries at the least cost (nearTiePick among
   * them; neither sampling nor the replica spread applies), or -1 when none is. Predicted TTFT is
   * the cost's T(Q + U) there; predicted TPOT its engine model's decode step at its KV usage with
   * the request added. leastTtftPick() then has the predictions.
   */
  objectiveSelect(c: CostInputs, slots: Int32Array, m: number): number {
    this.computeLogits(c, slots, m)
    if (this.markObjectives(c, slots, m) === 0) return -1
    const logits = this.logits
    for (let i = 0; i < m; i++) if (this.meets[i] === 0) logits[i] = Infinity
    return slots[this.nearTiePick(slots, m)] as number
  }

  /** The candidate with the least predicted TTFT of the last objectiveSelect(): fewest in flight among equals, then the first. */
  leastTtftPick(slots: Int32Array, m: number): number {
    const ttft = this.ttft
    const inFlight = this.seqs.inFlight
    let best = 0
    for (let i = 1; i < m; i++) {
      const t = ttft[i] as number
      const b = ttft[best] as number
      if (t < b || (t === b && (inFlight[slots[i] as number] as number) < (inFlight[slots[best] as number] as number))) best = i
    }
    return slots[best] as number
  }

  /** Fills tpot[i] and meets[i] from the latency logits just computed; returns how many candidates meet the objectives. */
  private markObjectives(c: CostInputs, slots: Int32Array, m: number): number {
    const ttftMs = c.ttftObjectiveMs
    const tpotMs = c.tpotObjectiveMs
    let n = 0
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      // decodeBlocks[i] is its active blocks with the request's added (latencyLogits)
      const tpot = this.models.of(s).decodeMs(kvUsage(this.decodeBlocks[i] as number, this.workers.totalKvBlocks[s] as number))
      this.tpot[i] = tpot
      const ok = (!(ttftMs > 0) || (this.ttft[i] as number) * 1000 <= ttftMs) && (!(tpotMs > 0) || tpot <= tpotMs)
      this.meets[i] = ok ? 1 : 0
      if (ok) n++
    }
    return n
  }

  /** Index of the minimum logit; exact ties broken uniformly at random (see the header). */
  minPick(m: number): number {
    const logits = this.logits
    let best = Infinity
    let ties = 0
    for (let i = 0; i < m; i++) {
      const l = logits[i] as number
      if (l < best) {
        best = l
        ties = 1
      } else if (l === best) {
        ties++
      }
    }
    let j = ties > 1 ? this.rng.int(ties) : 0
    for (let i = m - 1; i >= 0; i--) if (logits[i] === best && j-- === 0) return i
    return 0
  }

  /** Whether the replica spread is on (other replicas are routing). */
  get spreading(): boolean {
    return this.spreadCount > 1
  }

  /** Replica spread: this replica is `rank` of `count` routing replicas; off (or count ≤ 1) restores the random tie-break. */
  setSpread(rank: number, count: number, on: boolean): void {
    const active = on && count > 1 && Number.isInteger(rank) && rank >= 0 && rank < count
    this.spreadCount = active ? count : 1
    this.spreadRank = active ? rank : 0
    if (this.spreadSeenUntil.length < this.spreadRank) this.spreadSeenUntil = new Float64Array(this.spreadRank * 2)
    this.spreadSeenUntil.fill(0)
  }

  /**
   * A booking of the k-th replica ranked before this one just arrived: until `until` (clock ms)
   * the request it was routing at this moment is taken as in view, not assumed.
   */
  spreadSeen(k: number, until: number): void {
    if (k >= 0 && k < this.spreadRank) this.spreadSeenUntil[k] = until
  }

  /** Index among the m candidates for this replica's rank (see the header); allocation-free. */
  spreadPick(c: CostInputs, slots: Int32Array, m: number): number {
    if (this.spreadLoad.length < m) {
      this.spreadLoad = new Float64Array(Math.max(m, this.spreadLoad.length * 2))
      this.spreadOwn = new Float64Array(this.spreadLoad.length)
    }
    const load = this.spreadLoad
    const own = this.spreadOwn
    const logits = this.logits
    const seqs = this.seqs
    const identity = this.workers.identity
    const bs = this.blockSize
    const w = c.weight
    const ov = c.overlap
    const ovLen = ov === undefined ? 0 : ov.length
    const shared = c.track === TRACK_SHARED
    const n = c.track === TRACK_NONE ? 0 : c.n
    const latency = this.cost === 'latency'
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      load[i] = logits[i] as number
      if (latency) {
        // the latency cost is already what this request adds there; one like it adds as much again
        own[i] = logits[i] as number
        continue
      }
      // what one more request like this one would add there: its prefill not cached there, and
      // its blocks, less those a request like it shares (the ones cached there, once booked)
      const p = w * ((this.prefillBlocks[i] as number) - (seqs.prefillTokens[s] as number) / bs)
      let d = (this.decodeBlocks[i] as number) - (seqs.activeBlocks[s] as number)
      if (shared && s < ovLen) d = Math.min(d, n - ((ov as ArrayLike<number>)[s] as number))
      own[i] = (p > 0 ? p : 0) + (d > 0 ? d : 0) + c.requestWeight
    }
    if (this.spreadUsed.length < m) this.spreadUsed = new Int32Array(this.spreadLoad.length)
    const used = this.spreadUsed
    used.fill(0, 0, m)
    // the replicas before this one whose request of this moment is not in view yet
    let before = 0
    for (let k = 0; k < this.spreadRank; k++) if ((this.spreadSeenUntil[k] as number) <= c.now) before++
    const inFlight = seqs.inFlight
    const blocks = seqs.activeBlocks
    let pick = 0
    for (let step = 0; step <= before; step++) {
      // under the latency cost, costs within NEAR_TIE of the least are equal (as in nearTiePick)
      let least = Infinity
      for (let i = 0; i < m; i++) least = Math.min(least, load[i] as number)
      const limit = latency ? least + NEAR_TIE * Math.abs(least) : least
      let bestUsed = 0
      let bestReq = 0
      let bestBlk = 0
      let bestId = 0
      let found = false
      for (let i = 0; i < m; i++) {
        if (!((load[i] as number) <= limit)) continue
        const s = slots[i] as number
        const u = used[i] as number
        const r = latency ? (inFlight[s] as number) : 0
        const b = latency ? (blocks[s] as number) : 0
        const id = identity[s] as number
        // a worker no earlier replica took, then (latency cost) the least loaded, then the
        // smaller identity hash: every replica computes the same order
        const better = !found || u < bestUsed || (u === bestUsed && (r < bestReq || (r === bestReq && (b < bestBlk || (b === bestBlk && id < bestId)))))
        if (better) {
          found = true
          bestUsed = u
          bestReq = r
          bestBlk = b
          bestId = id
          pick = i
        }
      }
      load[pick] = (load[pick] as number) + (own[pick] as number)
      used[pick] = (used[pick] as number) + 1
    }
    return pick
  }

  /**
   * Index of the least loaded candidate among those whose logit is within NEAR_TIE of the least:
   * fewest in flight, then fewest active blocks, then the lower logit, random among equals.
   */
  nearTiePick(slots: Int32Array, m: number): number {
    const logits = this.logits
    let best = Infinity
    for (let i = 0; i < m; i++) best = Math.min(best, logits[i] as number)
    const limit = nearTieLimit(best)
    const inFlight = this.seqs.inFlight
    const blocks = this.seqs.activeBlocks
    let req = Infinity
    let blk = Infinity
    let lg = Infinity
    let ties = 0
    for (let i = 0; i < m; i++) {
      const l = logits[i] as number
      if (!(l <= limit)) continue
      const s = slots[i] as number
      const r = inFlight[s] as number
      const b = blocks[s] as number
      if (r < req || (r === req && (b < blk || (b === blk && l < lg)))) {
        req = r
        blk = b
        lg = l
        ties = 1
      } else if (r === req && b === blk && l === lg) {
        ties++
      }
    }
    let j = ties > 1 ? this.rng.int(ties) : 0
    for (let i = m - 1; i >= 0; i--) {
      const s = slots[i] as number
      if (logits[i] === lg && inFlight[s] === req && blocks[s] === blk && j-- === 0) return i
    }
    return 0
  }

  /**
   * p_i ∝ exp(−(logit_i − min) / ((max − min) × T)); all equal → uniform. The first index whose
   * cumulative probability reaches u wins, the last one if rounding leaves u unreached.
   */
  softmaxPick(m: number, temperature: number): number {
    const logits = this.logits
    let min = Infinity
    let max = -Infinity
    for (let i = 0; i < m; i++) {
      const l = logits[i] as number
      if (l < min) min = l
      if (l > max) max = l
    }
    if (!(max > min)) return this.rng.int(m)
    const scale = 1 / ((max - min) * temperature)
    const weights = this.weights
    let sum = 0
    for (let i = 0; i < m; i++) {
      const e = Math.exp(-((logits[i] as number) - min) * scale)
      weights[i] = e
      sum += e
    }
    const u = this.rng.next() * sum
    let acc = 0
    for (let i = 0; i < m; i++) {
      acc += weights[i] as number
      if (acc >= u) return i
    }
    return m - 1
  }

  private countPresent(c: CostInputs, slots: Int32Array, m: number): Int32Array {
    const need = this.workers.slotCapacity
    if (this.present.length < need) this.present = new Int32Array(Math.max(need, this.present.length * 2))
    const present = this.present
    for (let i = 0; i < m; i++) present[slots[i] as number] = 0
    // Non-candidate slots may collect counts too; only candidates' entries are read, and they
    // were zeroed above, so stale values elsewhere never matter.
    this.seqs.countPresent(c.lo as ArrayLike<number>, c.hi as ArrayLike<number>, c.n, present)
    return present
  }

  private roundRobin(slots: Int32Array, m: number): number {
    // Candidates are ascending by slot: take the first one after the last pick, wrapping.
    // Keyed by slot rather than by position so that busy or removed workers do not skew the turn.
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      if (s > this.rrLast) {
        this.rrLast = s
        return s
      }
    }
    this.rrLast = slots[0] as number
    return this.rrLast
  }

  /** Fewest in-flight requests, then fewest active blocks, random among exact ties. */
  private leastLoaded(slots: Int32Array, from: number, to: number, device: number): number {
    const inFlight = this.seqs.inFlight
    const blocks = this.seqs.activeBlocks
    const devices = this.workers.device
    let bestReq = Infinity
    let bestBlocks = Infinity
    let chosen = -1
    let ties = 0
    for (let i = from; i < to; i++) {
      const s = slots[i] as number
      if (device >= 0 && (devices[s] === DEVICE_CPU ? 1 : 0) !== device) continue
      const r = inFlight[s] as number
      const b = blocks[s] as number
      if (r < bestReq || (r === bestReq && b < bestBlocks)) {
        bestReq = r
        bestBlocks = b
        chosen = s
        ties = 1
      } else if (r === bestReq && b === bestBlocks) {
        ties++
        if (this.rng.int(ties) === 0) chosen = s
      }
    }
    return chosen
  }

  private powerOfTwo(slots: Int32Array, m: number): number {
    if (m === 1) return slots[0] as number
    const i = this.rng.int(m)
    let j = this.rng.int(m - 1)
    if (j >= i) j++
    const a = slots[i] as number
    const b = slots[j] as number
    const ra = this.seqs.inFlight[a] as number
    const rb = this.seqs.inFlight[b] as number
    if (ra !== rb) return ra < rb ? a : b
    const ba = this.seqs.activeBlocks[a] as number
    const bb = this.seqs.activeBlocks[b] as number
    if (ba !== bb) return ba < bb ? a : b
    return this.rng.int(2) === 0 ? a : b
  }

  /**
   * Dynamo's device-aware selection: per device group (CPU, non-CPU) normalized_load = in-flight(group) /
   * (instances(group) × weight), weight 1 for CPU and the CUDA:CPU ratio otherwise; the lighter
   * group wins, then least-loaded inside it. An exact tie goes to the non-CPU group, as in
   * Dynamo (CPU is chosen only while strictly below its budget). One group present → least-loaded.
   */
  private deviceAware(slots: Int32Array, m: number): number {
    const inFlight = this.seqs.inFlight
    const devices = this.workers.device
    let cpuN = 0
    let cpuLoad = 0
    let gpuLoad = 0
    for (let i = 0; i < m; i++) {
      const s = slots[i] as number
      if (devices[s] === DEVICE_CPU) {
        cpuN++
        cpuLoad += inFlight[s] as number
      } else {
        gpuLoad += inFlight[s] as number
      }
    }
    const gpuN = m - cpuN
    if (cpuN === 0 || gpuN === 0) return this.leastLoaded(slots, 0, m, -1)
    const cpuNorm = cpuLoad / cpuN
    const gpuNorm = gpuLoad / (gpuN * this.cudaToCpuRatio)
    return this.leastLoaded(slots, 0, m, cpuNorm < gpuNorm ? 1 : 0)
  }
}

/** Costs at or below this are near-ties of the cheapest, `best` (latency cost). */
export function nearTieLimit(best: number): number {
  return best + NEAR_TIE * Math.abs(best)
}

/** The request's prompt tokens not cached on a worker-rank holding `overlap` of its blocks; none when prefill is not tracked. */
export function uncachedTokens(c: CostInputs, overlap: number, blockSize: number): number {
  // decode-only pools (prefill tracking off) compute no prompt here
  return c.trackPrefill ? c.isl - Math.min(overlap * blockSize, c.isl) : 0
}

/** The latency cost (seconds) of one candidate from its load: cost.ts's terms with its chunk. `terms` receives them. */
export function latencyCost(
  queued: number,
  uncached: number,
  inFlight: number,
  maxBatched: number,
  active: number,
  added: number,
  total: number,
  fleet: FleetLoad,
  terms: LatencyTerms,
  e: EngineModel,
): number {
  return latencyTerms(queued, uncached, inFlight, chunkTokens(maxBatched, inFlight), active, added, total, fleet, terms, e)
}

/** Dynamo's decode blocks: the active ones and the request's blocks not already active there (`present`). */
export function decodeBlocks(active: number, extra: number, present: number): number {
  return active + extra - present
}

/**
 * Prefill tokens the request would wait behind (`queued`) and compute on a worker-rank holding
 * `overlap` of its blocks, net of its credit; `minQueued`, `reqBlocks`: the credit decay's terms.
 */
export function prefillTokens(c: CostInputs, queued: number, overlap: number, bs: number, decay: number, minQueued: number, reqBlocks: number): number {
  if (!c.trackPrefill) return queued
  let credit = c.credit
  if (decay > 0) credit /= 1 + (decay * ((queued - minQueued) / bs)) / reqBlocks
  // A cached run longer than the prompt (a client's isl shorter than its hashes) counts as the
  // whole prompt: at credit 1 that is Dynamo's original max(0, isl − cached), and the cost stays
  // continuous in the credit. Above 1 the credit may exceed the prompt on purpose, and Dynamo
  // clamps the whole term at 0.
  const cached = Math.min(overlap * bs, c.isl)
  return Math.max(0, queued + c.isl - credit * cached)
}

/** Dynamo's logit from its prefill and decode blocks and the requests in flight. */
export function dynamoLogit(weight: number, prefillBlocks: number, decodeBlocks: number, requestWeight: number, inFlight: number): number {
  const l = weight * prefillBlocks + decodeBlocks
  return requestWeight !== 0 ? l + requestWeight * inFlight : l
}

/**
 * Dynamo-style debug lines for an explanation, one per candidate: Dynamo's formula, or under the
 * latency cost its three terms in seconds with what they were computed from.
 */
export function formatCandidates(rows: readonly Candidate[], weight: number): string {
  return rows
    .map((r) =>
      r.ttftSecs === undefined || r.slowdownSecs === undefined || r.queueingSecs === undefined
        ? `Formula for worker_id=${r.workerId} dp_rank=${r.dpRank}: ${r.logit.toFixed(3)} = ${weight} * ${r.prefillBlocks.toFixed(3)} + ` +
          `${r.decodeBlocks} (cached_blocks: ${r.overlapBlocks})`
        : `Formula for worker_id=${r.workerId} dp_rank=${r.dpRank}: ${r.logit.toFixed(4)} s = ttft ${r.ttftSecs.toFixed(4)} s (` +
          `${r.prefillBlocks.toFixed(3)} prefill blocks queued and uncached) + decode slowdown ${r.slowdownSecs.toFixed(4)} s (${r.inFlight} in ` +
          `flight, ${r.decodeBlocks} decode blocks) + queueing ${r.queueingSecs.toFixed(4)} s (cached_blocks: ${r.overlapBlocks})`,
    )
    .join('\n')
}
