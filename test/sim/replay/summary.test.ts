// Replay statistics on inputs whose answers are worked out by hand.
import t from 'tap'
import { formatSummary, hitRate, percentile, quantiles, spread, summarize } from '../../../src/sim/replay/summary.js'
import type { ReplayRecord } from '../../../src/sim/replay/client.js'

t.test('percentile: nearest rank', async (t) => {
  const s = Float64Array.from({ length: 10 }, (_, i) => (i + 1) * 10) // 10..100
  t.equal(percentile(s, 0.5), 50)
  t.equal(percentile(s, 0.9), 90)
  t.equal(percentile(s, 0.99), 100)
  t.equal(percentile(s, 0), 10)
  t.equal(percentile(s, 1), 100)
  t.equal(percentile([7], 0.99), 7)
  t.equal(percentile([], 0.5), null)
  // 100 samples 1..100: p99 is the 99th
  const h = Float64Array.from({ length: 100 }, (_, i) => i + 1)
  t.equal(percentile(h, 0.99), 99)
  t.equal(percentile(h, 0.9), 90)
})

t.test('quantiles sort a copy and give mean and max', async (t) => {
  const xs = [5, 1, 4, 2, 3]
  const q = quantiles(xs)
  t.same(q, { p50: 3, p90: 5, p99: 5, mean: 3, max: 5 })
  t.same(xs, [5, 1, 4, 2, 3], 'input untouched')
  t.same(quantiles([]), { p50: null, p90: null, p99: null, mean: null, max: null })
})

t.test('spread is max/min; a worker with nothing makes it unbounded (null)', async (t) => {
  t.equal(spread([10, 20, 15]), 2)
  t.equal(spread([4, 4]), 1)
  t.equal(spread([3, 0]), null)
  t.equal(spread([]), null)
})

t.test('hit rate', async (t) => {
  t.equal(hitRate(25, 100), 0.25)
  t.equal(hitRate(0, 0), null)
})

function rec(p: Partial<ReplayRecord> & { id: number }): ReplayRecord {
  return {
    timestamp: 0,
    scheduled_ms: 0,
    sent_ms: 0,
    ttft_ms: 10,
    tpot_ms: 2,
    e2e_ms: 100,
    output_tokens: 10,
    prompt_tokens: 100,
    cached_tokens: 0,
    worker: 'a',
    status: 200,
    error: null,
    ...p,
  }
}

t.test('summarize: counts, hit rate over successes, per-worker counts and spread, time scale', async (t) => {
  const records = [
    rec({ id: 0, sent_ms: 0, e2e_ms: 1000, ttft_ms: 10, cached_tokens: 50, worker: 'a' }),
    rec({ id: 1, sent_ms: 500, e2e_ms: 1500, ttft_ms: 30, cached_tokens: 0, worker: 'b', scheduled_ms: 400 }),
    rec({ id: 2, sent_ms: 100, scheduled_ms: 100, e2e_ms: 200, ttft_ms: 20, cached_tokens: 100, worker: 'a' }),
    rec({ id: 3, sent_ms: 200, scheduled_ms: 200, e2e_ms: null, ttft_ms: null, status: 503, error: 'HTTP 503: busy', worker: null, cached_tokens: 0 }),
    rec({ id: 4, sent_ms: 300, scheduled_ms: 250, e2e_ms: null, ttft_ms: null, status: 0, error: 'HTTP 503: busy', worker: null }),
  ]
  const s = summarize(records, { gaps: [1, 2, 3, 4], timeScale: 10, workers: ['a', 'b', 'c'] })
  t.equal(s.requests, 5)
  t.equal(s.ok, 3)
  t.equal(s.errors, 2)
  t.same(s.error_kinds, { 'HTTP 503: busy': 2 })
  t.equal(s.prompt_tokens, 300)
  t.equal(s.cached_tokens, 150)
  t.equal(s.hit_rate, 0.5)
  t.equal(s.output_tokens, 30)
  t.same(s.workers, { a: 2, b: 1, c: 0 })
  t.equal(s.spread, null, 'worker c got nothing')
  // first send 0, last end 500 + 1500 = 2000 ms wall → 20 s simulated
  t.equal(s.duration_s, 20)
  t.equal(s.requests_per_s, 3 / 20)
  t.equal(s.output_tokens_per_s, 30 / 20)
  t.same(s.ttft_ms, { p50: 200, p90: 300, p99: 300, mean: 200, max: 300 })
  t.same(s.itl_ms, { p50: 20, p90: 40, p99: 40, mean: 25, max: 40 }, 'ITL: the pooled gaps, scaled')
  t.same(s.tpot_ms, { p50: 20, p90: 20, p99: 20, mean: 20, max: 20 }, "TPOT: the successful requests' own, scaled")
  t.same([s.send_lag_ms.p50, s.send_lag_ms.max], [0, 100], 'lag is wall time, not scaled')
  const two = summarize(records, { workers: ['a', 'b'] })
  t.equal(two.spread, 2)
  t.equal(two.time_scale, 1)
  t.equal(two.itl_ms.p50, null)
  const text = formatSummary(s)
  t.match(text, /TPOT \(ms, simulated: wall × 10\) {2}p50 20\.00 {2}p99 20\.00/)
  t.match(text, /ITL {2}\(ms, simulated: wall × 10\) {2}p50 20\.00 {2}p99 40\.00/)
  t.match(text, /requests {6}5 \(3 ok, 2 failed\)/)
  t.match(text, /hit rate {6}50\.00%/)
  t.match(text, /simulated: wall × 10/)
  t.match(text, /error ×2 {3}HTTP 503: busy/)
  t.match(formatSummary(two), /spread max\/min 2\.00/)
})

t.test('summarize: no records', async (t) => {
  const s = summarize([])
  t.equal(s.requests, 0)
  t.equal(s.duration_s, 0)
  t.equal(s.requests_per_s, 0)
  t.equal(s.hit_rate, null)
  t.equal(s.spread, null)
  t.match(formatSummary(s), /hit rate {6}–/)
})
