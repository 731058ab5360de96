// Statistics of a replay: latency percentiles, achieved prefix-cache hit rate, throughput and how
// evenly the router spread the requests. Pure functions over the per-request records, so the
// CLI, the end-to-end benchmark and the tests all compute them the same way.
//
// Percentiles are nearest-rank (the smallest sample with at least q of the samples at or below
// it): every reported figure is a latency that was really observed, and small inputs give
// answers one can check by hand.
import type { ReplayRecord } from './client.js'

export interface Quantiles {
  p50: number | null
  p90: number | null
  p99: number | null
  mean: number | null
  max: number | null
}

export interface ReplaySummary {
  requests: number
  ok: number
  errors: number
  /** The most frequent error messages with their counts (at most 5). */
  error_kinds: Record<string, number>
  /** Multiplies every duration below (1 = wall clock; the mocker's --speedup-ratio = simulated). */
  time_scale: number
  /** First send to last completion, scaled. */
  duration_s: number
  requests_per_s: number
  output_tokens_per_s: number
  prompt_tokens: number
  cached_tokens: number
  output_tokens: number
  /** cached prompt tokens / prompt tokens, over successful requests; null when there are none. */
  hit_rate: number | null
  /** Time to the first content chunk, from the moment the request was sent. */
  ttft_ms: Quantiles
  /** ITL: the gaps between network reads that carried content, pooled over all requests (client.ts). */
  itl_ms: Quantiles
  /** TPOT of each request ((last chunk − first chunk) / (chunks − 1)), across requests. */
  tpot_ms: Quantiles
  /** Send to end of stream. */
  e2e_ms: Quantiles
  /** How late requests left compared with the trace schedule, wall ms (never scaled). */
  send_lag_ms: Quantiles
  /** Successful requests per worker id (workers given as expected appear with 0). */
  workers: Record<string, number>
  /** max/min of the per-worker counts; null when some worker got none or none are known. */
  spread: number | null
}

/** Nearest-rank percentile of an ascending array; null when empty. q in [0, 1]. */
export function percentile(sorted: ArrayLike<number>, q: number): number | null {
  const n = sorted.length
  if (n === 0) return null
  const rank = Math.ceil(q * n)
  return sorted[Math.min(n - 1, Math.max(0, rank - 1))] as number
}

/** Quantiles of unsorted samples (the input is not modified). */
export function quantiles(samples: ArrayLike<number>): Quantiles {
  const s = Float64Array.from(samples).sort()
  let sum = 0
  for (let i = 0; i < s.length; i++) sum += s[i] as number
  return {
    p50: percentile(s, 0.5),
    p90: percentile(s, 0.9),
    p99: percentile(s, 0.99),
    mean: s.length === 0 ? null : sum / s.length,
    max: s.length === 0 ? null : (s[s.length - 1] as number),
  }
}

/** max/min of the counts; null when there are none or the smallest is 0 (unbounded). */
export function spread(counts: readonly number[]): number | null {
  if (counts.length === 0) return null
  let lo = Infinity
  let hi = -Infinity
  for (const c of counts) {
    if (c < lo) lo = c
    if (c > hi) hi = c
  }
  return lo <= 0 ? null : hi / lo
}

/** Cached prompt tokens / prompt tokens; null when there were no prompt tokens. */
export function hitRate(cachedTokens: number, promptTokens: number): number | null {
  return promptTokens > 0 ? cachedTokens / promptTokens : null
}

function scaled(q: Quantiles, k: number): Quantiles {
  const f = (v: number | null): number | null => (v === null ? null : v * k)
  return { p50: f(q.p50), p90: f(q.p90), p99: f(q.p99), mean: f(q.mean), max: f(q.max) }
}

export interface SummarizeOptions {
  /** ITL samples of every request, wall ms (ReplayResult.itlGaps). */
  gaps?: ArrayLike<number>
  /** Durations are multiplied by this (default 1). */
  timeScale?: number
  /** Worker ids that should have received requests: they count even with zero requests. */
  workers?: readonly string[]
}

export function summarize(records: readonly ReplayRecord[], options: SummarizeOptions = {}): ReplaySummary {
  const k = options.timeScale ?? 1
  const ok = records.filter((r) => r.error === null)
  const kinds = new Map<string, number>()
  for (const r of records) {
    if (r.error !== null) kinds.set(r.error, (kinds.get(r.error) ?? 0) + 1)
  }
  const workers = new Map<string, number>()
  for (const w of options.workers ?? []) workers.set(w, 0)
  let prompt = 0
  let cached = 0
  let output = 0
  for (const r of ok) {
    prompt += r.prompt_tokens
    cached += r.cached_tokens
    output += r.output_tokens
    if (r.worker !== null) workers.set(r.worker, (workers.get(r.worker) ?? 0) + 1)
  }
  let first = Infinity
  let last = -Infinity
  for (const r of records) {
    first = Math.min(first, r.sent_ms)
    last = Math.max(last, r.sent_ms + (r.e2e_ms ?? 0))
  }
  const durationS = records.length === 0 ? 0 : ((last - first) / 1000) * k
  const num = (xs: (number | null)[]): number[] => xs.filter((x): x is number => x !== null)
  const sortedKinds = [...kinds.entries()].sort((a, b) => b[1] - a[1]).slice(0, 5)
  return {
    requests: records.length,
    ok: ok.length,
    errors: records.length - ok.length,
    error_kinds: Object.fromEntries(sortedKinds),
    time_scale: k,
    duration_s: durationS,
    requests_per_s: durationS > 0 ? ok.length / durationS : 0,
    output_tokens_per_s: durationS > 0 ? output / durationS : 0,
    prompt_tokens: prompt,
    cached_tokens: cached,
    output_tokens: output,
    hit_rate: hitRate(cached, prompt),
    ttft_ms: scaled(quantiles(num(ok.map((r) => r.ttft_ms))), k),
    itl_ms: scaled(quantiles(options.gaps ?? []), k),
    tpot_ms: scaled(quantiles(num(ok.map((r) => r.tpot_ms))), k),
    e2e_ms: scaled(quantiles(num(ok.map((r) => r.e2e_ms))), k),
    send_lag_ms: quantiles(records.map((r) => r.sent_ms - r.scheduled_ms)),
    workers: Object.fromEntries([...workers.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))),
    spread: spread([...workers.values()]),
  }
}

function fmt(v: number | null, digits = 1): string {
  return v === null ? '–' : v.toFixed(digits)
}

/** The human-readable summary the CLI prints. */
export function formatSummary(s: ReplaySummary): string {
  const unit = s.time_scale === 1 ? 'ms' : `ms, simulated: wall × ${s.time_scale}`
  const counts = Object.entries(s.workers)
  const lines = [
    `requests      ${s.requests} (${s.ok} ok, ${s.errors} failed)`,
    `duration      ${s.duration_s.toFixed(1)} s${s.time_scale === 1 ? '' : ' (simulated)'}; ${s.requests_per_s.toFixed(2)} req/s, ` +
      `${s.output_tokens_per_s.toFixed(0)} output tokens/s`,
    `TTFT (${unit})  p50 ${fmt(s.ttft_ms.p50)}  p90 ${fmt(s.ttft_ms.p90)}  p99 ${fmt(s.ttft_ms.p99)}`,
    `TPOT (${unit})  p50 ${fmt(s.tpot_ms.p50, 2)}  p99 ${fmt(s.tpot_ms.p99, 2)}  (per request: time per output token after the first)`,
    `ITL  (${unit})  p50 ${fmt(s.itl_ms.p50, 2)}  p99 ${fmt(s.itl_ms.p99, 2)}  (gaps between reads that carried tokens)`,
    `hit rate      ${s.hit_rate === null ? '–' : `${(s.hit_rate * 100).toFixed(2)}%`} (${s.cached_tokens} of ${s.prompt_tokens} prompt tokens cached)`,
    `workers       ${counts.length === 0 ? '–' : counts.map(([w, n]) => `${w}:${n}`).join(' ')}; spread max/min ` +
      `${s.spread === null ? '–' : s.spread.toFixed(2)}`,
    `send lag (wall ms)  p50 ${fmt(s.send_lag_ms.p50)}  p99 ${fmt(s.send_lag_ms.p99)}  max ${fmt(s.send_lag_ms.max)}`,
  ]
  for (const [msg, n] of Object.entries(s.error_kinds)) lines.push(`error ×${n}   ${msg}`)
  return `${lines.join('\n')}\n`
}
