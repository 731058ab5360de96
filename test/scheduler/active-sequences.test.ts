import t from 'tap'
import { ActiveSequences, booking, TRACK_SHARED, TRACK_UNIQUE } from '../../src/scheduler/active-sequences.js'
import { BlockRefs } from '../../src/scheduler/block-refs.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import { U64SlotMap } from '../../src/scheduler/u64-slot-map.js'
import { blocks, chain } from './fixtures.js'

t.test('shared prefix blocks count once per worker-rank, by reference', async (t) => {
  const a = new ActiveSequences(300_000)
  a.ensureSlots(2)
  const p = chain([...blocks(0, 4), 100, 101]) // shares 4 blocks with q
  const q = chain([...blocks(0, 4), 200, 201, 202])
  a.add('p', booking({ slot: 0, isl: 96, prefillTokens: 96, track: TRACK_SHARED, lo: p.lo, hi: p.hi, n: 6 }), 0)
  t.equal(a.activeBlocks[0], 6)
  a.add('q', booking({ slot: 0, isl: 112, overlapBlocks: 4, prefillTokens: 112, track: TRACK_SHARED, lo: q.lo, hi: q.hi, n: 7 }), 0)
  t.equal(a.activeBlocks[0], 9, '4 shared + 2 + 3 distinct')
  t.equal(a.blockRefCount(0, p.lo[0] as number, p.hi[0] as number), 2)
  t.equal(a.blockRefCount(0, p.lo[4] as number, p.hi[4] as number), 1)
  a.add('r', booking({ slot: 1, prefillTokens: 16, track: TRACK_SHARED, lo: q.lo, hi: q.hi, n: 7 }), 0)
  t.equal(a.activeBlocks[1], 7, 'another worker-rank counts its own copy')
  t.equal(a.inFlight[0], 2)
  t.equal(a.prefillTokens[0], 208)
  const present = new Int32Array(2)
  a.countPresent(q.lo, q.hi, 7, present)
  t.same(Array.from(present), [7, 7], 'every block of q is active on both ranks')
  present.fill(0)
  const fresh = chain([999])
  a.countPresent(fresh.lo, fresh.hi, 1, present)
  t.same(Array.from(present), [0, 0])

  t.ok(a.free('q'))
  t.equal(a.activeBlocks[0], 6, 'q only removes what nobody else holds')
  t.equal(a.blockRefCount(0, p.lo[0] as number, p.hi[0] as number), 1)
  t.notOk(a.free('q'), 'freeing twice is a no-op')
  t.equal(a.activeBlocks[0], 6)
  t.ok(a.free('p'))
  t.ok(a.free('r'))
  t.same([a.activeBlocks[0], a.activeBlocks[1], a.prefillTokens[0], a.inFlight[0], a.trackedPairs, a.size], [0, 0, 0, 0, 0, 0])
})

t.test('prefill tokens leave on prefill-complete, and free implies it', async (t) => {
  const a = new ActiveSequences(300_000)
  a.add('x', booking({ slot: 0, isl: 600, overlapBlocks: 1, prefillTokens: 500 }), 0)
  a.add('y', booking({ slot: 0, prefillTokens: 300 }), 0)
  t.equal(a.prefillTokens[0], 800)
  t.same(a.requestInfo('x'), { slot: 0, isl: 600, overlapBlocks: 1, prefillTokens: 500, blocks: 0, addedAt: 0 })
  t.ok(a.markPrefillComplete('x'))
  t.equal(a.prefillTokens[0], 300)
  t.ok(a.markPrefillComplete('x'), 'known request, nothing left to subtract')
  t.equal(a.prefillTokens[0], 300)
  t.notOk(a.markPrefillComplete('nope'))
  t.equal(a.requestInfo('nope'), undefined)
  t.equal(a.slotOfRequest('y'), 0)
  t.equal(a.slotOfRequest('nope'), -1)
  t.ok(a.free('y'))
  t.equal(a.prefillTokens[0], 0)
  t.ok(a.free('x'))
  t.equal(a.inFlight[0], 0)
})

t.test('toggles: no tracking adds no blocks; no kv reuse counts every block', async (t) => {
  const a = new ActiveSequences(300_000)
  const h = chain(blocks(0, 5))
  a.add('none', booking({ slot: 0, lo: h.lo, hi: h.hi, n: 5 }), 0)
  t.equal(a.activeBlocks[0], 0)
  a.add('u1', booking({ slot: 0, track: TRACK_UNIQUE, n: 5 }), 0)
  a.add('u2', booking({ slot: 0, track: TRACK_UNIQUE, n: 5 }), 0)
  t.equal(a.activeBlocks[0], 10, 'random hashes never dedupe')
  t.equal(a.requestInfo('u1')?.blocks, 5)
  a.free('u1')
  t.equal(a.activeBlocks[0], 5)
  a.free('u2')
  a.free('none')
  t.equal(a.activeBlocks[0], 0)
})

t.test('duplicates are refused', async (t) => {
  const a = new ActiveSequences(300_000)
  a.add('d', booking({ slot: 0, prefillTokens: 1 }), 0)
  t.throws(() => a.add('d', booking({ slot: 0, prefillTokens: 1 }), 0), { code: 'KVR_ERR_DUPLICATE_REQUEST' })
  t.equal(a.inFlight[0], 1)
})

t.test('stale requests expire lazily on add and on demand, exactly once', async (t) => {
  const a = new ActiveSequences(1000)
  const h = chain(blocks(0, 3))
  a.add('old', booking({ slot: 0, prefillTokens: 10, track: TRACK_SHARED, lo: h.lo, hi: h.hi, n: 3 }), 0)
  a.add('gone', booking({ slot: 0, prefillTokens: 10 }), 100)
  a.free('gone') // its FIFO record goes stale and must be skipped
  a.add('mid', booking({ slot: 0, prefillTokens: 10 }), 500)
  a.add('new', booking({ slot: 0, prefillTokens: 10, track: TRACK_SHARED, lo: h.lo, hi: h.hi, n: 3 }), 999)
  t.equal(a.size, 3, 'nothing expired before a full period')
  a.add('later', booking({ slot: 0, prefillTokens: 10 }), 1000)
  t.notOk(a.has('old'), 'the oldest booking expired when a new one was added')
  t.ok(a.has('mid'))
  t.equal(a.activeBlocks[0], 3, "'new' still holds the shared blocks")
  t.notOk(a.free('old'), 'an expired request cannot be freed again')
  t.equal(a.expireStale(1499), 0)
  t.equal(a.expireStale(1500), 1)
  t.equal(a.expireStale(5000), 2)
  t.equal(a.expiredTotal, 4)
  t.same([a.size, a.activeBlocks[0], a.prefillTokens[0], a.inFlight[0], a.trackedPairs], [0, 0, 0, 0, 0])
})

t.test('FIFO and handle storage grow', async (t) => {
  const a = new ActiveSequences(10)
  for (let i = 0; i < 500; i++) a.add(`r${i}`, booking({ slot: i % 3, prefillTokens: 1, track: TRACK_UNIQUE, n: 1 }), i / 100)
  t.equal(a.size, 500)
  t.equal(a.expireStale(100), 500)
  // wrap-around: alternate add and expire so the ring head moves
  for (let i = 0; i < 300; i++) {
    a.add(`w${i}`, booking({ slot: 0, prefillTokens: 1 }), 200 + i)
    if (i % 3 === 0) a.expireStale(200 + i)
  }
  const left = a.size
  t.ok(left > 0 && left < 300, 'some expired on the way')
  t.equal(a.expireStale(10_000), left)
  t.equal(a.size, 0)
  t.equal(a.expiredTotal, 800)
})

t.test('dropSlot frees only that slot', async (t) => {
  const a = new ActiveSequences(300_000)
  a.ensureSlots(40)
  t.ok(a.activeBlocks.length >= 40)
  const h = chain(blocks(0, 4))
  a.add('a', booking({ slot: 3, prefillTokens: 5, track: TRACK_SHARED, lo: h.lo, hi: h.hi, n: 4 }), 0)
  a.add('b', booking({ slot: 3, prefillTokens: 5, track: TRACK_SHARED, lo: h.lo, hi: h.hi, n: 4 }), 0)
  a.add('c', booking({ slot: 4, prefillTokens: 5, track: TRACK_SHARED, lo: h.lo, hi: h.hi, n: 4 }), 0)
  t.same(a.dropSlot(3).sort(), ['a', 'b'])
  t.equal(a.activeBlocks[3], 0)
  t.equal(a.activeBlocks[4], 4)
  t.same(a.dropSlot(3), [])
  t.ok(a.has('c'))
})

t.test('big prompts: pair lists recycle by size class and the maps grow', async (t) => {
  const a = new ActiveSequences(300_000)
  a.ensureSlots(4)
  const n = 20_000
  const lo = new Uint32Array(n)
  const hi = new Uint32Array(n)
  for (let i = 0; i < n; i++) {
    lo[i] = i
    hi[i] = 7
  }
  for (let slot = 0; slot < 4; slot++) a.add(`big${slot}`, booking({ slot, track: TRACK_SHARED, lo, hi, n }), 0)
  t.equal(a.trackedPairs, 4 * n)
  const present = new Int32Array(4)
  a.countPresent(lo, hi, n, present)
  t.same(Array.from(present), [n, n, n, n])
  for (let slot = 0; slot < 4; slot++) a.free(`big${slot}`)
  t.equal(a.trackedPairs, 0)
  a.add('again', booking({ slot: 1, track: TRACK_SHARED, lo, hi, n }), 0)
  t.equal(a.activeBlocks[1], n)
  a.free('again')
  t.equal(a.activeBlocks[1], 0)
  // one-block requests use the smallest class
  a.add('one', booking({ slot: 0, track: TRACK_SHARED, lo, hi, n: 1 }), 0)
  t.equal(a.activeBlocks[0], 1)
  a.free('one')
})

t.test('U64SlotMap: find, insert, delete in chains, reuse, growth, clear', async (t) => {
  t.throws(() => new U64SlotMap(4, 3), /power of two/)
  const m = new U64SlotMap(4, 2)
  t.equal(m.capacity, 16)
  let grew = 0
  m.onGrow = () => grew++
  const idx: number[] = []
  for (let i = 0; i < 100; i++) idx.push(m.insert(i, i >>> 1, i % 3))
  t.ok(grew >= 2)
  for (let i = 0; i < 100; i++) t.equal(m.find(i, i >>> 1, i % 3), idx[i])
  t.equal(m.find(1, 0, 2), -1, 'slot is part of the key')
  for (let i = 0; i < 100; i += 2) m.delete(idx[i] as number)
  t.equal(m.size, 50)
  for (let i = 0; i < 100; i++) t.equal(m.find(i, i >>> 1, i % 3) >= 0, i % 2 === 1)
  const keys = Array.from({ length: 100 }, (_, i) => i)
  const out = new Int32Array(100)
  for (const slot of [0, 1, 2]) {
    m.findAll(
      keys,
      keys.map((i) => i >>> 1),
      100,
      slot,
      out,
    )
    t.same(
      Array.from(out),
      keys.map((i) => m.find(i, i >>> 1, slot)),
      `findAll is find, slot ${slot}`,
    )
  }
  const size = m.size
  t.equal(typeof m.warm(Int32Array.from([3, -1, 5]), 0, 3, 1), 'number')
  t.equal(m.size, size, 'warm reads, nothing more')
  const again = m.insert(5000, 1, 0)
  t.ok(again < 100, 'a freed index is reused')
  t.equal(m.highWater, 100)
  m.clear()
  t.equal(m.size, 0)
  t.equal(m.find(1, 0, 1), -1)
})

t.test('BlockRefs: release unlinks from the middle of a hash list', async (t) => {
  const r = new BlockRefs()
  const p0 = r.acquire(0, 1, 1)
  t.ok(r.created)
  const p1 = r.acquire(1, 1, 1)
  const p2 = r.acquire(2, 1, 1)
  r.acquire(1, 1, 1)
  t.notOk(r.created)
  t.equal(r.refCount(1, 1, 1), 2)
  t.notOk(r.release(p1))
  t.ok(r.release(p1), 'middle of the list')
  const present = new Int32Array(3)
  r.countPresent([1], [1], 1, present)
  t.same(Array.from(present), [1, 0, 1])
  t.ok(r.release(p2))
  t.ok(r.release(p0))
  t.equal(r.size, 0)
  t.equal(r.refCount(0, 1, 1), 0)
  present.fill(0)
  r.countPresent([1], [1], 1, present)
  t.same(Array.from(present), [0, 0, 0])
})

t.test('countPresent: depth of the longest active prefix per slot, for chained hashes', async (t) => {
  const a = new ActiveSequences(300_000)
  a.ensureSlots(3)
  const q = chain(blocks(0, 7))
  const p = chain([...blocks(0, 4), 50, 51]) // shares q's first 4 blocks
  const r = chain(blocks(0, 2))
  a.add('p', booking({ slot: 0, track: TRACK_SHARED, lo: p.lo, hi: p.hi, n: 6 }), 0)
  a.add('q', booking({ slot: 1, track: TRACK_SHARED, lo: q.lo, hi: q.hi, n: 7 }), 0)
  a.add('r', booking({ slot: 2, track: TRACK_SHARED, lo: r.lo, hi: r.hi, n: 2 }), 0)
  const present = new Int32Array(3)
  a.countPresent(q.lo, q.hi, 7, present)
  t.same(Array.from(present), [4, 7, 2])
  present.fill(0)
  a.countPresent(q.lo, q.hi, 0, present)
  t.same(Array.from(present), [0, 0, 0], 'no blocks, nothing present')
})

t.test('countPresent falls back to exact counting when hashes are not chained', async (t) => {
  const r = new BlockRefs()
  r.acquire(0, 1, 0) // A on slot 0
  r.acquire(0, 2, 0) // B on slots 0 and 1: more holders than A, impossible for a chain
  r.acquire(1, 2, 0)
  r.acquire(2, 3, 0) // C on slot 2 only
  const present = new Int32Array(3)
  r.countPresent([1, 2, 3], [0, 0, 0], 3, present)
  t.same(Array.from(present), [2, 1, 1])
})

t.test('countPresent is exact for hashes that are not chained (same holder count, different slots)', async (t) => {
  const a = new ActiveSequences(300_000)
  a.ensureSlots(3)
  // slot 0 holds A, slot 1 holds B: each query block has one holder, but not the same one
  a.add('a', booking({ slot: 0, track: TRACK_SHARED, lo: [1], hi: [0], n: 1 }), 0)
  a.add('b', booking({ slot: 1, track: TRACK_SHARED, lo: [2], hi: [0], n: 1 }), 0)
  const present = new Int32Array(3)
  a.countPresent([1, 2], [0, 0], 2, present)
  t.same(Array.from(present), [1, 1, 0], 'A on slot 0, B on slot 1')
  // a block nobody holds does not hide later blocks that somebody does
  present.fill(0)
  a.countPresent([9, 1], [0, 0], 2, present)
  t.same(Array.from(present), [1, 0, 0])
  // fewer holders is not a subset either: A on {0, 2}, B on {1}
  a.add('c', booking({ slot: 2, track: TRACK_SHARED, lo: [1], hi: [0], n: 1 }), 0)
  present.fill(0)
  a.countPresent([1, 2], [0, 0], 2, present)
  t.same(Array.from(present), [1, 1, 1])
  // a block stored after another hash than in the query
  a.add('d', booking({ slot: 1, track: TRACK_SHARED, lo: [7, 1], hi: [0, 0], n: 2 }), 0)
  present.fill(0)
  a.countPresent([1, 2, 7], [0, 0, 0], 3, present)
  t.same(Array.from(present), [1, 3, 1])
})

t.test('countPresent equals plain set membership for arbitrary hashes (randomised)', async (t) => {
  const rng = new Xoshiro128(99)
  let mismatches = 0
  let checks = 0
  for (let round = 0; round < 40; round++) {
    const SLOTS = 1 + rng.int(5)
    const a = new ActiveSequences(1e12)
    a.ensureSlots(SLOTS)
    const live = new Map<string, { slot: number; hashes: number[] }>()
    // a small alphabet, so hashes recur at any position and in any order; half the requests
    // are chained prefixes of each other, as the router produces them
    const draw = (): number[] => {
      const n = 1 + rng.int(6)
      if (rng.next() < 0.5) return Array.from({ length: n }, (_, k) => 100 + k)
      return Array.from({ length: n }, () => rng.int(8))
    }
    for (let op = 0; op < 120; op++) {
      if (rng.next() < 0.6 || live.size === 0) {
        const id = `r${round}-${op}`
        const hashes = draw()
        const slot = rng.int(SLOTS)
        if (rng.next() < 0.5) {
          // as in a decision: look the blocks up, then book them (the booking reuses the lookups),
          // sometimes with a block changed in between
          a.countPresent(
            hashes,
            hashes.map(() => 5),
            hashes.length,
            new Int32Array(SLOTS),
          )
          if (rng.next() < 0.3) hashes[rng.int(hashes.length)] = rng.int(8)
        }
        a.add(id, booking({ slot, track: TRACK_SHARED, lo: hashes, hi: hashes.map(() => 5), n: hashes.length }), 0)
        live.set(id, { slot, hashes })
      } else {
        const ids = [...live.keys()]
        const id = ids[rng.int(ids.length)] as string
        a.free(id)
        live.delete(id)
      }
      const q = draw()
      const present = new Int32Array(SLOTS)
      a.countPresent(
        q,
        q.map(() => 5),
        q.length,
        present,
      )
      for (let s = 0; s < SLOTS; s++) {
        const active = new Set<number>()
        for (const r of live.values()) if (r.slot === s) for (const h of r.hashes) active.add(h)
        const expected = q.filter((h) => active.has(h)).length
        checks++
        if (present[s] !== expected || a.activeBlocks[s] !== active.size) mismatches++
      }
    }
  }
  t.equal(mismatches, 0, `${checks} checks against the naive model`)
  t.ok(checks > 1000)
})
