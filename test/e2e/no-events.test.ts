// A static fleet whose engines publish no KV events: two `kv-router mocker` engines given to
// `kv-router serve` as `--worker URL`, no NATS, no ZMQ. Neither is `exact`: both are `no-events`,
// each warned about once, and routed on predictions, so prompts that share a prefix stay on one
// engine and hit its cache (the engine's own answer says how many tokens were cached).
import t from 'tap'
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

t.test('workers without events: no-events, warned once each, routed on predictions', async (t) => {
  const engines = run(['mocker', '--num-workers', '2', '--block-size', String(BS), '--speedup-ratio', '0', '--host', '127.0.0.1', '--http-port', '0'])
  t.teardown(async () => {
    engines.p.kill('SIGTERM')
    await engines.exited
  })
  const m = await ready(engines, /^kv-router mocker: ready 2 engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/, 'mocker ready')
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
    m[1] as string,
    '--worker',
    m[2] as string,
  ])
  t.teardown(async () => {
    router.p.kill('SIGTERM')
    await router.exited
  })
  const base = (await ready(router, /listening on (http:\/\/\S+)/, 'router listening'))[1] as string

  const workers = (await (await fetch(`${base}/v1/workers`)).json()) as { workers: { index: string; ranks: { index: string }[] }[] }
  t.same(
    workers.workers.map((w) => [w.index, w.ranks.map((r) => r.index)]),
    [
      ['no-events', ['no-events']],
      ['no-events', ['no-events']],
    ],
    'neither is called exact',
  )
  t.match(await (await fetch(`${base}/metrics`)).text(), /^kvrouter_worker_ranks_no_events 2$/m, 'counted')

  // six prompts sharing a 320-byte prefix (20 blocks), one after the other
  const prefix = 'You are a careful assistant who answers in one line. The router has no KV events from these engines, '.repeat(4).slice(0, 320)
  const results = []
  for (let i = 0; i < 6; i++) results.push(await complete(base, `${prefix}question ${i}: which engine holds this prefix?`))
  t.equal(new Set(results.map((r) => r.worker)).size, 1, `shared prefixes stay on one engine (went to ${results.map((r) => r.worker).join(',')})`)
  t.equal(results[0]?.cached, 0, 'the first is a miss')
  for (let i = 1; i < 6; i++) t.ok((results[i]?.cached ?? 0) >= 320, `request ${i} hits the engine's cache (${results[i]?.cached} tokens)`)

  // an unrelated prompt may go anywhere; the load still spreads: a burst of distinct prompts uses both
  const burst = await Promise.all(
    Array.from({ length: 8 }, (_, i) => complete(base, `Distinct prompt number ${i} with nothing shared, long enough for blocks ${'x'.repeat(40 + i)}`)),
  )
  t.equal(new Set(burst.map((r) => r.worker)).size, 2, 'unrelated prompts spread over both engines')

  const warned = router.err().match(/KVR_WORKER_NO_EVENTS/g) ?? []
  t.equal(warned.length, 2, `one warning per worker:\n${router.err()}`)
  t.match(router.err(), /has no KV event source/)
})
