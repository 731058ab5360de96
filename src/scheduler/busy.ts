// Which worker-ranks may take a request. Two separate notions, as in Dynamo:
//
// * load shedding: a rank is overloaded when any configured threshold is exceeded; a worker is
//   busy only when all of its ranks are overloaded, and busy workers are dropped from the
//   candidates in every router mode. No candidate left → 503 "all workers busy".
// * queue busy: a rank is busy when its unstarted prefill tokens exceed
//   threshold × max_num_batched_tokens; only when every candidate is busy does a request wait.
import { KvrError } from '../errors.js'
import type { ActiveSequences } from './active-sequences.js'
import type { SchedulerOptions } from './options.js'
import type { WorkerRanks } from './worker-ranks.js'

/** The load-shedding thresholds; null = not set. Live-editable (Dynamo's POST /busy_threshold). */
export interface BusyThresholds {
  activeDecodeBlocksThreshold: number | null
  activePrefillTokensThreshold: number | null
  activePrefillTokensThresholdFrac: number | null
}

export class Eligibility {
  /** Candidate slots of the last collect(), ascending; valid up to count. */
  slots = new Int32Array(8)
  count = 0
  private busyRanks = new Int32Array(8)
  private decodeFrac = Infinity
  private prefillAbs = Infinity
  private prefillFrac = Infinity
  private shedding = false

  constructor(
    private readonly workers: WorkerRanks,
    private readonly seqs: ActiveSequences,
    opts: Pick<SchedulerOptions, keyof BusyThresholds>,
  ) {
    this.setThresholds(opts)
  }

  get thresholds(): BusyThresholds {
    return {
      activeDecodeBlocksThreshold: this.decodeFrac === Infinity ? null : this.decodeFrac,
      activePrefillTokensThreshold: this.prefillAbs === Infinity ? null : this.prefillAbs,
      activePrefillTokensThresholdFrac: this.prefillFrac === Infinity ? null : this.prefillFrac,
    }
  }

  /** Changes the given thresholds (null clears one); validates all before applying any. */
  setThresholds(patch: Partial<BusyThresholds>): void {
    const decode = check('activeDecodeBlocksThreshold', patch.activeDecodeBlocksThreshold, this.decodeFrac, 1)
    const abs = check('activePrefillTokensThreshold', patch.activePrefillTokensThreshold, this.prefillAbs, Infinity)
    const frac = check('activePrefillTokensThresholdFrac', patch.activePrefillTokensThresholdFrac, this.prefillFrac, Infinity)
    this.decodeFrac = decode
    this.prefillAbs = abs
    this.prefillFrac = frac
    this.shedding = decode !== Infinity || abs !== Infinity || frac !== Infinity
  }

  /** Any load-shedding threshold exceeded on this rank. */
  overloaded(slot: number): boolean {
    if (!this.shedding) return false
    const prefill = this.seqs.prefillTokens[slot] as number
    if (prefill > this.prefillAbs) return true
    if (prefill > this.prefillFrac * (this.workers.maxNumBatchedTokens[slot] as number)) return true
    const total = this.workers.totalKvBlocks[slot] as number
    const active = Math.max(this.seqs.activeBlocks[slot] as number, this.workers.reportedActiveBlocks[slot] as number)
    return total > 0 && active / total > this.decodeFrac
  }

  /**
   * Fills `slots` with the candidates among `from` (the first n entries, live slots): every rank
   * of each worker that still has a rank below the shedding thresholds.
   */
  collect(from: ArrayLike<number>, n: number): number {
    if (this.slots.length < n) this.slots = new Int32Array(Math.max(n, this.slots.length * 2))
    const out = this.slots
    if (!this.shedding) {
      for (let i = 0; i < n; i++) out[i] = from[i] as number
      this.count = n
      return n
    }
    const workers = this.workers
    if (this.busyRanks.length < workers.rankCount.length) this.busyRanks = new Int32Array(workers.rankCount.length)
    const busy = this.busyRanks
    // Count over every rank of the fleet, not only `from`: a request pinned to one rank still
    // sees its worker as busy when all of that worker's ranks are.
    const live = workers.liveSlots
    const liveN = workers.liveCount
    for (let i = 0; i < liveN; i++) busy[workers.workerIndex[live[i] as number] as number] = 0
    for (let i = 0; i < liveN; i++) {
      const s = live[i] as number
      if (this.overloaded(s)) {
        const w = workers.workerIndex[s] as number
        busy[w] = (busy[w] as number) + 1
      }
    }
    let m = 0
    for (let i = 0; i < n; i++) {
      const s = from[i] as number
      const w = workers.workerIndex[s] as number
      if ((busy[w] as number) < (workers.rankCount[w] as number)) out[m++] = s
    }
    this.count = m
    return m
  }
}

/** Queue-busy test for one rank. */
export function queueBusy(slot: number, threshold: number, seqs: ActiveSequences, workers: WorkerRanks): boolean {
  return (seqs.prefillTokens[slot] as number) > threshold * (workers.maxNumBatchedTokens[slot] as number)
}

/** True when every one of the n slots is queue-busy (and n > 0). */
export function allQueueBusy(slots: ArrayLike<number>, n: number, threshold: number, seqs: ActiveSequences, workers: WorkerRanks): boolean {
  if (n === 0) return false
  for (let i = 0; i < n; i++) if (!queueBusy(slots[i] as number, threshold, seqs, workers)) return false
  return true
}

function check(name: string, v: number | null | undefined, current: number, max: number): number {
  if (v === undefined) return current
  if (v === null) return Infinity
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0 || v > max) {
    throw new KvrError('KVR_ERR_INVALID_OPTION', `${name} must be a number in [0, ${max === Infinity ? '∞)' : `${max}]`} or null, got ${String(v)}`)
  }
  return v
}
