// How long a simulated engine's step takes: the router's engine model
// (src/scheduler/engine-model.ts, Dynamo's mocker polynomial default) scaled by the speedup
// options, so the engines run exactly the model the latency cost assumes.
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
import { decodeMs, prefillMs } from '../../scheduler/engine-model.js'

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
