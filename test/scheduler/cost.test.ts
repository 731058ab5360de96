// The latency cost (src/scheduler/cost.ts) against cases computed by hand from the engine model:
// prefill_ms(T) = 4.209989e-7·T² + 1.518344e-2·T + 16.50142, decode_ms(p) = −25.74·p² + 54.01·p + 5.74.
import t from 'tap'
import { ASSUMED_OUTPUT_TOKENS, chunkTokens, DEFAULT_CHUNK_TOKENS, FleetLoad, LatencyTerms, latencyTerms, NEAR_TIE } from '../../src/scheduler/cost.js'
import { DEFAULT_MAX_BATCHED_TOKENS } from '../../src/scheduler/options.js'
import { DEFAULT_ENGINE_MODEL as E } from '../../src/scheduler/engine-model.js'
import { Selector, formatCandidates } from '../../src/scheduler/selector.js'
import type { ActiveSequences } from '../../src/scheduler/active-sequences.js'
import { blocks, chain, makeScheduler, overlaps } from './fixtures.js'

const near = (a: number, b: number): boolean => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b))

/** The fleet terms of a decision whose candidates average this many in flight at this KV usage. */
function fleetOf(inFlight: number, usage: number): FleetLoad {
  const f = new FleetLoad()
  f.set(inFlight, usage, 1, E)
  return f
}

t.test('queue ahead: queued and uncached tokens are computed together, at the prefill rate', async (t) => {
  const out = new LatencyTerms()
  const idle = fleetOf(0, 0)
  // nothing in flight: one step of 4,000 queued + 2,000 uncached tokens, no decodes
  // 4.209989e-7 × 6000² + 1.518344e-2 × 6000 + 16.50142 = 15.1559604 + 91.10064 + 16.50142 ms
  const cost = latencyTerms(4000, 2000, 0, chunkTokens(8192, 0), 0, 0, 0, idle, out, E)
  t.ok(near(out.ttft, 0.1227580204), `ttft ${out.ttft}`)
  t.equal(out.slowdown, 0, 'nothing running to slow down')
  t.equal(out.queueing, 0, 'nothing arriving to queue behind it')
  t.equal(cost, out.ttft + out.slowdown + out.queueing)
  // beyond one step: 16,384 tokens are two full chunks of 8,192, each 169.1369184 ms
  latencyTerms(12000, 4384, 0, chunkTokens(8192, 0), 0, 0, 0, idle, out, E)
  t.ok(near(out.ttft, 0.3382738368), `two chunks: ${out.ttft}`)
  // fully cached with nothing queued: no prefill work at all
  t.equal(latencyTerms(0, 0, 0, 8192, 0, 0, 0, idle, out, E), 0)
})

t.test('decode load: its step time in the ttft, the slowdown of the requests decoding there, the queue behind it', async (t) => {
  const out = new LatencyTerms()
  t.ok(near(E.msPerUsage, 28.27), 'decode_ms(1) − decode_ms(0) = 34.01 − 5.74')
  // 4 in flight here and on average, usage 2,000 / 10,000 = 0.2 → decode step −1.0296 + 10.802 + 5.74 = 15.5124 ms
  const fleet = fleetOf(4, 0.2)
  t.ok(near(fleet.arrivalsPerMs, 4 / (256 * 15.5124)), "Little's law: 4 in flight over 256 decode steps")
  latencyTerms(0, 1000, 4, chunkTokens(8192, 4), 2000, 100, 10_000, fleet, out, E)
  // ttft: prefill_ms(1000) = 32.1058589 ms and one step's decodes
  t.ok(near(out.ttft, 0.0476182589), `ttft ${out.ttft}`)
  // its chunk in the steps of the 4 decoding: 4 × 32.1058589; its 100 blocks in their next 256 steps: 4 × 256 × 28.27 × 100 / 10,000
  t.ok(near(out.slowdown, (4 * 32.1058589 + (4 * 256 * 28.27 * 100) / 10_000) / 1000), `slowdown ${out.slowdown}`)
  // nothing ahead: arrivals during its own 47.6 ms wait on average half of it
  t.ok(near(out.queueing, (fleet.arrivalsPerMs * 47.6182589 * 47.6182589) / 2 / 1000), `queueing ${out.queueing}`)
  t.equal(ASSUMED_OUTPUT_TOKENS, 256)
  // the same request behind 20,000 queued tokens: 20,000 / 8,188 chunks ahead of it, each with its
  // step's decodes; its own tokens add no fixed step cost to the running requests any more
  const queued = new LatencyTerms()
  latencyTerms(20_000, 1000, 4, chunkTokens(8192, 4), 2000, 100, 10_000, fleet, queued, E)
  const p8188 = 4.209989e-7 * 8188 * 8188 + 1.518344e-2 * 8188 + 16.50142
  const wait = (20_000 / 8188) * (p8188 + 15.5124)
  const ttft = (21_000 / 8188) * (p8188 + 15.5124)
  t.ok(near(queued.ttft, ttft / 1000), `ttft behind the queue ${queued.ttft}`)
  t.ok(near(queued.slowdown, (4 * (1000 / 8188) * p8188 + (4 * 256 * 28.27 * 100) / 10_000) / 1000), `slowdown ${queued.slowdown}`)
  t.ok(near(queued.queueing, (fleet.arrivalsPerMs * (ttft - wait) * (wait + (ttft - wait) / 2)) / 1000), 'arrivals during the wait wait for all of it')
  t.ok(queued.queueing > 5 * out.queueing)
  // the stall counts the fleet's mean in flight, not the worker-rank's own; none where none is in flight
  const busier = new LatencyTerms()
  latencyTerms(0, 1000, 4, chunkTokens(8192, 4), 2000, 0, 10_000, fleetOf(10, 0.2), busier, E)
  t.ok(near(busier.slowdown, (10 * 32.1058589) / 1000), `fleet mean 10: ${busier.slowdown}`)
  latencyTerms(0, 1000, 0, chunkTokens(8192, 0), 0, 100, 10_000, fleetOf(10, 0.2), busier, E)
  t.equal(busier.slowdown, 0, 'nothing in flight there: nothing to slow down')
  // capacity unknown: no usage-dependent term, the model's idle decode step
  latencyTerms(0, 1000, 4, chunkTokens(8192, 4), 2000, 100, 0, fleet, out, E)
  t.ok(near(out.ttft, (32.1058589 + 5.74) / 1000))
  t.ok(near(out.slowdown, (4 * 32.1058589) / 1000))
})

t.test('cached share: only the uncached tokens are computed, and the slowdown scales with them', async (t) => {
  const { s } = makeScheduler({ cost: 'latency', blockSize: 16, queueThreshold: null }, 2, { maxNumBatchedTokens: 8192 })
  // 60 of the 100 blocks are cached on worker 1: 640 tokens to compute there, 1,600 on worker 2
  const d = s.tryRoute({ isl: 1600, overlapBlocks: overlaps({ 0: 60 }), updateStates: false, explain: true })
  const p = (x: number): number => 4.209989e-7 * x * x + 1.518344e-2 * x + 16.50142
  t.equal(d?.workerId, 1n)
  const rows = d?.candidates ?? []
  t.ok(near(rows[0]?.ttftSecs ?? NaN, p(640) / 1000), `worker 1: ${rows[0]?.ttftSecs}`)
  t.ok(near(rows[1]?.ttftSecs ?? NaN, p(1600) / 1000), `worker 2: ${rows[1]?.ttftSecs}`)
  t.same(
    rows.map((r) => [r.prefillBlocks, r.logit === (r.ttftSecs ?? NaN) + (r.slowdownSecs ?? NaN) + (r.queueingSecs ?? NaN)]),
    [
      [40, true],
      [100, true],
    ],
  )
  // a cached run longer than the prompt is the whole prompt, never less than nothing
  const over = s.tryRoute({ isl: 160, overlapBlocks: overlaps({ 0: 60 }), updateStates: false, explain: true })
  t.equal(over?.candidates?.[0]?.ttftSecs, 0)
})

t.test("prefill rate: the chunk comes from the worker's registration", async (t) => {
  t.equal(chunkTokens(2048, 2), 2046, 'each request in flight takes one token of the step')
  t.equal(chunkTokens(DEFAULT_MAX_BATCHED_TOKENS, 0), DEFAULT_CHUNK_TOKENS, 'none registered: 8,192')
  t.equal(chunkTokens(4, 10), 1, 'never below one token a step')
  const out = new LatencyTerms()
  // 5,000 tokens in chunks of 2,046 on an engine of unknown capacity with 2 in flight:
  // 5000 / 2046 steps of prefill_ms(2046) + 5.74 ms, and their prefill time for each of the 2
  const p2046 = 4.209989e-7 * 2046 * 2046 + 1.518344e-2 * 2046 + 16.50142
  latencyTerms(0, 5000, 2, chunkTokens(2048, 2), 0, 0, 0, fleetOf(2, 0), out, E)
  t.ok(near(out.ttft, ((5000 / 2046) * (p2046 + 5.74)) / 1000), `ttft ${out.ttft}`)
  t.ok(near(out.slowdown, (2 * (5000 / 2046) * p2046) / 1000), `slowdown ${out.slowdown}`)
  // through the scheduler: a registered small budget makes a long prompt dearer there
  const { s } = makeScheduler({ cost: 'latency', blockSize: 16, queueThreshold: null }, 2, (i) => ({ maxNumBatchedTokens: i === 0 ? 512 : 8192 }))
  const d = s.tryRoute({ isl: 8000, updateStates: false, explain: true })
  t.equal(d?.workerId, 2n, '16 steps with their fixed cost each lose to one')
  t.ok((d?.candidates?.[0]?.ttftSecs ?? 0) > (d?.candidates?.[1]?.ttftSecs ?? 0))
})

t.test('a follow-up stays with its cache on a busier worker; a new prompt goes to the idler one', async (t) => {
  const { s } = makeScheduler({ cost: 'latency', blockSize: 64, queueThreshold: null }, 2, { maxNumBatchedTokens: 8192, totalKvBlocks: 20_000 })
  // worker 1 runs 8 conversations, worker 2 runs 6 (prefill done, decoding)
  for (let i = 0; i < 14; i++) {
    const h = chain(blocks(10_000 * (i + 1), 200))
    s.tryRoute({ id: `bg${i}`, isl: 200 * 64, workerId: i < 8 ? 1n : 2n, seqLo: h.lo, seqHi: h.hi })
    s.markPrefillComplete(`bg${i}`)
  }
  const conv = chain(blocks(500_000, 250))
  const follow = s.tryRoute({ isl: 250 * 64, overlapBlocks: overlaps({ 0: 230 }), seqLo: conv.lo, seqHi: conv.hi, updateStates: false, explain: true })
  t.equal(follow?.workerId, 1n, `${formatCandidates(follow?.candidates ?? [], 1)}`)
  const fresh = chain(blocks(900_000, 250))
  const other = s.tryRoute({ isl: 250 * 64, seqLo: fresh.lo, seqHi: fresh.hi, updateStates: false, explain: true })
  t.equal(other?.workerId, 2n, 'no cache anywhere: fewer requests to slow down')
  const text = formatCandidates(other?.candidates ?? [], 1)
  t.match(
    text,
    new RegExp(
      '^Formula for worker_id=1 dp_rank=0: \\d+\\.\\d{4} s = ttft \\d+\\.\\d{4} s \\(250\\.000 prefill blocks queued and uncached\\) ' +
        '\\+ decode slowdown \\d+\\.\\d{4} s \\(8 in flight, 1850 decode blocks\\) \\+ queueing \\d+\\.\\d{4} s \\(cached_blocks: 0\\)$',
      'm',
    ),
  )
  t.equal(text.split('\n').length, 2)
})

t.test('ties and near-ties go to the least loaded, so equal candidates share the load', async (t) => {
  // exact cost tie (capacity unknown, so active blocks do not enter the cost): fewer active blocks wins every time
  const { s } = makeScheduler({ cost: 'latency', blockSize: 16, queueThreshold: null }, 2)
  const a = chain(blocks(100, 50))
  const b = chain(blocks(200, 10))
  s.tryRoute({ id: 'a', isl: 800, workerId: 1n, seqLo: a.lo, seqHi: a.hi })
  s.tryRoute({ id: 'b', isl: 160, workerId: 2n, seqLo: b.lo, seqHi: b.hi })
  s.markPrefillComplete('a')
  s.markPrefillComplete('b')
  for (let i = 0; i < 20; i++) {
    const d = s.tryRoute({ isl: 320, updateStates: false, explain: true })
    t.equal(d?.candidates?.[0]?.logit, d?.candidates?.[1]?.logit)
    t.equal(d?.workerId, 2n)
  }
  // near-ties: within NEAR_TIE of the cheapest, fewest in flight wins; beyond it, the cost does
  const inFlight = new Int32Array([3, 1, 0])
  const seqs = { inFlight, activeBlocks: new Int32Array(3) } as unknown as ActiveSequences
  const sel = new Selector(s.workers, seqs, { next: () => 0, int: () => 0 }, 16, 8, 'latency')
  const slots = new Int32Array([0, 1, 2])
  sel.logits.set([1, 1 + NEAR_TIE / 2, 1 + NEAR_TIE * 2])
  t.equal(sel.nearTiePick(slots, 3), 1)
  sel.logits.set([1, 1 + NEAR_TIE * 1.5, 1 + NEAR_TIE * 2])
  t.equal(sel.nearTiePick(slots, 3), 0)
  // a stream of equal requests on an idle fleet spreads evenly
  const { s: f } = makeScheduler({ cost: 'latency', blockSize: 16, queueThreshold: null, seed: 3 }, 8, { maxNumBatchedTokens: 8192, totalKvBlocks: 10_000 })
  const counts = new Array<number>(8).fill(0)
  for (let i = 0; i < 400; i++) {
    const h = chain(blocks(1_000_000 + i * 100, 40))
    const d = f.tryRoute({ id: `r${i}`, isl: 640, seqLo: h.lo, seqHi: h.hi })
    counts[d?.slot ?? 0] = (counts[d?.slot ?? 0] ?? 0) + 1
    if (i % 3 === 0) f.markPrefillComplete(`r${i}`)
  }
  t.ok(Math.max(...counts) - Math.min(...counts) <= 5, `${counts.join(', ')}`)
})

t.test("Dynamo's knobs do not enter the latency cost; temperature still samples over it", async (t) => {
  const { s } = makeScheduler({ cost: 'latency', blockSize: 16, queueThreshold: null, seed: 9 }, 2)
  const ov = overlaps({ 1: 5 })
  const base = s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, explain: true })
  const knobs = s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, explain: true, overrides: { overlapScoreWeight: 0, overlapScoreCredit: 7 } })
  t.same(
    knobs?.candidates?.map((c) => c.logit),
    base?.candidates?.map((c) => c.logit),
  )
  const counts = [0, 0]
  for (let i = 0; i < 2000; i++) {
    const d = s.tryRoute({ isl: 160, overlapBlocks: ov, updateStates: false, overrides: { temperature: 1 } })
    counts[d?.slot ?? 0] = (counts[d?.slot ?? 0] ?? 0) + 1
  }
  // two candidates: the cheaper is taken with p = 1 / (1 + e^−1/T) ≈ 0.73 at T = 1, whatever their costs
  t.ok((counts[1] ?? 0) > 1300 && (counts[1] ?? 0) < 1620, `${counts.join(', ')}`)
})
