// Fleet simulation in virtual time (npm run bench:fleet-sim): the router's Scheduler in front of
// simulated engines (src/sim/mocker/engine.ts) stepped on a simulated clock, replaying a slice of
// the Mooncake conversation trace. No wall clock, no HTTP, no processes: a run takes seconds, is
// the same every time, and a busy machine does not change it, which makes it the tool for
// comparing costs on many workloads. bench:e2e is the same experiment through the real router,
// proxy and mocker processes; the two agree on hit rates to a point or so.
//
// What the simulation leaves out: the router learns an engine's cache from the engine itself at
// the moment of the decision (no event latency), and a step's results are visible at its end
// (the mocker's timing). Times are simulated ms.
//
// Run: npm run bench:fleet-sim [-- --minutes M] [--offset M] [--workers N] [--load X]
//      [--capacity-factor F] [--chunk TOKENS] [--modes kv,kv-dynamo,...] [--trace FILE]
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { readTrace, TraceBlockHasher, expandTokens } from '../src/sim/replay/trace.js'
import type { TraceRequest } from '../src/sim/replay/trace.js'
import { cacheBound } from '../src/sim/replay/bound.js'
import { sequenceHashesInto } from '../src/codec/hashing.js'
import { MockEngine } from '../src/sim/mocker/engine.js'
import type { EngineRequest, RequestListener } from '../src/sim/mocker/engine.js'
import { Scheduler } from '../src/scheduler/scheduler.js'
import type { SchedulerOptionsInput } from '../src/scheduler/options.js'
import { percentile } from '../src/sim/replay/summary.js'
import { repoRoot, resultsDir } from './lib/common.js'

const BLOCK_SIZE = 64

/** The modes of bench:e2e, as scheduler options. */
const MODES: Record<string, SchedulerOptionsInput> = {
  kv: { mode: 'kv' },
  'kv-dynamo': { mode: 'kv', cost: 'dynamo' },
  'kv-tuned': { mode: 'kv', cost: 'dynamo', overlapScoreWeight: 10, overlapScoreCredit: 5 },
  'round-robin': { mode: 'round-robin' },
  random: { mode: 'random' },
  'least-loaded': { mode: 'least-loaded' },
}

interface Args {
  minutes: number
  offset: number
  workers: number
  load: number
  capacityFactor: number
  chunk: number
  modes: string[]
  trace: string
}

function fail(msg: string): never {
  process.stderr.write(`bench:fleet-sim: ${msg}\n`)
  process.exit(2)
}

function parseArgs(argv: string[]): Args {
  const v = new Map<string, string>()
  const known = ['--minutes', '--offset', '--workers', '--load', '--capacity-factor', '--chunk', '--modes', '--trace']
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (!known.includes(a)) fail(`unknown option ${JSON.stringify(a)} (known: ${known.join(' ')})`)
    const value = argv[++i]
    if (value === undefined) fail(`${a} needs a value`)
    v.set(a, value)
  }
  const num = (name: string, dflt: number, min: number): number => {
    const s = v.get(name)
    if (s === undefined) return dflt
    const n = Number(s)
    if (s.trim() === '' || !Number.isFinite(n) || n < min) fail(`${name} must be a number ≥ ${min}, got ${JSON.stringify(s)}`)
    return n
  }
  const modes = (v.get('--modes') ?? 'kv,kv-dynamo,kv-tuned,round-robin,least-loaded').split(',').filter((m) => m !== '')
  for (const m of modes) if (MODES[m] === undefined) fail(`--modes: unknown mode ${JSON.stringify(m)} (one of ${Object.keys(MODES).join(', ')})`)
  const workers = num('--workers', 8, 1)
  if (!Number.isInteger(workers)) fail('--workers must be an integer')
  return {
    minutes: num('--minutes', 20, 0.001),
    offset: num('--offset', 0, 0),
    workers,
    load: num('--load', 8, 0.001),
    capacityFactor: num('--capacity-factor', 1.25, 0.001),
    chunk: Math.floor(num('--chunk', 8192, 1)),
    modes,
    trace: v.get('--trace') ?? join(repoRoot(), 'data', 'conversation_trace.jsonl'),
  }
}

interface Outcome {
  hitRate: number
  ttft: Float64Array
  e2eMeanMs: number
  perWorker: number[]
}

/** Replays the requests through a fresh Scheduler and a cold fleet; everything in simulated ms. */
function simulate(options: SchedulerOptionsInput, requests: TraceRequest[], a: Args, blocksPerWorker: number): Outcome {
  let now = 0
  const s = new Scheduler({ blockSize: BLOCK_SIZE, seed: 1, ...options }, { timers: false, clock: () => now })
  const engines: MockEngine[] = []
  for (let i = 0; i < a.workers; i++) {
    engines.push(
      new MockEngine({
        workerId: BigInt(i + 1),
        blockSize: BLOCK_SIZE,
        numGpuBlocks: blocksPerWorker,
        maxNumBatchedTokens: a.chunk,
        autoStep: false,
        now: () => now,
      }),
    )
    s.addWorkerRank(BigInt(i + 1), 0, { maxNumBatchedTokens: a.chunk, totalKvBlocks: blocksPerWorker })
  }
  const hasher = new TraceBlockHasher(BLOCK_SIZE)
  const t0 = requests[0]?.timestamp ?? 0
  const idOf = new Map<EngineRequest, number>()
  const sentAt = new Float64Array(requests.length)
  const ttft: number[] = []
  let e2eSum = 0
  let finished = 0
  const perWorker = new Array<number>(a.workers).fill(0)
  // a step runs whole when it starts; what it produced becomes visible when it ends
  const stepEnd = new Float64Array(a.workers).fill(-1)
  const firsts: number[][] = engines.map(() => [])
  const ends: number[][] = engines.map(() => [])
  const listeners: RequestListener[] = engines.map((_, e) => ({
    onToken: (r) => {
      if (r.outputTokens === 1) firsts[e]?.push(idOf.get(r) as number)
    },
    onFinish: (r) => {
      if (r.outputTokens === 1) firsts[e]?.push(idOf.get(r) as number)
      ends[e]?.push(idOf.get(r) as number)
    },
  }))
  const overlap = new Float64Array(a.workers)
  const startStep = (e: number): void => {
    const report = (engines[e] as MockEngine).step()
    stepEnd[e] = report === null ? -1 : now + report.durationMs
  }
  const route = (i: number): boolean => {
    const r = requests[i] as TraceRequest
    const n = hasher.blockCount(r)
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    hasher.hashesInto(r, lo, hi)
    const sLo = new Uint32Array(n)
    const sHi = new Uint32Array(n)
    sequenceHashesInto(lo, hi, n, sLo, sHi)
    for (let e = 0; e < a.workers; e++) overlap[e] = n > 0 ? (engines[e] as MockEngine).pool.prefixHits(lo, hi, n) : 0
    const d = s.tryRoute({ id: String(i), isl: r.input_length, overlapBlocks: overlap, seqLo: sLo, seqHi: sHi })
    if (d === null) return false
    const e = d.slot
    perWorker[e] = (perWorker[e] as number) + 1
    idOf.set((engines[e] as MockEngine).submit(expandTokens(r), Math.max(1, r.output_length), listeners[e] as RequestListener), i)
    if (stepEnd[e] === -1) startStep(e)
    return true
  }
  // requests the router queued (every worker-rank queue-busy), first come first served
  const waiting: number[] = []
  let next = 0
  for (;;) {
    let e = -1
    for (let w = 0; w < a.workers; w++) if ((stepEnd[w] as number) >= 0 && (e < 0 || (stepEnd[w] as number) < (stepEnd[e] as number))) e = w
    const arrival = next < requests.length ? ((requests[next] as TraceRequest).timestamp - t0) / a.load : Infinity
    if (e < 0 && arrival === Infinity) break
    if (e < 0 || arrival <= (stepEnd[e] as number)) {
      now = arrival
      sentAt[next] = now
      if (waiting.length > 0 || !route(next)) waiting.push(next)
      next++
      continue
    }
    now = stepEnd[e] as number
    for (const i of firsts[e] as number[]) {
      ttft.push(now - (sentAt[i] as number))
      s.markPrefillComplete(String(i))
    }
    for (const i of ends[e] as number[]) {
      e2eSum += now - (sentAt[i] as number)
      finished++
      s.free(String(i))
    }
    ;(firsts[e] as number[]).length = 0
    ;(ends[e] as number[]).length = 0
    startStep(e)
    while (waiting.length > 0 && route(waiting[0] as number)) waiting.shift()
  }
  let prompt = 0
  let cached = 0
  for (const e of engines) {
    prompt += e.stats.promptTokens
    cached += e.stats.cachedTokens
  }
  return { hitRate: prompt > 0 ? cached / prompt : 0, ttft: Float64Array.from(ttft).sort(), e2eMeanMs: finished > 0 ? e2eSum / finished : 0, perWorker }
}

function table(header: string[], rows: string[][]): string {
  const w = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)))
  const line = (cells: string[]): string => cells.map((c, i) => (i === 0 ? c.padEnd(w[i] as number) : c.padStart(w[i] as number))).join(' | ')
  return [line(header), w.map((n) => '-'.repeat(n)).join('-|-'), ...rows.map(line)].join('\n')
}

function main(): void {
  const a = parseArgs(process.argv.slice(2))
  const from = a.offset * 60_000
  const requests = readTrace(a.trace).filter((r) => r.timestamp >= from && r.timestamp < from + a.minutes * 60_000)
  if (requests.length === 0) fail('the slice holds no request')
  const bound = cacheBound(requests, BLOCK_SIZE)
  const k = Math.ceil((bound.uniqueBlocks / a.workers) * a.capacityFactor)
  console.log(
    `bench:fleet-sim — min ${a.offset} to ${a.offset + a.minutes} of the trace: ${requests.length} requests, ${a.workers} engines of ${k} KV ` +
      `blocks and a ${a.chunk}-token step, load × ${a.load}; infinite-cache bound ${(bound.hitRate * 100).toFixed(1)}%`,
  )
  const rows: string[][] = []
  const json: Record<
    string,
    { hit_rate: number; hit_rate_over_bound: number; ttft_ms: { p50: number; p90: number; p99: number }; e2e_mean_ms: number; spread: number | null }
  > = {}
  let rrP90: number | null = null
  for (const mode of a.modes) {
    const t = performance.now()
    const o = simulate(MODES[mode] as SchedulerOptionsInput, requests, a, k)
    const p = (q: number): number => percentile(o.ttft, q) ?? NaN
    if (mode === 'round-robin') rrP90 = p(0.9)
    const spread = Math.max(...o.perWorker) / Math.min(...o.perWorker)
    json[mode] = {
      hit_rate: o.hitRate,
      hit_rate_over_bound: o.hitRate / bound.hitRate,
      ttft_ms: { p50: p(0.5), p90: p(0.9), p99: p(0.99) },
      e2e_mean_ms: o.e2eMeanMs,
      spread: Number.isFinite(spread) ? spread : null,
    }
    rows.push([
      mode,
      `${(o.hitRate * 100).toFixed(1)}%`,
      (o.hitRate / bound.hitRate).toFixed(2),
      p(0.5).toFixed(0),
      p(0.9).toFixed(0),
      p(0.99).toFixed(0),
      o.e2eMeanMs.toFixed(0),
      Number.isFinite(spread) ? spread.toFixed(2) : '∞',
      ((performance.now() - t) / 1000).toFixed(1),
    ])
  }
  console.log(table(['mode', 'hit rate', '÷ bound', 'TTFT p50', 'TTFT p90', 'TTFT p99', 'E2E mean', 'spread', 'run s'], rows))
  if (rrP90 !== null) {
    const ratios = rows.filter((r) => r[0] !== 'round-robin').map((r) => `${r[0]} ${(Number(r[4]) / (rrP90 as number)).toFixed(3)}`)
    console.log(`TTFT p90 ÷ round-robin's: ${ratios.join(', ')}`)
  }
  console.log('(times in simulated ms; spread = max ÷ min requests per engine)')
  const file = join(resultsDir(), 'fleet-sim.json')
  const config = {
    minutes: a.minutes,
    offset_minutes: a.offset,
    workers: a.workers,
    load: a.load,
    capacity_factor: a.capacityFactor,
    chunk_tokens: a.chunk,
    kv_blocks_per_engine: k,
    requests: requests.length,
  }
  writeFileSync(file, `${JSON.stringify({ date: new Date().toISOString(), hit_rate_bound: bound.hitRate, config, modes: json }, null, 2)}\n`)
  console.log(`written: ${file}`)
}

main()
