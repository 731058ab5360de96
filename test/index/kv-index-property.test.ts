// Random event streams applied to the typed-array index and to the naive model must give the same
// answers at every step; dumps must replay to the same answers. Seeded, so failures reproduce.
import t, { type Test } from 'tap'
import { KvIndex, REJECT_REASON_NAMES } from '../../src/index/kv-index.js'
import { toDecoded, type RouterEvent } from '../../src/codec/events.js'
import { ModelIndex } from '../helpers/model-index.js'
import { Rng } from '../helpers/rng.js'
import { stored } from '../helpers/events.js'
import { EventStream as Stream, randomQuery } from '../helpers/random-events.js'

function status(code: number): string {
  return code === 0 ? 'ok' : (REJECT_REASON_NAMES[code - 1] as string)
}

function indexScores(ix: KvIndex, q: bigint[], early: boolean): Map<string, number> {
  const m = new Map<string, number>()
  for (const s of ix.overlapScores(q, early)) m.set(`${s.worker_id}:${s.dp_rank}`, s.overlap_blocks)
  return m
}

function indexSizes(ix: KvIndex): Map<string, number> {
  const m = new Map<string, number>()
  for (const s of ix.treeSizes()) m.set(`${s.worker_id}:${s.dp_rank}`, s.tree_size)
  return m
}

const sorted = (m: Map<string, number>): [string, number][] => [...m].sort((a, b) => (a[0] < b[0] ? -1 : 1))

function compare(t: Test, ix: KvIndex, model: ModelIndex, r: Rng, where: string, ignoreEmpty = false): boolean {
  for (let k = 0; k < 6; k++) {
    const q = randomQuery(r)
    for (const early of [false, true]) {
      const a = sorted(indexScores(ix, q, early))
      const b = sorted(model.findMatches(q, early))
      if (JSON.stringify(a) !== JSON.stringify(b)) {
        t.same(a, b, `${where}: find_matches(${q.join(',')}, early=${early})`)
        return false
      }
    }
  }
  // a replayed dump knows only the worker-ranks that hold blocks
  const keep = (e: [string, number]): boolean => !ignoreEmpty || e[1] > 0
  const sa = sorted(indexSizes(ix)).filter(keep)
  const sb = sorted(model.treeSizes()).filter(keep)
  if (JSON.stringify(sa) !== JSON.stringify(sb)) {
    t.same(sa, sb, `${where}: tree sizes`)
    return false
  }
  return true
}

function replay(events: RouterEvent[]): KvIndex {
  const ix = new KvIndex()
  for (const ev of events) ix.apply(toDecoded(ev))
  return ix
}

for (const [seed, maxBlocks] of [
  [1, undefined],
  [2, undefined],
  [3, undefined],
  [4, 30],
  [5, 12],
] as const) {
  t.test(`seed ${seed}${maxBlocks ? `, cap ${maxBlocks}` : ''}: index ≡ model over 3000 random events`, async (t) => {
    const rng = new Rng(seed)
    const stream = new Stream(rng)
    const ix = new KvIndex(maxBlocks === undefined ? { initialBlocks: 16 } : { maxBlocks, initialBlocks: 4 })
    const model = new ModelIndex(maxBlocks)
    let mismatches = 0
    let dumps = 0
    const seen = new Set<string>()
    for (let step = 0; step < 3000 && mismatches === 0; step++) {
      const { ev, forget } = stream.next()
      if (ev !== undefined) {
        const a = status(ix.apply(toDecoded(ev)))
        const b = model.apply(ev)
        seen.add(b)
        if (a !== b) {
          t.equal(a, b, `step ${step}: status of ${JSON.stringify(ev, (_k, v) => (typeof v === 'bigint' ? String(v) : v))}`)
          mismatches++
        }
      } else if (forget !== undefined) {
        ix.removeWorker(Number(forget & 0xffffffffn), Number(forget >> 32n))
        model.clear(forget, true)
      }
      if (ix.liveEntries !== [...model.treeSizes().values()].reduce((x, y) => x + y, 0) || ix.liveNodes !== model.nodeCount()) {
        t.fail(`step ${step}: entries ${ix.liveEntries} nodes ${ix.liveNodes} vs model nodes ${model.nodeCount()}`)
        mismatches++
      }
      if (step % 5 === 0 && !compare(t, ix, model, rng, `step ${step}`)) mismatches++
      if (step % 300 === 299) {
        const copy = replay(ix.dump())
        dumps++
        if (!compare(t, copy, model, new Rng(step), `dump at step ${step}`, true)) mismatches++
        if (copy.liveEntries !== ix.liveEntries) {
          t.equal(copy.liveEntries, ix.liveEntries, `dump at step ${step}: entries`)
          mismatches++
        }
      }
    }
    t.equal(mismatches, 0, 'no divergence')
    t.equal(dumps, 10, 'dumps replayed')
    // the stream really exercised the rules
    for (const s of ['ok', 'parent_block_not_found', 'block_not_found', 'invalid_block', ...(maxBlocks ? ['capacity'] : [])])
      t.ok(seen.has(s), `stream produced ${s}`)
  })
}

t.test('dump of an ordinary tree is one single-block stored event per (node, worker), parents first', async (t) => {
  const ix = new KvIndex()
  ix.apply(
    toDecoded(
      stored(1, null, [
        [100, 1],
        [200, 2],
      ]),
    ),
  )
  ix.apply(toDecoded(stored(2, null, [[100, 1]])))
  const events = ix.dump()
  t.equal(events.length, 3)
  for (const e of events) {
    const d = e.event.data
    t.ok(typeof d === 'object' && 'stored' in d && d.stored.blocks.length === 1)
  }
  t.same(
    events.map((e) => e.event.event_id),
    [0n, 1n, 2n],
    'running event ids from 0',
  )
  const last = events[2]?.event.data as { stored: { parent_hash: bigint | null } }
  t.equal(last.stored.parent_hash, 100n)
  const copy = replay(events)
  const order = (xs: { worker_id: bigint }[]): bigint[] => xs.map((x) => x.worker_id).sort()
  t.same(order(copy.overlapScores([1n, 2n])), order(ix.overlapScores([1n, 2n])))
  t.same(
    copy
      .overlapScores([1n, 2n])
      .map((x) => x.overlap_blocks)
      .sort(),
    ix
      .overlapScores([1n, 2n])
      .map((x) => x.overlap_blocks)
      .sort(),
  )
})
