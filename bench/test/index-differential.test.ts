// The index against the one it replaced (bench/test/reference-index/, the radix tree with one
// record per node and one per entry), on the benchmark's workload: the Mooncake trace through
// simulated engines (bench/lib/index-workload.ts), every lookup answered alike (worker-rank,
// overlap, tree size), every event with the same status, the same tree sizes and dumps at the end.
// A second pass reuses every freed slot; removing workers midway exercises the records that
// move when a node's first entry goes. The round-robin case spreads conversations over the
// workers, so many nodes have several holders (the overflow records).
import t, { type Test } from 'tap'
import { KvIndex } from '../../src/index/kv-index.js'
import { EventDecoder } from '../../src/codec/event-decoder.js'
import { u64Hi, u64Lo } from '../../src/codec/u64.js'
import { buildIndexWorkload, type WorkerAssignment } from '../lib/index-workload.js'
import { KvIndex as ReferenceIndex } from './reference-index/kv-index.js'
import { createHash } from 'node:crypto'
import type { RouterEvent } from '../../src/codec/events.js'

/** One lookup's answer as text: `worker:rank=depth/size` per matched worker-rank, sorted. */
function answer(ix: KvIndex | ReferenceIndex, m: number): string {
  const parts: string[] = []
  for (let k = 0; k < m; k++) {
    const w = ix.matchWorkers[k] as number
    parts.push(`${ix.workerIdHi(w)}.${ix.workerIdLo(w)}:${ix.workerRank(w)}=${ix.depth(w)}/${ix.treeSize(w)}`)
  }
  return parts.sort().join(' ')
}

/**
 * What a dump holds, as test/helpers/dump-paths.ts reads it (each block hash per worker-rank with
 * the path of tokens hashes to it, anchors as `*`), with each path as a digest: the trace's paths
 * run to hundreds of blocks, too long to spell out for every block.
 */
function dumpDigest(events: readonly RouterEvent[]): string {
  const ranks = new Map<string, Map<bigint, string>>()
  for (const ev of events) {
    const key = `${ev.worker_id}:${ev.event.dp_rank}`
    let held = ranks.get(key)
    if (held === undefined) ranks.set(key, (held = new Map()))
    const d = ev.event.data
    if (d === 'cleared') {
      held.clear()
      continue
    }
    if ('removed' in d) {
      for (const h of d.removed.block_hashes) held.delete(h)
      continue
    }
    let path = ''
    if (d.stored.parent_hash !== null) {
      const p = held.get(d.stored.parent_hash)
      if (p === undefined) throw new Error(`the dump names parent ${d.stored.parent_hash} that ${key} does not hold`)
      path = p
    }
    for (const b of d.stored.blocks) {
      const step = path === '' && b.tokens_hash >> 32n === 0xffffffffn ? '*' : String(b.tokens_hash)
      path = createHash('sha1').update(`${path}/${step}`).digest('base64')
      held.set(b.block_hash, path)
    }
  }
  const all = createHash('sha1')
  for (const [key, held] of [...ranks].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
    if (held.size === 0) continue
    all.update(
      `${key} ${[...held]
        .map(([h, p]) => `${h}=${p}`)
        .sort()
        .join(' ')}\n`,
    )
  }
  return all.digest('hex')
}

function sizes(ix: KvIndex | ReferenceIndex): string {
  return ix
    .treeSizes()
    .map((s) => `${s.worker_id}:${s.dp_rank}=${s.tree_size}@${s.last_event_id ?? '-'}`)
    .sort()
    .join(' ')
}

function differential(t: Test, assignment: WorkerAssignment, limit: number | undefined): void {
  const wl = buildIndexWorkload({ workers: 64, assignment, ...(limit !== undefined ? { limit } : {}) })
  const ix = new KvIndex()
  const ref = new ReferenceIndex()
  const decA = new EventDecoder()
  const decB = new EventDecoder()
  let lookups = 0
  let matched = 0
  let multi = 0
  for (let pass = 0; pass < 2; pass++) {
    const wrong: string[] = []
    let op = 0
    for (const o of wl.ops) {
      op++
      if (o.kind === 'event') {
        const a = ix.apply(decA.decode(o.bytes))
        const b = ref.apply(decB.decode(o.bytes))
        if (a !== b && wrong.length < 5) wrong.push(`op ${op}: status ${a}, reference ${b}`)
      } else {
        const got = answer(ix, ix.findMatches(o.lo, o.hi, o.n))
        const want = answer(ref, ref.findMatches(o.lo, o.hi, o.n))
        if (got !== want && wrong.length < 5) wrong.push(`op ${op}: ${got.slice(0, 200)} vs ${want.slice(0, 200)}`)
        // early exit on every fourth: the walk is the same up to where it stops
        if ((lookups & 3) === 0) {
          const ge = answer(ix, ix.findMatches(o.lo, o.hi, o.n, true))
          const we = answer(ref, ref.findMatches(o.lo, o.hi, o.n, true))
          if (ge !== we && wrong.length < 5) wrong.push(`op ${op} (early exit): ${ge.slice(0, 200)} vs ${we.slice(0, 200)}`)
        }
        lookups++
        matched += ix.matchCount
        if (ix.matchCount > 1) multi++
      }
      // in the second pass, a quarter of the workers leave halfway and come back with their next event
      if (pass === 1 && op === wl.ops.length >> 1) {
        for (const w of wl.workerIds.slice(0, 16))
          t.equal(ix.removeWorker(u64Lo(w), u64Hi(w)), ref.removeWorker(u64Lo(w), u64Hi(w)), 'blocks dropped with the worker')
      }
    }
    t.same(wrong, [], `pass ${pass}: every status and every answer alike`)
    t.equal(ix.liveEntries, ref.liveEntries, `pass ${pass}: entries`)
    t.equal(ix.liveNodes, ref.liveNodes, `pass ${pass}: nodes`)
    t.equal(sizes(ix), sizes(ref), `pass ${pass}: tree sizes and last event ids`)
    t.equal(dumpDigest(ix.dump()), dumpDigest(ref.dump()), `pass ${pass}: every block on its path`)
    t.same([...ix.rejectedByReason], [...ref.rejectedByReason], `pass ${pass}: rejections`)
    for (const w of wl.workerIds) ix.removeWorker(u64Lo(w), u64Hi(w))
    for (const w of wl.workerIds) ref.removeWorker(u64Lo(w), u64Hi(w))
    t.equal(ix.liveEntries, 0, 'every worker removed: nothing held')
  }
  t.ok(lookups > 0 && matched > lookups, `${lookups} lookups compared, ${matched} worker-rank answers, ${multi} with several worker-ranks`)
}

t.test('the whole trace, conversations on the worker that holds them (the benchmark)', async (t) => {
  differential(t, 'prefix', undefined)
})

t.test('round-robin: conversations spread over the workers, blocks with many holders', async (t) => {
  differential(t, 'round-robin', 1500)
})
