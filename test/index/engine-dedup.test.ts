// Per worker-rank refcounts of engine block hashes: a duplicate store is counted, a removal is
// applied only at count 0, untracked hashes pass, and the table survives growth and deletion
// (checked against a Map over many random operations).
import t from 'tap'
import { DecodedEvent, EventKind, StorageTier } from '../../src/codec/event-decoder.js'
import { EngineDedup, HashCounts } from '../../src/index/engine-dedup.js'
import { Rng } from '../helpers/rng.js'

function event(kind: EventKind, hashes: number[], tier: number = StorageTier.Device): DecodedEvent {
  const d = new DecodedEvent()
  d.kind = kind
  d.tier = tier
  d.ensure(hashes.length)
  hashes.forEach((h, i) => {
    d.blockLo[i] = h
    d.blockHi[i] = h === 5 ? 0xffffffff : 0
  })
  d.count = hashes.length
  return d
}

const left = (d: DecodedEvent): number[] => [...d.blockLo.subarray(0, d.count)]

t.test('stores count up, removals apply at zero, untracked hashes pass', async (t) => {
  const dd = new EngineDedup()
  const c = dd.counts(7, 0, 0)
  t.ok(dd.filter(c, event(EventKind.Stored, [1, 2, 5])))
  t.ok(dd.filter(c, event(EventKind.Stored, [2, 5])))
  t.equal(dd.duplicateStores, 2)
  const r = event(EventKind.Removed, [1, 2, 5, 9])
  t.ok(dd.filter(c, r))
  t.same(left(r), [1, 9], 'the once-stored and the untracked go; the twice-stored stay')
  t.equal(dd.suppressedRemovals, 2)
  const again = event(EventKind.Removed, [2, 5])
  t.ok(dd.filter(c, again))
  t.same(left(again), [2, 5], 'their second removal applies')
  const none = event(EventKind.Stored, [3])
  dd.filter(c, none)
  dd.filter(c, event(EventKind.Stored, [3]))
  t.notOk(dd.filter(c, event(EventKind.Removed, [3])), 'nothing left to apply')
  t.equal(c.size, 1)
  // host-tier events are not counted
  t.ok(dd.filter(c, event(EventKind.Stored, [4], StorageTier.HostPinned)))
  t.equal(c.size, 1)
  t.ok(dd.filter(c, event(EventKind.Cleared, [])))
})

t.test('ranks count apart; a rank or a worker is forgotten', async (t) => {
  const dd = new EngineDedup()
  dd.filter(dd.counts(7, 0, 0), event(EventKind.Stored, [1]))
  dd.filter(dd.counts(7, 0, 1), event(EventKind.Stored, [1]))
  t.equal(dd.duplicateStores, 0)
  dd.filter(dd.counts(7, 0, 1), event(EventKind.Stored, [1]))
  dd.forgetRank(7, 0, 1)
  t.equal(dd.counts(7, 0, 1).size, 0)
  t.equal(dd.counts(7, 0, 0).size, 1)
  dd.filter(dd.counts(8, 0, 0), event(EventKind.Stored, [1]))
  dd.forgetWorker(7, 0)
  t.equal(dd.counts(7, 0, 0).size, 0)
  t.equal(dd.counts(8, 0, 0).size, 1, 'another worker keeps its counts')
})

t.test('a full table counts no new hash: its removal passes through', async (t) => {
  const c = new HashCounts(2)
  t.equal(c.add(1, 0), 0)
  t.equal(c.add(2, 0), 0)
  t.equal(c.add(3, 0), -1)
  t.equal(c.add(1, 0), 1)
  t.equal(c.remove(3, 0), -1)
})

t.test('the table agrees with a Map over random stores and removals', async (t) => {
  const rng = new Rng(3)
  const c = new HashCounts(1 << 20)
  const ref = new Map<string, number>()
  for (let i = 0; i < 200_000; i++) {
    // few distinct keys, many collisions in the low bits
    const lo = rng.int(3000) * 1024
    const hi = rng.int(3)
    const k = `${lo}:${hi}`
    if (rng.next() < 0.55) {
      const before = c.add(lo, hi)
      if (before !== (ref.get(k) ?? 0)) return t.fail(`add ${k}: ${before}`)
      ref.set(k, (ref.get(k) ?? 0) + 1)
    } else {
      const after = c.remove(lo, hi)
      const r = ref.get(k)
      if (r === undefined ? after !== -1 : after !== r - 1) return t.fail(`remove ${k}: ${after}`)
      if (r !== undefined) r === 1 ? ref.delete(k) : ref.set(k, r - 1)
    }
  }
  t.equal(c.size, ref.size)
  let wrong = 0
  for (const [k, v] of ref) {
    const [lo, hi] = k.split(':').map(Number) as [number, number]
    if (c.add(lo, hi) !== v) wrong++
  }
  t.equal(wrong, 0, 'every count as the Map has it')
})
