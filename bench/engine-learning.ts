// Routing on engines the latency cost does not model (npm run bench:learning):
// bench:fleet-sim, in virtual time, on four fleets, each mode on the same fleet and load.
//
//   large      every engine `large` (a 70B-class profile: a shape the cost's model does not share)
//   mixed      half `large`, half `large` at half speed
//   three-way  `large`, `large@0.5` and a quarter `long-context@0.75` (for 8 workers:
//              large:3,large@0.5:3,long-context@0.75:2)
//   default    every engine the cost's own model (the reference: what the cost was built for)
//
// Modes: kv (the latency cost learning each worker-rank's engine model), kv-static (the same cost
// with the fixed default model), kv-dynamo, round-robin and least-loaded. Slices: the conversation
// trace from min 0 (fleet-sim's default slice) and from min 20, `--minutes` long each.
//
// Load. The default fleet runs at fleet-sim's default load (× 8: round-robin queues, its p90 TTFT
// several seconds). Every other fleet gets that load × its prefill capacity relative to the
// default fleet (bench/lib/engine-learning.ts: a `large` engine does a full prefill step in 2.3×
// the default's time, so a fleet of them gets × 3.5), so every fleet is about as busy as the
// default one. Round-robin still collapses on the mixed fleets: it sends the slow half as many
// requests as the fast half.
//
// Each fleet and slice is one fleet-sim process (--jobs at once; the results are the same
// whatever the machine does, only the run time changes). The targets are judged on the first
// slice; the same bars on the other slices are printed for information.
//
// Run: npm run bench:learning [-- --workers 8] [--minutes 20] [--offsets 0,20] [--fleets large,mixed,three-way,default]
//      [--modes kv,kv-static,kv-dynamo,round-robin,least-loaded] [--load 8] [--jobs 2] [--out FILE] [--svg FILE]
//      npm run bench:learning -- --replot   redraws the figure from the JSON
// Results: bench/results/engine-learning.json, the figure (TTFT by mode on the mixed fleet) in
// docs/engine-learning.svg, and printed tables.
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { availableParallelism, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { repoRoot, resultsDir, textTable } from './lib/common.js'
import { renderE2eSvg } from './lib/e2e-plot.js'
import { barResult, evaluateBars, fleetSpec, parseLearningArgs, relativeCapacity } from './lib/engine-learning.js'
import type { Bar, FleetName, FleetRun, LearningArgs } from './lib/engine-learning.js'

const SIM = join(dirname(fileURLToPath(import.meta.url)), 'fleet-sim.js')

function fail(msg: string): never {
  process.stderr.write(`bench:learning: ${msg}\n`)
  process.exit(2)
}

type Q3 = { p50: number | null; p90: number | null; p99: number | null }

/** The fields of fleet-sim's JSON read here. */
interface SimMode {
  hit_rate: number
  hit_rate_over_bound: number
  ttft_ms: Q3
  ttft_percentiles_ms: (number | null)[]
  itl_ms: Q3
  tpot_ms: Q3
  e2e_mean_ms: number
  errors: number
  spread: number | null
  preemptions: number
  classes: Record<
    string,
    {
      engines: number
      request_share: number
      uncached_prefill_share: number
      ttft_ms: Q3
      true_speed: { prefill: number; decode: number }
      learned: { prefill_speed: number; decode_speed: number } | null
    }
  >
}
interface SimResult {
  hit_rate_bound: number
  config: { requests: number; kv_blocks_per_engine: number; load: number; engine_profile: string }
  modes: Record<string, SimMode>
}

interface Run extends FleetRun {
  spec: string
  load: number
  relative_capacity: number
  requests: number
  kv_blocks_per_engine: number
  /** Requests the scheduler dropped as stale (a booking older than its limit): the scheduler's warning lines. */
  stale_warnings: number
  wall_s: number
  modes: Record<string, SimMode>
}

interface ResultJson {
  benchmark: 'engine-learning'
  date: string
  command: string
  config: { workers: number; minutes: number; offsets: number[]; default_load: number; modes: string[]; fleets: string[] }
  runs: Run[]
  bars: { offset: number; bars: Bar[] }[]
}

const sliceName = (offset: number, minutes: number): string => `min ${offset}–${offset + minutes}`

/** One fleet-sim process; resolves with its JSON. */
function runSim(args: string[], out: string): Promise<{ result: SimResult; stale: number; wallS: number }> {
  const t0 = performance.now()
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [SIM, ...args, '--out', out], { stdio: ['ignore', 'ignore', 'pipe'] })
    let err = ''
    p.stderr?.on('data', (d: Buffer) => {
      err += d.toString()
    })
    p.on('error', reject)
    p.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`fleet-sim ${args.join(' ')} exited ${code}: ${err.trim()}`))
      const stale = err.split('\n').filter((l) => l.includes('bookings_expired')).length
      resolve({ result: JSON.parse(readFileSync(out, 'utf8')) as SimResult, stale, wallS: (performance.now() - t0) / 1000 })
    })
  })
}

async function runAll(a: LearningArgs): Promise<Run[]> {
  const dir = mkdtempSync(join(tmpdir(), 'kvr-learning-'))
  const jobs = a.offsets.flatMap((offset) => a.fleets.map((fleet) => ({ offset, fleet })))
  const runs: Run[] = new Array(jobs.length)
  let next = 0
  const worker = async (): Promise<void> => {
    while (next < jobs.length) {
      const k = next++
      const { offset, fleet } = jobs[k] as { offset: number; fleet: FleetName }
      const spec = fleetSpec(fleet, a.workers)
      const cap = relativeCapacity(spec, a.workers)
      // rounded, so that the fleet-sim command it stands for is the one printed
      const load = Math.round(a.load * cap * 100) / 100
      const args = ['--workers', String(a.workers), '--minutes', String(a.minutes), '--offset', String(offset)]
      args.push('--engine-profile', spec, '--load', String(load), '--modes', a.modes.join(','))
      const { result, stale, wallS } = await runSim(args, join(dir, `${k}.json`))
      console.log(`  ${fleet} on ${sliceName(offset, a.minutes)}: node dist/bench/fleet-sim.js ${args.join(' ')}  [${wallS.toFixed(0)} s]`)
      runs[k] = {
        fleet,
        offset,
        spec,
        load,
        relative_capacity: cap,
        hit_rate_bound: result.hit_rate_bound,
        requests: result.config.requests,
        kv_blocks_per_engine: result.config.kv_blocks_per_engine,
        stale_warnings: stale,
        wall_s: wallS,
        modes: result.modes,
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: Math.min(a.jobs, jobs.length) }, worker))
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  return runs
}

const ms = (v: number | null | undefined): string => (v === null || v === undefined ? 'n/a' : v.toFixed(0))
const pct = (v: number): string => `${(v * 100).toFixed(1)}%`

function printTables(r: ResultJson): void {
  const rows: string[][] = []
  const classRows: string[][] = []
  for (const run of r.runs) {
    const slice = sliceName(run.offset, r.config.minutes)
    for (const [mode, m] of Object.entries(run.modes)) {
      rows.push([
        slice,
        run.fleet,
        String(run.load),
        mode,
        pct(m.hit_rate),
        m.hit_rate_over_bound.toFixed(2),
        ms(m.ttft_ms.p50),
        ms(m.ttft_ms.p90),
        ms(m.ttft_ms.p99),
        m.itl_ms.p90 === null ? 'n/a' : m.itl_ms.p90.toFixed(1),
        m.tpot_ms.p90 === null ? 'n/a' : m.tpot_ms.p90.toFixed(1),
        String(m.errors),
        m.spread === null ? '∞' : m.spread.toFixed(2),
      ])
      const classes = Object.entries(m.classes)
      if (classes.length > 1)
        for (const [label, c] of classes)
          classRows.push([
            slice,
            run.fleet,
            mode,
            label,
            String(c.engines),
            pct(c.request_share),
            pct(c.uncached_prefill_share),
            ms(c.ttft_ms.p90),
            `${c.true_speed.prefill.toFixed(2)} / ${c.true_speed.decode.toFixed(2)}`,
            c.learned === null ? '–' : `${c.learned.prefill_speed.toFixed(2)} / ${c.learned.decode_speed.toFixed(2)}`,
          ])
    }
  }
  console.log(`\nper fleet and mode (${r.config.workers} workers; times in simulated ms)`)
  console.log(
    textTable(
      ['slice', 'fleet', 'load', 'mode', 'hit rate', '÷ bound', 'TTFT p50', 'TTFT p90', 'TTFT p99', 'ITL p90', 'TPOT p90', 'errors', 'spread'],
      rows,
      4,
    ),
  )
  console.log("ITL: every gap between two tokens of a request; TPOT: each request's mean gap; spread: max ÷ min requests per engine")
  const fleets = [...new Set(r.runs.map((x) => `${x.fleet} = --engine-profile ${x.spec} (capacity ${x.relative_capacity.toFixed(3)} × default's)`))]
  console.log(`fleets: ${fleets.join('; ')}`)
  const stale = r.runs.filter((x) => x.stale_warnings > 0)
  if (stale.length > 0) {
    const where = stale.map((x) => `${x.fleet} on ${sliceName(x.offset, r.config.minutes)}`).join(', ')
    console.log(`the scheduler freed bookings older than its stale limit (a request longer than 300 s simulated) in: ${where}`)
  }
  if (classRows.length > 0) {
    console.log('\nper timing class (profile@speed): its share of the requests and of the uncached prefill tokens, its p90 TTFT, its speeds')
    console.log(textTable(['slice', 'fleet', 'mode', 'class', 'engines', 'requests', 'uncached prefill', 'TTFT p90', 'speed: true', 'learned'], classRows, 4))
    console.log(
      "speed: prefill / decode against the default model's (1 = as fast; a fresh 1,024-token prefill, a decode step at KV usage 0.5): " +
        "the profile's own, and the scheduler's learned model at the end of the run (means over the class's engines)",
    )
  }
  for (const { offset, bars } of r.bars) {
    const first = offset === r.config.offsets[0]
    console.log(`\n${first ? 'the targets' : 'the same targets, for information'}: ${sliceName(offset, r.config.minutes)}`)
    console.log(
      textTable(
        ['bar', 'value', 'target', 'result'],
        bars.map((b) => [b.bar, b.value, b.target, barResult(b)]),
      ),
    )
  }
}

/** TTFT CDF and hit rate by mode on the mixed fleet, first slice; null without that run. */
function plot(r: ResultJson): string | null {
  const run = r.runs.find((x) => x.fleet === 'mixed' && x.offset === r.config.offsets[0])
  if (run === undefined) return null
  return renderE2eSvg({
    title: `Routing on engines the cost does not model: ${r.config.workers} engines, --engine-profile ${run.spec}`,
    subtitle:
      `bench:fleet-sim (virtual time), ${sliceName(run.offset, r.config.minutes)} of the Mooncake conversation trace (${run.requests} requests), ` +
      `load × ${run.load}, ${run.kv_blocks_per_engine} KV blocks/engine; ${r.date.slice(0, 10)}`,
    series: Object.entries(run.modes).map(([mode, m]) => ({
      mode,
      ttftMs: m.ttft_percentiles_ms.filter((x): x is number => x !== null),
      hitRate: m.hit_rate,
      note: `p50 ${ms(m.ttft_ms.p50)}  p90 ${ms(m.ttft_ms.p90)}  p99 ${ms(m.ttft_ms.p99)} ms`,
    })),
    bound: run.hit_rate_bound,
    ttftLabel: 'TTFT, simulated time (log scale)',
  })
}

async function main(): Promise<void> {
  let a: LearningArgs
  try {
    a = parseLearningArgs(process.argv.slice(2), availableParallelism())
  } catch (err) {
    fail((err as Error).message)
  }
  const out = a.out ?? join(resultsDir(), 'engine-learning.json')
  const svg = a.svg ?? join(repoRoot(), 'docs', 'engine-learning.svg')
  if (a.replot) {
    const r = JSON.parse(readFileSync(out, 'utf8')) as ResultJson
    const s = plot(r)
    if (s === null) fail(`${out} holds no mixed fleet run`)
    writeFileSync(svg, s)
    console.log(`written: ${svg}`)
    return
  }
  const command = `npm run bench:learning${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`
  console.log(
    `bench:learning — ${a.workers} workers; fleets ${a.fleets.join(', ')}; modes ${a.modes.join(', ')}; ` +
      `slices ${a.offsets.map((o) => sliceName(o, a.minutes)).join(', ')}; ` +
      `default fleet at load × ${a.load}, the others scaled by capacity; ${a.jobs} at once`,
  )
  const t0 = performance.now()
  const runs = await runAll(a)
  const r: ResultJson = {
    benchmark: 'engine-learning',
    date: new Date().toISOString(),
    command,
    config: { workers: a.workers, minutes: a.minutes, offsets: a.offsets, default_load: a.load, modes: a.modes, fleets: a.fleets },
    runs,
    bars: a.offsets.map((offset) => ({ offset, bars: evaluateBars(runs, offset) })),
  }
  printTables(r)
  writeFileSync(out, `${JSON.stringify(r, null, 2)}\n`)
  console.log(`\nwritten: ${out}`)
  const s = plot(r)
  if (s !== null) {
    writeFileSync(svg, s)
    console.log(`written: ${svg}`)
  }
  console.log(`(${((performance.now() - t0) / 1000).toFixed(0)} s)`)
}

main().catch((err: unknown) => {
  process.stderr.write(`bench:learning: ${(err as Error).message}\n`)
  process.exit(1)
})
