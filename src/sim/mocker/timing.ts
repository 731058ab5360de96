// How long a simulated engine's step takes: the engine's timing profile (profiles.ts; `default`
// is the router's engine model, src/scheduler/engine-model.ts) at the engine's speed, scaled by
// the speedup options.
//
// How one engine step is priced. vLLM runs a step as a single forward pass over a batch that
// may mix prefill chunks and decodes. The two published curves were fitted separately (a
// prefill-only pass, a decode-only pass), and nothing in the reference tells how they combine;
// the mocker prices a mixed step as the SUM of the two terms:
//
//   step_ms = (prefill_ms(T + L / 3) + attention_ms) / (speed × speedup)
//           + decode_ms(p) / (speed × speedup × decode_speedup)
//
// where L is the prompt tokens loaded from the host offload tier (HOST_LOAD_COST), the prefill
// term is present only when the step computes or loads prefill tokens, and the decode term only
// when it carries at least one decode. Summing is the conservative reading (a prefill
// chunk really does delay the decodes batched with it, which is why vLLM users see ITL spikes
// when long prompts arrive) and it degenerates to each fitted curve on its own for pure steps.
import { PROFILES } from './profiles.js'
import type { EngineProfile } from './profiles.js'

export interface StepCost {
  /** Prefill tokens computed in the step (T). */
  prefillTokens: number
  /** Sum over those tokens of the context before each (for the profile's attention term). */
  prefillPairs: number
  /** Requests decoding one token in the step. */
  decodes: number
  /** KV usage p in [0, 1] for the decode term. */
  kvUsage: number
  /** Prompt tokens loaded from the host tier in the step (see HOST_LOAD_COST). */
  loadedTokens?: number
}

/**
 * What a token loaded from the host tier costs, in prefilled tokens of the step's T: an 8B-class
 * model's KV is 128 KiB per token, ~5 µs over PCIe at ~25 GB/s, against the default profile's
 * ~15 µs per prefilled token (its linear term). A third, whatever the profile: simple, and of
 * the right order.
 */
export const HOST_LOAD_COST = 1 / 3

export interface SpeedOptions {
  /** Divides every duration; 0 means "no sleep": every step takes no time at all. */
  speedupRatio: number
  /** Further divides decode durations. */
  decodeSpeedupRatio: number
}

/** The default profile's prefill polynomial equals the engine model's prefillMs. */
export function profilePrefillMs(p: EngineProfile, tokens: number, pairs: number): number {
  if (!(tokens > 0)) return 0
  const q = p.prefill
  return q.a * tokens * tokens + q.b * tokens + q.c + p.attentionMsPerPair * pairs
}

/** The default profile's decode polynomial equals the engine model's decodeMs. */
export function profileDecodeMs(p: EngineProfile, kvUsage: number): number {
  const d = p.decode
  return Math.max(d.floorMs, d.a * kvUsage * kvUsage + d.b * kvUsage + d.c)
}

/** Wall-clock milliseconds of one step (see the pricing rule at the top of this file). */
export function stepMs(c: StepCost, s: SpeedOptions, profile: EngineProfile = PROFILES.default, speed = 1): number {
  if (!(s.speedupRatio > 0)) return 0
  const scale = s.speedupRatio * speed
  let ms = 0
  const loaded = c.loadedTokens ?? 0
  const t = loaded > 0 ? c.prefillTokens + loaded * HOST_LOAD_COST : c.prefillTokens
  if (t > 0) ms += profilePrefillMs(profile, t, c.prefillPairs) / scale
  if (c.decodes > 0) ms += profileDecodeMs(profile, c.kvUsage) / (scale * s.decodeSpeedupRatio)
  return ms
}
