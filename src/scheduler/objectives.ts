// Per-request latency objectives (TTFT, TPOT; ScheduleRequest.ttftObjectiveMs, tpotObjectiveMs):
// which requests the selection weighs them for, the choice when no candidate is predicted to meet
// them (as llm-d's predicted-latency scheduling: shed a sheddable request, else the least
// predicted TTFT), and the counts of each outcome.
import { KvrError } from '../errors.js'
import type { SchedulerOptions } from './options.js'
import { objectiveUnmet } from './rejection.js'
import type { CostInputs, Selector } from './selector.js'

/** The most an objective may ask, ms (about 2.8 hours): beyond it a number is a mistake. */
export const MAX_OBJECTIVE_MS = 1e7

/** What of a request the objectives read. */
export interface ObjectiveRequest {
  ttftObjectiveMs?: number
  tpotObjectiveMs?: number
  workerId?: bigint
  priority?: number
}

/**
 * Requests with objectives by outcome: some candidate predicted to meet them, none (sent to the
 * least predicted TTFT), none and shed (priority < 0), not predicted (another mode or cost, or pinned).
 */
export interface ObjectiveCounts {
  predictedMet: number
  nonePredicted: number
  shed: number
  notPredicted: number
}

export class Objectives {
  readonly counts: ObjectiveCounts = { predictedMet: 0, nonePredicted: 0, shed: 0, notPredicted: 0 }

  constructor(
    private readonly options: SchedulerOptions,
    private readonly selector: Selector,
  ) {}

  /** Validates the request's objectives: each, when given, in (0, 10^7] ms. */
  check(req: ObjectiveRequest): void {
    if (req.ttftObjectiveMs !== undefined) checkObjective('request.ttftObjectiveMs', req.ttftObjectiveMs)
    if (req.tpotObjectiveMs !== undefined) checkObjective('request.tpotObjectiveMs', req.tpotObjectiveMs)
  }

  /** Whether the objectives steer the request's selection: it has some, is not pinned, and the mode and cost predict latency. */
  predicted(req: ObjectiveRequest): boolean {
    return has(req) && req.workerId === undefined && this.options.mode === 'kv' && this.options.cost === 'latency'
  }

  /** A request chosen without its objectives (see predicted()): counted. */
  unpredicted(req: ObjectiveRequest): void {
    if (has(req)) this.counts.notPredicted++
  }

  /**
   * The cheapest candidate predicted to meet the objectives; when none is, a sheddable request
   * (priority < 0) is refused with OBJECTIVE_UNMET, any other goes to the least predicted TTFT.
   */
  select(req: ObjectiveRequest, c: CostInputs, slots: Int32Array, m: number): number {
    const slot = this.selector.objectiveSelect(c, slots, m)
    if (slot >= 0) {
      this.counts.predictedMet++
      return slot
    }
    if ((req.priority ?? 0) < 0) {
      this.counts.shed++
      throw objectiveUnmet(c.ttftObjectiveMs, c.tpotObjectiveMs, this.options.retryAfterSecs)
    }
    this.counts.nonePredicted++
    return this.selector.leastTtftPick(slots, m)
  }
}

function has(req: ObjectiveRequest): boolean {
  return req.ttftObjectiveMs !== undefined || req.tpotObjectiveMs !== undefined
}

function checkObjective(name: string, v: number): void {
  if (typeof v !== 'number' || !(v > 0) || !(v <= MAX_OBJECTIVE_MS))
    throw new KvrError('KVR_ERR_INVALID_OPTION', `${name} must be a number in (0, ${MAX_OBJECTIVE_MS}] ms, got ${String(v)}`)
}
