// Other replicas' bookings in the scheduler (replica sync): they load cost and busy checks like
// this router's own, live in their own id space, end by free, stale expiry, worker removal or
// their owner leaving; this router's bookings are reported to an observer; and the replica
// spread makes replicas facing the same near-tie choose different workers.
import t from 'tap'
import { ActiveSequences, booking, TRACK_SHARED, TRACK_UNIQUE } from '../../src/scheduler/active-sequences.js'
import type { BookingObserver } from '../../src/scheduler/scheduler.js'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import { identityHash } from '../../src/scheduler/worker-ranks.js'
import type { CostModel } from '../../src/scheduler/options.js'
import { blocks, chain, FakeClock, makeScheduler } from './fixtures.js'

t.test('a remote booking loads its worker-rank: the next decision goes elsewhere, and comes back once it is freed', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  const h = chain(blocks(0, 8))
  t.equal(s.addRemote('p1/r1', 1, 1n, 0, booking({ isl: 128, prefillTokens: 128, lo: h.lo, hi: h.hi, n: 8 })), 'applied')
  t.equal(s.sequences.prefillTokens[0], 128)
  t.equal(s.sequences.activeBlocks[0], 8)
  t.equal(s.sequences.inFlight[0], 1)
  t.equal(s.stats().bookedRequests, 0, 'not one of this router’s bookings')
  t.equal(s.stats().remoteBookings, 1)
  const d = s.tryRoute({ id: 'mine', isl: 64, updateStates: false })
  t.equal(d?.workerId, 2n, 'the remotely loaded worker is avoided')
  t.ok(s.markRemotePrefillComplete('p1/r1'))
  t.equal(s.sequences.prefillTokens[0], 0)
  t.ok(s.freeRemote('p1/r1'))
  t.notOk(s.freeRemote('p1/r1'), 'a second free is a no-op')
  t.same([s.sequences.activeBlocks[0], s.sequences.inFlight[0], s.sequences.trackedPairs], [0, 0, 0])
})

t.test('remote keys never meet local ids; duplicates and unknown workers are refused', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  s.tryRoute({ id: 'same', isl: 32, workerId: 2n })
  t.equal(s.addRemote('same', 1, 1n, 0, booking({ isl: 32, prefillTokens: 32 })), 'applied', 'a remote key equal to a local id is another booking')
  t.equal(s.addRemote('same', 1, 1n, 0, booking({ isl: 32, prefillTokens: 32 })), 'duplicate')
  t.equal(s.addRemote('other', 1, 9n, 0, booking({ isl: 32, prefillTokens: 32 })), 'unknown_worker')
  t.equal(s.sequences.inFlight[0], 1)
  t.equal(s.sequences.inFlight[1], 1)
  t.ok(s.free('same'), 'the local booking frees the local one')
  t.equal(s.sequences.inFlight[1], 0)
  t.equal(s.sequences.inFlight[0], 1, 'the remote one stays')
  t.notOk(s.markPrefillComplete('nope'))
})

t.test('a peer leaving drops its bookings only; stale expiry reaps remote bookings and counts them', async (t) => {
  const { s, clock } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  s.addRemote('a', 1, 1n, 0, booking({ isl: 16, prefillTokens: 16 }))
  s.addRemote('b', 1, 2n, 0, booking({ isl: 16, prefillTokens: 16 }))
  s.addRemote('c', 2, 2n, 0, booking({ isl: 16, prefillTokens: 16 }))
  s.tryRoute({ id: 'local', isl: 16, workerId: 1n })
  t.same(s.sequences.countByOwner(), [1, 2, 1])
  t.equal(s.dropRemoteOwner(1), 2)
  t.same(s.sequences.countByOwner(), [1, undefined, 1])
  t.notOk(s.sequences.hasRemote('a'))
  t.ok(s.sequences.hasRemote('c'))
  clock.advance(300_001)
  s.recheck()
  t.equal(s.stats().staleExpiredTotal, 2)
  t.equal(s.stats().remoteExpiredTotal, 1)
  t.equal(s.stats().remoteBookings, 0)
})

t.test('removing a worker returns only this router’s ids, and drops the remote bookings on it too', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  s.tryRoute({ id: 'mine', isl: 16, workerId: 1n })
  s.addRemote('theirs', 1, 1n, 0, booking({ isl: 16, prefillTokens: 16 }))
  t.same(s.removeWorker(1n), ['mine'])
  t.notOk(s.sequences.hasRemote('theirs'))
})

t.test('remote prefill and blocks follow the tracking options', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, trackActiveBlocks: false, trackPrefillTokens: false }, 1)
  const h = chain(blocks(0, 4))
  s.addRemote('x', 1, 1n, 0, booking({ isl: 64, prefillTokens: 64, lo: h.lo, hi: h.hi, n: 4 }))
  t.same([s.sequences.prefillTokens[0], s.sequences.activeBlocks[0], s.sequences.inFlight[0]], [0, 0, 1])
})

t.test('the observer hears every booking, prefill completion and free of this router, with the blocks it booked', async (t) => {
  const seen: unknown[] = []
  const observer: BookingObserver = {
    booked: (id, b) =>
      seen.push([
        'booked',
        id,
        b.slot,
        b.isl,
        b.overlapBlocks,
        b.prefillTokens,
        b.trackPrefill,
        b.track,
        b.n,
        b.lo === undefined ? null : Array.from(b.lo as Uint32Array).slice(0, b.n),
        b.hi === undefined ? null : Array.from(b.hi as Uint32Array).slice(0, b.n),
      ]),
    prefillCompleted: (id, slot) => seen.push(['prefill', id, slot]),
    freed: (id, slot) => seen.push(['freed', id, slot]),
  }
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  s.observer = observer
  const h = chain(blocks(0, 3))
  s.tryRoute({ id: 'q', isl: 50, workerId: 2n, seqLo: h.lo, seqHi: h.hi, overlapBlocks: new Float64Array([0, 1]) })
  s.tryRoute({ id: 'dry', isl: 50, updateStates: false })
  t.ok(s.markPrefillComplete('q'))
  t.notOk(s.markPrefillComplete('unknown'))
  t.ok(s.free('q'))
  t.notOk(s.free('q'))
  s.addRemote('r', 1, 1n, 0, booking({ isl: 16, prefillTokens: 16 }))
  s.freeRemote('r')
  t.same(
    seen,
    [
      ['booked', 'q', 1, 50, 1, 34, true, TRACK_SHARED, 3, Array.from(h.lo), Array.from(h.hi)],
      ['prefill', 'q', 1],
      ['freed', 'q', 1],
    ],
    'query-only and remote bookings are not reported',
  )
  const unique = makeScheduler({ blockSize: 16, queueThreshold: null, assumeKvReuse: false }, 1).s
  unique.observer = observer
  seen.length = 0
  unique.tryRoute({ id: 'u', isl: 40 })
  t.equal((seen[0] as unknown[])[7], TRACK_UNIQUE)
  t.equal((seen[0] as unknown[])[8], 2, 'two complete blocks counted without hashes')
})

t.test('local bookings read back with their hashes, prefill left and unique blocks', async (t) => {
  const a = new ActiveSequences(300_000)
  a.ensureSlots(2)
  const p = chain(blocks(0, 5))
  a.add('p', booking({ slot: 1, isl: 80, prefillTokens: 80, track: TRACK_SHARED, lo: p.lo, hi: p.hi, n: 5 }), 0)
  a.add('u', booking({ slot: 0, isl: 32, prefillTokens: 32, track: TRACK_UNIQUE, n: 2 }), 0)
  a.addRemote('x', 3, booking({ slot: 0, isl: 16, prefillTokens: 16, track: TRACK_SHARED, lo: p.lo, hi: p.hi, n: 5 }), 0)
  a.markPrefillComplete('u')
  const got = a.localBookings().sort((x, y) => x.id.localeCompare(y.id))
  t.equal(got.length, 2, 'remote bookings are not this router’s to tell')
  t.same(got[0], { id: 'p', slot: 1, isl: 80, overlapBlocks: 0, prefillTokens: 80, trackPrefill: true, track: TRACK_SHARED, lo: p.lo, hi: p.hi, n: 5 })
  t.same(got[1], { id: 'u', slot: 0, isl: 32, overlapBlocks: 0, prefillTokens: 0, trackPrefill: true, track: TRACK_UNIQUE, lo: undefined, hi: undefined, n: 2 })
  t.equal(a.remoteAddedAt('x'), 0)
  t.equal(a.remoteAddedAt('p'), -1)
  t.throws(() => a.addRemote('y', 0, booking({ slot: 0, track: TRACK_SHARED }), 0), { code: 'KVR_ERR_INVALID_OPTION' })
})

/** Two schedulers with the same workers, registered in different orders (so slots differ), ranks 0 and 1. */
function pair(workers: number, spread: boolean, cost: CostModel = 'latency'): [Scheduler, Scheduler] {
  const out: Scheduler[] = []
  for (let r = 0; r < 2; r++) {
    const clock = new FakeClock()
    const s = new Scheduler({ blockSize: 16, queueThreshold: null, seed: 11 + r, cost }, { clock: clock.now, timers: false })
    const ids = Array.from({ length: workers }, (_, i) => BigInt(1000 + i * 7))
    if (r === 1) ids.reverse()
    for (const id of ids) s.addWorkerRank(id, 0)
    s.setSpread(r, 2, spread)
    out.push(s)
  }
  return out as [Scheduler, Scheduler]
}

/** Books `isl` tokens of prefill on a worker on both replicas, as a third router's booking. */
function load(both: Scheduler[], key: string, worker: bigint, isl: number): void {
  for (const s of both) s.addRemote(key, 9, worker, 0, booking({ isl, prefillTokens: isl }))
}

t.test('replica spread: two replicas routing at once choose apart where both would take the cheapest; without it they collide', async (t) => {
  const trial = (spread: boolean): number => {
    let collisions = 0
    for (let k = 0; k < 50; k++) {
      const [a, b] = pair(4, spread)
      // uneven loads, so most waves have one cheapest worker
      for (let i = 0; i < 4; i++) load([a, b], `l${i}`, BigInt(1000 + i * 7), 16 * (((k + i * 3) % 5) + 1))
      for (let wave = 0; wave < 6; wave++) {
        const da = a.tryRoute({ id: `a${wave}`, isl: 16 * (2 + ((wave + k) % 4)) })
        const db = b.tryRoute({ id: `b${wave}`, isl: 16 * (2 + ((wave * 3 + k) % 4)) })
        if (da?.workerId === db?.workerId) collisions++
        // then each learns the other's booking, as replica sync tells it
        a.addRemote(`b${wave}`, 1, db?.workerId as bigint, 0, booking({ prefillTokens: b.sequences.requestInfo(`b${wave}`)?.prefillTokens ?? 0 }))
        b.addRemote(`a${wave}`, 1, da?.workerId as bigint, 0, booking({ prefillTokens: a.sequences.requestInfo(`a${wave}`)?.prefillTokens ?? 0 }))
      }
    }
    return collisions
  }
  const without = trial(false)
  const withSpread = trial(true)
  t.comment(`300 simultaneous pairs: ${without} collisions without the spread, ${withSpread} with it`)
  t.ok(without > 150, `without the spread, the cheapest worker takes both most of the time (${without} of 300)`)
  t.ok(withSpread < without / 5, `with it, rarely (${withSpread} of 300)`)
})

t.test(
  'replica spread, Dynamo’s cost: rank 0 takes the cheapest, rank 1 where one router would put a second request; a cached prefix keeps both on its worker',
  async (t) => {
    const [a, b] = pair(3, true, 'dynamo')
    const ws = [1000n, 1007n, 1014n]
    load([a, b], 'x', ws[0] as bigint, 32)
    load([a, b], 'y', ws[1] as bigint, 48)
    const da = a.tryRoute({ id: 'p', isl: 64, updateStates: false })
    const db = b.tryRoute({ id: 'q', isl: 64, updateStates: false })
    t.equal(da?.workerId, ws[2], 'rank 0: the idle worker, the cheapest')
    t.equal(db?.workerId, ws[0], 'rank 1: where one router would put a second such request')
    // its 4 blocks cached on the middle worker: a second request like it costs there only its
    // unaligned tail, so one router would put both there
    const cachedA = new Float64Array(8)
    cachedA[a.workers.slotOf(ws[1] as bigint, 0)] = 4
    const cachedB = new Float64Array(8)
    cachedB[b.workers.slotOf(ws[1] as bigint, 0)] = 4
    const h = chain(blocks(0, 4))
    t.equal(a.tryRoute({ id: 'r', isl: 72, overlapBlocks: cachedA, seqLo: h.lo, seqHi: h.hi, updateStates: false })?.workerId, ws[1])
    t.equal(
      b.tryRoute({ id: 's', isl: 72, overlapBlocks: cachedB, seqLo: h.lo, seqHi: h.hi, updateStates: false })?.workerId,
      ws[1],
      'the cache hit wins on both',
    )
    // off: both take the cheapest
    const [c, d] = pair(3, false, 'dynamo')
    load([c, d], 'x', ws[0] as bigint, 32)
    load([c, d], 'y', ws[1] as bigint, 48)
    t.equal(c.tryRoute({ id: 'p', isl: 64, updateStates: false })?.workerId, ws[2])
    t.equal(d.tryRoute({ id: 'q', isl: 64, updateStates: false })?.workerId, ws[2])
  },
)

t.test('replica spread, latency cost: rank 1 takes where one router would put a second request; a long cached prefix keeps both on its worker', async (t) => {
  const ws = [1000n, 1007n, 1014n]
  const [a, b] = pair(3, true)
  load([a, b], 'x', ws[0] as bigint, 32)
  load([a, b], 'y', ws[1] as bigint, 48)
  const da = a.tryRoute({ id: 'p', isl: 64, updateStates: false })
  const db = b.tryRoute({ id: 'q', isl: 64, updateStates: false })
  t.equal(da?.workerId, ws[2], 'rank 0: the idle worker, the cheapest')
  t.not(db?.workerId, ws[2], 'rank 1: not where rank 0 is putting its request')
  // 200 of its 210 blocks cached on the middle worker: recomputing them elsewhere costs far more
  // than a second request there, so one router would put both there
  const isl = 210 * 16
  const h = chain(blocks(0, 200))
  const cached = (s: Scheduler): Float64Array => {
    const o = new Float64Array(8)
    o[s.workers.slotOf(ws[1] as bigint, 0)] = 200
    return o
  }
  t.equal(a.tryRoute({ id: 'r', isl, overlapBlocks: cached(a), seqLo: h.lo, seqHi: h.hi, updateStates: false })?.workerId, ws[1])
  t.equal(b.tryRoute({ id: 's', isl, overlapBlocks: cached(b), seqLo: h.lo, seqHi: h.hi, updateStates: false })?.workerId, ws[1], 'the cache hit wins on both')
  // off: both take the cheapest
  const [c, d] = pair(3, false)
  load([c, d], 'x', ws[0] as bigint, 32)
  load([c, d], 'y', ws[1] as bigint, 48)
  t.equal(c.tryRoute({ id: 'p', isl: 64, updateStates: false })?.workerId, ws[2])
  t.equal(d.tryRoute({ id: 'q', isl: 64, updateStates: false })?.workerId, ws[2])
})

t.test('replica spread: exact ties go to the same worker-rank identity on every replica of the same rank', async (t) => {
  const [a] = pair(4, true)
  const [, b] = pair(4, true)
  a.setSpread(0, 2, true)
  b.setSpread(0, 2, true)
  t.equal(
    a.tryRoute({ id: 'x', isl: 32, updateStates: false })?.workerId,
    b.tryRoute({ id: 'y', isl: 32, updateStates: false })?.workerId,
    'same rank, same view, same worker whatever the slots',
  )
})

t.test('the identity hash depends on the worker and rank only, and spreads', async (t) => {
  t.equal(identityHash(5n, 0), identityHash(5n, 0))
  t.not(identityHash(5n, 0), identityHash(5n, 1))
  t.not(identityHash(5n, 0), identityHash(5n + (1n << 32n), 0))
  const seen = new Set<number>()
  for (let i = 0; i < 1000; i++) seen.add(identityHash(BigInt(i), 0))
  t.equal(seen.size, 1000)
})
