// The engine estimator (src/scheduler/engine-estimator.ts) against planted engines: observations
// computed from a known model (with noise, outliers, a change of speed), and what it learns.
import t from 'tap'
import { DRIFT_REQUESTS, EngineEstimator, GRID, MIN_SAMPLES, SHRINK } from '../../src/scheduler/engine-estimator.js'
import { chunkTokens, prefillSteps, prefillTimeMs } from '../../src/scheduler/cost.js'
import { DEFAULT_ENGINE_MODEL, EngineModel } from '../../src/scheduler/engine-model.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import { makeScheduler } from './fixtures.js'
import { blocks, chain } from './fixtures.js'

const d = DEFAULT_ENGINE_MODEL
const CHUNK = 8192

/** An engine of the default model's shape with each coefficient scaled: [a, b, c, base, rise]. */
function planted(r: readonly number[]): EngineModel {
  const [a = 1, b = 1, c = 1, base = 1, rise = 1] = r
  return new EngineModel(d.a * a, d.b * b, d.c * c, d.base * base, d.rise * rise)
}

/**
 * Feeds n observations of engine e to the slot: a prompt of 200..20,000 tokens (queue included)
 * at a random KV usage, its time to first token and its inter-token time, each off by up to
 * ±noise; with probability `outliers` an observation is a stall of 5–10× instead.
 */
function feed(est: EngineEstimator, slot: number, e: EngineModel, n: number, rng: Xoshiro128, noise = 0.05, outliers = 0): void {
  for (let i = 0; i < n; i++) {
    const x = 200 + rng.int(19_800)
    const usage = rng.next()
    const busy = rng.next() < 0.8
    let ttft = prefillTimeMs(x, CHUNK, e) + (busy ? prefillSteps(x, CHUNK) * e.decodeMs(usage) : 0)
    let itl = e.decodeMs(usage)
    ttft *= 1 + noise * (2 * rng.next() - 1)
    itl *= 1 + noise * (2 * rng.next() - 1)
    if (rng.next() < outliers) ttft *= 5 + 5 * rng.next()
    if (rng.next() < outliers) itl *= 5 + 5 * rng.next()
    est.observeTtft(slot, x, CHUNK, busy, usage, ttft)
    est.observeItl(slot, itl, usage)
  }
}

/** The learned speeds against the planted engine's (1 = the default model's). */
function speeds(est: EngineEstimator, slot: number): { prefill: number; decode: number } {
  const l = est.learned(slot)
  if (l === null) throw new Error('learning is off')
  return { prefill: l.prefillSpeed, decode: l.decodeSpeed }
}

const trueSpeed = (e: EngineModel): { prefill: number; decode: number } => ({
  prefill: d.prefillMs(1024) / e.prefillMs(1024),
  decode: d.decodeMs(0.5) / e.decodeMs(0.5),
})

const within = (got: number, want: number, rel: number): boolean => Math.abs(got / want - 1) <= rel

t.test('converges to a planted engine of another shape and speed', async (t) => {
  const est = new EngineEstimator(true)
  est.reset(0, true)
  const large = planted([1.2, 2.5, 2.5, 2.4, 1.3])
  feed(est, 0, large, 400, new Xoshiro128(1))
  const got = speeds(est, 0)
  const want = trueSpeed(large)
  t.ok(within(got.prefill, want.prefill, 0.08), `prefill speed ${got.prefill.toFixed(3)}, planted ${want.prefill.toFixed(3)}`)
  t.ok(within(got.decode, want.decode, 0.08), `decode speed ${got.decode.toFixed(3)}, planted ${want.decode.toFixed(3)}`)
  // the decode terms themselves; of prefill, what the cost uses: the time of a queue of x tokens
  // (per-token cost and per-step overhead trade off beyond a chunk, where both grow with x)
  const r = est.ratios(0)
  t.ok(within(r[3] as number, 2.4, 0.1), `decode base ${(r[3] as number).toFixed(3)} of the default's, planted 2.4`)
  t.ok(within(r[4] as number, 1.3, 0.1), `decode rise ${(r[4] as number).toFixed(3)} of the default's, planted 1.3`)
  const fit = planted([r[0] as number, r[1] as number, r[2] as number, 1, 1])
  for (const x of [1000, 4000, 8000, 20_000]) {
    const got = prefillTimeMs(x, CHUNK, fit)
    const want = prefillTimeMs(x, CHUNK, large)
    t.ok(within(got, want, 0.1), `prefill of ${x} tokens: ${got.toFixed(1)} ms, planted ${want.toFixed(1)} ms`)
  }
  const l = est.learned(0)
  t.equal(l?.prefillSource, 'learned')
  t.ok((l?.ttftSpread ?? 1) < 0.1, `spread ${l?.ttftSpread} reflects the ±5% noise`)
  // the cost prices the fit shrunk towards the default, on the grid
  const priced = est.models.of(0)
  const shrunk = (2.5 ** SHRINK * d.b) / priced.b
  t.ok(shrunk > 1 / GRID ** 1.5 && shrunk < GRID ** 1.5, `priced b ${priced.b} ≈ default × 2.5^${SHRINK}`)
})

t.test('ignores outliers', async (t) => {
  const est = new EngineEstimator(true)
  est.reset(0, true)
  const e = planted([1, 2, 2, 2, 2])
  feed(est, 0, e, 400, new Xoshiro128(2), 0.05, 0.1)
  const got = speeds(est, 0)
  const want = trueSpeed(e)
  t.ok(within(got.prefill, want.prefill, 0.15), `prefill speed ${got.prefill.toFixed(3)} with 10% stalls of 5–10×, planted ${want.prefill.toFixed(3)}`)
  t.ok(within(got.decode, want.decode, 0.15), `decode speed ${got.decode.toFixed(3)}, planted ${want.decode.toFixed(3)}`)
})

t.test(`follows a step change in speed within ${DRIFT_REQUESTS} requests`, async (t) => {
  const est = new EngineEstimator(true)
  est.reset(0, true)
  const rng = new Xoshiro128(3)
  const fast = planted([1, 1, 1, 1, 1])
  const slow = planted([2, 2, 2, 2, 2])
  feed(est, 0, fast, 300, rng)
  t.ok(within(speeds(est, 0).prefill, 1, 0.08), 'at the default speed first')
  feed(est, 0, slow, DRIFT_REQUESTS, rng)
  const got = speeds(est, 0)
  t.ok(within(got.prefill, 0.5, 0.15), `prefill speed ${got.prefill.toFixed(3)} after ${DRIFT_REQUESTS} requests at half speed`)
  t.ok(within(got.decode, 0.5, 0.15), `decode speed ${got.decode.toFixed(3)}`)
  // and not after a handful: the change is followed, not jumped to on one observation
  const est2 = new EngineEstimator(true)
  est2.reset(0, true)
  const rng2 = new Xoshiro128(3)
  feed(est2, 0, fast, 300, rng2)
  feed(est2, 0, slow, 2, rng2)
  t.ok(speeds(est2, 0).prefill > 0.7, `two slow requests move it only to ${speeds(est2, 0).prefill.toFixed(3)}`)
})

t.test('falls back to the prior with too few samples', async (t) => {
  const est = new EngineEstimator(true)
  est.reset(0, true)
  const slow = planted([3, 3, 3, 3, 3])
  feed(est, 0, slow, MIN_SAMPLES - 1, new Xoshiro128(4))
  const l = est.learned(0)
  t.equal(l?.prefillSource, 'prior')
  t.equal(l?.decodeSource, 'prior')
  t.equal(l?.prefillSpeed, 1, 'the default model until then')
  t.equal(est.models.of(0), DEFAULT_ENGINE_MODEL, 'and the cost prices the default model')
  feed(est, 0, slow, 1, new Xoshiro128(5))
  t.equal(est.learned(0)?.prefillSource, 'learned')
  t.ok((est.learned(0)?.prefillSpeed ?? 1) < 0.6, `then learned: ${est.learned(0)?.prefillSpeed}`)
  t.not(est.models.of(0), DEFAULT_ENGINE_MODEL, 'and priced')
  // a reset (the worker-rank left, another took its slot) starts again from the prior
  est.reset(0, false)
  est.reset(0, true)
  t.equal(est.models.of(0), DEFAULT_ENGINE_MODEL)
  t.equal(est.learned(0)?.ttftSamples, 0)
  // learning off: nothing is learned or shown
  const off = new EngineEstimator(false)
  off.reset(0, true)
  off.booked('r', 0, 0, 1000, CHUNK, false, 0, 0)
  off.firstToken('r', 500)
  t.equal(off.learned(0), null)
})

t.test('workers of one kind share one priced model; the fleet model is theirs', async (t) => {
  const est = new EngineEstimator(true)
  const rng = new Xoshiro128(6)
  const e = planted([1.2, 2.5, 2.5, 2.4, 1.3])
  for (let s = 0; s < 6; s++) est.reset(s, true)
  for (let s = 0; s < 6; s++) feed(est, s, e, 200, rng, 0.02)
  const ids = new Set(Array.from(est.models.modelOf.subarray(0, 6)))
  t.ok(ids.size <= 2, `${ids.size} priced model(s) for six engines of one kind`)
  if (ids.size === 1) t.equal(est.models.fleet, est.models.of(0), 'one model: the fleet terms use it exactly')
})

t.test('the scheduler learns from the requests it books: slower worker-ranks get less of the work', async (t) => {
  const { s, clock } = makeScheduler({ cost: 'latency', blockSize: 64, queueThreshold: null, learnEngines: true }, 2, {
    maxNumBatchedTokens: CHUNK,
    totalKvBlocks: 100_000,
  })
  const engines = [d, planted([3, 3, 3, 3, 3])]
  const rng = new Xoshiro128(7)
  let slowShare = 0
  for (let i = 0; i < 200; i++) {
    const n = 10 + rng.int(100)
    const h = chain(blocks(1_000_000 + i * 1000, n))
    const dec = s.tryRoute({ id: `r${i}`, isl: n * 64, seqLo: h.lo, seqHi: h.hi })
    if (dec === null) throw new Error('no decision')
    const e = engines[dec.slot] as EngineModel
    // served alone: its time to first token is its prefill; then 20 tokens at the idle step
    clock.advance(prefillTimeMs(n * 64, chunkTokens(CHUNK, 0), e))
    s.markPrefillComplete(`r${i}`)
    clock.advance(19 * e.decodeMs(0))
    s.free(`r${i}`, 20)
    if (i >= 100 && dec.slot === 1) slowShare++
  }
  const fast = s.learnedEngine(0)
  const slow = s.learnedEngine(1)
  t.ok(fast !== null && slow !== null)
  t.ok((slow?.prefillSpeed ?? 1) < 0.5 && (fast?.prefillSpeed ?? 0) > 0.8, `learned prefill speeds: ${fast?.prefillSpeed}, ${slow?.prefillSpeed}`)
  t.ok(slowShare < 35, `the 3× slower worker-rank took ${slowShare} of the last 100 requests`)
  // the same traffic without learning splits evenly
  const { s: off } = makeScheduler({ cost: 'latency', blockSize: 64, queueThreshold: null, learnEngines: false }, 2, {
    maxNumBatchedTokens: CHUNK,
    totalKvBlocks: 100_000,
  })
  t.equal(off.learnedEngine(0), null)
})
