// The health probes (src/core/health-probes.ts) against real servers: a mocker engine answers
// /health; a server without /health is asked /v1/models instead; a 5xx, a refused connection and a
// server that never answers fail (the last as a timeout); probes reuse one keep-alive connection,
// a failure is confirmed half an interval later, and no more than `concurrency` run at once.
import t from 'tap'
import { createServer } from 'node:http'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { HealthProbes } from '../../src/core/health-probes.js'
import type { ProbeResult } from '../../src/core/health.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { getFreePorts } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'

interface Scripted {
  url: string
  /** Requests by path, connections opened, requests open now and at most. */
  paths: string[]
  connections: number
  open: number
  maxOpen: number
  close(): Promise<void>
}

async function server(handle: (req: IncomingMessage, res: ServerResponse) => void): Promise<Scripted> {
  const s: Scripted = { url: '', paths: [], connections: 0, open: 0, maxOpen: 0, close: async () => undefined }
  const srv: Server = createServer((req, res) => {
    s.paths.push(req.url ?? '')
    s.open++
    s.maxOpen = Math.max(s.maxOpen, s.open)
    res.on('close', () => s.open--)
    handle(req, res)
  })
  srv.on('connection', () => s.connections++)
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  s.url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`
  s.close = async () => {
    srv.closeAllConnections()
    await new Promise<void>((r) => srv.close(() => r()))
  }
  return s
}

function probes(intervalMs: number, timeoutMs: number, concurrency?: number): { p: HealthProbes; results: { id: bigint; at: number; r: ProbeResult }[] } {
  const results: { id: bigint; at: number; r: ProbeResult }[] = []
  const p = new HealthProbes({
    intervalMs,
    timeoutMs,
    ...(concurrency === undefined ? {} : { concurrency }),
    result: (id, _url, r) => {
      results.push({ id, at: performance.now(), r })
      return r.outcome !== 'ok'
    },
  })
  return { p, results }
}

t.test('a mocker engine answers /health, probed an interval apart', async (t) => {
  const fleet = await MockerFleet.start({ numWorkers: 1, firstWorkerId: 1n, blockSize: 16, speedupRatio: 0 })
  t.teardown(() => fleet.close())
  const { p, results } = probes(50, 1000)
  t.teardown(() => p.close())
  const start = performance.now()
  p.watch(1n, (fleet.workers[0] as { url: string }).url)
  await waitUntil('5 probes', () => results.length >= 5)
  const took = (results[4]?.at ?? 0) - start
  t.same(new Set(results.map((x) => JSON.stringify(x.r))), new Set([JSON.stringify({ outcome: 'ok', detail: null, path: '/health' })]))
  t.equal(p.counters.ok, results.length)
  // the first at once, then one an interval after the other started
  t.ok(took >= 190, `5 probes in ${took.toFixed(0)} ms, 50 ms apart`)
})

t.test('no /health: /v1/models from then on; any answer below 500 is up', async (t) => {
  const s = await server((req, res) => {
    res.writeHead(req.url === '/health' ? 404 : 401)
    res.end('{}')
  })
  t.teardown(() => s.close())
  const { p, results } = probes(50, 1000)
  t.teardown(() => p.close())
  p.watch(7n, s.url)
  await waitUntil('6 probes', () => results.length >= 6)
  await p.close()
  t.same(
    results.map((x) => x.r),
    results.map(() => ({ outcome: 'ok', detail: null, path: '/v1/models' })),
  )
  t.equal(s.paths.filter((x) => x === '/health').length, 1, '/health asked once')
  t.ok(s.paths.filter((x) => x === '/v1/models').length >= 6)
  // the second request of the first probe may go out before the first one's socket is free
  t.ok(s.connections <= 2, `${s.paths.length} requests over ${s.connections} keep-alive connection(s)`)
})

t.test('failures: a 5xx, a refused connection, no answer in time; confirmed half an interval later', async (t) => {
  const broken = await server((_req, res) => {
    res.writeHead(503)
    res.end()
  })
  const hung = await server(() => undefined)
  t.teardown(async () => {
    await broken.close()
    await hung.close()
  })
  const [closed] = await getFreePorts(1)
  const { p, results } = probes(400, 100)
  t.teardown(() => p.close())
  p.watch(1n, broken.url)
  p.watch(2n, `http://127.0.0.1:${closed}`)
  p.watch(3n, hung.url)
  await waitUntil('two probes of each', () => [1n, 2n, 3n].every((id) => results.filter((x) => x.id === id).length >= 2), 5000)
  const of = (id: bigint): { at: number; r: ProbeResult }[] => results.filter((x) => x.id === id)
  t.same(of(1n)[0]?.r, { outcome: 'failed', detail: 'GET /health answered 503', path: '/health' })
  t.equal(of(2n)[0]?.r.outcome, 'failed')
  t.match(of(2n)[0]?.r.detail, /^GET \/health: .*ECONNREFUSED/)
  t.same(of(3n)[0]?.r, { outcome: 'timeout', detail: 'GET /health: no answer in 0.1 s', path: '/health' })
  // each failure asked for the next probe half an interval (200 ms) after the failed one started;
  // results are stamped when each answer came, so the first answer's own delay comes off the gap
  for (const id of [1n, 2n]) {
    const gap = (of(id)[1]?.at ?? 0) - (of(id)[0]?.at ?? 0)
    t.ok(gap >= 150 && gap < 380, `worker ${id}: confirmed ${gap.toFixed(0)} ms later`)
  }
  const hungGap = (of(3n)[1]?.at ?? 0) - (of(3n)[0]?.at ?? 0)
  t.ok(hungGap >= 180 && hungGap < 380, `the hung worker: ${hungGap.toFixed(0)} ms from timeout to timeout`)
  t.ok(p.counters.failed >= 4 && p.counters.timeout >= 2, JSON.stringify(p.counters))
})

t.test('at most `concurrency` probes at once; a worker unwatched is no longer probed', async (t) => {
  const hung = await server(() => undefined)
  t.teardown(() => hung.close())
  const { p, results } = probes(100, 200, 2)
  t.teardown(() => p.close())
  const start = performance.now()
  for (let i = 1; i <= 6; i++) p.watch(BigInt(i), `${hung.url}/w${i}`)
  await waitUntil('every worker probed', () => new Set(results.map((x) => x.id)).size === 6, 5000)
  // six probes that each time out after 200 ms, two at a time: three rounds
  const took = performance.now() - start
  t.ok(took >= 580, `two at a time: every worker probed once in ${took.toFixed(0)} ms`)
  t.ok(hung.maxOpen <= 4, `requests the server saw open at once: ${hung.maxOpen} (an aborted one closes there a little later)`)
  for (let i = 1; i <= 6; i++) p.unwatch(BigInt(i))
  await new Promise((r) => setTimeout(r, 300))
  const n = results.length
  await new Promise((r) => setTimeout(r, 400))
  t.equal(results.length, n, 'nothing reported after unwatch')
})
