// The engine step-time model the latency cost (cost.ts) prices candidates with: Dynamo's mocker
// polynomial default, fitted on a vLLM-like engine. The simulated engines (src/sim/mocker/) run
// this same model, so the cost's assumptions about engines are exactly what they do. Pure
// functions, so a test can hold every value against the published formulas.

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
 * The prefill cost of a step, in milliseconds, for T new (uncached) prompt tokens. T = 0
 * (everything the batch needed was cached) costs nothing: the constant term models a forward
 * pass that does not happen.
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
