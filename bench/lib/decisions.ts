// The route decision of bench:route: selection plus booking, kv mode (latency cost), given the
// request's overlaps, timed alone (process.hrtime.bigint()) in a steady state. A fixed population
// of booked requests, about 4 per worker-rank (prompts sharing system prefixes, so active blocks
// are really shared), one new request booked per operation while the oldest is freed and a
// middle-aged one completes prefill (the upkeep, timed apart); before it, the same request routed
// without booking (the selection alone, timed apart). Overlaps reach the scheduler as the route
// path gives them, the slots holding a prefix listed (the older build reads the array). Two
// models of who holds the request's system prefix:
//   share    16 system prefixes; about one worker-rank in eight holds the request's, a few
//            (1.5%) hold more: at 7,000 worker-ranks about 980 per request
//   tenants  the fleet serves more tenants as it grows: 16 system prefixes per 64 worker-ranks,
//            each request's held by 8 worker-ranks and more of it by 1, as in the 64-rank fleet
//            (the same as share up to 64): a request finds as much of its prompt at every size
//
// Three schedulers take the same operations, each on its own: this build's (the pruned
// selection), this build's with fullScan (the reference: every decision of the pruned one is
// checked against it), and, with BENCH_ROUTE_BASE=<dist of another build>, that build's. This
// build's and the other's repetitions alternate, their order swapped each time, so that a
// shared machine's drift falls on both; their ratio is the median of the repetitions' ratios.
// The fleets' repetitions are interleaved too (benchDecisionSet), so a fleet's figures over the
// 64-rank fleet's (the bar: 7,000 ÷ 64) are taken repetition by repetition under the same load.
// The schedulers run on virtual time (a millisecond an operation), so twins see the same clock.
// Heap: used heap and typed-array buffers after a full collection, before the scheduler is built
// and once it has reached its steady state, per scheduler.
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fullGc } from '../../src/runtime/heap-settle.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import type { ScheduleRequest, SchedulerDeps } from '../../src/scheduler/scheduler.js'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import type { SchedulerOptionsInput } from '../../src/scheduler/options.js'
import { median } from './common.js'

const BLOCK_SIZE = 64
/** Requests booked per worker-rank in the steady state. */
const IN_FLIGHT_PER_RANK = 4

/** What the benchmark calls on a scheduler: the public API every build has. */
interface SchedulerLike {
  addWorkerRank(workerId: bigint, dpRank: number): number
  tryRoute(req: ScheduleRequest): { slot: number } | null
  free(id: string): boolean
  markPrefillComplete(id: string): boolean
}

export type SchedulerClass = new (options: SchedulerOptionsInput, deps: SchedulerDeps) => SchedulerLike

/** One fleet: ranks worker-ranks in workers of ranksPerWorker dp ranks, and who holds the prefixes. */
export interface DecisionCase {
  ranks: number
  ranksPerWorker: number
  model: 'share' | 'tenants'
}

export interface DecisionSettings {
  reps: number
  ops: number
  warmup: number
  templates: number
}

interface Run {
  p50Us: number
  p99Us: number
  meanUs: number
  /** free + prefill completion of one operation, mean µs. */
  upkeepUs: number
  /** The same request routed without booking: the selection alone, p50 and p99 µs. */
  selectP50Us: number
  selectP99Us: number
}

export interface DecisionSide {
  p50Us: number
  p99Us: number
  meanUs: number
  upkeepUs: number
  selectP50Us: number
  selectP99Us: number
  /** Heap the scheduler holds in its steady state, MB. */
  heapMB: number
  reps: Run[]
}

export interface DecisionResult {
  ranks: number
  ranksPerWorker: number
  model: DecisionCase['model']
  ops: number
  population: number
  /** Mean worker-ranks with an overlap per request. */
  matchedPerRequest: number
  pruned: DecisionSide
  fullScan: DecisionSide
  base: DecisionSide | null
  /** Per repetition: base ÷ this build, p50 and p99; their medians. */
  ratiosP50: number[]
  ratiosP99: number[]
  ratioP50: number | null
  ratioP99: number | null
  /** Decisions of the pruned selection checked against the full scan's, and how many differed. */
  compared: number
  differed: number
}

interface Template {
  isl: number
  lo: Uint32Array
  hi: Uint32Array
  slots: Int32Array
  values: Float64Array
}

function makeTemplates(rng: Xoshiro128, c: DecisionCase, count: number): Template[] {
  const ranks = c.ranks
  const tenants = c.model === 'tenants' && ranks > 64
  const prefixes = Array.from({ length: tenants ? Math.round((16 * ranks) / 64) : 16 }, () => {
    const n = 4 + rng.int(29)
    return { lo: Uint32Array.from({ length: n }, () => rng.int(2 ** 32)), hi: Uint32Array.from({ length: n }, () => rng.int(2 ** 32)) }
  })
  const out: Template[] = []
  for (let i = 0; i < count; i++) {
    const p = prefixes[rng.int(prefixes.length)] as { lo: Uint32Array; hi: Uint32Array }
    const n = Math.max(p.lo.length + 1, 8 + rng.int(121))
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    lo.set(p.lo)
    hi.set(p.hi)
    for (let k = p.lo.length; k < n; k++) {
      lo[k] = rng.int(2 ** 32)
      hi[k] = rng.int(2 ** 32)
    }
    const slots: number[] = []
    const values: number[] = []
    if (tenants) {
      // 8 worker-ranks hold the system prefix, 1 more of the prompt
      const held = new Set<number>()
      while (held.size < 9) held.add(rng.int(ranks))
      let k = 0
      for (const w of [...held].sort((x, y) => x - y)) {
        slots.push(w)
        values.push(k++ === 8 ? p.lo.length + rng.int(n - p.lo.length + 1) : p.lo.length)
      }
    } else {
      // about one worker-rank in eight holds the system prefix, a few hold more
      for (let w = 0; w < ranks; w++) {
        const r = rng.next()
        if (r < 0.125) {
          slots.push(w)
          values.push(p.lo.length)
        } else if (r < 0.14) {
          slots.push(w)
          values.push(p.lo.length + rng.int(n - p.lo.length + 1))
        }
      }
    }
    out.push({ isl: n * BLOCK_SIZE - rng.int(BLOCK_SIZE), lo, hi, slots: Int32Array.from(slots), values: Float64Array.from(values) })
  }
  return out
}

/** One scheduler under the workload: its own population of booked requests. */
class Driver {
  readonly s: SchedulerLike
  /** The booked requests' ids, oldest first: a ring of population + 1 entries from `head`, `size` long. */
  private readonly ring: Int32Array
  private head = 0
  private size = 0
  private readonly dense: Float64Array
  private readonly req: ScheduleRequest = { id: '', isl: 0 }
  private readonly query: ScheduleRequest = { isl: 0, updateStates: false }
  private seq = 0
  /** The schedulers' clock, ms: the operation's index. */
  private now = 0

  constructor(
    Ctor: SchedulerClass,
    fullScan: boolean,
    c: DecisionCase,
    private readonly templates: Template[],
    private readonly ids: string[],
    private readonly population: number,
  ) {
    // virtual time, a millisecond an operation: every scheduler of a fleet sees the same clock, and
    // no booking reaches the stale limit (300 s) however long the other fleets' repetitions take
    const clock = (): number => this.now
    this.s = new Ctor({ mode: 'kv', blockSize: BLOCK_SIZE, seed: 1, queueThreshold: 4.0 }, { timers: false, fullScan, clock })
    for (let w = 0; w < c.ranks / c.ranksPerWorker; w++) for (let r = 0; r < c.ranksPerWorker; r++) this.s.addWorkerRank(BigInt(1_000_000_007 * (w + 1)), r)
    this.dense = new Float64Array(c.ranks)
    this.ring = new Int32Array(population + 1)
  }

  /**
   * Operations [from, to) of the sequence: decisions timed into `timed`, choices into `choices`;
   * with `select`, each request first routed without booking, timed there, its choice in `queried`.
   */
  run(
    ops: Int32Array,
    from: number,
    to: number,
    timed: Float64Array | null,
    upkeep: Float64Array | null,
    choices: Int32Array,
    select: Float64Array | null,
    queried: Int32Array,
  ): void {
    const req = this.req
    const query = this.query
    const dense = this.dense
    for (let i = from; i < to; i++) {
      this.now = i
      const tpl = this.templates[ops[i] as number] as Template
      for (let k = 0; k < tpl.slots.length; k++) dense[tpl.slots[k] as number] = tpl.values[k] as number
      if (select !== null) {
        query.isl = tpl.isl
        query.seqLo = tpl.lo
        query.seqHi = tpl.hi
        query.overlapBlocks = dense
        query.overlapSlots = tpl.slots
        const q0 = process.hrtime.bigint()
        const q = this.s.tryRoute(query)
        select[i - from] = Number(process.hrtime.bigint() - q0) / 1000
        queried[i] = q === null ? -1 : q.slot
      }
      const id = this.seq++ % this.ids.length
      req.id = this.ids[id] as string
      req.isl = tpl.isl
      req.seqLo = tpl.lo
      req.seqHi = tpl.hi
      req.overlapBlocks = dense
      req.overlapSlots = tpl.slots
      const t0 = process.hrtime.bigint()
      const d = this.s.tryRoute(req)
      const t1 = process.hrtime.bigint()
      for (let k = 0; k < tpl.slots.length; k++) dense[tpl.slots[k] as number] = 0
      if (d === null) throw new Error('benchmark state unexpectedly queued a request')
      choices[i] = d.slot
      const ring = this.ring
      ring[(this.head + this.size++) % ring.length] = id
      const t2 = process.hrtime.bigint()
      if (this.size > this.population) {
        this.s.free(this.ids[ring[this.head] as number] as string)
        this.head = (this.head + 1) % ring.length
        this.size--
      }
      this.s.markPrefillComplete(this.ids[ring[(this.head + (this.size >> 1)) % ring.length] as number] as string)
      const t3 = process.hrtime.bigint()
      if (timed !== null) timed[i - from] = Number(t1 - t0) / 1000
      if (upkeep !== null) upkeep[i - from] = Number(t3 - t2) / 1000
    }
  }
}

/** Used heap after a full collection, with the typed arrays' buffers (outside V8's heap, where the scheduler keeps its state), MB. */
async function heapMB(): Promise<number> {
  const gc = fullGc()
  let last = Infinity
  // the buffers of freed typed arrays go a while after the collection, in the background: collect
  // until the figure holds still
  for (let i = 0; i < 50; i++) {
    // a tick queued across the collection, as heap-settle.ts explains
    process.nextTick(noop)
    gc()
    await sleep(20)
    const m = process.memoryUsage()
    const mb = (m.heapUsed + m.arrayBuffers) / 2 ** 20
    if (Math.abs(mb - last) < 0.05) return mb
    last = mb
  }
  return last
}

function noop(): void {}

function percentile(sorted: Float64Array, q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number
}

function summarize(samples: Float64Array, upkeep: Float64Array, select: Float64Array): Run {
  let sum = 0
  for (const v of samples) sum += v
  let up = 0
  for (const v of upkeep) up += v
  const sorted = Float64Array.from(samples).sort()
  const sel = Float64Array.from(select).sort()
  return {
    p50Us: percentile(sorted, 0.5),
    p99Us: percentile(sorted, 0.99),
    meanUs: sum / samples.length,
    upkeepUs: up / upkeep.length,
    selectP50Us: percentile(sel, 0.5),
    selectP99Us: percentile(sel, 0.99),
  }
}

function side(reps: Run[], heap: number): DecisionSide {
  return {
    p50Us: median(reps.map((x) => x.p50Us)),
    p99Us: median(reps.map((x) => x.p99Us)),
    meanUs: median(reps.map((x) => x.meanUs)),
    upkeepUs: median(reps.map((x) => x.upkeepUs)),
    selectP50Us: median(reps.map((x) => x.selectP50Us)),
    selectP99Us: median(reps.map((x) => x.selectP99Us)),
    heapMB: heap,
    reps,
  }
}

/** The Scheduler of another build's dist (BENCH_ROUTE_BASE), or null. */
export async function baseScheduler(dist: string | undefined): Promise<SchedulerClass | null> {
  if (dist === undefined || dist === '') return null
  const mod = (await import(join(dist, 'src', 'scheduler', 'scheduler.js'))) as { Scheduler: SchedulerClass }
  return mod.Scheduler
}

/** Untimed operations before each timed repetition: a case's state goes cold while the others run. */
const REWARM = 500

interface Built {
  d: Driver
  heap: number
  choices: Int32Array
  queried: Int32Array
}

/** One fleet's schedulers, built and warmed up, with the operations they take and their repetitions so far. */
export interface PreparedCase {
  readonly c: DecisionCase
  readonly set: DecisionSettings
  readonly population: number
  readonly matchedPerRequest: number
  readonly warmup: number
  readonly ops: Int32Array
  readonly pruned: Built
  readonly full: Built
  readonly base: Built | null
  readonly reps: { pruned: Run[]; full: Run[]; base: Run[] }
}

/** Builds a fleet's three schedulers (this build's, its full-scan twin, the other build's) and warms them up. */
export async function prepareDecisions(c: DecisionCase, set: DecisionSettings, Base: SchedulerClass | null): Promise<PreparedCase> {
  const rng = new Xoshiro128(20240601 + c.ranks * 8 + c.ranksPerWorker)
  const templates = makeTemplates(rng, c, set.templates)
  const population = IN_FLIGHT_PER_RANK * c.ranks
  const ids = Array.from({ length: population * 2 + 2 }, (_, i) => `req-${i}`)
  // warm-up long enough to fill the population, then the timed repetitions
  const warmup = Math.max(set.warmup, population + set.warmup / 2)
  const total = warmup + set.reps * (REWARM + set.ops)
  const ops = Int32Array.from({ length: total }, () => rng.int(templates.length))
  let matched = 0
  for (const t of templates) matched += t.slots.length
  const build = async (Ctor: SchedulerClass, fullScan: boolean): Promise<Built> => {
    const choices = new Int32Array(total)
    const queried = new Int32Array(total)
    const h0 = await heapMB()
    const d = new Driver(Ctor, fullScan, c, templates, ids, population)
    d.run(ops, 0, warmup, null, null, choices, null, queried)
    return { d, heap: (await heapMB()) - h0, choices, queried }
  }
  const pruned = await build(Scheduler as unknown as SchedulerClass, false)
  const full = await build(Scheduler as unknown as SchedulerClass, true)
  const base = Base === null ? null : await build(Base, false)
  return { c, set, population, matchedPerRequest: matched / templates.length, warmup, ops, pruned, full, base, reps: { pruned: [], full: [], base: [] } }
}

/** Repetition r of a prepared fleet: this build and the other alternate, which goes first swapped each time; then the full scan. */
export function runDecisionRep(p: PreparedCase, r: number): void {
  const n = p.set.ops
  const samples = new Float64Array(n)
  const upkeep = new Float64Array(n)
  const select = new Float64Array(n)
  const from = p.warmup + r * (REWARM + n)
  const rep = (b: Built, into: Run[]): void => {
    b.d.run(p.ops, from, from + REWARM, null, null, b.choices, null, b.queried)
    b.d.run(p.ops, from + REWARM, from + REWARM + n, samples, upkeep, b.choices, select, b.queried)
    into.push(summarize(samples, upkeep, select))
  }
  if (p.base !== null && r % 2 === 0) rep(p.base, p.reps.base)
  rep(p.pruned, p.reps.pruned)
  if (p.base !== null && r % 2 === 1) rep(p.base, p.reps.base)
  rep(p.full, p.reps.full)
}

/** A prepared fleet's result once its repetitions ran: medians, and every decision checked against the full scan's. */
export function finishDecisions(p: PreparedCase): DecisionResult {
  const { pruned, full, reps, warmup } = p
  const total = p.ops.length
  let differed = 0
  let compared = 0
  for (let i = 0; i < total; i++) if (pruned.choices[i] !== full.choices[i]) differed++
  compared += total
  // the unbooked routes of the timed operations
  for (let r = 0; r < reps.pruned.length; r++) {
    const from = warmup + r * (REWARM + p.set.ops) + REWARM
    for (let i = from; i < from + p.set.ops; i++) if (pruned.queried[i] !== full.queried[i]) differed++
    compared += p.set.ops
  }
  const ratiosP50 = reps.base.map((b, i) => b.p50Us / (reps.pruned[i] as Run).p50Us)
  const ratiosP99 = reps.base.map((b, i) => b.p99Us / (reps.pruned[i] as Run).p99Us)
  return {
    ranks: p.c.ranks,
    ranksPerWorker: p.c.ranksPerWorker,
    model: p.c.model,
    ops: p.set.ops,
    population: p.population,
    matchedPerRequest: p.matchedPerRequest,
    pruned: side(reps.pruned, pruned.heap),
    fullScan: side(reps.full, full.heap),
    base: p.base === null ? null : side(reps.base, p.base.heap),
    ratiosP50,
    ratiosP99,
    ratioP50: ratiosP50.length > 0 ? median(ratiosP50) : null,
    ratioP99: ratiosP99.length > 0 ? median(ratiosP99) : null,
    compared,
    differed,
  }
}

/** One fleet alone. */
export async function benchDecisions(c: DecisionCase, set: DecisionSettings, Base: SchedulerClass | null): Promise<DecisionResult> {
  const p = await prepareDecisions(c, set, Base)
  for (let r = 0; r < set.reps; r++) runDecisionRep(p, r)
  return finishDecisions(p)
}

/**
 * Several fleets with their repetitions interleaved: repetition r of every fleet, in an order
 * rotated each time, before any fleet's r + 1, so that a shared machine's load falls on all
 * sizes alike and the ratio of two sizes can be taken repetition by repetition (sizeRatios).
 * Every fleet takes the same number of repetitions.
 */
export async function benchDecisionSet(cases: readonly { c: DecisionCase; set: DecisionSettings }[], Base: SchedulerClass | null): Promise<DecisionResult[]> {
  const reps = cases[0]?.set.reps ?? 0
  if (cases.some((x) => x.set.reps !== reps)) throw new Error('interleaved fleets take the same number of repetitions')
  const prepared: PreparedCase[] = []
  for (const x of cases) prepared.push(await prepareDecisions(x.c, x.set, Base))
  for (let r = 0; r < reps; r++) for (let i = 0; i < prepared.length; i++) runDecisionRep(prepared[(i + r) % prepared.length] as PreparedCase, r)
  return prepared.map(finishDecisions)
}

/**
 * A fleet's decision figures over those at 64 worker-ranks, this build's and the other's: the
 * median of the repetitions' ratios when the fleets' repetitions were interleaved (benchDecisionSet).
 */
export interface SizeRatio {
  ranks: number
  ranksPerWorker: number
  model: DecisionCase['model']
  p99: number
  p50: number
  selectP99: number
  selectP50: number
  baseP99: number | null
  baseP50: number | null
}

/** Every fleet past 64 worker-ranks over the 64-rank one (the two models are the same there). */
export function sizeRatios(results: readonly DecisionResult[]): SizeRatio[] {
  const small = results.find((d) => d.ranks === 64 && d.ranksPerWorker === 1)
  if (small === undefined) return []
  const b = small.base
  return results
    .filter((d) => d.ranks > 64)
    .map((d) => ({
      ranks: d.ranks,
      ranksPerWorker: d.ranksPerWorker,
      model: d.model,
      p99: over(d.pruned, small.pruned, (x) => x.p99Us),
      p50: over(d.pruned, small.pruned, (x) => x.p50Us),
      selectP99: over(d.pruned, small.pruned, (x) => x.selectP99Us),
      selectP50: over(d.pruned, small.pruned, (x) => x.selectP50Us),
      baseP99: b === null || d.base === null ? null : over(d.base, b, (x) => x.p99Us),
      baseP50: b === null || d.base === null ? null : over(d.base, b, (x) => x.p50Us),
    }))
}

/** The median of one figure's ratios, repetition by repetition (interleaved runs), else the ratio of its medians. */
function over(big: DecisionSide, small: DecisionSide, f: (x: Run) => number): number {
  if (big.reps.length > 0 && big.reps.length === small.reps.length) return median(big.reps.map((x, i) => f(x) / f(small.reps[i] as Run)))
  return f(big) / f(small)
}

function shape(d: { ranks: number; ranksPerWorker: number; model: string }): string {
  return `${d.ranks}${d.ranksPerWorker > 1 ? ` (${d.ranks / d.ranksPerWorker}×${d.ranksPerWorker})` : ''}, ${d.model}`
}

/** The printed table of a run's decision results. */
export function decisionTable(results: readonly DecisionResult[], reps: number): string[] {
  const f = (x: number | null | undefined, d = 2): string => (x === null || x === undefined ? '–' : x.toFixed(d))
  const lines = [
    `route decision (selection + booking, kv mode, latency cost, given overlaps), median of ${reps} repetitions; µs, heap MB`,
    'worker-ranks (dp), model | ops | in flight | matched | p50 | p99 | mean | select p50 | p99 | upkeep | heap | full scan p50 | p99 |' +
      ' base p50 | p99 | select p50 | upkeep | heap | base/this p50 | p99 | same as full scan',
  ]
  for (const d of results) {
    const b = d.base
    lines.push(
      [
        shape(d).padStart(23),
        String(d.ops).padStart(5),
        String(d.population).padStart(9),
        f(d.matchedPerRequest, 0).padStart(7),
        f(d.pruned.p50Us).padStart(6),
        f(d.pruned.p99Us).padStart(7),
        f(d.pruned.meanUs).padStart(6),
        f(d.pruned.selectP50Us).padStart(10),
        f(d.pruned.selectP99Us).padStart(7),
        f(d.pruned.upkeepUs).padStart(6),
        f(d.pruned.heapMB, 1).padStart(5),
        f(d.fullScan.p50Us).padStart(13),
        f(d.fullScan.p99Us).padStart(7),
        f(b?.p50Us).padStart(8),
        f(b?.p99Us).padStart(7),
        f(b?.selectP50Us).padStart(10),
        f(b?.upkeepUs).padStart(6),
        f(b?.heapMB, 1).padStart(5),
        f(d.ratioP50).padStart(13),
        f(d.ratioP99).padStart(5),
        `${d.compared - d.differed}/${d.compared}`,
      ].join(' | '),
    )
  }
  for (const r of sizeRatios(results)) {
    const f2 = (x: number | null): string => (x === null ? '–' : x.toFixed(2))
    lines.push(
      `${shape(r)} ÷ 64: p99 ${f2(r.p99)}${r.ranks === 7000 ? ' (bar ≤ 2)' : ''}, p50 ${f2(r.p50)}; ` +
        `selection alone p99 ${f2(r.selectP99)}, p50 ${f2(r.selectP50)}` +
        (r.baseP99 === null ? '' : `; the other build p99 ${f2(r.baseP99)}, p50 ${f2(r.baseP50)}`),
    )
  }
  return lines
}
