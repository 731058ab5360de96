// The latency cost (--router-cost latency, the default in kv mode): per candidate worker-rank,
// the seconds that sending the request there adds to the latency of the requests the fleet
// serves, from a model of how a vLLM-like engine spends its steps. docs/cost.md derives it.
//
//   An engine step computes up to B tokens (max_num_batched_tokens); each request in flight takes
//   one of them to decode, so k = B − R prefill tokens go per step, and a step with a prefill
//   chunk of x tokens and decodes takes prefill_ms(x) + decode_ms(kv usage).
//
//   ttft      = T(Q + U)                          its own wait and prefill, T as below
//   slowdown  = R̄ × (P(Q + U) − P(Q))             its chunks lengthen the steps of the requests
//             + R × N × slope × blocks / capacity  decoding there; its KV lengthens them too
//   queueing  = λ × own × (wait + own / 2)         requests arriving while its prefill is pending
//                                                  or running wait for it
//   cost      = ttft + slowdown + queueing         seconds
//
//   Q = prefill tokens already booked there (ahead of it); U = its prompt tokens not cached there
//   R = requests in flight there; R̄ = the candidates' mean (0 where R = 0); N = ASSUMED_OUTPUT_TOKENS
//   P(x) = prefill_ms(x) for x ≤ k, else x / k × prefill_ms(k); T(x) = P(x) + max(1, x / k) × decode step
//   wait = T(Q), own = ttft − wait; λ = R̄ / (N × its decode step at the mean usage) (Little's law)
//   slope = decode_ms(1) − decode_ms(0), per unit of KV usage
//
// Which requests its chunks will stall is not known when it is routed (the ones in flight there
// now may be gone once the queue ahead of it is done), so the stall counts the fleet's mean in
// flight, except on a worker-rank with nothing in flight. Counting the worker-rank's own R there
// sends long prompts to worker-ranks holding few, long requests: the fleet sorts itself by request
// size, and long prompts queue behind each other (docs/cost.md shows the measurement).
//
// prefill_ms and decode_ms are each worker-rank's engine model (engine-model.ts): the default one
// (Dynamo's mocker polynomials) until the worker-rank's own has been learned from the requests it
// served (engine-estimator.ts). A speed shared by the whole fleet scales every term alike and
// cancels out of every decision; the shape (per-step overhead, per-token prefill cost, decode step
// time) weighs the terms against each other, and speeds that differ between worker-ranks move
// work to the faster ones.
import { DEFAULT_MAX_BATCHED_TOKENS } from './options.js'
import type { EngineModel } from './engine-model.js'

/**
 * Prefill chunk of an engine that registered no max_num_batched_tokens: vLLM's chunked-prefill
 * budget for online serving and the mocker's default.
 */
export const DEFAULT_CHUNK_TOKENS = 8192

/**
 * Output tokens a request is assumed to decode: the router does not know how long an answer will
 * be. It sets how long a request's KV stays in the decode batch and a request's lifetime.
 */
export const ASSUMED_OUTPUT_TOKENS = 256

/**
 * ms a decode step gains per unit of KV usage is the engine model's rise from empty to full
 * (EngineModel.msPerUsage). The fitted curve bends down towards full; its local slope would make
 * busier engines look cheaper for more KV and gather long requests on them.
 */

/**
 * Costs within this share of the cheapest are one choice to the model, whose error is larger:
 * among them the least loaded worker-rank wins, so equal candidates share the load.
 */
export const NEAR_TIE = 0.01

/** The prefill tokens one step computes on a worker-rank with this registered budget and R in flight. */
export function chunkTokens(maxNumBatchedTokens: number, inFlight: number): number {
  const b = maxNumBatchedTokens === DEFAULT_MAX_BATCHED_TOKENS ? DEFAULT_CHUNK_TOKENS : maxNumBatchedTokens
  return Math.max(1, b - inFlight)
}

/** ms of prefill compute for x queued tokens in chunks of k. */
export function prefillTimeMs(x: number, k: number, e: EngineModel): number {
  if (!(x > 0)) return 0
  return x <= k ? e.prefillMs(x) : (x / k) * e.prefillMs(k)
}

/** Steps the engine runs to compute x prefill tokens in chunks of k; at least the one that samples. */
export function prefillSteps(x: number, k: number): number {
  return x > k ? x / k : 1
}

/** KV usage in [0, 1] of a worker-rank with this many active blocks; 0 when its capacity is unknown. */
export function kvUsage(activeBlocks: number, totalBlocks: number): number {
  return totalBlocks > 0 ? Math.min(1, activeBlocks / totalBlocks) : 0
}

/** Units of usageUnits(): 2^30 per worker-rank at full usage, so sums over 2^23 candidates stay exact. */
export const USAGE_SCALE = 2 ** 30

/**
 * KV usage in integer units. The fleet's mean usage is a sum over the candidates; summed as
 * integers it is exact in any order, so a sum kept up to date as loads change (LoadIndex) and
 * one added up candidate by candidate give the same double, and with it the same costs.
 */
export function usageUnits(activeBlocks: number, totalBlocks: number): number {
  return Math.round(kvUsage(activeBlocks, totalBlocks) * USAGE_SCALE)
}

/** What the candidates of one decision share: the fleet terms of the cost. */
export class FleetLoad {
  /** Mean requests in flight per candidate (R̄). */
  inFlight = 0
  /** Requests reaching a worker-rank of the fleet's model per ms (λ). */
  arrivalsPerMs = 0
  /** The candidates' mean KV usage, the fleet's model and its decode step there. */
  private usage = 0
  private model: EngineModel | null = null
  private step = 1

  /**
   * Sets both from the candidates' summed in-flight requests and KV usage (usage units ÷
   * USAGE_SCALE); the decode step at the mean usage is the fleet's model's (EngineModels.fleet).
   */
  set(sumInFlight: number, sumUsage: number, m: number, fleet: EngineModel): void {
    this.inFlight = m > 0 ? sumInFlight / m : 0
    this.usage = m > 0 ? sumUsage / m : 0
    this.model = fleet
    this.step = fleet.decodeMs(this.usage)
    this.arrivalsPerMs = m > 0 ? this.inFlight / (ASSUMED_OUTPUT_TOKENS * this.step) : 0
  }

  /**
   * λ of a worker-rank with engine model e: requests finish, and so arrive, at the pace of its
   * decode steps, so a worker-rank whose steps take twice the fleet's sees half the arrivals (and
   * its queueing term grows with its slowness once, not twice). The fleet's own model: λ exactly.
   */
  arrivalsFor(e: EngineModel): number {
    return e === this.model ? this.arrivalsPerMs : (this.arrivalsPerMs * this.step) / e.decodeMs(this.usage)
  }
}

/** The terms of one candidate's cost, in seconds (written by latencyTerms). */
export class LatencyTerms {
  ttft = 0
  slowdown = 0
  queueing = 0
}

/**
 * The cost of one candidate: fills `out` and returns its sum, in seconds.
 *   queued:    prefill tokens booked there (Q)
 *   uncached:  the request's prompt tokens not cached there (U)
 *   inFlight:  requests in flight there (R)
 *   chunk:     prefill tokens per step there (chunkTokens)
 *   active:    its active KV blocks; added: the request's blocks not already active there
 *   total:     its KV capacity in blocks (0 = unknown: no usage-dependent terms)
 *   e:         its engine model
 */
export function latencyTerms(
  queued: number,
  uncached: number,
  inFlight: number,
  chunk: number,
  active: number,
  added: number,
  total: number,
  fleet: FleetLoad,
  out: LatencyTerms,
  e: EngineModel,
): number {
  const x = queued + uncached
  const prefillAhead = prefillTimeMs(queued, chunk, e)
  const prefill = prefillTimeMs(x, chunk, e)
  const step = inFlight > 0 ? e.decodeMs(kvUsage(active, total)) : 0
  const ttft = prefill + prefillSteps(x, chunk) * step
  const wait = queued > 0 ? prefillAhead + prefillSteps(queued, chunk) * step : 0
  const own = ttft - wait
  let slowdown = inFlight > 0 ? fleet.inFlight * (prefill - prefillAhead) : 0
  if (total > 0 && added > 0) slowdown += kvSlowdownMs(inFlight, added, total, e)
  const queueing = fleet.arrivalsFor(e) * own * (wait + own / 2)
  out.ttft = ttft / 1000
  out.slowdown = slowdown / 1000
  out.queueing = queueing / 1000
  return out.ttft + out.slowdown + out.queueing
}

/**
 * A lower bound, in seconds, of latencyTerms() over every worker-rank of one kind (its requests
 * in flight, capacity, and so its chunk and the range stepMin..stepMax of its decode step) whose
 * wait, T(queued) with its decode step (0 with nothing queued), is at least `wait`, for a request
 * whose `uncached` tokens are not cached there and which adds `added` blocks. LoadIndex keeps such
 * worker-ranks sorted by their wait, so the pruned selection stops at the first whose bound
 * exceeds what it has already found; with `wait` 0 it bounds them all. It never decreases as
 * `wait` grows.
 *
 * Every worker-rank of the kind has the engine model `e`.
 *
 * Why it holds: a wait of at least `wait` needs a queue of at least the q0 that waits that long
 * at the longest step (T grows with the queue and the step). The request's own prefill behind a
 * queue of q, P(q + uncached) − P(q), grows with q while both fit a chunk, is concave while the
 * sum crosses one, and is constant once q does: its least over q ≥ q0 is at q0 or at the ends of
 * the crossing. Its extra steps, steps(q + uncached) − steps(q), never decrease with q and last
 * at least stepMin; with nothing queued its own time, P(uncached) + its steps, is above both.
 * Every other term grows with the wait or with that own time.
 */
export function latencyLowerBound(
  wait: number,
  uncached: number,
  inFlight: number,
  chunk: number,
  stepMin: number,
  stepMax: number,
  added: number,
  total: number,
  fleet: FleetLoad,
  e: EngineModel,
): number {
  return latencyLowerBoundFrom(wait, queueAtLeast(wait, chunk, stepMax, e), uncached, inFlight, chunk, stepMin, added, total, fleet, e)
}

/**
 * latencyLowerBound given q0 = queueAtLeast(wait, chunk, stepMax), the least queue behind such a
 * wait: it depends on the worker-ranks alone, so LoadIndex keeps it with each class.
 */
export function latencyLowerBoundFrom(
  wait: number,
  q0: number,
  uncached: number,
  inFlight: number,
  chunk: number,
  stepMin: number,
  added: number,
  total: number,
  fleet: FleetLoad,
  e: EngineModel,
): number {
  const prefill = prefillIncreaseAtLeast(q0, uncached, chunk, e)
  const own = prefill + extraStepsAtLeast(q0, uncached, chunk) * stepMin
  let slowdown = inFlight > 0 ? fleet.inFlight * prefill : 0
  if (total > 0 && added > 0) slowdown += kvSlowdownMs(inFlight, added, total, e)
  const queueing = fleet.arrivalsFor(e) * own * (wait + own / 2)
  return (wait + own + slowdown + queueing) / 1000
}

/**
 * The least own time (ms) of a request of `uncached` tokens behind a queue of at least q0: the
 * prefill it adds and its extra steps (latencyLowerBound's `own`). With q0 = 0 it bounds every
 * queue, so latencyLowerBound at any wait w is at least its value at no wait plus
 * w × (1 + arrivals per ms × this) / 1000: every term but the wait's grows with the own time.
 */
export function ownAtLeast(q0: number, uncached: number, chunk: number, stepMin: number, e: EngineModel): number {
  return prefillIncreaseAtLeast(q0, uncached, chunk, e) + extraStepsAtLeast(q0, uncached, chunk) * stepMin
}

/** The steps a request of u tokens adds behind a queue of at least q0 (never fewer than behind none). */
function extraStepsAtLeast(q0: number, u: number, k: number): number {
  return prefillSteps(q0 + u, k) - (q0 > 0 ? prefillSteps(q0, k) : 1)
}

/** ms the request's `added` blocks add to the decode steps of the requests in flight on a worker-rank of known capacity. */
export function kvSlowdownMs(inFlight: number, added: number, total: number, e: EngineModel): number {
  return (inFlight * ASSUMED_OUTPUT_TOKENS * e.msPerUsage * added) / total
}

/** The least queue (tokens) that waits `wait` ms with chunks of k and steps of `step` ms: T's inverse; 0 below one step. */
export function queueAtLeast(wait: number, k: number, step: number, e: EngineModel): number {
  const first = e.c + step
  if (!(wait > first)) return 0
  const full = e.prefillMs(k) + step
  // a·q² + b·q + c + step = wait within a chunk (the root in the form that does not cancel),
  // q / k × (prefill_ms(k) + step) = wait beyond; rounded down a little
  const x = wait - first
  const q = wait <= full ? (2 * x) / (e.b + Math.sqrt(e.b * e.b + 4 * e.a * x)) : (wait * k) / full
  return q * (1 - 1e-9)
}

/** The least of P(q + u) − P(q) over q ≥ q0 (q0 = 0: over every q > 0, where P(0+) is prefill_ms's constant). */
function prefillIncreaseAtLeast(q0: number, u: number, k: number, e: EngineModel): number {
  if (!(u > 0)) return 0
  const least = prefillIncrease(q0, u, k, e)
  // before the crossing the increase grows with q (P is convex within a chunk), so at the
  // crossing's start it is no less than at q0: of the crossing's ends only k is left
  return q0 < k ? Math.min(least, prefillIncrease(k, u, k, e)) : least
}

/** P(q + u) − P(q), with P(0+) prefill_ms's constant. */
function prefillIncrease(q: number, u: number, k: number, e: EngineModel): number {
  return prefillTimeMs(q + u, k, e) - (q > 0 ? prefillTimeMs(q, k, e) : e.c)
}
