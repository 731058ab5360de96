// `kv-router serve` options: Dynamo's flag names, each with its DYN_* variable;
// the command line wins over the environment. Everything is validated here, once, and the result
// is frozen; an invalid value is a ConfigError whose message is the one line the CLI prints
// before exiting with status 2.
import { isHttpUrl, parseIntArg, parseNumArg } from './cli/flags.js'
import { COST_MODELS, ROUTER_MODES, QUEUE_POLICIES } from './scheduler/options.js'
import type { CostModel, QueuePolicy, RouterMode } from './scheduler/options.js'
import { MAX_SHARDS } from './thread/protocol.js'
import { LOG_FORMATS, parseLogLevel } from './runtime/log.js'
import type { LogFormat, LogLevel } from './runtime/log.js'

export class ConfigError extends Error {
  override name = 'ConfigError'
}

/** An engine's own KV-event publisher (vLLM, SGLang: ZMQ + MessagePack). */
export interface EngineEventsSpec {
  /** PUB endpoint of dp rank 0, tcp://host:port; rank r publishes on port + r. */
  readonly endpoint: string
  /** Replay ROUTER endpoint of dp rank 0 (rank r: port + r), or null. */
  readonly replay: string | null
  /** Topic prefix subscribed to ('' = every topic). */
  readonly topic: string
}

export interface StaticWorkerSpec {
  /** Worker id (u64); the 1-based position on the command line when not given. */
  readonly id: bigint
  readonly url: string
  /** Where the engine publishes its own KV events, or null (Dynamo events via NATS / HTTP). */
  readonly kvEvents: EngineEventsSpec | null
}

export interface ServeConfig {
  readonly mode: RouterMode
  readonly httpHost: string
  readonly httpPort: number
  readonly blockSize: number
  /** kv mode's cost: 'latency' (docs/cost.md) or Dynamo's formula. */
  readonly cost: CostModel
  readonly overlapScoreWeight: number
  readonly overlapScoreCredit: number
  readonly overlapScoreCreditDecay: number
  readonly decodeActiveRequestWeight: number
  readonly temperature: number
  readonly kvEvents: boolean
  /** Recover missed KV events from workers that answer Dynamo's worker query. */
  readonly eventRecovery: boolean
  readonly ttlSecs: number
  /** Approximate mode: entries the predicted-cache tree holds before it is pruned. */
  readonly maxTreeSize: number
  /** Approximate mode: the share of maxTreeSize a prune keeps. */
  readonly pruneTargetRatio: number
  /** Blocks one indexer shard holds at most; events beyond are rejected as `capacity`. */
  readonly maxIndexBlocks: number
  /** device-aware-weighted: a non-CPU worker's throughput in CPU workers. */
  readonly cudaToCpuRatio: number
  /** Predict-on-route: seconds a routed prompt counts as cached on its worker before its events (0 = off). */
  readonly predictedTtlSecs: number
  /** X-Dynamo-Session-ID bindings' lifetime in seconds (0 = off). */
  readonly sessionAffinityTtlSecs: number
  readonly queueThreshold: number | null
  readonly queuePolicy: QueuePolicy
  readonly queueMaxPending: number
  readonly trackActiveBlocks: boolean
  readonly trackPrefillTokens: boolean
  readonly assumeKvReuse: boolean
  readonly activeDecodeBlocksThreshold: number | null
  readonly activePrefillTokensThreshold: number | null
  readonly activePrefillTokensThresholdFrac: number | null
  readonly replicaSync: boolean
  /** Replica sync: how long a catch-up waits for peers' bookings at most, seconds. */
  readonly replicaCatchUpSecs: number
  /** Replica sync: replicas routing at the same moment take different workers where one router would (see Selector). */
  readonly replicaSpread: boolean
  readonly durableKvEvents: boolean
  readonly snapshotThreshold: number
  readonly resetStates: boolean
  /** Indexer shard threads (--router-event-threads); 0 = one per spare core. */
  readonly eventThreads: number
  /** µs an idle shard spins before sleeping; null = the pool's default (200 with a core to spare beyond the event loop and the shards, else 0). */
  readonly shardSpinUs: number | null
  /** µs the event loop spins for a query answer before awaiting; null = the pool's default (60 with a core to spare for every shard, else 0). */
  readonly querySpinUs: number | null
  readonly namespace: string
  readonly component: string
  readonly endpoint: string | null
  readonly natsUrl: string | null
  readonly etcdUrl: string | null
  readonly workers: readonly StaticWorkerSpec[]
  /** Path of a tokenizer.json, 'bytes', or null (token-id prompts only in kv mode). */
  readonly tokenizer: string | null
  readonly tokenizerThreads: number
  readonly apiKey: string | null
  /** With apiKey: /metrics answers without it. */
  readonly publicMetrics: boolean
  readonly modelName: string
  /** Simulated engines started in this process (the `npm start` demo fleet). */
  readonly embeddedFleet: number
  readonly proxyRetries: number
  /** Seconds between health probes of each worker (0 = no probes). */
  readonly healthProbeIntervalSecs: number
  /** Seconds a health probe waits for its answer. */
  readonly healthProbeTimeoutSecs: number
  /** Failed probes in a row that make a worker unreachable. */
  readonly healthProbeFailures: number
  readonly bodyLimit: number
  readonly shutdownTimeoutSecs: number
  /** Niceness of the router's threads (--nice); null leaves it as inherited. */
  readonly nice: number | null
  readonly seed: number | undefined
  readonly logLevel: LogLevel
  readonly logFormat: LogFormat
}

type Kind = 'int' | 'num' | 'bool' | 'enum' | 'str' | 'url' | 'workers' | 'nullnum' | 'name' | 'endpoint' | 'loglevel'

interface FlagDef {
  flag: string
  key: keyof ServeConfig
  env: readonly string[]
  kind: Kind
  dflt: unknown
  min?: number
  max?: number
  values?: readonly string[]
  /** kind 'url': the schemes each URL of the list may have. */
  schemes?: readonly string[]
  aliases?: readonly string[]
  help: string
}

const F = (d: FlagDef): FlagDef => d

export const FLAGS: readonly FlagDef[] = [
  F({ flag: '--router-mode', key: 'mode', env: ['DYN_ROUTER_MODE'], kind: 'enum', values: ROUTER_MODES, dflt: 'kv', help: 'how workers are chosen' }),
  F({ flag: '--http-host', key: 'httpHost', env: ['DYN_HTTP_HOST'], kind: 'str', dflt: '0.0.0.0', help: 'address to listen on' }),
  F({
    flag: '--http-port',
    key: 'httpPort',
    env: ['DYN_HTTP_PORT'],
    kind: 'int',
    min: 0,
    max: 65535,
    dflt: 8000,
    help: 'port to listen on (0 = any free port)',
  }),
  F({
    flag: '--router-block-size',
    key: 'blockSize',
    env: ['DYN_ROUTER_BLOCK_SIZE', 'DYN_KV_CACHE_BLOCK_SIZE'],
    aliases: ['--kv-cache-block-size', '--block-size'],
    kind: 'int',
    min: 1,
    max: 65536,
    dflt: 128,
    help: 'KV block size in tokens; must match the workers',
  }),
  F({
    flag: '--router-cost',
    key: 'cost',
    env: ['DYN_ROUTER_COST'],
    kind: 'enum',
    values: COST_MODELS,
    dflt: 'latency',
    help: "kv mode's cost: latency = the seconds a worker-rank would add (time to first token + the slowdown of its running requests, docs/cost.md); dynamo = Dynamo's weight × prefill_blocks + decode_blocks, tuned by the four flags that follow",
  }),
  F({
    flag: '--router-kv-overlap-score-weight',
    key: 'overlapScoreWeight',
    env: ['DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT', 'DYN_ROUTER_PREFILL_LOAD_SCALE', 'DYN_KV_OVERLAP_SCORE_WEIGHT', 'DYN_OVERLAP_SCORE_WEIGHT'],
    aliases: ['--kv-overlap-score-weight', '--router-prefill-load-scale'],
    kind: 'num',
    min: 0,
    dflt: 1.0,
    help: 'dynamo cost: weight of prefill blocks (Dynamo 1.2 and later call it the prefill load scale)',
  }),
  F({
    flag: '--router-kv-overlap-score-credit',
    key: 'overlapScoreCredit',
    env: ['DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT'],
    kind: 'num',
    min: 0,
    dflt: 1.0,
    help: 'dynamo cost: prefill blocks one cached block is worth; above 1 favours the worker holding the prefix over a less loaded one',
  }),
  F({
    flag: '--router-kv-overlap-score-credit-decay',
    key: 'overlapScoreCreditDecay',
    env: ['DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY'],
    kind: 'num',
    min: 0,
    dflt: 0,
    help: 'dynamo cost: shrinks the credit of workers with more queued prefill than the least queued one',
  }),
  F({
    flag: '--router-decode-active-request-weight',
    key: 'decodeActiveRequestWeight',
    env: ['DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT'],
    kind: 'num',
    min: 0,
    dflt: 0,
    help: 'dynamo cost: cost per request in flight on a worker',
  }),
  F({
    flag: '--router-temperature',
    key: 'temperature',
    env: ['DYN_ROUTER_TEMPERATURE'],
    kind: 'num',
    min: 0,
    dflt: 0.0,
    help: '0 = pick the cheapest; > 0 = softmax sampling',
  }),
  F({
    flag: '--router-kv-events',
    key: 'kvEvents',
    env: ['DYN_ROUTER_USE_KV_EVENTS', 'DYN_KV_EVENTS'],
    aliases: ['--kv-events'],
    kind: 'bool',
    dflt: true,
    help: "index workers' KV events (--no-… = approximate mode)",
  }),
  F({
    flag: '--router-event-recovery',
    key: 'eventRecovery',
    env: ['DYN_ROUTER_EVENT_RECOVERY'],
    kind: 'bool',
    dflt: true,
    help: "fetch what a worker's KV events missed (a gap in its event ids, or a router that starts after it cached blocks) through its worker query, POST {url}/v1/kv/query (--no-… = count gaps and accept them)",
  }),
  F({
    flag: '--router-ttl-secs',
    key: 'ttlSecs',
    env: ['DYN_ROUTER_TTL_SECS'],
    aliases: ['--router-ttl'],
    kind: 'num',
    min: 0.001,
    dflt: 120,
    help: 'approximate mode: seconds a routed prefix is assumed cached',
  }),
  F({
    flag: '--router-max-tree-size',
    key: 'maxTreeSize',
    env: ['DYN_ROUTER_MAX_TREE_SIZE'],
    kind: 'int',
    min: 1,
    max: 2 ** 31 - 1,
    dflt: 1 << 20,
    help: 'approximate mode: predicted entries kept before a prune',
  }),
  F({
    flag: '--router-prune-target-ratio',
    key: 'pruneTargetRatio',
    env: ['DYN_ROUTER_PRUNE_TARGET_RATIO'],
    kind: 'num',
    min: 0,
    max: 1,
    dflt: 0.8,
    help: 'approximate mode: share of --router-max-tree-size a prune keeps',
  }),
  F({
    flag: '--router-max-index-blocks',
    key: 'maxIndexBlocks',
    env: ['DYN_ROUTER_MAX_INDEX_BLOCKS'],
    kind: 'int',
    min: 1,
    max: 67_000_000,
    dflt: 60_000_000,
    help: 'blocks one indexer shard holds at most (KV events beyond it are rejected and counted as capacity)',
  }),
  F({
    flag: '--router-predicted-ttl-secs',
    key: 'predictedTtlSecs',
    env: ['DYN_ROUTER_PREDICTED_TTL_SECS'],
    kind: 'num',
    min: 0,
    max: 86_400,
    dflt: 0,
    help: "predict-on-route: seconds a routed prompt's blocks count as cached on the chosen worker until its KV events confirm them (0 = off; needs KV events)",
  }),
  F({
    flag: '--router-session-affinity-ttl-secs',
    key: 'sessionAffinityTtlSecs',
    env: ['DYN_ROUTER_SESSION_AFFINITY_TTL_SECS'],
    kind: 'num',
    min: 0,
    max: 31_536_000,
    dflt: 0,
    help: 'requests with an X-Dynamo-Session-ID header go to the worker their session last went to while that is younger than this, unless it is gone, suspended or busy (0 = off)',
  }),
  F({
    flag: '--encoder-cuda-to-cpu-ratio',
    key: 'cudaToCpuRatio',
    env: ['DYN_ENCODER_CUDA_TO_CPU_RATIO'],
    kind: 'num',
    min: 0.001,
    max: 1_000_000,
    dflt: 8,
    help: 'device-aware-weighted mode: how many CPU workers one non-CPU worker is worth',
  }),
  F({
    flag: '--router-queue-threshold',
    key: 'queueThreshold',
    env: ['DYN_ROUTER_QUEUE_THRESHOLD'],
    kind: 'nullnum',
    min: 0,
    dflt: 4.0,
    help: 'queue when every worker has more unstarted prefill than this × max_num_batched_tokens ("none" disables)',
  }),
  F({
    flag: '--router-queue-policy',
    key: 'queuePolicy',
    env: ['DYN_ROUTER_QUEUE_POLICY'],
    kind: 'enum',
    values: QUEUE_POLICIES,
    dflt: 'fcfs',
    help: 'order of waiting requests',
  }),
  F({
    flag: '--router-queue-max-pending',
    key: 'queueMaxPending',
    env: ['DYN_ROUTER_QUEUE_MAX_PENDING'],
    kind: 'int',
    min: 0,
    max: 1 << 24,
    dflt: 10_000,
    help: 'waiting requests beyond this get 503 + Retry-After',
  }),
  F({
    flag: '--router-track-active-blocks',
    key: 'trackActiveBlocks',
    env: ['DYN_ROUTER_TRACK_ACTIVE_BLOCKS'],
    kind: 'bool',
    dflt: true,
    help: 'count blocks of active requests in the cost',
  }),
  F({
    flag: '--router-track-prefill-tokens',
    key: 'trackPrefillTokens',
    env: ['DYN_ROUTER_TRACK_PREFILL_TOKENS'],
    kind: 'bool',
    dflt: true,
    help: 'count queued prefill tokens in the cost',
  }),
  F({
    flag: '--router-assume-kv-reuse',
    key: 'assumeKvReuse',
    env: ['DYN_ROUTER_ASSUME_KV_REUSE'],
    kind: 'bool',
    dflt: true,
    help: 'active requests sharing a prefix share its blocks',
  }),
  F({
    flag: '--active-decode-blocks-threshold',
    key: 'activeDecodeBlocksThreshold',
    env: ['DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD'],
    kind: 'nullnum',
    min: 0,
    max: 1,
    dflt: null,
    help: 'busy when active blocks / total blocks exceed this',
  }),
  F({
    flag: '--active-prefill-tokens-threshold',
    key: 'activePrefillTokensThreshold',
    env: ['DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD'],
    kind: 'nullnum',
    min: 0,
    dflt: null,
    help: 'busy when unstarted prefill tokens exceed this',
  }),
  F({
    flag: '--active-prefill-tokens-threshold-frac',
    key: 'activePrefillTokensThresholdFrac',
    env: ['DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC'],
    kind: 'nullnum',
    min: 0,
    dflt: null,
    help: 'busy when unstarted prefill tokens exceed this × max_num_batched_tokens',
  }),
  F({
    flag: '--router-replica-sync',
    key: 'replicaSync',
    env: ['DYN_ROUTER_REPLICA_SYNC'],
    kind: 'bool',
    dflt: false,
    help: "share bookings with the other router replicas over NATS (Dynamo's active_sequences_events); needs --nats-url",
  }),
  F({
    flag: '--router-replica-catch-up-secs',
    key: 'replicaCatchUpSecs',
    env: ['DYN_ROUTER_REPLICA_CATCH_UP_SECS'],
    kind: 'num',
    min: 0,
    max: 600,
    dflt: 2,
    help: "replica sync: how long a replica that starts or reconnects waits for its peers' bookings before it reports ready",
  }),
  F({
    flag: '--router-replica-spread',
    key: 'replicaSpread',
    env: ['DYN_ROUTER_REPLICA_SPREAD'],
    kind: 'bool',
    dflt: true,
    help: 'replica sync: while peers are routing too, a replica takes the worker one router would give its request after those of the replicas ranked before it, so replicas routing at the same moment do not all pick the cheapest worker (--no-…: always the cheapest)',
  }),
  F({
    flag: '--router-durable-kv-events',
    key: 'durableKvEvents',
    env: ['DYN_ROUTER_DURABLE_KV_EVENTS'],
    kind: 'bool',
    dflt: false,
    help: 'read KV events from the JetStream stream namespace-{ns}-component-{component}-kv-events through a durable consumer per replica, with index snapshots in the object store; needs --nats-url',
  }),
  F({
    flag: '--router-snapshot-threshold',
    key: 'snapshotThreshold',
    env: ['DYN_ROUTER_SNAPSHOT_THRESHOLD'],
    kind: 'int',
    min: 1,
    max: Number.MAX_SAFE_INTEGER,
    dflt: 1_000_000,
    help: 'durable mode: a replica snapshots the index and purges what every replica acknowledged when the stream holds more messages than this',
  }),
  F({
    flag: '--router-reset-states',
    key: 'resetStates',
    env: ['DYN_ROUTER_RESET_STATES'],
    kind: 'bool',
    dflt: false,
    help: 'durable mode: delete the snapshot and purge the stream at start (skipped while another replica reads the stream)',
  }),
  F({
    flag: '--router-event-threads',
    key: 'eventThreads',
    env: ['DYN_ROUTER_EVENT_THREADS'],
    kind: 'int',
    min: 0,
    max: MAX_SHARDS,
    dflt: 0,
    help: 'indexer shard threads (0 = one per spare core: the CPUs the process may use, capped by its cgroup CPU quota, less one)',
  }),
  F({
    flag: '--router-shard-spin-us',
    key: 'shardSpinUs',
    env: ['DYN_ROUTER_SHARD_SPIN_US'],
    kind: 'nullnum',
    min: 0,
    max: 1_000_000,
    dflt: null,
    help: 'µs an idle indexer shard spins before it sleeps (default 200 with a core to spare beyond the event loop and the shards, else 0)',
  }),
  F({
    flag: '--router-query-spin-us',
    key: 'querySpinUs',
    env: ['DYN_ROUTER_QUERY_SPIN_US'],
    kind: 'nullnum',
    min: 0,
    max: 1_000_000,
    dflt: null,
    help: 'µs the event loop spins for an overlap answer before it awaits (default 60 with a core to spare for every shard, else 0)',
  }),
  F({ flag: '--namespace', key: 'namespace', env: ['DYN_NAMESPACE'], kind: 'name', dflt: 'dynamo', help: 'Dynamo namespace' }),
  F({ flag: '--component', key: 'component', env: ['DYN_COMPONENT'], kind: 'name', dflt: 'backend', help: 'Dynamo component of the workers' }),
  F({ flag: '--endpoint', key: 'endpoint', env: ['DYN_ROUTER_ENDPOINT'], kind: 'endpoint', dflt: null, help: 'ns.component.endpoint (standalone form)' }),
  F({
    flag: '--nats-url',
    key: 'natsUrl',
    env: ['NATS_SERVER'],
    kind: 'url',
    schemes: ['nats', 'tls', 'ws', 'wss'],
    dflt: null,
    help: 'NATS server: KV events from namespace.{ns}.component.{component}.kv-events',
  }),
  F({
    flag: '--etcd-url',
    key: 'etcdUrl',
    env: ['ETCD_ENDPOINTS'],
    kind: 'url',
    schemes: ['http', 'https'],
    dflt: null,
    help: 'etcd: workers from v1/instances/{ns}/{component}/{endpoint}/ (docs/dynamo-compatibility.md)',
  }),
  F({
    flag: '--worker',
    key: 'workers',
    env: ['DYN_ROUTER_WORKERS'],
    kind: 'workers',
    dflt: [],
    help: "static worker: URL or ID=URL, then ,kv-events=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T] to read the engine's own KV events (repeatable; env: comma-separated)",
  }),
  F({
    flag: '--tokenizer',
    key: 'tokenizer',
    env: ['DYN_TOKENIZER'],
    kind: 'str',
    dflt: null,
    help: 'tokenizer.json path for text prompts, or "bytes" (UTF-8 bytes as tokens)',
  }),
  F({
    flag: '--tokenizer-threads',
    key: 'tokenizerThreads',
    env: ['DYN_TOKENIZER_THREADS'],
    kind: 'int',
    min: 1,
    max: 64,
    dflt: 1,
    help: 'piscina threads for tokenizing',
  }),
  F({
    flag: '--api-key',
    key: 'apiKey',
    env: ['DYN_API_KEY'],
    kind: 'str',
    dflt: null,
    help: 'require "Authorization: Bearer KEY" on every route but /health, /ready, /metrics, /status',
  }),
  F({
    flag: '--public-metrics',
    key: 'publicMetrics',
    env: ['DYN_PUBLIC_METRICS'],
    kind: 'bool',
    dflt: true,
    help: 'with --api-key, /metrics answers without the key (--no-public-metrics: it needs the key too)',
  }),
  F({ flag: '--model-name', key: 'modelName', env: ['DYN_MODEL_NAME'], kind: 'str', dflt: 'kv-router-model', help: 'model name served by GET /v1/models' }),
  F({
    flag: '--embedded-fleet',
    key: 'embeddedFleet',
    env: ['DYN_EMBEDDED_FLEET'],
    kind: 'int',
    min: 0,
    max: 64,
    dflt: 0,
    help: 'simulated engines to run in this process (demo)',
  }),
  F({
    flag: '--proxy-retries',
    key: 'proxyRetries',
    env: ['DYN_PROXY_RETRIES'],
    kind: 'int',
    min: 0,
    max: 16,
    dflt: 2,
    help: 'retries on another worker when one fails before its first token',
  }),
  F({
    flag: '--router-health-probe-interval-secs',
    key: 'healthProbeIntervalSecs',
    env: ['DYN_ROUTER_HEALTH_PROBE_INTERVAL_SECS'],
    kind: 'num',
    min: 0,
    max: 3600,
    dflt: 2,
    help: 'seconds between health probes of each worker, GET {url}/health (/v1/models where /health is 404); a worker failing --router-health-probe-failures in a row is unreachable and out of routing until one answers (0 = no probes)',
  }),
  F({
    flag: '--router-health-probe-timeout-secs',
    key: 'healthProbeTimeoutSecs',
    env: ['DYN_ROUTER_HEALTH_PROBE_TIMEOUT_SECS'],
    kind: 'num',
    min: 0.001,
    max: 600,
    dflt: 1,
    help: 'seconds a health probe waits for its answer before it counts as failed',
  }),
  F({
    flag: '--router-health-probe-failures',
    key: 'healthProbeFailures',
    env: ['DYN_ROUTER_HEALTH_PROBE_FAILURES'],
    kind: 'int',
    min: 1,
    max: 100,
    dflt: 2,
    help: 'failed health probes in a row that make a worker unreachable',
  }),
  F({
    flag: '--http-body-limit',
    key: 'bodyLimit',
    env: ['DYN_HTTP_BODY_LIMIT'],
    kind: 'int',
    min: 1024,
    max: 1 << 30,
    dflt: 16 * 1024 * 1024,
    help: 'largest request body in bytes (413 above)',
  }),
  F({
    flag: '--shutdown-timeout-secs',
    key: 'shutdownTimeoutSecs',
    env: ['DYN_SHUTDOWN_TIMEOUT_SECS'],
    kind: 'num',
    min: 0,
    max: 3600,
    dflt: 30,
    help: 'how long SIGTERM waits for in-flight requests',
  }),
  F({
    flag: '--nice',
    key: 'nice',
    env: ['DYN_ROUTER_NICE'],
    kind: 'int',
    min: -20,
    max: 19,
    dflt: null,
    help: "scheduling niceness of the router's threads; negative runs it ahead of engines or load generators on shared cores (below the current one needs root, CAP_SYS_NICE or RLIMIT_NICE)",
  }),
  F({
    flag: '--seed',
    key: 'seed',
    env: ['DYN_ROUTER_SEED'],
    kind: 'int',
    min: 0,
    max: 0xffffffff,
    dflt: undefined,
    help: 'seed of the selection RNG (tests)',
  }),
  F({
    flag: '--log-level',
    key: 'logLevel',
    env: ['DYN_LOG'],
    kind: 'loglevel',
    dflt: 'info',
    help: 'least severe log lines written (DYN_LOG: its bare level; target=level directives are skipped)',
  }),
  F({
    flag: '--log-format',
    key: 'logFormat',
    env: ['DYN_ROUTER_LOG_FORMAT'],
    kind: 'enum',
    values: LOG_FORMATS,
    dflt: 'auto',
    help: 'log lines on stderr: json (one object per line), pretty (for people), auto (pretty on a terminal, else json)',
  }),
]

function accepts(d: FlagDef): string {
  switch (d.kind) {
    case 'int':
      return `an integer in [${d.min ?? 0}, ${d.max ?? '∞'}]`
    case 'num':
      return `a number in [${d.min ?? 0}, ${d.max ?? '∞'}]`
    case 'nullnum':
      return `a number in [${d.min ?? 0}, ${d.max ?? '∞'}] or "none"`
    case 'bool':
      return 'true or false'
    case 'enum':
      return `one of ${(d.values ?? []).join('|')}`
    case 'url':
      return `a ${(d.schemes ?? ['http']).map((x) => x + '://').join(' or ')} URL (comma-separated for several servers of one cluster)`
    case 'workers':
      return 'a worker URL (http://host:port) or ID=URL with ID a u64, optionally followed by ,kv-events=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T]'
    case 'name':
      return 'a name of letters, digits, "_" and "-" (it becomes part of NATS subjects and etcd keys)'
    case 'endpoint':
      return 'namespace.component.endpoint, three names of letters, digits, "_" and "-" (dyn:// in front is allowed)'
    case 'loglevel':
      return 'one of error|warn|info|debug|trace|off (also fatal, silent), or a DYN_LOG filter such as info,dynamo_runtime=debug'
    default:
      return 'a non-empty string'
  }
}

function parseU64(text: string): bigint | null {
  if (!/^(0|[1-9][0-9]{0,19})$/.test(text)) return null
  const v = BigInt(text)
  return v <= 0xffffffffffffffffn ? v : null
}

function parseWorker(text: string, position: number): StaticWorkerSpec | null {
  let id: bigint | null = BigInt(position)
  let url = text
  const eq = text.indexOf('=')
  if (eq > 0 && !text.slice(0, eq).includes(':')) {
    id = parseU64(text.slice(0, eq))
    url = text.slice(eq + 1)
  }
  if (id === null) return null
  const checked = workerUrl(url)
  return checked === null ? null : Object.freeze({ id, url: checked, kvEvents: null })
}

/** The keys a --worker value may carry after its URL, for the engine's own KV events. */
const WORKER_KEYS = ['kv-events', 'replay', 'topic'] as const
type WorkerKey = (typeof WORKER_KEYS)[number]

/** `kv-events=…` and the like: a key of the worker before it, not a worker of its own. */
function workerKey(part: string): [WorkerKey, string] | null {
  const eq = part.indexOf('=')
  const key = part.slice(0, eq)
  return eq > 0 && (WORKER_KEYS as readonly string[]).includes(key) ? [key as WorkerKey, part.slice(eq + 1)] : null
}

/** A worker with the engine-event keys given after its URL; throws ConfigError (without the flag name) when they do not fit. */
function withEngineKeys(w: StaticWorkerSpec, keys: Map<WorkerKey, string>): StaticWorkerSpec {
  if (keys.size === 0) return w
  try {
    const spec = engineEventsSpec({ endpoint: keys.get('kv-events'), replay: keys.get('replay'), topic: keys.get('topic') }, 1, FLAG_FIELDS)
    return Object.freeze({ ...w, kvEvents: spec === null ? null : Object.freeze(spec) })
  } catch (err) {
    if (err instanceof ConfigError) throw new ConfigError(`worker ${w.id}: ${err.message}`)
    throw err
  }
}

/** How a source of registrations names the engine-event fields, for its error messages. */
export interface EngineEventsNames {
  readonly endpoint: string
  readonly replay: string
  readonly topic: string
  readonly dpSize: string
  /** The message when replay or topic come without the endpoint. */
  readonly alone: string
}

const FLAG_FIELDS: EngineEventsNames = {
  endpoint: 'kv-events',
  replay: 'replay',
  topic: 'topic',
  dpSize: 'dp_size',
  alone: 'replay= and topic= need kv-events=tcp://HOST:PORT',
}
/** The field names of POST /v1/workers and of etcd instance records. */
export const RECORD_FIELDS: EngineEventsNames = {
  endpoint: 'kv_events_endpoint',
  replay: 'replay_endpoint',
  topic: 'kv_events_topic',
  dpSize: 'dp_size',
  alone: 'replay_endpoint and kv_events_topic need kv_events_endpoint',
}

/**
 * The engine's own KV-event source a registration names (null or undefined fields are absent):
 * null when it names none, else its endpoints checked for every dp rank (rank r on port + r).
 * Throws ConfigError naming the field as `names` spells it. --worker, POST /v1/workers and etcd
 * records all check with it, so the three accept the same values.
 */
export function engineEventsSpec(
  f: { endpoint: unknown; replay: unknown; topic: unknown },
  dpRanks: number,
  names: EngineEventsNames,
): EngineEventsSpec | null {
  const given = (v: unknown): boolean => v !== null && v !== undefined
  if (!given(f.endpoint)) {
    if (given(f.replay) || given(f.topic)) throw new ConfigError(names.alone)
    return null
  }
  const endpoint = rankedEndpoint(f.endpoint, dpRanks, names.endpoint, names.dpSize)
  const replay = given(f.replay) ? rankedEndpoint(f.replay, dpRanks, names.replay, names.dpSize) : null
  if (given(f.topic) && typeof f.topic !== 'string') throw new ConfigError(`${names.topic} must be a string, got ${JSON.stringify(f.topic)}`)
  return { endpoint, replay, topic: (f.topic as string | undefined) ?? '' }
}

/** A tcp://HOST:PORT endpoint whose port + every rank is a port too. */
function rankedEndpoint(v: unknown, dpRanks: number, name: string, dpName: string): string {
  const e = typeof v === 'string' ? tcpEndpoint(v) : null
  if (e !== null && e.port + dpRanks - 1 <= 65535) return v as string
  const ranks = dpRanks > 1 ? ` with PORT + ${dpName} - 1 at most 65535 (${dpName} ${dpRanks})` : ''
  // the engine's own config names where it binds, which is no address to connect to
  const bind = typeof v === 'string' && v.startsWith('tcp://*:') ? '; tcp://*:PORT is where the engine binds, give the host the router connects to' : ''
  throw new ConfigError(`${name} must be tcp://HOST:PORT${ranks}, got ${JSON.stringify(v)}${bind}`)
}

/**
 * Host and port of a ZMQ endpoint the router connects to (tcp://HOST:PORT, port 1–65535), or
 * null. --worker and POST /v1/workers both check with it.
 */
export function tcpEndpoint(text: string): { host: string; port: number } | null {
  const m = /^tcp:\/\/(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(text)
  if (m === null) return null
  const port = Number(m[2])
  return port >= 1 && port <= 65535 ? { host: m[1] as string, port } : null
}

/** Rank r's endpoint: the port plus r, as vLLM offsets its publishers per dp rank. */
export function rankEndpoint(text: string, rank: number): string {
  const e = tcpEndpoint(text)
  if (e === null) throw new ConfigError(`not a tcp://HOST:PORT endpoint: ${JSON.stringify(text)}`)
  return `tcp://${e.host}:${e.port + rank}`
}

/**
 * A worker's HTTP endpoint as the proxy will use it (no trailing slash), or null when it cannot be
 * one: not http(s), no host, a port out of range. POST /v1/workers and --worker both check with it,
 * so a worker is never registered with a URL that fails every request sent to it.
 */
export function workerUrl(text: string): string | null {
  return isHttpUrl(text) ? text.replace(/\/+$/, '') : null
}

/**
 * The servers of a --nats-url or --etcd-url value. The client libraries take a list; handed the
 * flag's text whole, they would read a comma-separated list as one server and fail.
 */
export function urlList(text: string): string[] {
  return text
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x !== '')
}

function convert(d: FlagDef, raw: string, prev: unknown): unknown {
  const t = raw.trim()
  switch (d.kind) {
    case 'int':
      return parseIntArg(t, d.min ?? 0, d.max ?? Infinity)
    case 'num':
    case 'nullnum':
      if (d.kind === 'nullnum' && (t === 'none' || t === 'null' || t === 'off')) return null
      return parseNumArg(t, d.min ?? 0, d.max ?? Infinity)
    case 'bool': {
      const l = t.toLowerCase()
      if (l === 'true' || l === '1' || l === 'yes' || l === 'on') return true
      if (l === 'false' || l === '0' || l === 'no' || l === 'off') return false
      return undefined
    }
    case 'enum':
      return (d.values ?? []).includes(t) ? t : undefined
    case 'url': {
      const list = urlList(t)
      if (list.length === 0) return undefined
      for (const part of list) {
        try {
          const u = new URL(part)
          if (!(d.schemes ?? []).includes(u.protocol.slice(0, -1)) || u.hostname === '') return undefined
        } catch {
          return undefined
        }
      }
      return t
    }
    case 'workers': {
      const list = [...(prev as StaticWorkerSpec[])]
      const start = list.length
      // per worker of this value, the keys after its URL
      const keys: Map<WorkerKey, string>[] = []
      for (const raw of t.split(',')) {
        const part = raw.trim()
        const kv = workerKey(part)
        if (kv !== null) {
          const k = keys[keys.length - 1]
          if (k === undefined) throw new ConfigError(`${kv[0]}= must follow a worker URL`)
          if (k.has(kv[0])) throw new ConfigError(`${kv[0]}= is given twice for one worker`)
          k.set(kv[0], kv[1])
          continue
        }
        const w = parseWorker(part, list.length + 1)
        if (w === null) return undefined
        list.push(w)
        keys.push(new Map())
      }
      for (let i = 0; i < keys.length; i++) list[start + i] = withEngineKeys(list[start + i] as StaticWorkerSpec, keys[i] as Map<WorkerKey, string>)
      return list
    }
    case 'name':
      return NAME.test(t) ? t : undefined
    case 'endpoint': {
      const e = t.startsWith('dyn://') ? t.slice(6) : t
      const parts = e.split('.')
      return parts.length === 3 && parts.every((x) => NAME.test(x)) ? e : undefined
    }
    case 'loglevel':
      return parseLogLevel(t) ?? undefined
    default:
      return t === '' ? undefined : t
  }
}

// names that go into NATS subjects and etcd keys, where "." and "/" separate levels
const NAME = /^[A-Za-z0-9_-]+$/

/** convert(), with a ConfigError of its own (a --worker key that does not fit) named after the flag. */
function convertNamed(where: string, d: FlagDef, raw: string, prev: unknown): unknown {
  try {
    return convert(d, raw, prev)
  } catch (err) {
    if (err instanceof ConfigError) throw new ConfigError(`${where}: ${err.message}`)
    throw err
  }
}

function fail(where: string, d: FlagDef, raw: string): never {
  throw new ConfigError(`${where} must be ${accepts(d)}, got ${JSON.stringify(raw)}`)
}

const byName = new Map<string, FlagDef>()
for (const d of FLAGS) {
  byName.set(d.flag, d)
  for (const a of d.aliases ?? []) byName.set(a, d)
}

/**
 * Options from argv (after the subcommand) and the environment. Throws ConfigError with the one
 * line to print; returns 'help' for --help.
 */
export function parseServeConfig(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): ServeConfig | 'help' {
  const out: Record<string, unknown> = {}
  for (const d of FLAGS) out[d.key] = d.dflt
  // the command line first: a variable it overrides is not read at all, so a stale or wrong one
  // left in the environment cannot stop a router whose command line says otherwise
  const given = new Set<string>()
  let cliWorkers: StaticWorkerSpec[] | null = null
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string
    if (arg === '-h' || arg === '--help') return 'help'
    if (!arg.startsWith('--')) throw new ConfigError(`unexpected argument ${JSON.stringify(arg)} (see kv-router serve --help)`)
    const eq = arg.indexOf('=')
    const name = eq > 0 ? arg.slice(0, eq) : arg
    let d = byName.get(name)
    let negated = false
    if (d === undefined && name.startsWith('--no-')) {
      d = byName.get(`--${name.slice(5)}`)
      negated = d?.kind === 'bool'
      if (!negated) d = undefined
    }
    if (d === undefined) throw new ConfigError(`unknown option ${name} (see kv-router serve --help)`)
    given.add(d.key)
    if (negated) {
      if (eq > 0) throw new ConfigError(`${name} takes no value`)
      out[d.key] = false
      continue
    }
    let raw: string
    if (eq > 0) raw = arg.slice(eq + 1)
    else if (d.kind === 'bool' && (argv[i + 1] === undefined || (argv[i + 1] as string).startsWith('--'))) raw = 'true'
    else {
      const next = argv[i + 1]
      if (next === undefined) throw new ConfigError(`${name} needs a value: ${accepts(d)}`)
      // `--http-host --http-port 80` forgot the host; a value that really starts with "--" can
      // be given as NAME=VALUE
      if (next.startsWith('--') && next.length > 2)
        throw new ConfigError(`${name} needs a value (${accepts(d)}), got the option ${next}; write ${name}=VALUE for a value that starts with --`)
      raw = next
      i++
    }
    if (d.kind === 'workers') {
      const v = convertNamed(name, d, raw, cliWorkers ?? [])
      if (v === undefined) fail(name, d, raw)
      cliWorkers = v as StaticWorkerSpec[]
      continue
    }
    const v = convert(d, raw, [])
    if (v === undefined) fail(name, d, raw)
    out[d.key] = v
  }
  if (cliWorkers !== null) out.workers = cliWorkers
  for (const d of FLAGS) {
    if (given.has(d.key)) continue
    // of several names for one option, the first listed wins
    for (const name of [...d.env].reverse()) {
      const raw = env[name]
      if (raw === undefined || raw === '') continue
      const v = convertNamed(`${name} (${d.flag})`, d, raw, [])
      if (v === undefined) fail(`${name} (${d.flag})`, d, raw)
      out[d.key] = v
    }
  }
  const workers = out.workers as StaticWorkerSpec[]
  const ids = new Set<bigint>()
  for (const w of workers) {
    if (ids.has(w.id)) throw new ConfigError(`--worker: worker id ${w.id} is given twice`)
    ids.add(w.id)
  }
  out.workers = Object.freeze([...workers])
  // approximate mode predicts every decision for --router-ttl-secs already
  if ((out.predictedTtlSecs as number) > 0 && out.kvEvents === false)
    throw new ConfigError('--router-predicted-ttl-secs needs KV events: it is not used with --no-router-kv-events')
  if (out.replicaSync === true && out.natsUrl === null) throw new ConfigError('--router-replica-sync needs --nats-url: replicas share their bookings over NATS')
  if (out.durableKvEvents === true) {
    if (out.natsUrl === null) throw new ConfigError('--router-durable-kv-events needs --nats-url: the durable stream is on the NATS server')
    if (out.kvEvents === false) throw new ConfigError('--router-durable-kv-events needs KV events: it cannot be combined with --no-router-kv-events')
  }
  return Object.freeze(out) as unknown as ServeConfig
}

export function serveHelp(): string {
  const lines = [
    'usage: kv-router serve [options]',
    '',
    'Runs the KV-cache-aware router. Every option also reads its environment variable; the command line wins.',
    '',
  ]
  for (const d of FLAGS) {
    const names = [d.kind === 'bool' ? `${d.flag}, --no-${d.flag.slice(2)}` : `${d.flag} V`, ...(d.aliases ?? [])].join(', ')
    const dflt = d.dflt === null || d.dflt === undefined || (Array.isArray(d.dflt) && d.dflt.length === 0) ? '' : ` (default ${String(d.dflt)})`
    lines.push(`  ${names}`)
    lines.push(`      ${d.help}${dflt}; ${accepts(d)}; env ${d.env.join(', ')}`)
  }
  lines.push('  -h, --help')
  return lines.join('\n') + '\n'
}
