// Worker health through the router's API, with mocker engines as the workers: a registration of
// another block size is accepted and shown misconfigured, out of kv routing (not of the other
// modes) until registered again with the router's; probes make a dead worker unreachable and
// leave it out without a retry; /ready wants a worker that can take a request.
import t from 'tap'
import type { Test } from 'tap'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { getFreePorts } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { harness, metricSum, tokens } from './helpers.js'
import type { Harness } from './helpers.js'
import { captureProcessLog, warnings as warnLines } from '../helpers/log.js'

interface WorkerView {
  id: number
  health: string
  health_reason: string | null
  consecutive_failures: number
  probe: { path: string; consecutive_failures: number; last_ok_ms_ago: number | null; last_error: string | null } | null
}

const workers = async (h: Harness): Promise<WorkerView[]> =>
  (await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json<{ workers: WorkerView[] }>().workers
const one = async (h: Harness, id: number): Promise<WorkerView | undefined> => (await workers(h)).find((w) => w.id === id)
const ready = async (h: Harness, q = ''): Promise<{ status: number; body: { ready: boolean; workers: number; healthy_workers: number } }> => {
  const r = await h.app.fastify.inject({ method: 'GET', url: `/ready${q}` })
  return { status: r.statusCode, body: r.json() }
}

/** Where `n` completions with distinct prompts went (worker ids), all answered 200. */
async function spread(t: Test, h: Harness, n: number, from = 0): Promise<Set<number>> {
  const seen = new Set<number>()
  for (let i = 0; i < n; i++) {
    const r = await h.app.fastify.inject({ method: 'POST', url: '/v1/completions', payload: { prompt: tokens(12, 1000 * (from + i)), max_tokens: 1 } })
    t.equal(r.statusCode, 200, `request ${from + i} answered`)
    seen.add(r.json<{ nvext: { worker_id: { decode_worker_id: number } } }>().nvext.worker_id.decode_worker_id)
  }
  return seen
}

const fleet = await MockerFleet.start({ numWorkers: 3, firstWorkerId: 1n, blockSize: 4, speedupRatio: 0 })
t.teardown(() => fleet.close())
const url = (i: number): string => (fleet.workers[i] as { url: string }).url

t.test('another block size: registered, misconfigured, out of kv routing until registered right', async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  const capture = captureProcessLog()
  const said = (): string[] => warnLines(capture, 'KVR_BLOCK_SIZE_MISMATCH')
  const bad = await h.app.fastify.inject({ method: 'POST', url: '/v1/workers', payload: { id: 2, url: url(1), block_size: 16 } })
  t.equal(bad.statusCode, 201, 'accepted: a refused worker would be invisible')
  t.match(bad.json(), { id: 2, block_size: 16, health: 'misconfigured', health_reason: /^block size 16, the router's is 4/ })
  t.same(
    await ready(h),
    { status: 503, body: { ...(await ready(h)).body, ready: false, workers: 1, healthy_workers: 0 } },
    'its only worker misconfigured: not ready',
  )
  await h.router.addWorker({ id: 1n, url: url(0) })
  t.equal((await ready(h)).status, 200)
  t.match(await one(h, 2), {
    health: 'misconfigured',
    health_reason: "block size 16, the router's is 4: its KV blocks can never match; register it again with block size 4",
  })
  t.match(await one(h, 1), { health: 'healthy', health_reason: null })
  t.equal(await metricSum(h, 'kvrouter_workers', { state: 'misconfigured' }), 1)
  t.equal(await metricSum(h, 'kvrouter_workers', { state: 'healthy' }), 1)
  t.same([...(await spread(t, h, 12))], [1], 'every request to worker 1')
  // a request pinned to it still goes there
  const pinned = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'x-worker-instance-id': '2' },
    payload: { prompt: tokens(8), max_tokens: 1 },
  })
  t.equal(pinned.statusCode, 200)
  t.match(pinned.body, '"decode_worker_id":2')
  // registered again with the router's size: routed
  const fixed = await h.app.fastify.inject({ method: 'POST', url: '/v1/workers', payload: { id: 2, url: url(1), block_size: 4 } })
  t.equal(fixed.statusCode, 200)
  t.match(fixed.json(), { health: 'healthy', health_reason: null })
  t.same([...(await spread(t, h, 20, 100))].sort(), [1, 2], 'both take requests')
  t.equal(said().length, 1, 'warned once')
  t.match(
    said()[0],
    'worker 2 announces block size 16, the router hashes with 4: its blocks will never match; it is misconfigured, out of routing until it ' +
      'registers with block size 4',
  )
})

t.test('outside kv mode another block size is routed as any other', async (t) => {
  const h = await harness(['--router-block-size', '4', '--router-mode', 'round-robin'])
  t.teardown(() => h.close())
  await h.router.addWorker({ id: 1n, url: url(0) })
  t.equal((await h.app.fastify.inject({ method: 'POST', url: '/v1/workers', payload: { id: 2, url: url(1), block_size: 16 } })).statusCode, 201)
  t.match(await one(h, 2), { health: 'healthy', health_reason: null })
  t.same([...(await spread(t, h, 4))].sort(), [1, 2])
})

t.test('/ready: 503 with no worker, or none that can take a request; ?strict as before', async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  t.match(await ready(h), { status: 503, body: { ready: false, workers: 0, healthy_workers: 0 } }, 'no worker registered')
  await h.router.addWorker({ id: 1n, url: url(0) })
  await h.router.addWorker({ id: 2n, url: url(1) })
  t.match(await ready(h), { status: 200, body: { ready: true, workers: 2, healthy_workers: 2 } })
  t.equal((await ready(h, '?strict')).status, 200, 'no NATS or etcd configured: strict is ready too')
  h.router.suspension.failed(1n)
  t.match(await ready(h), { status: 200, body: { healthy_workers: 1 } })
  h.router.suspension.failed(2n)
  t.match(await ready(h), { status: 503, body: { ready: false, healthy_workers: 0 } }, 'every worker suspended')
  t.match(await one(h, 2), { health: 'suspended', health_reason: '1 request(s) in a row failed before their first token', consecutive_failures: 1 })
  for (const id of [1n, 2n]) h.router.suspension.answered(h.router.registry.get(id) as NonNullable<ReturnType<typeof h.router.registry.get>>)
  t.equal((await ready(h)).status, 200)
})

t.test('probes: a dead worker is unreachable and left out without a retry; answering again, it is back', async (t) => {
  const [deadPort] = await getFreePorts(1)
  const h = await harness(['--router-block-size', '4', '--router-health-probe-interval-secs', '0.2', '--router-health-probe-timeout-secs', '0.5'])
  t.teardown(() => h.close())
  const capture = captureProcessLog()
  const said = (): string[] => warnLines(capture, 'KVR_WORKER_UNREACHABLE')
  await h.router.addWorker({ id: 1n, url: url(0) })
  await h.router.addWorker({ id: 2n, url: `http://127.0.0.1:${deadPort}` })
  await waitUntil('worker 2 unreachable', async () => (await one(h, 2))?.health === 'unreachable', 5000)
  const dead = await one(h, 2)
  t.match(dead, {
    health: 'unreachable',
    health_reason: /^2 health probe\(s\) in a row failed, the last: GET \/health: .*ECONNREFUSED/,
    probe: { path: '/health', last_ok_ms_ago: null },
  })
  t.ok((dead?.probe?.consecutive_failures ?? 0) >= 2)
  t.match(await one(h, 1), { health: 'healthy', probe: { path: '/health', consecutive_failures: 0, last_error: null } })
  t.same(said().length, 1)
  t.match(said()[0], `worker 2 (http://127.0.0.1:${deadPort}) is unreachable: 2 health probe(s) in a row failed`)
  t.equal(await metricSum(h, 'kvrouter_workers', { state: 'unreachable' }), 1)
  t.ok((await metricSum(h, 'kvrouter_worker_probes_total', { outcome: 'failed' })) >= 2)
  t.ok((await metricSum(h, 'kvrouter_worker_probes_total', { outcome: 'ok' })) >= 1)
  const retries = await metricSum(h, 'kvrouter_proxy_retries_total')
  t.same([...(await spread(t, h, 12))], [1])
  t.equal(await metricSum(h, 'kvrouter_proxy_retries_total'), retries, 'no request was tried on it')
  t.equal(h.router.registry.get(2n)?.failures, 0, 'and none failed there')
  // a worker suspended after failures is still tried when it is the only one not held
  h.router.suspension.failed(1n)
  t.same([...(await spread(t, h, 2, 50))], [1], 'suspended, but the only worker not unreachable: tried')
  // an engine starts at its address: healthy at the next probe, its failed requests forgotten
  h.router.suspension.failed(2n)
  const revived = await MockerFleet.start({ numWorkers: 1, firstWorkerId: 2n, blockSize: 4, speedupRatio: 0, port: deadPort })
  t.teardown(() => revived.close())
  await waitUntil('worker 2 back', async () => (await one(h, 2))?.health === 'healthy', 5000)
  t.equal(h.router.registry.get(2n)?.failures, 0)
  t.match(await one(h, 2), { health_reason: null, probe: { consecutive_failures: 0, last_error: null } })
  t.same([...(await spread(t, h, 20, 200))].sort(), [1, 2])
})

t.test('every worker unreachable: 503 NO_WORKERS at once, not a try on each', async (t) => {
  const ports = await getFreePorts(2)
  const h = await harness(['--router-block-size', '4', '--router-health-probe-interval-secs', '0.2'])
  t.teardown(() => h.close())
  for (const [i, p] of ports.entries()) await h.router.addWorker({ id: BigInt(i + 1), url: `http://127.0.0.1:${p}` })
  await waitUntil('both unreachable', async () => (await workers(h)).every((w) => w.health === 'unreachable'), 5000)
  const r = await h.app.fastify.inject({ method: 'POST', url: '/v1/completions', payload: { prompt: tokens(8), max_tokens: 1 } })
  t.equal(r.statusCode, 503)
  t.match(r.json(), { error: { code: 'KVR_ERR_NO_WORKERS', message: /each of the 2 registered is unreachable or misconfigured/ } })
  t.match(await ready(h), { status: 503, body: { workers: 2, healthy_workers: 0 } })
})
