// `kv-router mocker` as a process: flag validation (exit 2 with one line naming the flag), the
// ready line, --router-url mode against a spawned `kv-router serve` (registration, events,
// prefix hits through the router, unregistering on SIGTERM), and NATS + etcd mode.
import t from 'tap'
import { Etcd3 } from 'etcd3'
import { createServer } from 'node:net'
import type { AddressInfo } from 'node:net'
import { MockerArgError, parseMockerArgs } from '../../../src/sim/mocker/main.js'
import { startEtcd, startNats } from '../../../src/deploy/services.js'
import { waitUntil } from '../../helpers/wait.js'
import { runCli as run } from '../../helpers/cli.js'
import { EngineEventDecoder } from '../../../support/engine-reference-decoder.js'
import { ZmqListener } from '../../../src/transport/zmq.js'
import type { CliProcess as Proc } from '../../helpers/cli.js'

async function ready(pr: Proc, re: RegExp): Promise<RegExpMatchArray> {
  let m: RegExpMatchArray | null = null
  await waitUntil(`ready line (${pr.err()})`, () => (m = pr.out().match(re)) !== null, 20_000)
  return m as unknown as RegExpMatchArray
}

t.test('invalid flags exit 2 with one line naming the flag', async (t) => {
  const cases: [string[], RegExp][] = [
    [['--num-workers', '0'], /^kv-router: mocker: --num-workers must be an integer in \[1, 1024\], got "0"\n$/],
    [['--block-size=abc'], /^kv-router: mocker: --block-size must be an integer in \[1, 65536\], got "abc"\n$/],
    [['--speedup-ratio', '-1'], /^kv-router: mocker: --speedup-ratio must be a number ≥ 0/],
    [['--preemption-mode', 'random'], /^kv-router: mocker: --preemption-mode must be one of lifo\|fifo, got "random"\n$/],
    [['--router-url', 'localhost:8000'], /^kv-router: mocker: --router-url must be an http\(s\) URL/],
    [['--bogus'], /^kv-router: mocker: unknown option --bogus/],
    [
      ['--kv-events-zmq', 'tcp://127.0.0.1:5557', '--kv-events-form', 'tuple'],
      /^kv-router: mocker: --kv-events-form must be one of map\|array, got "tuple"\n$/,
    ],
  ]
  const procs = cases.map(([args]) => run(['mocker', ...args]))
  for (let i = 0; i < cases.length; i++) {
    const [args, re] = cases[i] as [string[], RegExp]
    const pr = procs[i] as Proc
    t.equal(await pr.exited, 2, args.join(' '))
    t.match(pr.err(), re)
    t.equal(pr.err().split('\n').length, 2, 'one line')
    t.equal(pr.out(), '')
  }
  const help = run(['mocker', '--help'])
  t.equal(await help.exited, 0)
  t.match(help.out(), /usage: kv-router mocker/)
  t.match(help.out(), /--num-gpu-blocks-override N/)
  t.match(help.out(), /kv-router mocker: ready <N> engine\(s\) <url>/)
  t.match(help.out(), /--kv-events-zmq ENDPOINT/)
  t.match(help.out(), /kv-router serve reads it for a worker registered with kv-events=/, "the router reads the engines' ZMQ events")
  t.notMatch(help.out(), /not wired|does not read/)
})

t.test('a listen failure exits 2 with one line naming --host or --http-port', async (t) => {
  // a port the OS hands out, held by this test so the engine finds it taken
  const taken = createServer()
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => taken.close(() => resolve())))
  const port = (taken.address() as AddressInfo).port
  // not an IPv4 address, so it goes to the resolver: ENOTFOUND, or EAI_AGAIN without DNS
  const badHost = run(['mocker', '--host', '999.1.1.1'])
  const busy = run(['mocker', '--host', '127.0.0.1', '--http-port', String(port)])
  t.equal(await badHost.exited, 2)
  t.match(badHost.err(), /^kv-router: mocker: --host: cannot listen on 999\.1\.1\.1:0: getaddrinfo E[A-Z_]+ 999\.1\.1\.1\n$/)
  t.equal(await busy.exited, 2)
  t.equal(busy.err(), `kv-router: mocker: --http-port: cannot listen on 127.0.0.1:${port}: listen EADDRINUSE: address already in use 127.0.0.1:${port}\n`)
  t.equal(badHost.out() + busy.out(), '', 'no ready line')
})

t.test('the parser, flag by flag', async (t) => {
  const bad = (args: string[], re: RegExp): void => {
    t.throws(() => parseMockerArgs(args), re, args.join(' '))
    try {
      parseMockerArgs(args)
    } catch (err) {
      t.ok(err instanceof MockerArgError)
    }
  }
  const ok = parseMockerArgs([
    '--num-workers',
    '3',
    '--block-size',
    '16',
    '--num-gpu-blocks-override=100',
    '--max-num-seqs',
    '8',
    '--max-num-batched-tokens',
    '512',
    '--enable-chunked-prefill',
    'false',
    '--preemption-mode',
    'fifo',
    '--speedup-ratio',
    '2.5',
    '--decode-speedup-ratio',
    '0.5',
    '--host',
    '0.0.0.0',
    '--advertise-host',
    'engine-1',
    '--http-port',
    '9100',
    '--first-worker-id',
    '7',
    '--model-name',
    'mm',
    '--router-url',
    'http://r:8000/',
    '--api-key',
    'k',
  ])
  t.same(ok, {
    numWorkers: 3,
    fleet: {
      numWorkers: 3,
      blockSize: 16,
      numGpuBlocks: 100,
      maxNumSeqs: 8,
      maxNumBatchedTokens: 512,
      enableChunkedPrefill: false,
      preemptionMode: 'fifo',
      speedupRatio: 2.5,
      decodeSpeedupRatio: 0.5,
      host: '0.0.0.0',
      advertiseHost: 'engine-1',
      port: 9100,
      firstWorkerId: 7n,
      modelName: 'mm',
      routerUrl: 'http://r:8000',
      apiKey: 'k',
      namespace: 'dynamo',
      component: 'backend',
      endpoint: 'generate',
    },
  })
  const d = parseMockerArgs([
    '--enable-chunked-prefill',
    '--nats-url',
    'nats://n:4222',
    '--etcd-url',
    'http://e:2379',
    '--endpoint',
    'dyn://ns1.comp1.ep1',
    '--lease-ttl-secs',
    '5',
  ])
  t.match(d, {
    fleet: {
      enableChunkedPrefill: true,
      natsUrl: 'nats://n:4222',
      etcdUrl: 'http://e:2379',
      namespace: 'ns1',
      component: 'comp1',
      endpoint: 'ep1',
      leaseTtlSecs: 5,
      firstWorkerId: 1000n,
    },
  })
  t.equal(parseMockerArgs(['-h']), 'help')
  bad(['--num-workers'], /--num-workers needs a value/)
  bad(['--enable-chunked-prefill', 'maybe'], /must be true or false/)
  bad(['--decode-speedup-ratio', '0'], /--decode-speedup-ratio must be a number > 0/)
  bad(['--speedup-ratio', ''], /--speedup-ratio must be a number/)
  bad(['--http-port', '65535', '--num-workers', '2'], /leaves no room for 2 engines/)
  bad(['--endpoint', 'a.b'], /ns\.component\.endpoint/)
  bad(['--namespace', 'a b'], /--namespace must be a non-empty value without spaces/)
  bad(['--component', 'a/b'], /--component must match/)
  bad(['--router-url', 'http://r:1', '--nats-url', 'nats://n:1'], /cannot be combined/)
  bad(['--api-key', 'k'], /only used with --router-url/)
  t.match(parseMockerArgs(['--nats-url', 'nats://n:4222', '--durable-kv-events']), { fleet: { natsUrl: 'nats://n:4222', durableKvEvents: true } })
  t.notOk('durableKvEvents' in (parseMockerArgs(['--nats-url', 'nats://n:4222']) as { fleet: object }).fleet, 'core NATS unless asked')
  bad(['--durable-kv-events'], /--durable-kv-events needs --nats-url/)
  bad(['positional'], /unexpected argument "positional"/)
})

t.test('the parser reads numbers and URLs as serve does, and refuses hosts that break the engine URL', async (t) => {
  const bad = (args: string[], re: RegExp): void => void t.throws(() => parseMockerArgs(args), re, args.join(' '))
  bad(['--speedup-ratio', '0b11'], /^--speedup-ratio must be a number ≥ 0 \(at most 1000000000\), got "0b11"$/)
  bad(['--decode-speedup-ratio', '0x10'], /^--decode-speedup-ratio must be a number > 0/)
  bad(['--speedup-ratio', 'Infinity'], /^--speedup-ratio must be a number/)
  bad(['--router-url', 'http://127.0.0.1:99999'], /^--router-url must be an http\(s\) URL \(http:\/\/host:port\), got "http:\/\/127\.0\.0\.1:99999"$/)
  bad(['--etcd-url', 'http://h:-1'], /^--etcd-url must be an http\(s\) URL/)
  bad(['--advertise-host', 'a/b'], /^--advertise-host must be a host name or IP address, got "a\/b"$/)
  bad(['--advertise-host', 'user@h'], /^--advertise-host must be a host name or IP address/)
  bad(['--advertise-host', 'h:80'], /^--advertise-host must be a host name or IP address/)
  bad(['--advertise-host', 'h?x'], /^--advertise-host must be a host name or IP address/)
  t.match(parseMockerArgs(['--num-cpu-blocks', '64']), { fleet: { numCpuBlocks: 64 } })
  t.notOk('numCpuBlocks' in (parseMockerArgs([]) as { fleet: object }).fleet, 'no host tier unless asked')
  bad(['--num-cpu-blocks', '-1'], /--num-cpu-blocks/)
  bad(['--num-cpu-blocks', String(2 ** 26 + 1)], /--num-cpu-blocks/)
  t.match(parseMockerArgs(['--speedup-ratio', '1e-3', '--decode-speedup-ratio', ' 2 ']), { fleet: { speedupRatio: 0.001, decodeSpeedupRatio: 2 } })
  for (const host of ['engine-1', '10.0.0.7', '::1', 'Engine.Example.com'])
    t.match(parseMockerArgs(['--advertise-host', host]), { fleet: { advertiseHost: host } }, host)
})

t.test('--router-url: registers with a spawned router, events and prefix hits flow, SIGTERM unregisters', async (t) => {
  const KEY = 'mk'
  const router = run([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-block-size',
    '16',
    '--tokenizer',
    'bytes',
    '--router-event-threads',
    '1',
    '--api-key',
    KEY,
  ])
  t.teardown(() => router.p.kill('SIGKILL'))
  const base = (await ready(router, /listening on (http:\/\/\S+)/))[1] as string
  const mocker = run([
    'mocker',
    '--router-url',
    base,
    '--api-key',
    KEY,
    '--num-workers',
    '2',
    '--block-size',
    '16',
    '--speedup-ratio',
    '10',
    '--first-worker-id',
    '40',
  ])
  t.teardown(() => mocker.p.kill('SIGKILL'))
  const m = await ready(mocker, /^kv-router mocker: ready (\d+) engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/)
  t.equal(m[1], '2')
  t.equal(mocker.out().split('\n').length, 2, 'exactly one stdout line')
  t.match(mocker.err(), /worker ids 40 41; block size 16, 16384 blocks each; registration and events: router/)
  const workers = (await (await fetch(`${base}/v1/workers`, { headers: { authorization: `Bearer ${KEY}` } })).json()) as {
    workers: { id: number; url: string; capacity: number; max_num_batched_tokens: number }[]
  }
  t.same(
    workers.workers.map((w) => [w.id, w.url, w.capacity, w.max_num_batched_tokens]),
    [
      [40, m[2], 16384, 8192],
      [41, m[3], 16384, 8192],
    ],
  )

  const prompt = 'The mocker engines post their KV events to the router, which then knows where this prompt lives.'
  const ask = async (): Promise<{ worker: number; cached: number }> => {
    const r = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ prompt, max_tokens: 4 }),
    })
    t.equal(r.status, 200)
    const j = (await r.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } }; nvext: { worker_id: { decode_worker_id: number } } }
    return { worker: j.nvext.worker_id.decode_worker_id, cached: j.usage.prompt_tokens_details.cached_tokens }
  }
  const a = await ask()
  t.equal(a.cached, 0)
  await waitUntil(
    'the events reached the router',
    async () => /"last_event_id":[1-9]/.test(await (await fetch(`${base}/v1/workers`, { headers: { authorization: `Bearer ${KEY}` } })).text()),
    5000,
  )
  const b = await ask()
  t.equal(b.worker, a.worker, 'routed where the prefix is')
  t.equal(b.cached, Math.floor(Buffer.byteLength(prompt) / 16) * 16)

  mocker.p.kill('SIGTERM')
  t.equal(await mocker.exited, 0)
  const after = (await (await fetch(`${base}/v1/workers`, { headers: { authorization: `Bearer ${KEY}` } })).json()) as { workers: unknown[] }
  t.same(after.workers, [], 'the engines unregistered on the way out')
})

t.test('--kv-events-zmq: engine i publishes on port + i; its batches carry the prompt tokens', async (t) => {
  let mocker: Proc | null = null
  let base = 0
  for (let attempt = 0; mocker === null; attempt++) {
    base = 20000 + Math.floor(Math.random() * 20000) * 2
    const pr = run([
      'mocker',
      '--num-workers',
      '2',
      '--block-size',
      '4',
      '--speedup-ratio',
      '0',
      '--kv-events-zmq',
      `tcp://127.0.0.1:${base}`,
      '--kv-events-replay-zmq',
      `tcp://127.0.0.1:${base + 2}`,
    ])
    t.teardown(() => pr.p.kill('SIGKILL'))
    let code: number | null | undefined
    void pr.exited.then((c) => (code = c))
    await waitUntil(`ready or exit (${pr.err()})`, () => /ready/.test(pr.out()) || code !== undefined, 20_000)
    if (code === undefined) mocker = pr
    // a port someone else holds: another base
    else if (attempt > 5 || !/cannot bind/.test(pr.err())) throw new Error(`the mocker exited ${String(code)}: ${pr.err()}`)
  }
  const pr = mocker
  const m = pr.out().match(/^kv-router mocker: ready 2 engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/)
  t.ok(m, 'the ready line')
  t.match(pr.err(), new RegExp(`vLLM KV events on ZMQ tcp://127\\.0\\.0\\.1:${base}, replay tcp://127\\.0\\.0\\.1:${base + 2} \\(port \\+ engine index\\)`))
  const prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
  const r = await fetch(`${(m as RegExpMatchArray)[2]}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 2 }),
  })
  t.equal(r.status, 200)
  await r.arrayBuffer()
  // the second engine: port + 1, replay port + 1, the whole buffer replayed at the start
  const decoder = new EngineEventDecoder(4)
  const stored: unknown[] = []
  const l = ZmqListener.start(
    { workerId: 1n, dpRank: 0, endpoint: `tcp://127.0.0.1:${base + 1}`, replay: `tcp://127.0.0.1:${base + 3}`, topic: 'kv-events' },
    {
      batch: (_s, _seq, payload) => {
        for (const ev of decoder.decodeBatch(payload).events) if ((ev as { type?: string }).type === 'BlockStored') stored.push(ev)
      },
      restarted: () => undefined,
      state: () => undefined,
    },
  )
  t.teardown(() => l.close())
  await waitUntil('the replayed BlockStored', () => stored.length > 0, 5000)
  t.match(stored[0], { type: 'BlockStored', parent_block_hash: null, token_ids: prompt.slice(0, 8), block_size: 4, medium: 'GPU' })
  pr.p.kill('SIGTERM')
  t.equal(await pr.exited, 0)
})

t.test('--nats-url --etcd-url: ready once registered; SIGTERM revokes the leases', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const mocker = run(['mocker', '--nats-url', nats.url, '--etcd-url', etcd.url, '--num-workers', '3', '--speedup-ratio', '0', '--namespace', 'ns2'])
  t.teardown(() => mocker.p.kill('SIGKILL'))
  await ready(mocker, /^kv-router mocker: ready 3 engine\(s\)( http:\/\/\S+){3}\n/)
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const keys = await client.getAll().prefix('v1/').keys()
  t.equal(keys.filter((k) => k.startsWith('v1/instances/ns2/backend/generate/')).length, 3, 'registered before the ready line')
  t.equal(keys.filter((k) => k.startsWith('v1/mdc/ns2/backend/generate/')).length, 3)
  mocker.p.kill('SIGINT')
  t.equal(await mocker.exited, 0)
  t.same(await client.getAll().prefix('v1/').keys(), [], 'leases revoked')
  const unreachable = run(['mocker', '--etcd-url', 'http://127.0.0.1:1'])
  t.equal(await unreachable.exited, 2)
  t.match(unreachable.err(), /^kv-router: mocker: cannot reach etcd at http:\/\/127\.0\.0\.1:1/)
})
