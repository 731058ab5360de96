// Learned engine models with real processes: `kv-router serve` and a `kv-router mocker` process of
// two engines, one at full speed and one at 0.4 (`--engine-profile default,default@0.4`). Streamed
// chat requests of varied prompt lengths (prefill dominates) go through the router one at a time,
// so every decision sees an idle fleet. Under the fixed model the two engines then cost the same
// and share the requests; once the router has learned, GET /v1/workers orders the two by their
// true prefill speed and the slow one gets hardly any of the prompt tokens after the warm-up.
import t from 'tap'
import type { Test } from 'tap'
import { randomBytes } from 'node:crypto'
import { runCli, waitForOutput } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'

const BS = 16
const FAST = '1000'
const SLOW = '1001'
/** Requests of a run, and the first ones left out of the shares: the slow engine's model is learned within them. */
const REQUESTS = 64
const WARM_UP = 24

async function start(t: Test, args: string[], ready: RegExp): Promise<RegExpExecArray> {
  const c: CliProcess = runCli(args)
  t.teardown(async () => {
    c.p.kill('SIGTERM')
    await c.exited
  })
  const m = await Promise.race([waitForOutput(c, ready), new Promise<null>((r) => setTimeout(r, 30_000, null).unref())])
  if (m === null) throw new Error(`kv-router ${args[0]} did not start: ${c.out()} ${c.err()}`)
  return m
}

interface EngineModel {
  source: { prefill: string; decode: string }
  prefill_speed: number
  decode_speed: number
  samples: { ttft: number; itl: number }
}
interface Workers {
  workers: { id_str: string; ranks: { engine_model: EngineModel | null }[] }[]
}

/** A router (with `flags`) and a mocker fleet of a fast and a slow engine registered with it. */
async function fleet(t: Test, flags: string[]): Promise<string> {
  const router = await start(
    t,
    [
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
      ...flags,
    ],
    /listening on (http:\/\/\S+)/,
  )
  const base = router[1] as string
  await start(
    t,
    ['mocker', '--router-url', base, '--num-workers', '2', '--block-size', String(BS), '--engine-profile', 'default,default@0.4'],
    /kv-router mocker: ready 2 engine\(s\)/,
  )
  return base
}

/** One streamed chat request of a fresh prompt of `chars` bytes; the worker it went to. */
async function chat(base: string, chars: number): Promise<string> {
  // fresh text every time: no prefix cached anywhere, so each prompt is prefilled whole
  const content = randomBytes(Math.ceil((chars * 3) / 4))
    .toString('base64')
    .slice(0, chars)
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'kv-router-model', messages: [{ role: 'user', content }], max_tokens: 3, stream: true }),
  })
  if (r.status !== 200) throw new Error(`chat answered ${r.status}: ${await r.text()}`)
  await r.text()
  return r.headers.get('x-worker-id') ?? '?'
}

/** Sends the traffic, one request at a time; the prompt bytes each worker took after the warm-up. */
async function traffic(base: string): Promise<Map<string, number>> {
  const tokens = new Map<string, number>()
  for (let i = 0; i < REQUESTS; i++) {
    // 400 to 4,000 bytes, spread over the range
    const n = 400 + ((i * 1237) % 3600)
    const w = await chat(base, n)
    if (i >= WARM_UP) tokens.set(w, (tokens.get(w) ?? 0) + n)
  }
  return tokens
}

const share = (m: Map<string, number>, id: string): number => {
  let all = 0
  for (const v of m.values()) all += v
  return all === 0 ? 0 : (m.get(id) ?? 0) / all
}

async function models(base: string): Promise<Map<string, EngineModel | null>> {
  const w = (await (await fetch(`${base}/v1/workers`)).json()) as Workers
  return new Map(w.workers.map((x) => [x.id_str, x.ranks[0]?.engine_model ?? null]))
}

async function metricLines(base: string, name: string): Promise<string[]> {
  return (await (await fetch(`${base}/metrics`)).text()).split('\n').filter((l) => l.startsWith(`${name}{`))
}

let slowShareFixed = Number.NaN

t.test('--no-router-learn-engines: no engine model, and the two engines share the requests', async (t) => {
  const base = await fleet(t, ['--no-router-learn-engines'])
  const tokens = await traffic(base)
  const m = await models(base)
  t.same([...m.keys()].sort(), [FAST, SLOW])
  t.equal(m.get(FAST), null, 'no engine model while learning is off')
  t.equal(m.get(SLOW), null)
  t.same(await metricLines(base, 'kvrouter_worker_prefill_speed'), [], 'nor its series')
  slowShareFixed = share(tokens, SLOW)
  t.comment(`slow engine's share of the prompt tokens, fixed model: ${slowShareFixed.toFixed(3)}`)
  // both idle at every decision, alike to the fixed model: about half each
  t.ok(slowShareFixed > 0.2, `the slow engine took ${slowShareFixed.toFixed(3)} of the prompt tokens`)
})

t.test('learning: the slow engine is learned slower, and given hardly any prefill work', async (t) => {
  const base = await fleet(t, [])
  const before = await models(base)
  t.equal(before.get(SLOW)?.source.prefill, 'prior', 'the prior before any traffic')
  t.equal(before.get(SLOW)?.prefill_speed, 1)
  const tokens = await traffic(base)
  const m = await models(base)
  const fast = m.get(FAST) as EngineModel
  const slow = m.get(SLOW) as EngineModel
  t.comment(
    `learned prefill speeds: fast ${fast.prefill_speed.toFixed(3)} (${fast.samples.ttft} TTFTs), slow ${slow.prefill_speed.toFixed(3)} (${slow.samples.ttft})`,
  )
  // it was sent requests while it looked as fast as the other, until its own model was learned
  t.equal(slow.source.prefill, 'learned', "the slow engine's prefill is learned")
  t.equal(fast.source.prefill, 'learned')
  // the true ratio is 0.4: well below 1 even on a loaded machine, where both look slower
  t.ok(slow.prefill_speed < 0.75 * fast.prefill_speed, `slow ${slow.prefill_speed} < 0.75 × fast ${fast.prefill_speed}`)
  const slowShare = share(tokens, SLOW)
  t.comment(`slow engine's share of the prompt tokens after the warm-up, learned: ${slowShare.toFixed(3)}`)
  t.ok(slowShare < 0.1, `the slow engine took ${slowShare.toFixed(3)} of the prompt tokens`)
  if (Number.isFinite(slowShareFixed)) t.ok(slowShare < slowShareFixed - 0.1, `less than under the fixed model (${slowShareFixed.toFixed(3)})`)
  const speeds = await metricLines(base, 'kvrouter_worker_prefill_speed')
  t.equal(speeds.length, 2, '/metrics has a prefill speed per worker-rank')
  t.ok(
    speeds.some((l) => l.includes(`worker_id="${SLOW}"`) && Number(l.split(' ').pop()) === slow.prefill_speed),
    "the slow engine's, as GET /v1/workers says",
  )
})
