// Each worker-rank's learned engine model as GET /v1/workers, GET /v1/status and /metrics show it:
// the prior before any traffic (source `prior`, speeds 1, no samples), one series per worker-rank
// that leaves with its worker, and nothing at all while learning is off (--no-router-learn-engines,
// or the dynamo cost); and the model moved by streamed requests to a fast and a slow engine.
import t from 'tap'
import { randomBytes } from 'node:crypto'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { parseProfileList } from '../../src/sim/mocker/profiles.js'
import { BytesTokenizer } from '../../src/tokenizer/tokenizer.js'
import { harness, listening, metricSum } from './helpers.js'
import type { Harness } from './helpers.js'

const ENGINE_SERIES = ['kvrouter_worker_prefill_speed', 'kvrouter_worker_decode_speed', 'kvrouter_worker_engine_samples_total', 'kvrouter_worker_engine_spread']

interface EngineModel {
  source: { prefill: string; decode: string }
  prefill: { a_ms_per_token2: number; b_ms_per_token: number; c_ms: number }
  decode: { base_ms: number; rise_ms: number }
  prefill_speed: number
  decode_speed: number
  samples: { ttft: number; itl: number }
  spread: { ttft: number | null; itl: number | null }
}
interface Rank {
  dp_rank: number
  engine_model: EngineModel | null
}

async function ranks(h: Harness, url = '/v1/workers'): Promise<Map<string, Rank[]>> {
  const r = await h.app.fastify.inject({ method: 'GET', url })
  const body = r.json() as { workers: { id_str: string; ranks: Rank[] }[] }
  return new Map(body.workers.map((w) => [w.id_str, w.ranks]))
}

/** The samples of the learned-engine series on /metrics, as `name{labels} value` lines. */
async function engineSeries(h: Harness): Promise<string[]> {
  const body = (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  return body.split('\n').filter((l) => ENGINE_SERIES.some((n) => l.startsWith(`${n}{`)))
}

async function twoWorkers(h: Harness): Promise<void> {
  await h.router.addWorker({ id: 7n, url: 'http://127.0.0.1:9' })
  await h.router.addWorker({ id: 8n, url: 'http://127.0.0.1:9', dpRanks: 2 })
}

for (const [name, argv] of [
  ['--no-router-learn-engines', ['--no-router-learn-engines']],
  ['--router-cost dynamo', ['--router-cost', 'dynamo']],
] as const) {
  t.test(`${name}: no engine model anywhere`, async (t) => {
    const h = await harness([...argv])
    t.teardown(() => h.close())
    await twoWorkers(h)
    for (const url of ['/v1/workers', '/v1/status']) {
      const all = await ranks(h, url)
      t.equal(all.size, 2, url)
      for (const [id, rs] of all) for (const r of rs) t.equal(r.engine_model, null, `${url}: worker ${id} rank ${r.dp_rank}`)
    }
    t.same(await engineSeries(h), [], 'no learned-engine series on /metrics')
  })
}

t.test('learning on: the prior before any traffic, per worker-rank, in the API and /metrics', async (t) => {
  const h = await harness([])
  t.teardown(() => h.close())
  await twoWorkers(h)
  for (const url of ['/v1/workers', '/v1/status']) {
    const all = await ranks(h, url)
    t.same(
      [...all].map(([id, rs]) => [id, rs.length]),
      [
        ['7', 1],
        ['8', 2],
      ],
    )
    for (const [id, rs] of all)
      for (const r of rs) {
        const m = r.engine_model
        if (m === null) {
          t.fail(`${url}: worker ${id} rank ${r.dp_rank} has no engine model`)
          continue
        }
        t.same(m.source, { prefill: 'prior', decode: 'prior' }, `${url}: worker ${id} rank ${r.dp_rank}: the prior`)
        t.equal(m.prefill_speed, 1)
        t.equal(m.decode_speed, 1)
        t.same(m.samples, { ttft: 0, itl: 0 })
        for (const v of [m.prefill.a_ms_per_token2, m.prefill.b_ms_per_token, m.prefill.c_ms, m.decode.base_ms, m.decode.rise_ms]) t.type(v, 'number')
        t.ok(m.prefill.b_ms_per_token > 0 && m.decode.base_ms > 0, 'a model that costs time')
      }
  }
  const series = await engineSeries(h)
  for (const [id, rank] of [
    ['7', '0'],
    ['8', '0'],
    ['8', '1'],
  ]) {
    const of = (name: string, kind?: string) =>
      series.filter(
        (l) =>
          l.startsWith(`${name}{`) &&
          l.includes(`worker_id="${id}"`) &&
          l.includes(`dp_rank="${rank}"`) &&
          (kind === undefined || l.includes(`kind="${kind}"`)),
      )
    t.same(
      of('kvrouter_worker_prefill_speed').map((l) => Number(l.split(' ').pop())),
      [1],
      `worker ${id} rank ${rank}: prefill speed 1`,
    )
    t.same(
      of('kvrouter_worker_decode_speed').map((l) => Number(l.split(' ').pop())),
      [1],
    )
    for (const kind of ['ttft', 'itl'])
      t.same(
        of('kvrouter_worker_engine_samples_total', kind).map((l) => Number(l.split(' ').pop())),
        [0],
        `no ${kind} samples yet`,
      )
  }
  // a worker that leaves takes its series along
  await h.router.removeWorker(8n)
  const after = await engineSeries(h)
  t.same(
    after.filter((l) => l.includes('worker_id="8"')),
    [],
    'worker 8 is gone from /metrics',
  )
  t.ok(
    after.some((l) => l.startsWith('kvrouter_worker_prefill_speed{') && l.includes('worker_id="7"')),
    'worker 7 stays',
  )
})

t.test('observations move the model: streamed requests to a fast and a slow engine', async (t) => {
  const h = await harness(['--router-block-size', '16'], new BytesTokenizer())
  t.teardown(() => h.close())
  // engine 1 runs the default model, engine 2 the same at 0.3 of its speed
  const fleet = await MockerFleet.start({
    numWorkers: 2,
    blockSize: 16,
    engineProfiles: parseProfileList('default,default@0.3'),
    onEvent: (ev) => h.router.ingestEvent(ev),
  })
  t.teardown(() => fleet.close())
  for (const w of fleet.workers) await h.router.addWorker({ id: w.workerId, url: w.url, eventsInProcess: true })
  const [fast, slow] = fleet.workers.map((w) => w.workerId.toString()) as [string, string]
  const base = `http://127.0.0.1:${await listening(h)}`
  const model = async (id: string): Promise<EngineModel> => ((await ranks(h)).get(id)?.[0]?.engine_model ?? null) as EngineModel
  // one request at a time: each sees an idle fleet, so while the two look alike some go to each
  for (let i = 0; i < 40; i++) {
    const content = randomBytes(1500)
      .toString('base64')
      .slice(0, 600 + ((i * 997) % 1800))
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content }], max_tokens: 4, stream: true }),
    })
    t.equal(r.status, 200)
    await r.text()
  }
  const f = await model(fast)
  const s = await model(slow)
  t.comment(`prefill speed: fast ${f.prefill_speed} (${f.samples.ttft} TTFTs), slow ${s.prefill_speed} (${s.samples.ttft})`)
  // the slow one is sent requests while it looks as fast as the other, until its own model is learned
  t.equal(s.source.prefill, 'learned', "the slow engine's prefill is learned")
  t.ok(s.samples.ttft >= 8 && s.samples.itl > 0, 'from its own requests')
  t.ok(s.prefill_speed < 0.7 * f.prefill_speed, `slow ${s.prefill_speed} well below fast ${f.prefill_speed}`)
  t.ok(s.spread.ttft !== null && s.spread.ttft > 0, 'with its spread')
  // /metrics says the same
  t.equal(await metricSum(h, 'kvrouter_worker_prefill_speed', { worker_id: slow }), s.prefill_speed)
  t.equal(await metricSum(h, 'kvrouter_worker_decode_speed', { worker_id: slow }), s.decode_speed)
  t.equal(await metricSum(h, 'kvrouter_worker_engine_samples_total', { worker_id: slow, kind: 'ttft' }), s.samples.ttft)
  t.equal(await metricSum(h, 'kvrouter_worker_engine_samples_total', { worker_id: fast, kind: 'itl' }), f.samples.itl)
  t.equal(await metricSum(h, 'kvrouter_worker_engine_spread', { worker_id: slow, kind: 'ttft' }), s.spread.ttft)
})
