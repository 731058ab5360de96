// Storage tiers end to end: `kv-router mocker` engines with a host offload tier (--num-cpu-blocks)
// and a device pool small enough that a prompt is pushed out of it into the host tier, publishing
// vLLM-style over ZMQ (`medium: "CPU"` for the host tier). The same engines are read by
// `kv-router indexer`, whose /query answers the host-tier match (`cpu`) beyond the device one
// (`gpu`), and by `kv-router serve`, whose /v1/route explains the host-tier match (`host_blocks`)
// and prefers the worker holding the prompt there to one holding nothing. The engine's worker
// query (its tree dump, what a router recovers from) carries the host-tier blocks with their tier.
//
// The answer shapes are checked in test/e2e/indexer.test.ts and test/http/route-tiers.test.ts
// against their sources; here only the tiers' figures.
import t from 'tap'
import type { Test } from 'tap'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'
import { runCli } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'
import { waitUntil } from '../helpers/wait.js'

const BS = 16

async function ready(p: CliProcess, re: RegExp, what: string): Promise<RegExpExecArray> {
  let code: number | null | undefined
  void p.exited.then((c) => (code = c))
  await waitUntil(`${what} (${p.err()})`, () => re.test(p.out()) || code !== undefined, 20_000)
  const m = re.exec(p.out())
  if (m === null) throw new Error(`${what}: exited ${String(code)}: ${p.err()}`)
  return m
}

function stopAtEnd(t: Test, p: CliProcess): void {
  t.teardown(async () => {
    p.p.kill('SIGTERM')
    await p.exited
  })
}

/** Two engines of 8 device and 32 host blocks: PUB on base, base + 1; replay on base + 2, base + 3. */
async function mocker(t: Test): Promise<{ base: number; urls: string[] }> {
  for (let attempt = 0; ; attempt++) {
    const base = 20000 + Math.floor(Math.random() * 10000) * 4
    const p = runCli([
      'mocker',
      '--num-workers',
      '2',
      '--first-worker-id',
      '1',
      '--block-size',
      String(BS),
      '--num-gpu-blocks-override',
      '8',
      '--num-cpu-blocks',
      '32',
      '--speedup-ratio',
      '0',
      '--host',
      '127.0.0.1',
      '--http-port',
      '0',
      '--kv-events-zmq',
      `tcp://127.0.0.1:${base}`,
      '--kv-events-replay-zmq',
      `tcp://127.0.0.1:${base + 2}`,
    ])
    stopAtEnd(t, p)
    try {
      const m = await ready(p, /^kv-router mocker: ready 2 engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/, 'mocker ready')
      // stderr and stdout are separate pipes: the startup line may come after the ready line
      await waitUntil('the mocker names its host tier', () => /8 blocks and 32 host blocks each/.test(p.err()), 5000)
      t.match(p.err(), /8 blocks and 32 host blocks each/, 'the mocker names its host tier')
      return { base, urls: [m[1] as string, m[2] as string] }
    } catch (err) {
      // a port someone else holds: another base
      if (attempt > 10 || !/cannot bind/.test(p.err())) throw err
    }
  }
}

async function post(url: string, body: object): Promise<{ status: number; text: string; json: unknown }> {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
  const text = await r.text()
  return { status: r.status, text, json: JSON.parse(text) as unknown }
}

async function complete(url: string, tokens: number[]): Promise<number> {
  const r = await post(`${url}/v1/completions`, { prompt: tokens, max_tokens: 2 })
  if (r.status !== 200) throw new Error(`${url}: ${r.status} ${r.text}`)
  return (r.json as { usage: { prompt_tokens_details?: { cached_tokens: number } } }).usage.prompt_tokens_details?.cached_tokens ?? 0
}

const seq = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i)

interface Candidate {
  worker_id: number
  device_blocks: number
  host_blocks: number
  overlap_blocks: number
}

t.test('host-tier blocks of mocker engines, through kv-router indexer and kv-router serve', async (t) => {
  const eng = await mocker(t)
  const ep = (i: number): string => `tcp://127.0.0.1:${eng.base + i}`
  const rep = (i: number): string => `tcp://127.0.0.1:${eng.base + 2 + i}`

  // engine 0 serves the prompt (4 blocks), then two others of 6 blocks each: its 8 device blocks
  // cannot keep the prompt, which goes to its host tier. Engine 1 never sees the prompt.
  const prompt = seq(1, 64)
  await complete(eng.urls[0] as string, prompt)
  await complete(eng.urls[0] as string, seq(1000, 96))
  await complete(eng.urls[0] as string, seq(2000, 96))
  await complete(eng.urls[1] as string, seq(3000, 96))

  // the readers start after: the replay sockets give them the whole history
  const ix = runCli(['indexer', '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--log-level', 'warn'])
  stopAtEnd(t, ix)
  const router = runCli([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-block-size',
    String(BS),
    '--tokenizer',
    'bytes',
    '--router-event-threads',
    '1',
    '--worker',
    `1=${eng.urls[0]},kv-events=${ep(0)},replay=${rep(0)}`,
    '--worker',
    `2=${eng.urls[1]},kv-events=${ep(1)},replay=${rep(1)}`,
  ])
  stopAtEnd(t, router)
  const [ixm, rm] = await Promise.all([
    ready(ix, /^kv-router indexer: ready (http:\/\/\S+)\n/, 'indexer ready'),
    ready(router, /listening on (http:\/\/\S+)/, 'router listening'),
  ])
  const indexer = ixm[1] as string
  const base = rm[1] as string

  await t.test('the engine: the prompt left the device for the host tier, and its tree dump says so', async (t) => {
    const stats = (await (await fetch(`${eng.urls[0]}/stats`)).json()) as { pool: { host?: { used: number; capacity: number; stored: number } } }
    t.equal(stats.pool.host?.capacity, 32)
    t.ok((stats.pool.host?.used ?? 0) >= 4, `the host tier holds blocks (${stats.pool.host?.used})`)
    const dump = await post(`${eng.urls[0]}/v1/kv/query`, { worker_id: 1, start_event_id: null, end_event_id: null })
    t.equal(dump.status, 200)
    const hashes = [...computeSequenceHashes(computeBlockHashes(prompt, BS))]
    // read from the text, one event at a time: JSON.parse rounds hashes above 2^53
    const host = new Set<string>()
    for (const ev of dump.text.split('{"worker_id":').slice(1)) {
      if (!ev.includes('"storage_tier":"host_pinned"')) continue
      for (const m of ev.matchAll(/"block_hash":(\d+)/g)) host.add(m[1] as string)
    }
    t.same(
      hashes.map((h) => host.has(String(h))),
      [true, true, true, true],
      "every block of the prompt is in the tree dump's host tier",
    )
  })

  await t.test('kv-router indexer: /query answers cpu beyond gpu for the engine holding the prompt in its host tier', async (t) => {
    for (const [id, i] of [
      [1, 0],
      [2, 1],
    ] as const) {
      const r = await post(`${indexer}/register`, { instance_id: id, endpoint: ep(i), replay_endpoint: rep(i), model_name: 'm', block_size: BS })
      t.equal(r.status, 201, `engine ${i} registered`)
    }
    type Instances = Record<string, { gpu: number; cpu: number; disk: number; longest_matched: number }>
    let inst: Instances = {}
    // the history is replayed in order: wait for its end, where the device no longer holds the prompt
    await waitUntil('the indexer sees the host tier', async () => {
      inst = ((await post(`${indexer}/query`, { token_ids: prompt, model_name: 'm' })).json as { instances: Instances }).instances
      return inst['1']?.cpu === 64 && inst['1'].gpu === 0
    })
    const one = inst['1']
    t.same(one && [one.gpu, one.cpu, one.disk, one.longest_matched], [0, 64, 64, 64], 'engine 0: nothing on the device, 64 tokens with its host tier')
    t.equal(inst['2'], undefined, 'engine 1 holds nothing of it')
  })

  await t.test('kv-router serve: /v1/route explains host_blocks and chooses the worker holding them', async (t) => {
    let r: { worker_id: number; candidates: Candidate[] } = { worker_id: 0, candidates: [] }
    await waitUntil('the router sees the host tier', async () => {
      r = (await post(`${base}/v1/route`, { token_ids: prompt })).json as typeof r
      return r.candidates.some((c) => c.worker_id === 1 && c.host_blocks === 4 && c.device_blocks === 0)
    })
    const one = r.candidates.find((c) => c.worker_id === 1)
    const two = r.candidates.find((c) => c.worker_id === 2)
    t.same(one && [one.device_blocks, one.host_blocks, one.overlap_blocks], [0, 4, 3], 'worker 1: 4 host blocks, weighted 0.75 each')
    t.same(two && [two.device_blocks, two.host_blocks, two.overlap_blocks], [0, 0, 0], 'worker 2: nothing')
    t.equal(r.worker_id, 1, 'the host-tier prefix wins over nothing')
    // the router's lower tier comes to hold what the engine's host tier holds
    const stats = (await (await fetch(`${eng.urls[0]}/stats`)).json()) as { pool: { host: { used: number } } }
    let held = -1
    await waitUntil('the router holds the host tier', async () => {
      const workers = (await (await fetch(`${base}/v1/workers`)).json()) as { workers: { id: number; ranks: { lower_tier_blocks: number }[] }[] }
      held = workers.workers.find((w) => w.id === 1)?.ranks[0]?.lower_tier_blocks ?? -1
      return held === stats.pool.host.used
    })
    t.equal(held, stats.pool.host.used, "the router's host tier is the engine's")
  })

  await t.test('the prompt again on engine 0: loaded from the host tier, every block cached', async (t) => {
    t.equal(await complete(eng.urls[0] as string, prompt), 64)
    const stats = (await (await fetch(`${eng.urls[0]}/stats`)).json()) as { pool: { host: { loads: number } } }
    t.equal(stats.pool.host.loads, 4, 'four blocks loaded')
    // the device has them again: the router sees them there
    let device = -1
    await waitUntil('the router sees the device blocks', async () => {
      const r = (await post(`${base}/v1/route`, { token_ids: prompt })).json as { candidates: Candidate[] }
      device = r.candidates.find((c) => c.worker_id === 1)?.device_blocks ?? -1
      return device === 4
    })
    t.equal(device, 4, 'the device Stored of the loaded blocks reached the router')
  })
})
