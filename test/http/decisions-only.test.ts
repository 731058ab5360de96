// Workers registered for routing decisions only (POST /v1/workers with "decisions_only": true), as
// callers of /v1/route that contact the worker themselves register them: with health probes on and
// an address where nothing answers, such a worker is never probed, stays healthy and stays in
// /v1/route's answers, while a worker registered as usual at such an address turns unreachable.
// Proxied inference never goes to it: unpinned requests go elsewhere, pinned ones are refused.
import t from 'tap'
import { getFreePorts } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { harness, tokens, upstream } from './helpers.js'

interface WorkerView {
  id: number
  decisions_only: boolean
  health: string
  probe: object | null
}

const [silentA, silentB] = await getFreePorts(2)
const h = await harness(['--router-block-size', '4', '--router-health-probe-interval-secs', '0.1', '--router-health-probe-timeout-secs', '0.3'])
const live = await upstream((_req, _body, res) => {
  res.writeHead(200, { 'content-type': 'application/json' })
  res.end('{"choices":[{"text":"ok"}]}')
})
t.teardown(async () => {
  await h.close()
  await live.close()
})
const inject = h.app.fastify.inject.bind(h.app.fastify)
const workers = async (): Promise<WorkerView[]> => (await inject({ method: 'GET', url: '/v1/workers' })).json<{ workers: WorkerView[] }>().workers
const one = async (id: number): Promise<WorkerView | undefined> => (await workers()).find((w) => w.id === id)
const route = async (
  payload: object,
): Promise<{ status: number; body: { worker_id?: number; candidates?: { worker_id: number }[]; error?: { code: string } } }> => {
  const r = await inject({ method: 'POST', url: '/v1/route', payload })
  return { status: r.statusCode, body: r.json() }
}

t.test('a decisions-only worker is not probed and stays routable by /v1/route', async (t) => {
  const reg = await inject({ method: 'POST', url: '/v1/workers', payload: { id: 1, url: `http://127.0.0.1:${silentA}`, decisions_only: true } })
  t.equal(reg.statusCode, 201)
  t.match(reg.json(), { id: 1, decisions_only: true, health: 'healthy' })
  // the control: registered as usual at an address where nothing answers, it is probed out
  const probed = await inject({ method: 'POST', url: '/v1/workers', payload: { id: 2, url: `http://127.0.0.1:${silentB}` } })
  t.match(probed.json(), { id: 2, decisions_only: false })
  await waitUntil('worker 2 unreachable', async () => (await one(2))?.health === 'unreachable', 5000)
  // several intervals later worker 1 was never probed
  await new Promise((r) => setTimeout(r, 400))
  t.match(await one(1), { decisions_only: true, health: 'healthy', probe: null })
  for (let i = 0; i < 4; i++) {
    const r = await route({ token_ids: tokens(8, 100 * i) })
    t.equal(r.status, 200, `decision ${i} answered`)
    t.equal(r.body.worker_id, 1, `decision ${i} names the decisions-only worker`)
    t.same(
      r.body.candidates?.map((c) => c.worker_id),
      [1],
      'the unreachable worker is no candidate',
    )
  }
})

t.test('proxied inference never goes to it', async (t) => {
  // with no other worker that can take it, an unpinned request has nowhere to go
  const none = await inject({ method: 'POST', url: '/v1/completions', payload: { prompt: tokens(8), max_tokens: 1 } })
  t.equal(none.statusCode, 503)
  t.match(none.json(), { error: { code: 'KVR_ERR_NO_WORKERS' } })
  await h.router.addWorker({ id: 3n, url: live.url })
  await waitUntil('worker 3 healthy and probed', async () => (await one(3))?.probe !== null, 5000)
  for (let i = 0; i < 6; i++) {
    const r = await inject({ method: 'POST', url: '/v1/completions', payload: { prompt: tokens(8, 1000 + 100 * i), max_tokens: 1 } })
    t.equal(r.statusCode, 200, `request ${i} answered`)
    t.equal(r.headers['x-worker-id'], '3', `request ${i} went to the worker the router may send to`)
  }
  const pinned = await inject({ method: 'POST', url: '/v1/completions', payload: { prompt: tokens(8), max_tokens: 1, nvext: { backend_instance_id: 1 } } })
  t.equal(pinned.statusCode, 409)
  t.match(pinned.json(), { error: { code: 'KVR_ERR_WORKER_DECISIONS_ONLY', message: /worker 1 is registered for routing decisions only/ } })
  // /v1/route still decides for every worker, the decisions-only one included
  const both = await route({ token_ids: tokens(8, 5000) })
  t.equal(both.status, 200)
  t.same(both.body.candidates?.map((c) => c.worker_id).sort(), [1, 3])
  t.equal(h.router.registry.get(1n)?.failures, 0, 'no request failed on it')
})

t.test('a retry after a failure does not go to it either', async (t) => {
  // up for its probes, failing every completion before its first token: each one sent there is retried
  let failed = 0
  const failing = await upstream((req, _body, res) => {
    if (req.url === '/health') return void res.writeHead(200).end()
    failed++
    res.writeHead(503, { 'content-type': 'application/json' })
    res.end('{"error":"overloaded"}')
  })
  t.teardown(() => failing.close())
  await h.router.addWorker({ id: 5n, url: failing.url })
  for (let i = 0; i < 8; i++) {
    h.router.suspension.forget(5n)
    const r = await inject({ method: 'POST', url: '/v1/completions', payload: { prompt: tokens(8, 20_000 + 100 * i), max_tokens: 1 } })
    t.equal(r.statusCode, 200, `request ${i} answered`)
    t.equal(r.headers['x-worker-id'], '3', `request ${i} answered by the worker that works`)
  }
  t.ok(failed > 0, `requests were retried after the failing worker (${failed})`)
  t.equal(h.router.registry.get(1n)?.failures, 0, 'no retry went to the decisions-only worker')
  await h.router.removeWorker(5n)
})

t.test('registered again as decisions-only, an unreachable worker is back in /v1/route at once', async (t) => {
  t.equal((await one(2))?.health, 'unreachable')
  const again = await inject({ method: 'POST', url: '/v1/workers', payload: { id: 2, url: `http://127.0.0.1:${silentB}`, decisions_only: true } })
  t.equal(again.statusCode, 200)
  t.match(again.json(), { id: 2, decisions_only: true, health: 'healthy' })
  await new Promise((r) => setTimeout(r, 400))
  t.match(await one(2), { health: 'healthy' })
  const r = await route({ token_ids: tokens(8, 7000), worker_id: 2 })
  t.equal(r.status, 200)
  t.equal(r.body.worker_id, 2)
  // and registered as usual again, it is probed again
  await inject({ method: 'POST', url: '/v1/workers', payload: { id: 2, url: `http://127.0.0.1:${silentB}` } })
  await waitUntil('worker 2 unreachable again', async () => (await one(2))?.health === 'unreachable', 5000)
})

t.test('--worker ID=URL,decisions-only=true registers a static worker for decisions only', async (t) => {
  const [silent] = await getFreePorts(1)
  const s = await harness([
    '--router-block-size',
    '4',
    '--router-health-probe-interval-secs',
    '0.1',
    '--worker',
    `7=http://127.0.0.1:${silent},decisions-only=true`,
  ])
  t.teardown(() => s.close())
  t.equal(s.router.registry.get(7n)?.decisionsOnly, true)
  await new Promise((r) => setTimeout(r, 400))
  const w = (await s.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json<{ workers: WorkerView[] }>().workers.find((x) => x.id === 7)
  t.match(w, { decisions_only: true, health: 'healthy', probe: null }, 'never probed, still healthy')
  const r = await s.app.fastify.inject({ method: 'POST', url: '/v1/route', payload: { token_ids: tokens(8, 9000) } })
  t.equal(r.statusCode, 200)
  t.equal(r.json<{ worker_id: number }>().worker_id, 7)
})
