// Session affinity in the router: a session's requests stay on its worker-rank even where load
// would send them elsewhere; a binding ends with its TTL, and breaks (the request goes by the
// cost, the session re-bound there) when its worker is busy, suspended or gone. Through the
// proxy, the X-Dynamo-Session-ID header carries it to real mocker engines.
import t from 'tap'
import type { Test } from 'tap'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { BytesTokenizer } from '../../src/tokenizer/tokenizer.js'
import { harness } from '../http/helpers.js'
import type { Harness } from '../http/helpers.js'
import { tokens } from '../http/helpers.js'

async function router(t: Test, ttl: string): Promise<Harness> {
  const h = await harness(['--router-block-size', '4', '--router-session-affinity-ttl-secs', ttl])
  t.teardown(() => h.close())
  await h.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9', capacity: 1000 })
  await h.router.addWorker({ id: 2n, url: 'http://127.0.0.1:9', capacity: 1000 })
  return h
}

let n = 0
/** A booked request of the session, with a prompt of its own (no shared prefix pulls it anywhere). */
async function send(h: Harness, session: string | undefined): Promise<bigint> {
  n++
  const input: Parameters<Harness['router']['route']>[0] = { tokens: tokens(16, 10_000 + n * 100), id: `r${n}`, updateStates: true }
  if (session !== undefined) input.sessionId = session
  const { decision } = await h.router.route(input)
  return decision.workerId
}

t.test('a session stays on its worker-rank while load would move it; the TTL ends it', async (t) => {
  const h = await router(t, '0.4')
  const first = await send(h, 's')
  // without the session, the next requests alternate by load; with it they pile on `first`
  for (let i = 0; i < 4; i++) t.equal(await send(h, 's'), first, `request ${i + 2} of the session`)
  const other = await send(h, undefined)
  t.not(other, first, 'a request without a session goes where the load is lower')
  t.match(h.router.sessions?.counters, { hits: 4, bound: 1, broken: 0 })
  await new Promise((r) => setTimeout(r, 450))
  t.not(await send(h, 's'), first, 'the binding expired: the cost decides (the other worker has less load)')
  t.equal(h.router.sessions?.counters.bound, 2)
  const m = (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  t.match(m, /^kvrouter_session_affinity_total\{outcome="hit"\} 4$/m)
  t.match(m, /^kvrouter_session_bindings 1$/m)
})

t.test('a busy, suspended or removed worker breaks the binding; the session is bound anew', async (t) => {
  const h = await router(t, '60')
  const first = await send(h, 'busy')
  // its worker reports its cache nearly full and a threshold says that is busy
  h.router.scheduler.setBusyThresholds({ activeDecodeBlocksThreshold: 0.5 })
  h.router.scheduler.reportLoad(first, 0, 900, 1000)
  const moved = await send(h, 'busy')
  t.not(moved, first, 'busy: elsewhere')
  t.equal(await send(h, 'busy'), moved, 'and bound there')
  h.router.scheduler.reportLoad(first, 0, 0, 1000)
  // suspended after failures
  const w = h.router.registry.get(moved)
  if (w === undefined) throw new Error('unregistered')
  h.router.suspension.failed(moved)
  t.ok(h.router.suspension.isSuspended(w))
  const back = await send(h, 'busy')
  t.not(back, moved, 'suspended: elsewhere')
  // removed
  await h.router.removeWorker(back)
  t.not(await send(h, 'busy'), back, 'gone: elsewhere')
  // busy and suspended broke it; a removed worker's bindings went with it
  t.equal(h.router.sessions?.counters.broken, 2)
  t.equal(h.router.sessions?.counters.bound, 2)
})

t.test('X-Dynamo-Session-ID through the proxy to mocker engines; a malformed id is refused', async (t) => {
  const h = await harness(['--router-block-size', '16', '--router-session-affinity-ttl-secs', '60'], new BytesTokenizer())
  t.teardown(() => h.close())
  const fleet = await MockerFleet.start({ numWorkers: 2, blockSize: 16, speedupRatio: 10, onEvent: (ev) => h.router.ingestEvent(ev) })
  t.teardown(() => fleet.close())
  for (const w of fleet.workers) await h.router.addWorker({ id: w.workerId, url: w.url, eventsInProcess: true })
  const ask = async (session: string, i: number) => {
    const r = await h.app.fastify.inject({
      method: 'POST',
      url: '/v1/completions',
      headers: { 'content-type': 'application/json', 'x-dynamo-session-id': session },
      payload: JSON.stringify({ prompt: `Turn ${i} of a conversation with nothing shared between its turns ${'z'.repeat(i * 7)}`, max_tokens: 2 }),
    })
    t.equal(r.statusCode, 200)
    return r.headers['x-worker-id']
  }
  const workers = [await ask('chat-1', 1)]
  for (let i = 2; i <= 5; i++) workers.push(await ask('chat-1', i))
  t.equal(new Set(workers).size, 1, `one engine for the whole session (${workers.join(',')})`)
  const long = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'content-type': 'application/json', 'x-dynamo-session-id': 'x'.repeat(257) },
    payload: JSON.stringify({ prompt: 'hi', max_tokens: 1 }),
  })
  t.equal(long.statusCode, 400)
  t.match(long.body, 'x-dynamo-session-id is longer than 256 characters')
})
