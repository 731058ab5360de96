// Engines' own KV events as processes: `kv-router mocker` engines publishing vLLM-style over ZMQ
// (PUB + replay ROUTER, port + engine index), `kv-router serve` given them with
// --worker ID=URL,kv-events=…,replay=…. The router starts after the engines served requests
// (it catches up through the replay sockets); then requests with shared prefixes go through
// the router. Its index (GET /v1/kv/dump) must hold, per worker, exactly the blocks each
// engine's pool holds (its worker query's TreeDump), and a repeated prompt is a cache hit on
// the same worker.
import t from 'tap'
import type { Test } from 'tap'
import { runCli as run } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'
import { waitUntil } from '../helpers/wait.js'

const BS = 16

/** block_hash values of the Stored events in a JSON answer, as decimal strings. */
function storedHashes(json: string): Set<string> {
  // read from the text: JSON.parse would round hashes above 2^53
  const out = new Set<string>()
  for (const m of json.matchAll(/"block_hash":(\d+)/g)) out.add(m[1] as string)
  return out
}

async function ready(p: CliProcess, re: RegExp, what: string): Promise<RegExpExecArray> {
  let code: number | null | undefined
  void p.exited.then((c) => (code = c))
  await waitUntil(`${what} (${p.err()})`, () => re.test(p.out()) || code !== undefined, 20_000)
  const m = re.exec(p.out())
  if (m === null) throw new Error(`${what}: exited ${String(code)}: ${p.err()}`)
  return m
}

/** The mocker on a random free pair of port ranges (PUB base, base + 1; replay base + 2, base + 3). */
async function mocker(t: Test): Promise<{ base: number; urls: string[] }> {
  for (let attempt = 0; ; attempt++) {
    const base = 20000 + Math.floor(Math.random() * 10000) * 4
    const p = run([
      'mocker',
      '--num-workers',
      '2',
      '--first-worker-id',
      '1',
      '--block-size',
      String(BS),
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
    t.teardown(async () => {
      p.p.kill('SIGTERM')
      await p.exited
    })
    try {
      const m = await ready(p, /^kv-router mocker: ready 2 engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/, 'mocker ready')
      return { base, urls: [m[1] as string, m[2] as string] }
    } catch (err) {
      // a port someone else holds: another base
      if (attempt > 5 || !/cannot bind/.test(p.err())) throw err
    }
  }
}

async function complete(url: string, prompt: string): Promise<{ worker: number; cached: number }> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 4 }),
  })
  if (r.status !== 200) throw new Error(`${url}: ${r.status} ${await r.text()}`)
  const j = (await r.json()) as { usage?: { prompt_tokens_details?: { cached_tokens: number } }; nvext?: { worker_id?: { decode_worker_id: number } } }
  return { worker: j.nvext?.worker_id?.decode_worker_id ?? -1, cached: j.usage?.prompt_tokens_details?.cached_tokens ?? 0 }
}

/** '' when the router's index holds, per worker, the blocks its engine's pool holds; else what differs. */
async function compare(base: string, urls: string[]): Promise<string> {
  for (let i = 0; i < urls.length; i++) {
    const id = i + 1
    const r = await fetch(`${urls[i]}/v1/kv/query`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"worker_id":${id},"start_event_id":null,"end_event_id":null}`,
    })
    if (r.status !== 200) return `engine ${id} answers ${r.status}`
    const pool = storedHashes(await r.text())
    const index = storedHashes(await (await fetch(`${base}/v1/kv/dump?worker_id=${id}`)).text())
    if (pool.size === 0 || pool.size !== index.size || [...pool].some((h) => !index.has(h)))
      return `worker ${id}: pool ${pool.size} blocks, index ${index.size}`
  }
  return ''
}

const shared = [
  'You are a careful assistant. Answer the question about the cache in one line. ',
  'System: the KV router keeps an index of which engine holds which prompt prefix; ',
]

t.test('serve reads mocker engines over ZMQ: caught up through replay, then exact, and prefixes hit', async (t) => {
  const { base: port, urls } = await mocker(t)
  // served before the router exists: only the replay sockets can tell it
  for (let i = 0; i < 6; i++) await complete(urls[i % 2] as string, `${shared[i % 2]}early question ${i} about blocks`)

  const router = run([
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
    `1=${urls[0]},kv-events=tcp://127.0.0.1:${port},replay=tcp://127.0.0.1:${port + 2}`,
    '--worker',
    `2=${urls[1]},kv-events=tcp://127.0.0.1:${port + 1},replay=tcp://127.0.0.1:${port + 3}`,
  ])
  t.teardown(async () => {
    router.p.kill('SIGTERM')
    await router.exited
  })
  const base = (await ready(router, /listening on (http:\/\/\S+)/, 'router listening'))[1] as string

  let mismatch = ''
  await waitUntil('the router caught up through the replay sockets', async () => (mismatch = await compare(base, urls)) === '', 15_000, 50)
  t.equal(mismatch, '', 'caught up: every worker, index and pool hold the same blocks')

  const results = []
  for (let i = 0; i < 24; i++) results.push(await complete(base, `${shared[i % 2]}question ${i % 7} about routing and caches`))
  t.equal(new Set(results.map((r) => r.worker)).size, 2, 'both engines served')
  await waitUntil('the index equals the pools', async () => (mismatch = await compare(base, urls)) === '', 15_000, 50)
  t.equal(mismatch, '', 'after requests through the router: index and pool hold the same blocks')

  const prompt = 'A prompt long enough to fill a few blocks of sixteen bytes, asked twice through the router.'
  const a = await complete(base, prompt)
  await waitUntil('its blocks indexed', async () => (await compare(base, urls)) === '', 15_000, 50)
  const b = await complete(base, prompt)
  t.equal(b.worker, a.worker, 'routed where the prefix is')
  t.equal(b.cached, Math.floor(Buffer.byteLength(prompt) / BS) * BS, 'a cache hit of every whole block')

  const workers = (await (await fetch(`${base}/v1/workers`)).json()) as { workers: { id: number; index: string; ranks: { index: string }[] }[] }
  t.same(
    workers.workers.map((w) => [w.id, w.index, w.ranks.map((r) => r.index)]),
    [
      [1, 'exact', ['exact']],
      [2, 'exact', ['exact']],
    ],
  )
  const metrics = await (await fetch(`${base}/metrics`)).text()
  t.match(metrics, /kvrouter_zmq_total\{what="batches"\} [1-9]/)
  t.match(metrics, /kvrouter_zmq_total\{what="sink_errors"\} 0\n/)
})
