// The block pool under the engine's scheduler, on random seeded workloads (shared system
// prefixes, chunked and whole prefill, lifo and fifo preemption, aborts, a pool small enough
// to evict and preempt all the time): never above capacity, and the engine's KV events,
// replayed into the router's index, reproduce the pool's cached set exactly — at checkpoints
// along the way and at the end, as does the event ring's tree dump. Every Stored block's
// tokens_hash is the router's local hash of its tokens.
import t from 'tap'
import { MockEngine, type EngineRequest } from '../../../src/sim/mocker/engine.js'
import { EventDecoder } from '../../../src/codec/event-decoder.js'
import { encodeRouterEvent, type RouterEvent } from '../../../src/codec/events.js'
import { computeBlockHashes, computeSequenceHashes } from '../../../src/codec/hashing.js'
import { APPLY_OK, KvIndex } from '../../../src/index/kv-index.js'
import { Rng } from '../../helpers/rng.js'

const BS = 8

/** Block hashes an index holds for one worker (replaying its dump, synthetic bridges included). */
function indexBlocks(index: KvIndex, worker: bigint): Set<bigint> {
  const set = new Set<bigint>()
  for (const ev of index.dump()) {
    if (ev.worker_id !== worker || typeof ev.event.data !== 'object') continue
    if ('stored' in ev.event.data) for (const b of ev.event.data.stored.blocks) set.add(b.block_hash)
    else for (const h of ev.event.data.removed.block_hashes) set.delete(h)
  }
  return set
}

function treeSize(index: KvIndex, worker: bigint): number {
  return index.treeSizes().find((s) => s.worker_id === worker)?.tree_size ?? 0
}

const SEEDS = [
  { seed: 11, chunked: true, mode: 'lifo' as const, blocks: 40 },
  { seed: 12, chunked: true, mode: 'fifo' as const, blocks: 36 },
  { seed: 13, chunked: false, mode: 'lifo' as const, blocks: 30 },
  { seed: 14, chunked: false, mode: 'fifo' as const, blocks: 40 },
  { seed: 15, chunked: true, mode: 'lifo' as const, blocks: 200 },
]

for (const cfg of SEEDS) {
  t.test(`seed ${cfg.seed}: chunked ${cfg.chunked}, ${cfg.mode}, ${cfg.blocks} blocks`, async (t) => {
    const rng = new Rng(cfg.seed)
    const worker = BigInt(1000 + cfg.seed)
    const index = new KvIndex()
    const decoder = new EventDecoder()
    const events: RouterEvent[] = []
    let rejected = 0
    const e = new MockEngine({
      workerId: worker,
      autoStep: false,
      blockSize: BS,
      numGpuBlocks: cfg.blocks,
      maxNumSeqs: 6,
      maxNumBatchedTokens: 96,
      enableChunkedPrefill: cfg.chunked,
      preemptionMode: cfg.mode,
      onEvent: (ev) => {
        events.push(ev)
        // through JSON and the byte decoder, as a router receives them
        if (index.apply(decoder.decodeString(encodeRouterEvent(ev))) !== APPLY_OK) rejected++
      },
    })
    let tok = 1
    const fresh = (n: number): number[] => Array.from({ length: n }, () => tok++)
    const prefixes = Array.from({ length: 5 }, () => fresh(8 + rng.int(33)))
    const all: EngineRequest[] = []
    const live: EngineRequest[] = []
    let overCapacity = 0
    let checkpoints = 0
    let badCheckpoints = 0
    for (let step = 0; step < 700; step++) {
      const arrivals = rng.next() < 0.35 ? 1 + rng.int(3) : 0
      for (let a = 0; a < arrivals && step < 600; a++) {
        const base = rng.next() < 0.8 ? rng.pick(prefixes) : []
        let p = [...base, ...fresh(rng.int(40))]
        if (p.length === 0) p = fresh(5)
        let maxTokens = 1 + rng.int(40)
        // whole prefill: prompt + output must fit one step's budget
        if (!cfg.chunked) {
          p = p.slice(0, 60)
          maxTokens = Math.min(maxTokens, 96 - p.length)
        }
        const r = e.submit(p, maxTokens)
        all.push(r)
        live.push(r)
      }
      if (live.length > 0 && rng.next() < 0.04) {
        const r = live.splice(rng.int(live.length), 1)[0] as EngineRequest
        e.abort(r)
      }
      e.step()
      if (e.pool.used > cfg.blocks || e.activeBlocks > cfg.blocks) overCapacity++
      for (let i = live.length - 1; i >= 0; i--) if ((live[i] as EngineRequest).state === 'finished') live.splice(i, 1)
      if (step % 100 === 99) {
        checkpoints++
        const cached = e.pool.cachedBlocks()
        if (!setsEqual(indexBlocks(index, worker), cached) || treeSize(index, worker) !== cached.size) badCheckpoints++
      }
    }
    e.runUntilIdle()
    t.equal(overCapacity, 0, 'the pool and the running requests never exceed the capacity')
    t.equal(checkpoints, 7)
    t.equal(badCheckpoints, 0, "at every checkpoint the index held exactly the pool's cached set")
    t.equal(rejected, 0, 'every event applied')
    t.ok(e.pool.evictions > 0, `evictions happened (${e.pool.evictions})`)
    if (cfg.blocks < 100) t.ok(e.stats.preemptions > 0, `preemptions happened (${e.stats.preemptions})`)
    t.ok(e.stats.aborted > 0, `aborts happened (${e.stats.aborted})`)
    t.ok(e.stats.cachedTokens > 0, 'prefix hits happened')
    t.same(
      events.map((ev) => ev.event.event_id),
      events.map((_, i) => BigInt(i + 1)),
      'event ids consecutive from 1',
    )
    t.equal(e.stats.finished + e.stats.aborted, all.length, 'every request finished or was aborted')
    for (const r of all)
      if (r.state === 'finished' && r.outputTokens !== r.maxTokens) t.fail(`request ${r.id} ended with ${r.outputTokens}/${r.maxTokens} tokens`)
    t.equal(e.pool.activeBlocks + e.partialBlockCount, 0, 'no block leaked')

    // the final state, three ways
    const cached = e.pool.cachedBlocks()
    t.same(indexBlocks(index, worker), cached, "the index built from the events holds the pool's cached set")
    t.equal(treeSize(index, worker), e.pool.used)
    const dumped = new KvIndex()
    let dumpRejected = 0
    const dump = e.ring.query({ worker_id: worker, start_event_id: null, end_event_id: null }, worker)
    if (!('TreeDump' in dump)) throw new Error('expected a tree dump')
    for (const ev of dump.TreeDump) if (dumped.apply(decoder.decodeString(encodeRouterEvent(ev))) !== APPLY_OK) dumpRejected++
    t.equal(dumpRejected, 0)
    t.same(indexBlocks(dumped, worker), cached, "the ring's tree dump rebuilds the same cached set")
    t.same(
      dump.TreeDump.map((ev) => ev.event.event_id),
      dump.TreeDump.map((_, i) => BigInt(i)),
      'dump ids are synthetic, from 0',
    )

    // overlaps: what the router would answer equals what the engine would hit
    let badOverlap = 0
    for (const r of all) {
      const local = computeBlockHashes(r.tokens.subarray(0, r.isl), BS)
      const n = local.length
      const lo = new Uint32Array(n)
      const hi = new Uint32Array(n)
      local.forEach((v, i) => {
        lo[i] = Number(v & 0xffffffffn)
        hi[i] = Number(v >> 32n)
      })
      const fromIndex = index.overlapScores(local).find((s) => s.worker_id === worker)?.overlap_blocks ?? 0
      if (fromIndex !== e.pool.prefixHits(lo, hi, n)) badOverlap++
    }
    t.equal(badOverlap, 0, `router overlap equals engine prefix hits for all ${all.length} prompts`)

    // tokens_hash of every Stored block is the local hash of the tokens it holds
    const localOf = new Map<bigint, bigint>()
    for (const r of all) {
      const local = computeBlockHashes(r.tokens.subarray(0, r.known), BS)
      const seq = computeSequenceHashes(local)
      seq.forEach((s, i) => localOf.set(s, local[i] as bigint))
    }
    let badTokensHash = 0
    let storedBlocks = 0
    for (const ev of events) {
      if (typeof ev.event.data !== 'object' || !('stored' in ev.event.data)) continue
      for (const b of ev.event.data.stored.blocks) {
        storedBlocks++
        if (localOf.get(b.block_hash) !== b.tokens_hash) badTokensHash++
      }
    }
    t.ok(storedBlocks > 100)
    t.equal(badTokensHash, 0, `tokens_hash = the router's local hash for all ${storedBlocks} stored blocks`)
  })
}

function setsEqual(a: Set<bigint>, b: Set<bigint>): boolean {
  if (a.size !== b.size) return false
  for (const x of a) if (!b.has(x)) return false
  return true
}
