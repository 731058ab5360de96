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

/** The default decode curve's KV-dependent part, scaled to 0 at p = 0 and 1 at p = 1 (increasing on [0, 1]). */
export function decodeShape(p: number): number {
  return (DECODE_A * p * p + DECODE_B * p) / (DECODE_A + DECODE_B)
}

/**
 * One engine's step-time model as the latency cost prices it: the default model's curves with
 * their own coefficients. A worker-rank's model is learned from the requests it serves
 * (engine-estimator.ts); the default one is exactly the functions above.
 *
 *   prefill_ms(T) = a·T² + b·T + c           (0 when T = 0)
 *   decode_ms(p)  = max(1, base + rise·shape(p))
 */
export class EngineModel {
  /** decode_ms(0) and decode_ms(1): a decode step's range with requests in flight. */
  readonly stepMin: number
  readonly stepMax: number
  /** decode_ms(1) − decode_ms(0): ms a decode step gains per unit of KV usage (see cost.ts). */
  readonly msPerUsage: number
  /** rise over the default's: 1 exactly for the default model, whose values then equal decodeMs()'s bit for bit. */
  private readonly riseScale: number

  constructor(
    readonly a: number,
    readonly b: number,
    readonly c: number,
    readonly base: number,
    readonly rise: number,
  ) {
    this.riseScale = rise / (DECODE_A + DECODE_B)
    this.stepMin = this.decodeMs(0)
    this.stepMax = this.decodeMs(1)
    this.msPerUsage = this.stepMax - this.stepMin
  }

  prefillMs(t: number): number {
    if (!(t > 0)) return 0
    return this.a * t * t + this.b * t + this.c
  }

  decodeMs(p: number): number {
    return Math.max(DECODE_FLOOR_MS, this.base + this.riseScale * (DECODE_A * p * p + DECODE_B * p))
  }
}

/** The default model: prefillMs and decodeMs above. */
export const DEFAULT_ENGINE_MODEL = new EngineModel(PREFILL_A, PREFILL_B, PREFILL_C, DECODE_C, DECODE_A + DECODE_B)
