// Quantiles of latency samples and bootstrap intervals for the difference of two of them: the
// proxy benchmark's p99 overhead is the difference of two phases' p99s, each resting on the
// slowest 1% of its requests, and an interval says how far that figure moves from sampling alone.

import { median } from './common.js'

/** The q-quantile of ascending `sorted` as the sample at floor(q n) (NaN when empty). */
export function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number
}

/** The q-quantile (as quantile() takes it) of samples in any order, sorted in a copy. */
export function quantileOf(xs: ArrayLike<number>, q: number): number {
  return quantile(
    Array.from(xs).sort((a, b) => a - b),
    q,
  )
}

/**
 * The q-quantile (as quantile() takes it) of one resample with replacement of ascending `sorted`,
 * `next` giving uniform draws in [0, 1). With the samples sorted, that quantile is the sample at
 * the (n - floor(q n))-th largest index drawn, so only that many of the largest indices are kept
 * rather than the resample built and sorted: at q = 0.99 a few dozen of n.
 */
export function resampledQuantile(sorted: number[], q: number, next: () => number): number {
  const n = sorted.length
  const k = n - Math.min(n - 1, Math.floor(q * n))
  // ascending: top[0] is the k-th largest index drawn so far
  const top: number[] = []
  for (let i = 0; i < n; i++) {
    const j = Math.floor(next() * n)
    if (top.length === k && j <= (top[0] as number)) continue
    let at = 0
    while (at < top.length && (top[at] as number) < j) at++
    top.splice(at, 0, j)
    if (top.length > k) top.shift()
  }
  return sorted[top[0] as number] as number
}

/** A seeded xorshift32 generator of uniform draws in [0, 1): intervals that a result file can be checked against. */
export function uniformDraws(seed: number): () => number {
  let x = seed | 0 || 1
  return () => {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    return (x >>> 0) / 4294967296
  }
}

/**
 * The central `level` bootstrap interval of quantile(b, q) - quantile(a, q), both ascending, over
 * `resamples` resamples of each (percentile method); [NaN, NaN] when either is empty.
 */
export function quantileDifferenceInterval(
  a: number[],
  b: number[],
  opts: { q?: number; level?: number; resamples?: number; seed?: number } = {},
): [number, number] {
  if (a.length === 0 || b.length === 0) return [NaN, NaN]
  const q = opts.q ?? 0.99
  const tail = (1 - (opts.level ?? 0.95)) / 2
  const next = uniformDraws(opts.seed ?? 0x9e3779b9)
  const diffs: number[] = []
  for (let i = 0; i < (opts.resamples ?? 2000); i++) diffs.push(resampledQuantile(b, q, next) - resampledQuantile(a, q, next))
  diffs.sort((x, y) => x - y)
  return [quantile(diffs, tail), quantile(diffs, 1 - tail)]
}

/**
 * The central `level` bootstrap interval of the median of `xs` (percentile method): for a figure
 * taken as the median of a few paired phases, how far it moves from which phases happened to run.
 */
export function medianInterval(xs: number[], opts: { level?: number; resamples?: number; seed?: number } = {}): [number, number] {
  if (xs.length === 0) return [NaN, NaN]
  const tail = (1 - (opts.level ?? 0.95)) / 2
  const next = uniformDraws(opts.seed ?? 0x9e3779b9)
  const meds: number[] = []
  const r = new Array<number>(xs.length)
  for (let i = 0; i < (opts.resamples ?? 2000); i++) {
    for (let j = 0; j < xs.length; j++) r[j] = xs[Math.floor(next() * xs.length)] as number
    meds.push(median(r))
  }
  meds.sort((x, y) => x - y)
  return [quantile(meds, tail), quantile(meds, 1 - tail)]
}

/**
 * The central `level` bootstrap interval of (quantile(b1, q) - quantile(a1, q)) - (quantile(b2, q)
 * - quantile(a2, q)), all four ascending: how far the difference of two overheads moves from
 * sampling alone, e.g. a router's p99 overhead with logging on less the same with logging off.
 */
export function overheadDifferenceInterval(
  a1: number[],
  b1: number[],
  a2: number[],
  b2: number[],
  opts: { q?: number; level?: number; resamples?: number; seed?: number } = {},
): [number, number] {
  if (a1.length === 0 || b1.length === 0 || a2.length === 0 || b2.length === 0) return [NaN, NaN]
  const q = opts.q ?? 0.99
  const tail = (1 - (opts.level ?? 0.95)) / 2
  const next = uniformDraws(opts.seed ?? 0x9e3779b9)
  const diffs: number[] = []
  for (let i = 0; i < (opts.resamples ?? 2000); i++) {
    const first = resampledQuantile(b1, q, next) - resampledQuantile(a1, q, next)
    diffs.push(first - (resampledQuantile(b2, q, next) - resampledQuantile(a2, q, next)))
  }
  diffs.sort((x, y) => x - y)
  return [quantile(diffs, tail), quantile(diffs, 1 - tail)]
}
