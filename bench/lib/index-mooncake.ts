// `bench:index --mooncake`: Dynamo's indexer benchmark workload (bench/lib/mooncake-workload.ts)
// replayed against the index, with the figures in Dynamo's units beside this repository's.
//
// Targets: the single-threaded index on this thread, once fed the events as JSON (decoded here,
// as a router ingests them) and once fed them already decoded (the index alone, as Dynamo's bench
// hands its indexer event structs); and the shard pool with 1 and 2 shards (events as JSON through
// the rings, lookups fanned out to every shard).
//
// Two kinds of replay, each timing from the first operation to the last completion (the shards'
// final drain included):
//   saturated  every operation as soon as the previous one allows: the capacity (`reps` warm
//              passes after a cold one, medians)
//   sweep      the timeline compressed into a given duration, each operation issued at its
//              deadline: achieved against offered rate, as Dynamo's `--sweep` does. A step kept
//              up when achieved ≥ 95% of offered (Dynamo's criterion); the threshold is the
//              highest achieved rate of a step that kept up.
// Lookup latency is from the call to the answer (Dynamo times find_matches the same way), not
// from the deadline.
import { availableParallelism } from 'node:os'
import { once } from 'node:events'
import { KvIndex } from '../../src/index/kv-index.js'
import { EventDecoder } from '../../src/codec/event-decoder.js'
import { ShardPool } from '../../src/shards/pool.js'
import { u64Hi, u64Lo } from '../../src/codec/u64.js'
import { median } from './common.js'
import { quantileOf } from './stats.js'
import { buildMooncakeWorkload, type MooncakeCounts, type MooncakeOp, type MooncakeWorkload, type MooncakeWorkloadOptions } from './mooncake-workload.js'

export interface MooncakeBenchOptions extends MooncakeWorkloadOptions {
  /** Shard pool sizes to run (default 1 and 2). */
  shards?: number[]
  /** Warm saturated passes per target (default 3). */
  reps?: number
  /** Sweep steps (default 8); 0 skips the sweep. */
  sweepSteps?: number
  /** Sweep durations in ms; by default from half the fastest target's saturated time to 8× the slowest's. */
  sweepMinMs?: number
  sweepMaxMs?: number
}

interface PassResult {
  seconds: number
  lookupP50: number
  lookupP99: number
  bytesPerEntry: number
  entries: number
}

interface Target {
  readonly name: string
  readonly threads: number
  /** One replay; `durationMs` null: saturated. */
  pass(durationMs: number | null): Promise<PassResult>
  clear(): Promise<void>
  close(): Promise<void>
}

const spinUntil = (t: number): void => {
  while (performance.now() < t) {}
}
const turn = (): Promise<void> => new Promise((r) => setImmediate(r))

class SingleTarget implements Target {
  readonly threads = 1
  private readonly ix = new KvIndex()
  private readonly dec = new EventDecoder()

  constructor(
    readonly name: string,
    private readonly w: MooncakeWorkload,
    private readonly preDecoded: boolean,
    private readonly lat: Float64Array,
  ) {}

  pass(durationMs: number | null): Promise<PassResult> {
    const { ix, dec, lat, preDecoded } = this
    const ops = this.w.ops
    let li = 0
    const t0 = performance.now()
    for (let i = 0; i < ops.length; i++) {
      const op = ops[i] as MooncakeOp
      if (durationMs !== null) spinUntil(t0 + op.at * durationMs)
      if (op.kind === 'event') ix.apply(preDecoded ? op.decoded : dec.decode(op.bytes))
      else {
        const q0 = performance.now()
        ix.findMatches(op.lo, op.hi, op.n)
        lat[li++] = (performance.now() - q0) * 1000
      }
    }
    const seconds = (performance.now() - t0) / 1000
    const l = lat.subarray(0, li)
    return Promise.resolve({
      seconds,
      lookupP50: quantileOf(l, 0.5),
      lookupP99: quantileOf(l, 0.99),
      bytesPerEntry: ix.bytes / ix.liveEntries,
      entries: ix.liveEntries,
    })
  }

  clear(): Promise<void> {
    for (const w of this.w.workerIds) this.ix.removeWorker(u64Lo(w), u64Hi(w))
    if (this.ix.liveEntries !== 0) throw new Error(`bench: ${this.name} kept entries after every worker was removed`)
    return Promise.resolve()
  }

  close(): Promise<void> {
    return Promise.resolve()
  }
}

class PoolTarget implements Target {
  readonly name: string
  private constructor(
    private readonly pool: ShardPool,
    readonly threads: number,
    private readonly w: MooncakeWorkload,
    private readonly lat: Float64Array,
  ) {
    this.name = `${threads}-shard`
  }

  static async start(shards: number, w: MooncakeWorkload, lat: Float64Array): Promise<PoolTarget> {
    return new PoolTarget(await ShardPool.start({ shards }), shards, w, lat)
  }

  async pass(durationMs: number | null): Promise<PassResult> {
    const { pool, lat } = this
    const ops = this.w.ops
    let li = 0
    let pending = false
    const lookup = async (op: MooncakeOp & { kind: 'lookup' }): Promise<void> => {
      pending = true
      const q0 = performance.now()
      await pool.query(op.lo, op.hi, op.n)
      lat[li++] = (performance.now() - q0) * 1000
      pending = false
    }
    let inflight: Promise<void> = Promise.resolve()
    const t0 = performance.now()
    for (let i = 0; i < ops.length; i++) {
      const op = ops[i] as MooncakeOp
      if (durationMs !== null) {
        const due = t0 + op.at * durationMs
        // sleep through long gaps; through short ones keep turning the loop so answers are taken
        if (due - performance.now() > 2) await new Promise((r) => setTimeout(r, due - performance.now() - 1))
        while (performance.now() < due) await turn()
      }
      if (op.kind === 'event') {
        // answers are collected in event-loop callbacks: with a lookup out, give the loop a turn
        // per event, or the pushing would be counted into its latency
        if (pending) await turn()
        if (!pool.push(op.bytes) && pool.pendingMessages > 64) await once(pool, 'drain')
      } else {
        // one lookup in flight, as in the default mode: the events after it keep flowing, the
        // stream waits only when the next lookup comes up before this one is answered
        await inflight
        inflight = lookup(op)
        inflight.catch(() => undefined)
      }
    }
    await inflight
    while (pool.pendingMessages > 0) await once(pool, 'drain')
    await pool.flush()
    const seconds = (performance.now() - t0) / 1000
    const c = pool.counters()
    if (c.reduce((s, x) => s + x.malformed + x.lost, 0) !== 0) throw new Error('bench: events were malformed or lost')
    const entries = c.reduce((s, x) => s + x.blocks, 0)
    const bytes = (await pool.stats()).reduce((s, x) => s + x.bytes, 0)
    const l = lat.subarray(0, li)
    return { seconds, lookupP50: quantileOf(l, 0.5), lookupP99: quantileOf(l, 0.99), bytesPerEntry: bytes / entries, entries }
  }

  async clear(): Promise<void> {
    await Promise.all(this.w.workerIds.map((id) => this.pool.removeWorker(id)))
    const left = this.pool.counters().reduce((s, x) => s + x.blocks, 0)
    if (left !== 0) throw new Error(`bench: ${this.name} kept ${left} entries after every worker was removed`)
  }

  async close(): Promise<void> {
    await this.pool.close()
  }
}

/** The operation totals behind each unit. */
export interface UnitTotals {
  /** Dynamo's operation: one find_matches call or one KV event (stored, removed, cleared). */
  dynamoOps: number
  /** Dynamo's block operation as its Flash Indexer figures count it: lookup blocks + stored blocks. */
  dynamoBlockOps: number
  /** Dynamo's later ("corrected") block count: lookup blocks + stored + removed blocks. */
  dynamoBlockOpsCorrected: number
  /** This repository's block op (bench:index): stored + removed blocks, lookups not counted. */
  kvrBlockOps: number
}

export function unitTotals(c: MooncakeCounts): UnitTotals {
  return {
    dynamoOps: c.lookups + c.events,
    dynamoBlockOps: c.lookupBlocks + c.storedBlocks,
    dynamoBlockOpsCorrected: c.lookupBlocks + c.storedBlocks + c.removedBlocks,
    kvrBlockOps: c.storedBlocks + c.removedBlocks,
  }
}

export interface Rates {
  dynamo_ops_per_sec: number
  dynamo_block_ops_per_sec: number
  dynamo_block_ops_per_sec_corrected: number
  kvr_block_ops_per_sec: number
}

function rates(u: UnitTotals, seconds: number): Rates {
  return {
    dynamo_ops_per_sec: u.dynamoOps / seconds,
    dynamo_block_ops_per_sec: u.dynamoBlockOps / seconds,
    dynamo_block_ops_per_sec_corrected: u.dynamoBlockOpsCorrected / seconds,
    kvr_block_ops_per_sec: u.kvrBlockOps / seconds,
  }
}

export interface ConfigurationResult {
  /** Threads applying events: 1 for the single index, the shard count for a pool. */
  threads: number
  seconds: number
  rates: Rates
  /** rates divided by threads. */
  per_thread: Rates
  lookup_us: { p50: number; p99: number }
  /** Index memory per (block, worker) entry after the cold pass. */
  bytes_per_entry: number
  entries: number
  cold: { seconds: number; rates: Rates; lookup_us: { p50: number; p99: number } }
}

export interface SweepStep {
  duration_ms: number
  offered: Rates
  achieved: Rates
  lookup_us: { p50: number; p99: number }
  kept_up: boolean
}

export interface MooncakeBenchResult {
  command: string
  node: string
  cores: number
  reps: number
  workload: MooncakeWorkload['options'] & { counts: MooncakeCounts; build_ms: number; totals: UnitTotals }
  configurations: Record<string, ConfigurationResult>
  sweep: {
    durations_ms: number[]
    steps: Record<string, SweepStep[]>
    /** Highest achieved rates of a step that kept up; null when none did. */
    threshold: Record<string, { duration_ms: number; achieved: Rates } | null>
  }
}

/** `steps` durations from max down to min, evenly spaced in log: offered load rising, as Dynamo's sweep grid. */
export function sweepDurations(minMs: number, maxMs: number, steps: number): number[] {
  if (steps <= 0) return []
  if (steps === 1) return [maxMs]
  const a = Math.log(minMs)
  const b = Math.log(maxMs)
  return Array.from({ length: steps }, (_, i) => Math.round(Math.exp(b + ((a - b) * i) / (steps - 1)) * 10) / 10)
}

export async function runMooncakeBench(o: MooncakeBenchOptions = {}, log: (s: string) => void = () => undefined): Promise<MooncakeBenchResult> {
  const reps = o.reps ?? 3
  const sweepSteps = o.sweepSteps ?? 8
  const w = buildMooncakeWorkload(o)
  const totals = unitTotals(w.counts)
  log(`workload built in ${Math.round(w.buildMs)} ms: ${w.counts.lookups} lookups, ${w.counts.events} events`)
  const lat = new Float64Array(w.counts.lookups)
  const targets: Target[] = [new SingleTarget('single-thread', w, false, lat), new SingleTarget('single-thread, index only', w, true, lat)]
  for (const s of o.shards ?? [1, 2]) targets.push(await PoolTarget.start(s, w, lat))
  try {
    const cold = new Map<string, PassResult>()
    const warm = new Map<string, PassResult[]>(targets.map((t) => [t.name, []]))
    // pass 0 is cold; the warm passes alternate over the targets so a slow phase of the machine lands on all
    for (let r = 0; r <= reps; r++) {
      for (const t of targets) {
        const res = await t.pass(null)
        await t.clear()
        if (r === 0) cold.set(t.name, res)
        else warm.get(t.name)?.push(res)
      }
      log(`saturated pass ${r}${r === 0 ? ' (cold)' : ''} done`)
    }
    const configurations: Record<string, ConfigurationResult> = {}
    for (const t of targets) {
      const rs = warm.get(t.name) as PassResult[]
      const c0 = cold.get(t.name) as PassResult
      const sec = median(rs.map((x) => x.seconds))
      const rt = rates(totals, sec)
      configurations[t.name] = {
        threads: t.threads,
        seconds: sec,
        rates: rt,
        per_thread: rates(totals, sec * t.threads),
        lookup_us: { p50: median(rs.map((x) => x.lookupP50)), p99: median(rs.map((x) => x.lookupP99)) },
        bytes_per_entry: c0.bytesPerEntry,
        entries: c0.entries,
        cold: { seconds: c0.seconds, rates: rates(totals, c0.seconds), lookup_us: { p50: c0.lookupP50, p99: c0.lookupP99 } },
      }
    }
    const secs = Object.values(configurations).map((c) => c.seconds * 1000)
    const durations = sweepDurations(o.sweepMinMs ?? Math.min(...secs) / 2, o.sweepMaxMs ?? Math.max(...secs) * 8, sweepSteps)
    const steps: Record<string, SweepStep[]> = Object.fromEntries(targets.map((t) => [t.name, []]))
    for (const d of durations) {
      for (const t of targets) {
        const res = await t.pass(d)
        await t.clear()
        const offered = rates(totals, d / 1000)
        const achieved = rates(totals, res.seconds)
        steps[t.name]?.push({
          duration_ms: d,
          offered,
          achieved,
          lookup_us: { p50: res.lookupP50, p99: res.lookupP99 },
          kept_up: achieved.dynamo_ops_per_sec >= 0.95 * offered.dynamo_ops_per_sec,
        })
      }
      log(`sweep step ${d} ms done`)
    }
    const threshold: MooncakeBenchResult['sweep']['threshold'] = {}
    for (const t of targets) {
      let best: { duration_ms: number; achieved: Rates } | null = null
      for (const s of steps[t.name] ?? [])
        if (s.kept_up && (best === null || s.achieved.dynamo_ops_per_sec > best.achieved.dynamo_ops_per_sec))
          best = { duration_ms: s.duration_ms, achieved: s.achieved }
      threshold[t.name] = best
    }
    return {
      command: 'npm run bench:index -- --mooncake',
      node: process.version,
      cores: availableParallelism(),
      reps,
      workload: { ...w.options, counts: w.counts, build_ms: w.buildMs, totals },
      configurations,
      sweep: { durations_ms: durations, steps, threshold },
    }
  } finally {
    for (const t of targets) await t.close()
  }
}

const f = (x: number): string => Math.round(x).toLocaleString('en-US')
const m = (x: number): string => (x >= 1e6 ? `${(x / 1e6).toFixed(2)} M` : `${(x / 1e3).toFixed(1)} k`)
const us = (x: number): string => x.toFixed(1)

/** The printed tables of a result. */
export function formatMooncakeTables(r: MooncakeBenchResult): string {
  const w = r.workload
  const c = w.counts
  const lines: string[] = []
  lines.push(
    `kv-router index — Dynamo mooncake_bench workload: ${c.requests} requests over ${w.workers} workers (random deal, seed ${w.seed}), ` +
      `block ${w.blockSize}, ${w.gpuBlocks} GPU blocks per mock engine`,
  )
  lines.push(
    `${c.lookups} lookups (${f(c.lookupBlocks)} blocks) + ${c.events} events (${c.storedEvents} stored: ${f(c.storedBlocks)} blocks, ` +
      `${c.removedEvents} removed: ${f(c.removedBlocks)} blocks); engine prefix hit rate ${(c.engineHitRate * 100).toFixed(1)}%; ` +
      `node ${r.node}, ${r.cores} cores`,
  )
  lines.push(`saturated: medians of ${r.reps} warm passes after a cold one; every worker removed between passes`)
  lines.push('ops = lookups + events (Dynamo); Dynamo blocks = lookup + stored blocks; kv-router blocks = stored + removed blocks\n')
  lines.push(
    'configuration               threads      ops/s   Dynamo block ops/s   kv-router block ops/s   ops/s per thread   lookup p50 µs   p99 µs   bytes/entry',
  )
  for (const [name, x] of Object.entries(r.configurations)) {
    lines.push(
      `${name.padEnd(27)} ${String(x.threads).padStart(7)} ${m(x.rates.dynamo_ops_per_sec).padStart(10)} ${m(x.rates.dynamo_block_ops_per_sec).padStart(20)} ` +
        `${m(x.rates.kvr_block_ops_per_sec).padStart(23)} ${m(x.per_thread.dynamo_ops_per_sec).padStart(18)} ${us(x.lookup_us.p50).padStart(15)} ` +
        `${us(x.lookup_us.p99).padStart(8)} ${x.bytes_per_entry.toFixed(1).padStart(13)}`,
    )
  }
  const names = Object.keys(r.sweep.steps)
  if (r.sweep.durations_ms.length > 0) {
    lines.push('\nachieved vs offered (ops/s = lookups + events; p99 µs of lookups; * = kept up, achieved ≥ 95% of offered)')
    lines.push(`duration ms  offered ops/s │ ${names.map((n) => n.padStart(27)).join(' │ ')}`)
    r.sweep.durations_ms.forEach((d, i) => {
      const offered = r.sweep.steps[names[0] as string]?.[i]?.offered.dynamo_ops_per_sec ?? 0
      const cells = names.map((n) => {
        const s = r.sweep.steps[n]?.[i] as SweepStep
        return `${m(s.achieved.dynamo_ops_per_sec)}${s.kept_up ? '*' : ' '} p99 ${us(s.lookup_us.p99)}`.padStart(27)
      })
      lines.push(`${String(d).padStart(11)} ${m(offered).padStart(14)} │ ${cells.join(' │ ')}`)
    })
    lines.push('\nthreshold (highest achieved rate that kept up):')
    for (const n of names) {
      const t = r.sweep.threshold[n]
      lines.push(
        `  ${n.padEnd(27)} ${
          t === null || t === undefined
            ? 'none kept up'
            : `${m(t.achieved.dynamo_ops_per_sec)} ops/s, ${m(t.achieved.dynamo_block_ops_per_sec)} Dynamo block ops/s (${t.duration_ms} ms)`
        }`,
      )
    }
  }
  return lines.join('\n')
}

export interface ProfileRow {
  /** function (file:line) */
  fn: string
  self_ms: number
  share: number
}

/**
 * CPU profile of the single-threaded index alone (events already decoded, or decoded from JSON)
 * over `passes` saturated replays of the workload, after one unprofiled warm-up pass. The
 * profiler (V8's, as `node --cpu-prof` uses) runs only around the replays, so the workload's
 * build (engines that run their own index) and the clearing between passes are not in it. Returns
 * the profiles (one per pass) and their functions by self time.
 */
export async function profileSingle(
  o: MooncakeWorkloadOptions,
  passes: number,
  preDecoded: boolean,
): Promise<{ profiles: object[]; rows: ProfileRow[]; seconds: number; workload: MooncakeWorkload }> {
  const { Session } = await import('node:inspector/promises')
  const w = buildMooncakeWorkload(o)
  const t = new SingleTarget('profiled', w, preDecoded, new Float64Array(w.counts.lookups))
  await t.pass(null)
  await t.clear()
  const session = new Session()
  session.connect()
  await session.post('Profiler.enable')
  await session.post('Profiler.setSamplingInterval', { interval: 100 })
  let seconds = 0
  const profiles: CpuProfile[] = []
  for (let i = 0; i < passes; i++) {
    // profiled per pass: removing every worker in between is not part of the replay
    await session.post('Profiler.start')
    seconds += (await t.pass(null)).seconds
    profiles.push((await session.post('Profiler.stop')).profile as CpuProfile)
    await t.clear()
  }
  session.disconnect()
  const self = new Map<string, number>()
  for (const p of profiles) for (const r of selfTimes(p)) self.set(r.fn, (self.get(r.fn) ?? 0) + r.self_ms)
  const total = [...self.values()].reduce((a, b) => a + b, 0)
  const rows = [...self.entries()].sort((a, b) => b[1] - a[1]).map(([fn, ms]) => ({ fn, self_ms: ms, share: total === 0 ? 0 : ms / total }))
  return { profiles, rows, seconds, workload: w }
}

interface CpuProfile {
  nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number } }[]
  samples?: number[]
  timeDeltas?: number[]
}

/** Self time per function of a V8 CPU profile, largest first. */
export function selfTimes(p: CpuProfile): ProfileRow[] {
  const name = new Map<number, string>()
  for (const n of p.nodes) {
    const f = n.callFrame
    // compiled files, named by their source (functions keep their names; lines do not match)
    const file = f.url.replace(/^.*\/(src|bench|workers)\//, '$1/').replace(/\.js$/, '.ts')
    name.set(n.id, `${f.functionName || '(anonymous)'}${file === '' ? '' : ` (${file})`}`)
  }
  const self = new Map<string, number>()
  let total = 0
  const samples = p.samples ?? []
  const deltas = p.timeDeltas ?? []
  for (let i = 0; i < samples.length; i++) {
    const us = deltas[i + 1] ?? 0
    const k = name.get(samples[i] as number) ?? '?'
    self.set(k, (self.get(k) ?? 0) + us)
    total += us
  }
  return [...self.entries()].sort((a, b) => b[1] - a[1]).map(([fn, us]) => ({ fn, self_ms: us / 1000, share: total === 0 ? 0 : us / total }))
}
