// The shard pool against the single-threaded index, 1 to 4 shards: the same answers.
import t from 'tap'
import { ShardPool } from '../../src/shards/pool.js'
import { KvIndex, type OverlapScore } from '../../src/index/kv-index.js'
import { encodeRouterEvent, toDecoded, type RouterEvent } from '../../src/codec/events.js'
import { Rng } from '../helpers/rng.js'
import { EventStream, WORKERS, randomQuery } from '../helpers/random-events.js'

const key = (s: OverlapScore): string => `${s.worker_id}:${s.dp_rank}=${s.overlap_blocks}/${s.tree_size}`
const canon = (xs: OverlapScore[]): string[] => xs.map(key).sort()
const bytes = (ev: RouterEvent): Uint8Array => Buffer.from(encodeRouterEvent(ev))

for (const shards of [1, 2, 3, 4]) {
  t.test(`${shards} shard(s) answer exactly as the single-threaded index`, async (t) => {
    // a small ring: messages wrap around, some are larger than half of it, and it fills up
    const pool = await ShardPool.start({ shards, ringBytes: 4096, querySlots: 16 })
    t.teardown(() => pool.close())
    const reference = new KvIndex()
    const rng = new Rng(100 + shards)
    const stream = new EventStream(rng, WORKERS, 40)
    let mismatches = 0
    let checked = 0
    const background: Promise<unknown>[] = []
    for (let step = 0; step < 1200; step++) {
      const { ev, forget } = stream.next()
      if (ev !== undefined) {
        pool.push(bytes(ev))
        reference.apply(toDecoded(ev))
      } else if (forget !== undefined) {
        await pool.removeWorker(forget)
        reference.removeWorker(Number(forget & 0xffffffffn), Number(forget >> 32n))
      }
      // queries without a barrier run concurrently with the pushes
      if (step % 7 === 0) background.push(pool.overlapScores(randomQuery(rng)))
      if (step % 40 === 39) {
        const qs = Array.from({ length: 8 }, () => randomQuery(rng))
        const answers = await Promise.all(qs.map((q) => pool.overlapScores(q, { readYourWrites: true })))
        answers.forEach((a, i) => {
          checked++
          const want = canon(reference.overlapScores(qs[i] as bigint[]))
          if (JSON.stringify(canon(a)) !== JSON.stringify(want)) {
            mismatches++
            if (mismatches < 3) t.same(canon(a), want, `step ${step}, query ${(qs[i] as bigint[]).join(',')}`)
          }
          if (a.recoveringShards.length !== 0) mismatches++
        })
      }
    }
    const done = await Promise.all(background)
    t.equal(done.length, background.length, 'concurrent queries all answered')
    await pool.flush()
    t.equal(mismatches, 0, `${checked} read-your-writes answers matched`)
    const c = pool.counters()
    t.equal(
      c.reduce((s, x) => s + x.blocks, 0),
      reference.liveEntries,
      'blocks held, summed over shards',
    )
    t.equal(
      c.reduce((s, x) => s + x.malformed, 0),
      0,
    )
    if (shards === 1) t.ok(c[0] !== undefined && c[0].ringFull > 0, 'the ring filled and the producer waited')
    // a dump of all shards rebuilds the same index
    const copy = new KvIndex()
    for (const ev of await pool.dump()) copy.apply(toDecoded(ev))
    for (let i = 0; i < 50; i++) {
      const q = randomQuery(rng)
      t.same(canon(copy.overlapScores(q)), canon(reference.overlapScores(q)), `dump replay answers ${q.join(',')}`)
    }
  })
}
