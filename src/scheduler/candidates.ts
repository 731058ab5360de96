// Which worker-ranks one request may go to. Two forms of the same set:
//
//   listed   the candidates one by one in Eligibility.slots, ascending: a request pinned to a
//            worker, a mode or request the pruned selection does not take, and every decision
//            of a scheduler built with fullScan (the reference the pruned one is tested against)
//   indexed  the open worker-ranks of LoadIndex less the ones the request excludes (IndexView):
//            counted and summed, never listed, for the pruned selection
//
// Both raise the same errors in the same order: nothing registered, every worker held, every
// worker tried, every candidate busy. The workers held out of routing (health, configuration)
// live here too, since both forms leave them out.
import { KvrError } from '../errors.js'
import type { ActiveSequences } from './active-sequences.js'
import { allQueueBusy, Eligibility } from './busy.js'
import { LoadIndex } from './load-index.js'
import type { SchedulerOptions } from './options.js'
import type { IndexView } from './pruned-selector.js'
import type { EngineModels } from './engine-estimator.js'
import { allWorkersBusy } from './rejection.js'
import { growTo } from './typed-arrays.js'
import type { WorkerRanks } from './worker-ranks.js'

/** One worker-rank by identity (a RouteDecision is one). */
export interface WorkerRankRef {
  readonly workerId: bigint
  readonly dpRank: number
}

/** What of a request decides its candidates. */
export interface CandidateRequest {
  workerId?: bigint
  dpRank?: number
  exclude?: readonly WorkerRankRef[]
}

/** Exclusions past this many are listed: masking each one costs about what listing costs. */
const MAX_INDEXED_EXCLUSIONS = 64

export class CandidateSets implements IndexView {
  readonly eligibility: Eligibility
  /** Present unless the scheduler scores every candidate (fullScan, or a mode other than kv). */
  readonly index: LoadIndex | undefined
  /** Whether the last collect() listed the candidates (eligibility.slots) or left them to the index view. */
  listed = true
  /** Requests refused because every candidate was busy (a metric). */
  allBusyTotal = 0
  /** Workers held out of routing (unreachable, misconfigured); only requests pinned to them go there. */
  readonly heldIds = new Set<bigint>()

  // the index view of the last indexed collect()
  m = 0
  sumInFlight = 0
  sumUnits = 0
  excluded = new Int32Array(8)
  excludedN = 0
  /** Candidates of the view with no prefill booked, and queue-busy ones. */
  unqueued = 0
  private queueBusyN = 0
  /** Per slot: 1 while excluded by the last indexed collect(). */
  private excludedMark = new Uint8Array(8)
  private marked = new Int32Array(8)
  private markedN = 0

  /** Per slot, 1 when its worker is held. */
  private held = new Uint8Array(8)
  /** The live slots of workers not held, when some are (reused). */
  private open = new Int32Array(8)
  private pin = new Int32Array(1)

  constructor(
    private readonly workers: WorkerRanks,
    private readonly seqs: ActiveSequences,
    private readonly options: SchedulerOptions,
    indexed: boolean,
    models: EngineModels,
  ) {
    this.eligibility = new Eligibility(workers, seqs, options)
    if (indexed) {
      this.index = new LoadIndex(workers, seqs, this.eligibility, models, {
        cost: options.cost,
        blockSize: options.blockSize,
        overlapScoreWeight: options.overlapScoreWeight,
        queueThreshold: options.queueThreshold,
      })
      seqs.listener = this.index
    }
  }

  // ---- registration and held workers ----

  /** A rank was registered (or its info updated). */
  added(slot: number, workerId: bigint): void {
    if (this.held.length < this.workers.slotCapacity) this.held = growTo(this.held, this.workers.slotCapacity)
    const on = this.heldIds.has(workerId)
    this.held[slot] = on ? 1 : 0
    this.index?.setHeld(slot, on)
    // one more rank: a worker busy with all its ranks may not be any more
    this.index?.refreshWorker(workerId)
  }

  /** A rank was removed from WorkerRanks; `workerIndex` is the one its worker had. */
  removed(slot: number, workerIndex: number, workerId: bigint): void {
    this.held[slot] = 0
    this.index?.removed(slot, workerIndex)
    this.index?.refreshWorker(workerId)
  }

  /** Holds a worker out of routing or lets it back; false when that is already so. */
  setHeld(workerId: bigint, on: boolean): boolean {
    if (on === this.heldIds.has(workerId)) return false
    if (on) this.heldIds.add(workerId)
    else this.heldIds.delete(workerId)
    for (const slot of this.workers.slotsOf(workerId)) {
      this.held[slot] = on ? 1 : 0
      this.index?.setHeld(slot, on)
    }
    return true
  }

  isHeld(slot: number): boolean {
    return this.held[slot] === 1
  }

  /** The load-shedding thresholds changed: every rank's state may have. */
  thresholdsChanged(): void {
    this.index?.refreshAll()
  }

  /** A rank's own load report or capacity changed. */
  reported(slot: number): void {
    this.index?.refresh(slot)
  }

  // ---- one request's candidates ----

  /**
   * The request's candidates: listed in eligibility.slots, or (`indexed` and possible) as the index
   * view. Returns how many; throws when there is none.
   */
  collect(req: CandidateRequest, indexed: boolean): number {
    const ex = req.exclude
    if (indexed && this.index !== undefined && req.workerId === undefined && (ex === undefined || ex.length <= MAX_INDEXED_EXCLUSIONS)) {
      this.listed = false
      return this.collectIndexed(this.index, ex)
    }
    this.listed = true
    return this.collectListed(req)
  }

  /** Whether every candidate of the last collect() is queue-busy. */
  allQueueBusy(m: number, threshold: number): boolean {
    if (!this.listed) return m > 0 && this.queueBusyN === m
    return allQueueBusy(this.eligibility.slots, m, threshold, this.seqs, this.workers)
  }

  /** Whether the slot is a candidate of the last collect() (enqueue reads it right after). */
  isCandidate(slot: number): boolean {
    if (!this.listed) return this.index?.isOpen(slot) === true && this.excludedMark[slot] !== 1
    const slots = this.eligibility.slots
    for (let i = 0; i < this.eligibility.count; i++) if (slots[i] === slot) return true
    return false
  }

  isExcluded(slot: number): boolean {
    return this.excludedMark[slot] === 1
  }

  /**
   * The open worker-ranks of a request not pinned to any: their number, and whether they are all
   * queue-busy (the queue drains while they are not).
   */
  openAllQueueBusy(threshold: number): { m: number; busy: boolean } {
    if (this.index !== undefined) {
      const m = this.index.openCount
      return { m, busy: m === 0 || this.index.queueBusyCount === m }
    }
    const w = this.workers
    const m = this.heldIds.size > 0 ? this.eligibility.collect(this.open, this.openSlots()) : this.eligibility.collect(w.liveSlots, w.liveCount)
    return { m, busy: m === 0 || allQueueBusy(this.eligibility.slots, m, threshold, this.seqs, w) }
  }

  /** Whether some live worker-rank not held is outside `exclude`. */
  anyLiveOutside(exclude: readonly WorkerRankRef[]): boolean {
    const w = this.workers
    for (let i = 0; i < w.liveCount; i++) {
      const s = w.liveSlots[i] as number
      if (this.held[s] !== 1 && !excludes(w, exclude, s)) return true
    }
    return false
  }

  /** The live slots whose worker is not held into `open`; their count. */
  openSlots(): number {
    const w = this.workers
    if (this.open.length < w.liveCount) this.open = new Int32Array(Math.max(w.liveCount, this.open.length * 2))
    let k = 0
    for (let i = 0; i < w.liveCount; i++) {
      const s = w.liveSlots[i] as number
      if (this.held[s] !== 1) this.open[k++] = s
    }
    return k
  }

  private collectListed(req: CandidateRequest): number {
    const w = this.workers
    let from: ArrayLike<number> = w.liveSlots
    let n = w.liveCount
    if (req.workerId !== undefined) {
      if (req.dpRank !== undefined) {
        const slot = w.slotOf(req.workerId, req.dpRank)
        if (slot < 0) throw new KvrError('KVR_ERR_UNKNOWN_WORKER', `worker ${req.workerId} has no dp rank ${req.dpRank}`)
        this.pin[0] = slot
        from = this.pin
        n = 1
      } else {
        from = w.slotsOf(req.workerId)
        n = from.length
        if (n === 0) throw new KvrError('KVR_ERR_UNKNOWN_WORKER', `worker ${req.workerId} is not registered`)
      }
    } else if (this.options.mode === 'direct') {
      throw new KvrError('KVR_ERR_INVALID_OPTION', 'router mode direct needs the request to name its worker (workerId)')
    } else if (n === 0) {
      throw noneRegistered()
    } else if (this.heldIds.size > 0) {
      n = this.openSlots()
      if (n === 0) throw allHeld(w.workerCount)
      from = this.open
    }
    const ex = req.exclude
    if (ex !== undefined && ex.length > 0) {
      // only retries get here, so a small array per call is fine
      const left: number[] = []
      for (let i = 0; i < n; i++) if (!excludes(w, ex, from[i] as number)) left.push(from[i] as number)
      if (left.length === 0) throw allTried()
      from = left
      n = left.length
    }
    const m = this.eligibility.collect(from, n)
    if (m === 0) {
      this.allBusyTotal++
      throw allWorkersBusy(this.options.retryAfterSecs)
    }
    return m
  }

  private collectIndexed(index: LoadIndex, ex: readonly WorkerRankRef[] | undefined): number {
    const w = this.workers
    if (w.liveCount === 0) throw noneRegistered()
    if (this.heldIds.size > 0 && index.unheldCount === 0) throw allHeld(w.workerCount)
    for (let k = 0; k < this.markedN; k++) this.excludedMark[this.marked[k] as number] = 0
    this.markedN = 0
    this.excludedN = 0
    let m = index.openCount
    let sumInFlight = index.sumInFlight
    let sumUnits = index.sumUnits
    let queueBusy = index.queueBusyCount
    let unqueued = index.unqueuedCount
    if (ex !== undefined && ex.length > 0) {
      if (this.excludedMark.length < w.slotCapacity) this.excludedMark = growTo(this.excludedMark, w.slotCapacity)
      if (this.marked.length < ex.length) {
        this.marked = new Int32Array(Math.max(ex.length, this.marked.length * 2))
        this.excluded = new Int32Array(this.marked.length)
      }
      let unheld = 0
      for (const r of ex) {
        const s = w.slotOf(r.workerId, r.dpRank)
        if (s < 0 || this.excludedMark[s] === 1) continue
        this.excludedMark[s] = 1
        this.marked[this.markedN++] = s
        if (this.held[s] !== 1) unheld++
        if (!index.isOpen(s)) continue
        this.excluded[this.excludedN++] = s
        const cid = index.classOf[s] as number
        m--
        sumInFlight -= index.groupR[index.classGroup[cid] as number] as number
        sumUnits -= index.unitsOf(s)
        if (index.queueBusy(s)) queueBusy--
        if (index.classQ[cid] === 0) unqueued--
      }
      if (index.unheldCount - unheld === 0) throw allTried()
    }
    if (m === 0) {
      this.allBusyTotal++
      throw allWorkersBusy(this.options.retryAfterSecs)
    }
    this.m = m
    this.sumInFlight = sumInFlight
    this.sumUnits = sumUnits
    this.queueBusyN = queueBusy
    this.unqueued = unqueued
    return m
  }
}

function noneRegistered(): KvrError {
  return new KvrError('KVR_ERR_NO_WORKERS', 'no worker is registered')
}

function allHeld(workerCount: number): KvrError {
  return new KvrError(
    'KVR_ERR_NO_WORKERS',
    `no worker can take requests: each of the ${workerCount} registered is unreachable or misconfigured (GET /v1/workers says why)`,
  )
}

function allTried(): KvrError {
  return new KvrError('KVR_ERR_NO_WORKERS', 'every worker this request could go to has been tried')
}

/** True when the worker-rank registered in `slot` is one of `refs`. */
function excludes(w: WorkerRanks, refs: readonly WorkerRankRef[], slot: number): boolean {
  for (const r of refs) if (w.slotOf(r.workerId, r.dpRank) === slot) return true
  return false
}
