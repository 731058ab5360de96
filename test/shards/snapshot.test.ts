// Binary snapshots through the shard pool (ShardPool.snapshot, loadSnapshot): a snapshot of a
// pool, loaded into a pool of another shard count, holds the same index (the same dump, tree
// sizes, last event ids and answers) and goes on as the original under the same events; a
// truncated or corrupt snapshot is refused and counted, and nothing of it is applied in any
// shard; a snapshot takes its place among the events where its records enter the rings.
import t from 'tap'
import { ShardPool } from '../../src/shards/pool.js'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'
import type { OverlapScore } from '../../src/index/kv-index.js'
import { PART_HEAD, readSnapshot } from '../../src/index/snapshot-format.js'
import { isKvrError } from '../../src/errors.js'
import { Rng } from '../helpers/rng.js'
import { EventStream, WORKERS, randomQuery } from '../helpers/random-events.js'
import { chain, removed } from '../helpers/events.js'
import { dumpPaths } from '../helpers/dump-paths.js'

const bytes = (ev: RouterEvent): Uint8Array => Buffer.from(encodeRouterEvent(ev))
const key = (s: OverlapScore): string => `${s.worker_id}:${s.dp_rank}=${s.overlap_blocks}/${s.tree_size}`

async function sizes(pool: ShardPool): Promise<string> {
  return (await pool.treeSizes())
    .map((s) => `${s.worker_id}:${s.dp_rank}=${s.tree_size}@${s.last_event_id ?? '-'}`)
    .sort()
    .join(' ')
}

async function answers(pool: ShardPool, queries: bigint[][]): Promise<string> {
  const out: string[] = []
  for (const q of queries) out.push((await pool.overlapScores(q, { readYourWrites: true })).map(key).sort().join(','))
  return out.join('\n')
}

async function state(pool: ShardPool, queries: bigint[][]): Promise<string> {
  return `${await sizes(pool)}\n${dumpPaths(await pool.dump())}\n${await answers(pool, queries)}`
}

async function feed(pool: ShardPool, stream: EventStream, steps: number, also?: ShardPool): Promise<void> {
  for (let i = 0; i < steps; i++) {
    const { ev, forget } = stream.next()
    if (ev !== undefined) {
      pool.push(bytes(ev))
      also?.push(bytes(ev))
    } else if (forget !== undefined) {
      await pool.removeWorker(forget)
      await also?.removeWorker(forget)
    }
  }
  await pool.flush()
  await also?.flush()
}

t.test('a snapshot loaded into a pool of another shard count holds the same index, and goes on as the original', async (t) => {
  const rng = new Rng(7)
  const queries = Array.from({ length: 30 }, () => randomQuery(rng))
  const source = await ShardPool.start({ shards: 2 })
  t.teardown(() => source.close())
  // more workers than the helpers' five: each shard holds several
  const workers = [...WORKERS, 11n, 12n, 13n, 2n ** 63n + 17n]
  const stream = new EventStream(new Rng(8), workers, 40)
  await feed(source, stream, 1500)
  await source.ensureWorker(31n, 4)
  const want = await state(source, queries)
  t.ok((await source.treeSizes()).length >= 12, 'several workers and dp ranks')
  const snap = await source.snapshot()
  const parts = readSnapshot(snap)
  t.equal(parts.length, 2, 'a part per shard')
  t.equal(
    parts.reduce((n, p) => n + p.entries, 0),
    source.counters().reduce((n, c) => n + c.blocks, 0),
    'every block entry',
  )
  for (const shards of [1, 2, 3]) {
    const target = await ShardPool.start({ shards })
    const loaded = await target.loadSnapshot(snap)
    t.equal(loaded.parts, 2)
    t.equal(await state(target, queries), want, `${shards} shard(s): the same dump, tree sizes, last event ids and answers`)
    t.equal(target.snapshotsRefused, 0)
    if (shards === 2) {
      t.equal(Buffer.compare(Buffer.from(await target.snapshot()), Buffer.from(snap)), 0, 'the same shard count writes the same snapshot, byte for byte')
      // the same events from here on: the same index (gaps, re-links, MIXED nodes and all)
      await feed(source, stream, 600, target)
      t.equal(await state(target, queries), await state(source, queries), 'after 600 more events, the same index')
    }
    await target.close()
  }
})

t.test('a truncated or corrupt snapshot is refused, counted, and applied in no shard', async (t) => {
  const rng = new Rng(3)
  const queries = Array.from({ length: 20 }, () => randomQuery(rng))
  const source = await ShardPool.start({ shards: 3 })
  t.teardown(() => source.close())
  await feed(source, new EventStream(new Rng(4), WORKERS, 30), 800)
  const snap = await source.snapshot()
  const target = await ShardPool.start({ shards: 3 })
  t.teardown(() => target.close())
  // the target holds blocks of its own, of workers the snapshot names too
  for (const w of WORKERS) target.push(bytes(chain(w, null, [1, 2, 3])))
  await target.flush()
  const before = await state(target, queries)
  const parts = readSnapshot(snap)
  const last = parts[parts.length - 1] as { offset: number; length: number; entries: number }
  t.ok(last.entries > 0)
  const flipped = snap.slice()
  flipped[last.offset + last.length - 9] = (flipped[last.offset + last.length - 9] as number) ^ 0x40
  const headless = snap.slice()
  headless[last.offset + PART_HEAD.nodes] = (headless[last.offset + PART_HEAD.nodes] as number) + 1
  const cases: [string, Uint8Array, RegExp][] = [
    ['truncated', snap.subarray(0, snap.length - 100), /truncated/],
    ['cut inside its header', snap.subarray(0, 20), /truncated/],
    ["a byte of the last shard's part flipped", flipped, /checksum does not match/],
    ["a part's head changed", headless, /its head says otherwise/],
    ['JSON', Buffer.from('[]'), /not a kv-router binary snapshot/],
  ]
  let n = 0
  for (const [what, b, re] of cases) {
    await t.rejects(target.loadSnapshot(b), { code: 'KVR_ERR_SNAPSHOT_INVALID', message: re }, what)
    t.equal(target.snapshotsRefused, ++n, `${what}: counted`)
    t.equal(await state(target, queries), before, `${what}: nothing of it applied, in any shard`)
  }
  // and a sound one after them loads
  await target.loadSnapshot(snap)
  t.equal(await state(target, queries), await state(source, queries), 'the sound snapshot then loads')
})

t.test('a snapshot takes its place among the events where its records enter the rings', async (t) => {
  const source = await ShardPool.start({ shards: 1 })
  t.teardown(() => source.close())
  source.push(bytes(chain(1, null, [1, 2, 3])))
  source.push(bytes(chain(2, null, [1, 5])))
  await source.flush()
  const snap = await source.snapshot()
  const target = await ShardPool.start({ shards: 2 })
  t.teardown(() => target.close())
  // before: replaced by the snapshot; a worker it does not name: kept
  target.push(bytes(chain(1, null, [7, 8])))
  target.push(bytes(chain(3, null, [1, 9])))
  await target.flush()
  await target.loadSnapshot(snap)
  // after: applied on top
  target.push(bytes(chain(1, 3, [4])))
  target.push(bytes(removed(2, [500])))
  await target.flush()
  const dump = dumpPaths(await target.dump())
  t.equal(dump, ['1:0 100=1 200=1/2 300=1/2/3 400=1/2/3/4', '2:0 100=1', '3:0 100=1 900=1/9'].join('\n'))
  const scores = await target.overlapScores([1n, 2n, 3n, 4n])
  t.same(scores.map(key).sort(), ['1:0=4/4', '2:0=1/1', '3:0=1/2'])
})

t.test('a snapshot of an empty pool loads as nothing', async (t) => {
  const a = await ShardPool.start({ shards: 2 })
  t.teardown(() => a.close())
  const snap = await a.snapshot()
  const r = await a.loadSnapshot(snap)
  t.same(r, { parts: 2, workerRanks: 0, entries: 0 })
  t.same(await a.treeSizes(), [])
  t.ok(isKvrError(await a.loadSnapshot(snap.subarray(0, 10)).catch((e: unknown) => e), 'KVR_ERR_SNAPSHOT_INVALID'))
})
