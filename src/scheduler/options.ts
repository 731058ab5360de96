// Scheduler options: each one a row of the serve command's table (src/config/table.ts), with its
// flag, variables, default and range, so the router's configuration and a Scheduler built by code
// take the same defaults and refuse the same values. Resolved once, then frozen; every message
// names the option and the accepted range.
import { KvrError } from '../errors.js'
import { opt, resolveValues } from '../config/table.js'
import type { ConfigOf } from '../config/table.js'

export const ROUTER_MODES = ['kv', 'round-robin', 'random', 'least-loaded', 'power-of-two', 'direct', 'device-aware-weighted'] as const
export type RouterMode = (typeof ROUTER_MODES)[number]

/** kv mode's cost: the latency model of cost.ts, or Dynamo's formula. */
export const COST_MODELS = ['latency', 'dynamo'] as const
export type CostModel = (typeof COST_MODELS)[number]

export const QUEUE_POLICIES = ['fcfs', 'wspt', 'lcfs'] as const
export type QueuePolicy = (typeof QUEUE_POLICIES)[number]

/** Used when a worker-rank does not publish max_num_batched_tokens (Dynamo's default). */
export const DEFAULT_MAX_BATCHED_TOKENS = 10_000_000

/** What the four flags of Dynamo's formula do under the latency cost. */
const COST_ONLY = "tunes Dynamo's cost and has no effect under --router-cost latency (the default); add --router-cost dynamo to use it"

/** The scheduler's rows of `kv-router serve`'s table (the serve table places them among its own). */
export const SCHEDULER_ROWS = [
  opt({
    flag: '--router-mode',
    key: 'mode',
    env: ['DYN_ROUTER_MODE'],
    kind: 'enum',
    values: ROUTER_MODES,
    dflt: 'kv',
    help: 'how workers are chosen',
    doc:
      'How workers are chosen: `kv`, `round-robin`, `random`, `least-loaded`, `power-of-two`, `direct`, `device-aware-weighted` (see ' +
      '[architecture](architecture.md#modes)).',
  }),
  opt({
    flag: '--router-cost',
    key: 'cost',
    env: ['DYN_ROUTER_COST'],
    kind: 'enum',
    values: COST_MODELS,
    dflt: 'latency',
    help:
      "kv mode's cost: latency = the seconds a worker-rank would add (time to first token + the slowdown of its running requests, docs/cost.md); " +
      "dynamo = Dynamo's weight × prefill_blocks + decode_blocks, tuned by the four flags that follow",
    doc:
      "The cost `kv` mode minimizes. `latency`: the seconds a worker-rank would add to the fleet's latency (the request's time to first token, the " +
      'slowdown of the requests decoding there, the wait of the requests arriving after it), from a model of the engine; see ' +
      "[architecture](architecture.md#cost-kv-mode). `dynamo`: Dynamo's `weight × prefill_blocks + decode_blocks`, exactly as Dynamo computes it, " +
      "tuned by the next four flags. The one default that differs from Dynamo's.",
  }),
  opt({
    flag: '--router-learn-engines',
    key: 'learnEngines',
    env: ['KVR_ROUTER_LEARN_ENGINES'],
    kind: 'bool',
    dflt: true,
    help: "latency cost: learn each worker-rank's prefill and decode speed from the requests it serves (--no-router-learn-engines: the fixed model)",
    doc:
      "`--router-cost latency`: learn each worker-rank's engine model (prefill per-token and per-step cost, decode step time and its growth with KV " +
      'usage) from the time to first token and inter-token times of the streamed requests it serves, starting from the default model; ' +
      '`--no-router-learn-engines` prices every worker-rank with the fixed default model. See [cost](cost.md#what-the-cost-learns).',
    noEffect: { when: { cost: 'dynamo' }, says: 'tunes the latency cost and has no effect under --router-cost dynamo' },
  }),
  opt({
    flag: '--router-block-size',
    key: 'blockSize',
    env: ['DYN_ROUTER_BLOCK_SIZE', 'DYN_KV_CACHE_BLOCK_SIZE'],
    aliases: ['--kv-cache-block-size', '--block-size'],
    kind: 'int',
    min: 1,
    max: 65536,
    dflt: 128,
    help: 'KV block size in tokens; must match the workers',
    doc: "KV block size in tokens, 1–65536. Must equal the engines' block size, or no block ever matches.",
  }),
  opt({
    flag: '--router-kv-overlap-score-weight',
    key: 'overlapScoreWeight',
    env: ['DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT', 'DYN_ROUTER_PREFILL_LOAD_SCALE', 'DYN_KV_OVERLAP_SCORE_WEIGHT', 'DYN_OVERLAP_SCORE_WEIGHT'],
    aliases: ['--kv-overlap-score-weight', '--router-prefill-load-scale'],
    kind: 'num',
    min: 0,
    dflt: 1.0,
    help: "dynamo cost: weight of prefill blocks (Dynamo's newer 1.x releases call it the prefill load scale)",
    doc: "`--router-cost dynamo`: weight of the prefill term (≥ 0); Dynamo's newer name for it is the prefill load scale.",
    noEffect: { when: { mode: 'kv', cost: 'latency' }, says: COST_ONLY },
  }),
  opt({
    flag: '--router-kv-overlap-score-credit',
    key: 'overlapScoreCredit',
    env: ['DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT'],
    kind: 'num',
    min: 0,
    dflt: 1.0,
    help: 'dynamo cost: prefill blocks one cached block is worth; above 1 favours the worker holding the prefix over a less loaded one',
    doc: '`--router-cost dynamo`: prefill blocks one cached block is worth (≥ 0). Above 1 favours the worker that holds the prefix over a less loaded one.',
    noEffect: { when: { mode: 'kv', cost: 'latency' }, says: COST_ONLY },
  }),
  opt({
    flag: '--router-kv-overlap-score-credit-decay',
    key: 'overlapScoreCreditDecay',
    env: ['DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY'],
    kind: 'num',
    min: 0,
    dflt: 0,
    help: 'dynamo cost: shrinks the credit of workers with more queued prefill than the least queued one',
    doc: '`--router-cost dynamo`: shrinks the credit of workers with more queued prefill than the least queued candidate (≥ 0).',
    noEffect: { when: { mode: 'kv', cost: 'latency' }, says: COST_ONLY },
  }),
  opt({
    flag: '--router-decode-active-request-weight',
    key: 'decodeActiveRequestWeight',
    env: ['DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT'],
    kind: 'num',
    min: 0,
    dflt: 0,
    help: 'dynamo cost: cost per request in flight on a worker',
    doc: '`--router-cost dynamo`: cost added per request already in flight on a worker-rank (≥ 0).',
    noEffect: { when: { mode: 'kv', cost: 'latency' }, says: COST_ONLY },
  }),
  opt({
    flag: '--router-temperature',
    key: 'temperature',
    env: ['DYN_ROUTER_TEMPERATURE'],
    kind: 'num',
    min: 0,
    dflt: 0.0,
    help: '0 = pick the cheapest; > 0 = softmax sampling',
    doc:
      '0 picks the cheapest worker-rank (under `latency`, costs within 1% of the cheapest go to the one with the fewest requests in flight; under ' +
      '`dynamo`, exact ties at random); above 0, softmax sampling over the costs.',
  }),
  opt({
    flag: '--router-predicted-ttl-secs',
    key: 'predictedTtlSecs',
    env: ['DYN_ROUTER_PREDICTED_TTL_SECS'],
    kind: 'num',
    min: 0,
    max: 86_400,
    dflt: 0,
    help: "predict-on-route: seconds a routed prompt's blocks count as cached on the chosen worker until its KV events confirm them (0 = off; needs KV events)",
    doc:
      "Predict-on-route: seconds a routed prompt's blocks count as cached on the chosen worker-rank until its KV events confirm them; the overlap " +
      "is the larger of the index's and this (0 = off, up to 86400; not with `--no-router-kv-events`).",
  }),
  opt({
    flag: '--encoder-cuda-to-cpu-ratio',
    key: 'cudaToCpuRatio',
    env: ['DYN_ENCODER_CUDA_TO_CPU_RATIO'],
    kind: 'num',
    min: 0,
    openMin: true,
    max: 1_000_000,
    dflt: 8,
    help: 'device-aware-weighted mode: how many CPU workers one non-CPU worker is worth',
    doc: '`device-aware-weighted` mode: how many CPU workers one non-CPU worker is worth.',
  }),
  opt({
    flag: '--router-queue-threshold',
    key: 'queueThreshold',
    env: ['DYN_ROUTER_QUEUE_THRESHOLD'],
    kind: 'num',
    nullable: true,
    min: 0,
    dflt: 4.0,
    help: 'queue when every worker has more unstarted prefill than this × max_num_batched_tokens ("none" disables)',
    doc:
      'A request waits in the router queue when every worker-rank it may use has more unstarted prefill tokens than this × ' +
      '`max_num_batched_tokens`. `none` disables the queue.',
  }),
  opt({
    flag: '--router-queue-policy',
    key: 'queuePolicy',
    env: ['DYN_ROUTER_QUEUE_POLICY'],
    kind: 'enum',
    values: QUEUE_POLICIES,
    dflt: 'fcfs',
    help: 'order of waiting requests',
    doc: 'Order of waiting requests: `fcfs`, `wspt` or `lcfs`.',
  }),
  opt({
    flag: '--router-queue-max-pending',
    key: 'queueMaxPending',
    env: ['DYN_ROUTER_QUEUE_MAX_PENDING'],
    kind: 'int',
    min: 0,
    max: 1 << 24,
    dflt: 10_000,
    help: 'waiting requests beyond this get 503 + Retry-After',
    doc: 'Waiting requests beyond this are refused with 503 and `Retry-After` (0–2^24).',
  }),
  opt({
    flag: '--router-track-active-blocks',
    key: 'trackActiveBlocks',
    env: ['DYN_ROUTER_TRACK_ACTIVE_BLOCKS'],
    kind: 'bool',
    dflt: true,
    help: 'count blocks of active requests in the cost',
    doc: 'Count the KV blocks of requests in flight in the cost (the decode term).',
  }),
  opt({
    flag: '--router-track-prefill-tokens',
    key: 'trackPrefillTokens',
    env: ['DYN_ROUTER_TRACK_PREFILL_TOKENS'],
    kind: 'bool',
    dflt: true,
    help: 'count queued prefill tokens in the cost',
    doc: 'Count prefill tokens booked but not yet computed in the cost.',
  }),
  opt({
    flag: '--router-assume-kv-reuse',
    key: 'assumeKvReuse',
    env: ['DYN_ROUTER_ASSUME_KV_REUSE'],
    kind: 'bool',
    dflt: true,
    help: 'active requests sharing a prefix share its blocks',
    doc: 'Requests in flight on one worker that share a prefix share its blocks (counted once).',
  }),
  opt({
    flag: '--active-decode-blocks-threshold',
    key: 'activeDecodeBlocksThreshold',
    env: ['DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD'],
    kind: 'num',
    nullable: true,
    min: 0,
    max: 1,
    dflt: null,
    help: 'busy when active blocks / total blocks exceed this',
    doc: 'Load shedding: a worker-rank is busy when its active blocks / total KV blocks exceed this (0–1). Live-editable with `POST /busy_threshold`.',
  }),
  opt({
    flag: '--active-prefill-tokens-threshold',
    key: 'activePrefillTokensThreshold',
    env: ['DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD'],
    kind: 'num',
    nullable: true,
    min: 0,
    dflt: null,
    help: 'busy when unstarted prefill tokens exceed this',
    doc: 'Load shedding: busy when unstarted prefill tokens exceed this.',
  }),
  opt({
    flag: '--active-prefill-tokens-threshold-frac',
    key: 'activePrefillTokensThresholdFrac',
    env: ['DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC'],
    kind: 'num',
    nullable: true,
    min: 0,
    dflt: null,
    help: 'busy when unstarted prefill tokens exceed this × max_num_batched_tokens',
    doc: 'Load shedding: busy when unstarted prefill tokens exceed this × `max_num_batched_tokens`.',
  }),
  opt({
    flag: '--seed',
    key: 'seed',
    env: ['DYN_ROUTER_SEED'],
    kind: 'int',
    min: 0,
    max: 0xffffffff,
    dflt: undefined,
    help: 'seed of the selection RNG (tests)',
    doc: 'Seed of the selection RNG (0–2^32−1), for reproducible tests.',
  }),
] as const

export const APPROXIMATE_ROWS = [
  opt({
    flag: '--router-ttl-secs',
    key: 'ttlSecs',
    env: ['DYN_ROUTER_TTL_SECS'],
    aliases: ['--router-ttl'],
    kind: 'num',
    min: 0,
    openMin: true,
    dflt: 120,
    help: 'approximate mode: seconds a routed prefix is assumed cached',
    doc: 'Approximate mode: seconds a routed prefix is assumed cached (> 0).',
  }),
  opt({
    flag: '--router-max-tree-size',
    key: 'maxTreeSize',
    env: ['DYN_ROUTER_MAX_TREE_SIZE'],
    kind: 'int',
    min: 1,
    max: 2 ** 31 - 1,
    dflt: 1 << 20,
    help: 'approximate mode: predicted entries kept before a prune',
    doc: 'Approximate mode: predicted (block, worker-rank) entries kept before a prune, 1–2^31−1.',
  }),
  opt({
    flag: '--router-prune-target-ratio',
    key: 'pruneTargetRatio',
    env: ['DYN_ROUTER_PRUNE_TARGET_RATIO'],
    kind: 'num',
    min: 0,
    max: 1,
    dflt: 0.8,
    help: 'approximate mode: share of --router-max-tree-size a prune keeps',
    doc: 'Approximate mode: share of `--router-max-tree-size` a prune keeps, 0–1.',
  }),
] as const

/** Options only code sets (no flag). */
const INTERNAL_ROWS = [
  opt({
    flag: '',
    key: 'queueRecheckMs',
    kind: 'int',
    min: 0,
    max: 2 ** 31 - 1,
    dflt: 60_000,
    help: 'periodic queue recheck in ms; 0 = none (dispatch on prefill-complete and free only)',
  }),
  opt({ flag: '', key: 'retryAfterSecs', kind: 'int', min: 0, max: 86_400, dflt: 1, help: 'seconds a 503 asks the client to wait (Retry-After)' }),
  opt({
    flag: '',
    key: 'staleRequestSecs',
    kind: 'num',
    min: 0,
    openMin: true,
    dflt: 300,
    help: "a booked request still present this long after it was added is freed (Dynamo's 300 s)",
  }),
] as const

/** Approximate mode's switch: on when the router runs with --no-router-kv-events. */
const ENABLED_ROW = [opt({ flag: '', key: 'enabled', kind: 'bool', dflt: false, help: 'approximate mode: predict caches from the decisions' })] as const

export type ApproximateOptions = ConfigOf<typeof APPROXIMATE_ROWS> & ConfigOf<typeof ENABLED_ROW>

export type SchedulerOptions = ConfigOf<typeof SCHEDULER_ROWS> &
  ConfigOf<typeof INTERNAL_ROWS> & {
    readonly approximate: ApproximateOptions
  }

export type SchedulerOptionsInput = { -readonly [K in keyof Omit<SchedulerOptions, 'approximate'>]?: SchedulerOptions[K] } & {
  approximate?: Partial<ApproximateOptions>
}

const TOP_ROWS = [...SCHEDULER_ROWS, ...INTERNAL_ROWS]
const APPROX_ROWS = [...APPROXIMATE_ROWS, ...ENABLED_ROW]

/** Validates, fills defaults and deep-freezes. Throws KvrError(KVR_ERR_INVALID_OPTION). */
export function resolveSchedulerOptions(input: SchedulerOptionsInput = {}): SchedulerOptions {
  if (input === null || typeof input !== 'object') throw new KvrError('KVR_ERR_INVALID_OPTION', `scheduler options must be an object, got ${String(input)}`)
  const { approximate: a, ...rest } = input
  const top = resolveValues<Omit<SchedulerOptions, 'approximate'>>(TOP_ROWS, rest, 'scheduler option')
  const approximate = resolveValues<ApproximateOptions>(APPROX_ROWS, (a === undefined ? {} : a) as Record<string, unknown>, 'scheduler option', 'approximate.')
  return Object.freeze({ ...top, approximate })
}

/** The scheduler's options out of a configuration that holds its rows (the serve command's). */
export function schedulerOptionsOf(config: Readonly<Record<string, unknown>>, approximate: boolean): SchedulerOptionsInput {
  const o: Record<string, unknown> = {}
  for (const d of SCHEDULER_ROWS) o[d.key] = config[d.key]
  const a: Record<string, unknown> = { enabled: approximate }
  for (const d of APPROXIMATE_ROWS) a[d.key] = config[d.key]
  return { ...o, approximate: a } as SchedulerOptionsInput
}
