// `kv-router serve` options: Dynamo's flag names, each with its DYN_* variable; the command line
// wins over the environment. One table (its scheduler rows come from src/scheduler/options.ts)
// gives the parser, --help, docs/configuration.md and the ServeConfig type. Everything is
// validated here, once, and the result is frozen; an invalid value is a ConfigError whose message
// is the one line the CLI prints before exiting with status 2.
import { APPROXIMATE_ROWS, SCHEDULER_ROWS } from './scheduler/options.js'
import { MAX_SHARDS } from './thread/protocol.js'
import { LOG_FORMATS, parseLogLevel } from './runtime/log.js'
import { SNAPSHOT_FORMATS } from './transport/durable.js'
import { engineEventsSpec, workerUrl } from './core/endpoints.js'
import type { EngineEventsNames, EngineEventsSpec } from './core/endpoints.js'
import { isKvrError } from './errors.js'
import { ConfigError, opt, optionsHelp, parseOptions, withoutEffect } from './config/table.js'
import type { CommandTable, ConfigOf, OptionDef, Parsed } from './config/table.js'

export { ConfigError } from './config/table.js'
export type { EngineEventsSpec } from './core/endpoints.js'

export interface StaticWorkerSpec {
  /** Worker id (u64); the 1-based position on the command line when not given. */
  readonly id: bigint
  readonly url: string
  /** Where the engine publishes its own KV events, or null (Dynamo events via NATS / HTTP). */
  readonly kvEvents: EngineEventsSpec | null
  /** Routed by /v1/route only: never probed, never sent a proxied request (`decisions-only=true`). */
  readonly decisionsOnly: boolean
}

// names that go into NATS subjects and etcd keys, where "." and "/" separate levels
const NAME = /^[A-Za-z0-9_-]+$/
/** Dynamo's event planes (`--event-plane`, `DYN_EVENT_PLANE`). */
const EVENT_PLANES = ['zmq', 'nats'] as const
/** How requests to Dynamo's TCP request plane are encoded (`--request-plane-codec`, `DYN_REQUEST_PLANE_CODEC`). */
const REQUEST_PLANE_CODECS = ['json', 'msgpack'] as const
const NAME_ACCEPTS = 'a name of letters, digits, "_" and "-" (it becomes part of NATS subjects and etcd keys)'
const ENDPOINT_ACCEPTS = 'namespace.component.endpoint, three names of letters, digits, "_" and "-" (dyn:// in front is allowed)'
const LOG_LEVEL_ACCEPTS = 'one of error|warn|info|debug|trace|off (also fatal, silent), or a DYN_LOG filter such as info,dynamo_runtime=debug'
const WORKER_ACCEPTS =
  'a worker URL (http://host:port) or ID=URL with ID a u64, optionally followed by ,kv-events=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T] ' +
  'and ,decisions-only=true'

function readName(t: string): string | undefined {
  return NAME.test(t) ? t : undefined
}

function readEndpoint(t: string): string | undefined {
  const e = t.startsWith('dyn://') ? t.slice(6) : t
  const parts = e.split('.')
  return parts.length === 3 && parts.every((x) => NAME.test(x)) ? e : undefined
}

function urlsAccepts(schemes: readonly string[]): string {
  return `a ${schemes.map((x) => x + '://').join(' or ')} URL (comma-separated for several servers of one cluster)`
}

/** A list of servers whose URLs all have one of the schemes (the text is kept whole). */
function urlsOf(schemes: readonly string[]): (t: string) => string | undefined {
  return (t) => {
    const list = t
      .split(',')
      .map((x) => x.trim())
      .filter((x) => x !== '')
    if (list.length === 0) return undefined
    for (const part of list) {
      try {
        const u = new URL(part)
        if (!schemes.includes(u.protocol.slice(0, -1)) || u.hostname === '') return undefined
      } catch {
        return undefined
      }
    }
    return t
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
  return checked === null ? null : Object.freeze({ id, url: checked, kvEvents: null, decisionsOnly: false })
}

/** The keys a --worker value may carry after its URL, for the engine's own KV events. */
const WORKER_KEYS = ['kv-events', 'replay', 'topic', 'decisions-only'] as const
type WorkerKey = (typeof WORKER_KEYS)[number]

/** `kv-events=…` and the like: a key of the worker before it, not a worker of its own. */
function workerKey(part: string): [WorkerKey, string] | null {
  const eq = part.indexOf('=')
  const key = part.slice(0, eq)
  return eq > 0 && (WORKER_KEYS as readonly string[]).includes(key) ? [key as WorkerKey, part.slice(eq + 1)] : null
}

const FLAG_FIELDS: EngineEventsNames = {
  endpoint: 'kv-events',
  replay: 'replay',
  topic: 'topic',
  dpSize: 'dp_size',
  alone: 'replay= and topic= need kv-events=tcp://HOST:PORT',
}

/** A worker with the engine-event keys given after its URL; throws ConfigError (without the flag name) when they do not fit. */
function withEngineKeys(w: StaticWorkerSpec, keys: Map<WorkerKey, string>): StaticWorkerSpec {
  const only = keys.get('decisions-only')
  if (only !== undefined) {
    if (only !== 'true' && only !== 'false') throw new ConfigError(`worker ${w.id}: decisions-only= takes true or false, got ${JSON.stringify(only)}`)
    w = Object.freeze({ ...w, decisionsOnly: only === 'true' })
    keys.delete('decisions-only')
  }
  if (keys.size === 0) return w
  try {
    const spec = engineEventsSpec({ endpoint: keys.get('kv-events'), replay: keys.get('replay'), topic: keys.get('topic') }, 1, FLAG_FIELDS)
    return Object.freeze({ ...w, kvEvents: spec === null ? null : Object.freeze(spec) })
  } catch (err) {
    if (isKvrError(err, 'KVR_ERR_INVALID_ENDPOINT')) throw new ConfigError(`worker ${w.id}: ${err.message}`)
    throw err
  }
}

/** One --worker value (or the variable's list) after the workers given before it. */
function readWorkers(t: string, prev: unknown): readonly StaticWorkerSpec[] | undefined {
  const list = [...(prev as readonly StaticWorkerSpec[])]
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

/**
 * A table's rows by key, their literal types kept: the serve table picks the scheduler's rows by
 * name, so a row moved or added there cannot take another's place here.
 */
function byKey<const T extends readonly OptionDef[]>(rows: T): { readonly [D in T[number] as D['key']]: D } {
  return Object.fromEntries(rows.map((d) => [d.key, d])) as { readonly [D in T[number] as D['key']]: D }
}
const sched = byKey(SCHEDULER_ROWS)
const approx = byKey(APPROXIMATE_ROWS)

const SERVE_ROWS = [
  sched.mode,
  opt({
    flag: '--http-host',
    key: 'httpHost',
    env: ['DYN_HTTP_HOST'],
    kind: 'str',
    dflt: '0.0.0.0',
    help: 'address to listen on',
    doc: 'Address to listen on.',
  }),
  opt({
    flag: '--http-port',
    key: 'httpPort',
    env: ['DYN_HTTP_PORT'],
    kind: 'int',
    min: 0,
    max: 65535,
    dflt: 8000,
    help: 'port to listen on (0 = any free port)',
    doc: 'Port to listen on, 0–65535 (0 = any free port; the start-up line names it).',
  }),
  sched.blockSize,
  sched.cost,
  sched.learnEngines,
  sched.overlapScoreWeight,
  sched.overlapScoreCredit,
  sched.overlapScoreCreditDecay,
  sched.decodeActiveRequestWeight,
  sched.temperature,
  // Dynamo's names and defaults: lib/kv-router/src/scheduling/config.rs@0243c51b (default_host_cache_hit_weight,
  // default_disk_cache_hit_weight)
  opt({
    flag: '--router-host-cache-hit-weight',
    key: 'hostCacheHitWeight',
    env: ['DYN_ROUTER_HOST_CACHE_HIT_WEIGHT'],
    kind: 'num',
    min: 0,
    max: 1,
    dflt: 0.75,
    help: 'kv mode: what a prompt block matched in the host (CPU) tier counts for, against 1 for a device block',
    doc:
      "`kv` mode: the device blocks one prompt block matched in a worker-rank's host-pinned (CPU) tier counts for, 0–1 (it must be loaded " +
      "first). A worker-rank's overlap is device + this × its host-tier extension + the disk weight × its disk-tier extension; see " +
      '[architecture](architecture.md#storage-tiers).',
  }),
  opt({
    flag: '--router-disk-cache-hit-weight',
    key: 'diskCacheHitWeight',
    env: ['DYN_ROUTER_DISK_CACHE_HIT_WEIGHT'],
    kind: 'num',
    min: 0,
    max: 1,
    dflt: 0.25,
    help: 'kv mode: what a prompt block matched in the disk (or external) tier counts for, against 1 for a device block',
    doc:
      "`kv` mode: the device blocks one prompt block matched in a worker-rank's disk or external tier counts for, 0–1; see " +
      '[architecture](architecture.md#storage-tiers).',
  }),
  opt({
    flag: '--router-kv-events',
    key: 'kvEvents',
    env: ['DYN_ROUTER_USE_KV_EVENTS', 'DYN_KV_EVENTS'],
    aliases: ['--kv-events'],
    kind: 'bool',
    dflt: true,
    help: "index workers' KV events (--no-… = approximate mode)",
    doc: "Index the workers' KV events. `--no-router-kv-events` is approximate mode: the router predicts caches from its own decisions.",
  }),
  opt({
    flag: '--router-event-recovery',
    key: 'eventRecovery',
    env: ['DYN_ROUTER_EVENT_RECOVERY'],
    kind: 'bool',
    dflt: true,
    help:
      "fetch what a worker's KV events missed (a gap in its event ids, or a router that starts after it cached blocks) through its worker query, " +
      'POST {url}/v1/kv/query (--no-… = count gaps and accept them)',
    doc:
      "Fetch what a worker's KV events missed (a gap in its event ids, or a router that starts after it cached blocks) through its worker query, " +
      '`POST {url}/v1/kv/query`. `--no-router-event-recovery` counts gaps and accepts them.',
  }),
  approx.ttlSecs,
  approx.maxTreeSize,
  approx.pruneTargetRatio,
  opt({
    flag: '--router-max-index-blocks',
    key: 'maxIndexBlocks',
    env: ['DYN_ROUTER_MAX_INDEX_BLOCKS'],
    kind: 'int',
    min: 1,
    max: 67_000_000,
    dflt: 60_000_000,
    help: 'blocks one indexer shard holds at most (KV events beyond it are rejected and counted as capacity)',
    doc: '(block, worker-rank) entries one indexer shard holds at most, 1–67,000,000. Stores beyond it are rejected and counted as `capacity`.',
  }),
  sched.predictedTtlSecs,
  opt({
    flag: '--router-session-affinity-ttl-secs',
    key: 'sessionAffinityTtlSecs',
    env: ['DYN_ROUTER_SESSION_AFFINITY_TTL_SECS'],
    kind: 'num',
    min: 0,
    max: 31_536_000,
    dflt: 0,
    help:
      'requests with an X-Dynamo-Session-ID header go to the worker their session last went to while that is younger than this, unless it is gone, ' +
      'suspended or busy (0 = off)',
    doc:
      "Session affinity: a request with an `X-Dynamo-Session-ID` header goes to the worker-rank its session's last request went to, while that " +
      'binding is younger than this many seconds and the worker-rank is registered, not suspended and not busy (0 = off, up to 31536000).',
  }),
  sched.cudaToCpuRatio,
  sched.queueThreshold,
  sched.queuePolicy,
  sched.queueMaxPending,
  sched.trackActiveBlocks,
  sched.trackPrefillTokens,
  sched.assumeKvReuse,
  sched.activeDecodeBlocksThreshold,
  sched.activePrefillTokensThreshold,
  sched.activePrefillTokensThresholdFrac,
  opt({
    flag: '--router-replica-sync',
    key: 'replicaSync',
    env: ['DYN_ROUTER_REPLICA_SYNC'],
    kind: 'bool',
    dflt: false,
    help: "share bookings with the other router replicas over NATS (Dynamo's active_sequences_events); needs --nats-url",
    doc:
      "Share bookings with the other router replicas over NATS, on Dynamo's `active_sequences_events` subject, so each replica's costs count the " +
      'load every replica put on a worker. Needs `--nats-url`; with `--etcd-url` each replica also registers in etcd. See ' +
      '[operations](operations.md#replicas).',
  }),
  opt({
    flag: '--router-replica-catch-up-secs',
    key: 'replicaCatchUpSecs',
    env: ['DYN_ROUTER_REPLICA_CATCH_UP_SECS'],
    kind: 'num',
    min: 0,
    max: 600,
    dflt: 2,
    help: "replica sync: how long a replica that starts or reconnects waits for its peers' bookings before it reports ready",
    doc:
      "Replica sync: how long a replica that starts or reconnects to NATS waits for its peers' live bookings before `/ready` says ready, 0–600. A " +
      'replica with no peer listening is ready at once.',
  }),
  opt({
    flag: '--router-replica-spread',
    key: 'replicaSpread',
    env: ['DYN_ROUTER_REPLICA_SPREAD'],
    kind: 'bool',
    dflt: true,
    help:
      'replica sync: while peers are routing too, a replica takes the worker one router would give its request after those of the replicas ranked ' +
      'before it, so replicas routing at the same moment do not all pick the cheapest worker (--no-…: always the cheapest)',
    doc:
      'Replica sync: while peers are routing too, replica k of R takes the worker one router would give its request after those of the replicas ' +
      'ranked before it whose latest booking is not in view yet, so replicas routing at the same moment do not all pick the cheapest worker; ties ' +
      '(within 1% under the latency cost) broken in one order every replica computes. `--no-router-replica-spread`: always the cheapest, ties at ' +
      'random. See [operations](operations.md#the-race-and-the-spread).',
  }),
  opt({
    flag: '--router-durable-kv-events',
    key: 'durableKvEvents',
    env: ['DYN_ROUTER_DURABLE_KV_EVENTS'],
    kind: 'bool',
    dflt: false,
    help:
      'read KV events from the JetStream stream namespace-{ns}-component-{component}-kv-events through a durable consumer per replica, with index ' +
      'snapshots in the object store; needs --nats-url',
    doc:
      'Durable mode: also read KV events from the JetStream stream `namespace-{ns}-component-{component}-kv-events` (created when missing, an hour ' +
      "of retention) through a durable consumer named by this replica's instance id, acknowledged once applied, with index snapshots in the object " +
      'store. Needs `--nats-url` (with JetStream on the server) and KV events. See [operations](operations.md#durable-mode).',
  }),
  opt({
    flag: '--router-reset-states',
    key: 'resetStates',
    env: ['DYN_ROUTER_RESET_STATES'],
    kind: 'bool',
    dflt: false,
    help: 'durable mode: delete the snapshot and purge the stream at start (skipped while another replica reads the stream)',
    doc:
      'Durable mode: at start, delete the snapshot bucket and purge the stream, so this replica (and every later one) starts empty. Skipped, with a ' +
      'warning, while another replica reads the stream. No effect without `--router-durable-kv-events`.',
    noEffect: { when: { durableKvEvents: false }, says: 'has no effect without --router-durable-kv-events' },
  }),
  opt({
    flag: '--router-snapshot-threshold',
    key: 'snapshotThreshold',
    env: ['DYN_ROUTER_SNAPSHOT_THRESHOLD'],
    kind: 'int',
    min: 1,
    max: Number.MAX_SAFE_INTEGER,
    dflt: 1_000_000,
    help: 'durable mode: a replica snapshots the index and purges what every replica acknowledged when the stream holds more messages than this',
    doc:
      'Durable mode: when the stream holds more messages than this (checked every 1 s ± 100 ms), the replica drops the workers etcd no longer ' +
      'lists, uploads a snapshot of its index and purges the messages every replica acknowledged. At most once per this many new messages. No ' +
      'effect without `--router-durable-kv-events`.',
    noEffect: { when: { durableKvEvents: false }, says: 'has no effect without --router-durable-kv-events' },
  }),
  opt({
    flag: '--router-snapshot-format',
    key: 'snapshotFormat',
    env: ['DYN_ROUTER_SNAPSHOT_FORMAT'],
    kind: 'enum',
    values: SNAPSHOT_FORMATS,
    dflt: 'binary',
    help: 'durable mode: how this replica writes its snapshots (both are read): binary, or json for replicas older than binary snapshots',
    doc:
      'Durable mode: how this replica writes its snapshots of the index. `binary`: written and loaded by the shards themselves, a ninth of ' +
      'the size of JSON and over ten times faster to take and to load; `json`: a JSON array of `RouterEvent`s, as kv-router wrote before, for ' +
      'as long as replicas of such a version may start on the same namespace and component (a rolling upgrade, a rollback): they read only ' +
      "that. Both are read whatever this says. Dynamo's routers read neither (they write and read bincode). No effect without " +
      '`--router-durable-kv-events`. See [operations](operations.md#durable-mode).',
    noEffect: { when: { durableKvEvents: false }, says: 'has no effect without --router-durable-kv-events' },
  }),
  opt({
    flag: '--router-event-threads',
    key: 'eventThreads',
    env: ['DYN_ROUTER_EVENT_THREADS'],
    kind: 'int',
    min: 0,
    max: MAX_SHARDS,
    dflt: 0,
    help: 'indexer shard threads (0 = one per spare core: the CPUs the process may use, capped by its cgroup CPU quota, less one)',
    doc:
      'Indexer shard threads, 0–31. 0 = one per spare core: the CPUs the process may use, capped by its cgroup CPU quota, less one (at least 1). ' +
      'See [operations](operations.md#sizing).',
  }),
  opt({
    flag: '--router-shard-spin-us',
    key: 'shardSpinUs',
    env: ['DYN_ROUTER_SHARD_SPIN_US'],
    kind: 'num',
    nullable: true,
    min: 0,
    max: 1_000_000,
    dflt: null,
    help: 'µs an idle indexer shard spins before it sleeps (default 200 with a core to spare beyond the event loop and the shards, else 0)',
    doc: 'µs an idle shard spins before it sleeps (0–1,000,000). Unset: 200 when a core is spare beyond the event loop and the shards, else 0.',
  }),
  opt({
    flag: '--router-query-spin-us',
    key: 'querySpinUs',
    env: ['DYN_ROUTER_QUERY_SPIN_US'],
    kind: 'num',
    nullable: true,
    min: 0,
    max: 1_000_000,
    dflt: null,
    help: 'µs the event loop spins for an overlap answer before it awaits (default 60 with a core to spare for every shard, else 0)',
    doc:
      'µs the event loop spins for an overlap answer before it waits (0–1,000,000). Unset: 60 when a core is spare for every shard beside the event ' +
      'loop, else 0.',
  }),
  opt({
    flag: '--namespace',
    key: 'namespace',
    env: ['DYN_NAMESPACE'],
    kind: 'str',
    read: readName,
    accepts: NAME_ACCEPTS,
    dflt: 'dynamo',
    help: 'Dynamo namespace',
    doc: 'Dynamo namespace (letters, digits, `_`, `-`): part of NATS subjects and etcd keys.',
  }),
  opt({
    flag: '--component',
    key: 'component',
    env: ['DYN_COMPONENT'],
    kind: 'str',
    read: readName,
    accepts: NAME_ACCEPTS,
    dflt: 'backend',
    help: 'Dynamo component of the workers',
    doc: 'Dynamo component of the workers (same character set).',
  }),
  opt({
    flag: '--endpoint',
    key: 'endpoint',
    env: ['DYN_ROUTER_ENDPOINT'],
    kind: 'str',
    read: readEndpoint,
    accepts: ENDPOINT_ACCEPTS,
    dflt: null,
    help: 'ns.component.endpoint (standalone form)',
    doc: '`namespace.component.endpoint` (a `dyn://` prefix is allowed); overrides `--namespace` and `--component`. Without it the endpoint is `generate`.',
  }),
  opt({
    flag: '--nats-url',
    key: 'natsUrl',
    env: ['NATS_SERVER'],
    kind: 'str',
    read: urlsOf(['nats', 'tls', 'ws', 'wss']),
    accepts: urlsAccepts(['nats', 'tls', 'ws', 'wss']),
    dflt: null,
    help: 'NATS server: KV events from namespace.{ns}.component.{component}.kv-events',
    doc:
      'NATS server(s) to read KV events and worker load from (`nats://`, `tls://`, `ws://`, `wss://`; comma-separated for several servers of one ' +
      'cluster). Unset: no NATS.',
  }),
  opt({
    flag: '--etcd-url',
    key: 'etcdUrl',
    env: ['ETCD_ENDPOINTS'],
    kind: 'str',
    read: urlsOf(['http', 'https']),
    accepts: urlsAccepts(['http', 'https']),
    dflt: null,
    help: 'etcd: workers from v1/instances/{ns}/{component}/{endpoint}/ (docs/dynamo-compatibility.md)',
    doc:
      'etcd server(s) to discover workers from (`http://`, `https://`; comma-separated). Credentials in a URL (`http://user:password@host:2379`) ' +
      "are etcd's user and password. Unset: no etcd.",
  }),
  opt({
    flag: '--event-plane',
    key: 'eventPlane',
    env: ['DYN_EVENT_PLANE'],
    kind: 'enum',
    values: EVENT_PLANES,
    dflt: 'zmq',
    help: "where workers' KV events come from besides NATS: zmq (the event-plane publishers etcd lists, Dynamo's default since 1.3) or nats (NATS only)",
    doc:
      "Dynamo's event plane, as its `--event-plane` / `DYN_EVENT_PLANE`. `zmq`: the router also reads the ZMQ publishers that etcd lists under " +
      '`v1/event_channels/` for its namespace and component (topic `kv-events`, any endpoint), and ZMQ brokers registered under component ' +
      '`zmq_broker`; `nats`: KV events come from `--nats-url` only. No effect without `--etcd-url`. See ' +
      '[Dynamo compatibility](dynamo-compatibility.md#zmq-event-plane).',
    noEffect: { when: { etcdUrl: null }, says: 'has no effect without --etcd-url' },
  }),
  opt({
    flag: '--request-plane-codec',
    key: 'requestPlaneCodec',
    env: ['DYN_REQUEST_PLANE_CODEC'],
    kind: 'enum',
    values: REQUEST_PLANE_CODECS,
    dflt: 'json',
    help: "how requests to workers on Dynamo's TCP request plane are encoded: json (read by every release) or msgpack (named MessagePack)",
    doc:
      "The payload codec of requests sent to workers reached over Dynamo's TCP request plane, as Dynamo's `DYN_REQUEST_PLANE_CODEC`; the " +
      'workers answer in the same codec. `json` (the default here) is read by every Dynamo worker, old ones included, which take a request ' +
      "whose control header names no codec as JSON; `msgpack` is named MessagePack, the newest Dynamo frontends' default. " +
      'Workers reached over HTTP are not affected. See [Dynamo compatibility](dynamo-compatibility.md#tcp-request-plane-and-worker-query).',
  }),
  opt({
    flag: '--indexer-url',
    key: 'indexerUrl',
    env: ['KVR_INDEXER_URL'],
    kind: 'str',
    read: urlsOf(['http', 'https']),
    accepts: 'an http:// or https:// URL (comma-separated for several indexers, tried in order)',
    dflt: null,
    help:
      'shared remote index: route on the answers of a kv-router indexer (or Dynamo standalone indexer) at these URLs, tried in order, instead of ' +
      'consuming KV events; its own index runs in approximate mode and answers when none does in time',
    doc:
      "A shared remote index: `kv-router indexer` or Dynamo's standalone indexer (`python -m dynamo.indexer`), `http://` or `https://`, " +
      'comma-separated for several, tried in order (a failing one is skipped for a second). Each decision asks `POST /query_by_hash` with the ' +
      "prompt's local block hashes. The router then consumes no KV events itself: its local index runs in approximate mode (predictions from its " +
      'own decisions) and is what a decision uses when no indexer answers within `--indexer-timeout-ms`. The workers given with ' +
      '`kv-events=` endpoints are registered with every indexer (`POST /register`). See [deployment](deployment.md#a-shared-remote-index). ' +
      'Unset: the router indexes KV events itself.',
  }),
  opt({
    flag: '--indexer-timeout-ms',
    key: 'indexerTimeoutMs',
    env: ['KVR_INDEXER_TIMEOUT_MS'],
    kind: 'int',
    min: 1,
    max: 10_000,
    // a healthy indexer answers in about a millisecond; a busy one in a few, with a tail of tens:
    // a decision on predictions instead loses cache hits that cost more than the wait
    dflt: 100,
    help: 'deadline of one remote index query, failover included; past it the decision uses the local approximate index',
    doc:
      'Deadline of one `--indexer-url` query in milliseconds (1–10,000), failover to the next URL included. Past it the decision routes on the ' +
      'local approximate index, counted in `kvrouter_indexer_queries_total{result="timeout"}`. Three deadlines missed in a row skip that URL ' +
      'for a second. The default leaves room for a busy indexer: one that misses it routes the decision on predictions, which costs more ' +
      'cache hits than the wait costs time.',
    noEffect: { when: { indexerUrl: null }, says: 'has no effect without --indexer-url' },
  }),
  opt({
    flag: '--use-remote-indexer',
    key: 'useRemoteIndexer',
    env: ['DYN_USE_REMOTE_INDEXER'],
    kind: 'bool',
    dflt: false,
    help: "Dynamo's switch for a remote index: accepted with --indexer-url (which names the indexer), refused without it",
    doc:
      "Dynamo's switch for routing on a remote index. Dynamo finds its remote indexer over its request plane; kv-router's is the standalone " +
      'HTTP indexer named by `--indexer-url`, so this is accepted together with `--indexer-url` and refused without it.',
  }),
  opt({
    flag: '--worker',
    key: 'workers',
    env: ['DYN_ROUTER_WORKERS'],
    kind: 'str',
    read: readWorkers,
    accepts: WORKER_ACCEPTS,
    dflt: [],
    docDefault: 'none',
    help:
      "static worker: URL or ID=URL, then ,kv-events=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=T] to read the engine's own KV events, " +
      ',decisions-only=true for a worker only /v1/route callers reach (repeatable; env: comma-separated)',
    doc:
      "A static worker, `URL` or `ID=URL` (repeatable; the variable takes a comma-separated list). Without `ID=`, the worker's 1-based position is " +
      "its id. Ids are u64 and must be distinct. A vLLM or SGLang engine's own KV events (ZMQ + MessagePack) follow the URL: " +
      '`ID=URL,kv-events=tcp://HOST:5557[,replay=tcp://HOST:5558][,topic=kv-events]`; the router subscribes to the PUB endpoint, catches up and ' +
      'fills gaps through the replay endpoint, and subscribes to every topic when none is given. Endpoints must be `tcp://HOST:PORT`. With ' +
      '`dp_size` above 1 (`POST /v1/workers`, or `data_parallel_size` for a worker from etcd), rank r is read on each port + r, as vLLM offsets its ' +
      'publishers per data-parallel rank. `,decisions-only=true` registers a worker for `/v1/route` decisions only (its callers reach it ' +
      'themselves): it is never probed and never sent a proxied request; see [http-api](http-api.md#post-v1workers).',
  }),
  opt({
    flag: '--tokenizer',
    key: 'tokenizer',
    env: ['DYN_TOKENIZER'],
    kind: 'str',
    dflt: null,
    help: 'tokenizer.json path for text prompts, or "bytes" (UTF-8 bytes as tokens)',
    doc:
      'Path of a Hugging Face `tokenizer.json` for text prompts, or `bytes` (UTF-8 bytes as tokens, for demos and simulated engines). Unset: text ' +
      'prompts are refused in kv mode.',
  }),
  opt({
    flag: '--tokenizer-threads',
    key: 'tokenizerThreads',
    env: ['DYN_TOKENIZER_THREADS'],
    kind: 'int',
    min: 1,
    max: 64,
    dflt: 1,
    help: 'piscina threads for tokenizing',
    doc: 'Tokenizer threads, 1–64.',
  }),
  opt({
    flag: '--api-key',
    key: 'apiKey',
    env: ['DYN_API_KEY'],
    kind: 'str',
    dflt: null,
    help: 'require "Authorization: Bearer KEY" on every route but /health, /ready, /metrics, /status',
    doc:
      "Require `Authorization: Bearer KEY` on every route but `/health`, `/ready`, (unless `--no-public-metrics`) `/metrics`, and the status page's " +
      'HTML (`/status`, `/`: it holds no data and asks for the key): reads too, as they show worker URLs.',
  }),
  opt({
    flag: '--public-metrics',
    key: 'publicMetrics',
    env: ['DYN_PUBLIC_METRICS'],
    kind: 'bool',
    dflt: true,
    help: 'with --api-key, /metrics answers without the key (--no-public-metrics: it needs the key too)',
    doc: 'With `--api-key`, `/metrics` answers without the key; `--no-public-metrics` requires it there too.',
  }),
  opt({
    flag: '--model-name',
    key: 'modelName',
    env: ['DYN_MODEL_NAME'],
    kind: 'str',
    dflt: 'kv-router-model',
    help: 'model name served by GET /v1/models',
    doc: 'The model `GET /v1/models` lists and the embedded engines serve; the `model` metrics label of a request that names none.',
  }),
  opt({
    flag: '--embedded-fleet',
    key: 'embeddedFleet',
    env: ['DYN_EMBEDDED_FLEET'],
    kind: 'int',
    min: 0,
    max: 64,
    dflt: 0,
    help: 'simulated engines to run in this process (demo)',
    doc: 'Simulated engines to run inside the router process (0–64), for demos. They take the ids after the largest `--worker` id.',
  }),
  opt({
    flag: '--proxy-retries',
    key: 'proxyRetries',
    env: ['DYN_PROXY_RETRIES'],
    kind: 'int',
    min: 0,
    max: 16,
    dflt: 2,
    help: 'retries on another worker when one fails before its first token',
    doc: 'Retries on another worker when one fails before its first token (0–16).',
  }),
  opt({
    flag: '--router-health-probe-interval-secs',
    key: 'healthProbeIntervalSecs',
    env: ['DYN_ROUTER_HEALTH_PROBE_INTERVAL_SECS'],
    kind: 'num',
    min: 0,
    max: 3600,
    dflt: 2,
    help:
      'seconds between health probes of each worker, GET {url}/health (/v1/models where /health is 404); a worker failing ' +
      '--router-health-probe-failures in a row is unreachable and out of routing until one answers (0 = no probes)',
    doc:
      'Seconds between health probes of each registered worker, `GET {url}/health` (`/v1/models` for a worker whose `/health` answers 404), ' +
      '0–3,600; 0 = no probes. A worker that fails `--router-health-probe-failures` probes in a row is `unreachable` and out of routing until a ' +
      'probe is answered (see [operations](operations.md#worker-health)).',
  }),
  opt({
    flag: '--router-health-probe-timeout-secs',
    key: 'healthProbeTimeoutSecs',
    env: ['DYN_ROUTER_HEALTH_PROBE_TIMEOUT_SECS'],
    kind: 'num',
    min: 0.001,
    max: 600,
    dflt: 1,
    help: 'seconds a health probe waits for its answer before it counts as failed',
    doc: 'Seconds a health probe waits for its answer before it counts as failed (0.001–600).',
  }),
  opt({
    flag: '--router-health-probe-failures',
    key: 'healthProbeFailures',
    env: ['DYN_ROUTER_HEALTH_PROBE_FAILURES'],
    kind: 'int',
    min: 1,
    max: 100,
    dflt: 2,
    help: 'failed health probes in a row that make a worker unreachable',
    doc: 'Failed health probes in a row that make a worker `unreachable` (1–100). After a failure the next probe comes half an interval later.',
  }),
  opt({
    flag: '--http-body-limit',
    key: 'bodyLimit',
    env: ['DYN_HTTP_BODY_LIMIT'],
    kind: 'int',
    min: 1024,
    max: 1 << 30,
    dflt: 16 * 1024 * 1024,
    help: 'largest request body in bytes (413 above)',
    doc: 'Largest request body in bytes (1,024–2^30); larger bodies get 413.',
  }),
  opt({
    flag: '--shutdown-timeout-secs',
    key: 'shutdownTimeoutSecs',
    env: ['DYN_SHUTDOWN_TIMEOUT_SECS'],
    kind: 'num',
    min: 0,
    max: 3600,
    dflt: 30,
    help: 'how long SIGTERM waits for in-flight requests',
    doc: 'How long SIGTERM/SIGINT waits for requests in flight before cutting them (0–3,600).',
  }),
  opt({
    flag: '--nice',
    key: 'nice',
    env: ['DYN_ROUTER_NICE'],
    kind: 'int',
    min: -20,
    max: 19,
    dflt: null,
    help:
      "scheduling niceness of the router's threads; negative runs it ahead of engines or load generators on shared cores (below the current one " +
      'needs root, CAP_SYS_NICE or RLIMIT_NICE)',
    doc:
      'Niceness of every router thread, −20–19. Negative runs the router ahead of engines or load generators on shared cores; below the current ' +
      'niceness it needs root, `CAP_SYS_NICE` or `RLIMIT_NICE`. Unset: inherited.',
  }),
  sched.seed,
  opt({
    flag: '--log-level',
    key: 'logLevel',
    env: ['DYN_LOG'],
    kind: 'str',
    read: (t: string) => parseLogLevel(t) ?? undefined,
    accepts: LOG_LEVEL_ACCEPTS,
    dflt: 'info',
    help: 'least severe log lines written (DYN_LOG: its bare level; target=level directives are skipped)',
    doc:
      "Least severe [log](operations.md#logs) lines written: `error`, `warn`, `info`, `debug`, `trace`, `off` (case-insensitive; pino's `fatal` and " +
      "`silent` too). `DYN_LOG` may hold Dynamo's filter form, comma-separated directives such as `info,dynamo_runtime=debug`: its one bare level " +
      "is taken, and `target=level` directives (modules of Dynamo's Rust processes) are skipped; with none bare the level is `info`. Two bare " +
      'levels, or a word that is no level, are refused.',
  }),
  opt({
    flag: '--log-format',
    key: 'logFormat',
    env: ['DYN_ROUTER_LOG_FORMAT'],
    kind: 'enum',
    values: LOG_FORMATS,
    dflt: 'auto',
    help: 'log lines on stderr: json (one object per line), pretty (for people), auto (pretty on a terminal, else json)',
    doc: 'Log lines on stderr: `json` (one JSON object per line), `pretty` (one short line for people), `auto` (pretty when stderr is a terminal, else json).',
  }),
] as const

export type ServeConfig = ConfigOf<typeof SERVE_ROWS>

/** Every option of `kv-router serve`, in the order of --help and docs/configuration.md. */
export const FLAGS: readonly (OptionDef & { readonly env: readonly string[] })[] = SERVE_ROWS

export const SERVE_TABLE: CommandTable = {
  command: 'serve',
  options: FLAGS,
  unknown: (arg) =>
    arg.startsWith('--') ? `unknown option ${arg} (see kv-router serve --help)` : `unexpected argument ${JSON.stringify(arg)} (see kv-router serve --help)`,
}

/**
 * Options from argv (after the subcommand) and the environment, and which were given. Throws
 * ConfigError with the one line to print; returns 'help' for --help.
 */
export function parseServe(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): Parsed<ServeConfig> | 'help' {
  const parsed = parseOptions<Record<string, unknown>>(SERVE_TABLE, argv, env)
  if (parsed === 'help') return 'help'
  const out = { ...parsed.config }
  const workers = out.workers as readonly StaticWorkerSpec[]
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
  if (out.useRemoteIndexer === true && out.indexerUrl === null)
    throw new ConfigError('--use-remote-indexer needs --indexer-url: the URL(s) of the kv-router indexer or Dynamo standalone indexer to query')
  if (out.indexerUrl !== null) {
    // the remote index stands in for the router's own event intake
    if (parsed.given.has('kvEvents') && out.kvEvents === true)
      throw new ConfigError('--indexer-url routes on a remote index: the router consumes no KV events itself, so --router-kv-events cannot be given with it')
    if (out.durableKvEvents === true)
      throw new ConfigError('--router-durable-kv-events cannot be combined with --indexer-url: the router consumes no KV events')
    if (out.mode !== 'kv') throw new ConfigError(`--indexer-url needs --router-mode kv: mode ${String(out.mode)} asks no index`)
    if ((out.predictedTtlSecs as number) > 0)
      throw new ConfigError('--router-predicted-ttl-secs cannot be combined with --indexer-url: the local index already holds only predictions')
    out.kvEvents = false
  }
  return { config: Object.freeze(out) as unknown as ServeConfig, given: parsed.given }
}

/** parseServe's configuration alone. */
export function parseServeConfig(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): ServeConfig | 'help' {
  const p = parseServe(argv, env)
  return p === 'help' ? 'help' : p.config
}

/** The warnings for options given where they do nothing. */
export function serveWithoutEffect(p: Parsed<ServeConfig>): string[] {
  return withoutEffect(SERVE_TABLE, p.config as unknown as Record<string, unknown>, p.given)
}

export function serveHelp(): string {
  return `usage: kv-router serve [options]

Runs the KV-cache-aware router. Every option also reads its environment variable; the command line wins.

${optionsHelp(SERVE_TABLE)}`
}
