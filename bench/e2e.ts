// End-to-end benchmark (npm run bench:e2e): a slice of the Mooncake conversation
// trace replayed, time-compressed, through `kv-router serve` to a `kv-router mocker` fleet, once
// per router mode, with the same fleet and the same load, in one run. Every mode gets a fresh
// router and a fresh (cold) fleet, so no mode inherits another's cache.
//
// Time. The mocker's --speedup-ratio S makes its simulated clock run S× faster than the wall
// clock; the replay then sends at X × S the trace's pace, where X is the load multiplier, so in
// simulated time the fleet sees the trace's arrival rate × X. Latencies are measured on the
// wall clock by the client and reported × S, i.e. in SIMULATED ms, comparable to the mocker's
// timing model (a 13k-token prefill ≈ 0.3 s). Client, router and mocker overheads are scaled
// by S too, which is why S is kept as small as the time budget allows.
//
// Capacity. Every worker gets K KV blocks with K = ceil(unique blocks of the slice / workers ×
// capacity factor): the fleet as a whole can hold everything the slice ever stores, so a router
// that keeps each prefix on one worker can approach the infinite-cache bound, and one that
// scatters prefixes pays in evictions and recomputation.
//
// Latency per request, as the replay client sees it (src/sim/replay/client.ts): TTFT, send →
// first token; TPOT, the mean time per output token after the first ((last token − first) /
// (tokens − 1)); ITL, the gaps between the client's reads that carried tokens. The simulated
// engines run overdue steps back to back when the machine is busy, so tokens often arrive
// several to a read: TPOT is the figure to compare, ITL shows how bursty the delivery was.
//
// Run: npm run bench:e2e [-- --minutes M | --full] [--offset M] [--workers N] [--modes kv,round-robin]
//      [--speedup S] [--load X] [--capacity-factor F] [--max-in-flight N] [--trace FILE]
//      [--records DIR] [--router-args "FLAGS"] [--engine-profile LIST];  npm run bench:e2e -- --replot  redraws the SVG
//      from the JSON
// Results: bench/results/e2e.json, bench/results/e2e.svg and a printed table.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { availableParallelism, cpus } from 'node:os'
import { join, relative } from 'node:path'
import { readTrace } from '../src/sim/replay/trace.js'
import type { TraceRequest } from '../src/sim/replay/trace.js'
import { cacheBound } from '../src/sim/replay/bound.js'
import { startReplay } from '../src/sim/replay/client.js'
import type { ReplayResult } from '../src/sim/replay/client.js'
import { percentile, summarize } from '../src/sim/replay/summary.js'
import type { ReplaySummary } from '../src/sim/replay/summary.js'
import { renderE2eSvg } from './lib/e2e-plot.js'
import { parseProfileList, timingsFor } from '../src/sim/mocker/profiles.js'
import { repoRoot, resultsDir, textTable } from './lib/common.js'
import { cpuSample, cpuShares, start, stop, workerIds } from './lib/processes.js'
import type { Child } from './lib/processes.js'

const BLOCK_SIZE = 64
// kv runs the default cost (the latency cost, docs/cost.md); kv-dynamo Dynamo's cost at its
// defaults; kv-tuned Dynamo's cost with the knobs that made it fit this workload before the
// latency cost existed (not in the default run: kv does as well without knobs).
const TUNED = ['--router-prefill-load-scale', '10', '--router-kv-overlap-score-credit', '5']
const MODE_ARGS: Record<string, string[]> = {
  kv: ['--router-mode', 'kv'],
  // the latency cost with the fixed default engine model: what learning the engines adds
  'kv-static': ['--router-mode', 'kv', '--no-router-learn-engines'],
  'kv-dynamo': ['--router-mode', 'kv', '--router-cost', 'dynamo'],
  'kv-tuned': ['--router-mode', 'kv', '--router-cost', 'dynamo', ...TUNED],
  'round-robin': ['--router-mode', 'round-robin'],
  random: ['--router-mode', 'random'],
  'least-loaded': ['--router-mode', 'least-loaded'],
}
const ALL_MODES = Object.keys(MODE_ARGS)
const DEFAULT_MODES = ['kv', 'kv-dynamo', 'round-robin', 'random', 'least-loaded']
const MODEL = 'e2e-model'
/** Share of the machine other processes may use during a mode before the run is flagged. */
const OTHER_CPU_WARN = 0.1

// Defaults calibrated on a 2-core machine (docs/benchmarks.md): the load makes round-robin queue
// (p90 TTFT ≥ 1 s simulated) and S fits five modes in ~12 minutes.
const DEFAULTS = { minutes: 20, workers: 8, speedup: 1.5, load: 8, capacityFactor: 1.25, maxInFlight: 2048 }

/** The slice's name: "the first 20 min", "min 20 to 40", "the whole trace", "the trace from min 40". */
function sliceText(minutes: number | null, offset: number): string {
  if (minutes === null) return offset === 0 ? 'the whole trace' : `the trace from min ${offset}`
  return offset === 0 ? `the first ${minutes} min` : `min ${offset} to ${offset + minutes}`
}

/** A profile list the mocker will take for `workers` engines (its own checks, run here to fail before any process starts). */
function profileArg(spec: string, workers: number): string {
  try {
    timingsFor(parseProfileList(spec), workers)
  } catch (err) {
    fail((err as Error).message)
  }
  return spec
}

function fail(msg: string): never {
  process.stderr.write(`bench:e2e: ${msg}\n`)
  process.exit(2)
}

interface Args {
  minutes: number | null
  /** Minutes of the trace skipped before the slice: a later slice is traffic no default was tuned on. */
  offset: number
  workers: number
  modes: string[]
  speedup: number
  load: number
  capacityFactor: number
  maxInFlight: number
  trace: string
  /** Directory for one JSONL file of replay records per mode (analysis); null for none. */
  records: string | null
  /** Extra `kv-router serve` flags for every mode (experiments; the default run uses none). */
  routerArgs: string[]
  /** The engines' `--engine-profile` (their timing; `default` is the router's own model). */
  engineProfile: string
}

function parseArgs(argv: string[]): Args {
  const v = new Map<string, string>()
  let full = false
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (a === '--full') {
      full = true
      continue
    }
    const known = [
      '--minutes',
      '--offset',
      '--workers',
      '--modes',
      '--speedup',
      '--load',
      '--capacity-factor',
      '--max-in-flight',
      '--trace',
      '--records',
      '--router-args',
      '--engine-profile',
    ]
    const [name, inline] = a.includes('=') ? [a.slice(0, a.indexOf('=')), a.slice(a.indexOf('=') + 1)] : [a, undefined]
    if (!known.includes(name as string)) fail(`unknown option ${JSON.stringify(a)} (known: --full ${known.join(' ')})`)
    const value = inline ?? argv[++i]
    if (value === undefined) fail(`${name} needs a value`)
    v.set(name as string, value)
  }
  const num = (name: string, dflt: number, integer = false): number => {
    const s = v.get(name)
    if (s === undefined) return dflt
    const n = Number(s)
    if (s.trim() === '' || !Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n)))
      fail(`${name} must be a positive ${integer ? 'integer' : 'number'}, got ${JSON.stringify(s)}`)
    return n
  }
  const modes = (v.get('--modes') ?? DEFAULT_MODES.join(',')).split(',').filter((m) => m !== '')
  for (const m of modes) if (!ALL_MODES.includes(m)) fail(`--modes: unknown mode ${JSON.stringify(m)} (one of ${ALL_MODES.join(', ')})`)
  if (modes.length === 0) fail('--modes needs at least one mode')
  if (full && v.has('--minutes')) fail('--full and --minutes exclude each other')
  const offsetText = v.get('--offset') ?? '0'
  const offset = Number(offsetText)
  if (offsetText.trim() === '' || !Number.isFinite(offset) || offset < 0) fail(`--offset must be a number of minutes ≥ 0, got ${JSON.stringify(offsetText)}`)
  return {
    minutes: full ? null : num('--minutes', DEFAULTS.minutes),
    offset,
    workers: num('--workers', DEFAULTS.workers, true),
    modes,
    speedup: num('--speedup', DEFAULTS.speedup),
    load: num('--load', DEFAULTS.load),
    capacityFactor: num('--capacity-factor', DEFAULTS.capacityFactor),
    maxInFlight: num('--max-in-flight', DEFAULTS.maxInFlight, true),
    trace: v.get('--trace') ?? join(repoRoot(), 'data', 'conversation_trace.jsonl'),
    records: v.get('--records') ?? null,
    routerArgs: (v.get('--router-args') ?? '').split(/\s+/).filter((x) => x !== ''),
    engineProfile: profileArg(v.get('--engine-profile') ?? 'default', num('--workers', DEFAULTS.workers, true)),
  }
}

interface ModeRun {
  summary: ReplaySummary
  result: ReplayResult
  wallS: number
  routerCachedBlocks: number
  cpu: { own: number; other: number } | null
}

async function runMode(mode: string, a: Args, requests: TraceRequest[], k: number): Promise<ModeRun> {
  const router = await start(
    [
      'serve',
      '--http-host',
      '127.0.0.1',
      '--http-port',
      '0',
      ...(MODE_ARGS[mode] as string[]),
      '--router-block-size',
      String(BLOCK_SIZE),
      '--router-event-threads',
      '1',
      '--model-name',
      MODEL,
      '--shutdown-timeout-secs',
      '5',
      ...a.routerArgs,
    ],
    /listening on (http:\/\/\S+)/,
  )
  const url = router.match[1] as string
  let mocker: Child | null = null
  try {
    mocker = await start(
      [
        'mocker',
        '--num-workers',
        String(a.workers),
        '--router-url',
        url,
        '--block-size',
        String(BLOCK_SIZE),
        '--num-gpu-blocks-override',
        String(k),
        '--speedup-ratio',
        String(a.speedup),
        '--engine-profile',
        a.engineProfile,
      ],
      /kv-router mocker: ready (\d+) engine\(s\)/,
    )
    const { ids } = await workerIds(url)
    if (ids.length !== a.workers) throw new Error(`the router lists ${ids.length} worker(s), expected ${a.workers}`)
    const t0 = performance.now()
    const cpu0 = cpuSample([router.p.pid, mocker.p.pid])
    const run = startReplay({ url, requests, speedup: a.load * a.speedup, maxInFlight: a.maxInFlight, model: MODEL, timeoutMs: 600_000 })
    const tty = process.stderr.isTTY === true
    const ticker = setInterval(
      () => {
        const p = run.progress()
        const line =
          `  ${mode}: ${Math.floor((p.done / Math.max(1, p.total)) * 100)}%  sent ${p.sent}/${p.total}  in flight ${p.inFlight}  failed ` +
          `${p.failed}  ${p.elapsedS.toFixed(0)}/${p.scheduleS.toFixed(0)} s`
        process.stderr.write(tty ? `\r${line}\u001b[K` : `${line}\n`)
      },
      tty ? 500 : 15_000,
    )
    let result: ReplayResult
    try {
      result = await run.done
    } finally {
      clearInterval(ticker)
      if (tty) process.stderr.write('\r\u001b[K')
    }
    const wallS = (performance.now() - t0) / 1000
    const cpu = cpuShares(cpu0, cpuSample([router.p.pid, mocker.p.pid]))
    const after = await workerIds(url)
    const summary = summarize(result.records, { gaps: result.itlGaps, timeScale: a.speedup, workers: ids })
    return { summary, result, wallS, routerCachedBlocks: after.cachedBlocks, cpu }
  } finally {
    if (mocker !== null) await stop(mocker)
    await stop(router)
  }
}

interface Bar {
  bar: string
  value: string
  target: string
  pass: boolean | null
}

function pct(v: number | null): string {
  return v === null ? 'n/a' : `${(v * 100).toFixed(1)}%`
}
function ms(v: number | null): string {
  return v === null ? 'n/a' : v >= 10_000 ? v.toFixed(0) : v >= 100 ? v.toFixed(0) : v.toFixed(1)
}

function ttftSamples(r: ModeRun, scale: number): number[] {
  return r.result.records.filter((x) => x.error === null && x.ttft_ms !== null).map((x) => (x.ttft_ms as number) * scale)
}

function ttftPercentiles(r: ModeRun, scale: number): number[] {
  const s = Float64Array.from(ttftSamples(r, scale)).sort()
  if (s.length === 0) return []
  return Array.from({ length: 101 }, (_, q) => percentile(s, q / 100) as number)
}

function secs(v: number | null): string {
  return v === null ? 'n/a' : `${(v / 1000).toFixed(2)} s`
}

/** The targets: the default kv mode against the bound and round-robin; errors everywhere. */
function evaluateBars(bound: number, modes: Record<string, ReplaySummary>): Bar[] {
  const rr = modes['round-robin']
  const rrP90 = rr?.ttft_ms.p90 ?? null
  const bars: Bar[] = []
  const kv = modes.kv
  if (kv !== undefined) bars.push(...kvBars('kv', bound, kv, rr))
  const errs = Object.entries(modes).map(([m, s]) => `${m} ${s.errors}`)
  bars.push({ bar: 'zero errors in every mode', value: errs.join(', '), target: '0', pass: Object.values(modes).every((s) => s.errors === 0) })
  bars.push({
    bar: '(calibration) round-robin p90 TTFT ≥ 1 s simulated',
    value: rrP90 === null ? 'n/a' : `${ms(rrP90)} ms`,
    target: '≥ 1000 ms',
    pass: rrP90 === null ? null : rrP90 >= 1000,
  })
  return bars
}

/** The targets for one kv variant, against the bound and round-robin. */
function kvBars(name: string, bound: number, kv: ReplaySummary, rr: ReplaySummary | undefined): Bar[] {
  const bars: Bar[] = []
  const kvHit = kv.hit_rate
  bars.push({
    bar: `${name} hit rate ≥ 0.90 × bound`,
    value: kvHit === null ? 'n/a' : `${pct(kvHit)} (${(kvHit / bound).toFixed(2)} × bound)`,
    target: `≥ ${pct(0.9 * bound)}`,
    pass: kvHit === null ? null : kvHit >= 0.9 * bound,
  })
  const kvP90 = kv.ttft_ms.p90
  const rrP90 = rr?.ttft_ms.p90 ?? null
  bars.push({
    bar: `${name} p90 TTFT ≤ 0.25 × round-robin`,
    value: kvP90 === null || rrP90 === null ? 'n/a' : `${ms(kvP90)} vs ${ms(rrP90)} ms (${(kvP90 / rrP90).toFixed(3)})`,
    target: '≤ 0.25',
    pass: kvP90 === null || rrP90 === null ? null : kvP90 <= rrP90 * 0.25,
  })
  const sp = kv.spread
  bars.push({
    bar: `${name} spread (max/min requests per worker) ≤ 1.3`,
    value: sp === null ? '∞ (a worker got none)' : sp.toFixed(2),
    target: '≤ 1.3',
    pass: sp !== null && sp <= 1.3,
  })
  return bars
}

interface ResultJson {
  date: string
  hit_rate_bound: number
  config: {
    workers: number
    K: number
    speedup: number
    load: number
    minutes: number | null
    offset_minutes?: number
    requests: number
    block_size: number
    engine_profile?: string
  }
  modes: Record<string, { hit_rate: number | null; ttft_ms: { p50: number | null; p90: number | null; p99: number | null }; ttft_percentiles_ms?: number[] }>
}

const profileText = (p: string | undefined): string => (p === undefined || p === 'default' ? '' : ` --engine-profile ${p}`)

/** The figure, from the result JSON alone (so --replot can redraw a finished run). */
function plot(r: ResultJson): string {
  const c = r.config
  const slice = `${sliceText(c.minutes, c.offset_minutes ?? 0)} of the`
  return renderE2eSvg({
    title: `kv-router end to end: ${c.workers} mocker workers, ${slice} Mooncake conversation trace (${c.requests} requests)`,
    subtitle:
      `load × ${c.load}, mocker --speedup-ratio ${c.speedup}${profileText(c.engine_profile)} (times simulated), ` +
      `K = ${c.K} blocks/worker, block ${c.block_size}; ${r.date.slice(0, 10)}`,
    series: Object.entries(r.modes).map(([m, s]) => ({
      mode: m,
      ttftMs: s.ttft_percentiles_ms ?? [],
      hitRate: s.hit_rate,
      note: `p50 ${secs(s.ttft_ms.p50)}  p90 ${secs(s.ttft_ms.p90)}  p99 ${secs(s.ttft_ms.p99)}`,
    })),
    bound: r.hit_rate_bound,
    ttftLabel: 'TTFT, simulated time (log scale)',
  })
}

async function main(): Promise<void> {
  if (process.argv[2] === '--replot') {
    // redraws bench/results/e2e.svg from bench/results/e2e.json (after a change to the figure)
    const dir = resultsDir()
    writeFileSync(join(dir, 'e2e.svg'), plot(JSON.parse(readFileSync(join(dir, 'e2e.json'), 'utf8')) as ResultJson))
    console.log(`written to ${join(dir, 'e2e.svg')}`)
    return
  }
  const a = parseArgs(process.argv.slice(2))
  const all = readTrace(a.trace)
  const from = a.offset * 60_000
  const requests = all.filter((r) => r.timestamp >= from && (a.minutes === null || r.timestamp < from + a.minutes * 60_000))
  if (requests.length === 0) fail('the slice holds no request')
  const b0 = performance.now()
  const bound = cacheBound(requests, BLOCK_SIZE)
  const boundS = (performance.now() - b0) / 1000
  const k = Math.ceil((bound.uniqueBlocks / a.workers) * a.capacityFactor)
  const spanS = ((requests[requests.length - 1] as TraceRequest).timestamp - (requests[0] as TraceRequest).timestamp) / 1000
  const replaySpeedup = a.load * a.speedup
  const command = `npm run bench:e2e${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`
  const sliceName = sliceText(a.minutes, a.offset)
  console.log(`bench:e2e — ${sliceName} of ${relative(process.cwd(), a.trace)}: ${requests.length} requests over ${(spanS / 60).toFixed(1)} min`)
  console.log(
    `  infinite-cache hit-rate bound (block ${BLOCK_SIZE}): ${pct(bound.hitRate)}; ${bound.uniqueBlocks} unique blocks → K = ${k} KV blocks per ` +
      `worker (× ${a.workers} workers, factor ${a.capacityFactor}) [${boundS.toFixed(1)} s]`,
  )
  console.log(
    `  mocker --speedup-ratio ${a.speedup}, load × ${a.load} → replay at ${replaySpeedup}× the trace: ~${(spanS / replaySpeedup).toFixed(0)} s of ` +
      `sending per mode; modes: ${a.modes.join(', ')}`,
  )
  if (a.modes.includes('kv-tuned')) console.log(`  kv-tuned = kv-dynamo with ${TUNED.join(' ')}`)
  const runs: Record<string, ModeRun> = {}
  for (const mode of a.modes) {
    const r = await runMode(mode, a, requests, k)
    runs[mode] = r
    if (a.records !== null) {
      mkdirSync(a.records, { recursive: true })
      writeFileSync(join(a.records, `${mode}.jsonl`), r.result.records.map((x) => JSON.stringify(x)).join('\n') + '\n')
    }
    const s = r.summary
    const cpuNote = r.cpu === null ? '' : `; CPU: bench ${pct(r.cpu.own)} of the machine, other processes ${pct(r.cpu.other)}`
    console.log(
      `  ${mode}: ${s.ok}/${s.requests} ok in ${r.wallS.toFixed(0)} s wall; TTFT p50/p90/p99 ${ms(s.ttft_ms.p50)}/${ms(s.ttft_ms.p90)}/` +
        `${ms(s.ttft_ms.p99)} ms, hit rate ${pct(s.hit_rate)}, spread ${s.spread?.toFixed(2) ?? '∞'}${cpuNote}`,
    )
    if (r.cpu !== null && r.cpu.other > OTHER_CPU_WARN)
      console.log(`  WARNING: other processes used ${pct(r.cpu.other)} of the machine during ${mode}: its latencies are inflated; rerun on a quiet machine`)
  }
  const summaries = Object.fromEntries(Object.entries(runs).map(([m, r]) => [m, r.summary]))
  const bars = evaluateBars(bound.hitRate, summaries)

  const rows = Object.entries(runs).map(([m, r]) => {
    const s = r.summary
    return [
      m,
      String(s.requests),
      String(s.errors),
      ms(s.ttft_ms.p50),
      ms(s.ttft_ms.p90),
      ms(s.ttft_ms.p99),
      ms(s.tpot_ms.p50),
      ms(s.tpot_ms.p99),
      ms(s.itl_ms.p50),
      ms(s.itl_ms.p99),
      s.requests_per_s.toFixed(2),
      s.output_tokens_per_s.toFixed(0),
      pct(s.hit_rate),
      s.spread === null ? '∞' : s.spread.toFixed(2),
      ms(s.send_lag_ms.p99),
    ]
  })
  console.log(`\nper mode (times in SIMULATED ms = wall × ${a.speedup}; throughput per simulated second)`)
  console.log(
    textTable(
      [
        'mode',
        'requests',
        'errors',
        'TTFT p50',
        'TTFT p90',
        'TTFT p99',
        'TPOT p50',
        'TPOT p99',
        'ITL p50',
        'ITL p99',
        'req/s',
        'out tok/s',
        'hit rate',
        'spread',
        'send lag p99 (wall ms)',
      ],
      rows,
    ),
  )
  console.log(`infinite-cache bound: ${pct(bound.hitRate)}`)
  console.log('\ntargets')
  console.log(
    textTable(
      ['check', 'value', 'target', 'result'],
      bars.map((b) => [b.bar, b.value, b.target, b.pass === null ? 'n/a' : b.pass ? 'PASS' : 'FAIL']),
    ),
  )

  const config = {
    workers: a.workers,
    K: k,
    kv_blocks_per_worker: k,
    capacity_factor: a.capacityFactor,
    block_size: BLOCK_SIZE,
    speedup: a.speedup,
    load: a.load,
    replay_speedup: replaySpeedup,
    minutes: a.minutes,
    offset_minutes: a.offset,
    requests: requests.length,
    max_in_flight: a.maxInFlight,
    trace: relative(repoRoot(), a.trace),
    command,
    router_args: a.routerArgs,
    engine_profile: a.engineProfile,
    mode_args: Object.fromEntries(a.modes.map((m) => [m, MODE_ARGS[m]])),
    time_unit: `simulated ms (wall ms × ${a.speedup})`,
  }
  const modes = Object.fromEntries(
    Object.entries(runs).map(([m, r]) => {
      const s = r.summary
      return [
        m,
        {
          requests: s.requests,
          errors: s.errors,
          error_kinds: s.error_kinds,
          ttft_ms: { p50: s.ttft_ms.p50, p90: s.ttft_ms.p90, p99: s.ttft_ms.p99, mean: s.ttft_ms.mean },
          // the whole distribution, enough to redraw the CDF (--replot): percentiles 0, 1, …, 100
          ttft_percentiles_ms: ttftPercentiles(r, a.speedup),
          itl_ms: { p50: s.itl_ms.p50, p99: s.itl_ms.p99, mean: s.itl_ms.mean },
          tpot_ms: { p50: s.tpot_ms.p50, p90: s.tpot_ms.p90, p99: s.tpot_ms.p99, mean: s.tpot_ms.mean },
          e2e_ms: { p50: s.e2e_ms.p50, p99: s.e2e_ms.p99 },
          hit_rate: s.hit_rate,
          prompt_tokens: s.prompt_tokens,
          cached_tokens: s.cached_tokens,
          spread: s.spread,
          workers: s.workers,
          throughput: { requests_per_s: s.requests_per_s, output_tokens_per_s: s.output_tokens_per_s, duration_s: s.duration_s },
          send_lag_wall_ms: { p50: s.send_lag_ms.p50, p99: s.send_lag_ms.p99, max: s.send_lag_ms.max },
          wall_s: r.wallS,
          cpu_share: r.cpu === null ? null : { bench_processes: r.cpu.own, other_processes: r.cpu.other },
          router_cached_blocks_after: r.routerCachedBlocks,
        },
      ]
    }),
  )
  const out = {
    benchmark: 'e2e',
    date: new Date().toISOString(),
    node: process.version,
    cpus: availableParallelism(),
    cpuModel: cpus()[0]?.model ?? 'unknown',
    hit_rate_bound: bound.hitRate,
    bound: { block_size: BLOCK_SIZE, prompt_tokens: bound.promptTokens, cached_tokens: bound.cachedTokens, unique_blocks: bound.uniqueBlocks },
    config,
    modes,
    bars,
  }
  const dir = resultsDir()
  writeFileSync(join(dir, 'e2e.json'), JSON.stringify(out, null, 2) + '\n')
  const svg = plot(out)
  writeFileSync(join(dir, 'e2e.svg'), svg)
  console.log(`\nwritten to ${join(dir, 'e2e.json')} and ${join(dir, 'e2e.svg')}`)
}

await main()
