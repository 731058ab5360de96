// Recovery of missed KV events against real simulated engines over HTTP: a router that registers a
// worker which answers worker queries rebuilds it from a dump; a worker that does not answer has its
// gaps counted and accepted; a restarted shard rebuilt from its workers' dumps. Events are lost on
// the way as a NATS outage loses them.
import t from 'tap'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { Router } from '../../src/core/router.js'
import { config, until, upstream } from '../http/helpers.js'
import { getFreePorts } from '../../src/deploy/services.js'
import { captureProcessLog, warnings } from '../helpers/log.js'
import { canon, ev } from '../helpers/recovery.js'

/** A worker's blocks as block hashes, sorted, from events that rebuild them. */
function blocksOf(events: RouterEvent[], worker: bigint): string[] {
  const out: string[] = []
  for (const e of events) {
    if (e.worker_id !== worker || typeof e.event.data !== 'object' || !('stored' in e.event.data)) continue
    for (const b of e.event.data.stored.blocks) out.push(String(b.block_hash))
  }
  return out.sort()
}

async function complete(url: string, prompt: number[]): Promise<void> {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 1 }),
  })
  await r.text()
  if (r.status !== 200) throw new Error(`the engine answered ${r.status}`)
}

t.test('against a simulated engine: a router that starts late catches up, and events lost on the way are fetched', async (t) => {
  let deliver: ((e: RouterEvent) => void) | null = null
  let lose = (_e: RouterEvent): boolean => false
  const fleet = await MockerFleet.start({
    numWorkers: 1,
    firstWorkerId: 11n,
    blockSize: 4,
    speedupRatio: 0,
    onEvent: (e) => (lose(e) ? undefined : deliver?.(e)),
  })
  t.teardown(() => fleet.close())
  const engine = fleet.workers[0]
  if (engine === undefined) return t.fail('no engine')
  // the engine caches blocks before any router listens
  await complete(
    engine.url,
    Array.from({ length: 16 }, (_, i) => i + 1),
  )
  await complete(
    engine.url,
    Array.from({ length: 12 }, (_, i) => 100 + i),
  )
  const router = await Router.start(config(['--router-block-size', '4', '--router-event-recovery']))
  t.teardown(() => router.close())
  deliver = (e) => router.ingestEvent(e)
  await router.addWorker({ id: engine.workerId, url: engine.url })
  await until(() => router.recovery?.counters.dumps === 1)
  await router.pool.flush()
  t.same(
    blocksOf(await router.pool.dump(), engine.workerId),
    blocksOf(engine.engine.ring.treeDump(), engine.workerId),
    'after the dump, the index holds what the engine holds',
  )
  t.equal(blocksOf(await router.pool.dump(), engine.workerId).length, 7, 'four blocks and three')

  // a stretch of events is lost (a NATS outage); the next one that arrives reveals the gap
  const newest = engine.engine.ring.newestId
  lose = (e) => e.event.event_id <= newest + 2n
  await complete(
    engine.url,
    Array.from({ length: 8 }, (_, i) => 200 + i),
  )
  await complete(
    engine.url,
    Array.from({ length: 8 }, (_, i) => 300 + i),
  )
  lose = () => false
  await complete(
    engine.url,
    Array.from({ length: 8 }, (_, i) => 400 + i),
  )
  await until(() => (router.recovery?.counters.ranges ?? 0) === 1).catch((e: unknown) => {
    t.comment(
      JSON.stringify({
        counters: router.recovery?.counters,
        gaps: router.pool.counters()[0]?.gaps,
        newest: String(engine.engine.ring.newestId),
        was: String(newest),
      }),
    )
    throw e
  })
  await router.pool.flush()
  t.equal(router.recovery?.counters.gaps, 1)
  t.same(
    blocksOf(await router.pool.dump(), engine.workerId),
    blocksOf(engine.engine.ring.treeDump(), engine.workerId),
    'the lost events were fetched: the index holds what the engine holds',
  )
  t.equal(router.recovery?.stateOf(engine.workerId, 0), 'exact')
  const m = await router.metrics.registry.metrics()
  t.match(m, /kvrouter_index_recovery_total\{what="dumps"\} 1/)
  t.match(m, /kvrouter_index_recovery_total\{what="ranges"\} 1/)
  t.match(m, /kvrouter_shard_event_gaps_total\{shard="0"\} 1/)
})

t.test('a worker that does not answer the query: its gaps are counted and accepted, never held', async (t) => {
  let probes = 0
  const up = await upstream((req, _body, res) => {
    if (req.url === '/v1/kv/query') probes++
    res.writeHead(404, { 'content-type': 'application/json' })
    res.end('{"error":"not here"}')
  })
  t.teardown(() => up.close())
  const router = await Router.start(config(['--router-block-size', '4', '--router-event-recovery']))
  t.teardown(() => router.close())
  await router.addWorker({ id: 21n, url: up.url })
  await until(() => probes === 1)
  router.ingestEvent(ev(21n, 1, 1, null))
  router.ingestEvent(ev(21n, 7, 7, null))
  t.same(canon(await router.pool.overlapScores([7n], { readYourWrites: true })), ['21:0=1/2'], 'applied at once')
  // the counters are published after the batch; a control call comes after that
  await router.pool.flush()
  t.equal(router.pool.counters()[0]?.gaps, 1)
  t.equal(router.recovery?.counters.gaps, 0, 'no recovery asked for')
  await new Promise((r) => setTimeout(r, 50))
  t.equal(probes, 1, 'probed once, at registration, and not again')
})

t.test('a worker that answers the probe but not the recovery: the held events go on and the rank is degraded', async (t) => {
  let queries = 0
  const up = await upstream((req, body, res) => {
    if (req.url !== '/v1/kv/query') {
      res.end()
      return
    }
    queries++
    // the probe gets TooNew; the dump at registration an empty tree; anything after an error
    const q = JSON.parse(body) as { start_event_id: unknown }
    res.writeHead(q.start_event_id === null && queries === 2 ? 200 : q.start_event_id === null ? 500 : 200, { 'content-type': 'application/json' })
    if (queries === 1) res.end('{"TooNew":{"requested_start":18446744073709551615,"requested_end":null,"newest_available":0}}')
    else if (queries === 2) res.end('{"TreeDump":[]}')
    else res.end('{"Error":"the ring was dropped"}')
  })
  t.teardown(() => up.close())
  const router = await Router.start(config(['--router-block-size', '4', '--router-event-recovery']))
  t.teardown(() => router.close())
  const capture = captureProcessLog()
  await router.addWorker({ id: 31n, url: up.url })
  await until(() => router.recovery?.counters.dumps === 1)
  router.ingestEvent(ev(31n, 1, 1, null))
  router.ingestEvent(ev(31n, 5, 5, null))
  await until(() => router.recovery?.counters.failed === 1, 10_000)
  t.same(canon(await router.pool.overlapScores([5n], { readYourWrites: true })), ['31:0=1/2'], 'the held event applied')
  t.equal(router.recovery?.stateOf(31n, 0), 'degraded')
  const named = (): boolean => warnings(capture, 'KVR_INDEX_DEGRADED').some((w) => /worker 31 rank 0: its KV events could not be recovered/.test(w))
  await until(named).catch(() => undefined)
  t.ok(named(), 'a warning names the worker')
})

t.test("a shard that dies comes back empty and is rebuilt from its workers' dumps, then exact again", async (t) => {
  const router = await Router.start(config(['--router-block-size', '4', '--router-event-recovery']))
  t.teardown(() => router.close())
  const fleet = await MockerFleet.start({ numWorkers: 2, firstWorkerId: 41n, blockSize: 4, speedupRatio: 0, onEvent: (e) => void router.ingestEvent(e) })
  t.teardown(() => fleet.close())
  for (const e of fleet.workers) await router.addWorker({ id: e.workerId, url: e.url })
  await until(() => router.recovery?.counters.dumps === 2)
  for (const [i, e] of fleet.workers.entries())
    await complete(
      e.url,
      Array.from({ length: 12 }, (_, k) => 1000 * i + k),
    )
  await router.pool.flush()
  const want = (id: bigint): string[] => blocksOf((fleet.workers.find((e) => e.workerId === id) as (typeof fleet.workers)[number]).engine.ring.treeDump(), id)
  t.equal(blocksOf(await router.pool.dump(), 41n).length, 3)
  const restarted = new Promise((r) => router.pool.once('shardRestarted', r))
  await router.pool.terminateShard(0)
  await restarted
  t.equal(router.pool.health()[0], 'recovering', 'empty, and says so')
  await until(() => router.pool.health()[0] === 'exact', 10_000)
  t.same(blocksOf(await router.pool.dump(), 41n), want(41n), 'worker 41 rebuilt')
  t.same(blocksOf(await router.pool.dump(), 42n), want(42n), 'worker 42 rebuilt')
  // and its gaps are recovered again, not accepted: the fresh shard was told the worker answers
  const e = fleet.workers[0] as (typeof fleet.workers)[number]
  const before = router.recovery?.counters.ranges ?? 0
  router.ingestEvent({ worker_id: e.workerId, event: { event_id: e.engine.ring.newestId + 5n, dp_rank: 0, data: 'cleared' } })
  const asked = (): boolean => (router.recovery?.counters.ranges ?? 0) + (router.recovery?.counters.failed ?? 0) > before
  await until(asked).catch(() => undefined)
  t.ok(asked(), 'a gap after the restart goes to recovery')
})

t.test(
  'a restarted shard whose worker cannot be rebuilt is exact again, that worker degraded with a warning; approximate mode had nothing to lose',
  async (t) => {
    const capture = captureProcessLog()
    const up = await upstream((_req, _body, res) => {
      res.writeHead(404)
      res.end()
    })
    t.teardown(() => up.close())
    const r = await Router.start(config(['--router-block-size', '4', '--router-event-recovery']))
    t.teardown(() => r.close())
    await r.addWorker({ id: 51n, url: up.url })
    // it sent events (a worker that never did had only predictions to lose)
    r.ingestEvent({ worker_id: 51n, event: { event_id: 1n, dp_rank: 0, data: 'cleared' } })
    await r.pool.flush()
    const r1 = new Promise((res) => r.pool.once('shardRestarted', res))
    await r.pool.terminateShard(0)
    await r1
    // three probes of the worker (1 s, 2 s, 4 s apart) before it is given up: seconds, more under load
    await until(() => r.pool.health()[0] === 'exact', 30_000)
    t.equal(r.recovery?.stateOf(51n, 0), 'degraded', 'the worker that could not be rebuilt says so')
    await until(
      () => warnings(capture, 'KVR_INDEX_DEGRADED').some((w) => /index shard 0 restarted: the cached blocks of worker\(s\) 51 are forgotten/.test(w)),
      30_000,
    )
    // without recovery at all, the same
    const plain = await Router.start(config(['--router-block-size', '4']))
    t.teardown(() => plain.close())
    await plain.addWorker({ id: 52n, url: 'http://127.0.0.1:9' })
    plain.ingestEvent({ worker_id: 52n, event: { event_id: 1n, dp_rank: 0, data: 'cleared' } })
    await plain.pool.flush()
    const r2 = new Promise((res) => plain.pool.once('shardRestarted', res))
    await plain.pool.terminateShard(0)
    await r2
    // waits as long as the first router's: a shard restart takes seconds on a loaded machine
    await until(() => plain.pool.health()[0] === 'exact', 30_000)
    await until(() => warnings(capture, 'KVR_INDEX_DEGRADED').some((w) => /worker\(s\) 52 are forgotten .*--no-router-event-recovery/.test(w)), 30_000)
    const approx = await Router.start(config(['--router-block-size', '4', '--no-router-kv-events']))
    t.teardown(() => approx.close())
    const r3 = new Promise((res) => approx.pool.once('shardRestarted', res))
    await approx.pool.terminateShard(0)
    await r3
    await until(() => approx.pool.health()[0] === 'exact').catch(() => undefined)
    t.equal(approx.pool.health()[0], 'exact', 'approximate mode: exact at once')
  },
)

t.test('a worker not up when it registers is probed again until it answers, then rebuilt', async (t) => {
  const [port] = await getFreePorts(1)
  const router = await Router.start(config(['--router-block-size', '4', '--router-event-recovery']))
  t.teardown(() => router.close())
  await router.addWorker({ id: 61n, url: `http://127.0.0.1:${port}` })
  // nothing listens yet: the first probe fails; the worker comes up a moment later
  await new Promise((r) => setTimeout(r, 300))
  const { createServer } = await import('node:http')
  const srv = createServer((req, res) => {
    let body = ''
    req.on('data', (c: Buffer) => (body += c.toString()))
    req.on('end', () => {
      const q = JSON.parse(body) as { start_event_id: unknown }
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(
        q.start_event_id === null
          ? `{"TreeDump":[${encodeRouterEvent(ev(61n, 0, 70, null))}]}`
          : '{"TooNew":{"requested_start":18446744073709551615,"requested_end":null,"newest_available":3}}',
      )
    })
  })
  await new Promise<void>((r) => srv.listen(port, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => srv.close(() => r())))
  await until(() => router.recovery?.counters.dumps === 1, 10_000)
  t.same(canon(await router.pool.overlapScores([70n], { readYourWrites: true })), ['61:0=1/1'], 'rebuilt from its dump once it answered')
  // the dump stands for ids up to 3: event 6 is a gap again
  router.ingestEvent(ev(61n, 6, 71, null))
  await until(() => (router.recovery?.counters.gaps ?? 0) === 1).catch(() => undefined)
  t.equal(router.recovery?.counters.gaps, 1, 'a later gap goes to recovery, not accepted')
})
