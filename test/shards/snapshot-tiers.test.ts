// Lower storage tiers through the shard pool: host and disk blocks pushed as events are answered
// in the merged overlap (overlapHost, overlapDisk), survive a binary snapshot (version 2) loaded
// into a pool of another shard count, and the pool's dump replays them exactly.
import t from 'tap'
import { ShardPool } from '../../src/shards/pool.js'
import { encodeRouterEvent, type RouterEvent, type StorageTierName } from '../../src/codec/events.js'
import { HEADER } from '../../src/index/snapshot-format.js'
import { chain } from '../helpers/events.js'

const push = (pool: ShardPool, ev: RouterEvent, tier?: StorageTierName): boolean =>
  pool.push(Buffer.from(encodeRouterEvent(tier === undefined ? ev : { ...ev, storage_tier: tier })))

async function tiers(pool: ShardPool, toks: number[]): Promise<string> {
  const lo = Uint32Array.from(toks)
  const r = await pool.query(lo, new Uint32Array(toks.length), toks.length, { readYourWrites: true })
  const out: string[] = []
  for (let i = 0; i < r.count; i++) out.push(`${r.workerIdLo[i]}:${r.dpRank[i]}=${r.overlap[i]}/${r.overlapHost?.[i] ?? '-'}/${r.overlapDisk?.[i] ?? '-'}`)
  return out.sort().join(' ')
}

t.test('tiers through the query board, a snapshot and a dump', async (t) => {
  const source = await ShardPool.start({ shards: 2 })
  t.teardown(() => source.close())
  push(source, chain(1, null, [1, 2]))
  push(source, chain(1, 2, [3]), 'host_pinned')
  push(source, chain(1, 3, [4]), 'disk')
  push(source, chain(2, null, [1, 2, 3]), 'host_pinned')
  push(source, chain(3, null, [1, 2, 3, 4]))
  push(source, chain(4, null, [9]))
  await source.flush()
  const q = [1, 2, 3, 4, 5]
  const want = '1:0=2/3/4 2:0=0/3/3 3:0=4/4/4'
  t.equal(await tiers(source, q), want)
  t.equal(await tiers(source, [9]), '4:0=1/-/-', 'no tier beyond the device: the answer has no tier columns')
  t.same(
    source.counters().reduce((s, c) => s + c.lowerBlocks, 0),
    5,
    'lower-tier blocks counted',
  )
  const snap = await source.snapshot()
  t.equal(new DataView(snap.buffer, snap.byteOffset).getUint32(HEADER.version, true), 2, 'version 2: it holds lower-tier blocks')
  const copy = await ShardPool.start({ shards: 3 })
  t.teardown(() => copy.close())
  await copy.loadSnapshot(snap)
  t.equal(await tiers(copy, q), want, 'the snapshot restores every tier')
  const replayed = await ShardPool.start({ shards: 1 })
  t.teardown(() => replayed.close())
  for (const ev of await source.dump()) push(replayed, ev)
  await replayed.flush()
  t.equal(await tiers(replayed, q), want, 'the dump restores every tier')
})
