// `kv-router mocker`: N simulated vLLM-like engines in one process (docs/architecture.md).
//
// The contract other tools rely on (replay, bench:e2e, docker-compose): the flags below, and
// exactly one line on stdout once every engine is up and registered:
//
//   kv-router mocker: ready <N> engine(s) <url1> <url2> ...
//
// Invalid options exit 2 with one line naming the option; SIGTERM/SIGINT revoke the leases (or
// unregister from the router), close the servers and exit 0.
import { isKvrError } from '../../errors.js'
import { isHttpUrl } from '../../core/endpoints.js'
import { ConfigError, opt, optionsHelp, parseOptions } from '../../config/table.js'
import type { CommandTable, ConfigOf } from '../../config/table.js'
import { FatalError, commandArgs } from '../../runtime/fatal.js'
import { BLOCK_SIZE_OPTION, ENGINE_DEFAULTS } from './engine.js'
import { FleetListenError, MockerFleet } from './fleet.js'
import type { FleetOptions } from './fleet.js'
import { urlHost } from './server.js'
import { parseTcpEndpoint } from './zmq-publisher.js'
import { PROFILE_NAMES, parseProfileList, timingsFor } from './profiles.js'
import type { ProfileGroup } from './profiles.js'

/** A value without spaces, as subjects, keys and names need. */
function word(t: string): string | undefined {
  return t === '' || /\s/.test(t) ? undefined : t
}
const WORD = 'a non-empty value without spaces'

/**
 * Whether `host` makes a sound engine URL, built the way the engines build theirs: "a/b" or
 * "u@h" would otherwise be registered with a router as a URL that points elsewhere or nowhere.
 */
function isUrlHost(host: string): boolean {
  try {
    const u = new URL(`http://${urlHost(host)}:1/`)
    return u.port === '1' && u.pathname === '/' && u.username === '' && u.password === ''
  } catch {
    return false
  }
}

const httpUrl = (t: string): string | undefined => (isHttpUrl(t) ? t.replace(/\/+$/, '') : undefined)
const HTTP_URL = 'an http(s) URL (http://host:port)'
const zmq = (t: string): string | undefined => (parseTcpEndpoint(t) === null ? undefined : t)
const ZMQ = 'tcp://HOST:PORT with a port in [1, 65535]'
/** FROM:COUNT, the first sequence number not sent and how many: a fault for tests of recovery. */
function dropRange(t: string): { from: bigint; count: number } | undefined {
  const m = /^(\d{1,19}):(\d{1,7})$/.exec(t)
  if (m === null) return undefined
  const from = BigInt(m[1] as string)
  const count = Number(m[2])
  return from < 1n << 63n && count >= 1 ? { from, count } : undefined
}
/** A profile list; its own errors say what is wrong with it. */
function profileList(t: string): ProfileGroup[] {
  try {
    return parseProfileList(t)
  } catch (err) {
    if (isKvrError(err)) throw new ConfigError(err.message.replace(/^--engine-profile: /, ''))
    throw err
  }
}
const speed = (open: boolean): string => `a number ${open ? '>' : '≥'} 0 (at most 1000000000)`

const MOCKER_ROWS = [
  opt({
    flag: '--num-workers',
    key: 'numWorkers',
    kind: 'int',
    min: 1,
    max: 1024,
    dflt: 1,
    group: "engines (names as in Dynamo's mocker)",
    help: 'engines in this process',
    doc: 'Engines in this process (1–1024).',
  }),
  opt({
    ...BLOCK_SIZE_OPTION,
    dflt: ENGINE_DEFAULTS.blockSize,
    help: "tokens per KV block; must match the router's --router-block-size",
    doc: "Tokens per KV block (1–65536); must match the router's `--router-block-size`.",
  }),
  opt({
    flag: '--num-gpu-blocks-override',
    key: 'numGpuBlocks',
    kind: 'int',
    min: 1,
    max: 1 << 26,
    dflt: ENGINE_DEFAULTS.numGpuBlocks,
    help: 'KV blocks per engine',
    doc: 'KV blocks per engine (1–2^26).',
  }),
  opt({
    flag: '--num-cpu-blocks',
    key: 'numCpuBlocks',
    kind: 'int',
    min: 0,
    max: 1 << 26,
    dflt: ENGINE_DEFAULTS.numCpuBlocks,
    help: 'blocks of a host (CPU) offload tier per engine, kept in LRU order from what the device evicts; 0 = none',
    doc:
      'Blocks of a host (CPU) offload tier per engine (0–2^26; 0 = none): a block the device evicts is kept there (LRU) and published as ' +
      'stored in the host tier (vLLM `medium: "CPU"`, Dynamo `storage_tier: "host_pinned"`); a prompt whose cached prefix continues there ' +
      'loads those blocks back instead of computing them ([architecture](architecture.md#host-offload-tier)).',
  }),
  opt({
    flag: '--max-num-seqs',
    key: 'maxNumSeqs',
    kind: 'int',
    min: 1,
    max: 1 << 20,
    dflt: ENGINE_DEFAULTS.maxNumSeqs,
    help: 'running requests per engine at most',
    doc: 'Running requests per engine at most.',
  }),
  opt({
    flag: '--max-num-batched-tokens',
    key: 'maxNumBatchedTokens',
    kind: 'int',
    min: 1,
    max: 1 << 30,
    dflt: ENGINE_DEFAULTS.maxNumBatchedTokens,
    help: 'token budget of one engine step',
    doc: 'Token budget of one engine step.',
  }),
  opt({
    flag: '--enable-chunked-prefill',
    key: 'enableChunkedPrefill',
    kind: 'bool',
    dflt: ENGINE_DEFAULTS.enableChunkedPrefill,
    help: 'split long prefills over steps',
    doc: '`true` or `false`: split long prefills over steps.',
  }),
  opt({
    flag: '--preemption-mode',
    key: 'preemptionMode',
    kind: 'enum',
    values: ['lifo', 'fifo'],
    dflt: ENGINE_DEFAULTS.preemptionMode,
    help: 'which running request gives way under memory pressure',
    doc: '`lifo` or `fifo`: which running request gives way under memory pressure.',
  }),
  opt({
    flag: '--speedup-ratio',
    key: 'speedupRatio',
    kind: 'num',
    min: 0,
    max: 1e9,
    dflt: ENGINE_DEFAULTS.speedupRatio,
    accepts: speed(false),
    help: 'divides every simulated duration; 0 = no sleeping at all',
    doc: 'Divides every simulated duration; 0 = no sleeping at all.',
  }),
  opt({
    flag: '--decode-speedup-ratio',
    key: 'decodeSpeedupRatio',
    kind: 'num',
    min: 0,
    openMin: true,
    max: 1e9,
    dflt: ENGINE_DEFAULTS.decodeSpeedupRatio,
    accepts: speed(true),
    help: 'further divides decode durations',
    doc: 'Further divides decode durations (> 0).',
  }),
  opt({
    flag: '--engine-profile',
    key: 'engineProfiles',
    kind: 'str',
    read: profileList,
    accepts: 'NAME[@SPEED][:COUNT],…',
    metavar: 'LIST',
    dflt: null,
    docDefault: '`default`',
    help: `the engines' timing: ${PROFILE_NAMES.join(', ')}, each at @SPEED (0.5 = half speed), dealt out in turn or :COUNT engines each`,
    doc:
      "The engines' step timing ([architecture](architecture.md#engine-profiles)): profiles " +
      PROFILE_NAMES.map((n) => `\`${n}\``).join(', ') +
      ', each optionally `@SPEED` (durations ÷ SPEED; `0.5` is half speed) and `:COUNT` engines. Without counts the list is dealt out ' +
      'over the engines in turn; with counts on every entry they must add up to `--num-workers`. E.g. `large:2,large@0.5:2`.',
  }),
  opt({
    flag: '--model-name',
    key: 'modelName',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'NAME',
    dflt: 'kv-router-model',
    help: "model served by the engines' GET /v1/models",
    doc: "Model served by the engines' `GET /v1/models`.",
  }),
  opt({
    flag: '--host',
    key: 'host',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'HOST',
    dflt: '127.0.0.1',
    group: 'network',
    help: 'listen address',
    doc: 'Listen address.',
  }),
  opt({
    flag: '--http-port',
    key: 'port',
    kind: 'int',
    min: 0,
    max: 65535,
    dflt: 0,
    help: "first engine's port; engine i listens on port + i (0 = free ports)",
    doc: "First engine's port; engine i listens on port + i. 0 = free ports.",
  }),
  opt({
    flag: '--advertise-host',
    key: 'advertiseHost',
    kind: 'str',
    read: (t: string) => (isUrlHost(t) ? t : undefined),
    accepts: 'a host name or IP address',
    metavar: 'HOST',
    dflt: null,
    docDefault: '`--host`',
    help: "host written into the engines' URLs, what the router connects to (default: --host)",
    doc: "Host written into the engines' URLs (what the router connects to).",
  }),
  opt({
    flag: '--router-url',
    key: 'routerUrl',
    kind: 'str',
    read: httpUrl,
    accepts: HTTP_URL,
    metavar: 'URL',
    dflt: null,
    group: "registration and KV events (pick one; with none, events stay in each engine's ring)",
    help: 'register with a kv-router (POST /v1/workers) and post KV events to its /v1/kv-events',
    doc: 'Register with a kv-router (`POST /v1/workers`) and post KV events to its `/v1/kv-events`. Not combinable with `--nats-url`/`--etcd-url`.',
  }),
  opt({
    flag: '--api-key',
    key: 'apiKey',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'KEY',
    dflt: null,
    help: "that router's --api-key (only with --router-url)",
    doc: "That router's `--api-key` (only with `--router-url`).",
  }),
  opt({
    flag: '--first-worker-id',
    key: 'firstWorkerId',
    kind: 'int',
    min: 0,
    max: Number.MAX_SAFE_INTEGER,
    dflt: 1000,
    help: 'worker id of the first engine when ids do not come from etcd leases (then N, N+1, …)',
    doc: 'Worker id of the first engine when ids do not come from etcd leases (then N, N+1, …).',
  }),
  opt({
    flag: '--nats-url',
    key: 'natsUrl',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'URL',
    dflt: null,
    help: 'publish KV events on namespace.{ns}.component.{component}.kv-events and load on namespace.{ns}.kv_metrics',
    doc: 'Publish KV events on `namespace.{ns}.component.{component}.kv-events` and load on `namespace.{ns}.kv_metrics`.',
  }),
  opt({
    flag: '--durable-kv-events',
    key: 'durableKvEvents',
    kind: 'bool',
    dflt: false,
    help:
      'with --nats-url: KV events into the JetStream stream namespace-{ns}-component-{component}-kv-events instead, each stored once and in order ' +
      '(for kv-router serve --router-durable-kv-events)',
    doc:
      'With `--nats-url`: publish KV events into the JetStream stream `namespace-{ns}-component-{component}-kv-events` (subject `….queue`, created ' +
      'when missing) instead of the core subject, as a Dynamo worker started with `--durable-kv-events` does: each event stored before the next is ' +
      'sent, retried until it is, under a message id the server de-duplicates, so none is lost or repeated across a server restart. For a router ' +
      'with `--router-durable-kv-events`.',
  }),
  opt({
    flag: '--etcd-url',
    key: 'etcdUrl',
    kind: 'str',
    read: httpUrl,
    accepts: HTTP_URL,
    metavar: 'URL',
    dflt: null,
    help: 'register each engine in etcd under its own lease (lease id = worker id)',
    doc: 'Register each engine in etcd under its own lease (lease id = worker id).',
  }),
  opt({ flag: '--lease-ttl-secs', key: 'leaseTtlSecs', kind: 'int', min: 2, max: 3600, dflt: 10, help: 'etcd lease TTL', doc: 'etcd lease TTL (2–3600).' }),
  opt({
    flag: '--namespace',
    key: 'namespace',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'NS',
    dflt: 'dynamo',
    help: 'namespace for subjects and keys',
    doc: 'Namespace for subjects and keys.',
  }),
  opt({
    flag: '--component',
    key: 'component',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'NAME',
    dflt: 'backend',
    help: 'component for subjects and keys',
    doc: 'Component for subjects and keys.',
  }),
  opt({
    flag: '--endpoint',
    key: 'endpoint',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'NAME',
    dflt: 'generate',
    help: 'endpoint name, or ns.component.endpoint (which then sets all three)',
    doc: 'Endpoint name, or `ns.component.endpoint` (which then sets all three).',
  }),
  opt({
    flag: '--dynamo',
    key: 'dynamoMode',
    kind: 'bool',
    flagOnly: true,
    dflt: false,
    group: 'as current Dynamo workers (python -m dynamo.vllm v1.3+ defaults; needs --etcd-url)',
    help:
      'each engine a Dynamo worker: records under its etcd lease, KV events and load on the ZMQ event plane, generate and the worker query ' +
      'on the TCP request plane',
    doc:
      'Each engine behaves as an unchanged current Dynamo worker ([architecture](architecture.md#the-mockers-dynamo-mode)): under its etcd ' +
      'lease (lease id = instance id = worker id) it registers `v1/instances/…` records for `generate` and `worker_kv_indexer_query_dp0` ' +
      '(TCP transport), its model card under `v1/mdc/…`, and event-channel records; it publishes KV events (`kv-events`) and load ' +
      '(`kv_metrics`) as 4-frame messages on ZMQ PUB sockets bound on free ports of `--host`, and serves requests on one TCP request-plane ' +
      'listener per process (acknowledged, answered on a stream dialled back to the frontend, cancelled by `stop`/`kill`). Needs ' +
      '`--etcd-url`; not combinable with `--nats-url` or `--router-url`.',
  }),
  opt({
    flag: '--dynamo-event-channels',
    key: 'dynamoEventChannels',
    kind: 'enum',
    values: ['endpoint', 'component'],
    dflt: 'endpoint',
    help: 'with --dynamo: event-channel records endpoint-scoped (current Dynamo) or component-scoped (its earlier form)',
    doc:
      'With `--dynamo`: the event-channel records, `endpoint` (current Dynamo: `v1/event_channels/namespace/{ns}/component/{c}/endpoint/{e}/' +
      'topic/{topic}/{publisher_id:x}` with a `scope`) or `component` (its earlier form: `v1/event_channels/{ns}/{c}/{topic}/{instance_id:x}`).',
  }),
  opt({
    flag: '--dynamo-max-inflight',
    key: 'dynamoMaxInflight',
    kind: 'int',
    min: 1,
    max: 1 << 20,
    dflt: 1024,
    help: 'with --dynamo: requests in flight per engine; more are refused with "Server overloaded: …"',
    doc: 'With `--dynamo`: requests in flight per engine (1–2^20); a request beyond them is refused with `Server overloaded: …` (a 503 at the frontend).',
  }),
  opt({
    flag: '--dynamo-drop-kv-events',
    key: 'dynamoDropKvEvents',
    kind: 'str',
    read: dropRange,
    accepts: 'FROM:COUNT, FROM a sequence number (from 0) and COUNT in [1, 9999999]',
    metavar: 'FROM:COUNT',
    dflt: null,
    help: 'with --dynamo, a fault for tests: each engine does not send its kv-events messages FROM to FROM+COUNT-1 (their sequence numbers are spent)',
    doc:
      "With `--dynamo`, a fault for tests of a router's recovery: each engine's `kv-events` publisher does not send its messages with " +
      'sequence numbers `FROM` to `FROM+COUNT-1` (numbered from 0), as a subscriber past its high-water mark loses them; the numbers are ' +
      'spent, so the next message shows the gap. Counted in `/stats` (`dynamo.kv_events.dropped`).',
  }),
  opt({
    flag: '--kv-events-zmq',
    key: 'kvEventsZmq',
    kind: 'str',
    read: zmq,
    accepts: ZMQ,
    metavar: 'ENDPOINT',
    dflt: null,
    group: 'KV events over ZMQ, as vLLM publishes them (in addition to any of the above)',
    help:
      'bind a PUB socket per engine at tcp://HOST:PORT (HOST * = every interface), engine i on PORT + i as vLLM offsets per data-parallel rank; ' +
      'kv-router serve reads it for a worker registered with kv-events=tcp://HOST:PORT',
    doc:
      'Also publish KV events exactly as vLLM does: a ZMQ PUB socket per engine bound at `tcp://HOST:PORT` (`*` = every interface), engine i on ' +
      'PORT + i (as vLLM offsets per data-parallel rank); frames `[topic, seq, MessagePack batch]`, seq from 0. Combinable with the other ' +
      'transports. A router reads it for the workers registered with these endpoints ([vLLM and SGLang](vllm-sglang.md#registering-the-engines)).',
  }),
  opt({
    flag: '--kv-events-replay-zmq',
    key: 'kvEventsReplayZmq',
    kind: 'str',
    read: zmq,
    accepts: ZMQ,
    metavar: 'ENDPOINT',
    dflt: null,
    help:
      "with --kv-events-zmq: a replay ROUTER socket per engine (PORT + i) answering from the engine's last 10000 batches, ending with seq −1; its " +
      'ports must not overlap the PUB ports',
    doc:
      "With `--kv-events-zmq`: a replay ROUTER socket per engine (PORT + i) answering from the engine's last 10000 batches, ending with seq −1. Its " +
      'ports must not overlap the PUB ports.',
  }),
  opt({
    flag: '--kv-events-form',
    key: 'kvEventsForm',
    kind: 'enum',
    values: ['map', 'array'],
    dflt: 'map',
    help: 'with --kv-events-zmq: vLLM\'s event encoding, map (vLLM since PR #42892, {type: "BlockStored", …}) or array (older vLLM, ["BlockStored", …])',
    doc: 'With `--kv-events-zmq`: `map` (vLLM since PR #42892, `{type: "BlockStored", …}`) or `array` (older vLLM, `["BlockStored", …]`).',
  }),
  opt({
    flag: '--kv-events-topic',
    key: 'kvEventsTopic',
    kind: 'str',
    read: word,
    accepts: WORD,
    metavar: 'T',
    dflt: 'kv-events',
    help: 'with --kv-events-zmq: the topic frame of every batch',
    doc: 'With `--kv-events-zmq`: the topic frame of every batch.',
  }),
] as const

type MockerConfig = ConfigOf<typeof MOCKER_ROWS>

/** `kv-router mocker`'s options: the parser, --help and docs/configuration.md come from it. */
export const MOCKER_TABLE: CommandTable = {
  command: 'mocker',
  options: MOCKER_ROWS,
  unknown: (arg) =>
    arg.startsWith('--')
      ? `unknown option ${arg} (kv-router mocker --help lists the options)`
      : `unexpected argument ${JSON.stringify(arg)} (kv-router mocker --help lists the options)`,
}

export const mockerHelp = `usage: kv-router mocker [options]

Simulated vLLM-like engines: OpenAI-compatible HTTP servers with a paged KV cache, prefix
caching, a token-budget scheduler (chunked prefill, preemption) and the timing model of
Dynamo's mocker; they publish real KV events and answer the worker KV query.
${optionsHelp(MOCKER_TABLE)}
Each engine serves POST /v1/completions, POST /v1/chat/completions, POST /v1/kv/query (the
worker KV query: {worker_id, start_event_id, end_event_id}), GET /health, GET /v1/models and
GET /stats. Once all are up, one line is printed on stdout:
  kv-router mocker: ready <N> engine(s) <url> ...
`

export interface MockerCli {
  fleet: FleetOptions
  numWorkers: number
}

const NAME_RE = /^[A-Za-z0-9_-]+$/

/** A bad command line: the message is the one line to print. */
export class MockerArgError extends Error {}

/** Parses the mocker's arguments; 'help' for --help. Throws MockerArgError. */
export function parseMockerArgs(argv: readonly string[]): MockerCli | 'help' {
  let parsed: ReturnType<typeof parseOptions<MockerConfig>>
  try {
    parsed = parseOptions<MockerConfig>(MOCKER_TABLE, argv)
  } catch (err) {
    if (err instanceof ConfigError) throw new MockerArgError(err.message)
    throw err
  }
  if (parsed === 'help') return 'help'
  const { config: c, given } = parsed
  // the options given, as the fleet reads them (the others take the fleet's own defaults)
  const f: FleetOptions = {}
  for (const key of given.keys()) if (key !== 'firstWorkerId') (f as Record<string, unknown>)[key] = c[key as keyof MockerConfig]
  const numWorkers = c.numWorkers
  f.numWorkers = numWorkers
  f.firstWorkerId = BigInt(c.firstWorkerId)
  if (c.port > 0 && c.port + numWorkers - 1 > 65535) throw new MockerArgError(`--http-port ${c.port} leaves no room for ${numWorkers} engines below port 65536`)

  let ns: string = c.namespace
  let component: string = c.component
  let endpoint: string = c.endpoint
  if (endpoint.includes('.')) {
    const parts = endpoint.replace(/^dyn:\/\//, '').split('.')
    if (parts.length !== 3) throw new MockerArgError(`--endpoint must be a name or ns.component.endpoint, got ${JSON.stringify(endpoint)}`)
    ;[ns, component, endpoint] = parts as [string, string, string]
  }
  for (const [flag, x] of [
    ['--namespace', ns],
    ['--component', component],
    ['--endpoint', endpoint],
  ] as const) {
    if (!NAME_RE.test(x)) throw new MockerArgError(`${flag} must match ${NAME_RE.source}, got ${JSON.stringify(x)}`)
  }
  f.namespace = ns
  f.component = component
  f.endpoint = endpoint
  if (f.routerUrl !== undefined && (f.natsUrl !== undefined || f.etcdUrl !== undefined)) {
    throw new MockerArgError('--router-url cannot be combined with --nats-url or --etcd-url (events and registration would go two ways)')
  }
  if (f.apiKey !== undefined && f.routerUrl === undefined) throw new MockerArgError('--api-key is only used with --router-url')
  if (f.durableKvEvents === true && f.natsUrl === undefined) throw new MockerArgError('--durable-kv-events needs --nats-url: the stream is on the NATS server')
  checkZmq(f, numWorkers)
  checkDynamo(f)
  if (c.engineProfiles !== null) {
    try {
      timingsFor(c.engineProfiles, numWorkers)
    } catch (err) {
      if (isKvrError(err)) throw new MockerArgError(err.message)
      throw err
    }
  }
  return { fleet: f, numWorkers }
}

/** --dynamo and its companions: etcd needed, no second way for events, sub-options only with it. */
function checkDynamo(f: FleetOptions): void {
  const g = f as FleetOptions & {
    dynamoMode?: boolean
    dynamoEventChannels?: 'endpoint' | 'component'
    dynamoMaxInflight?: number
    dynamoDropKvEvents?: { from: bigint; count: number }
  }
  const { dynamoMode, dynamoEventChannels, dynamoMaxInflight, dynamoDropKvEvents } = g
  delete g.dynamoMode
  delete g.dynamoEventChannels
  delete g.dynamoMaxInflight
  delete g.dynamoDropKvEvents
  if (dynamoMode !== true) {
    if (dynamoEventChannels !== undefined) throw new MockerArgError('--dynamo-event-channels is only used with --dynamo')
    if (dynamoMaxInflight !== undefined) throw new MockerArgError('--dynamo-max-inflight is only used with --dynamo')
    if (dynamoDropKvEvents !== undefined) throw new MockerArgError('--dynamo-drop-kv-events is only used with --dynamo')
    return
  }
  if (f.etcdUrl === undefined) throw new MockerArgError('--dynamo needs --etcd-url: a Dynamo worker registers under its etcd lease')
  if (f.natsUrl !== undefined) throw new MockerArgError('--dynamo cannot be combined with --nats-url: its KV events and load go on the ZMQ event plane')
  f.dynamo = {}
  if (dynamoEventChannels !== undefined) f.dynamo.eventChannels = dynamoEventChannels
  if (dynamoMaxInflight !== undefined) f.dynamo.maxInflight = dynamoMaxInflight
  if (dynamoDropKvEvents !== undefined) f.dynamo.dropKvEvents = dynamoDropKvEvents
}

/** The ZMQ flags: companions of --kv-events-zmq, room for every engine's port, no port bound twice. */
function checkZmq(f: FleetOptions, numWorkers: number): void {
  if (f.kvEventsZmq === undefined) {
    for (const [flag, x] of [
      ['--kv-events-replay-zmq', f.kvEventsReplayZmq],
      ['--kv-events-form', f.kvEventsForm],
      ['--kv-events-topic', f.kvEventsTopic],
    ] as const) {
      if (x !== undefined) throw new MockerArgError(`${flag} is only used with --kv-events-zmq`)
    }
    return
  }
  const ranges: [string, { host: string; port: number }][] = []
  for (const [flag, x] of [
    ['--kv-events-zmq', f.kvEventsZmq],
    ['--kv-events-replay-zmq', f.kvEventsReplayZmq],
  ] as const) {
    if (x === undefined) continue
    const e = parseTcpEndpoint(x) as { host: string; port: number }
    if (e.port + numWorkers - 1 > 65535) throw new MockerArgError(`${flag} port ${e.port} leaves no room for ${numWorkers} engines below port 65536`)
    ranges.push([flag, e])
  }
  const [a, b] = ranges
  if (a !== undefined && b !== undefined && a[1].host === b[1].host && a[1].port < b[1].port + numWorkers && b[1].port < a[1].port + numWorkers) {
    throw new MockerArgError(`--kv-events-zmq and --kv-events-replay-zmq overlap: engine i binds port + i of each, for ${numWorkers} engine(s)`)
  }
}

/**
 * Runs the engines until SIGTERM or SIGINT (status 0) or a lost etcd lease (status 1); resolves
 * with the exit status once they are closed. Throws FatalError for an invalid option or engines
 * that cannot start.
 */
export async function mockerMain(argv: string[]): Promise<number> {
  const cli = commandArgs(
    'mocker',
    () => parseMockerArgs(argv),
    (err) => err instanceof MockerArgError,
    () => mockerHelp,
  )
  if (cli === null) return 0
  const o = cli.fleet
  let stopping = false
  let fleet: MockerFleet | null = null
  let stopped: (code: number) => void = () => undefined
  const done = new Promise<number>((resolve) => (stopped = resolve))
  const stop = (code: number): void => {
    if (stopping) return
    stopping = true
    void (fleet?.close() ?? Promise.resolve()).finally(() => stopped(code))
  }
  o.onWarning = (m) => process.stderr.write(`kv-router mocker: ${m}\n`)
  o.onLeaseLost = (id, err) => {
    // like a Dynamo worker whose primary lease is gone: stop rather than serve unregistered
    process.stderr.write(`kv-router mocker: engine ${id} lost its etcd lease (${err.message}); stopping\n`)
    stop(1)
  }
  try {
    fleet = await MockerFleet.start(o)
  } catch (err) {
    if (err instanceof FleetListenError) throw new FatalError(`mocker: ${err.option === 'host' ? '--host' : '--http-port'}: ${err.message}`)
    if (isKvrError(err)) throw new FatalError(`mocker: ${err.message}`)
    throw err
  }
  const ws = fleet.workers
  const transport =
    o.dynamo !== undefined
      ? `Dynamo (etcd ${o.etcdUrl}, ZMQ event plane, TCP request plane ${fleet.requestPlaneAddress})`
      : o.routerUrl !== undefined
        ? `router ${o.routerUrl}`
        : [
            o.natsUrl !== undefined ? `${o.durableKvEvents === true ? 'JetStream' : 'NATS'} ${o.natsUrl}` : '',
            o.etcdUrl !== undefined ? `etcd ${o.etcdUrl}` : '',
          ]
            .filter((x) => x !== '')
            .join(' + ') || 'none (events stay in the local rings)'
  const zmq =
    o.kvEventsZmq === undefined
      ? ''
      : `; vLLM KV events on ZMQ ${o.kvEventsZmq}${o.kvEventsReplayZmq === undefined ? '' : `, replay ${o.kvEventsReplayZmq}`} (port + engine index)`
  const cpu = ws[0]?.engine.config.numCpuBlocks ?? 0
  const host = cpu > 0 ? `and ${cpu} host blocks ` : ''
  process.stderr.write(
    `kv-router mocker: worker ids ${ws.map((w) => w.workerId).join(' ')}; block size ${ws[0]?.engine.config.blockSize}, ${ws[0]?.capacity} blocks ` +
      `${host}each; registration and events: ${transport}${zmq}\n`,
  )
  process.stdout.write(`kv-router mocker: ready ${ws.length} engine(s) ${fleet.urls.join(' ')}\n`)
  process.on('SIGTERM', () => stop(0))
  process.on('SIGINT', () => stop(0))
  return done
}
