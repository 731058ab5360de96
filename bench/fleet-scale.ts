// How the router's costs grow with the fleet (npm run bench:fleet-scale): bench:fleet-sim run at
// several fleet sizes, each in its own process (a clean heap for the memory figures), with the
// overlaps read from a KvIndex fed with the engines' own KV events. The fleets are W workers × R
// dp ranks; every size gets the same load per worker-rank: one copy of the trace slice, under
// disjoint block ids, per `--ranks-per-copy` worker-ranks, and engines of `--kv-blocks` blocks. Reported per size and mode: the route
// decision (Scheduler.tryRoute) p50/p99 µs, replayed alone (--replay-decisions) and as timed
// inside the simulation, find_matches p50/p99 µs, the index's event apply in
// block ops/s, and what the index and the scheduler hold in memory at the end — all wall time on
// this machine, so compare sizes within one run. The figure (log-log) goes to
// bench/results/fleet-scale.svg.
//
// Run: npm run bench:fleet-scale [-- --ranks 64,1024,7000] [--dp-size 8] [--ranks-per-copy 32]
//      [--kv-blocks 4096] [--minutes 1] [--offset 0] [--modes kv,kv-full-scan]
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { resultsDir, textTable } from './lib/common.js'
import { renderScaleSvg } from './lib/scale-plot.js'
import type { ScaleSeries } from './lib/scale-plot.js'

interface Args {
  ranks: number[]
  dpSize: number
  ranksPerCopy: number
  kvBlocks: number
  minutes: number
  offset: number
  modes: string[]
}

function fail(msg: string): never {
  process.stderr.write(`bench:fleet-scale: ${msg}\n`)
  process.exit(2)
}

function parseArgs(argv: string[]): Args {
  const v = new Map<string, string>()
  const known = ['--ranks', '--dp-size', '--ranks-per-copy', '--kv-blocks', '--minutes', '--offset', '--modes']
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (!known.includes(a)) fail(`unknown option ${JSON.stringify(a)} (known: ${known.join(' ')})`)
    const value = argv[++i]
    if (value === undefined) fail(`${a} needs a value`)
    v.set(a, value)
  }
  const int = (name: string, s: string): number => {
    const n = Number(s)
    if (s.trim() === '' || !Number.isInteger(n) || n < 1) fail(`${name} must be an integer ≥ 1, got ${JSON.stringify(s)}`)
    return n
  }
  const dpSize = int('--dp-size', v.get('--dp-size') ?? '8')
  const ranks = (v.get('--ranks') ?? '64,1024,7000').split(',').map((s) => int('--ranks', s))
  for (const r of ranks) if (r % dpSize !== 0) fail(`--ranks: ${r} is not a multiple of --dp-size ${dpSize}`)
  const minutes = Number(v.get('--minutes') ?? '1')
  if (!(minutes > 0)) fail('--minutes must be a number > 0')
  const offset = Number(v.get('--offset') ?? '0')
  if (!(offset >= 0)) fail('--offset must be a number ≥ 0')
  return {
    ranks,
    dpSize,
    ranksPerCopy: int('--ranks-per-copy', v.get('--ranks-per-copy') ?? '32'),
    kvBlocks: int('--kv-blocks', v.get('--kv-blocks') ?? '4096'),
    minutes,
    offset,
    modes: (v.get('--modes') ?? 'kv').split(',').filter((m) => m !== ''),
  }
}

interface SimMode {
  hit_rate_over_bound: number
  wall: {
    decisions: number
    decision_us: { p50: number; p99: number }
    replayed_decision_us: { p50: number; p99: number } | null
    find_matches_us: { p50: number; p99: number } | null
    apply_block_ops_per_sec: number | null
    index_bytes: number | null
    scheduler_bytes: number | null
    run_s: number
  }
}

function main(): void {
  const a = parseArgs(process.argv.slice(2))
  const sim = join(fileURLToPath(new URL('.', import.meta.url)), 'fleet-sim.js')
  const dir = mkdtempSync(join(tmpdir(), 'kvr-fleet-scale-'))
  const results: { ranks: number; copies: number; requests: number; modes: Record<string, SimMode> }[] = []
  try {
    for (const ranks of a.ranks) {
      const copies = Math.max(1, Math.round(ranks / a.ranksPerCopy))
      const out = join(dir, `${ranks}.json`)
      const args = [
        sim,
        '--index',
        '--replay-decisions',
        '--workers',
        String(ranks / a.dpSize),
        '--dp-size',
        String(a.dpSize),
        '--duplicate',
        String(copies),
        '--kv-blocks',
        String(a.kvBlocks),
        '--minutes',
        String(a.minutes),
        '--offset',
        String(a.offset),
        '--modes',
        a.modes.join(','),
        '--out',
        out,
      ]
      process.stdout.write(`${ranks} worker-ranks (${ranks / a.dpSize} workers × ${a.dpSize}), ${copies} copies of the slice…\n`)
      const r = spawnSync(process.execPath, args, { stdio: ['ignore', 'ignore', 'inherit'] })
      if (r.status !== 0) fail(`bench:fleet-sim exited ${String(r.status)} at ${ranks} worker-ranks`)
      const j = JSON.parse(readFileSync(out, 'utf8')) as { config: { requests: number }; modes: Record<string, SimMode> }
      results.push({ ranks, copies, requests: j.config.requests, modes: j.modes })
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
  const f1 = (x: number | null | undefined): string => (x === null || x === undefined || !Number.isFinite(x) ? '–' : x.toFixed(1))
  const mib = (x: number | null): string => (x === null ? '–' : (x / 2 ** 20).toFixed(1))
  const header = [
    'worker-ranks',
    'requests',
    'mode',
    '÷ bound',
    'decision p50 µs',
    'p99 µs',
    'in the simulation: p50 µs',
    'p99 µs',
    'find_matches p50 µs',
    'p99 µs',
    'apply block ops/s',
    'index MiB',
    'scheduler MiB',
    'run s',
  ]
  const rows: string[][] = []
  for (const r of results)
    for (const [mode, m] of Object.entries(r.modes))
      rows.push([
        r.ranks.toLocaleString('en-US'),
        r.requests.toLocaleString('en-US'),
        mode,
        m.hit_rate_over_bound.toFixed(2),
        f1(m.wall.replayed_decision_us?.p50),
        f1(m.wall.replayed_decision_us?.p99),
        f1(m.wall.decision_us.p50),
        f1(m.wall.decision_us.p99),
        f1(m.wall.find_matches_us?.p50),
        f1(m.wall.find_matches_us?.p99),
        m.wall.apply_block_ops_per_sec === null ? '–' : Math.round(m.wall.apply_block_ops_per_sec).toLocaleString('en-US'),
        mib(m.wall.index_bytes),
        mib(m.wall.scheduler_bytes),
        m.wall.run_s.toFixed(0),
      ])
  console.log(textTable(header, rows, 3))
  const at = (mode: string, f: (m: SimMode) => number | null | undefined): (readonly [number, number])[] =>
    results.flatMap((r) => {
      const m = r.modes[mode]
      const y = m === undefined ? undefined : f(m)
      return y === null || y === undefined ? [] : [[r.ranks, y] as const]
    })
  const series: ScaleSeries[] = []
  for (const mode of a.modes) {
    series.push({ name: `${mode}: decision p99`, unit: 'µs', points: at(mode, (m) => m.wall.replayed_decision_us?.p99) })
    series.push({ name: `${mode}: decision p50`, unit: 'µs', points: at(mode, (m) => m.wall.replayed_decision_us?.p50) })
  }
  const first = a.modes[0] as string
  series.push({ name: 'find_matches p99', unit: 'µs', points: at(first, (m) => m.wall.find_matches_us?.p99) })
  series.push({ name: 'index memory', unit: 'MiB', points: at(first, (m) => (m.wall.index_bytes === null ? null : m.wall.index_bytes / 2 ** 20)) })
  series.push({ name: 'scheduler memory', unit: 'MiB', points: at(first, (m) => (m.wall.scheduler_bytes === null ? null : m.wall.scheduler_bytes / 2 ** 20)) })
  const svg = renderScaleSvg(
    'What a request costs the router, by fleet size',
    `bench:fleet-sim, ${a.minutes} min of the conversation trace per ${a.ranksPerCopy} worker-ranks, ` +
      `${a.dpSize} dp ranks per worker; wall time on this machine`,
    series,
  )
  const svgFile = join(resultsDir(), 'fleet-scale.svg')
  writeFileSync(svgFile, svg)
  const file = join(resultsDir(), 'fleet-scale.json')
  writeFileSync(file, `${JSON.stringify({ date: new Date().toISOString(), config: a, results }, null, 2)}\n`)
  console.log(`written: ${file}, ${svgFile}`)
}

main()
