// Scheduler options: validated once, defaults filled in, then frozen. Every message names the
// option and the accepted range so the CLI layer can print it as is.
import { KvrError } from '../errors.js'

export const ROUTER_MODES = ['kv', 'round-robin', 'random', 'least-loaded', 'power-of-two', 'direct', 'device-aware-weighted'] as const
export type RouterMode = (typeof ROUTER_MODES)[number]

/** kv mode's cost: the latency model of cost.ts, or Dynamo's formula. */
export const COST_MODELS = ['latency', 'dynamo'] as const
export type CostModel = (typeof COST_MODELS)[number]

export const QUEUE_POLICIES = ['fcfs', 'wspt', 'lcfs'] as const
export type QueuePolicy = (typeof QUEUE_POLICIES)[number]

/** Used when a worker-rank does not publish max_num_batched_tokens (Dynamo's default). */
export const DEFAULT_MAX_BATCHED_TOKENS = 10_000_000

export interface ApproximateOptions {
  /** Off unless the router runs with --no-router-kv-events. */
  readonly enabled: boolean
  /** --router-ttl-secs (default 120). */
  readonly ttlSecs: number
  /** --router-max-tree-size (default 2^20 blocks summed over worker-ranks). */
  readonly maxTreeSize: number
  /** --router-prune-target-ratio (default 0.8). */
  readonly pruneTargetRatio: number
}

export interface SchedulerOptions {
  readonly mode: RouterMode
  /** kv mode's cost: 'latency' (src/scheduler/cost.ts) or Dynamo's formula, unchanged. */
  readonly cost: CostModel
  /** KV block size in tokens; prefill blocks are prefill tokens / blockSize (not rounded). */
  readonly blockSize: number
  /** Dynamo's overlap_score_weight, later its prefill_load_scale: multiplies the prefill term (dynamo cost). */
  readonly overlapScoreWeight: number
  /** Dynamo's overlap_score_credit (default 1): prefill blocks one cached block is worth. */
  readonly overlapScoreCredit: number
  /** Dynamo's overlap_score_credit_decay (default 0). */
  readonly overlapScoreCreditDecay: number
  /** Dynamo's decode_active_request_weight (default 0): cost per in-flight request. */
  readonly decodeActiveRequestWeight: number
  readonly temperature: number
  /** null disables the queue: requests are always scheduled at once. */
  readonly queueThreshold: number | null
  readonly queuePolicy: QueuePolicy
  /** --router-queue-max-pending: waiting requests beyond this are refused with 503. */
  readonly queueMaxPending: number
  /** Periodic queue recheck; 0 disables the timer (dispatch then happens on prefill-complete/free only). */
  readonly queueRecheckMs: number
  /** Seconds a 503 asks the client to wait (Retry-After). */
  readonly retryAfterSecs: number
  readonly trackActiveBlocks: boolean
  readonly trackPrefillTokens: boolean
  readonly assumeKvReuse: boolean
  /** A booked request still present this long after it was added is freed (Dynamo's: 300 s). */
  readonly staleRequestSecs: number
  /** Load shedding; null = threshold not set. */
  readonly activeDecodeBlocksThreshold: number | null
  readonly activePrefillTokensThreshold: number | null
  readonly activePrefillTokensThresholdFrac: number | null
  /** DYN_ENCODER_CUDA_TO_CPU_RATIO for device-aware-weighted (Dynamo's default is 8). */
  readonly cudaToCpuRatio: number
  /**
   * Predict-on-route: seconds a routed prompt's blocks count as cached on the chosen worker-rank
   * before its KV events confirm them (the overlap is the larger of the index's and this); 0 = off.
   */
  readonly predictedTtlSecs: number
  readonly approximate: ApproximateOptions
  /** Seed for the selection RNG; undefined = random seed. */
  readonly seed: number | undefined
}

export type SchedulerOptionsInput = Partial<Omit<SchedulerOptions, 'approximate'>> & {
  approximate?: Partial<ApproximateOptions>
}

const DEFAULTS: Omit<SchedulerOptions, 'approximate' | 'seed'> = {
  mode: 'kv',
  cost: 'latency',
  blockSize: 128,
  overlapScoreWeight: 1.0,
  overlapScoreCredit: 1.0,
  overlapScoreCreditDecay: 0,
  decodeActiveRequestWeight: 0,
  temperature: 0.0,
  queueThreshold: 4.0,
  queuePolicy: 'fcfs',
  queueMaxPending: 10_000,
  queueRecheckMs: 60_000,
  retryAfterSecs: 1,
  trackActiveBlocks: true,
  trackPrefillTokens: true,
  assumeKvReuse: true,
  staleRequestSecs: 300,
  activeDecodeBlocksThreshold: null,
  activePrefillTokensThreshold: null,
  activePrefillTokensThresholdFrac: null,
  cudaToCpuRatio: 8,
  predictedTtlSecs: 0,
}

function invalid(name: string, expected: string, got: unknown): KvrError {
  return new KvrError('KVR_ERR_INVALID_OPTION', `options.${name} must be ${expected}, got ${describe(got)}`)
}

function describe(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v)
  if (typeof v === 'bigint') return `${v}n`
  return String(v)
}

function num(name: string, v: unknown, def: number, min: number, max = Infinity, minExclusive = false): number {
  if (v === undefined) return def
  const range = `a number in ${minExclusive ? '(' : '['}${min}, ${max === Infinity ? '∞)' : `${max}]`}`
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max || (minExclusive && v === min)) throw invalid(name, range, v)
  return v
}

function int(name: string, v: unknown, def: number, min: number, max: number): number {
  if (v === undefined) return def
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw invalid(name, `an integer in [${min}, ${max}]`, v)
  return v
}

function bool(name: string, v: unknown, def: boolean): boolean {
  if (v === undefined) return def
  if (typeof v !== 'boolean') throw invalid(name, 'a boolean', v)
  return v
}

function nullableNum(name: string, v: unknown, def: number | null, min: number, max = Infinity): number | null {
  if (v === undefined) return def
  if (v === null) return null
  return num(name, v, 0, min, max)
}

function oneOf<T extends string>(name: string, v: unknown, def: T, allowed: readonly T[]): T {
  if (v === undefined) return def
  if (typeof v !== 'string' || !(allowed as readonly string[]).includes(v)) throw invalid(name, `one of ${allowed.join('|')}`, v)
  return v as T
}

const KNOWN = new Set<string>([...Object.keys(DEFAULTS), 'approximate', 'seed'])
const KNOWN_APPROX = new Set(['enabled', 'ttlSecs', 'maxTreeSize', 'pruneTargetRatio'])

/** Validates, fills defaults and deep-freezes. Throws KvrError(KVR_ERR_INVALID_OPTION). */
export function resolveSchedulerOptions(input: SchedulerOptionsInput = {}): SchedulerOptions {
  if (input === null || typeof input !== 'object') throw new KvrError('KVR_ERR_INVALID_OPTION', `scheduler options must be an object, got ${describe(input)}`)
  for (const k of Object.keys(input)) if (!KNOWN.has(k)) throw new KvrError('KVR_ERR_INVALID_OPTION', `options.${k} is not a scheduler option`)
  const a: Partial<ApproximateOptions> | null = input.approximate === undefined ? {} : input.approximate
  if (a === null || typeof a !== 'object') throw invalid('approximate', 'an object', a)
  for (const k of Object.keys(a)) if (!KNOWN_APPROX.has(k)) throw new KvrError('KVR_ERR_INVALID_OPTION', `options.approximate.${k} is not a scheduler option`)
  const approximate: ApproximateOptions = Object.freeze({
    enabled: bool('approximate.enabled', a.enabled, false),
    ttlSecs: num('approximate.ttlSecs', a.ttlSecs, 120, 0, Infinity, true),
    maxTreeSize: int('approximate.maxTreeSize', a.maxTreeSize, 1 << 20, 1, 2 ** 31 - 1),
    pruneTargetRatio: num('approximate.pruneTargetRatio', a.pruneTargetRatio, 0.8, 0, 1),
  })
  const seed = input.seed === undefined ? undefined : int('seed', input.seed, 0, 0, 0xffffffff)
  return Object.freeze({
    mode: oneOf('mode', input.mode, DEFAULTS.mode, ROUTER_MODES),
    cost: oneOf('cost', input.cost, DEFAULTS.cost, COST_MODELS),
    blockSize: int('blockSize', input.blockSize, DEFAULTS.blockSize, 1, 65536),
    overlapScoreWeight: num('overlapScoreWeight', input.overlapScoreWeight, DEFAULTS.overlapScoreWeight, 0),
    overlapScoreCredit: num('overlapScoreCredit', input.overlapScoreCredit, DEFAULTS.overlapScoreCredit, 0),
    overlapScoreCreditDecay: num('overlapScoreCreditDecay', input.overlapScoreCreditDecay, DEFAULTS.overlapScoreCreditDecay, 0),
    decodeActiveRequestWeight: num('decodeActiveRequestWeight', input.decodeActiveRequestWeight, DEFAULTS.decodeActiveRequestWeight, 0),
    temperature: num('temperature', input.temperature, DEFAULTS.temperature, 0),
    queueThreshold: nullableNum('queueThreshold', input.queueThreshold, DEFAULTS.queueThreshold, 0),
    queuePolicy: oneOf('queuePolicy', input.queuePolicy, DEFAULTS.queuePolicy, QUEUE_POLICIES),
    queueMaxPending: int('queueMaxPending', input.queueMaxPending, DEFAULTS.queueMaxPending, 0, 1 << 24),
    queueRecheckMs: int('queueRecheckMs', input.queueRecheckMs, DEFAULTS.queueRecheckMs, 0, 2 ** 31 - 1),
    retryAfterSecs: int('retryAfterSecs', input.retryAfterSecs, DEFAULTS.retryAfterSecs, 0, 86_400),
    trackActiveBlocks: bool('trackActiveBlocks', input.trackActiveBlocks, DEFAULTS.trackActiveBlocks),
    trackPrefillTokens: bool('trackPrefillTokens', input.trackPrefillTokens, DEFAULTS.trackPrefillTokens),
    assumeKvReuse: bool('assumeKvReuse', input.assumeKvReuse, DEFAULTS.assumeKvReuse),
    staleRequestSecs: num('staleRequestSecs', input.staleRequestSecs, DEFAULTS.staleRequestSecs, 0, Infinity, true),
    activeDecodeBlocksThreshold: nullableNum('activeDecodeBlocksThreshold', input.activeDecodeBlocksThreshold, null, 0, 1),
    activePrefillTokensThreshold: nullableNum('activePrefillTokensThreshold', input.activePrefillTokensThreshold, null, 0),
    activePrefillTokensThresholdFrac: nullableNum('activePrefillTokensThresholdFrac', input.activePrefillTokensThresholdFrac, null, 0),
    cudaToCpuRatio: num('cudaToCpuRatio', input.cudaToCpuRatio, DEFAULTS.cudaToCpuRatio, 0, Infinity, true),
    predictedTtlSecs: num('predictedTtlSecs', input.predictedTtlSecs, DEFAULTS.predictedTtlSecs, 0, 86_400),
    approximate,
    seed,
  })
}
