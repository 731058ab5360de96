// The shard pool's lifecycle: a shard killed, stalled or exiting; shutdown that drains; close with work in flight.
import t from 'tap'
import { once } from 'node:events'
import { ShardPool } from '../../src/shards/pool.js'
import { KvIndex } from '../../src/index/kv-index.js'
import { encodeRouterEvent, toDecoded, type RouterEvent } from '../../src/codec/events.js'
import { Rng } from '../helpers/rng.js'
import { EventStream, WORKERS } from '../helpers/random-events.js'
import { chain } from '../helpers/events.js'

const bytes = (ev: RouterEvent): Uint8Array => Buffer.from(encodeRouterEvent(ev))

t.test('a killed shard is restarted and reported as recovering until rebuilt', async (t) => {
  const pool = await ShardPool.start({ shards: 2, heartbeatMs: 20, stallMs: 300 })
  t.teardown(() => pool.close())
  const workers = [11n, 12n, 13n, 14n, 15n, 16n]
  for (const w of workers) pool.push(bytes(chain(w, null, [1, 2, 3])))
  await pool.flush()
  t.equal((await pool.overlapScores([1n, 2n, 3n])).length, workers.length)
  const victim = pool.shardOf(11n)
  const restarted = once(pool, 'shardRestarted')
  await pool.terminateShard(victim)
  const [which] = (await restarted) as [number]
  t.equal(which, victim)
  t.equal(pool.health()[victim], 'recovering')
  const after = await pool.overlapScores([1n, 2n, 3n])
  t.same(after.recoveringShards, [victim], 'the answer says which shard is not exact')
  const survivors = workers.filter((w) => pool.shardOf(w) !== victim)
  t.same(after.map((s) => s.worker_id).sort(), survivors.sort(), 'the empty shard contributes nothing')
  // the restarted shard takes events again
  pool.push(bytes(chain(11n, null, [1])))
  t.ok((await pool.overlapScores([1n], { readYourWrites: true })).some((s) => s.worker_id === 11n))
  pool.markRebuilt(victim)
  t.same((await pool.overlapScores([1n])).recoveringShards, [])
  t.same(pool.health(), ['exact', 'exact'])
  t.equal(pool.counters()[victim]?.restarts, 1)
})

t.test('a stalled shard is detected by its heartbeat, and a query it owed still completes', async (t) => {
  const pool = await ShardPool.start({ shards: 2, heartbeatMs: 20, stallMs: 250 })
  t.teardown(() => pool.close())
  pool.push(bytes(chain(21n, null, [1])))
  pool.push(bytes(chain(22n, null, [1])))
  await pool.flush()
  const stalled = once(pool, 'shardStalled')
  const restarted = once(pool, 'shardRestarted')
  pool.blockShard(0, 5000)
  await new Promise((r) => setTimeout(r, 50))
  const owed = pool.overlapScores([1n])
  t.same(await stalled, [0])
  await restarted
  const r = await owed
  t.same(r.recoveringShards, [0], 'the query waited for shard 0, which died: answered as recovering')
  t.equal(pool.health()[0], 'recovering')
})

t.test('shutdown drains: every event enqueued before close is applied or reported', async (t) => {
  const pool = await ShardPool.start({ shards: 2, ringBytes: 1024 })
  const rng = new Rng(5)
  const stream = new EventStream(rng, WORKERS, 30)
  const reference = new KvIndex()
  let pushed = 0
  let queued = 0
  while (pushed < 3000) {
    const { ev } = stream.next()
    if (ev === undefined) continue
    if (!pool.push(bytes(ev))) queued++
    reference.apply(toDecoded(ev))
    pushed++
  }
  t.ok(queued > 0, `${queued} pushes were queued behind a full ring`)
  const report = await pool.close()
  t.equal(
    report.reduce((s, x) => s + x.enqueued, 0),
    pushed,
  )
  t.equal(
    report.reduce((s, x) => s + x.processed, 0),
    pushed,
    'every message was processed',
  )
  t.equal(
    report.reduce((s, x) => s + x.received, 0),
    pushed,
  )
  t.equal(
    report.reduce((s, x) => s + x.lost + x.pendingMessages, 0),
    0,
  )
  t.equal(
    report.reduce((s, x) => s + x.blocks, 0),
    reference.liveEntries,
    'and applied as the reference applied them',
  )
  await t.rejects(pool.overlapScores([1n]), { code: 'KVR_ERR_SHUTTING_DOWN' })
})

t.test('close with a query in flight, and a shard that dies while the pool closes', async (t) => {
  const pool = await ShardPool.start({ shards: 2, heartbeatMs: 20, stallMs: 5000 })
  pool.push(bytes(chain(31n, null, [1])))
  pool.push(bytes(chain(32n, null, [1])))
  await pool.flush()
  const victim = pool.shardOf(31n)
  pool.blockShard(victim, 400)
  await new Promise((r) => setTimeout(r, 30))
  const inFlight = pool.overlapScores([1n])
  const closing = pool.close()
  await t.rejects(pool.overlapScores([1n]), { code: 'KVR_ERR_SHUTTING_DOWN' }, 'no new query once closing')
  t.throws(() => pool.push(bytes(chain(33n, null, [1]))), { code: 'KVR_ERR_SHUTTING_DOWN' })
  await pool.terminateShard(victim)
  const report = await closing
  t.equal(report.length, 2, 'close() settled although a shard died during it')
  const answer = await inFlight
  t.ok(answer.recoveringShards.includes(victim), 'the query in flight was answered, saying which shard is missing')
})

t.test('a control call on a shard that exits rejects instead of waiting forever', async (t) => {
  const pool = await ShardPool.start({ shards: 1, heartbeatMs: 20, stallMs: 250 })
  t.teardown(() => pool.close())
  pool.push(bytes(chain(41n, null, [1])))
  pool.blockShard(0, 3000)
  await new Promise((r) => setTimeout(r, 30))
  pool.push(bytes(chain(42n, null, [1])))
  await t.rejects(pool.flush(), { code: 'KVR_ERR_SHARD_RESTARTED' })
  t.equal(pool.counters()[0]?.restarts, 1)
  t.equal(pool.health()[0], 'recovering')
  await t.resolves(pool.flush(), 'the replacement shard answers control calls')
})
