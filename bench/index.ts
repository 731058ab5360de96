// The index benchmark: the Mooncake conversation trace, expanded to router blocks and run
// through one simulated engine block pool per worker (bench/lib/index-workload.ts),
// replayed in trace order — each request's lookup, then the KV events its engine published —
// against (a) the single-threaded index on the main thread and (b) the shard pool with 1, 2 and
// 4 shards. Run: `npm run bench:index [-- --limit N --workers W --reps R --only-shards S
// --shard-spin-us U --query-spin-us U]`.
//
// What is measured, per configuration, over the whole replay:
//   block_ops_per_sec    event blocks (stored + removed) / wall time, the final drain included
//                        (the clock stops when every event has been applied)
//   request_ops_per_sec  (events + lookups) / the same wall time
//   lookup_us            p50/p99 of each lookup from call to merged answer, fan-out included;
//                        one lookup is in flight at a time, each issued at its place in the
//                        trace, while the events after it keep flowing to the shards (the
//                        stream waits only when the next lookup comes up before the previous
//                        one is answered)
//   ring_full            pushes that found the ring full and waited (never dropped)
//   one_shard_paced_at_half_rate
//                        1 shard again, its events paced at half the rate it reached: the
//                        lookup latency below saturation, where a router normally runs
// and once: bytes per cached (block, worker) entry of the index after the first replay.
//
// Every configuration keeps one index (one pool) for the whole benchmark and replays the trace
// 1 + `reps` times, removing every worker in between. The first pass is reported apart as
// `cold`: each shard is a fresh isolate whose code is not yet optimised, and in a replay of
// about a second that warm-up is a large share (V8's compiler and GC threads preempt the shard
// thread over a thousand times in a cold pass, and lookups wait behind it). A router runs for
// days, so the warm passes are the headline. On a shared machine the warm passes alternate over
// the configurations and medians are reported.
// Results: bench/results/index.json and a printed table.
//
// `--base DIR` measures another build beside this one in the same run (DIR: its dist/, e.g. a
// build of main): its single-threaded index and shard pools become targets of their own, their
// passes alternating with this build's, and the ratios of this build to it (block ops/s, lookup
// p99, bytes per entry) are printed and written under `versus_base`.
//
// `--mooncake` runs instead the workload of Dynamo's indexer benchmark (mooncake_bench) and reports
// its units beside ours, with an achieved-vs-offered sweep (bench/lib/index-mooncake.ts):
// `npm run bench:index -- --mooncake [--workers W --gpu-blocks B --block-size S --limit N --reps R
// --length-factor F --duplication D --seed X --sweep-steps K --sweep-min-ms A --sweep-max-ms B
// --no-sweep --only-shards S --no-shards]`, into bench/results/index-mooncake.json. With `--profile P`
// it profiles the single-threaded index instead over P saturated passes (`--with-decode`: fed JSON),
// prints the functions by self time and writes the last pass's profile to
// bench/results/index-mooncake.cpuprofile.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { availableParallelism } from 'node:os'
import { once } from 'node:events'
import { buildIndexWorkload, type WorkloadOp } from './lib/index-workload.js'
import { resolve } from 'node:path'
import { KvIndex } from '../src/index/kv-index.js'
import { EventDecoder } from '../src/codec/event-decoder.js'
import { ShardPool } from '../src/shards/pool.js'
import { median, resultsDir } from './lib/common.js'
import { quantileOf } from './lib/stats.js'
import { u64Hi, u64Lo } from '../src/codec/u64.js'
import { formatMooncakeTables, profileSingle, runMooncakeBench } from './lib/index-mooncake.js'

function arg(name: string, dflt: number | undefined): number | undefined {
  const i = process.argv.indexOf(`--${name}`)
  if (i < 0) return dflt
  const v = Number(process.argv[i + 1])
  if (!Number.isFinite(v) || v <= 0) throw new Error(`--${name} needs a positive number`)
  return v
}

if (process.argv.includes('--mooncake')) {
  const workers = arg('workers', undefined)
  const limit = arg('limit', undefined)
  const gpuBlocks = arg('gpu-blocks', undefined)
  const blockSize = arg('block-size', undefined)
  const lengthFactor = arg('length-factor', undefined)
  const duplication = arg('duplication', undefined)
  const seed = arg('seed', undefined)
  const sweepMinMs = arg('sweep-min-ms', undefined)
  const sweepMaxMs = arg('sweep-max-ms', undefined)
  const only = arg('only-shards', undefined)
  const profilePasses = arg('profile', undefined)
  const workloadOptions = {
    ...(workers !== undefined ? { workers } : {}),
    ...(limit !== undefined ? { limit } : {}),
    ...(gpuBlocks !== undefined ? { gpuBlocks } : {}),
    ...(blockSize !== undefined ? { blockSize } : {}),
    ...(lengthFactor !== undefined ? { lengthFactor } : {}),
    ...(duplication !== undefined ? { duplication } : {}),
    ...(seed !== undefined ? { seed } : {}),
  }
  if (profilePasses !== undefined) {
    // the single-threaded index alone under the profiler; the JSON decode too with --with-decode
    const decode = process.argv.includes('--with-decode')
    const p = await profileSingle(workloadOptions, profilePasses, !decode)
    // the last pass's profile, for a flame graph (Chrome DevTools, speedscope)
    writeFileSync(join(resultsDir(), 'index-mooncake.cpuprofile'), JSON.stringify(p.profiles[p.profiles.length - 1]))
    const c = p.workload.counts
    console.log(
      `single-thread index${decode ? ' with JSON decode' : ' alone'}, ${profilePasses} saturated passes: ${p.seconds.toFixed(2)} s, ` +
        `${((profilePasses * (c.lookups + c.events)) / p.seconds / 1e6).toFixed(3)} M ops/s`,
    )
    console.log('self time      share  function')
    for (const r of p.rows.slice(0, 25)) console.log(`${r.self_ms.toFixed(1).padStart(9)} ms ${(r.share * 100).toFixed(1).padStart(6)}%  ${r.fn}`)
    console.log('wrote bench/results/index-mooncake.cpuprofile (the last pass)')
    process.exit(0)
  }
  const result = await runMooncakeBench(
    {
      reps: arg('reps', 3) as number,
      sweepSteps: process.argv.includes('--no-sweep') ? 0 : (arg('sweep-steps', 8) as number),
      shards: process.argv.includes('--no-shards') ? [] : only === undefined ? [1, 2] : [only],
      ...workloadOptions,
      ...(sweepMinMs !== undefined ? { sweepMinMs } : {}),
      ...(sweepMaxMs !== undefined ? { sweepMaxMs } : {}),
    },
    (s) => console.error(s),
  )
  writeFileSync(join(resultsDir(), 'index-mooncake.json'), JSON.stringify(result, null, 2) + '\n')
  console.log(formatMooncakeTables(result))
  console.log('wrote bench/results/index-mooncake.json')
  process.exit(0)
}

/** What a target is built from: this build's classes, or those of the build `--base` names. */
interface Impl {
  /** '' for this build, 'base ' for the other. */
  prefix: string
  KvIndex: typeof KvIndex
  EventDecoder: typeof EventDecoder
  ShardPool: typeof ShardPool
}

function textArg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`)
  if (i < 0) return undefined
  const v = process.argv[i + 1]
  if (v === undefined || v.startsWith('--')) throw new Error(`--${name} needs a value`)
  return v
}

const baseDir = textArg('base')
const impls: Impl[] = [{ prefix: '', KvIndex, EventDecoder, ShardPool }]
if (baseDir !== undefined) {
  const dir = resolve(baseDir)
  const load = async <T>(rel: string): Promise<T> => (await import(pathToFileURL(join(dir, rel)).href)) as T
  impls.push({
    prefix: 'base ',
    KvIndex: (await load<{ KvIndex: typeof KvIndex }>('src/index/kv-index.js')).KvIndex,
    EventDecoder: (await load<{ EventDecoder: typeof EventDecoder }>('src/codec/event-decoder.js')).EventDecoder,
    ShardPool: (await load<{ ShardPool: typeof ShardPool }>('src/shards/pool.js')).ShardPool,
  })
}

const limit = arg('limit', undefined)
const workers = arg('workers', 64) as number
const reps = arg('reps', 3) as number
const shardCounts = [1, 2, 4]
const shardSpinUs = arg('shard-spin-us', undefined)
const querySpinUs = arg('query-spin-us', undefined)
const only = arg('only-shards', undefined)

interface RunResult {
  seconds: number
  lookupP50: number
  lookupP99: number
  ringFull: number
  bytesPerBlock: number
  entries: number
}

const workload = buildIndexWorkload({ workers, ...(limit !== undefined ? { limit } : {}) })
const ops: WorkloadOp[] = workload.ops
const counts = workload.counts
const lookups = new Float64Array(counts.lookups)

/**
 * One index under test. Every target lives for the whole benchmark and replays the trace
 * several times: the first pass meets a cold JIT (a fresh isolate for every shard thread) and
 * empty tables, so it is reported apart as `cold`; between passes every worker is removed, which
 * is a product operation, and the next pass starts from an empty index again.
 */
interface Target {
  readonly name: string
  pass(paceBlocksPerSec?: number): Promise<RunResult>
  clear(): Promise<void>
  close(): Promise<void>
}

class SingleTarget implements Target {
  readonly name: string
  private readonly ix: KvIndex
  private readonly dec: EventDecoder

  constructor(impl: Impl) {
    this.name = `${impl.prefix}single-thread`
    this.ix = new impl.KvIndex()
    this.dec = new impl.EventDecoder()
  }

  pass(): Promise<RunResult> {
    const ix = this.ix
    const dec = this.dec
    let li = 0
    const t0 = performance.now()
    for (const op of ops) {
      if (op.kind === 'event') {
        ix.apply(dec.decode(op.bytes))
      } else {
        const q0 = performance.now()
        ix.findMatches(op.lo, op.hi, op.n)
        lookups[li++] = (performance.now() - q0) * 1000
      }
    }
    const seconds = (performance.now() - t0) / 1000
    return Promise.resolve({
      seconds,
      lookupP50: quantileOf(lookups.subarray(0, li), 0.5),
      lookupP99: quantileOf(lookups.subarray(0, li), 0.99),
      ringFull: 0,
      bytesPerBlock: ix.bytes / ix.liveEntries,
      entries: ix.liveEntries,
    })
  }

  clear(): Promise<void> {
    for (const w of workload.workerIds) this.ix.removeWorker(u64Lo(w), u64Hi(w))
    if (this.ix.liveEntries !== 0) throw new Error('bench: the single index kept entries after every worker was removed')
    return Promise.resolve()
  }

  close(): Promise<void> {
    return Promise.resolve()
  }
}

class PoolTarget implements Target {
  readonly name: string
  private ringFullBefore = 0

  private constructor(
    private readonly pool: ShardPool,
    shards: number,
    prefix: string,
  ) {
    this.name = `${prefix}${shards}-shard`
  }

  static async start(impl: Impl, shards: number): Promise<PoolTarget> {
    return new PoolTarget(
      await impl.ShardPool.start({ shards, ...(shardSpinUs !== undefined ? { shardSpinUs } : {}), ...(querySpinUs !== undefined ? { querySpinUs } : {}) }),
      shards,
      impl.prefix,
    )
  }

  /**
   * One replay. With `paceBlocksPerSec`, events are released no faster than that (in bursts on
   * a 1 ms timer), so the lookups meet shards that are busy but not saturated: the latency a
   * router sees below its event capacity, not at it.
   */
  async pass(paceBlocksPerSec?: number): Promise<RunResult> {
    const pool = this.pool
    let li = 0
    let pending = false
    const lookup = async (op: WorkloadOp & { kind: 'lookup' }): Promise<void> => {
      pending = true
      const q0 = performance.now()
      await pool.query(op.lo, op.hi, op.n)
      lookups[li++] = (performance.now() - q0) * 1000
      pending = false
    }
    let inflight: Promise<void> = Promise.resolve()
    const t0 = performance.now()
    let blocksSent = 0
    for (const op of ops) {
      if (op.kind === 'event') {
        // While a lookup is out, give the event loop a turn per event: the pool rings the shards
        // and collects answers in event-loop callbacks, so a loop that kept pushing would count
        // its own pushing into the lookup's latency.
        if (pending) await new Promise((r) => setImmediate(r))
        if (paceBlocksPerSec !== undefined) {
          blocksSent += op.blocks
          while (blocksSent / paceBlocksPerSec > (performance.now() - t0) / 1000) await new Promise((r) => setTimeout(r, 1))
        }
        // a full ring queues the message in the pool; sleep until the shard has taken the queue
        if (!pool.push(op.bytes) && pool.pendingMessages > 64) await once(pool, 'drain')
      } else {
        // One lookup in flight at a time, issued at its place in the trace. The events after it
        // keep flowing while it is out (a router's event intake does not wait for its HTTP
        // requests); the stream stops only when the next lookup comes up before this one is done.
        await inflight
        inflight = lookup(op)
        // handled when awaited; this keeps a failure from being an unhandled rejection meanwhile
        inflight.catch(() => undefined)
      }
    }
    await inflight
    while (pool.pendingMessages > 0) await once(pool, 'drain')
    await pool.flush()
    const seconds = (performance.now() - t0) / 1000
    const c = pool.counters()
    const stats = await pool.stats()
    const entries = c.reduce((s, x) => s + x.blocks, 0)
    const bytes = stats.reduce((s, x) => s + x.bytes, 0)
    const ringFullTotal = c.reduce((s, x) => s + x.ringFull, 0)
    const ringFull = ringFullTotal - this.ringFullBefore
    this.ringFullBefore = ringFullTotal
    if (c.reduce((s, x) => s + x.malformed + x.lost, 0) !== 0) throw new Error('bench: events were malformed or lost')
    return {
      seconds,
      lookupP50: quantileOf(lookups.subarray(0, li), 0.5),
      lookupP99: quantileOf(lookups.subarray(0, li), 0.99),
      ringFull,
      bytesPerBlock: bytes / entries,
      entries,
    }
  }

  async clear(): Promise<void> {
    await Promise.all(workload.workerIds.map((w) => this.pool.removeWorker(w)))
    const left = this.pool.counters().reduce((s, x) => s + x.blocks, 0)
    if (left !== 0) throw new Error(`bench: ${this.name} kept ${left} entries after every worker was removed`)
  }

  async close(): Promise<void> {
    await this.pool.close()
  }
}

const targets: Target[] = impls.map((impl) => new SingleTarget(impl))
for (const s of shardCounts) if (only === undefined || only === s) for (const impl of impls) targets.push(await PoolTarget.start(impl, s))
const configs = targets.map((t) => t.name)
const cold = new Map<string, RunResult>()
const runs = new Map<string, RunResult[]>(configs.map((c) => [c, []]))
// pass 0 is the cold one; the measured passes alternate over the targets, so a slow phase of
// the shared machine lands on all of them rather than on one, in turn forwards and backwards, so
// no target always follows the same one
for (let r = 0; r <= reps; r++) {
  for (const t of r % 2 === 0 ? targets : [...targets].reverse()) {
    const res = await t.pass()
    await t.clear()
    if (r === 0) cold.set(t.name, res)
    else (runs.get(t.name) as RunResult[]).push(res)
  }
}

// The lookup latency below saturation: one shard, its events paced at half the rate it reached
// above (median), so the shard is busy about half the time instead of always.
const oneShard = runs.get('1-shard')
const oneShardTarget = targets.find((t) => t.name === '1-shard')
let paced: { pace_block_ops_per_sec: number; lookup_us: { p50: number; p99: number }; seconds: number } | undefined
if (oneShard !== undefined && oneShardTarget !== undefined && !process.argv.includes('--no-paced')) {
  const rate = Math.round(counts.blocks / median(oneShard.map((x) => x.seconds)) / 2)
  const rs: RunResult[] = []
  for (let r = 0; r < reps; r++) {
    rs.push(await oneShardTarget.pass(rate))
    await oneShardTarget.clear()
  }
  paced = {
    pace_block_ops_per_sec: rate,
    lookup_us: { p50: median(rs.map((x) => x.lookupP50)), p99: median(rs.map((x) => x.lookupP99)) },
    seconds: median(rs.map((x) => x.seconds)),
  }
}
for (const t of targets) await t.close()

const totalOps = counts.events + counts.lookups
interface Summary {
  block_ops_per_sec: number
  request_ops_per_sec: number
  lookup_us: { p50: number; p99: number }
  ring_full: number
  seconds: number
  /** The first pass: cold JIT, empty tables. */
  cold: { block_ops_per_sec: number; lookup_us: { p50: number; p99: number } }
}
const summary: Record<string, Summary> = {}
for (const c of configs) {
  const rs = runs.get(c) as RunResult[]
  const first = cold.get(c) as RunResult
  const sec = median(rs.map((x) => x.seconds))
  summary[c] = {
    seconds: sec,
    block_ops_per_sec: counts.blocks / sec,
    request_ops_per_sec: totalOps / sec,
    lookup_us: { p50: median(rs.map((x) => x.lookupP50)), p99: median(rs.map((x) => x.lookupP99)) },
    ring_full: median(rs.map((x) => x.ringFull)),
    cold: { block_ops_per_sec: counts.blocks / first.seconds, lookup_us: { p50: first.lookupP50, p99: first.lookupP99 } },
  }
}
// memory is read after the cold pass: a fresh index holding the trace, no reuse of freed slots
const firstSingle = cold.get('single-thread') as RunResult

interface Versus {
  /** This build's rate / the base's, median over the alternated pairs of passes (pass k of each). */
  block_ops_per_sec: number
  /** This build's lookup p99 (p50) / the base's, median over the same pairs. */
  lookup_p99: number
  lookup_p50: number
  /** This build's bytes per entry / the base's, after the cold pass. */
  bytes_per_entry: number
}

/** Each configuration of this build against the same one of the base build, pass by pass. */
function versusBase(): Record<string, Versus> {
  const out: Record<string, Versus> = {}
  for (const c of configs) {
    const mine = runs.get(c) as RunResult[]
    const theirs = runs.get(`base ${c}`)
    if (c.startsWith('base ') || theirs === undefined) continue
    const pairs = (f: (a: RunResult, b: RunResult) => number): number => median(mine.map((a, k) => f(a, theirs[k] as RunResult)))
    out[c] = {
      block_ops_per_sec: pairs((a, b) => b.seconds / a.seconds),
      lookup_p99: pairs((a, b) => a.lookupP99 / b.lookupP99),
      lookup_p50: pairs((a, b) => a.lookupP50 / b.lookupP50),
      bytes_per_entry: (cold.get(c) as RunResult).bytesPerBlock / (cold.get(`base ${c}`) as RunResult).bytesPerBlock,
    }
  }
  return out
}
const result = {
  command: 'npm run bench:index',
  node: process.version,
  cores: availableParallelism(),
  reps,
  workload: { ...workload.options, counts, build_ms: workload.buildMs },
  block_ops_per_sec: Object.fromEntries(configs.map((c) => [c, (summary[c] as Summary).block_ops_per_sec])),
  lookup_us: Object.fromEntries(configs.map((c) => [c, (summary[c] as Summary).lookup_us])),
  bytes_per_block: firstSingle.bytesPerBlock,
  bytes_per_block_sharded: Object.fromEntries(configs.filter((c) => c !== 'single-thread').map((c) => [c, (cold.get(c) as RunResult).bytesPerBlock])),
  entries_at_end: firstSingle.entries,
  configurations: summary,
  ...(paced !== undefined ? { one_shard_paced_at_half_rate: paced } : {}),
  ...(baseDir !== undefined ? { base: resolve(baseDir), versus_base: versusBase() } : {}),
}
writeFileSync(join(resultsDir(), 'index.json'), JSON.stringify(result, null, 2) + '\n')

const f = (x: number): string => Math.round(x).toLocaleString('en-US')
const us = (x: number): string => x.toFixed(1)
console.log(
  `kv-router index benchmark — Mooncake trace, ${counts.requests} requests, ${workers} workers, block ${workload.options.blockSize}, ` +
    `${workload.options.capacity} blocks/worker`,
)
console.log(
  `${counts.events} events (${f(counts.blocks)} blocks), ${counts.lookups} lookups (${f(counts.lookupBlocks)} blocks); node ${process.version}, ` +
    `${availableParallelism()} cores`,
)
console.log(`warm: medians of ${reps} passes after a first (cold) pass on the same index; every worker removed between passes\n`)
console.log('configuration         block ops/s   request ops/s   lookup p50 µs   lookup p99 µs   ring full   seconds │ cold: block ops/s   p50 µs   p99 µs')
for (const c of configs) {
  const s = summary[c] as Summary
  console.log(
    `${c.padEnd(19)} ${f(s.block_ops_per_sec).padStart(13)} ${f(s.request_ops_per_sec).padStart(15)} ${us(s.lookup_us.p50).padStart(15)} ` +
      `${us(s.lookup_us.p99).padStart(15)} ${String(s.ring_full).padStart(11)} ${s.seconds.toFixed(2).padStart(9)} │ ` +
      `${f(s.cold.block_ops_per_sec).padStart(17)} ${us(s.cold.lookup_us.p50).padStart(8)} ${us(s.cold.lookup_us.p99).padStart(8)}`,
  )
}
if (paced !== undefined) {
  console.log(
    `1-shard, events paced at ${f(paced.pace_block_ops_per_sec)} block ops/s (half its warm saturated rate): lookup p50 ${us(paced.lookup_us.p50)} ` +
      `µs, p99 ${us(paced.lookup_us.p99)} µs`,
  )
}
const sharded = configs.filter((c) => c !== 'single-thread')
console.log(
  `\nbytes per cached (block, worker) entry after the cold pass: ${result.bytes_per_block.toFixed(1)} (single index, ${f(result.entries_at_end)} ` +
    `entries); sharded: ${sharded.map((c) => `${c}: ${(result.bytes_per_block_sharded[c] as number).toFixed(1)}`).join(', ')}`,
)
if (result.versus_base !== undefined) {
  console.log(`\nthis build / base (${result.base}), medians over the ${reps} alternated pairs of warm passes:`)
  console.log('configuration    block ops/s   lookup p50   lookup p99   bytes per entry')
  for (const [c, v] of Object.entries(result.versus_base)) {
    console.log(
      `${c.padEnd(14)} ${v.block_ops_per_sec.toFixed(2).padStart(12)}× ${v.lookup_p50.toFixed(2).padStart(11)}× ${v.lookup_p99.toFixed(2).padStart(11)}× ` +
        `${v.bytes_per_entry.toFixed(2).padStart(16)}×`,
    )
  }
}
console.log(`wrote bench/results/index.json`)
