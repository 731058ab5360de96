// Predict-on-route with real mocker engines whose KV events reach the router late on purpose
// (3 s): a follow-up sent right after its parent goes to the parent's engine and hits its cache;
// without the prediction it goes by load to the other one; after the TTL the prediction is gone.
import t from 'tap'
import type { Test } from 'tap'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { BytesTokenizer } from '../../src/tokenizer/tokenizer.js'
import { harness } from '../http/helpers.js'
import type { Harness } from '../http/helpers.js'

const BS = 16
const EVENT_DELAY_MS = 3000
const json = { 'content-type': 'application/json' }

async function setup(t: Test, argv: string[]): Promise<Harness> {
  const h = await harness(['--router-block-size', String(BS), ...argv], new BytesTokenizer())
  t.teardown(() => h.close())
  const timers = new Set<NodeJS.Timeout>()
  const fleet = await MockerFleet.start({
    numWorkers: 2,
    blockSize: BS,
    speedupRatio: 10,
    onEvent: (ev) => {
      const timer = setTimeout(() => {
        timers.delete(timer)
        h.router.ingestEvent(ev)
      }, EVENT_DELAY_MS)
      timers.add(timer)
    },
  })
  t.teardown(async () => {
    for (const x of timers) clearTimeout(x)
    await fleet.close()
  })
  for (const w of fleet.workers) await h.router.addWorker({ id: w.workerId, url: w.url, eventsInProcess: true })
  // both engines have sent an event long before: exact, not predicted as workers without events are
  for (const w of fleet.workers) h.router.ingestEvent({ worker_id: w.workerId, event: { event_id: 0n, dp_rank: 0, data: 'cleared' } })
  await h.router.pool.flush()
  return h
}

const parent = 'The router has to send this conversation back to the engine that holds it. '.repeat(6)

async function complete(h: Harness, prompt: string, maxTokens: number): Promise<{ worker: number; cached: number }> {
  const r = await h.app.fastify.inject({ method: 'POST', url: '/v1/completions', headers: json, payload: JSON.stringify({ prompt, max_tokens: maxTokens }) })
  if (r.statusCode !== 200) throw new Error(`${r.statusCode} ${r.body}`)
  const j = r.json() as { usage?: { prompt_tokens_details?: { cached_tokens: number } }; nvext?: { worker_id?: { decode_worker_id: number } } }
  return { worker: j.nvext?.worker_id?.decode_worker_id ?? -1, cached: j.usage?.prompt_tokens_details?.cached_tokens ?? 0 }
}

/** The parent, still decoding (so it holds load), and a follow-up sent once its prefill is done. */
async function parentAndFollowUp(h: Harness) {
  const p = complete(h, parent, 200)
  await new Promise((r) => setTimeout(r, 300))
  const follow = await complete(h, `${parent}And a follow-up question about it.`, 4)
  return { parent: await p, follow }
}

t.test('with --router-predicted-ttl-secs the follow-up lands on the parent engine before its events arrive', async (t) => {
  const h = await setup(t, ['--router-predicted-ttl-secs', '5'])
  const { parent: p, follow } = await parentAndFollowUp(h)
  t.equal(follow.worker, p.worker, 'same engine')
  t.ok(follow.cached >= Math.floor(Buffer.byteLength(parent) / BS) * BS, `a cache hit of the parent's blocks (${follow.cached} tokens)`)
  t.equal(h.router.scheduler.stats().approximateBlocks, 0, 'nothing went into the index: the prediction stays in the scheduler')
})

t.test('without it the follow-up goes by load to the other engine and misses', async (t) => {
  const h = await setup(t, [])
  const { parent: p, follow } = await parentAndFollowUp(h)
  t.not(follow.worker, p.worker)
  t.equal(follow.cached, 0)
})

t.test('the prediction ends with its TTL', async (t) => {
  const h = await setup(t, ['--router-predicted-ttl-secs', '0.5'])
  const first = await complete(h, parent, 4)
  const overlapOn = async (): Promise<number | undefined> => {
    const r = await h.app.fastify.inject({
      method: 'POST',
      url: '/v1/route',
      headers: json,
      payload: JSON.stringify({ token_ids: [...Buffer.from(parent)], explain: true }),
    })
    const j = r.json() as { candidates: { worker_id: number; overlap_blocks: number }[] }
    return j.candidates.find((c) => c.worker_id === first.worker)?.overlap_blocks
  }
  t.equal(await overlapOn(), Math.floor(Buffer.byteLength(parent) / BS), 'predicted at once')
  await new Promise((r) => setTimeout(r, 700))
  t.equal(await overlapOn(), 0, 'gone after the TTL (the events are still on their way)')
})
