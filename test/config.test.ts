// `kv-router serve` options: Dynamo's names, DYN_* variables, command line over environment,
// validation with one line naming the flag and what it accepts, frozen result; and the process
// behaviour (exit status 2, one line on stderr, --help).
import t from 'tap'
import { spawn } from 'node:child_process'
import { ConfigError, FLAGS, parseServeConfig, serveHelp } from '../src/config.js'
import type { ServeConfig } from '../src/config.js'
import { cliArgv } from './helpers/cli.js'
import { logRecords } from './helpers/log.js'

function parse(argv: string[], env: NodeJS.ProcessEnv = {}): ServeConfig {
  const c = parseServeConfig(argv, env)
  if (c === 'help') throw new Error('help')
  return c
}

t.test("--worker takes the engine's own KV-event endpoints after its URL", async (t) => {
  const c = parse([
    '--worker',
    '1=http://a:1,kv-events=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,topic=kv-events',
    '--worker',
    'http://b:2,kv-events=tcp://[::1]:6000',
  ])
  t.same(c.workers, [
    { id: 1n, url: 'http://a:1', kvEvents: { endpoint: 'tcp://10.0.0.5:5557', replay: 'tcp://10.0.0.5:5558', topic: 'kv-events' }, decisionsOnly: false },
    { id: 2n, url: 'http://b:2', kvEvents: { endpoint: 'tcp://[::1]:6000', replay: null, topic: '' }, decisionsOnly: false },
  ])
  const e = parse([], { DYN_ROUTER_WORKERS: '5=http://a:1,kv-events=tcp://h:1,6=http://b:2,7=http://c:3,kv-events=tcp://h:3' })
  t.same(
    e.workers.map((w) => [w.id, w.kvEvents?.endpoint ?? null]),
    [
      [5n, 'tcp://h:1'],
      [6n, null],
      [7n, 'tcp://h:3'],
    ],
    'in the variable, keys belong to the worker before them',
  )
  t.throws(() => parse([], { DYN_ROUTER_WORKERS: '5=http://a:1,kv-events=x' }), /^DYN_ROUTER_WORKERS \(--worker\): worker 5: kv-events must be tcp/)
})

t.test('--worker takes decisions-only=true|false after its URL', async (t) => {
  const c = parse([
    '--worker',
    '1=http://a:1,decisions-only=true,kv-events=tcp://h:1',
    '--worker',
    '2=http://b:2,decisions-only=false',
    '--worker',
    'http://c:3',
  ])
  t.same(
    c.workers.map((w) => [w.id, w.decisionsOnly, w.kvEvents?.endpoint ?? null]),
    [
      [1n, true, 'tcp://h:1'],
      [2n, false, null],
      [3n, false, null],
    ],
  )
  t.throws(() => parse(['--worker', '1=http://a:1,decisions-only=yes']), /^--worker: worker 1: decisions-only= takes true or false, got "yes"$/)
  t.throws(() => parse(['--worker', 'decisions-only=true']), /decisions-only= must follow a worker URL/)
})

t.test("defaults are Dynamo's and the result is frozen", async (t) => {
  const c = parse([])
  t.equal(c.mode, 'kv')
  t.equal(c.cost, 'latency', 'the one default that is not Dynamo: docs/cost.md')
  t.equal(c.httpPort, 8000)
  t.equal(c.blockSize, 128)
  t.equal(c.overlapScoreWeight, 1)
  t.equal(c.temperature, 0)
  t.equal(c.queueThreshold, 4)
  t.equal(c.queuePolicy, 'fcfs')
  t.equal(c.kvEvents, true)
  t.equal(c.snapshotThreshold, 1_000_000)
  t.equal(c.namespace, 'dynamo')
  t.equal(c.component, 'backend')
  t.equal(c.natsUrl, null)
  t.ok(Object.isFrozen(c))
  t.ok(Object.isFrozen(c.workers))
  t.throws(() => {
    ;(c as { httpPort: number }).httpPort = 1
  })
})

t.test('flags, aliases, --no- forms and = syntax', async (t) => {
  const c = parse([
    '--router-mode',
    'round-robin',
    '--http-port=9001',
    '--kv-cache-block-size',
    '32',
    '--router-temperature',
    '0.5',
    '--no-router-kv-events',
    '--router-queue-threshold',
    'none',
    '--router-queue-policy',
    'wspt',
    '--router-track-active-blocks',
    'false',
    '--router-replica-sync',
    '--nats-url',
    'nats://n:4222',
    '--no-router-replica-spread',
    '--worker',
    'http://a:1',
    '--worker',
    '77=http://b:2/',
    '--api-key',
    'k',
    '--endpoint',
    'dyn.backend.generate',
  ])
  t.equal(c.mode, 'round-robin')
  t.equal(c.httpPort, 9001)
  t.equal(c.blockSize, 32)
  t.equal(c.temperature, 0.5)
  t.equal(c.kvEvents, false)
  t.equal(c.queueThreshold, null)
  t.equal(c.queuePolicy, 'wspt')
  t.equal(c.trackActiveBlocks, false)
  t.equal(c.replicaSync, true)
  t.equal(c.replicaSpread, false)
  t.equal(c.replicaCatchUpSecs, 2)
  t.same(c.workers, [
    { id: 1n, url: 'http://a:1', kvEvents: null, decisionsOnly: false },
    { id: 77n, url: 'http://b:2', kvEvents: null, decisionsOnly: false },
  ])
  t.equal(c.apiKey, 'k')
  t.equal(c.endpoint, 'dyn.backend.generate')
  t.equal(parse(['--worker', '18446744073709551615=http://x:1']).workers[0]?.id, 18446744073709551615n, 'u64 worker ids are exact')
  t.equal(parse(['--endpoint', 'dyn://ns-1.comp_2.generate']).endpoint, 'ns-1.comp_2.generate', 'dyn:// in front is dropped')
  t.equal(parse(['--api-key=--starts-with-dashes']).apiKey, '--starts-with-dashes', 'NAME=VALUE takes a value starting with --')
})

t.test('environment variables, and the command line wins', async (t) => {
  const env = {
    DYN_ROUTER_TEMPERATURE: '0.25',
    DYN_HTTP_PORT: '7000',
    DYN_ROUTER_USE_KV_EVENTS: 'false',
    NATS_SERVER: 'nats://n:4222',
    ETCD_ENDPOINTS: 'http://e:2379',
    DYN_KV_CACHE_BLOCK_SIZE: '64',
    DYN_ROUTER_WORKERS: 'http://w:1,9=http://w:2',
  }
  const e = parse([], env)
  t.equal(e.temperature, 0.25)
  t.equal(e.httpPort, 7000)
  t.equal(e.kvEvents, false)
  t.equal(e.natsUrl, 'nats://n:4222')
  t.equal(e.etcdUrl, 'http://e:2379')
  t.equal(e.blockSize, 64)
  t.same(
    e.workers.map((w) => w.id),
    [1n, 9n],
  )
  const c = parse(['--router-temperature', '0.75', '--router-kv-events', '--worker', 'http://c:3', '--router-block-size', '16'], env)
  t.equal(c.temperature, 0.75, 'flag over env')
  t.equal(c.kvEvents, true)
  t.equal(c.httpPort, 7000, 'env still applies where no flag is given')
  t.same(
    c.workers.map((w) => w.url),
    ['http://c:3'],
    '--worker replaces the env list',
  )
  t.equal(c.blockSize, 16)
  // the primary name wins over a legacy variable
  t.equal(parse([], { DYN_ROUTER_BLOCK_SIZE: '8', DYN_KV_CACHE_BLOCK_SIZE: '64' }).blockSize, 8)
  // Era C cost knobs: the prefill load scale is the weight under its newer name
  const k = parse(['--router-prefill-load-scale', '10', '--router-kv-overlap-score-credit', '5'], {
    DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY: '0.5',
    DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT: '2',
  })
  t.same([k.overlapScoreWeight, k.overlapScoreCredit, k.overlapScoreCreditDecay, k.decodeActiveRequestWeight], [10, 5, 0.5, 2])
  t.equal(parse([], { DYN_ROUTER_PREFILL_LOAD_SCALE: '4' }).overlapScoreWeight, 4)
  t.equal(parse(['--router-cost', 'dynamo']).cost, 'dynamo')
  t.equal(parse([], { DYN_ROUTER_COST: 'dynamo' }).cost, 'dynamo')
  t.equal(parse(['--router-cost=latency'], { DYN_ROUTER_COST: 'dynamo' }).cost, 'latency', 'the command line wins')
  t.same([e.overlapScoreCredit, e.overlapScoreCreditDecay, e.decodeActiveRequestWeight], [1, 0, 0], "Dynamo's defaults")
})

t.test('each invalid value: one line naming the flag and what it accepts', async (t) => {
  const cases: [string[], RegExp][] = [
    [['--router-mode', 'fastest'], /^--router-mode must be one of kv\|round-robin\|random\|least-loaded/],
    [['--router-cost', 'cheap'], /^--router-cost must be one of latency\|dynamo, got "cheap"$/],
    [['--http-port', '70000'], /^--http-port must be an integer in \[0, 65535\], got "70000"$/],
    [['--http-port', 'x'], /^--http-port must be an integer/],
    [['--router-block-size', '0'], /^--router-block-size must be an integer in \[1, 65536\]/],
    [['--router-kv-overlap-score-weight', '-1'], /^--router-kv-overlap-score-weight must be a number in \[0, ∞\]/],
    [['--router-kv-overlap-score-credit', 'lots'], /^--router-kv-overlap-score-credit must be a number in \[0, ∞\], got "lots"/],
    [['--router-temperature', 'hot'], /^--router-temperature must be a number/],
    [['--router-queue-threshold', 'lots'], /or "none"/],
    [['--router-queue-policy', 'sjf'], /^--router-queue-policy must be one of fcfs\|wspt\|lcfs/],
    [['--router-queue-max-pending', '-5'], /^--router-queue-max-pending must be an integer/],
    [['--router-kv-events', 'maybe'], /^--router-kv-events must be true or false/],
    [['--active-decode-blocks-threshold', '1.5'], /^--active-decode-blocks-threshold must be a number in \[0, 1\]/],
    [['--router-event-threads', '32'], /^--router-event-threads must be an integer in \[0, 31\]/],
    [['--nats-url', 'not a url'], /^--nats-url must be a nats:\/\/ or tls:\/\/ or ws:\/\/ or wss:\/\/ URL/],
    [['--nats-url', 'foo:bar'], /^--nats-url must be a nats:\/\//],
    [['--nats-url', 'nats://127.0.0.1:4222,http://x:1'], /^--nats-url must be a nats:\/\//],
    [['--etcd-url', 'nats://127.0.0.1:2379'], /^--etcd-url must be a http:\/\/ or https:\/\/ URL/],
    [['--etcd-url', ','], /^--etcd-url must be a http:\/\//],
    [['--worker', 'ftp://x'], /^--worker must be a worker URL/],
    [['--worker', 'abc=http://x:1'], /^--worker must be a worker URL/],
    [['--worker', '1=http://x:1', '--worker', '1=http://y:1'], /worker id 1 is given twice/],
    [['--worker', '1=http://x:1,kv-events=http://h:5557'], /^--worker: worker 1: kv-events must be tcp:\/\/HOST:PORT, got "http:\/\/h:5557"/],
    [['--worker', '1=http://x:1,kv-events=tcp://h:70000'], /^--worker: worker 1: kv-events must be tcp:\/\/HOST:PORT/],
    [['--worker', '1=http://x:1,kv-events=tcp://h'], /^--worker: worker 1: kv-events must be tcp:\/\/HOST:PORT/],
    [['--worker', '1=http://x:1,kv-events=tcp://h:1,replay=tcp://h:x'], /^--worker: worker 1: replay must be tcp:\/\/HOST:PORT/],
    [['--worker', '1=http://x:1,replay=tcp://h:5558'], /^--worker: worker 1: replay= and topic= need kv-events=/],
    [['--worker', 'kv-events=tcp://h:5557'], /^--worker: kv-events= must follow a worker URL/],
    [['--worker', '1=http://x:1,kv-events=tcp://h:1,kv-events=tcp://h:2'], /^--worker: kv-events= is given twice/],
    [['--http-port'], /^--http-port needs a value/],
    [['--frobnicate'], /^unknown option --frobnicate/],
    [['--no-http-port'], /^unknown option --no-http-port/],
    [['stray'], /^unexpected argument "stray"/],
    [['--endpoint', 'foo'], /^--endpoint must be namespace\.component\.endpoint, three names/],
    [['--endpoint', 'a..c'], /^--endpoint must be namespace\.component\.endpoint/],
    [['--endpoint', 'a.b.c.d'], /^--endpoint must be namespace\.component\.endpoint/],
    [['--namespace', 'a.b'], /^--namespace must be a name of letters, digits/],
    [['--component', 'x/y'], /^--component must be a name/],
    [['--http-host', '--http-port', '80'], /^--http-host needs a value \(a non-empty string\), got the option --http-port; write --http-host=VALUE/],
    [['--router-replica-sync'], /^--router-replica-sync needs --nats-url: replicas share their bookings over NATS/],
    [['--router-replica-catch-up-secs', '-1'], /^--router-replica-catch-up-secs must be a number in \[0, 600\]/],
  ]
  for (const [argv, re] of cases) {
    const err = t.throws(() => parseServeConfig(argv, {}), argv.join(' ')) as Error
    t.type(err, ConfigError)
    t.match(err.message, re, argv.join(' '))
    t.notMatch(err.message, /\n/, 'one line')
  }
  t.throws(() => parseServeConfig([], { DYN_ROUTER_TEMPERATURE: 'warm' }), /^DYN_ROUTER_TEMPERATURE \(--router-temperature\) must be a number/)
})

t.test('a variable the command line overrides is not read, so a bad one does not stop the router', async (t) => {
  const bad = { DYN_ROUTER_TEMPERATURE: 'warm', DYN_ROUTER_WORKERS: 'not a url', DYN_ROUTER_USE_KV_EVENTS: 'maybe' }
  const c = parse(['--router-temperature', '0.5', '--worker', 'http://w:1', '--no-router-kv-events'], bad)
  t.equal(c.temperature, 0.5)
  t.same(
    c.workers.map((w) => w.url),
    ['http://w:1'],
  )
  t.equal(c.kvEvents, false)
  // an alias on the command line overrides every variable of its option
  t.equal(parse(['--block-size', '32'], { DYN_ROUTER_BLOCK_SIZE: 'x', DYN_KV_CACHE_BLOCK_SIZE: 'y' }).blockSize, 32)
  // the ones it does not override are still checked
  t.throws(
    () => parse(['--router-temperature', '0.5', '--worker', 'http://w:1'], bad),
    /^DYN_ROUTER_USE_KV_EVENTS \(--router-kv-events\) must be true or false/,
  )
  t.throws(
    () => parse(['--router-temperature', '0.5'], { DYN_ROUTER_QUEUE_POLICY: 'random' }),
    /^DYN_ROUTER_QUEUE_POLICY \(--router-queue-policy\) must be one of/,
  )
  t.equal(parseServeConfig(['--help'], bad), 'help', '--help is shown whatever the environment holds')
})

t.test('help lists every flag with its variable', async (t) => {
  t.equal(parseServeConfig(['--help']), 'help')
  const text = serveHelp()
  for (const f of FLAGS) {
    t.match(text, f.flag)
    for (const e of f.env) t.match(text, e)
  }
})

function run(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, cliArgv(args), { env: { PATH: process.env.PATH, ...env } })
    let stdout = ''
    let stderr = ''
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()))
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()))
    p.on('close', (code) => resolve({ code, stdout, stderr }))
  })
}

t.test('process: options that act only in durable mode are said to have no effect without it', async (t) => {
  const r = await run([
    'serve',
    '--router-replica-sync',
    '--nats-url',
    'nats://127.0.0.1:1',
    '--router-snapshot-threshold',
    '5',
    '--router-reset-states',
    '--tokenizer',
    '/nonexistent/tokenizer.json',
    '--router-event-threads',
    '1',
  ])
  t.equal(r.code, 2)
  // two warning lines in the log, then the line the process dies with
  const lines = r.stderr.split('\n')
  t.same(
    logRecords(lines.slice(0, 2).join('\n')).map((x) => [x.level, x.msg]),
    [
      ['warn', '--router-reset-states has no effect without --router-durable-kv-events'],
      ['warn', '--router-snapshot-threshold has no effect without --router-durable-kv-events'],
    ],
  )
  t.match(lines[2], /^kv-router: serve: --tokenizer: /)
  t.notMatch(r.stderr, /replica-sync/, 'replica sync is in effect: nothing said of it')
  const d = await run([
    'serve',
    '--router-durable-kv-events',
    '--nats-url',
    'nats://127.0.0.1:1',
    '--router-snapshot-threshold',
    '5',
    '--router-reset-states',
    '--tokenizer',
    '/nonexistent/tokenizer.json',
    '--router-event-threads',
    '1',
  ])
  t.equal(d.code, 2)
  t.notMatch(d.stderr, /"warn"/, 'in durable mode both are in effect')
})

t.test('durable mode needs NATS and KV events', async (t) => {
  const nats = ['--nats-url', 'nats://127.0.0.1:4222']
  const c = parse(['--router-durable-kv-events', '--router-snapshot-threshold', '100', '--router-reset-states', ...nats])
  t.equal(c.durableKvEvents, true)
  t.equal(c.snapshotThreshold, 100)
  t.equal(c.resetStates, true)
  t.equal(parse([], { DYN_ROUTER_DURABLE_KV_EVENTS: 'true', NATS_SERVER: 'nats://n:4222' }).durableKvEvents, true)
  t.throws(() => parse(['--router-durable-kv-events']), /^--router-durable-kv-events needs --nats-url/)
  t.throws(() => parse(['--router-durable-kv-events', '--no-router-kv-events', ...nats]), /^--router-durable-kv-events needs KV events/)
  t.throws(() => parse(['--router-snapshot-threshold', '0']), /^--router-snapshot-threshold must be an integer in \[1,/)
  t.equal(parse(['--router-snapshot-threshold', '5']).snapshotThreshold, 5, 'taken without durable mode (serve warns that it does nothing there)')
})

t.test("process: Dynamo's cost flags under the latency cost are said to have no effect", async (t) => {
  const bad = ['--tokenizer', '/nonexistent/tokenizer.json', '--router-event-threads', '1']
  const [latency, dynamo] = await Promise.all([
    run(['serve', '--router-prefill-load-scale', '10', ...bad], { DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT: '5' }),
    run(['serve', '--router-cost', 'dynamo', '--router-prefill-load-scale', '10', ...bad]),
  ])
  const warned = logRecords(latency.stderr)
    .filter((x) => x.level === 'warn')
    .map((x) => x.msg)
  t.match(warned, [
    /^--router-kv-overlap-score-weight \(--router-prefill-load-scale\) tunes Dynamo's cost and has no effect under --router-cost latency/,
    /^--router-kv-overlap-score-credit tunes Dynamo's cost/,
  ])
  t.notMatch(latency.stderr, /credit-decay|active-request-weight/, 'only the flags set')
  t.notMatch(dynamo.stderr, /tunes Dynamo's cost/)
})

t.test('process: invalid values exit 2 with one line; --help exits 0', async (t) => {
  const [a, b, c, d, e] = await Promise.all([
    run(['serve', '--router-temperature', 'hot']),
    run(['serve'], { DYN_ROUTER_QUEUE_POLICY: 'random' }),
    run(['serve', '--help']),
    run(['serve', '--tokenizer', '/nonexistent/tokenizer.json', '--router-event-threads', '1']),
    run(['serve', '--worker', '1=http://127.0.0.1:9,kv-events=tcp://h:0']),
  ])
  t.equal(e.code, 2)
  t.equal(e.stderr, 'kv-router: serve: --worker: worker 1: kv-events must be tcp://HOST:PORT, got "tcp://h:0"\n')
  t.equal(a.code, 2)
  t.equal(a.stderr, 'kv-router: serve: --router-temperature must be a number in [0, ∞], got "hot"\n')
  t.equal(b.code, 2)
  t.match(b.stderr, /^kv-router: serve: DYN_ROUTER_QUEUE_POLICY \(--router-queue-policy\) must be one of fcfs\|wspt\|lcfs, got "random"\n$/)
  t.equal(c.code, 0)
  t.match(c.stdout, /--router-kv-overlap-score-weight X, --kv-overlap-score-weight, --router-prefill-load-scale\n/)
  t.equal(d.code, 2)
  t.match(d.stderr, /^kv-router: serve: --tokenizer: no such file \/nonexistent\/tokenizer.json\n$/)
})

t.test('index cap, approximate pruning, the CUDA-to-CPU ratio: flags with defaults and ranges', async (t) => {
  const d = parse([])
  t.equal(d.maxIndexBlocks, 60_000_000)
  t.equal(d.maxTreeSize, 1 << 20)
  t.equal(d.pruneTargetRatio, 0.8)
  t.equal(d.cudaToCpuRatio, 8, "Dynamo's default")
  const c = parse(['--router-max-index-blocks', '5000', '--router-max-tree-size', '100', '--router-prune-target-ratio', '0.5'], {
    DYN_ENCODER_CUDA_TO_CPU_RATIO: '1',
  })
  t.equal(c.maxIndexBlocks, 5000)
  t.equal(c.maxTreeSize, 100)
  t.equal(c.pruneTargetRatio, 0.5)
  t.equal(c.cudaToCpuRatio, 1, 'read from DYN_ENCODER_CUDA_TO_CPU_RATIO')
  t.equal(parse(['--encoder-cuda-to-cpu-ratio', '2'], { DYN_ENCODER_CUDA_TO_CPU_RATIO: '1' }).cudaToCpuRatio, 2, 'the command line wins')
  t.throws(() => parse([], { DYN_ENCODER_CUDA_TO_CPU_RATIO: 'abc' }), /DYN_ENCODER_CUDA_TO_CPU_RATIO \(--encoder-cuda-to-cpu-ratio\) must be a number/)
  t.throws(() => parse(['--router-max-index-blocks', '0']), /--router-max-index-blocks must be an integer in \[1, 67000000\]/)
  t.throws(() => parse(['--router-prune-target-ratio', '1.5']), /--router-prune-target-ratio must be a number in \[0, 1\]/)
})

t.test('--router-predicted-ttl-secs: off by default, a number of seconds, refused with --no-router-kv-events', async (t) => {
  t.equal((parseServeConfig([], {}) as ServeConfig).predictedTtlSecs, 0)
  t.equal((parseServeConfig(['--router-predicted-ttl-secs', '2.5'], {}) as ServeConfig).predictedTtlSecs, 2.5)
  t.equal((parseServeConfig([], { DYN_ROUTER_PREDICTED_TTL_SECS: '5' }) as ServeConfig).predictedTtlSecs, 5)
  t.throws(() => parseServeConfig(['--router-predicted-ttl-secs', '-1'], {}), ConfigError)
  t.throws(() => parseServeConfig(['--router-predicted-ttl-secs', '5', '--no-router-kv-events'], {}), {
    message: '--router-predicted-ttl-secs needs KV events: it is not used with --no-router-kv-events',
  })
})

t.test('--indexer-url: a shared remote index, its deadline, and what cannot go with it', async (t) => {
  const c = parse(['--indexer-url', 'http://idx-a:8090, https://idx-b:8090'])
  t.equal(c.indexerUrl, 'http://idx-a:8090, https://idx-b:8090', 'a comma-separated list is kept whole')
  t.equal(c.indexerTimeoutMs, 100, 'the deadline defaults to 100 ms')
  t.equal(c.kvEvents, false, 'the router consumes no KV events itself: its local index is approximate')
  t.equal(parse([]).indexerUrl, null, 'unset: no remote index')
  const e = parse([], { KVR_INDEXER_URL: 'http://idx:8090', KVR_INDEXER_TIMEOUT_MS: '50', DYN_USE_REMOTE_INDEXER: 'true' })
  t.same([e.indexerUrl, e.indexerTimeoutMs, e.useRemoteIndexer], ['http://idx:8090', 50, true], "from the environment, with Dynamo's switch")
  const cases: [string[], RegExp][] = [
    [['--indexer-url', 'idx:8090'], /^--indexer-url must be an http:\/\/ or https:\/\/ URL/],
    [['--indexer-url', 'nats://idx:4222'], /^--indexer-url must be an http:\/\/ or https:\/\/ URL/],
    [['--indexer-url', 'http://a:1,ftp://b:2'], /^--indexer-url must be/],
    [['--indexer-url', 'http://a:1', '--indexer-timeout-ms', '0'], /^--indexer-timeout-ms must be an integer in \[1, 10000\]/],
    [['--indexer-url', 'http://a:1', '--indexer-timeout-ms', '2.5'], /^--indexer-timeout-ms must be an integer/],
    [['--use-remote-indexer'], /^--use-remote-indexer needs --indexer-url/],
    [['--indexer-url', 'http://a:1', '--router-kv-events'], /^--indexer-url routes on a remote index: .*--router-kv-events cannot be given with it/],
    [['--indexer-url', 'http://a:1', '--router-mode', 'round-robin'], /^--indexer-url needs --router-mode kv/],
    [['--indexer-url', 'http://a:1', '--router-predicted-ttl-secs', '5'], /^--router-predicted-ttl-secs cannot be combined with --indexer-url/],
    [
      ['--indexer-url', 'http://a:1', '--nats-url', 'nats://n:4222', '--router-durable-kv-events'],
      /^--router-durable-kv-events cannot be combined with --indexer-url/,
    ],
  ]
  for (const [argv, re] of cases) {
    const err = t.throws(() => parseServeConfig(argv, {}), argv.join(' ')) as Error
    t.type(err, ConfigError)
    t.match(err.message, re, argv.join(' '))
  }
})
