// A worker that fails before its first token is left out of routing for a while (1 s, doubling
// with each failure in a row, up to 30 s), so dead workers stop taking requests and retries
// while their lease runs out; an answer ends it; when every worker is out, none is.
import t from 'tap'
import { getFreePorts } from '../../src/deploy/services.js'
import { harness, listening, tokens, upstream } from './helpers.js'

const ok = (_req: unknown, _body: string, res: import('node:http').ServerResponse): void => {
  res.writeHead(200, { 'content-type': 'application/json' })
  res.end('{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}')
}

t.test('dead workers are tried once, then left out while the live one takes everything', async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  const live = await upstream(ok)
  t.teardown(() => live.close())
  const [d1, d2] = await getFreePorts(2)
  await h.router.addWorker({ id: 1n, url: `http://127.0.0.1:${d1}` })
  await h.router.addWorker({ id: 2n, url: `http://127.0.0.1:${d2}` })
  await h.router.addWorker({ id: 3n, url: live.url })
  const port = await listening(h)
  const post = async (i: number): Promise<number> => {
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: tokens(8, 100 * i) }),
    })
    await r.text()
    return r.status
  }
  const statuses: number[] = []
  const t0 = performance.now()
  for (let i = 0; i < 30; i++) statuses.push(await post(i))
  t.same(new Set(statuses), new Set([200]), 'every request answered')
  const failures = (id: bigint): number => h.router.registry.get(id)?.failures ?? -1
  t.ok(failures(1n) <= 1 && failures(2n) <= 1, `each dead worker tried at most once in the first second (${failures(1n)}, ${failures(2n)})`)
  t.equal(failures(3n), 0)
  const workers = (await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json<{
    workers: { id: number; health: string; suspended_for_ms: number }[]
  }>().workers
  // on a loaded machine the 30 requests may outlast the second a suspension lasts
  const withinSuspension = performance.now() - t0 < 1000
  for (const w of workers.filter((x) => x.id !== 3 && failures(BigInt(x.id)) === 1)) {
    if (withinSuspension || w.health === 'suspended') {
      t.equal(w.health, 'suspended', `worker ${w.id}`)
      t.ok(w.suspended_for_ms > 0 && w.suspended_for_ms <= 1000, `for up to 1 s (${w.suspended_for_ms} ms)`)
    } else t.equal(w.suspended_for_ms, 0, `worker ${w.id}: its second is over`)
  }
  const suspendedNow = workers.filter((w) => w.health === 'suspended').length
  const gauge = Number(/kvrouter_workers_suspended (\d+)/.exec(await h.router.metrics.registry.metrics())?.[1] ?? -1)
  // a suspension may end between the two reads, never begin
  if (performance.now() - t0 < 1000) t.equal(gauge, suspendedNow, 'the gauge counts the suspended workers')
  else t.ok(gauge >= 0 && gauge <= suspendedNow, `the gauge counts the suspended workers (${gauge} ≤ ${suspendedNow})`)
  // when its time is up a dead worker may be tried again; failing again doubles its time out
  for (const id of [1n, 2n]) h.router.suspension.failed(id)
  const after = (await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json<{ workers: { id: number; suspended_for_ms: number }[] }>().workers
  const w1 = after.find((w) => w.id === 1)
  t.ok((w1?.suspended_for_ms ?? 0) > 1000, `a second failure in a row: longer (${w1?.suspended_for_ms} ms)`)
  // an answer ends it
  const w3 = h.router.registry.get(3n)
  if (w3 === undefined) return t.fail('no worker 3')
  h.router.suspension.failed(3n)
  t.ok(h.router.suspension.isSuspended(w3))
  h.router.suspension.answered(w3)
  t.notOk(h.router.suspension.isSuspended(w3))
  t.equal(w3.failures, 0)
})

t.test('when every worker is out, none is: the request is tried, and the error says where', async (t) => {
  const h = await harness(['--router-block-size', '4', '--proxy-retries', '2'])
  t.teardown(() => h.close())
  const ports = await getFreePorts(3)
  for (const [i, p] of ports.entries()) await h.router.addWorker({ id: BigInt(i + 1), url: `http://127.0.0.1:${p}` })
  for (const id of [1n, 2n, 3n]) h.router.suspension.failed(id)
  const r = await h.app.fastify.inject({ method: 'POST', url: '/v1/completions', payload: { prompt: tokens(8) } })
  t.equal(r.statusCode, 502, 'tried, not refused for want of workers')
  const e = r.json<{ error: { code: string; message: string } }>().error
  t.equal(e.code, 'KVR_ERR_UPSTREAM')
  t.match(e.message, /\(the last of 3 attempts, on workers [123], [123], [123]\)$/)
})
