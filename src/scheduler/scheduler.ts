// The scheduler façade the HTTP layer calls: candidates → (wait in the queue when
// every candidate is busy) → cost and selection → booking, plus the lifecycle calls that end a
// booking. Everything that changes load (prefill-complete, free, cancel, worker changes and a
// periodic recheck) gives waiting requests a chance to be dispatched.
//
//   schedule(req) ──► candidates ──► all queue-busy? ──yes──► PendingQueue ──drain──┐
//                         │                 │no                                    │
//                         │ none: 404/503   ▼                                      ▼
//                                      select + book ◄─────────────────────────────┘
//
// In kv mode at temperature 0 the candidates stay in LoadIndex and PrunedSelector makes the
// Selector's choice without scoring every one (candidates.ts, pruned-selector.ts); the rest, and a
// scheduler built with fullScan, list them and score them all.
import { KvrError } from '../errors.js'
import { ActiveSequences, TRACK_NONE, TRACK_SHARED, TRACK_UNIQUE } from './active-sequences.js'
import type { Booking } from './active-sequences.js'
import type { ApproxSink } from './approximate.js'
import { ApproxTracker, NO_SINK } from './approximate.js'
import type { BusyThresholds } from './busy.js'
import { queueBusy } from './busy.js'
import type { WorkerRankRef } from './candidates.js'
import { CandidateSets } from './candidates.js'
import type { SchedulerOptions, SchedulerOptionsInput } from './options.js'
import { resolveSchedulerOptions } from './options.js'
import { PendingQueue } from './pending-queue.js'
import { policyKey } from './queue-policy.js'
import { OverlapInput } from './overlap-input.js'
import { PrunedSelector } from './pruned-selector.js'
import { chunkTokens, kvUsage } from './cost.js'
import { EngineEstimator } from './engine-estimator.js'
import type { LearnedEngine } from './engine-estimator.js'
import { growTo } from './typed-arrays.js'
import { queueFull } from './rejection.js'
import { Objectives } from './objectives.js'
import type { ObjectiveCounts } from './objectives.js'
import type { Rng } from './rng.js'
import { Xoshiro128 } from './rng.js'
import type { Candidate } from './selector.js'
import { CostInputs, Selector } from './selector.js'
import type { WorkerRankInfo } from './worker-ranks.js'
import { WorkerRanks } from './worker-ranks.js'

/** Largest prompt length a request may declare: a u32, as token counts are. */
export const MAX_ISL = 0xffffffff

/** Per-request overrides (nvext.router_config_override). */
export interface RouterConfigOverride {
  overlapScoreWeight?: number
  overlapScoreCredit?: number
  temperature?: number
  assumeKvReuse?: boolean
  trackPrefillTokens?: boolean
}

export interface ScheduleRequest {
  /** Required when the request is booked (updateStates !== false). */
  id?: string
  /** Prompt length in tokens. */
  isl: number
  /** Cached prefix per slot, in blocks (0 or missing = no match), from the index or shard pool. */
  overlapBlocks?: ArrayLike<number>
  /**
   * The slots with a cached prefix: every slot whose overlapBlocks entry is not 0 (more may be
   * listed). Lets a decision find them without reading overlapBlocks whole; without overlapBlocks,
   * overlapValues gives their blocks, entry for entry (the route path's form: nothing per slot).
   */
  overlapSlots?: ArrayLike<number>
  overlapValues?: ArrayLike<number>
  /** Blocks each slot holds in the index; shown in explanations only. */
  treeSizes?: ArrayLike<number>
  /** Chained sequence hashes of the complete blocks (u64 as halves): load tracking, approximate mode. */
  seqLo?: Uint32Array
  seqHi?: Uint32Array
  /** Number of hashes in seqLo/seqHi to use; defaults to their length. */
  blockCount?: number
  /** Local block hashes, needed only in approximate mode (tokens_hash of the synthetic Stored). */
  localLo?: Uint32Array
  localHi?: Uint32Array
  /** nvext.agent_hints.priority; negative counts as 0 in the queue, and makes a request with objectives sheddable. */
  priority?: number
  /** Latency objectives, ms, each in (0, 10^7] (x-slo-ttft-ms, x-slo-tpot-ms, nvext.slo; objectives.ts). */
  ttftObjectiveMs?: number
  tpotObjectiveMs?: number
  /** Pin (backend_instance_id / direct mode): the worker, and optionally its rank. */
  workerId?: bigint
  dpRank?: number
  overrides?: RouterConfigOverride
  /** false = query only (/v1/route without update_states): nothing is booked, the queue is skipped. */
  updateStates?: boolean
  /** Build the candidates table. */
  explain?: boolean
  /**
   * Worker-ranks this request must not go to: the ones a proxy retry has already tried. Named by
   * identity, not slot: a slot freed by a removal is handed to the next registration, and that
   * worker has not been tried.
   */
  exclude?: readonly WorkerRankRef[]
  /** Aborting it while the request waits removes it from the queue (client went away). */
  signal?: CancelSignal
}

/** What the scheduler needs of a cancellation signal; an AbortSignal is one. */
export interface CancelSignal {
  readonly aborted: boolean
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void
  removeEventListener(type: 'abort', listener: () => void): void
}

export interface RouteDecision {
  requestId: string | undefined
  slot: number
  workerId: bigint
  dpRank: number
  /** The chosen worker-rank's cached prefix in blocks. */
  overlapBlocks: number
  booked: boolean
  /** Time spent in the queue (ms on the scheduler's clock); 0 when it did not wait. */
  waitedMs: number
  /** Only when req.explain: every candidate with overlap, prefill/decode blocks and logit. */
  candidates: Candidate[] | undefined
}

/**
 * Told of this router's bookings as they are made and end (replica sync publishes them). Called
 * synchronously on the routing path: the booking is the scheduler's scratch, valid only during the call.
 */
export interface BookingObserver {
  booked(id: string, b: Readonly<Booking>): void
  prefillCompleted(id: string, slot: number): void
  freed(id: string, slot: number): void
}

/** What became of another replica's booking handed to the scheduler. */
export type RemoteOutcome = 'applied' | 'unknown_worker' | 'duplicate'

export interface SchedulerDeps {
  /** Share a table with other components; a new one otherwise. */
  workers?: WorkerRanks
  /** Milliseconds, monotonic. Default performance.now. */
  clock?: () => number
  rng?: Rng
  /**
   * Receives the predicted blocks: of every worker-rank in approximate mode, else of the ones
   * marked with setPredicted (workers that send no KV events). Required in approximate mode.
   */
  approxSink?: ApproxSink
  /** false: no interval timers; the owner calls recheck() (tests). Default true. */
  timers?: boolean
  /**
   * Score every candidate in every decision: the reference the pruned selection is tested and
   * benchmarked against (it chooses the same). Default false.
   */
  fullScan?: boolean
}

export interface SlotStats {
  slot: number
  workerId: bigint
  dpRank: number
  activeBlocks: number
  prefillTokens: number
  inFlight: number
}

export interface SchedulerStats {
  queueDepth: number
  queueMaxPending: number
  decisionsTotal: number
  /** Of them, made by the pruned selection (the rest scored every candidate). */
  prunedTotal: number
  /** Requests with latency objectives by outcome. */
  objectives: ObjectiveCounts
  queuedTotal: number
  queueFullTotal: number
  allBusyTotal: number
  cancelledTotal: number
  staleExpiredTotal: number
  /** Of them, other replicas' bookings. */
  remoteExpiredTotal: number
  waitCount: number
  waitSumMs: number
  waitMaxMs: number
  bookedRequests: number
  /** Other replicas' bookings held (replica sync). */
  remoteBookings: number
  approximateBlocks: number
  slots: SlotStats[]
}

interface Waiter {
  req: ScheduleRequest
  id: string
  resolve: (d: RouteDecision) => void
  reject: (e: unknown) => void
  enqueuedAt: number
  onAbort: (() => void) | undefined
}

const WAIT_SAMPLES = 4096

export class Scheduler {
  readonly options: SchedulerOptions
  readonly workers: WorkerRanks
  readonly sequences: ActiveSequences

  private readonly clock: () => number
  private readonly selector: Selector
  private readonly cands: CandidateSets
  private readonly pruned: PrunedSelector | undefined
  private readonly queue = new PendingQueue()
  private readonly approx: ApproxTracker | undefined
  /** Predict-on-route: each booked prompt's blocks on its worker-rank for predictedTtlSecs. */
  private readonly routed: ApproxTracker | undefined
  /** The overlap the selection sees when predict-on-route adds to the index's. */
  private merged = new Float64Array(8)
  /** Per slot, 1 when its cache is predicted from decisions (all slots in approximate mode). */
  private predicted = new Uint8Array(8)
  private readonly cost = new CostInputs()
  /** Each worker-rank's engine model for the latency cost, learned from its requests (or the default one when learning is off). */
  private readonly estimator: EngineEstimator
  private readonly objectives: Objectives
  private readonly epoch: number
  private readonly overlap: OverlapInput
  /** OverlapInput.best() of the request tryRoute last found waiting. */
  private waitBest = 0
  private waiters: (Waiter | undefined)[] = []
  private freeWaiters: number[] = []
  private readonly waitingIds = new Map<string, number>()
  /** Pinned waiters popped by drainQueue() whose own ranks are still busy (reused list). */
  private readonly blocked: number[] = []
  private draining = false
  private timers: ReturnType<typeof setInterval>[] = []
  /** Told of every booking this router makes and ends (replica sync), or null. */
  observer: BookingObserver | null = null

  private decisionsTotal = 0
  private prunedTotal = 0
  private queuedTotal = 0
  private queueFullTotal = 0
  private cancelledTotal = 0
  private waitCount = 0
  private waitSumMs = 0
  private waitMaxMs = 0
  private waitSamples = new Float64Array(WAIT_SAMPLES)
  private waitSampleN = 0

  constructor(options: SchedulerOptionsInput = {}, deps: SchedulerDeps = {}) {
    this.options = resolveSchedulerOptions(options)
    const o = this.options
    this.clock = deps.clock ?? (() => performance.now())
    this.workers = deps.workers ?? new WorkerRanks()
    this.sequences = new ActiveSequences(o.staleRequestSecs * 1000)
    this.sequences.ensureSlots(this.workers.slotCapacity)
    const rng = deps.rng ?? new Xoshiro128(o.seed)
    this.estimator = new EngineEstimator(o.learnEngines && o.mode === 'kv' && o.cost === 'latency')
    const models = this.estimator.models
    this.selector = new Selector(this.workers, this.sequences, rng, o.blockSize, o.cudaToCpuRatio, o.cost, models)
    this.objectives = new Objectives(o, this.selector)
    const indexed = o.mode === 'kv' && deps.fullScan !== true
    this.cands = new CandidateSets(this.workers, this.sequences, o, indexed, models)
    this.overlap = new OverlapInput(this.workers)
    const index = this.cands.index
    this.pruned = index === undefined ? undefined : new PrunedSelector(index, this.workers, this.sequences, rng, o.blockSize, o.cost, models)
    // a worker-rank whose model moved to another grid cell changes family in the load index
    if (index !== undefined) this.estimator.onChange = (slot) => index.refresh(slot)
    this.epoch = this.clock()
    if (o.approximate.enabled && deps.approxSink === undefined) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', 'options.approximate.enabled needs an approxSink to receive the predicted blocks')
    }
    if (deps.approxSink !== undefined) {
      this.approx = new ApproxTracker(this.workers, deps.approxSink, {
        ttlMs: o.approximate.ttlSecs * 1000,
        maxTreeSize: o.approximate.maxTreeSize,
        pruneTargetRatio: o.approximate.pruneTargetRatio,
      })
    }
    if (o.predictedTtlSecs > 0)
      this.routed = new ApproxTracker(this.workers, NO_SINK, {
        ttlMs: o.predictedTtlSecs * 1000,
        maxTreeSize: o.approximate.maxTreeSize,
        pruneTargetRatio: o.approximate.pruneTargetRatio,
      })
    if (deps.timers !== false) {
      if (o.queueRecheckMs > 0) this.timers.push(setInterval(() => this.recheck(), o.queueRecheckMs))
      if (this.routed !== undefined) {
        const routed = this.routed
        this.timers.push(setInterval(() => routed.expire(this.clock()), Math.min(1000, o.predictedTtlSecs * 1000)))
      }
      if (this.approx !== undefined) {
        const approx = this.approx
        this.timers.push(setInterval(() => approx.expire(this.clock()), Math.min(1000, o.approximate.ttlSecs * 1000)))
      }
      for (const t of this.timers) t.unref()
    }
  }

  // ---- worker-ranks ----

  addWorkerRank(workerId: bigint, dpRank: number, info?: WorkerRankInfo): number {
    const fresh = this.workers.slotOf(workerId, dpRank) < 0
    const slot = this.workers.register(workerId, dpRank, info)
    // a new worker-rank starts from the prior; a registration updated keeps what was learned
    if (fresh) this.estimator.reset(slot, true)
    this.sequences.ensureSlots(this.workers.slotCapacity)
    if (this.predicted.length < this.workers.slotCapacity) this.predicted = growTo(this.predicted, this.workers.slotCapacity)
    this.cands.added(slot, workerId)
    this.drainQueue()
    return slot
  }

  /**
   * Removes a worker-rank; its booked requests are dropped (their ids are returned, and free()
   * on them is a no-op from now on). Waiters pinned to it are refused with UNKNOWN_WORKER.
   */
  removeWorkerRank(workerId: bigint, dpRank: number): string[] {
    const slot = this.workers.remove(workerId, dpRank)
    if (slot < 0) return []
    this.cands.removed(slot, this.workers.workerIndex[slot] as number, workerId)
    const dropped = this.forgetSlot(slot)
    this.afterRemoval()
    return dropped
  }

  removeWorker(workerId: bigint): string[] {
    const out: string[] = []
    for (const slot of this.workers.removeWorker(workerId)) {
      this.cands.removed(slot, this.workers.workerIndex[slot] as number, workerId)
      out.push(...this.forgetSlot(slot))
    }
    if (out.length > 0 || this.queue.size > 0) this.afterRemoval()
    return out
  }

  /**
   * Marks a worker's ranks as predicted (its routed prompts count as cached there for the
   * approximate TTL, as in approximate mode) or not. Turning it off forgets the predictions
   * without events: the caller resets what the index holds of the worker.
   */
  setPredicted(workerId: bigint, on: boolean): void {
    if (this.approx === undefined) return
    for (const slot of this.workers.slotsOf(workerId)) {
      if (!on && this.predicted[slot] === 1) this.approx.removeSlot(slot)
      this.predicted[slot] = on ? 1 : 0
    }
  }

  /**
   * Holds a worker out of routing (its ranks are no candidates unless a request is pinned to it),
   * or lets it back. Ranks it registers later are held as well. Waiters that no worker is left
   * for are refused; a worker let back may take waiters.
   */
  setHeld(workerId: bigint, on: boolean): void {
    if (!this.cands.setHeld(workerId, on)) return
    if (on) this.afterRemoval()
    else this.drainQueue()
  }

  /** Whether the worker-rank's worker is held out of routing. */
  isHeld(slot: number): boolean {
    return this.cands.isHeld(slot)
  }

  /** Whether the worker-rank is past a load-shedding threshold or the queue threshold. */
  isBusy(slot: number): boolean {
    const t = this.options.queueThreshold
    return this.cands.eligibility.overloaded(slot) || (t !== null && queueBusy(slot, t, this.sequences, this.workers))
  }

  /** Whether the worker-rank's cache is predicted rather than known from its events. */
  isPredicted(slot: number): boolean {
    return this.options.approximate.enabled || this.predicted[slot] === 1
  }

  // ---- load shedding thresholds (GET/POST /busy_threshold) ----

  /**
   * A worker-rank's own load report (`kv_metrics`): its active KV blocks, and its
   * capacity when the registration did not give one. Load shedding uses the larger of
   * this and the router's own booking count, so load from other routers counts too.
   * False when the worker-rank is not registered.
   */
  reportLoad(workerId: bigint, dpRank: number, activeBlocks: number | null, totalBlocks: number | null): boolean {
    const slot = this.workers.slotOf(workerId, dpRank)
    if (slot < 0) return false
    if (activeBlocks !== null && Number.isFinite(activeBlocks) && activeBlocks >= 0) this.workers.reportedActiveBlocks[slot] = activeBlocks
    if (totalBlocks !== null && Number.isFinite(totalBlocks) && totalBlocks > 0 && this.workers.totalKvBlocks[slot] === 0)
      this.workers.totalKvBlocks[slot] = totalBlocks
    this.cands.reported(slot)
    return true
  }

  busyThresholds(): BusyThresholds {
    return this.cands.eligibility.thresholds
  }

  /** Live edit of the load-shedding thresholds; null clears one, an omitted one is kept. */
  setBusyThresholds(patch: Partial<BusyThresholds>): BusyThresholds {
    this.cands.eligibility.setThresholds(patch)
    this.cands.thresholdsChanged()
    this.drainQueue()
    return this.cands.eligibility.thresholds
  }

  // ---- routing ----

  /**
   * Routes a request: resolves with the decision at once, or after waiting in the queue when
   * every candidate is busy. Rejects with KvrError: NO_WORKERS, UNKNOWN_WORKER, ALL_WORKERS_BUSY,
   * QUEUE_FULL and OBJECTIVE_UNMET (RetryableError, 503), REQUEST_CANCELLED, DUPLICATE_REQUEST, INVALID_OPTION.
   */
  schedule(req: ScheduleRequest): Promise<RouteDecision> {
    try {
      if (req.signal?.aborted === true) throw new KvrError('KVR_ERR_REQUEST_CANCELLED', `request ${req.id ?? ''} was cancelled before it was routed`)
      const decision = this.tryRoute(req)
      if (decision !== null) return Promise.resolve(decision)
      return this.enqueue(req)
    } catch (err) {
      return Promise.reject(err)
    }
  }

  /** Synchronous routing: the decision, or null when the request would have to wait. */
  tryRoute(req: ScheduleRequest): RouteDecision | null {
    const booked = this.checkRequest(req)
    let decision: RouteDecision
    const expired = this.sequences.expiredTotal
    try {
      this.prepare(req)
      const m = this.candidates(req)
      const t = this.options.queueThreshold
      if (booked && t !== null && this.cands.allQueueBusy(m, t)) {
        // wspt's key, from the candidates it has now (enqueue follows)
        this.waitBest = this.overlap.best(this.cands)
        return null
      }
      decision = this.decide(req, m, 0)
    } finally {
      this.overlap.clear()
    }
    // Booking expires stale requests lazily; the load they held may let a waiter run.
    if (this.sequences.expiredTotal !== expired) this.drainQueue()
    return decision
  }

  /**
   * The first token arrived: the request's prompt is no longer queued work. `observed`: it did
   * just now (a stream's first event), so its time to first token teaches the worker-rank's engine
   * model; false when the answer came whole and the moment is unknown.
   */
  markPrefillComplete(id: string, observed = true): boolean {
    if (observed) this.estimator.firstToken(id, this.clock())
    return this.progress(id, false)
  }

  /**
   * Ends a booked request. Idempotent: false when unknown or already freed. `outputTokens`: the
   * tokens it streamed, for its inter-token time (0 = not known).
   */
  free(id: string, outputTokens = 0): boolean {
    this.estimator.ended(id, outputTokens, this.clock())
    return this.progress(id, true)
  }

  /** A worker-rank's engine model as the latency cost uses it, with how sure it is; null when learning is off. */
  learnedEngine(slot: number): LearnedEngine | null {
    return this.workers.live[slot] === 1 ? this.estimator.learned(slot) : null
  }

  /** The request's prefill completed, or (`ended`) the request ended: the observer hears of it, and waiters may run. */
  private progress(id: string, ended: boolean): boolean {
    const slot = this.observer === null ? -1 : this.sequences.slotOfRequest(id)
    const ok = ended ? this.sequences.free(id) : this.sequences.markPrefillComplete(id)
    if (ok) {
      if (slot >= 0) {
        if (ended) this.observer?.freed(id, slot)
        else this.observer?.prefillCompleted(id, slot)
      }
      this.drainQueue()
    }
    return ok
  }

  // ---- other replicas' bookings (replica sync) ----

  /**
   * Books another replica's request on (workerId, dpRank) as if it were this router's: its
   * prefill tokens and blocks load the worker-rank in cost and busy checks. `key` is unique per
   * owner and request; owner ≥ 1 names the replica. `b` is the booking as the peer tells it (isl,
   * overlapBlocks, prefillTokens, n hashes in lo/hi); its slot, track and prefill are set here as
   * this router counts them: the hashes as shared blocks unless active-block tracking is off, the
   * prefill tokens only when prefill tracking is on.
   */
  addRemote(key: string, owner: number, workerId: bigint, dpRank: number, b: Booking): RemoteOutcome {
    const slot = this.workers.slotOf(workerId, dpRank)
    if (slot < 0) return 'unknown_worker'
    if (this.sequences.activeBlocks.length < this.workers.slotCapacity) this.sequences.ensureSlots(this.workers.slotCapacity)
    const o = this.options
    b.slot = slot
    b.track = o.trackActiveBlocks && b.n > 0 ? TRACK_SHARED : TRACK_NONE
    b.trackPrefill = o.trackPrefillTokens
    b.prefillTokens = o.trackPrefillTokens && b.prefillTokens > 0 ? Math.min(b.prefillTokens, MAX_ISL) : 0
    const h = this.sequences.addRemote(key, owner, b, this.clock())
    return h < 0 ? 'duplicate' : 'applied'
  }

  /** Slot of the worker-rank (tests and replica sync); -1 when not registered. */
  slotOf(workerId: bigint, dpRank: number): number {
    return this.workers.slotOf(workerId, dpRank)
  }

  markRemotePrefillComplete(key: string): boolean {
    const ok = this.sequences.markRemotePrefillComplete(key)
    if (ok) this.drainQueue()
    return ok
  }

  freeRemote(key: string): boolean {
    const ok = this.sequences.freeRemote(key)
    if (ok) this.drainQueue()
    return ok
  }

  /** Drops every booking of a replica that went away; returns how many. */
  dropRemoteOwner(owner: number): number {
    const n = this.sequences.dropOwner(owner)
    if (n > 0) this.drainQueue()
    return n
  }

  /**
   * Replica spread (kv mode, temperature 0; see Selector): this replica is `rank` of `count`
   * routing replicas; off or count 1 restores the plain minimum with random ties.
   */
  setSpread(rank: number, count: number, on: boolean): void {
    this.selector.setSpread(rank, count, on)
  }

  /** A booking of the k-th replica ranked before this one arrived: for forMs it counts as the one it routes now. */
  spreadSeen(k: number, forMs: number): void {
    this.selector.spreadSeen(k, this.clock() + forMs)
  }

  /** The client went away: a waiting request leaves the queue, a booked one is freed. */
  cancel(id: string): boolean {
    const h = this.waitingIds.get(id)
    if (h === undefined) return this.free(id)
    const w = this.takeWaiter(h)
    this.queue.remove(h)
    this.cancelledTotal++
    w.reject(new KvrError('KVR_ERR_REQUEST_CANCELLED', `request ${id} was cancelled while it waited in the router queue`))
    return true
  }

  isWaiting(id: string): boolean {
    return this.waitingIds.has(id)
  }

  /** Periodic work: stale bookings expire, approximate entries expire, the queue drains. */
  recheck(): void {
    const now = this.clock()
    this.sequences.expireStale(now)
    this.approx?.expire(now)
    this.drainQueue()
  }

  /** Stops the timers and refuses every waiting request. */
  close(): void {
    for (const t of this.timers) clearInterval(t)
    this.timers = []
    for (const id of [...this.waitingIds.keys()]) this.cancel(id)
  }

  // ---- metrics ----

  stats(): SchedulerStats {
    const slots: SlotStats[] = []
    const w = this.workers
    const s = this.sequences
    for (let i = 0; i < w.liveCount; i++) {
      const slot = w.liveSlots[i] as number
      slots.push({
        slot,
        workerId: w.workerIdOf(slot),
        dpRank: w.dpRankOf(slot),
        activeBlocks: s.activeBlocks[slot] as number,
        prefillTokens: s.prefillTokens[slot] as number,
        inFlight: s.inFlight[slot] as number,
      })
    }
    return {
      queueDepth: this.queue.size,
      queueMaxPending: this.options.queueMaxPending,
      decisionsTotal: this.decisionsTotal,
      prunedTotal: this.prunedTotal,
      objectives: { ...this.objectives.counts },
      queuedTotal: this.queuedTotal,
      queueFullTotal: this.queueFullTotal,
      allBusyTotal: this.cands.allBusyTotal,
      cancelledTotal: this.cancelledTotal,
      staleExpiredTotal: s.expiredTotal,
      remoteExpiredTotal: s.expiredRemoteTotal,
      waitCount: this.waitCount,
      waitSumMs: this.waitSumMs,
      waitMaxMs: this.waitMaxMs,
      bookedRequests: s.size,
      remoteBookings: s.remoteSize,
      approximateBlocks: this.approx?.size ?? 0,
      slots,
    }
  }

  /** Queue wait times (ms) recorded since the last call, oldest first (at most the last 4096). */
  takeWaitSamples(): number[] {
    const n = Math.min(this.waitSampleN, WAIT_SAMPLES)
    const out: number[] = []
    for (let k = this.waitSampleN - n; k < this.waitSampleN; k++) out.push(this.waitSamples[k % WAIT_SAMPLES] as number)
    this.waitSampleN = 0
    return out
  }

  // ---- internals ----

  /** Validates what the hot path relies on; returns whether the request is to be booked. */
  private checkRequest(req: ScheduleRequest): boolean {
    const booked = req.updateStates !== false
    if (booked) {
      const id = req.id
      if (typeof id !== 'string' || id.length === 0)
        throw new KvrError('KVR_ERR_INVALID_OPTION', 'request.id must be a non-empty string when the request is booked')
      if (this.sequences.has(id) || this.waitingIds.has(id)) throw new KvrError('KVR_ERR_DUPLICATE_REQUEST', `request ${id} is already booked or waiting`)
    }
    const isl = req.isl
    // bounded so that sums of bookings stay exact doubles: one of 1e300 would absorb every other
    // booking's tokens into it and leave its worker busy for good
    if (typeof isl !== 'number' || !(isl >= 0) || !(isl <= MAX_ISL))
      throw new KvrError('KVR_ERR_INVALID_OPTION', `request.isl must be a number in [0, 2^32), got ${String(isl)}`)
    this.objectives.check(req)
    return booked
  }

  /** Fills the reusable cost inputs from the request and the options. */
  private prepare(req: ScheduleRequest): void {
    const o = this.options
    const c = this.cost
    const ov = req.overrides
    c.isl = req.isl
    c.overlap = this.overlap.dense(req)
    if (this.routed !== undefined && this.routed.size > 0) {
      const merged = this.withRouted(req, c.overlap)
      if (merged !== c.overlap) this.overlap.raised()
      c.overlap = merged
    }
    c.weight = o.overlapScoreWeight
    c.credit = o.overlapScoreCredit
    c.creditDecay = o.overlapScoreCreditDecay
    c.requestWeight = o.decodeActiveRequestWeight
    c.temperature = o.temperature
    if (this.selector.spreading) c.now = this.clock()
    c.trackPrefill = o.trackPrefillTokens
    c.ttftObjectiveMs = req.ttftObjectiveMs ?? 0
    c.tpotObjectiveMs = req.tpotObjectiveMs ?? 0
    let reuse = o.assumeKvReuse
    if (ov !== undefined) {
      if (ov.overlapScoreWeight !== undefined) c.weight = checkNonNegative('overrides.overlapScoreWeight', ov.overlapScoreWeight)
      if (ov.overlapScoreCredit !== undefined) c.credit = checkNonNegative('overrides.overlapScoreCredit', ov.overlapScoreCredit)
      if (ov.temperature !== undefined) c.temperature = checkNonNegative('overrides.temperature', ov.temperature)
      if (ov.trackPrefillTokens !== undefined) c.trackPrefill = ov.trackPrefillTokens === true
      if (ov.assumeKvReuse !== undefined) reuse = ov.assumeKvReuse === true
    }
    const n = hashCount(req)
    c.lo = undefined
    c.hi = undefined
    c.n = 0
    c.track = TRACK_NONE
    if (!o.trackActiveBlocks) return
    if (!reuse) {
      // One fresh random hash per complete block upstream: never shared, so only the count matters.
      c.track = TRACK_UNIQUE
      c.n = req.seqLo !== undefined && req.seqHi !== undefined ? n : Math.floor(req.isl / o.blockSize)
    } else if (n > 0) {
      c.track = TRACK_SHARED
      c.lo = req.seqLo
      c.hi = req.seqHi
      c.n = n
    }
  }

  /**
   * The index's overlap raised, per worker-rank, to the prompt's leading blocks routed there
   * within predictedTtlSecs: a follow-up sent before its parent's events arrive, or a burst of
   * one prompt, finds the prefix where it will be.
   */
  private withRouted(req: ScheduleRequest, base: ArrayLike<number> | undefined): ArrayLike<number> | undefined {
    const routed = this.routed as ApproxTracker
    const lo = req.seqLo
    const hi = req.seqHi
    const n = hashCount(req)
    if (lo === undefined || hi === undefined || n === 0) return base
    const w = this.workers
    if (this.merged.length < w.slotCapacity) this.merged = new Float64Array(w.slotCapacity)
    const m = this.merged
    m.fill(0)
    if (base !== undefined) for (let i = Math.min(base.length, m.length) - 1; i >= 0; i--) m[i] = base[i] as number
    const now = this.clock()
    let any = false
    for (let i = 0; i < w.liveCount; i++) {
      const slot = w.liveSlots[i] as number
      const d = routed.prefixDepth(slot, lo, hi, n, now)
      if (d > (m[slot] as number)) {
        m[slot] = d
        any = true
      }
    }
    return any ? m : base
  }

  /**
   * The request's candidates (CandidateSets.collect); throws when there is none. The pruned
   * selection takes a request not pinned to a worker, in kv mode at temperature 0 without the
   * replica spread or an explanation, and under Dynamo's cost at the options' weight.
   */
  private candidates(req: ScheduleRequest): number {
    const w = this.workers
    if (this.sequences.activeBlocks.length < w.slotCapacity) this.sequences.ensureSlots(w.slotCapacity)
    const c = this.cost
    const o = this.options
    // objectives are weighed against every candidate's predictions: listed, as pinned and explained requests are
    const pruned =
      this.pruned !== undefined &&
      req.explain !== true &&
      !this.objectives.predicted(req) &&
      c.temperature === 0 &&
      !this.selector.spreading &&
      (o.cost === 'latency' || c.weight === o.overlapScoreWeight)
    const m = this.cands.collect(req, pruned)
    // the credit decay's reference is the least booked prefill among the candidates: the index
    // knows it only when it is 0
    if (!this.cands.listed && o.cost === 'dynamo' && c.trackPrefill && c.creditDecay > 0 && this.cands.unqueued === 0) return this.cands.collect(req, false)
    return m
  }

  /** The pruned selection's choice, or the full scan's when it finds no comparable cost. */
  private prunedSelect(req: ScheduleRequest): number {
    this.overlap.matchedSlots(this.cost.overlap)
    const slot = (this.pruned as PrunedSelector).select(this.cost, this.overlap.matched, this.overlap.matchedN, this.cands)
    if (slot >= 0) {
      this.prunedTotal++
      return slot
    }
    const k = this.cands.collect(req, false)
    return this.selector.select(this.options.mode, this.cost, this.cands.eligibility.slots, k)
  }

  /** Selection and booking over the m candidates prepared by candidates(). */
  private decide(req: ScheduleRequest, m: number, waitedMs: number): RouteDecision {
    const c = this.cost
    const slots = this.cands.eligibility.slots
    const listed = this.cands.listed
    const candidates = req.explain === true && listed ? this.selector.explain(c, slots, m, req.treeSizes) : undefined
    let slot: number
    if (listed && this.objectives.predicted(req)) slot = this.objectives.select(req, c, slots, m)
    else {
      slot = listed ? this.selector.select(this.options.mode, c, slots, m) : this.prunedSelect(req)
      this.objectives.unpredicted(req)
    }
    const ov = c.overlap
    const overlap = ov !== undefined && slot < ov.length ? (ov[slot] as number) : 0
    const booked = req.updateStates !== false
    if (booked) {
      const now = this.clock()
      const fresh = c.isl - overlap * this.options.blockSize
      // the cost inputs already hold the request's prompt and blocks: with the choice they are its booking
      c.slot = slot
      c.overlapBlocks = overlap
      c.prefillTokens = c.trackPrefill && fresh > 0 ? fresh : 0
      if (this.estimator.enabled) this.observeBooking(req.id as string, slot, fresh, now)
      this.sequences.add(req.id as string, c, now)
      this.observer?.booked(req.id as string, c)
      if (this.routed !== undefined && req.seqLo !== undefined && req.seqHi !== undefined) {
        this.routed.record(slot, req.seqLo, req.seqHi, req.seqLo, req.seqHi, Math.min(hashCount(req), req.seqLo.length, req.seqHi.length), now)
      }
      const approx = this.approx
      if (
        approx !== undefined &&
        (this.options.approximate.enabled || this.predicted[slot] === 1) &&
        req.localLo !== undefined &&
        req.localHi !== undefined &&
        req.seqLo !== undefined &&
        req.seqHi !== undefined
      ) {
        approx.record(slot, req.localLo, req.localHi, req.seqLo, req.seqHi, Math.min(hashCount(req), req.localLo.length, req.localHi.length), now)
      }
    }
    this.decisionsTotal++
    return {
      requestId: req.id,
      slot,
      workerId: this.workers.workerIdOf(slot),
      dpRank: this.workers.dpRankOf(slot),
      overlapBlocks: overlap,
      booked,
      waitedMs,
      candidates,
    }
  }

  private enqueue(req: ScheduleRequest): Promise<RouteDecision> {
    const o = this.options
    if (this.queue.size >= o.queueMaxPending) {
      this.queueFullTotal++
      throw queueFull(o.queueMaxPending, o.retryAfterSecs)
    }
    const id = req.id as string
    const now = this.clock()
    // wspt: the work left after the best cache hit among this request's candidates.
    const newTokens = Math.max(0, req.isl - this.waitBest * o.blockSize)
    const key = policyKey(o.queuePolicy, req.priority, (now - this.epoch) / 1000, newTokens)
    const h = this.freeWaiters.pop() ?? this.waiters.length
    this.queuedTotal++
    return new Promise<RouteDecision>((resolve, reject) => {
      const signal = req.signal
      const onAbort = signal === undefined ? undefined : () => this.cancel(id)
      this.waiters[h] = { req, id, resolve, reject, enqueuedAt: now, onAbort }
      this.waitingIds.set(id, h)
      this.queue.push(h, key)
      if (signal !== undefined && onAbort !== undefined) signal.addEventListener('abort', onAbort, { once: true })
    })
  }

  private takeWaiter(h: number): Waiter {
    const w = this.waiters[h] as Waiter
    this.waiters[h] = undefined
    this.freeWaiters.push(h)
    this.waitingIds.delete(w.id)
    if (w.onAbort !== undefined) w.req.signal?.removeEventListener('abort', w.onAbort)
    return w
  }

  /** Dispatches waiting requests, best key first, while some candidate is not busy. */
  private drainQueue(): void {
    const t = this.options.queueThreshold
    if (this.draining || this.queue.size === 0 || t === null) return
    this.draining = true
    try {
      const blocked = this.blocked
      while (this.queue.size > 0) {
        if (this.cands.openAllQueueBusy(t).busy) break
        const h = this.queue.pop()
        const waiter = this.waiters[h] as Waiter
        const req = waiter.req
        try {
          this.prepare(req)
          const k = this.candidates(req)
          // Some worker is free, but a pinned request may only run on its own ranks, and a retry
          // not on those it has tried: it keeps its place while requests behind it that can run
          // now go ahead.
          if ((req.workerId !== undefined || (req.exclude !== undefined && req.exclude.length > 0)) && this.cands.allQueueBusy(k, t)) {
            blocked.push(h)
            continue
          }
          this.takeWaiter(h)
          const waited = this.clock() - waiter.enqueuedAt
          const decision = this.decide(req, k, waited)
          this.recordWait(waited)
          waiter.resolve(decision)
        } catch (err) {
          if (this.waiters[h] === waiter) this.takeWaiter(h)
          waiter.reject(err)
        } finally {
          this.overlap.clear()
        }
      }
    } finally {
      for (const h of this.blocked) this.queue.restore(h)
      this.blocked.length = 0
      this.draining = false
    }
  }

  private recordWait(ms: number): void {
    this.waitCount++
    this.waitSumMs += ms
    if (ms > this.waitMaxMs) this.waitMaxMs = ms
    this.waitSamples[this.waitSampleN % WAIT_SAMPLES] = ms
    this.waitSampleN++
  }

  /** Waiters pinned to a worker-rank that no longer exists can never run: refuse them now. */
  private afterRemoval(): void {
    for (const [id, h] of [...this.waitingIds]) {
      const req = (this.waiters[h] as Waiter).req
      let err: KvrError | undefined
      if (req.workerId !== undefined) {
        const gone = req.dpRank !== undefined ? this.workers.slotOf(req.workerId, req.dpRank) < 0 : this.workers.slotsOf(req.workerId).length === 0
        if (gone) err = new KvrError('KVR_ERR_UNKNOWN_WORKER', `request ${id} waited for worker ${req.workerId}, which was removed`)
      } else if (req.exclude !== undefined && req.exclude.length > 0 && !this.cands.anyLiveOutside(req.exclude)) {
        err = new KvrError('KVR_ERR_NO_WORKERS', `request ${id} waited for a worker it had not tried, and none is left`)
      } else if (this.cands.heldIds.size > 0 && this.workers.liveCount > 0 && this.cands.openSlots() === 0) {
        err = new KvrError('KVR_ERR_NO_WORKERS', `request ${id} waited for a worker, and every registered one is now unreachable or misconfigured`)
      }
      if (err === undefined) continue
      const w = this.takeWaiter(h)
      this.queue.remove(h)
      w.reject(err)
    }
    this.drainQueue()
  }

  /** What the estimator needs to read the request's time to first token: the slot's load before it. */
  private observeBooking(id: string, slot: number, fresh: number, now: number): void {
    const s = this.sequences
    const w = this.workers
    const r = s.inFlight[slot] as number
    const chunk = chunkTokens(w.maxNumBatchedTokens[slot] as number, r)
    const usage = kvUsage(s.activeBlocks[slot] as number, w.totalKvBlocks[slot] as number)
    this.estimator.booked(id, slot, s.prefillTokens[slot] as number, fresh > 0 ? fresh : 0, chunk, r > 0, usage, now)
  }

  private forgetSlot(slot: number): string[] {
    this.estimator.reset(slot, false)
    this.approx?.removeSlot(slot)
    this.routed?.removeSlot(slot)
    this.predicted[slot] = 0
    return this.sequences.dropSlot(slot)
  }
}

function hashCount(req: ScheduleRequest): number {
  const lo = req.seqLo
  const hi = req.seqHi
  if (lo === undefined || hi === undefined) return 0
  const max = Math.min(lo.length, hi.length)
  const n = req.blockCount ?? max
  if (!Number.isInteger(n) || n < 0 || n > max)
    throw new KvrError('KVR_ERR_INVALID_OPTION', `request.blockCount must be an integer in [0, ${max}], got ${String(n)}`)
  return n
}

function checkNonNegative(name: string, v: number): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0)
    throw new KvrError('KVR_ERR_INVALID_OPTION', `${name} must be a finite number ≥ 0, got ${String(v)}`)
  return v
}

export { TRACK_NONE, TRACK_SHARED, TRACK_UNIQUE }
export type { WorkerRankRef }
export type { BusyThresholds }
