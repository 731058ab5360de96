// What the router's V8 flags cost in its worker threads: a process started with them (as the
// shebang starts `kv-router`) runs a pool of index shards through the Mooncake trace's events,
// replayed `--passes` times with every worker removed in between, and reports its peak RSS.
// Three kinds of process, alternated over `--reps` repetitions:
//   shipped      the router's flags, then workerHeapsAtDefaults() before the shards start, as
//                src/main.ts does: the flags' heap sizes stay the main thread's
//   every-thread the router's flags with nothing given back: every shard gets the 64 MB
//                semi-spaces and the old generation floor (the router before session 20)
//   defaults     no flags at all: V8's own sizes everywhere
// Run: `npm run bench:thread-heaps [-- --shards N --passes P --limit L --reps R]`.
// Results: bench/results/thread-heaps.json and a printed table.
import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { once } from 'node:events'
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { median, repoRoot } from './common.js'
import { ROUTER_V8_FLAGS, workerHeapsAtDefaults } from '../src/runtime/v8-flags.js'

type Kind = 'shipped' | 'every-thread' | 'defaults'
const KINDS: readonly Kind[] = ['shipped', 'every-thread', 'defaults']

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`)
  if (i < 0) return dflt
  const v = Number(process.argv[i + 1])
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${name} needs a positive integer`)
  return v
}

interface ChildResult {
  kind: Kind
  reset: string[]
  /** The kernel's high-water mark of the process's resident memory. */
  maxRssMb: number
  /** Resident memory before the shards started (the workload is built by then). */
  rssBeforeShardsMb: number
  seconds: number
  entries: number
}

async function runChild(kind: Kind, shards: number, passes: number, limit: number): Promise<void> {
  const reset = kind === 'shipped' ? workerHeapsAtDefaults() : []
  const { buildIndexWorkload } = await import('./index-workload.js')
  const { ShardPool } = await import('../src/shards/pool.js')
  const workload = buildIndexWorkload({ workers: 64, limit })
  const rssBeforeShardsMb = process.memoryUsage().rss / 2 ** 20
  const pool = await ShardPool.start({ shards })
  const t0 = performance.now()
  let entries = 0
  for (let pass = 0; pass < passes; pass++) {
    for (const op of workload.ops) {
      if (op.kind !== 'event') continue
      if (!pool.push(op.bytes) && pool.pendingMessages > 64) await once(pool, 'drain')
    }
    while (pool.pendingMessages > 0) await once(pool, 'drain')
    await pool.flush()
    entries = Math.max(
      entries,
      pool.counters().reduce((s, c) => s + c.blocks, 0),
    )
    await Promise.all(workload.workerIds.map((w) => pool.removeWorker(w)))
  }
  const seconds = (performance.now() - t0) / 1000
  const c = pool.counters()
  if (c.reduce((s, x) => s + x.malformed + x.lost, 0) !== 0) throw new Error('bench: events were malformed or lost')
  const maxRssMb = process.resourceUsage().maxRSS / 1024
  await pool.close()
  const out: ChildResult = { kind, reset, maxRssMb, rssBeforeShardsMb, seconds, entries }
  process.stdout.write(`${JSON.stringify(out)}\n`)
}

function main(): void {
  const shards = arg('shards', 4)
  const passes = arg('passes', 20)
  const limit = arg('limit', 6000)
  const reps = arg('reps', 3)
  const self = fileURLToPath(import.meta.url)
  const results: ChildResult[] = []
  for (let r = 0; r < reps; r++) {
    for (const kind of KINDS) {
      const flags = kind === 'defaults' ? [] : [...ROUTER_V8_FLAGS]
      const p = spawnSync(process.execPath, [...flags, self, '--child', kind, '--shards', String(shards), '--passes', String(passes), '--limit', String(limit)], {
        encoding: 'utf8',
        maxBuffer: 1 << 24,
      })
      if (p.status !== 0) throw new Error(`${kind}: exited ${p.status}: ${p.stderr}`)
      const line = p.stdout.trim().split('\n').pop() ?? ''
      const res = JSON.parse(line) as ChildResult
      results.push(res)
      process.stdout.write(`rep ${r + 1} ${kind.padEnd(12)} max RSS ${res.maxRssMb.toFixed(0)} MB (before the shards ${res.rssBeforeShardsMb.toFixed(0)} MB), ${res.seconds.toFixed(1)} s\n`)
    }
  }
  const summary = KINDS.map((kind) => {
    const rs = results.filter((x) => x.kind === kind)
    const maxRssMbMedian = median(rs.map((x) => x.maxRssMb))
    return { kind, maxRssMbMedian, addedMbMedian: median(rs.map((x) => x.maxRssMb - x.rssBeforeShardsMb)), secondsMedian: median(rs.map((x) => x.seconds)), reset: rs[0]?.reset ?? [] }
  })
  const shipped = summary.find((s) => s.kind === 'shipped')?.maxRssMbMedian ?? 0
  console.log(`\n${shards} shards, ${passes} passes over the first ${limit} requests' events; medians of ${reps}`)
  console.log('process      | max RSS MB | added while the shards ran, MB | above shipped, per shard MB | replay s')
  for (const s of summary)
    console.log(
      `${s.kind.padEnd(12)} | ${s.maxRssMbMedian.toFixed(0).padStart(10)} | ${s.addedMbMedian.toFixed(0).padStart(31)} | ${((s.maxRssMbMedian - shipped) / shards).toFixed(1).padStart(27)} | ${s.secondsMedian.toFixed(1)}`,
    )
  const dir = join(repoRoot(), 'bench', 'results')
  mkdirSync(dir, { recursive: true })
  writeFileSync(join(dir, 'thread-heaps.json'), JSON.stringify({ node: process.version, shards, passes, limit, reps, summary, runs: results }, null, 2))
}

const ci = process.argv.indexOf('--child')
if (ci >= 0) await runChild(process.argv[ci + 1] as Kind, arg('shards', 4), arg('passes', 20), arg('limit', 6000))
else main()
