// Cost and selection through the scheduler façade.
import t from 'tap'
import { formatCandidates, Selector, CostInputs } from '../../src/scheduler/selector.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import { blocks, chain, makeScheduler, overlaps } from './fixtures.js'
import type { RouteDecision, Scheduler } from '../../src/scheduler/scheduler.js'

function bump(counts: number[], i: number): void {
  counts[i] = (counts[i] ?? 0) + 1
}

/** Books a finished-prefill request holding `n` fresh blocks on a worker, to set its decode load. */
function holdBlocks(s: Scheduler, id: string, workerId: bigint, n: number, base: number): void {
  const h = chain(blocks(base, n))
  s.tryRoute({ id, isl: 0, workerId, dpRank: 0, seqLo: h.lo, seqHi: h.hi })
  s.markPrefillComplete(id)
}

t.test('a worked example: W1 8+10=18, W2 5+5=10, W3 2+9=11 → W2', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 3)
  holdBlocks(s, 'w1-load', 1n, 10, 1000)
  holdBlocks(s, 'w2-load', 2n, 5, 2000)
  holdBlocks(s, 'w3-load', 3n, 9, 3000)
  const d = s.tryRoute({ id: 'req', isl: 160, overlapBlocks: overlaps({ 0: 2, 1: 5, 2: 8 }), explain: true })
  t.ok(d)
  t.equal(d?.workerId, 2n)
  t.equal(d?.overlapBlocks, 5)
  t.same(
    d?.candidates?.map((c) => [c.workerId, c.overlapBlocks, c.prefillBlocks, c.decodeBlocks, c.logit]),
    [
      [1n, 2, 8, 10, 18],
      [2n, 5, 5, 5, 10],
      [3n, 8, 2, 9, 11],
    ],
  )
  const text = formatCandidates(d?.candidates ?? [], 1)
  t.match(text, /Formula for worker_id=2 dp_rank=0: 10\.000 = 1 \* 5\.000 \+ 5 \(cached_blocks: 5\)/)
  t.equal(text.split('\n').length, 3)
  t.equal(s.sequences.prefillTokens[1], 80, 'booked: 160 − 5×16 new tokens')
})

t.test('decode term counts only the request blocks not already active on the worker', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  const shared = chain(blocks(0, 6))
  s.tryRoute({ id: 'a', isl: 96, workerId: 1n, seqLo: shared.lo, seqHi: shared.hi })
  s.markPrefillComplete('a')
  const req = chain([...blocks(0, 6), 50, 51])
  const d = s.tryRoute({ id: 'b', isl: 128, seqLo: req.lo, seqHi: req.hi, overlapBlocks: overlaps({ 0: 6 }), explain: true, updateStates: false })
  t.same(
    d?.candidates?.map((c) => [c.prefillBlocks, c.decodeBlocks, c.logit]),
    [
      [2, 6 + 2, 10],
      [8, 8, 16],
    ],
  )
  t.equal(d?.workerId, 1n)
  t.equal(d?.booked, false)
  t.equal(s.sequences.inFlight[0], 1, 'query-only decisions book nothing')
})

t.test('per-request overrides: weight 0 is pure load balancing; prefill tracking off', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  holdBlocks(s, 'load', 1n, 4, 100)
  const ov = overlaps({ 0: 10 })
  t.equal(s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false })?.workerId, 1n, 'cache hit wins at weight 1')
  t.equal(s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, overrides: { overlapScoreWeight: 0 } })?.workerId, 2n)
  const d = s.tryRoute({ id: 'np', isl: 160, overlapBlocks: ov, overrides: { trackPrefillTokens: false, overlapScoreWeight: 5 }, explain: true })
  t.same(
    d?.candidates?.map((c) => c.prefillBlocks),
    [0, 0],
  )
  t.equal(s.sequences.prefillTokens[1], 0, 'no prompt tokens booked')
  t.throws(() => s.tryRoute({ isl: 1, updateStates: false, overrides: { temperature: -1 } }), { code: 'KVR_ERR_INVALID_OPTION' })
  t.throws(() => s.tryRoute({ isl: 1, updateStates: false, overrides: { overlapScoreWeight: Number.POSITIVE_INFINITY } }), /overrides\.overlapScoreWeight/)
})

t.test('Era C overlap credit: above 1 a cached block outweighs decode load (credit 1 = Era B)', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 2)
  holdBlocks(s, 'w1', 1n, 2, 100)
  holdBlocks(s, 'w2', 2n, 10, 200)
  const ov = overlaps({ 1: 6 })
  // credit 1: W1 10 + 2 = 12, W2 (10 − 6) + 10 = 14 → W1
  const one = s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, explain: true })
  t.same(
    one?.candidates?.map((c) => [c.prefillBlocks, c.logit]),
    [
      [10, 12],
      [4, 14],
    ],
  )
  t.equal(one?.workerId, 1n)
  // credit 2: W2 max(0, 10 − 12) + 10 = 10 → W2; the prefill term is clamped at 0, not negative
  const two = s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, explain: true, overrides: { overlapScoreCredit: 2 } })
  t.same(
    two?.candidates?.map((c) => [c.prefillBlocks, c.logit]),
    [
      [10, 12],
      [0, 10],
    ],
  )
  t.equal(two?.workerId, 2n)
  // the same through the options, with the prefill scale multiplying the credited term
  const { s: s2 } = makeScheduler({ blockSize: 16, queueThreshold: null, overlapScoreCredit: 1.5, overlapScoreWeight: 3 }, 2)
  holdBlocks(s2, 'w1', 1n, 2, 100)
  holdBlocks(s2, 'w2', 2n, 10, 200)
  const d = s2.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, explain: true })
  t.same(
    d?.candidates?.map((c) => c.logit),
    [3 * 10 + 2, 3 * (10 - 9) + 10],
  )
  t.throws(() => s.tryRoute({ isl: 1, updateStates: false, overrides: { overlapScoreCredit: -1 } }), /overrides\.overlapScoreCredit/)
  // a cached run longer than the stated prompt counts as the whole prompt: no jump past credit 1
  const { s: s3 } = makeScheduler({ blockSize: 16, queueThreshold: null }, 1)
  s3.tryRoute({ id: 'queued', isl: 160, workerId: 1n })
  const at = (credit: number): number =>
    s3.tryRoute({ isl: 32, overlapBlocks: overlaps({ 0: 10 }), updateStates: false, explain: true, overrides: { overlapScoreCredit: credit } })?.candidates?.[0]
      ?.prefillBlocks ?? NaN
  t.equal(at(1), 10, 'Era B: the queued 10 blocks, no new tokens')
  t.ok(Math.abs(at(1.01) - (10 - 0.01 * 2)) < 1e-9, 'just above 1: just below')
  t.throws(() => makeScheduler({ overlapScoreCredit: Number.NaN }, 1), { code: 'KVR_ERR_INVALID_OPTION' })
})

t.test('Era C credit decay shrinks the credit of workers with more queued prefill', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, overlapScoreCredit: 2, overlapScoreCreditDecay: 1 }, 2)
  // 4 blocks of prefill queued on W2 (booked, first token not yet seen)
  s.tryRoute({ id: 'q', isl: 64, workerId: 2n })
  const d = s.tryRoute({ isl: 160, overlapBlocks: overlaps({ 0: 6, 1: 6 }), updateStates: false, explain: true })
  const credit2 = 2 / (1 + (1 * 4) / 10)
  const rows = d?.candidates?.map((c) => c.prefillBlocks) ?? []
  t.equal(rows[0], 0, 'W1 is the least queued: full credit 2 × 6 blocks covers the 10-block prompt')
  t.ok(Math.abs((rows[1] as number) - (4 + 10 - credit2 * 6)) < 1e-9, `W2: 4 queued + 10 − ${credit2.toFixed(3)} × 6`)
  t.equal(d?.workerId, 1n)
})

t.test('Era C decode_active_request_weight adds a cost per in-flight request', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, decodeActiveRequestWeight: 7 }, 2)
  holdBlocks(s, 'a', 1n, 0, 100)
  holdBlocks(s, 'b', 1n, 0, 200)
  const d = s.tryRoute({ isl: 32, updateStates: false, explain: true })
  t.same(
    d?.candidates?.map((c) => [c.inFlight, c.logit]),
    [
      [2, 2 + 14],
      [0, 2],
    ],
  )
  t.equal(d?.workerId, 2n)
})

t.test('assume_kv_reuse off: every block is new on every worker', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, assumeKvReuse: false }, 1)
  const h = chain(blocks(0, 4))
  s.tryRoute({ id: 'a', isl: 64, seqLo: h.lo, seqHi: h.hi })
  s.tryRoute({ id: 'b', isl: 64, seqLo: h.lo, seqHi: h.hi })
  t.equal(s.sequences.activeBlocks[0], 8)
  s.tryRoute({ id: 'c', isl: 70 })
  t.equal(s.sequences.activeBlocks[0], 12, 'without hashes: floor(isl / block size) blocks')
  const d = s.tryRoute({ isl: 64, seqLo: h.lo, seqHi: h.hi, updateStates: false, explain: true })
  t.equal(d?.candidates?.[0]?.decodeBlocks, 16)
  const r = s.tryRoute({ isl: 64, seqLo: h.lo, seqHi: h.hi, updateStates: false, explain: true, overrides: { assumeKvReuse: true } })
  t.equal(r?.candidates?.[0]?.decodeBlocks, 12 + 4, 'the unique blocks do not match the real hashes')
  for (const id of ['a', 'b', 'c']) s.free(id)
  t.equal(s.sequences.activeBlocks[0], 0)
})

t.test('track_active_blocks off: no decode tracking at all', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, trackActiveBlocks: false }, 1)
  const h = chain(blocks(0, 4))
  const d = s.tryRoute({ id: 'a', isl: 64, seqLo: h.lo, seqHi: h.hi, explain: true })
  t.equal(d?.candidates?.[0]?.decodeBlocks, 0)
  t.equal(s.sequences.activeBlocks[0], 0)
  t.throws(() => s.tryRoute({ id: 'b', isl: 64, seqLo: h.lo, seqHi: h.hi, blockCount: 5 }), /request\.blockCount must be an integer in \[0, 4\]/)
})

t.test('temperature 0 breaks exact ties uniformly at random (seeded)', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, seed: 11 }, 4)
  const counts = [0, 0, 0, 0]
  for (let i = 0; i < 4000; i++) {
    const d = s.tryRoute({ isl: 64, updateStates: false })
    bump(counts, d?.slot ?? 0)
  }
  for (const c of counts) t.ok(c > 850 && c < 1150, `share ${c}/4000 near 1000`)
  const again = makeScheduler({ blockSize: 16, queueThreshold: null, seed: 11 }, 4).s
  const seqA: number[] = []
  const seqB: number[] = []
  const first = makeScheduler({ blockSize: 16, queueThreshold: null, seed: 11 }, 4).s
  for (let i = 0; i < 50; i++) {
    seqA.push(first.tryRoute({ isl: 64, updateStates: false })?.slot ?? -1)
    seqB.push(again.tryRoute({ isl: 64, updateStates: false })?.slot ?? -1)
  }
  t.same(seqA, seqB, 'same seed, same decisions')
})

t.test('softmax: sampled frequencies match the formula', async (t) => {
  const T = 0.5
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, temperature: T, seed: 5 }, 3)
  // logits with no load: prefill blocks = 10 − overlap → 10, 5, 2
  const ov = overlaps({ 0: 0, 1: 5, 2: 8 })
  const logits = [10, 5, 2]
  const min = 2
  const max = 10
  const w = logits.map((l) => Math.exp(-(l - min) / ((max - min) * T)))
  const sum = w.reduce((a, b) => a + b, 0)
  const p = w.map((x) => x / sum)
  const N = 20_000
  const counts = [0, 0, 0]
  for (let i = 0; i < N; i++) bump(counts, s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false })?.slot ?? 0)
  for (let i = 0; i < 3; i++) {
    const pi = p[i] as number
    const bound = 5 * Math.sqrt((pi * (1 - pi)) / N)
    t.ok(Math.abs((counts[i] as number) / N - pi) <= bound, `worker ${i}: ${(counts[i] as number) / N} vs ${pi.toFixed(4)} ± ${bound.toFixed(4)}`)
  }
  // per-request temperature override: equal logits → uniform
  const flat = [0, 0, 0]
  for (let i = 0; i < 3000; i++) bump(flat, s.tryRoute({ isl: 160, updateStates: false, overrides: { temperature: 2 } })?.slot ?? 0)
  for (const c of flat) t.ok(c > 850 && c < 1150, `uniform share ${c}/3000`)
  // override to 0 makes it deterministic again
  for (let i = 0; i < 20; i++) t.equal(s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, overrides: { temperature: 0 } })?.slot, 2)
})

t.test('softmax walks the cumulative distribution', async (t) => {
  const rng = { next: () => 0.999999, int: () => 0 }
  const { s } = makeScheduler({ queueThreshold: null }, 2)
  const sel = new Selector(s.workers, s.sequences, rng, 16, 8)
  sel.logits[0] = 1
  sel.logits[1] = 2
  t.equal(sel.softmaxPick(2, 1), 1, 'u near the top lands on the last candidate')
  const low = new Selector(s.workers, s.sequences, { next: () => 0.5, int: () => 0 }, 16, 8)
  low.logits[0] = 1
  low.logits[1] = 2
  t.equal(low.softmaxPick(2, 1), 0, 'p0 = 1 / (1 + e^-1) ≈ 0.73 covers u = 0.5')
  const c = new CostInputs()
  t.equal(c.track, 0)
})

t.test('hot-spot guard: a universal prefix on every worker does not pile traffic onto one', async (t) => {
  const W = 8
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null, seed: 1234 }, W)
  const universal = blocks(0, 32)
  // equal standing load: every worker holds the universal prefix for one long-running request
  for (let w = 0; w < W; w++) {
    const h = chain(universal)
    s.tryRoute({ id: `bg${w}`, isl: 512, workerId: BigInt(w + 1), seqLo: h.lo, seqHi: h.hi })
    s.markPrefillComplete(`bg${w}`)
  }
  const ov = new Float64Array(W).fill(32)
  const counts = new Array<number>(W).fill(0)
  for (let i = 0; i < 10_000; i++) {
    const h = chain([...universal, 100_000 + i, 200_000 + i])
    const d = s.tryRoute({ id: `r${i}`, isl: 34 * 16, overlapBlocks: ov, seqLo: h.lo, seqHi: h.hi })
    bump(counts, d?.slot ?? 0)
    s.free(`r${i}`)
  }
  const max = Math.max(...counts)
  const min = Math.min(...counts)
  t.ok(max / min <= 1.2, `max/min = ${(max / min).toFixed(3)} (${counts.join(', ')})`)
  t.equal(
    counts.reduce((a, b) => a + b, 0),
    10_000,
  )
})

t.test('round-robin cycles over live workers in slot order', async (t) => {
  const { s } = makeScheduler({ mode: 'round-robin', queueThreshold: null }, 3)
  const picks: bigint[] = []
  for (let i = 0; i < 6; i++) picks.push(s.tryRoute({ isl: 10, updateStates: false })?.workerId ?? 0n)
  t.same(picks, [1n, 2n, 3n, 1n, 2n, 3n])
  s.removeWorkerRank(2n, 0)
  const after: bigint[] = []
  for (let i = 0; i < 4; i++) after.push(s.tryRoute({ isl: 10, updateStates: false })?.workerId ?? 0n)
  t.same(after, [1n, 3n, 1n, 3n])
})

t.test('random spreads uniformly', async (t) => {
  const { s } = makeScheduler({ mode: 'random', queueThreshold: null, seed: 9 }, 3)
  const counts = [0, 0, 0]
  for (let i = 0; i < 3000; i++) bump(counts, s.tryRoute({ isl: 10, updateStates: false })?.slot ?? 0)
  for (const c of counts) t.ok(c > 880 && c < 1120, `share ${c}`)
})

t.test('least-loaded: fewest requests, then fewest active blocks, random among exact ties', async (t) => {
  const { s } = makeScheduler({ mode: 'least-loaded', queueThreshold: null, seed: 3 }, 3)
  // in-flight: w1 2, w2 1, w3 1; active blocks: w2 5, w3 3
  holdBlocks(s, 'a', 1n, 1, 10)
  holdBlocks(s, 'b', 1n, 1, 20)
  holdBlocks(s, 'c', 2n, 5, 30)
  holdBlocks(s, 'd', 3n, 3, 40)
  for (let i = 0; i < 10; i++) t.equal(s.tryRoute({ isl: 10, updateStates: false })?.workerId, 3n)
  s.free('c')
  holdBlocks(s, 'e', 2n, 3, 50)
  const seen = new Set<bigint>()
  for (let i = 0; i < 50; i++) seen.add(s.tryRoute({ isl: 10, updateStates: false })?.workerId ?? 0n)
  t.same([...seen].sort(), [2n, 3n], 'w2 and w3 tie exactly and both get picked')
})

t.test('power-of-two: the less loaded of two random workers wins', async (t) => {
  const { s } = makeScheduler({ mode: 'power-of-two', queueThreshold: null, seed: 21 }, 3)
  holdBlocks(s, 'x1', 2n, 1, 10)
  for (let i = 0; i < 5; i++) holdBlocks(s, `y${i}`, 3n, 1, 100 + i * 10)
  const counts = [0, 0, 0]
  const N = 6000
  for (let i = 0; i < N; i++) bump(counts, s.tryRoute({ isl: 10, updateStates: false })?.slot ?? 0)
  t.equal(counts[2], 0, 'the most loaded never wins a pair')
  t.ok(Math.abs((counts[0] as number) / N - 2 / 3) < 0.03, `w1 wins every pair it is in: ${(counts[0] as number) / N}`)
  t.ok(Math.abs((counts[1] as number) / N - 1 / 3) < 0.03)
  // equal in-flight, blocks decide; full tie → either
  const two = makeScheduler({ mode: 'power-of-two', queueThreshold: null, seed: 2 }, 2).s
  holdBlocks(two, 'p', 1n, 4, 10)
  holdBlocks(two, 'q', 2n, 1, 20)
  for (let i = 0; i < 10; i++) t.equal(two.tryRoute({ isl: 10, updateStates: false })?.workerId, 2n)
  two.free('p')
  two.free('q')
  const seen = new Set<bigint>()
  for (let i = 0; i < 40; i++) seen.add(two.tryRoute({ isl: 10, updateStates: false })?.workerId ?? 0n)
  t.equal(seen.size, 2)
  const one = makeScheduler({ mode: 'power-of-two', queueThreshold: null }, 1).s
  t.equal(one.tryRoute({ isl: 10, updateStates: false })?.workerId, 1n)
})

t.test('direct: the request names its worker; no selection, still booked', async (t) => {
  const { s } = makeScheduler({ mode: 'direct', queueThreshold: null }, 3)
  holdBlocks(s, 'load', 2n, 50, 10)
  const d = s.tryRoute({ id: 'r', isl: 100, workerId: 2n, dpRank: 0, overlapBlocks: overlaps({ 1: 3 }) })
  t.equal(d?.workerId, 2n)
  t.equal(d?.overlapBlocks, 3, "the pinned worker's overlap is still used")
  t.equal(s.sequences.inFlight[1], 2)
  t.throws(() => s.tryRoute({ id: 'x', isl: 1 }), /router mode direct needs the request to name its worker/)
  t.throws(() => s.tryRoute({ id: 'x', isl: 1, workerId: 99n }), { code: 'KVR_ERR_UNKNOWN_WORKER' })
  t.throws(() => s.tryRoute({ id: 'x', isl: 1, workerId: 1n, dpRank: 4 }), { code: 'KVR_ERR_UNKNOWN_WORKER' })
  // a worker with two ranks: without a rank, the less loaded rank takes it
  s.addWorkerRank(9n, 0)
  s.addWorkerRank(9n, 1)
  holdBlocks(s, 'r0', 9n, 1, 500)
  t.equal(s.tryRoute({ id: 'y', isl: 1, workerId: 9n })?.dpRank, 1)
})

t.test('kv mode honours a pin (backend_instance_id) against the cost', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null }, 2)
  holdBlocks(s, 'load', 1n, 100, 10)
  t.equal(s.tryRoute({ id: 'p', isl: 10, workerId: 1n })?.workerId, 1n)
  t.equal(s.tryRoute({ id: 'q', isl: 10 })?.workerId, 2n)
})

t.test('device-aware-weighted: a 4:1 ratio sends about 4 of 5 requests to the non-CPU worker', async (t) => {
  const { s } = makeScheduler({ mode: 'device-aware-weighted', queueThreshold: null, cudaToCpuRatio: 4 }, 2, (i) => ({ device: i === 0 ? 'gpu' : 'cpu' }))
  const counts = [0, 0]
  for (let i = 0; i < 1000; i++) bump(counts, s.tryRoute({ id: `r${i}`, isl: 10 })?.slot ?? 0)
  t.ok(counts[0] === 800 || counts[0] === 801, `gpu ${counts[0]}, cpu ${counts[1]}`)
  // the sequence: a tie goes to the non-CPU group, then CPU once its normalized load is lower
  const first = makeScheduler({ mode: 'device-aware-weighted', queueThreshold: null, cudaToCpuRatio: 4 }, 2, (i) => ({ device: i === 0 ? 'gpu' : 'cpu' })).s
  const order: string[] = []
  for (let i = 0; i < 7; i++) order.push(first.workers.deviceOf(first.tryRoute({ id: `r${i}`, isl: 10 })?.slot ?? 0))
  t.same(order, ['gpu', 'cpu', 'gpu', 'gpu', 'gpu', 'gpu', 'cpu'])
})

t.test('device-aware-weighted: least-loaded inside the group; one group = least-loaded', async (t) => {
  const { s } = makeScheduler({ mode: 'device-aware-weighted', queueThreshold: null, cudaToCpuRatio: 8 }, 3, (i) => ({ device: i === 2 ? 'cpu' : 'gpu' }))
  holdBlocks(s, 'a', 1n, 1, 10)
  t.equal(s.tryRoute({ id: 'b', isl: 1 })?.workerId, 3n, 'CPU 0/1 is lighter than GPU 1/(2×8)')
  t.equal(s.tryRoute({ id: 'c', isl: 1 })?.workerId, 2n, 'then the least-loaded GPU')
  const cpuOnly = makeScheduler({ mode: 'device-aware-weighted', queueThreshold: null }, 2, { device: 'cpu' }).s
  holdBlocks(cpuOnly, 'a', 1n, 1, 10)
  t.equal(cpuOnly.tryRoute({ id: 'b', isl: 1 })?.workerId, 2n)
})

t.test('explanations carry tree sizes and in-flight counts', async (t) => {
  const { s } = makeScheduler({ mode: 'least-loaded', queueThreshold: null }, 2)
  const d = s.tryRoute({ isl: 32, updateStates: false, explain: true, treeSizes: [7] })
  t.equal(d?.candidates?.[0]?.treeSize, 7)
  t.equal(d?.candidates?.[1]?.treeSize, undefined)
  t.equal(d?.candidates?.[0]?.inFlight, 0)
  t.equal(s.tryRoute({ isl: 32, updateStates: false })?.candidates, undefined, 'no table unless asked')
})

t.test('rng is deterministic per seed and in range', async (t) => {
  const a = new Xoshiro128(42)
  const b = new Xoshiro128(42)
  const c = new Xoshiro128(43)
  const xs = Array.from({ length: 5 }, () => a.next())
  t.same(
    xs,
    Array.from({ length: 5 }, () => b.next()),
  )
  t.not(xs[0], c.next())
  for (let i = 0; i < 1000; i++) {
    const v = a.int(7)
    t.ok(v >= 0 && v < 7 && Number.isInteger(v))
  }
  const r = new Xoshiro128()
  const v = r.next()
  t.ok(v >= 0 && v < 1)
})

t.test('kv mode with many candidates picks the cheapest', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 40)
  const ov = new Float64Array(40)
  ov[33] = 9
  const d = s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, explain: true })
  t.equal(d?.slot, 33)
  t.equal(d?.candidates?.length, 40)
  t.equal(d?.candidates?.[33]?.logit, 1)
})

t.test('exclude (a proxy retry): the best worker-rank not excluded, in the order the cost gives', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: null }, 3)
  holdBlocks(s, 'w1-load', 1n, 10, 1000)
  holdBlocks(s, 'w2-load', 2n, 5, 2000)
  holdBlocks(s, 'w3-load', 3n, 9, 3000)
  // the worked example's costs: W2 10 < W3 11 < W1 18
  const ov = overlaps({ 0: 2, 1: 5, 2: 8 })
  const first = s.tryRoute({ id: 'r', isl: 160, overlapBlocks: ov, updateStates: false })
  t.equal(first?.workerId, 2n)
  const second = s.tryRoute({ id: 'r', isl: 160, overlapBlocks: ov, updateStates: false, exclude: [first as RouteDecision] })
  t.equal(second?.workerId, 3n, 'W2 tried: the next best is W3')
  const third = s.tryRoute({ id: 'r', isl: 160, overlapBlocks: ov, updateStates: false, exclude: [first as RouteDecision, second as RouteDecision] })
  t.equal(third?.workerId, 1n, 'then W1')
  t.throws(
    () => s.tryRoute({ id: 'r', isl: 160, overlapBlocks: ov, exclude: [1n, 2n, 3n].map((workerId) => ({ workerId, dpRank: 0 })) }),
    { code: 'KVR_ERR_NO_WORKERS' },
    'every worker tried',
  )
  t.equal(s.stats().bookedRequests, 3, 'nothing booked by the refused retry')
  const pinned = s.tryRoute({ id: 'p', isl: 16, workerId: 3n, updateStates: false, exclude: [first as RouteDecision] })
  t.equal(pinned?.workerId, 3n, 'an exclusion of another worker leaves a pin alone')
  t.throws(
    () => s.tryRoute({ id: 'p', isl: 16, workerId: 3n, exclude: [second as RouteDecision] }),
    { code: 'KVR_ERR_NO_WORKERS' },
    'a pinned worker that was tried',
  )
})
