// Lower storage tiers in the index (src/index/lower-tiers.ts): host_pinned, disk and external blocks
// are residencies of their own beside the device copy, and a query extends each worker-rank's
// device match through host, then disk and external, as Dynamo's lower-tier continuation does
// (lib/kv-router/src/indexer/lower_tier_indexers.rs@1783f723, query_lower_tiers).
import t from 'tap'
import { KvIndex, RejectReason } from '../../src/index/kv-index.js'
import { checkPart } from '../../src/index/snapshot-format.js'
import { type RouterEvent, type StorageTierName, toDecoded } from '../../src/codec/events.js'
import { chain, cleared, removed } from '../helpers/events.js'

function apply(index: KvIndex, ev: RouterEvent): number {
  return index.apply(toDecoded(ev))
}
const tier = (ev: RouterEvent, name: StorageTierName): RouterEvent => ({ ...ev, storage_tier: name })

/** "worker:rank" → [device, through host, through disk]. */
function tiers(index: KvIndex, toks: number[]): Record<string, [number, number, number]> {
  const out: Record<string, [number, number, number]> = {}
  for (const s of index.overlapScores(toks.map(BigInt))) {
    out[`${s.worker_id}:${s.dp_rank}`] = [s.overlap_blocks, s.overlap_host ?? s.overlap_blocks, s.overlap_disk ?? s.overlap_blocks]
  }
  return out
}

t.test('a host-tier chain continues the device match; disk continues host; both cumulative', async (t) => {
  const ix = new KvIndex()
  t.equal(apply(ix, chain(1, null, [1, 2])), 0)
  t.equal(apply(ix, tier(chain(1, 2, [3, 4]), 'host_pinned')), 0)
  t.equal(apply(ix, tier(chain(1, 4, [5]), 'disk')), 0)
  t.same(tiers(ix, [1, 2, 3, 4, 5, 6]), { '1:0': [2, 4, 5] })
  t.same(tiers(ix, [1, 2, 3, 9, 5]), { '1:0': [2, 3, 3] }, 'a mismatch stops the extension')
  t.equal(ix.liveEntries, 2, 'device entries alone')
  t.equal(ix.lowerEntries, 3)
  t.same(ix.lowerTierBlocks(), [2, 1, 0])
  t.same(
    ix.treeSizes().map((s) => [s.tree_size, s.lower_tier_blocks]),
    [[2, 3]],
  )
})

t.test('a worker-rank with nothing on device matches from the root of its lower tiers', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3]))
  apply(ix, tier(chain(2, null, [1, 2]), 'host_pinned'))
  apply(ix, tier(chain(3, null, [1]), 'disk'))
  t.same(tiers(ix, [1, 2, 3]), { '1:0': [3, 3, 3], '2:0': [0, 2, 2], '3:0': [0, 0, 1] })
  t.same(tiers(ix, [7, 1]), {}, 'no match from the middle')
})

t.test('the host copy of a block is its own residency: removing one tier keeps the other', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2]))
  apply(ix, tier(chain(1, null, [1, 2]), 'host_pinned'))
  t.same(tiers(ix, [1, 2]), { '1:0': [2, 2, 2] })
  // device evicts block 2 (offloaded): the host copy carries the match on
  t.equal(apply(ix, removed(1, [200])), 0)
  t.same(tiers(ix, [1, 2]), { '1:0': [1, 2, 2] })
  // the host tier drops block 1: the device copy stays
  t.equal(apply(ix, tier(removed(1, [100]), 'host_pinned')), 0)
  t.same(tiers(ix, [1, 2]), { '1:0': [1, 2, 2] }, 'host block 2 still continues from device block 1 (its parent hash)')
  t.equal(apply(ix, tier(removed(1, [100]), 'host_pinned')), 1 + RejectReason.BlockNotFound, 'a second remove finds nothing')
  t.equal(apply(ix, tier(removed(1, [200]), 'disk')), 1 + RejectReason.BlockNotFound, 'tiers are separate')
  t.equal(ix.lowerEntries, 1)
})

t.test('cleared, of any tier, clears every tier of the worker', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1]))
  apply(ix, tier(chain(1, 1, [2]), 'host_pinned'))
  apply(ix, tier(chain(1, 2, [3]), 'disk'))
  apply(ix, tier(chain(2, null, [1, 2]), 'host_pinned'))
  t.equal(apply(ix, tier(cleared(1), 'host_pinned')), 0)
  t.same(tiers(ix, [1, 2, 3]), { '2:0': [0, 2, 2] })
  t.equal(ix.lowerEntries, 2)
  t.equal(ix.removeWorker(2, 0), 2, 'remove_worker drops its lower-tier blocks')
  t.equal(ix.lowerEntries, 0)
  t.same(tiers(ix, [1, 2, 3]), {})
})

t.test('a host block in the middle of a device chain extends to its end, not past it', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3, 4]))
  apply(ix, tier(chain(1, 2, [3]), 'host_pinned'))
  // device loses block 3 (offloaded), so device block 4 is cut off; host 3 continues device 2
  apply(ix, removed(1, [300]))
  t.same(tiers(ix, [1, 2, 3, 4]), { '1:0': [2, 3, 3] }, "the continuation does not go back to device blocks (Dynamo's walk)")
})

t.test('dp ranks are separate worker-ranks in every tier', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1], 0))
  apply(ix, tier(chain(1, 1, [2, 3], 1), 'host_pinned'))
  apply(ix, tier(chain(1, 1, [2], 0), 'disk'))
  t.same(tiers(ix, [1, 2, 3]), { '1:0': [1, 1, 2] }, 'rank 1 holds no device block 1 for its host chain to continue')
  apply(ix, chain(1, null, [1], 1))
  t.same(tiers(ix, [1, 2, 3]), { '1:0': [1, 1, 2], '1:1': [1, 3, 3] })
})

t.test('external blocks extend after disk, into the disk overlap', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1]))
  apply(ix, tier(chain(1, 1, [2]), 'disk'))
  apply(ix, tier(chain(1, 2, [3]), 'external'))
  t.same(tiers(ix, [1, 2, 3, 4]), { '1:0': [1, 1, 3] })
})

t.test('a conflicting lower-tier store keeps the first mapping; the cap counts every tier', async (t) => {
  const ix = new KvIndex({ maxBlocks: 3 })
  apply(ix, tier(chain(1, null, [1]), 'host_pinned'))
  // same (parent, tokens) to another hash: ignored
  apply(
    ix,
    tier(
      {
        ...chain(1, null, [1]),
        event: { ...chain(1, null, [1]).event, data: { stored: { parent_hash: null, blocks: [{ block_hash: 999n, tokens_hash: 1n }] } } },
      },
      'host_pinned',
    ),
  )
  t.equal(ix.lowerEntries, 1)
  apply(ix, chain(1, null, [1, 2]))
  t.equal(apply(ix, tier(chain(1, 2, [3, 4]), 'disk')), 1 + RejectReason.Capacity)
  t.equal(ix.liveEntries + ix.lowerEntries, 3)
  t.equal(apply(ix, chain(2, null, [7])), 1 + RejectReason.Capacity, 'device stores see the lower tiers in the cap')
})

t.test('the dump and the snapshot part carry the tiers: a restore answers the same', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2]))
  apply(ix, tier(chain(1, 2, [3, 4]), 'host_pinned'))
  apply(ix, tier(chain(2, null, [1, 2, 3]), 'disk'))
  apply(ix, tier(chain(3, null, [1]), 'external'))
  const q = [1, 2, 3, 4, 5]
  const want = tiers(ix, q)
  const dump = ix.dump()
  t.same(
    dump.filter((e) => e.storage_tier !== undefined).map((e) => e.storage_tier),
    ['host_pinned', 'host_pinned', 'disk', 'disk', 'disk', 'external'],
  )
  const replayed = new KvIndex()
  for (const ev of dump) t.equal(apply(replayed, ev), 0)
  t.same(tiers(replayed, q), want, 'the dump replayed')
  const part = checkPart(ix.writeSnapshotPart())
  t.equal(part.lowerBlocks, 6)
  const loaded = new KvIndex()
  loaded.loadSnapshotPart(part, new Uint8Array(part.workers).fill(1))
  t.same(tiers(loaded, q), want, 'the snapshot part loaded')
  t.same(loaded.lowerTierBlocks(), [2, 3, 1])
  // loading again replaces what the worker-ranks held, in every tier
  loaded.loadSnapshotPart(part, new Uint8Array(part.workers).fill(1))
  t.equal(loaded.lowerEntries, 6)
  // a device-only part has no section: the same bytes as before tiers existed
  const plain = new KvIndex()
  apply(plain, chain(1, null, [1, 2]))
  t.equal(checkPart(plain.writeSnapshotPart()).lowerBlocks, 0)
})
