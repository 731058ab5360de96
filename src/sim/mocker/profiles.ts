// Engine timing profiles: how long a simulated engine's steps take. `default` is the router's own
// engine model (src/scheduler/engine-model.ts), so a fleet of it runs exactly what the latency
// cost assumes; the others differ from it in shape, not only in speed, so routing can be measured
// on engines the cost does not model. Each is an engineering estimate of a kind of engine (see
// docs/architecture.md § Engine profiles), not a fit to a measured one.
import { DECODE_A, DECODE_B, DECODE_C, DECODE_FLOOR_MS, PREFILL_A, PREFILL_B, PREFILL_C } from '../../scheduler/engine-model.js'
import { KvrError } from '../../errors.js'

export interface EngineProfile {
  readonly name: ProfileName
  /** What real engine it stands for, in a line. */
  readonly standsFor: string
  /** prefill_ms = a·T² + b·T + c for T new tokens in the step (0 when T = 0). */
  readonly prefill: { readonly a: number; readonly b: number; readonly c: number }
  /**
   * Attention against the context: ms per (new token × context token before it) pair. The
   * polynomial prices a chunk by its own length only; this term makes a chunk that follows a long
   * cached prefix cost more than the same chunk of a fresh prompt.
   */
  readonly attentionMsPerPair: number
  /** decode_ms = max(floor, a·p² + b·p + c) at KV usage p. */
  readonly decode: { readonly a: number; readonly b: number; readonly c: number; readonly floorMs: number }
}

export const PROFILE_NAMES = ['default', 'large', 'long-context'] as const
export type ProfileName = (typeof PROFILE_NAMES)[number]

const DEFAULT_PREFILL = { a: PREFILL_A, b: PREFILL_B, c: PREFILL_C }
const DEFAULT_DECODE = { a: DECODE_A, b: DECODE_B, c: DECODE_C, floorMs: DECODE_FLOOR_MS }

export const PROFILES: Readonly<Record<ProfileName, EngineProfile>> = Object.freeze({
  default: Object.freeze({
    name: 'default',
    standsFor: "the router's engine model: Dynamo's mocker polynomials, fitted on a vLLM engine serving an 8B-class model on one GPU",
    prefill: DEFAULT_PREFILL,
    attentionMsPerPair: 0,
    decode: DEFAULT_DECODE,
  }),
  // A 70B-class dense model with tensor parallelism on the same GPU generation: per-token prefill
  // work and the fixed step overhead (more layers, all-reduces across GPUs) both grow about 2.5×,
  // the quadratic part less; a decode step is dominated by reading the weights, so its base cost
  // grows about 2.4× while the part that grows with KV usage grows only 1.3×.
  large: Object.freeze({
    name: 'large',
    standsFor: 'a 70B-class dense model with tensor parallelism: prefill and step overhead ~2.5× the default, decode base ~2.4×, its KV growth ~1.3×',
    prefill: { a: PREFILL_A * 1.2, b: PREFILL_B * 2.5, c: PREFILL_C * 2.5 },
    attentionMsPerPair: 0,
    decode: { a: DECODE_A * 1.3, b: DECODE_B * 1.3, c: DECODE_C * 2.4, floorMs: DECODE_FLOOR_MS },
  }),
  // The default engine with attention priced against the whole context: an 8B-class model's
  // attention is about 0.5 MFLOP per (query, key) pair over its layers; at ~200 TFLOP/s effective
  // that is 2.6e-6 ms a pair, so a 1,024-token chunk after 30,000 cached tokens costs ~80 ms more
  // than the same chunk of a fresh prompt.
  'long-context': Object.freeze({
    name: 'long-context',
    standsFor: 'the default engine with attention priced against the cached context: long-context prefill grows faster than the fitted curve',
    prefill: DEFAULT_PREFILL,
    attentionMsPerPair: 2.6e-6,
    decode: DEFAULT_DECODE,
  }),
})

/** A profile at a speed: durations are divided by `speed` (0.5 = an engine at half speed). */
export interface EngineTiming {
  profile: ProfileName
  speed: number
}

/** Engines assigned a timing each, from a list (`--engine-profile`). */
export interface ProfileGroup extends EngineTiming {
  /** Engines of this group, or null: the list is dealt out over the engines in turn. */
  count: number | null
}

const GROUP = /^([a-z-]+)(?:@([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?))?(?::([0-9]+))?$/

/**
 * `NAME[@SPEED][:COUNT],…`: e.g. `large`, `default@0.5`, `default:2,default@0.5:2`. Without counts
 * the entries are dealt out over the engines in turn; with counts (on every entry) they go in
 * order and must add up to the number of engines.
 */
export function parseProfileList(spec: string): ProfileGroup[] {
  const out: ProfileGroup[] = []
  for (const part of spec.split(',')) {
    const m = GROUP.exec(part.trim())
    if (m === null) throw profileError(`"${part}" is not NAME[@SPEED][:COUNT]`)
    const name = m[1] as string
    if (!(PROFILE_NAMES as readonly string[]).includes(name)) throw profileError(`unknown profile "${name}" (${PROFILE_NAMES.join(', ')})`)
    const speed = m[2] === undefined ? 1 : Number(m[2])
    if (!(speed > 0) || !(speed <= 1000)) throw profileError(`speed of "${part}" must be in (0, 1000], got ${m[2]}`)
    const count = m[3] === undefined ? null : Number(m[3])
    if (count !== null && !(count >= 1 && Number.isSafeInteger(count))) throw profileError(`count of "${part}" must be an integer ≥ 1`)
    out.push({ profile: name as ProfileName, speed, count })
  }
  const counted = out.filter((g) => g.count !== null).length
  if (counted !== 0 && counted !== out.length) throw profileError(`"${spec}": give a count on every entry or on none`)
  return out
}

/** The timing of each of `n` engines. */
export function timingsFor(groups: readonly ProfileGroup[], n: number): EngineTiming[] {
  if (groups.length === 0) return Array.from({ length: n }, () => ({ profile: 'default', speed: 1 }))
  if ((groups[0] as ProfileGroup).count === null) return Array.from({ length: n }, (_, i) => timingOf(groups[i % groups.length] as ProfileGroup))
  const total = groups.reduce((s, g) => s + (g.count ?? 0), 0)
  if (total !== n) throw profileError(`the counts add up to ${total} engine(s), but there are ${n}`)
  return groups.flatMap((g) => Array.from({ length: g.count ?? 0 }, () => timingOf(g)))
}

function timingOf(g: ProfileGroup): EngineTiming {
  return { profile: g.profile, speed: g.speed }
}

function profileError(msg: string): KvrError {
  return new KvrError('KVR_ERR_INVALID_OPTION', `--engine-profile: ${msg}`)
}
