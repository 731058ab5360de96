// The shard pool: malformed messages, options, control records in order with events, waking a
// sleeping shard, the ring under a backlog, misrouted events, the backlog cap.
import t from 'tap'
import { once } from 'node:events'
import { ShardPool } from '../../src/shards/pool.js'
import type { OverlapScore } from '../../src/index/kv-index.js'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'
import { chain, stored } from '../helpers/events.js'

const key = (s: OverlapScore): string => `${s.worker_id}:${s.dp_rank}=${s.overlap_blocks}/${s.tree_size}`
const canon = (xs: OverlapScore[]): string[] => xs.map(key).sort()
const bytes = (ev: RouterEvent): Uint8Array => Buffer.from(encodeRouterEvent(ev))

t.test('malformed messages are counted, not applied, and do not stop the shard', async (t) => {
  const pool = await ShardPool.start({ shards: 2 })
  t.teardown(() => pool.close())
  pool.push(Buffer.from('{"worker_id":1,"event":'))
  pool.push(Buffer.from('not json at all'))
  pool.push(bytes(chain(1, null, [1, 2])))
  await pool.flush()
  const c = pool.counters()
  t.equal(
    c.reduce((s, x) => s + x.malformed, 0),
    2,
  )
  t.equal(
    c.reduce((s, x) => s + x.applied, 0),
    1,
  )
  const r = await pool.overlapScores([1n, 2n])
  t.same(canon(r), ['1:0=2/2'])
})

t.test('options are validated', async (t) => {
  await t.rejects(ShardPool.start({ shards: 0 }), { code: 'KVR_ERR_INVALID_OPTION', message: /shards/ })
  await t.rejects(ShardPool.start({ ringBytes: 1000 }), { code: 'KVR_ERR_INVALID_OPTION', message: /ringBytes/ })
  await t.rejects(ShardPool.start({ shards: 32 }), { code: 'KVR_ERR_INVALID_OPTION', message: /shards.*31/ })
})

t.test('removeWorker applies in order with the events around it; control bytes cannot be injected', async (t) => {
  const pool = await ShardPool.start({ shards: 2, ringBytes: 4096 })
  t.teardown(() => pool.close())
  pool.push(bytes(chain(51n, null, [1, 2])))
  const removal = pool.removeWorker(51n)
  pool.push(bytes(chain(51n, null, [3])))
  await removal
  const after = await pool.overlapScores([3n], { readYourWrites: true })
  t.same(canon(after), ['51:0=1/1'], 'the event pushed after the removal survives it')
  t.same(canon(await pool.overlapScores([1n, 2n])), [], 'the events before it are gone')
  // a message shaped like a control record is refused at intake, not obeyed
  const forged = new Uint8Array(12)
  forged[1] = 1
  new DataView(forged.buffer).setUint32(4, 51, true)
  pool.push(forged)
  pool.push(new Uint8Array(0))
  t.equal(pool.rejectedAtIntake, 2)
  t.same(canon(await pool.overlapScores([3n], { readYourWrites: true })), ['51:0=1/1'])
})

t.test('a control call or a query wakes a shard asleep in its futex wait at once', async (t) => {
  // A heartbeat of 30 s: a shard that is not woken sleeps that long, so a call that waited for
  // the heartbeat would take seconds, not milliseconds.
  const pool = await ShardPool.start({ shards: 1, heartbeatMs: 30_000, stallMs: 120_000, shardSpinUs: 0, querySpinUs: 0 })
  t.teardown(() => pool.close())
  const ev: RouterEvent = {
    worker_id: 7n,
    event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 11n, tokens_hash: 21n }] } } },
  }
  pool.push(Buffer.from(encodeRouterEvent(ev)))
  await pool.flush()
  for (let round = 0; round < 5; round++) {
    // long enough for the shard to finish its turn and fall asleep
    await new Promise((r) => setTimeout(r, 50))
    let t0 = performance.now()
    const stats = await pool.stats()
    t.ok(performance.now() - t0 < 1000, `round ${round}: stats() answered while the shard slept (${(performance.now() - t0).toFixed(1)} ms)`)
    t.equal(stats[0]?.blocks, 1)
    await new Promise((r) => setTimeout(r, 50))
    t0 = performance.now()
    const scores = await pool.overlapScores([21n])
    t.ok(performance.now() - t0 < 1000, `round ${round}: a query was answered while the shard slept`)
    t.equal(scores[0]?.overlap_blocks, 1)
  }
})

t.test('a full ring wakes its producer once per half ring freed, not once per batch the shard reads', async (t) => {
  const RING = 64 * 1024
  const pool = await ShardPool.start({ shards: 1, ringBytes: RING })
  t.teardown(() => pool.close())
  // small messages: the shard reads 64 per batch, a fraction of what a half ring holds
  const msgs = Array.from({ length: 20_000 }, (_, i) => Buffer.from(encodeRouterEvent(chain(1, null, [i + 1]))))
  const total = msgs.reduce((n, m) => n + m.length + 8, 0)
  let queued = 0
  for (const m of msgs) if (!pool.push(m)) queued++
  if (queued > 0) await once(pool, 'drain')
  await pool.flush()
  const [c] = pool.counters()
  t.ok(c !== undefined && c.ringFull > 0, 'the ring filled')
  // one wake per half ring, with room for a few 50 ms timeouts on a busy machine; waking per
  // batch takes about 2.5 times the half-ring count here
  const bound = Math.ceil((1.5 * total) / (RING / 2)) + 10
  t.ok(c !== undefined && c.ringWaits > 0 && c.ringWaits <= bound, `${c?.ringWaits} waits for ${total} bytes through a ${RING}-byte ring (at most ${bound})`)
  t.equal(c?.applied, msgs.length, 'every message applied')
})

t.test('a busy shard takes control calls and answers barriers mid-backlog, not when it runs dry', async (t) => {
  // The periodic turn of the event loop is pushed out to an hour, so the only ways a call can be
  // taken in before the backlog is done are the ones under test: the posted-call counter, and
  // the turn taken once a barrier is released.
  const pool = await ShardPool.start({ shards: 1, ringBytes: 64 * 1024 * 1024, shardYieldMaxMs: 3_600_000 })
  t.teardown(() => pool.close())
  // events of 64 fresh blocks each: about half a second of work per backlog here
  const backlog = (base: number): Uint8Array[] =>
    Array.from({ length: 1500 }, (_, i) => {
      const first = base + i * 64
      return bytes(
        stored(
          3,
          null,
          Array.from({ length: 64 }, (_, k) => [first + k + 1, first + k + 1] as [number, number]),
        ),
      )
    })
  const a = backlog(0)
  const b = backlog(1_000_000)
  let refused = 0
  for (const m of a) if (!pool.push(m)) refused++
  const statsAt = pool.stats().then(() => pool.counters()[0]?.processed ?? -1)
  const flushedAt = pool.flush().then(() => pool.counters()[0]?.processed ?? -1)
  for (const m of b) if (!pool.push(m)) refused++
  t.equal(refused, 0, 'both backlogs fit in the ring')
  const total = a.length + b.length
  const s = await statsAt
  t.ok(s < total, `stats() answered with ${s} of ${total} messages processed`)
  const f = await flushedAt
  t.ok(f >= a.length, 'the barrier waited for every message pushed before it')
  t.ok(f < total, `and was answered with ${f} of ${total} processed, before the later backlog was done`)
  await pool.flush()
  t.equal(pool.counters()[0]?.processed, total)
})

t.test("an event the intake sends to the wrong shard goes on to its own, and its worker's later events reach it", async (t) => {
  const pool = await ShardPool.start({ shards: 2, ringBytes: 4096 })
  t.teardown(() => pool.close())
  // two workers on different shards
  let a = 1n
  while (pool.shardOf(a) !== 0) a++
  let b = 1n
  while (pool.shardOf(b) !== 1) b++
  const json = (ev: RouterEvent): string => Buffer.from(encodeRouterEvent(ev)).toString('utf8')
  // the scan meets a's id first (an unknown key, nested) and the decoder reads b's; an escaped key
  // hides b's id from the scan altogether; an envelope names a as its publisher
  const nested = `{"trace":{"worker_id":${a}},${json(chain(b, null, [1, 2])).slice(1)}`
  const escaped = json(chain(b, 2, [3])).replace('"worker_id"', '"worker\\u005fid"')
  pool.push(Buffer.from(nested))
  pool.push(Buffer.from(escaped))
  // the bounce takes a message to the main thread and back: wait for it, then flush its shard
  for (let i = 0; i < 100 && pool.rerouted < 2; i++) await new Promise((r) => setTimeout(r, 10))
  t.equal(pool.rerouted, 2, 'both sent on')
  await pool.flush()
  const c = pool.counters()
  t.equal((c[0]?.misplaced ?? 0) + (c[1]?.misplaced ?? 0), 2, 'counted as misplaced where they landed')
  t.same(canon(await pool.overlapScores([1n, 2n, 3n], { readYourWrites: true })), [`${b}:0=3/3`], 'applied, once, for the worker they name')
  // the worker's own cleared reaches the shard that holds its blocks
  pool.push(bytes({ worker_id: b, event: { event_id: 9n, dp_rank: 0, data: 'cleared' } }))
  t.same(canon(await pool.overlapScores([1n, 2n, 3n], { readYourWrites: true })), [], 'cleared where they are')
})

t.test('offer() drops past the backlog cap, counted; push() always queues', async (t) => {
  // offers in one synchronous loop outrun the shard: its small ring fills and the rest wait in the backlog
  const pool = await ShardPool.start({ shards: 1, ringBytes: 1024, maxPendingBytes: 4096 })
  t.teardown(() => pool.close())
  const msg = bytes(chain(5n, null, [1, 2, 3, 4, 5, 6, 7, 8]))
  for (let i = 0; i < 2000; i++) pool.offer(msg)
  t.ok(pool.dropped > 0, `${pool.dropped} dropped`)
  t.ok(pool.pendingBytes < 4096 + msg.length, `the backlog stays at the cap (${pool.pendingBytes} bytes)`)
  t.equal(pool.backlogFull, pool.pendingBytes >= 4096)
  const before = pool.dropped
  pool.push(msg)
  t.equal(pool.dropped, before, 'push() never drops')
  await pool.flush()
  t.equal(pool.pendingBytes, 0, 'the backlog drains to nothing')
  t.notOk(pool.backlogFull)
  t.same(canon(await pool.overlapScores([1n, 2n, 3n, 4n, 5n, 6n, 7n, 8n])), ['5:0=8/8'], 'what was taken was applied')
  t.ok(pool.counters()[0]?.received === 2001 - pool.dropped, 'every offer taken reached the shard, every other was dropped')
})
