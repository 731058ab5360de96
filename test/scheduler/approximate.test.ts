// Approximate mode with a fake clock: TTL expiry, refresh, pruning order.
import t from 'tap'
import { ApproxTracker } from '../../src/scheduler/approximate.js'
import type { ApproxSink } from '../../src/scheduler/approximate.js'
import { WorkerRanks } from '../../src/scheduler/worker-ranks.js'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import { FakeClock } from './fixtures.js'

type Event = { kind: 'stored'; worker: bigint; rank: number; local: number[]; seq: number[] } | { kind: 'removed'; worker: bigint; rank: number; seq: number[] }

class RecordingSink implements ApproxSink {
  events: Event[] = []
  stored(workerId: bigint, dpRank: number, localLo: Uint32Array, _localHi: Uint32Array, seqLo: Uint32Array, _seqHi: Uint32Array, n: number): void {
    this.events.push({ kind: 'stored', worker: workerId, rank: dpRank, local: Array.from(localLo.subarray(0, n)), seq: Array.from(seqLo.subarray(0, n)) })
  }
  removed(workerId: bigint, dpRank: number, seqLo: Uint32Array, _seqHi: Uint32Array, n: number): void {
    this.events.push({ kind: 'removed', worker: workerId, rank: dpRank, seq: Array.from(seqLo.subarray(0, n)) })
  }
  take(): Event[] {
    const e = this.events
    this.events = []
    return e
  }
}

/** Blocks with seq hash = base + i (lo half), local hash = 1000 + base + i. */
function hashes(base: number, n: number) {
  const seqLo = new Uint32Array(n).map((_, i) => base + i)
  const localLo = new Uint32Array(n).map((_, i) => 1000 + base + i)
  return { seqLo, seqHi: new Uint32Array(n), localLo, localHi: new Uint32Array(n) }
}

function setup(opts: Partial<{ ttlMs: number; maxTreeSize: number; pruneTargetRatio: number }> = {}) {
  const workers = new WorkerRanks()
  workers.register(10n, 0)
  workers.register(20n, 1)
  const sink = new RecordingSink()
  const tr = new ApproxTracker(workers, sink, { ttlMs: 120_000, maxTreeSize: 1 << 20, pruneTargetRatio: 0.8, ...opts })
  return { workers, sink, tr }
}

function record(tr: ApproxTracker, slot: number, base: number, n: number, now: number): void {
  const h = hashes(base, n)
  tr.record(slot, h.localLo, h.localHi, h.seqLo, h.seqHi, n, now)
}

t.test('a decision stores all complete blocks; the TTL removes them, deepest first', async (t) => {
  const { sink, tr } = setup()
  record(tr, 0, 1, 3, 0)
  t.same(sink.take(), [{ kind: 'stored', worker: 10n, rank: 0, local: [1001, 1002, 1003], seq: [1, 2, 3] }])
  t.equal(tr.size, 3)
  t.equal(tr.nextExpiry(), 120_000)
  t.equal(tr.expire(119_999), 0)
  t.same(sink.take(), [])
  t.equal(tr.expire(120_000), 3)
  t.same(sink.take(), [{ kind: 'removed', worker: 10n, rank: 0, seq: [3, 2, 1] }])
  t.equal(tr.size, 0)
  t.equal(tr.nextExpiry(), Infinity)
  t.equal(tr.expiredTotal, 3)
})

t.test('routing the same prefix again refreshes it', async (t) => {
  const { sink, tr } = setup()
  record(tr, 0, 1, 4, 0) // blocks 1..4 expire at 120 s
  record(tr, 0, 1, 2, 60_000) // blocks 1..2 refreshed to 180 s
  t.equal(tr.size, 4, 'refresh adds no entry')
  sink.take()
  tr.expire(120_000)
  t.same(sink.take(), [{ kind: 'removed', worker: 10n, rank: 0, seq: [4, 3] }])
  tr.expire(179_999)
  t.same(sink.take(), [])
  tr.expire(180_000)
  t.same(sink.take(), [{ kind: 'removed', worker: 10n, rank: 0, seq: [2, 1] }])
  t.equal(tr.nextExpiry(), Infinity, 'stale heap nodes are skipped')
})

t.test('the same blocks on two worker-ranks are separate entries; removals grouped per rank', async (t) => {
  const { sink, tr } = setup()
  record(tr, 0, 1, 2, 0)
  record(tr, 1, 1, 2, 0)
  t.equal(tr.size, 4)
  sink.take()
  tr.expire(200_000)
  const ev = sink.take()
  t.equal(ev.length, 2)
  t.same(
    ev.map((e) => [e.worker, e.rank, e.seq]),
    [
      [10n, 0, [2, 1]],
      [20n, 1, [2, 1]],
    ],
  )
})

t.test('pruning above the size cap: earliest expiry first, deepest first among equals', async (t) => {
  const { sink, tr } = setup({ maxTreeSize: 10, pruneTargetRatio: 0.5 })
  record(tr, 0, 100, 4, 0) // expires 120 s
  record(tr, 1, 200, 4, 1000) // 121 s
  record(tr, 0, 300, 2, 2000) // 122 s → 10 entries, not above the cap
  t.equal(tr.size, 10)
  sink.take()
  record(tr, 0, 400, 1, 3000) // 11 > 10 → prune down to floor(10 × 0.5) = 5
  t.equal(tr.size, 5)
  t.equal(tr.prunedTotal, 6)
  t.same(sink.take(), [
    { kind: 'stored', worker: 10n, rank: 0, local: [1400], seq: [400] },
    { kind: 'removed', worker: 10n, rank: 0, seq: [103, 102, 101, 100] },
    { kind: 'removed', worker: 20n, rank: 1, seq: [203, 202] },
  ])
  tr.expire(1e9)
  t.same(sink.take(), [
    { kind: 'removed', worker: 20n, rank: 1, seq: [201, 200] },
    { kind: 'removed', worker: 10n, rank: 0, seq: [301, 300, 400] },
  ])
})

t.test('equal expiry and position: key order, then slot', async (t) => {
  const { sink, tr } = setup({ maxTreeSize: 2, pruneTargetRatio: 0 })
  const a = { lo: new Uint32Array([5]), hi: new Uint32Array([2]) }
  const b = { lo: new Uint32Array([9]), hi: new Uint32Array([1]) }
  tr.record(0, a.lo, a.hi, a.lo, a.hi, 1, 0)
  tr.record(1, a.lo, a.hi, a.lo, a.hi, 1, 0)
  tr.record(0, b.lo, b.hi, b.lo, b.hi, 1, 0) // 3 > 2 → prune all, in order (hi 1) < (hi 2, slot 0) < (hi 2, slot 1)
  const removed = sink.take().filter((e) => e.kind === 'removed')
  t.same(
    removed.map((e) => [e.worker, e.seq]),
    [
      [10n, [9, 5]],
      [20n, [5]],
    ],
  )
})

t.test('a removed worker-rank loses its entries without events', async (t) => {
  const { sink, tr, workers } = setup()
  record(tr, 0, 1, 3, 0)
  record(tr, 1, 1, 3, 0)
  sink.take()
  t.equal(tr.removeSlot(0), 3)
  t.equal(tr.size, 3)
  // slot 1 removed from the table without removeSlot: its expiry must not emit for a dead rank
  workers.remove(20n, 1)
  tr.expire(1e9)
  t.same(sink.take(), [])
  t.equal(tr.size, 0)
})

t.test('the lazy heap is rebuilt when stale nodes dominate', async (t) => {
  const { tr } = setup()
  // an entry that is never refreshed stays at the top, so refreshed nodes pile up below it
  record(tr, 1, 50_000, 1, 0)
  for (let i = 1; i <= 6000; i++) record(tr, 0, 1, 1, i)
  t.equal(tr.size, 2)
  t.ok(tr.heapSize <= 4097 && tr.heapSize < 6000, `heap holds ${tr.heapSize} nodes for 2 live entries`)
  t.equal(tr.nextExpiry(), 120_000)
  t.equal(tr.expire(120_000), 1)
  t.equal(tr.nextExpiry(), 6000 + 120_000, 'the rebuilt heap still finds the refreshed expiry')
  // many distinct entries: node storage grows
  for (let i = 0; i < 3000; i++) record(tr, 1, 10_000 + i * 2, 2, 10_000)
  t.equal(tr.size, 6001)
  t.equal(tr.expire(1e12), 6001)
  t.equal(tr.size, 0)
  record(tr, 0, 1, 0, 1e12)
  t.equal(tr.size, 0, 'an empty prompt records nothing')
})

t.test('scheduler integration: decisions are recorded, query-only ones are not', async (t) => {
  const clock = new FakeClock()
  t.throws(() => new Scheduler({ approximate: { enabled: true } }, { timers: false }), /needs an approxSink/)
  const sink = new RecordingSink()
  const s = new Scheduler({ queueThreshold: null, seed: 1, approximate: { enabled: true, ttlSecs: 10 } }, { clock: clock.now, approxSink: sink, timers: false })
  s.addWorkerRank(10n, 0)
  s.addWorkerRank(11n, 0)
  const h = hashes(1, 3)
  const d = s.tryRoute({ id: 'a', isl: 3 * 128, seqLo: h.seqLo, seqHi: h.seqHi, localLo: h.localLo, localHi: h.localHi })
  t.same(sink.take(), [{ kind: 'stored', worker: d?.workerId, rank: 0, local: [1001, 1002, 1003], seq: [1, 2, 3] }])
  s.tryRoute({ isl: 3 * 128, seqLo: h.seqLo, seqHi: h.seqHi, localLo: h.localLo, localHi: h.localHi, updateStates: false })
  t.same(sink.take(), [])
  t.equal(s.stats().approximateBlocks, 3)
  clock.advance(10_000)
  s.recheck()
  t.same(sink.take(), [{ kind: 'removed', worker: d?.workerId, rank: 0, seq: [3, 2, 1] }])
  s.tryRoute({ id: 'b', isl: 3 * 128, workerId: 11n, seqLo: h.seqLo, seqHi: h.seqHi, localLo: h.localLo, localHi: h.localHi })
  t.equal(s.stats().approximateBlocks, 3, 'pinned decisions are recorded too')
  s.removeWorker(11n)
  t.equal(s.stats().approximateBlocks, 0)
  const timed = new Scheduler({ approximate: { enabled: true } }, { approxSink: sink })
  timed.close()
})
