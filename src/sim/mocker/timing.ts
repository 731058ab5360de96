// Dynamo's mocker timing model (its polynomial default). Pure functions, so a test can
// hold every value against the published formulas.
//
// How one engine step is priced. vLLM runs a step as a single forward pass over a batch that
// may mix prefill chunks and decodes. The two published curves were fitted separately (a
// prefill-only pass, a decode-only pass), and nothing in the reference tells how they combine;
// the mocker prices a mixed step as the SUM of the two terms:
//
//   step_ms = prefill_ms(T) / speedup  +  decode_ms(p) / (speedup × decode_speedup)
//
// where the prefill term is present only when the step computes prefill tokens and the decode
// term only when it carries at least one decode. Summing is the conservative reading (a prefill
// chunk really does delay the decodes batched with it, which is why vLLM users see ITL spikes
// when long prompts arrive) and it degenerates to each fitted curve on its own for pure steps.

/** prefill_ms = a·T² + b·T + c. */
export const PREFILL_A = 4.209989e-7
export const PREFILL_B = 1.518344e-2
export const PREFILL_C = 16.50142
/** decode_ms = a·p² + b·p + c, floored at DECODE_FLOOR_MS. */
export const DECODE_A = -25.74
export const DECODE_B = 54.01
export const DECODE_C = 5.74
export const DECODE_FLOOR_MS = 1

/**
 * The prefill cost of a step, in simulated milliseconds, for T new (uncached) prompt tokens.
 * T = 0 (everything the batch needed was cached) costs nothing: the constant term models a
 * forward pass that does not happen.
 */
export function prefillMs(t: number): number {
  if (!(t > 0)) return 0
  return PREFILL_A * t * t + PREFILL_B * t + PREFILL_C
}

/**
 * T of Dynamo's model: batch_size × (mean isl − mean cached prefix) over the prefill requests of a
 * step. That equals the sum of their uncached tokens, which is how the engine computes it (with
 * chunked prefill, a request's "isl − cached" for a step is the size of its chunk).
 */
export function prefillTokens(batchSize: number, meanIsl: number, meanCached: number): number {
  return Math.max(0, batchSize * (meanIsl - meanCached))
}

/** The decode cost of a step at KV usage p = active_kv_tokens / total_kv_tokens, ≥ 1 ms. */
export function decodeMs(p: number): number {
  return Math.max(DECODE_FLOOR_MS, DECODE_A * p * p + DECODE_B * p + DECODE_C)
}

export interface StepCost {
  /** Prefill tokens computed in the step (T). */
  prefillTokens: number
  /** Requests decoding one token in the step. */
  decodes: number
  /** KV usage p in [0, 1] for the decode term. */
  kvUsage: number
}

export interface SpeedOptions {
  /** Divides every duration; 0 means "no sleep": every step takes no time at all. */
  speedupRatio: number
  /** Further divides decode durations. */
  decodeSpeedupRatio: number
}

/** Wall-clock milliseconds of one step (see the pricing rule at the top of this file). */
export function stepMs(c: StepCost, s: SpeedOptions): number {
  if (!(s.speedupRatio > 0)) return 0
  let ms = 0
  if (c.prefillTokens > 0) ms += prefillMs(c.prefillTokens) / s.speedupRatio
  if (c.decodes > 0) ms += decodeMs(c.kvUsage) / (s.speedupRatio * s.decodeSpeedupRatio)
  return ms
}
