import t from 'tap'
import { KvIndex, RejectReason, type OverlapScore } from '../../src/index/kv-index.js'
import { toDecoded, type RouterEvent } from '../../src/codec/events.js'
import { chain, stored, removed, cleared } from '../helpers/events.js'

function apply(index: KvIndex, ev: RouterEvent): number {
  return index.apply(toDecoded(ev))
}

/** "worker:rank" → overlap blocks, for readable assertions. */
function scores(index: KvIndex, toks: number[]): Record<string, number> {
  const out: Record<string, number> = {}
  for (const s of index.overlapScores(toks.map(BigInt))) out[`${s.worker_id}:${s.dp_rank}`] = s.overlap_blocks
  return out
}

function sizes(index: KvIndex): Record<string, number> {
  const out: Record<string, number> = {}
  for (const s of index.treeSizes()) out[`${s.worker_id}:${s.dp_rank}`] = s.tree_size
  return out
}

t.test('stored with a null parent starts at the root; depth is the contiguous prefix', async (t) => {
  const ix = new KvIndex()
  t.equal(apply(ix, chain(1, null, [1, 2, 3])), 0)
  t.equal(apply(ix, chain(2, null, [1, 2])), 0)
  t.same(scores(ix, [1, 2, 3, 4]), { '1:0': 3, '2:0': 2 })
  t.same(scores(ix, [1, 9, 3]), { '1:0': 1, '2:0': 1 }, 'a mismatch stops the prefix')
  t.same(scores(ix, [2, 3]), {}, 'no match from the middle')
  t.same(scores(ix, []), {}, 'empty query')
  t.same(sizes(ix), { '1:0': 3, '2:0': 2 })
  t.equal(ix.liveNodes, 4, 'root + three shared nodes')
})

t.test('stored with a known parent extends the chain; an unknown parent rejects the whole event', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2]))
  t.equal(apply(ix, chain(1, 2, [3, 4])), 0)
  t.same(scores(ix, [1, 2, 3, 4]), { '1:0': 4 })
  t.equal(apply(ix, chain(1, 77, [5, 6])), 1 + RejectReason.ParentBlockNotFound)
  t.equal(ix.rejectedByReason[RejectReason.ParentBlockNotFound], 1)
  t.same(sizes(ix), { '1:0': 4 }, 'nothing of the rejected event applied')
  // the parent is looked up among this worker's hashes only
  t.equal(apply(ix, chain(2, 2, [3])), 1 + RejectReason.ParentBlockNotFound, "another worker's block is not a parent")
  t.same(sizes(ix), { '1:0': 4, '2:0': 0 }, 'the worker-rank exists even though its event failed')
})

t.test('duplicate stores are idempotent', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2]))
  apply(ix, chain(1, null, [1, 2]))
  apply(ix, chain(1, 1, [2]))
  t.same(sizes(ix), { '1:0': 2 })
  t.equal(ix.liveEntries, 2)
  t.same(scores(ix, [1, 2]), { '1:0': 2 })
})

t.test('dp_rank is part of the worker identity', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3], 0))
  apply(ix, chain(1, null, [1], 1))
  t.same(scores(ix, [1, 2, 3]), { '1:0': 3, '1:1': 1 })
  t.equal(apply(ix, chain(1, 1, [2], 2)), 1 + RejectReason.ParentBlockNotFound, "rank 2 cannot use rank 0's blocks as parent")
})

t.test('removed drops the worker; a node left empty drops its subtree (cascade)', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3, 4]))
  apply(ix, chain(2, null, [1, 2]))
  t.equal(apply(ix, removed(2, [200])), 0)
  t.same(scores(ix, [1, 2, 3]), { '1:0': 3, '2:0': 1 })
  // worker 1 removes a middle block: node 2 is empty now, so 3 and 4 are cut off the tree
  t.equal(apply(ix, removed(1, [200])), 0)
  t.same(scores(ix, [1, 2, 3, 4]), { '1:0': 1, '2:0': 1 })
  t.same(sizes(ix), { '1:0': 3, '2:0': 1 }, 'the detached blocks are still held (tree size counts them)')
  t.equal(ix.liveNodes, 4, 'root, 1, and the detached 3 → 4')
  // the worker re-stores block 2: its known block 3 is not reattached by that alone...
  apply(ix, chain(1, 1, [2]))
  t.same(scores(ix, [1, 2, 3]), { '1:0': 2, '2:0': 1 })
  // ...but storing 3 under 2 again re-links the detached node with its own subtree (4)
  apply(ix, chain(1, 2, [3]))
  t.same(scores(ix, [1, 2, 3, 4]), { '1:0': 4, '2:0': 1 })
  t.same(sizes(ix), { '1:0': 4, '2:0': 1 })
})

t.test('removing an unknown block is counted and the rest of the batch still applies', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3]))
  t.equal(apply(ix, removed(1, [999, 300, 998])), 1 + RejectReason.BlockNotFound)
  t.equal(ix.rejectedByReason[RejectReason.BlockNotFound], 2, 'each missing hash counted')
  t.same(sizes(ix), { '1:0': 2 })
  t.equal(apply(ix, removed(3, [100])), 1 + RejectReason.BlockNotFound, 'unknown worker: nothing to remove')
})

t.test('re-linking a known block hash under a new parent', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3]))
  apply(ix, removed(1, [100])) // 1 emptied: 2→3 detached but held
  t.same(scores(ix, [1, 2, 3]), {})
  // a new parent with different content, then block 2 (known to the worker) stored under it
  apply(ix, stored(1, null, [[500, 5]]))
  t.equal(apply(ix, stored(1, 500, [[200, 2]])), 0)
  t.same(scores(ix, [5, 2, 3]), { '1:0': 3 }, 'the re-linked node brings its subtree')
  t.same(sizes(ix), { '1:0': 3 })
})

t.test('self-reference aborts with invalid_block; earlier blocks of the event stay', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1]))
  // block 100 under parent 100: a block equal to its own parent
  t.equal(
    apply(
      ix,
      stored(1, 100, [
        [700, 7],
        [100, 8],
      ]),
    ),
    1 + RejectReason.InvalidBlock,
  )
  t.equal(ix.rejectedByReason[RejectReason.InvalidBlock], 1)
  t.same(scores(ix, [1, 7]), { '1:0': 2 }, 'the first block of the event was applied')
  t.same(scores(ix, [1, 7, 8]), { '1:0': 2 })
  // a deeper cycle: an ancestor's hash reused below it
  t.equal(apply(ix, stored(1, 700, [[100, 9]])), 1 + RejectReason.InvalidBlock)
  t.same(scores(ix, [1]), { '1:0': 1 }, 'the ancestor was not moved')
})

t.test('cleared removes every rank of that worker and keeps the worker registered', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2], 0))
  apply(ix, chain(1, null, [1, 2, 3], 1))
  apply(ix, chain(2, null, [1]))
  t.equal(apply(ix, cleared(1, 0)), 0)
  t.same(scores(ix, [1, 2, 3]), { '2:0': 1 })
  t.same(sizes(ix), { '1:0': 0, '1:1': 0, '2:0': 1 })
  t.equal(ix.liveEntries, 1)
  t.equal(ix.liveNodes, 2)
  t.equal(apply(ix, chain(1, null, [4], 1)), 0, 'the worker can store again')
})

t.test('remove_worker removes all ranks and forgets them', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2], 0))
  apply(ix, chain(1, null, [1], 3))
  apply(ix, chain(2, null, [1, 2]))
  t.equal(ix.removeWorker(1, 0), 3)
  t.same(sizes(ix), { '2:0': 2 })
  t.same(scores(ix, [1, 2]), { '2:0': 2 })
  t.equal(ix.liveWorkers, 1)
  t.equal(ix.removeWorker(9, 0), 0, 'unknown worker: nothing to do')
})

t.test('find_matches: early exit, tree sizes, and the equal-count shortcut', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3, 4]))
  apply(ix, chain(2, null, [1, 2]))
  apply(ix, chain(3, null, [1]))
  const full = ix.overlapScores([1n, 2n, 3n, 4n])
  const byWorker = new Map(full.map((s: OverlapScore) => [s.worker_id, s]))
  t.equal(byWorker.get(1n)?.overlap_blocks, 4)
  t.equal(byWorker.get(2n)?.overlap_blocks, 2)
  t.equal(byWorker.get(3n)?.overlap_blocks, 1)
  t.equal(byWorker.get(1n)?.tree_size, 4)
  t.equal(byWorker.get(3n)?.tree_size, 1)
  // early exit: once one worker is left, it gets depth+1 and the walk stops
  const early = new Map(ix.overlapScores([1n, 2n, 3n, 4n], true).map((s) => [s.worker_id, s.overlap_blocks]))
  t.equal(early.get(1n), 3)
  t.equal(early.get(2n), 2)
})

t.test('u64 worker ids and hashes above 2^53 round-trip exactly', async (t) => {
  const ix = new KvIndex()
  const wid = 2n ** 63n + 12345n
  const big = 2n ** 64n - 1n
  apply(
    ix,
    stored(wid, null, [
      [big, big - 1n],
      [big - 2n, 2n ** 53n + 1n],
    ]),
  )
  const s = ix.overlapScores([big - 1n, 2n ** 53n + 1n])
  t.equal(s.length, 1)
  t.equal(s[0]?.worker_id, wid)
  t.equal(s[0]?.overlap_blocks, 2)
  t.same(
    ix.overlapScores([big - 1n, 2n ** 53n]).map((x) => x.overlap_blocks),
    [1],
    'neighbouring value does not match',
  )
})

t.test('a worker reaching one node through two hashes stays until both are removed', async (t) => {
  const ix = new KvIndex()
  apply(ix, stored(1, null, [[100, 1]]))
  apply(ix, stored(1, null, [[101, 1]])) // same content, another external hash (e.g. a LoRA variant)
  t.same(sizes(ix), { '1:0': 2 })
  apply(ix, removed(1, [100]))
  t.same(scores(ix, [1]), { '1:0': 1 })
  apply(ix, removed(1, [101]))
  t.same(scores(ix, [1]), {})
  t.equal(ix.liveNodes, 1)
})

t.test('the block cap rejects stores beyond it and freed entries are reused', async (t) => {
  const ix = new KvIndex({ maxBlocks: 5, initialBlocks: 4 })
  t.equal(apply(ix, chain(1, null, [1, 2, 3])), 0)
  t.equal(apply(ix, chain(2, null, [1, 2, 3])), 1 + RejectReason.Capacity)
  t.equal(ix.liveEntries, 5, 'filled up to the cap, not beyond')
  t.same(scores(ix, [1, 2, 3]), { '1:0': 3, '2:0': 2 })
  t.equal(apply(ix, chain(3, null, [9])), 1 + RejectReason.Capacity)
  t.equal(ix.liveNodes, 4, 'the node made for the refused block was freed')
  // freeing makes room again, and memory stays bounded over many cycles
  apply(ix, removed(2, [100, 200]))
  const bytes = ix.bytes
  for (let i = 0; i < 1000; i++) {
    t.equal(apply(ix, chain(3, null, [10 + (i % 7), 20])), 0)
    apply(ix, removed(3, [(10 + (i % 7)) * 100, 2000]))
  }
  t.equal(ix.liveEntries, 3)
  t.equal(ix.bytes, bytes, 'no growth: freed nodes and entries are reclaimed')
})

t.test('many workers and blocks: tables grow and stay consistent', async (t) => {
  const ix = new KvIndex({ initialBlocks: 16 })
  for (let w = 0; w < 300; w++) apply(ix, chain(w, null, [1, 2, 3, 1000 + w]))
  t.equal(ix.liveWorkers, 300)
  t.equal(ix.liveEntries, 1200)
  t.equal(ix.liveNodes, 1 + 3 + 300)
  const s = ix.overlapScores([1n, 2n, 3n, 1007n])
  t.equal(s.length, 300)
  t.equal(s.filter((x) => x.overlap_blocks === 4).length, 1)
  t.equal(s.find((x) => x.overlap_blocks === 4)?.worker_id, 7n)
  for (let w = 0; w < 300; w += 2) ix.removeWorker(w, 0)
  t.equal(ix.liveWorkers, 150)
  t.equal(ix.overlapScores([1n, 2n, 3n]).length, 150)
})

t.test('tree sizes carry the last event id applied per worker-rank', async (t) => {
  const ix = new KvIndex()
  const a = chain(1, null, [1, 2])
  a.event.event_id = 2n ** 60n + 9n
  apply(ix, a)
  ix.ensureWorker(2, 0, 0)
  const sizes = ix.treeSizes()
  t.equal(sizes.find((s) => s.worker_id === 1n)?.last_event_id, 2n ** 60n + 9n)
  t.equal(sizes.find((s) => s.worker_id === 2n)?.last_event_id, undefined, 'none before its first event')
})

t.test('a new chain goes into slots side by side, even when the free ones were freed interleaved', async (t) => {
  const index = new KvIndex()
  // two chains of 24 blocks on two workers, then both evicted block by block, interleaved, so
  // the most recently freed slots alternate between the two regions
  t.equal(
    apply(
      index,
      chain(
        1,
        null,
        Array.from({ length: 24 }, (_, i) => i + 1),
      ),
    ),
    0,
  )
  t.equal(
    apply(
      index,
      chain(
        2,
        null,
        Array.from({ length: 24 }, (_, i) => i + 101),
      ),
    ),
    0,
  )
  const bytesBefore = index.bytes
  for (let i = 24; i >= 1; i--) {
    t.equal(apply(index, removed(1, [i * 100])), 0)
    t.equal(apply(index, removed(2, [(i + 100) * 100])), 0)
  }
  t.equal(index.liveEntries, 0)
  // a new 24-block chain: each node next to its parent
  t.equal(
    apply(
      index,
      chain(
        3,
        null,
        Array.from({ length: 24 }, (_, i) => i + 201),
      ),
    ),
    0,
  )
  const w = index.workerSlot(3, 0, 0)
  const slots = Array.from({ length: 24 }, (_, i) => index.nodeSlotOf(w, (i + 201) * 100, 0))
  t.notOk(slots.includes(-1), 'every block is held')
  const steps = slots.slice(1).map((s, i) => s - (slots[i] as number))
  t.ok(steps.every((d) => d === 1) || steps.every((d) => d === -1), `one slot apart, one way: ${steps.join(',')}`)
  t.equal(index.bytes, bytesBefore, 'freed slots reused: nothing grew')
  t.same(
    scores(
      index,
      Array.from({ length: 24 }, (_, i) => i + 201),
    ),
    { '3:0': 24 },
  )
  t.same(scores(index, [1, 2, 3]), {}, 'the evicted chains are gone')
  // the free list is still whole: a chain as long as every free slot takes them all, no growth
  t.equal(
    apply(
      index,
      chain(
        4,
        null,
        Array.from({ length: 24 }, (_, i) => i + 301),
      ),
    ),
    0,
  )
  t.equal(index.bytes, bytesBefore)
  t.same(sizes(index), { '1:0': 0, '2:0': 0, '3:0': 24, '4:0': 24 })
})

t.test('a first block whose tokens_hash is 0 is a block like any other, not the root', async (t) => {
  const ix = new KvIndex()
  apply(
    ix,
    stored(1, null, [
      [100, 7],
      [101, 8],
    ]),
  )
  t.equal(apply(ix, stored(2, null, [[10, 0]])), 0)
  t.same(scores(ix, [0, 7, 8]), { '2:0': 1 }, 'worker 1 holds no block 0')
  t.same(scores(ix, [7, 8]), { '1:0': 2 })
  t.equal(ix.liveNodes, 4, 'root + three nodes')
  const dumped = ix
    .dump()
    .flatMap((e) =>
      typeof e.event.data === 'object' && 'stored' in e.event.data ? e.event.data.stored.blocks.map((b) => `${e.worker_id}:${b.tokens_hash}`) : [],
    )
  t.same(dumped.sort(), ['1:7', '1:8', '2:0'], 'the dump has the block')
  t.equal(apply(ix, removed(2, [10])), 0)
  t.same(scores(ix, [7, 8]), { '1:0': 2 }, "worker 2's remove leaves worker 1 whole")
  t.same(sizes(ix), { '1:0': 2, '2:0': 0 })
  t.equal(ix.liveNodes, 3, 'the root is still there')
  // and a zero under a zero, and the root's hint never set by a first block
  apply(
    ix,
    stored(3, null, [
      [20, 0],
      [21, 0],
    ]),
  )
  t.same(scores(ix, [0, 0, 0]), { '3:0': 2 })
})

t.test('queries stay exact when the stamps wrap past 2^32 - 1', async (t) => {
  const ix = new KvIndex()
  apply(ix, chain(1, null, [1, 2, 3]))
  apply(ix, chain(2, null, [1, 2]))
  t.same(scores(ix, [1, 2, 3]), { '1:0': 3, '2:0': 2 })
  // the next query's stamps wrap to 1 with the marks of the last one still in place
  const stamps = ix as unknown as { stamp: number; markStamp: number }
  stamps.stamp = 0xffffffff
  stamps.markStamp = 0xffffffff
  t.same(scores(ix, [1, 2, 3]), { '1:0': 3, '2:0': 2 })
  t.equal(stamps.stamp, 1)
  t.same(scores(ix, [1, 2]), { '1:0': 2, '2:0': 2 })
})

t.test("a slot's generation wraps at 16 bits: the children it had before stay detached", async (t) => {
  const ix = new KvIndex()
  // worker 1: A (tokens 1) and its child B (tokens 2); A leaves, B stays, detached
  apply(ix, chain(1, null, [1, 2]))
  const a = ix.nodeSlotOf(ix.workerSlot(1, 0, 0), 100, 0)
  t.equal(apply(ix, removed(1, [100])), 0)
  // worker 2 stores and removes a first block, each time in A's old slot, one generation later:
  // 65,535 frees bring the slot's generation back to the one B was made under
  const store = toDecoded(stored(2, null, [[5000, 1]]))
  const remove = toDecoded(removed(2, [5000]))
  for (let i = 0; i < 65535; i++) {
    ix.apply(store)
    ix.apply(remove)
  }
  t.equal(apply(ix, stored(2, null, [[5000, 1]])), 0)
  t.equal(ix.nodeSlotOf(ix.workerSlot(2, 0, 0), 5000, 0), a, "in A's old slot, at B's parent generation again")
  // B is no child of it: worker 2's block with B's tokens makes a node of its own
  t.equal(apply(ix, stored(2, 5000, [[5001, 2]])), 0)
  t.equal(ix.liveNodes, 1 + 3, "the root, B, worker 2's two")
  t.same(scores(ix, [1, 2]), { '2:0': 2 })
  t.same(sizes(ix), { '1:0': 1, '2:0': 2 })
})
