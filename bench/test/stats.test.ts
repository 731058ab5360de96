// The proxy benchmark's bootstrap intervals (bench/lib/stats.ts): the shortcut that keeps only the
// largest indices drawn must give exactly the quantile of the resample built and sorted, and the
// interval must cover the true difference of two known distributions about as often as it claims.
// The same holds of the interval of a median of paired ratios and of a difference of overheads.
import t from 'tap'
import { medianInterval, overheadDifferenceInterval, quantile, quantileDifferenceInterval, quantileOf, resampledQuantile, uniformDraws } from '../lib/stats.js'

/** The resample built in full from the same draws, sorted, and its quantile taken. */
function resampledByHand(sorted: number[], q: number, next: () => number): number {
  const r = sorted.map(() => sorted[Math.floor(next() * sorted.length)] as number)
  r.sort((a, b) => a - b)
  return quantile(r, q)
}

/** n samples of 50 ms plus an exponential tail of the given mean, ascending. */
function latencies(n: number, tailMs: number, next: () => number): number[] {
  const xs: number[] = []
  for (let i = 0; i < n; i++) xs.push(50 - tailMs * Math.log(1 - next()))
  return xs.sort((a, b) => a - b)
}

t.test('quantile takes the sample at floor(q n), NaN when empty', async (t) => {
  t.equal(quantile([1, 2, 3, 4], 0.5), 3)
  t.equal(quantile([1, 2, 3, 4], 0.99), 4)
  t.equal(quantile([7], 0.99), 7)
  t.ok(Number.isNaN(quantile([], 0.5)))
})

t.test('quantileOf sorts a copy numerically, of a typed array or a plain one', async (t) => {
  const xs = new Float64Array([10, 9, 100, 2, 1])
  t.equal(quantileOf(xs, 0.5), 9, 'numeric order: as text, 100 would sort before 2')
  t.equal(quantileOf(xs.subarray(0, 2), 0.99), 10)
  t.equal(quantileOf([3, 1, 2], 0), 1)
  t.same(Array.from(xs), [10, 9, 100, 2, 1], 'the samples are left in their order')
  t.ok(Number.isNaN(quantileOf(new Float64Array(0), 0.99)))
})

t.test('the kept largest indices give the quantile of the whole resample', async (t) => {
  const gen = uniformDraws(7)
  for (const n of [1, 2, 5, 99, 100, 101, 1000, 2330]) {
    const xs = latencies(n, 1, gen)
    for (const q of [0.5, 0.9, 0.99]) {
      for (let rep = 0; rep < 5; rep++) {
        const seed = n * 1000 + rep * 10 + Math.round(q * 100)
        t.equal(resampledQuantile(xs, q, uniformDraws(seed)), resampledByHand(xs, q, uniformDraws(seed)), `n ${n}, q ${q}, seed ${seed}`)
      }
    }
  }
})

t.test('uniform draws stay in [0, 1) and repeat for a seed', async (t) => {
  const a = uniformDraws(42)
  const b = uniformDraws(42)
  let min = 1
  let max = 0
  let same = true
  for (let i = 0; i < 100_000; i++) {
    const x = a()
    if (x !== b()) same = false
    min = Math.min(min, x)
    max = Math.max(max, x)
  }
  t.ok(same, 'the same seed gives the same draws')
  t.ok(min >= 0 && min < 0.001, `min ${min}`)
  t.ok(max < 1 && max > 0.999, `max ${max}`)
  t.not(uniformDraws(1)(), uniformDraws(2)(), 'different seeds differ')
})

t.test('the p99 difference interval covers the true difference about as often as it says', async (t) => {
  // exponential tails of mean 1 ms and 1.5 ms above 50 ms: the true p99s are 50 + m ln 100
  const truth = 0.5 * Math.log(100)
  const gen = uniformDraws(99)
  let covered = 0
  const trials = 40
  for (let i = 0; i < trials; i++) {
    const a = latencies(2330, 1, gen)
    const b = latencies(2330, 1.5, gen)
    const [lo, hi] = quantileDifferenceInterval(a, b, { resamples: 400, seed: i + 1 })
    t.ok(lo <= hi, 'ordered')
    if (lo <= truth && truth <= hi) covered++
  }
  // a 95% interval missing in more than 6 of 40 trials (binomial tail below 1%) would be broken
  t.ok(covered >= 34, `covered ${covered} of ${trials}`)
  const [lo, hi] = quantileDifferenceInterval([1, 2], [], {})
  t.ok(Number.isNaN(lo) && Number.isNaN(hi), 'an empty side gives no interval')
})

t.test('a wider level gives a wider interval, from the same draws', async (t) => {
  const gen = uniformDraws(3)
  const a = latencies(2000, 1, gen)
  const b = latencies(2000, 1, gen)
  const [lo95, hi95] = quantileDifferenceInterval(a, b, { level: 0.95, resamples: 500, seed: 5 })
  const [lo50, hi50] = quantileDifferenceInterval(a, b, { level: 0.5, resamples: 500, seed: 5 })
  t.ok(lo95 <= lo50 && hi50 <= hi95, `50% [${lo50}, ${hi50}] inside 95% [${lo95}, ${hi95}]`)
  t.ok(hi95 - lo95 > hi50 - lo50, 'strictly wider')
})

t.test('the median interval covers the true median about as often as it says', async (t) => {
  // nine ratios around 1 with a spread of a few percent, as nine logging trios give
  const gen = uniformDraws(17)
  let covered = 0
  const trials = 60
  for (let i = 0; i < trials; i++) {
    const xs = Array.from({ length: 9 }, () => 1 + 0.04 * (gen() - 0.5))
    const [lo, hi] = medianInterval(xs, { resamples: 500, seed: i + 1 })
    t.ok(lo <= hi, 'ordered')
    if (lo <= 1 && 1 <= hi) covered++
  }
  // the percentile bootstrap of a median of nine is a little narrow; far fewer would be broken
  t.ok(covered >= 48, `covered ${covered} of ${trials}`)
  const [lo, hi] = medianInterval([0.9, 0.92, 0.91, 0.9, 0.93])
  t.ok(hi < 1, `a clear 8% loss is outside 1: [${lo}, ${hi}]`)
  t.ok(Number.isNaN(medianInterval([])[0]), 'no samples, no interval')
})

t.test('the difference of two overheads: 0 inside when they are alike, outside when one is slower', async (t) => {
  const gen = uniformDraws(23)
  let alike = 0
  const trials = 30
  for (let i = 0; i < trials; i++) {
    const [a1, b1, a2, b2] = [1, 1.5, 1, 1.5].map((m) => latencies(3000, m, gen))
    const [lo, hi] = overheadDifferenceInterval(a1 as number[], b1 as number[], a2 as number[], b2 as number[], { resamples: 300, seed: i + 1 })
    if (lo <= 0 && 0 <= hi) alike++
  }
  t.ok(alike >= 25, `0 inside in ${alike} of ${trials}`)
  // a hop whose tail is 3 ms rather than 1.5 ms: its p99 overhead is larger by 1.5 ln 100 ≈ 6.9 ms
  const [a1, b1, a2, b2] = [1, 3, 1, 1.5].map((m) => latencies(3000, m, gen))
  const [lo, hi] = overheadDifferenceInterval(a1 as number[], b1 as number[], a2 as number[], b2 as number[], { resamples: 300, seed: 3 })
  t.ok(lo > 0, `[${lo}, ${hi}] above 0`)
  const truth = 1.5 * Math.log(100)
  t.ok(lo <= truth && truth <= hi, `[${lo}, ${hi}] holds ${truth}`)
  t.ok(Number.isNaN(overheadDifferenceInterval([], [1], [1], [1])[0]), 'an empty side gives no interval')
})
