// Router replicas on one shared index, as processes: `kv-router mocker` engines publishing over
// ZMQ, one `kv-router indexer`, and two `kv-router serve --indexer-url` replicas given the engines
// with their ZMQ endpoints. The replicas register the engines with the indexer and read no KV
// event themselves. A prompt served through replica A is found by replica B, which never saw it,
// on the worker that cached it: only the remote index can tell B. With the indexer killed, both
// keep answering (on their own predictions) and count the fallbacks; with it started again on
// its port, they tell it the engines again and route on it again. Replica B lists a dead indexer
// URL before the live one: it fails over within the deadline.
import t from 'tap'
import type { Test } from 'tap'
import { runCli as run } from '../helpers/cli.js'
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

function stopOnTeardown(t: Test, p: CliProcess): void {
  t.teardown(async () => {
    p.p.kill('SIGTERM')
    await p.exited
  })
}

/** Two engines on a random free base: PUB base, base + 1; replay base + 2, base + 3. */
async function mocker(t: Test): Promise<{ base: number; urls: string[] }> {
  for (let attempt = 0; ; attempt++) {
    const base = 20000 + Math.floor(Math.random() * 10000) * 4
    const p = run([
      'mocker',
      '--num-workers=2',
      '--first-worker-id=1',
      `--block-size=${BS}`,
      '--speedup-ratio=0',
      '--host=127.0.0.1',
      '--http-port=0',
      `--kv-events-zmq=tcp://127.0.0.1:${base}`,
      `--kv-events-replay-zmq=tcp://127.0.0.1:${base + 2}`,
    ])
    stopOnTeardown(t, p)
    try {
      const m = await ready(p, /^kv-router mocker: ready 2 engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/, 'mocker ready')
      return { base, urls: [m[1] as string, m[2] as string] }
    } catch (err) {
      if (attempt > 5 || !/cannot bind/.test(p.err())) throw err
    }
  }
}

async function indexer(t: Test, port: number): Promise<{ p: CliProcess; url: string }> {
  const p = run(['indexer', '--host=127.0.0.1', `--port=${port}`])
  stopOnTeardown(t, p)
  const url = (await ready(p, /kv-router indexer: ready (http:\/\/\S+)/, 'indexer ready'))[1] as string
  return { p, url }
}

async function replica(t: Test, indexerUrl: string, base: number, urls: string[]): Promise<{ p: CliProcess; url: string }> {
  const p = run([
    'serve',
    '--http-host=127.0.0.1',
    '--http-port=0',
    `--router-block-size=${BS}`,
    '--tokenizer=bytes',
    '--router-event-threads=1',
    `--indexer-url=${indexerUrl}`,
    // generous for a shared 2-core test machine; the default is 20 ms
    '--indexer-timeout-ms=1000',
    '--worker',
    `1=${urls[0]},kv-events=tcp://127.0.0.1:${base},replay=tcp://127.0.0.1:${base + 2}`,
    '--worker',
    `2=${urls[1]},kv-events=tcp://127.0.0.1:${base + 1},replay=tcp://127.0.0.1:${base + 3}`,
  ])
  stopOnTeardown(t, p)
  const url = (await ready(p, /listening on (http:\/\/\S+)/, 'replica listening'))[1] as string
  return { p, url }
}

/** The sum of a metric's series whose labels contain `labels`, from GET /metrics. */
async function metric(base: string, name: string, labels = ''): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text()
  let sum = 0
  for (const line of text.split('\n')) {
    if (!line.startsWith(name) || (line[name.length] !== '{' && line[name.length] !== ' ')) continue
    if (labels !== '' && !line.includes(labels)) continue
    sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return sum
}

async function complete(url: string, prompt: string): Promise<number> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 2 }),
  })
  if (r.status !== 200) throw new Error(`${url}: ${r.status} ${await r.text()}`)
  const j = (await r.json()) as { nvext?: { worker_id?: { decode_worker_id: number } } }
  return j.nvext?.worker_id?.decode_worker_id ?? -1
}

/** A routing decision for the prompt (its UTF-8 bytes are the tokens), not booked. */
async function route(url: string, prompt: string): Promise<{ worker: number; overlap: number }> {
  const r = await fetch(`${url}/v1/route`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token_ids: [...Buffer.from(prompt, 'utf8')] }),
  })
  if (r.status !== 200) throw new Error(`${url}/v1/route: ${r.status} ${await r.text()}`)
  const j = (await r.json()) as { worker_id: number; overlap_blocks: number }
  return { worker: j.worker_id, overlap: j.overlap_blocks }
}

async function remoteIndex(url: string): Promise<{ reachable: boolean; exact: boolean } | null> {
  const j = (await (await fetch(`${url}/ready`)).json()) as { remote_index: { reachable: boolean; exact: boolean } | null }
  return j.remote_index
}

// the tag first: prompts share no leading block, so an overlap names the one prompt asked
const prompt = (tag: string): string => `${tag}: a prompt long enough for several blocks of sixteen bytes, asked twice over.`

t.test('two replicas on one kv-router indexer: exact through it, approximate without it, exact again', async (t) => {
  const { base, urls } = await mocker(t)
  let idx = await indexer(t, 0)
  const indexerPort = Number(new URL(idx.url).port)
  const a = await replica(t, idx.url, base, urls)
  // B lists a dead indexer first (nothing listens on port 9): it is skipped for the live one
  const dead = 'http://127.0.0.1:9'
  const b = await replica(t, `${dead},${idx.url}`, base, urls)

  // the replicas registered the engines with the indexer (each rank once; the second replica's are 409s)
  await waitUntil(
    'the indexer lists both engines',
    async () => {
      const r = await fetch(`${idx.url}/workers`)
      const text = await r.text()
      return r.status === 200 && /"instance_id":1\b/.test(text) && /"instance_id":2\b/.test(text)
    },
    10_000,
    50,
  )

  // served through A; B has never seen it, so an overlap at B comes from the shared index
  const first = prompt('the first topic')
  const served = await complete(a.url, first)
  t.ok(served === 1 || served === 2, `replica A sent it to an engine (${served})`)
  let atB = { worker: -1, overlap: 0 }
  await waitUntil('replica B finds the prompt cached through the remote index', async () => (atB = await route(b.url, first)).overlap > 0, 10_000, 50)
  t.equal(atB.worker, served, 'B routes the repeated prompt to the engine that caches it')
  t.ok(atB.overlap >= 3, `with its cached blocks as overlap (${atB.overlap})`)
  t.ok((await metric(b.url, 'kvrouter_indexer_queries_total', 'result="ok"')) > 0, "B's queries were answered")
  t.equal(await metric(b.url, 'kvrouter_indexer_up', `url="${dead}"`), 0, 'the dead URL is down')
  t.equal(await metric(b.url, 'kvrouter_indexer_up', `url="${idx.url}"`), 1, 'and the live one, which answered in its stead, up')
  t.match(await remoteIndex(b.url), { reachable: true, exact: true }, '/ready: the remote index is reachable and exact')
  for (const r of [a, b]) {
    t.equal(await metric(r.url, 'kvrouter_zmq_total', 'what="batches"'), 0, 'the replica read no ZMQ batch itself')
    const status = (await (await fetch(`${r.url}/v1/status`)).json()) as { router: { kv_events: boolean; remote_index: { urls: { up: boolean }[] } } }
    t.equal(status.router.kv_events, false, 'and consumes no KV events: /v1/status')
    t.same(
      status.router.remote_index.urls.map((u) => u.up),
      r === a ? [true] : [false, true],
      'which names each indexer URL, up or not',
    )
  }

  // the indexer gone: both replicas keep routing, on their own predictions, and count it
  idx.p.p.kill('SIGKILL')
  await idx.p.exited
  const fallbacksBefore =
    (await metric(b.url, 'kvrouter_indexer_queries_total', 'result="error"')) +
    (await metric(b.url, 'kvrouter_indexer_queries_total', 'result="timeout"')) +
    (await metric(b.url, 'kvrouter_indexer_queries_total', 'result="unavailable"'))
  for (const r of [a, b]) {
    const d = await route(r.url, prompt('a question while the indexer is down'))
    t.ok(d.worker === 1 || d.worker === 2, 'a replica without its indexer still decides')
    t.equal((await complete(r.url, prompt('a completion while the indexer is down'))) > 0, true, 'and serves completions')
  }
  const fallbacksAfter =
    (await metric(b.url, 'kvrouter_indexer_queries_total', 'result="error"')) +
    (await metric(b.url, 'kvrouter_indexer_queries_total', 'result="timeout"')) +
    (await metric(b.url, 'kvrouter_indexer_queries_total', 'result="unavailable"'))
  t.ok(fallbacksAfter >= fallbacksBefore + 2, `the fallbacks are counted (${fallbacksBefore} → ${fallbacksAfter})`)
  const down = await remoteIndex(b.url)
  t.equal(down?.exact, false, '/ready says the remote index is not exact')
  t.equal((await fetch(`${b.url}/ready`)).status, 200, 'and the replica stays ready')

  // started again on its port: the replicas find it, tell it the engines again, and route on it
  idx = await indexer(t, indexerPort)
  await waitUntil(
    'the replicas registered the engines again',
    async () => /"instance_id":2\b/.test(await (await fetch(`${idx.url}/workers`)).text()),
    10_000,
    50,
  )
  const second = prompt('the second topic, after the restart')
  const served2 = await complete(a.url, second)
  let again = { worker: -1, overlap: 0 }
  await waitUntil('replica B routes on the restarted indexer', async () => (again = await route(b.url, second)).overlap > 0, 10_000, 50)
  t.equal(again.worker, served2, 'B finds the new prompt on the engine that caches it')
  t.equal((await remoteIndex(b.url))?.exact, true, '/ready: exact again')
})
