// `kv-router mocker`: N simulated vLLM-like engines in one process (docs/architecture.md).
//
// The contract other tools rely on (replay, bench:e2e, docker-compose): the flags below, and
// exactly one line on stdout once every engine is up and registered:
//
//   kv-router mocker: ready <N> engine(s) <url1> <url2> ...
//
// Invalid options exit 2 with one line naming the option; SIGTERM/SIGINT revoke the leases (or
// unregister from the router), close the servers and exit 0.
import { die, isHttpUrl, parseIntArg, parseNumArg } from '../../cli/flags.js'
import { isKvrError } from '../../errors.js'
import { ENGINE_DEFAULTS } from './engine.js'
import type { PreemptionMode } from './engine.js'
import { FleetListenError, MockerFleet } from './fleet.js'
import type { FleetOptions } from './fleet.js'
import { urlHost } from './server.js'
import { parseTcpEndpoint } from './zmq-publisher.js'

export const mockerHelp = `usage: kv-router mocker [options]

Simulated vLLM-like engines: OpenAI-compatible HTTP servers with a paged KV cache, prefix
caching, a token-budget scheduler (chunked prefill, preemption) and the timing model of
Dynamo's mocker; they publish real KV events and answer the worker KV query.

engines (names as in Dynamo's mocker):
  --num-workers N                engines in this process (default 1)
  --block-size N                 tokens per KV block (default ${ENGINE_DEFAULTS.blockSize}; must match the router's)
  --num-gpu-blocks-override N    KV blocks per engine (default ${ENGINE_DEFAULTS.numGpuBlocks})
  --max-num-seqs N               running requests per engine at most (default ${ENGINE_DEFAULTS.maxNumSeqs})
  --max-num-batched-tokens N     token budget of one step (default ${ENGINE_DEFAULTS.maxNumBatchedTokens})
  --enable-chunked-prefill B     true|false (default true)
  --preemption-mode M            lifo|fifo: which request gives way under memory pressure (default lifo)
  --speedup-ratio X              divides every simulated duration; 0 = no sleeping at all (default 1)
  --decode-speedup-ratio X       further divides decode durations (default 1)
  --model-name NAME              model served by GET /v1/models (default kv-router-model)

network:
  --host HOST                    listen address (default 127.0.0.1)
  --http-port N                  first engine's port, engine i uses N+i (default 0: free ports)
  --advertise-host HOST          host written into the engines' URLs (default: --host)

registration and KV events (pick one; with none, events stay in each engine's ring):
  --router-url URL               register with a kv-router (POST /v1/workers) and post KV events
                                 to its /v1/kv-events
  --api-key KEY                  that router's --api-key
  --first-worker-id N            worker id of the first engine without etcd (default 1000)
  --nats-url URL                 publish KV events on namespace.{ns}.component.{component}.kv-events
                                 and load on namespace.{ns}.kv_metrics
  --durable-kv-events            with --nats-url: KV events into the JetStream stream
                                 namespace-{ns}-component-{component}-kv-events instead, each
                                 stored once and in order (for kv-router --router-durable-kv-events)
  --etcd-url URL                 register each engine under its own lease (lease id = worker id)
  --lease-ttl-secs N             etcd lease TTL (default 10)
  --namespace NS                 (default dynamo)
  --component NAME               (default backend)
  --endpoint NAME                endpoint name, or ns.component.endpoint (default generate)

KV events over ZMQ, as vLLM publishes them (in addition to any of the above):
  --kv-events-zmq ENDPOINT       bind a PUB socket per engine, tcp://HOST:PORT (HOST * = every
                                 interface); engine i binds PORT+i, as vLLM offsets per DP rank
  --kv-events-replay-zmq ENDPOINT  a replay ROUTER per engine (its last 10000 batches), PORT+i too
  --kv-events-form F             map|array: vLLM's event encoding, map since PR #42892 (default map)
  --kv-events-topic T            the topic frame (default kv-events)
  The router side is not wired yet: kv-router does not read these sockets (use --router-url,
  --nats-url for the router; ZMQ is for tests and other subscribers).

Each engine serves POST /v1/completions, POST /v1/chat/completions, POST /v1/kv/query (the
worker KV query: {worker_id, start_event_id, end_event_id}), GET /health, GET /v1/models and
GET /stats. Once all are up, one line is printed on stdout:
  kv-router mocker: ready <N> engine(s) <url> ...
`

export interface MockerCli {
  fleet: FleetOptions
  numWorkers: number
}

type Kind = 'int' | 'num' | 'bool' | 'str' | 'url' | 'host' | 'zmq'
interface Spec {
  kind: Kind
  min?: number
  max?: number
  /** num: the lower bound is exclusive */
  open?: boolean
  values?: readonly string[]
}

export const SPECS: Record<string, Spec> = {
  '--num-workers': { kind: 'int', min: 1, max: 1024 },
  '--block-size': { kind: 'int', min: 1, max: 65536 },
  '--num-gpu-blocks-override': { kind: 'int', min: 1, max: 1 << 26 },
  '--max-num-seqs': { kind: 'int', min: 1, max: 1 << 20 },
  '--max-num-batched-tokens': { kind: 'int', min: 1, max: 1 << 30 },
  '--enable-chunked-prefill': { kind: 'bool' },
  '--preemption-mode': { kind: 'str', values: ['lifo', 'fifo'] },
  '--speedup-ratio': { kind: 'num', min: 0, max: 1e9 },
  '--decode-speedup-ratio': { kind: 'num', min: 0, max: 1e9, open: true },
  '--model-name': { kind: 'str' },
  '--host': { kind: 'str' },
  '--http-port': { kind: 'int', min: 0, max: 65535 },
  '--advertise-host': { kind: 'host' },
  '--router-url': { kind: 'url' },
  '--api-key': { kind: 'str' },
  '--first-worker-id': { kind: 'int', min: 0, max: Number.MAX_SAFE_INTEGER },
  '--nats-url': { kind: 'str' },
  '--durable-kv-events': { kind: 'bool' },
  '--etcd-url': { kind: 'url' },
  '--lease-ttl-secs': { kind: 'int', min: 2, max: 3600 },
  '--namespace': { kind: 'str' },
  '--component': { kind: 'str' },
  '--endpoint': { kind: 'str' },
  '--kv-events-zmq': { kind: 'zmq' },
  '--kv-events-replay-zmq': { kind: 'zmq' },
  '--kv-events-form': { kind: 'str', values: ['map', 'array'] },
  '--kv-events-topic': { kind: 'str' },
}

const NAME_RE = /^[A-Za-z0-9_-]+$/

/** A bad command line: the message is the one line to print. */
export class MockerArgError extends Error {}

/** Parses the mocker's arguments; 'help' for --help. Throws MockerArgError. */
export function parseMockerArgs(argv: readonly string[]): MockerCli | 'help' {
  const v = new Map<string, string | number | boolean>()
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (a === '--help' || a === '-h') return 'help'
    if (!a.startsWith('--')) throw new MockerArgError(`unexpected argument ${JSON.stringify(a)} (kv-router mocker --help lists the options)`)
    const eq = a.indexOf('=')
    const name = eq < 0 ? a : a.slice(0, eq)
    const spec = SPECS[name]
    if (spec === undefined) throw new MockerArgError(`unknown option ${name} (kv-router mocker --help lists the options)`)
    let raw: string | undefined
    if (eq >= 0) raw = a.slice(eq + 1)
    else if (spec.kind === 'bool') {
      const next = argv[i + 1]
      if (next !== undefined && !next.startsWith('--')) {
        raw = next
        i++
      } else raw = 'true'
    } else {
      raw = argv[i + 1]
      if (raw === undefined) throw new MockerArgError(`${name} needs a value`)
      i++
    }
    v.set(name, convert(name, spec, raw))
  }
  const get = <T extends string | number | boolean>(name: string): T | undefined => v.get(name) as T | undefined

  const f: FleetOptions = {}
  const numWorkers = get<number>('--num-workers') ?? 1
  f.numWorkers = numWorkers
  const engineKeys = [
    ['--block-size', 'blockSize'],
    ['--num-gpu-blocks-override', 'numGpuBlocks'],
    ['--max-num-seqs', 'maxNumSeqs'],
    ['--max-num-batched-tokens', 'maxNumBatchedTokens'],
    ['--enable-chunked-prefill', 'enableChunkedPrefill'],
    ['--speedup-ratio', 'speedupRatio'],
    ['--decode-speedup-ratio', 'decodeSpeedupRatio'],
    ['--model-name', 'modelName'],
    ['--host', 'host'],
    ['--http-port', 'port'],
    ['--advertise-host', 'advertiseHost'],
    ['--router-url', 'routerUrl'],
    ['--api-key', 'apiKey'],
    ['--nats-url', 'natsUrl'],
    ['--durable-kv-events', 'durableKvEvents'],
    ['--etcd-url', 'etcdUrl'],
    ['--lease-ttl-secs', 'leaseTtlSecs'],
    ['--kv-events-zmq', 'kvEventsZmq'],
    ['--kv-events-replay-zmq', 'kvEventsReplayZmq'],
    ['--kv-events-form', 'kvEventsForm'],
    ['--kv-events-topic', 'kvEventsTopic'],
  ] as const
  for (const [flag, key] of engineKeys) {
    const x = v.get(flag)
    if (x !== undefined) (f as Record<string, unknown>)[key] = x
  }
  const pm = get<string>('--preemption-mode')
  if (pm !== undefined) f.preemptionMode = pm as PreemptionMode
  f.firstWorkerId = BigInt(get<number>('--first-worker-id') ?? 1000)
  const port = get<number>('--http-port')
  if (port !== undefined && port > 0 && port + numWorkers - 1 > 65535)
    throw new MockerArgError(`--http-port ${port} leaves no room for ${numWorkers} engines below port 65536`)

  let ns = get<string>('--namespace') ?? 'dynamo'
  let component = get<string>('--component') ?? 'backend'
  let endpoint = get<string>('--endpoint') ?? 'generate'
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
  return { fleet: f, numWorkers }
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

function convert(name: string, s: Spec, raw: string): string | number | boolean {
  switch (s.kind) {
    case 'int': {
      const n = parseIntArg(raw, s.min as number, s.max as number)
      if (n === undefined) throw new MockerArgError(`${name} must be an integer in [${s.min}, ${s.max}], got ${JSON.stringify(raw)}`)
      return n
    }
    case 'num': {
      const n = parseNumArg(raw, s.min as number, s.max as number)
      if (n === undefined || (s.open === true && n === s.min)) {
        throw new MockerArgError(`${name} must be a number ${s.open === true ? '>' : '≥'} ${s.min} (at most ${s.max}), got ${JSON.stringify(raw)}`)
      }
      return n
    }
    case 'bool':
      if (raw === 'true' || raw === '1') return true
      if (raw === 'false' || raw === '0') return false
      throw new MockerArgError(`${name} must be true or false, got ${JSON.stringify(raw)}`)
    case 'url':
      if (!isHttpUrl(raw)) throw new MockerArgError(`${name} must be an http(s) URL (http://host:port), got ${JSON.stringify(raw)}`)
      return raw.replace(/\/+$/, '')
    case 'zmq':
      if (parseTcpEndpoint(raw) === null) throw new MockerArgError(`${name} must be tcp://HOST:PORT with a port in [1, 65535], got ${JSON.stringify(raw)}`)
      return raw
    case 'host':
      if (!isUrlHost(raw)) throw new MockerArgError(`${name} must be a host name or IP address, got ${JSON.stringify(raw)}`)
      return raw
    default:
      if (raw === '' || /\s/.test(raw)) throw new MockerArgError(`${name} must be a non-empty value without spaces, got ${JSON.stringify(raw)}`)
      if (s.values !== undefined && !s.values.includes(raw))
        throw new MockerArgError(`${name} must be one of ${s.values.join('|')}, got ${JSON.stringify(raw)}`)
      return raw
  }
}

export async function mockerMain(argv: string[]): Promise<void> {
  let cli: MockerCli | 'help'
  try {
    cli = parseMockerArgs(argv)
  } catch (err) {
    if (err instanceof MockerArgError) die(`mocker: ${err.message}`)
    throw err
  }
  if (cli === 'help') {
    process.stdout.write(mockerHelp)
    return
  }
  const o = cli.fleet
  let stopping = false
  let fleet: MockerFleet | null = null
  const stop = (code: number): void => {
    if (stopping) return
    stopping = true
    void (fleet?.close() ?? Promise.resolve()).finally(() => process.exit(code))
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
    if (err instanceof FleetListenError) die(`mocker: ${err.option === 'host' ? '--host' : '--http-port'}: ${err.message}`)
    if (isKvrError(err)) die(`mocker: ${err.message}`)
    throw err
  }
  const ws = fleet.workers
  const transport =
    o.routerUrl !== undefined
      ? `router ${o.routerUrl}`
      : [o.natsUrl !== undefined ? `${o.durableKvEvents === true ? 'JetStream' : 'NATS'} ${o.natsUrl}` : '', o.etcdUrl !== undefined ? `etcd ${o.etcdUrl}` : '']
          .filter((x) => x !== '')
          .join(' + ') || 'none (events stay in the local rings)'
  const zmq =
    o.kvEventsZmq === undefined
      ? ''
      : `; vLLM KV events on ZMQ ${o.kvEventsZmq}${o.kvEventsReplayZmq === undefined ? '' : `, replay ${o.kvEventsReplayZmq}`} (port + engine index)`
  process.stderr.write(
    `kv-router mocker: worker ids ${ws.map((w) => w.workerId).join(' ')}; block size ${ws[0]?.engine.config.blockSize}, ${ws[0]?.capacity} blocks each; registration and events: ${transport}${zmq}\n`,
  )
  process.stdout.write(`kv-router mocker: ready ${ws.length} engine(s) ${fleet.urls.join(' ')}\n`)
  process.on('SIGTERM', () => stop(0))
  process.on('SIGINT', () => stop(0))
}
