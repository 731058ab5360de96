// Recovery of missed KV events inside the shard pool: a shard holds a recoverable worker's events
// from a gap in its ids until the missing range (or a dump) arrives, then applies all in order; a
// failed or late answer; the answers of the worker query.
import t from 'tap'
import type { Test } from 'tap'
import { ShardPool, type EventGap } from '../../src/shards/pool.js'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'
import { RecoveryKind } from '../../src/thread/protocol.js'
import { IndexRecovery, answerOf } from '../../src/shards/recovery.js'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { until } from '../http/helpers.js'
import { canon, ev } from '../helpers/recovery.js'

const bytes = (e: RouterEvent): Uint8Array => Buffer.from(encodeRouterEvent(e))
const array = (es: RouterEvent[]): Uint8Array => Buffer.from(`[${es.map(encodeRouterEvent).join(',')}]`)
const chainOf = (n: number): bigint[] => Array.from({ length: n }, (_, i) => BigInt(i + 1))

/** A one-shard pool where worker 7 is recoverable, and the gaps it reports. */
async function recoverablePool(t: Test): Promise<{ pool: ShardPool; gaps: EventGap[] }> {
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const gaps: EventGap[] = []
  pool.on('gap', (g: EventGap) => gaps.push(g))
  pool.setRecoverable(7n, true)
  return { pool, gaps }
}

t.test("a gap holds the worker-rank's events until the missing range is applied, then all in order", async (t) => {
  const { pool, gaps } = await recoverablePool(t)
  pool.push(bytes(ev(7n, 1, 1, null)))
  pool.push(bytes(ev(7n, 2, 2, 1)))
  pool.push(bytes(ev(7n, 5, 5, 4)))
  pool.push(bytes(ev(7n, 6, 6, 5)))
  // another worker of the same shard is not held up
  pool.push(bytes(ev(8n, 1, 1, null)))
  await until(() => gaps.length === 1)
  t.match(gaps[0], { workerId: 7n, dpRank: 0, from: 3n, to: 4n }, 'the missing ids, both ends inclusive')
  t.same(canon(await pool.overlapScores(chainOf(6))), ['7:0=2/2', '8:0=1/1'], 'events 5 and 6 held, worker 8 applied')
  // a hold does not hold up barriers (registrations, GET /v1/workers): they pass at once
  await pool.flush()
  pool.deliverRecovery(7n, 0, gaps[0]?.ticket ?? -1, RecoveryKind.Events, array([ev(7n, 3, 3, 2), ev(7n, 4, 4, 3)]))
  t.same(canon(await pool.overlapScores(chainOf(6), { readYourWrites: true })), ['7:0=6/6', '8:0=1/1'], 'the range, then the held events: a whole chain')
  await pool.flush()
  t.equal(pool.counters()[0]?.gaps, 1)
  t.same((await pool.treeSizes()).find((s) => s.worker_id === 7n)?.last_event_id, 6n)
})

t.test('a failed recovery lets the held events go, the hole accepted; a worker not recoverable is never held', async (t) => {
  const { pool, gaps } = await recoverablePool(t)
  pool.push(bytes(ev(7n, 1, 1, null)))
  pool.push(bytes(ev(7n, 9, 9, null)))
  await until(() => gaps.length === 1)
  pool.deliverRecovery(7n, 0, gaps[0]?.ticket ?? -1, RecoveryKind.Failed, null)
  t.same(canon(await pool.overlapScores([9n], { readYourWrites: true })), ['7:0=1/2'], 'the held event applied')
  // not recoverable: counted, applied at once, no gap reported for recovery
  pool.push(bytes(ev(5n, 1, 1, null)))
  pool.push(bytes(ev(5n, 4, 4, null)))
  t.same(canon(await pool.overlapScores([4n], { readYourWrites: true })), ['5:0=1/2'])
  await pool.flush()
  t.equal(pool.counters()[0]?.gaps, 2, 'both gaps counted')
  t.equal(gaps.length, 1, "only the recoverable worker's reported")
  // an older id (a duplicate) is applied and does not move the last id back
  pool.push(bytes(ev(5n, 2, 2, 1)))
  t.same((await pool.treeSizes()).find((s) => s.worker_id === 5n)?.last_event_id, 4n)
})

t.test("a tree dump replaces the worker-rank's blocks, the events held meanwhile applied after it", async (t) => {
  const pool = await ShardPool.start({ shards: 2 })
  t.teardown(() => pool.close())
  pool.push(bytes(ev(7n, 1, 1, null)))
  pool.push(bytes(ev(7n, 2, 2, 1)))
  await pool.flush()
  const ticket = pool.park(7n, 0)
  pool.push(bytes(ev(7n, 3, 3, 2)))
  t.same(canon(await pool.overlapScores(chainOf(3))), ['7:0=2/2'], 'held behind the park')
  // the worker's cached set, as a dump sees it: blocks 1 and 2 evicted, 2 re-stored under 9
  pool.deliverRecovery(7n, 0, ticket, RecoveryKind.TreeDump, array([ev(7n, 0, 9, null), ev(7n, 1, 2, 9)]))
  t.same(canon(await pool.overlapScores([9n, 2n, 3n], { readYourWrites: true })), ['7:0=3/3'], 'the dump, then block 3 on it')
  t.same(canon(await pool.overlapScores([1n])), [], 'what the dump does not hold is gone')
  // the dump's ids are synthetic: the next live id is taken whatever it is, without a gap
  const gaps: EventGap[] = []
  pool.on('gap', (g: EventGap) => gaps.push(g))
  pool.push(bytes(ev(7n, 40, 40, null)))
  await pool.flush()
  t.equal(gaps.length, 0)
  // a dump that names the last id it stands for: an event past the next one is a gap again
  pool.setRecoverable(7n, true)
  const t2 = pool.park(7n, 0)
  pool.deliverRecovery(7n, 0, t2, RecoveryKind.TreeDump, array([ev(7n, 0, 50, null)]), 60n)
  pool.push(bytes(ev(7n, 63, 63, null)))
  await until(() => gaps.length === 1)
  t.match(gaps[0], { workerId: 7n, dpRank: 0, from: 61n, to: 62n })
  pool.deliverRecovery(7n, 0, gaps[0]?.ticket ?? -1, RecoveryKind.Failed, null)
  t.same(canon(await pool.overlapScores([63n], { readYourWrites: true })), ['7:0=1/2'])
  // a worker removed while held: its held events applied, then removed with the rest
  pool.park(7n, 0)
  pool.push(bytes(ev(7n, 64, 64, null)))
  await pool.removeWorker(7n)
  t.same(canon(await pool.overlapScores([50n], { readYourWrites: true })), [])
  // holds are let go when the pool closes, whatever is still in flight
  pool.park(8n, 0)
  pool.push(bytes(ev(8n, 1, 1, null)))
})

t.test("a late answer cannot end a newer hold; a recovery applies only its own worker-rank's newer events", async (t) => {
  const { pool, gaps } = await recoverablePool(t)
  pool.push(bytes(ev(7n, 1, 1, null)))
  pool.push(bytes(ev(7n, 5, 5, null)))
  await until(() => gaps.length === 1)
  const old = gaps[0]?.ticket ?? -1
  // something else ends that hold (a re-registration parks the rank again), and a new one opens
  const fresh = pool.park(7n, 0)
  pool.push(bytes(ev(7n, 6, 6, null)))
  pool.deliverRecovery(7n, 0, old, RecoveryKind.Events, array([ev(7n, 2, 2, 1)]))
  t.same(canon(await pool.overlapScores([2n], { readYourWrites: true })), [], 'the stale answer was dropped')
  t.same(canon(await pool.overlapScores([6n])), [], 'and the new hold still holds')
  // the new hold's answer: another worker's event, another rank's, an id already applied, and a good one
  const other: RouterEvent = { ...ev(8n, 3, 3, null) }
  const rank3: RouterEvent = { worker_id: 7n, event: { ...ev(7n, 3, 33, null).event, dp_rank: 3 } }
  // (event 5 went on when the new hold replaced the old one: the last applied id is 5)
  pool.deliverRecovery(7n, 0, fresh, RecoveryKind.Events, array([other, rank3, ev(7n, 9, 4, null), ev(7n, 2, 22, null)]))
  t.same(canon(await pool.overlapScores([6n], { readYourWrites: true })), ['7:0=1/4'], 'the held event went on')
  t.same(canon(await pool.overlapScores([3n])), [], 'no block planted under worker 8')
  t.same(canon(await pool.overlapScores([33n])), [], 'nor under rank 3')
  t.same(canon(await pool.overlapScores([4n])), ['7:0=1/4'], 'its own newer event applied')
  t.same(canon(await pool.overlapScores([22n])), [], 'an id at or below the last applied is not')
  t.notOk(
    (await pool.treeSizes()).some((x) => x.worker_id === 8n || x.dp_rank === 3),
    'no worker-rank made up',
  )
})

t.test('after event id 2^64 - 1 nothing is a gap', async (t) => {
  const { pool, gaps } = await recoverablePool(t)
  const top = (tok: number): RouterEvent => ({ ...ev(7n, 1, tok, null), event: { ...ev(7n, 1, tok, null).event, event_id: 0xffffffffffffffffn } })
  pool.push(bytes(top(1)))
  pool.push(bytes(top(2)))
  await pool.flush()
  t.equal(gaps.length, 0)
  t.equal(pool.counters()[0]?.gaps, 0)
})

t.test('a gap that nobody answers does not keep the pool from closing', async (t) => {
  const pool = await ShardPool.start({ shards: 1 })
  pool.setRecoverable(7n, true)
  pool.push(bytes(ev(7n, 1, 1, null)))
  await pool.flush()
  // a backlog in the ring, then a gap behind it, and no 'gap' listener to answer it
  for (let i = 0; i < 2000; i++) pool.push(bytes(ev(9n, i + 1, i + 1, i === 0 ? null : i)))
  pool.push(bytes(ev(7n, 5, 5, null)))
  const closed = await Promise.race([pool.close().then(() => true), new Promise((r) => setTimeout(() => r(false), 10_000))])
  t.equal(closed, true, 'closed')
})

t.test('answers of the worker query', async (t) => {
  t.same(answerOf('{"TooNew":{"requested_start":5,"requested_end":null,"newest_available":3}}'), { kind: 'TooNew', newest: 3n })
  t.same(
    answerOf('{"TooNew":{"requested_start":5,"requested_end":null,"newest_available":18446744073709551615}}'),
    { kind: 'TooNew', newest: 18446744073709551615n },
    'exact above 2^53',
  )
  t.match(answerOf('{"TooNew":{"requested_start":5}}'), { kind: 'refused', final: true })
  const a = answerOf('{"Events":[{"worker_id":18446744073709551615,"event":{"event_id":3,"data":"cleared","dp_rank":0}}]}')
  t.equal(a.kind, 'Events')
  t.equal(
    a.kind === 'Events' ? Buffer.from(a.events).toString() : '',
    '[{"worker_id":18446744073709551615,"event":{"event_id":3,"data":"cleared","dp_rank":0}}]',
    'the array as the worker wrote it',
  )
  t.equal(answerOf('{"TreeDump":[]}').kind, 'TreeDump')
  t.match(answerOf('{"Error":"no"}'), { kind: 'refused', why: /no/ })
  t.match(answerOf('nope'), { kind: 'refused', why: /not JSON/ })
  t.match(answerOf('{"Events":5}'), { kind: 'refused', why: /not an array/ })
  t.match(answerOf('{"Events":[],"TreeDump":[]}'), { kind: 'refused', why: /one variant/ })
  t.match(answerOf('[]'), { kind: 'refused' })
})

/**
 * A worker answering the worker query over HTTP as Dynamo's LocalKvIndexer does with its buffer
 * (lib/kv-router/src/indexer/local.rs@fb5e6949, classify_query): nothing buffered yet, any start
 * id is answered with an empty dump; a start past the newest, TooNew; else the events from it on.
 */
async function bufferedWorker(t: Test): Promise<{ url: string; buffer: RouterEvent[]; asked: string[] }> {
  const buffer: RouterEvent[] = []
  const asked: string[] = []
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (d: Buffer) => (body += d.toString()))
    req.on('end', () => {
      asked.push(body)
      const start = /"start_event_id":(\d+)/.exec(body)?.[1]
      const newest = buffer.at(-1)?.event.event_id ?? 0n
      const list = (es: RouterEvent[]): string => `[${es.map(encodeRouterEvent).join(',')}]`
      res.setHeader('content-type', 'application/json')
      if (start === undefined || buffer.length === 0) res.end(`{"TreeDump":{"events":${list(buffer)},"last_event_id":${newest}}}`)
      else if (BigInt(start) > newest) res.end(`{"TooNew":{"requested_start":${start},"requested_end":${newest},"newest_available":${newest}}}`)
      else res.end(`{"Events":{"events":${list(buffer.filter((e) => e.event.event_id >= BigInt(start)))},"last_event_id":${newest}}}`)
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => server.close())
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, buffer, asked }
}

t.test('a worker with nothing buffered is recoverable; a loss a transport reports is recovered once', async (t) => {
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const w = await bufferedWorker(t)
  const recovery = new IndexRecovery(pool, { urlOf: () => w.url, attempts: 1 })
  t.teardown(() => recovery.close())
  t.equal(await recovery.workerAdded(7n, 1), true, 'its empty dump answers the probe: rebuilt (empty), and its gaps are recovered')
  t.match(recovery.counters, { dumps: 1, ranges: 0 })

  // events 1 to 3 cached; 2 never arrives: the shard sees the ids skip and recovers the range
  w.buffer.push(ev(7n, 1, 1, null), ev(7n, 2, 2, 1), ev(7n, 3, 3, 2))
  pool.push(bytes(w.buffer[0] as RouterEvent))
  pool.push(bytes(w.buffer[2] as RouterEvent))
  // the event plane saw the same loss in its sequence numbers, after pushing the message
  t.equal(await recovery.rankLost(7n, 0), false, 'not recovered a second time')
  await until(() => recovery.counters.ranges === 1)
  t.same(canon(await pool.overlapScores(chainOf(3), { readYourWrites: true })), ['7:0=3/3'])
  t.match(recovery.counters, { gaps: 1, ranges: 1, dumps: 1, covered: 1, failed: 0 }, "one gap, the shard's")

  // a loss the ids do not show (event 4 follows 3): the rank is rebuilt from a dump
  w.buffer.push(ev(7n, 4, 4, 3), ev(7n, 5, 5, 4))
  pool.push(bytes(w.buffer[3] as RouterEvent))
  t.equal(await recovery.rankLost(7n, 0), true, 'rebuilt from a dump')
  t.match(recovery.counters, { gaps: 2, ranges: 1, dumps: 2, covered: 1, failed: 0 })
  t.same(canon(await pool.overlapScores(chainOf(5), { readYourWrites: true })), ['7:0=5/5'], 'the dump holds every cached block')
  t.equal(w.asked.filter((b) => b.includes('"start_event_id":null')).length, 2, 'two dumps asked for')
})
