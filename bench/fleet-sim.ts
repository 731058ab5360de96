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
// At fleet scale (--dp-size, --duplicate, --index) it also measures what the router pays in wall
// time: each decision (p50/p99 µs), each find_matches and the index's event apply when overlaps
// come from a KvIndex fed with the engines' KV events, and the memory of the scheduler and index.
// The simulated engines allocate far more than the router, and their garbage collections land in
// the decisions timed in the simulation; --replay-decisions replays each mode's scheduler calls
// alone against a fresh scheduler (same states, same decisions, checked) and times them there.
//
// Engines. --engine-profile gives each worker a timing profile and speed (the mocker's syntax,
// src/sim/mocker/profiles.ts; a worker's dp ranks share its profile); `default` is the latency
// cost's own engine model, the others are engines it does not model, which the scheduler's
// per-worker-rank engine estimator (kv; kv-static has it off) learns from the first tokens and the
// inter-token times it is told of. Reported per timing class (profile@speed) when the fleet mixes
// them: the class's share of the requests and of the uncached prefill tokens, and its TTFT.
//
// Latency objectives. --objectives mix[:TIGHT:LOOSE] gives request i a TTFT objective of TIGHT ms
// (default 1,000) when i is even and LOOSE ms (default 10,000) when odd, and priority −1 (sheddable)
// when i mod 4 is 0 or 1. Each mode then runs twice, with the objectives given to the scheduler
// and without (the same objectives counted against the TTFTs): the share of objectives met (a
// request shed or not finished misses its objective), the requests shed, the TTFT p90.
//
// Run: npm run bench:fleet-sim [-- --minutes M] [--offset M] [--workers N] [--dp-size R]
//      [--duplicate D] [--index] [--replay-decisions] [--load X] [--capacity-factor F] [--chunk TOKENS]
//      [--engine-profile LIST] [--objectives mix[:TIGHT:LOOSE]] [--modes kv,kv-dynamo,...] [--trace FILE] [--out FILE]
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fullGc } from '../src/runtime/heap-settle.js'
import { KvIndex } from '../src/index/kv-index.js'
import { DecodedEvent } from '../src/codec/event-decoder.js'
import { toDecoded } from '../src/codec/events.js'
import { BinaryHeap } from '../src/scheduler/binary-heap.js'
import { readTrace, TraceBlockHasher, expandTokens } from '../src/sim/replay/trace.js'
import type { TraceRequest } from '../src/sim/replay/trace.js'
import { cacheBound } from '../src/sim/replay/bound.js'
import { sequenceHashesInto } from '../src/codec/hashing.js'
import { MockEngine } from '../src/sim/mocker/engine.js'
import { PROFILES, parseProfileList, timingsFor } from '../src/sim/mocker/profiles.js'
import { profileDecodeMs, profilePrefillMs } from '../src/sim/mocker/timing.js'
import type { EngineTiming } from '../src/sim/mocker/profiles.js'
import type { EngineRequest, RequestListener } from '../src/sim/mocker/engine.js'
import { Scheduler } from '../src/scheduler/scheduler.js'
import { isKvrError } from '../src/errors.js'
import type { SchedulerOptionsInput } from '../src/scheduler/options.js'
import { percentile } from '../src/sim/replay/summary.js'
import { repoRoot, resultsDir, textTable } from './lib/common.js'
import { duplicateTrace } from './lib/mooncake-workload.js'

const BLOCK_SIZE = 64

/** The modes of bench:e2e, as scheduler options. */
const MODES: Record<string, SchedulerOptionsInput> = {
  kv: { mode: 'kv' },
  // the latency cost with the fixed default engine model: what learning the engines adds
  'kv-static': { mode: 'kv', learnEngines: false },
  'kv-dynamo': { mode: 'kv', cost: 'dynamo' },
  'kv-tuned': { mode: 'kv', cost: 'dynamo', overlapScoreWeight: 10, overlapScoreCredit: 5 },
  // the default kv mode with every candidate scored: the reference the pruned selection must match
  'kv-full-scan': { mode: 'kv' },
  'round-robin': { mode: 'round-robin' },
  random: { mode: 'random' },
  'least-loaded': { mode: 'least-loaded' },
}

interface Args {
  minutes: number
  offset: number
  workers: number
  /** Data-parallel ranks per worker: worker-ranks = workers × dpSize, one engine each. */
  dpSize: number
  /** Copies of the slice under disjoint block ids, arriving together (Dynamo's trace duplication). */
  duplicate: number
  /** Overlaps from a KvIndex fed with the engines' KV events instead of the engines' pools. */
  index: boolean
  /** Replays each mode's scheduler calls against a fresh scheduler, decisions timed alone. */
  replay: boolean
  load: number
  capacityFactor: number
  /** KV blocks per engine instead of the capacity rule; 0 = the rule. */
  kvBlocks: number
  chunk: number
  modes: string[]
  trace: string
  out: string
  /** --engine-profile as given, and the timing of each worker it makes. */
  engineProfile: string
  timings: EngineTiming[]
  /** --objectives: the per-request TTFT objectives, or null without them. */
  objectives: ObjectiveSpec | null
}

/** --objectives mix: request i's TTFT objective is tightMs when i is even, looseMs when odd; sheddable (priority −1) when i mod 4 < 2. */
interface ObjectiveSpec {
  tightMs: number
  looseMs: number
}

const objectiveMs = (o: ObjectiveSpec, i: number): number => (i % 2 === 0 ? o.tightMs : o.looseMs)
const objectivePriority = (i: number): number => (i % 4 < 2 ? -1 : 0)

/** Reads --objectives: `mix` or `mix:TIGHT:LOOSE` (ms, each in (0, 10^7]). */
function parseObjectives(spec: string): ObjectiveSpec {
  const parts = spec.split(':')
  const bad = (): never => fail(`--objectives must be mix or mix:TIGHT_MS:LOOSE_MS, got ${JSON.stringify(spec)}`)
  if (parts[0] !== 'mix' || (parts.length !== 1 && parts.length !== 3)) bad()
  if (parts.length === 1) return { tightMs: 1000, looseMs: 10_000 }
  const [tight, loose] = [Number(parts[1]), Number(parts[2])]
  if (!(tight > 0 && tight <= 1e7 && loose > 0 && loose <= 1e7) || parts[1]?.trim() === '' || parts[2]?.trim() === '') bad()
  return { tightMs: tight, looseMs: loose }
}

function fail(msg: string): never {
  process.stderr.write(`bench:fleet-sim: ${msg}\n`)
  process.exit(2)
}

function parseArgs(argv: string[]): Args {
  const v = new Map<string, string>()
  const known = [
    '--minutes',
    '--offset',
    '--workers',
    '--dp-size',
    '--duplicate',
    '--load',
    '--capacity-factor',
    '--kv-blocks',
    '--chunk',
    '--modes',
    '--trace',
    '--out',
    '--engine-profile',
    '--objectives',
  ]
  let index = false
  let replay = false
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (a === '--index' || a === '--replay-decisions') {
      if (a === '--index') index = true
      else replay = true
      continue
    }
    if (!known.includes(a)) fail(`unknown option ${JSON.stringify(a)} (known: ${known.join(' ')} --index --replay-decisions)`)
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
  const int = (name: string, dflt: number): number => {
    const n = num(name, dflt, 1)
    if (!Number.isInteger(n)) fail(`${name} must be an integer`)
    return n
  }
  const workers = int('--workers', 8)
  const engineProfile = v.get('--engine-profile') ?? 'default'
  let timings: EngineTiming[] = []
  try {
    timings = timingsFor(parseProfileList(engineProfile), workers)
  } catch (err) {
    fail((err as Error).message)
  }
  return {
    minutes: num('--minutes', 20, 0.001),
    offset: num('--offset', 0, 0),
    workers,
    dpSize: int('--dp-size', 1),
    duplicate: int('--duplicate', 1),
    index,
    replay,
    load: num('--load', 8, 0.001),
    capacityFactor: num('--capacity-factor', 1.25, 0.001),
    kvBlocks: v.has('--kv-blocks') ? int('--kv-blocks', 0) : 0,
    chunk: Math.floor(num('--chunk', 8192, 1)),
    modes,
    trace: v.get('--trace') ?? join(repoRoot(), 'data', 'conversation_trace.jsonl'),
    out: v.get('--out') ?? join(resultsDir(), 'fleet-sim.json'),
    engineProfile,
    timings,
    objectives: v.has('--objectives') ? parseObjectives(v.get('--objectives') as string) : null,
  }
}

/** What one timing class (profile@speed) of the fleet got. */
interface ClassOutcome {
  label: string
  timing: EngineTiming
  engines: number
  requests: number
  /** Prompt tokens not found in the prefix cache when first scheduled. */
  uncachedPrefillTokens: number
  ttft: Float64Array
  /**
   * What the scheduler learned of the class's engines by the end, means over them (null with
   * learning off): speeds against the default model as the estimator states them, and how many
   * engines' prefill and decode models rest on observations rather than the prior.
   */
  learned: { prefillSpeed: number; decodeSpeed: number; prefillLearned: number; decodeLearned: number } | null
}

/** The estimator's reference points for the speeds it states (src/scheduler/engine-estimator.ts). */
const SPEED_TOKENS = 1024
const SPEED_USAGE = 0.5

/** A timing's true speeds in the estimator's terms: a fresh 1,024-token prefill and a decode step at usage 0.5, against the default's. */
function trueSpeeds(t: EngineTiming): { prefill: number; decode: number } {
  const pairs = (SPEED_TOKENS * (SPEED_TOKENS - 1)) / 2
  const p = PROFILES[t.profile]
  return {
    prefill: (t.speed * profilePrefillMs(PROFILES.default, SPEED_TOKENS, pairs)) / profilePrefillMs(p, SPEED_TOKENS, pairs),
    decode: (t.speed * profileDecodeMs(PROFILES.default, SPEED_USAGE)) / profileDecodeMs(p, SPEED_USAGE),
  }
}

interface Outcome {
  hitRate: number
  ttft: Float64Array
  /** Every inter-token gap (simulated ms): per token, not per request. */
  itl: Float64Array
  /** Each request's mean inter-token time ((last token − first) / (tokens − 1)). */
  tpot: Float64Array
  /** Requests that did not finish (never routed, or aborted). */
  errors: number
  /** Requests the engines preempted under KV memory pressure (recomputed later). */
  preemptions: number
  classes: ClassOutcome[]
  e2eMeanMs: number
  perWorker: number[]
  /** Wall µs of each Scheduler.tryRoute call, sorted. */
  decisionUs: Float64Array
  /** The scheduler's calls, to replay them alone (with --replay-decisions). */
  log: CallLog | null
  /** With --index: wall µs of each findMatches, sorted; and the event apply totals. */
  matchUs: Float64Array | null
  events: number
  blockOps: number
  applyMs: number
  /** Heap + array buffers the index and the scheduler hold at the end (after a full GC); the index's null without --index. */
  indexBytes: number | null
  schedulerBytes: number
  wallS: number
  /** With --objectives: requests whose TTFT met their objective, of the tight and loose ones, and those the scheduler shed. */
  objectives: { tight: number; tightMet: number; loose: number; looseMet: number; shed: number } | null
}

/** Growable sample of numbers (a per-token figure runs to millions a run). */
class Samples {
  private a = new Float64Array(1024)
  private n = 0
  push(v: number): void {
    if (this.n === this.a.length) {
      const grown = new Float64Array(this.a.length * 2)
      grown.set(this.a)
      this.a = grown
    }
    this.a[this.n++] = v
  }
  sorted(): Float64Array {
    return this.a.slice(0, this.n).sort()
  }
}

/** A timing's class name: profile@speed. */
const speeds = (x: { prefill: number; decode: number }): string => `${x.prefill.toFixed(2)} / ${x.decode.toFixed(2)}`

function timingLabel(t: EngineTiming): string {
  return `${t.profile}@${t.speed}`
}

const OP_ROUTE = 0
const OP_PREFILL = 1
const OP_FREE = 2

/**
 * The scheduler's calls in one simulation, in order, with the simulated clock of each and the
 * decision it returned: replayed against a fresh scheduler they rebuild the same states, so a
 * decision can be timed without the simulator's engines allocating around it.
 */
class CallLog {
  kind: number[] = []
  at: number[] = []
  req: number[] = []
  /** For a route: its overlap entries in slots/values[from[k] .. from[k + 1]) and the slot it chose (-1: none). */
  from: number[] = [0]
  slots = new Int32Array(1024)
  slotsN = 0
  values: number[] = []
  chose: number[] = []
  /** For a free: the request's output tokens (the estimator's inter-token observation). */
  outputTokens: number[] = []
  seq: (readonly [Uint32Array, Uint32Array])[] = []

  route(now: number, req: number, overlap: Float64Array, touched: Int32Array, n: number, seqLo: Uint32Array, seqHi: Uint32Array, chose: number): void {
    this.push(OP_ROUTE, now, req)
    if (this.slotsN + n > this.slots.length) {
      const grown = new Int32Array(Math.max(this.slots.length * 2, this.slotsN + n))
      grown.set(this.slots)
      this.slots = grown
    }
    for (let k = 0; k < n; k++) {
      const w = touched[k] as number
      this.slots[this.slotsN++] = w
      this.values.push(overlap[w] as number)
    }
    this.from.push(this.slotsN)
    this.seq[req] ??= [seqLo, seqHi]
    this.chose.push(chose)
  }

  other(kind: number, now: number, req: number, outputTokens = 0): void {
    this.push(kind, now, req, outputTokens)
    this.from.push(this.slotsN)
    this.chose.push(-1)
  }

  private push(kind: number, now: number, req: number, outputTokens = 0): void {
    this.kind.push(kind)
    this.outputTokens.push(outputTokens)
    this.at.push(now)
    this.req.push(req)
  }
}

/** Timed replays after the checked one. */
const TIMED_PASSES = 3

interface Replay {
  /** Wall µs of each tryRoute in the timed pass with the median p99, sorted. */
  us: Float64Array
  /** Decisions that differ from the simulation's. */
  differ: number
}

/** The log's calls against a fresh scheduler with `options`; only tryRoute is timed. */
function replayDecisions(mode: string, log: CallLog, requests: TraceRequest[], a: Args, blocksPerWorker: number): Replay {
  const options = MODES[mode] as SchedulerOptionsInput
  const ranks = a.workers * a.dpSize
  let now = 0
  const s = new Scheduler({ blockSize: BLOCK_SIZE, seed: 1, ...options }, { timers: false, clock: () => now })
  for (let e = 0; e < ranks; e++)
    s.addWorkerRank(BigInt(Math.floor(e / a.dpSize) + 1), e % a.dpSize, { maxNumBatchedTokens: a.chunk, totalKvBlocks: blocksPerWorker })
  const ids = requests.map((_, i) => String(i))
  const overlap = new Float64Array(ranks)
  // a request pass 1 booked earlier than pass 0 did is not routed again
  const booked = new Uint8Array(requests.length)
  const us: number[] = []
  let differ = 0
  // pass 0 checks the decisions and brings the scheduler's tables to their high-water mark, as a
  // router running for a while has them; the passes after it are timed (their ties may break
  // otherwise: not checked), and the pass with the median p99 is reported
  const passes: Float64Array[] = []
  for (let pass = 0; pass <= TIMED_PASSES; pass++) {
    us.length = 0
    for (let k = 0; k < log.kind.length; k++) {
      now = (log.at[k] as number) + pass * 1e9
      const i = log.req[k] as number
      const id = ids[i] as string
      if (log.kind[k] === OP_PREFILL) s.markPrefillComplete(id)
      else if (log.kind[k] === OP_FREE) {
        s.free(id, log.outputTokens[k] as number)
        booked[i] = 0
      } else if (booked[i] === 0) {
        const from = log.from[k] as number
        const to = log.from[k + 1] as number
        for (let j = from; j < to; j++) overlap[log.slots[j] as number] = log.values[j] as number
        const [seqLo, seqHi] = log.seq[i] as readonly [Uint32Array, Uint32Array]
        const req = { id, isl: (requests[i] as TraceRequest).input_length, overlapBlocks: overlap, overlapSlots: log.slots.subarray(from, to), seqLo, seqHi }
        const t = process.hrtime.bigint()
        const d = s.tryRoute(req)
        if (pass > 0) us.push(Number(process.hrtime.bigint() - t) / 1000)
        for (let j = from; j < to; j++) overlap[log.slots[j] as number] = 0
        if (d !== null) booked[i] = 1
        if (pass === 0 && (d === null ? -1 : d.slot) !== log.chose[k]) differ++
      }
    }
    if (pass > 0) passes.push(Float64Array.from(us).sort())
  }
  passes.sort((x, y) => (percentile(x, 0.99) ?? 0) - (percentile(y, 0.99) ?? 0))
  return { us: passes[passes.length >> 1] ?? new Float64Array(0), differ }
}

const gc = fullGc()

function heldBytes(): number {
  gc()
  gc()
  const m = process.memoryUsage()
  return m.heapUsed + m.arrayBuffers
}

/** Replays the requests through a fresh Scheduler and a cold fleet; everything in simulated ms. */
/** One mode on the slice; `steer`: the scheduler is given the --objectives (else they are only counted). */
function simulate(mode: string, requests: TraceRequest[], a: Args, blocksPerWorker: number, steer = false): Outcome {
  const options = MODES[mode] as SchedulerOptionsInput
  const wall0 = performance.now()
  const ranks = a.workers * a.dpSize
  let now = 0
  let s: Scheduler | null = new Scheduler(
    { blockSize: BLOCK_SIZE, seed: 1, ...options },
    { timers: false, clock: () => now, fullScan: mode === 'kv-full-scan' },
  )
  let index: KvIndex | null = a.index ? new KvIndex() : null
  const decoded = new DecodedEvent()
  let events = 0
  let blockOps = 0
  let applyMs = 0
  const engines: MockEngine[] = []
  const timingOf = (e: number): EngineTiming => a.timings[Math.floor(e / a.dpSize)] as EngineTiming
  const labels = [...new Set(a.timings.map(timingLabel))]
  const classOf = Int32Array.from({ length: ranks }, (_, e) => labels.indexOf(timingLabel(timingOf(e))))
  // engine e is worker ⌊e / dpSize⌋ + 1, rank e mod dpSize, and the scheduler's slot e
  for (let e = 0; e < ranks; e++) {
    const rank = e % a.dpSize
    const workerId = BigInt(Math.floor(e / a.dpSize) + 1)
    engines.push(
      new MockEngine({
        workerId,
        blockSize: BLOCK_SIZE,
        numGpuBlocks: blocksPerWorker,
        maxNumBatchedTokens: a.chunk,
        profile: timingOf(e).profile,
        speed: timingOf(e).speed,
        autoStep: false,
        now: () => now,
        onEvent:
          index === null
            ? undefined
            : (ev) => {
                toDecoded(ev, decoded)
                decoded.dpRank = rank
                const t = performance.now()
                ;(index as KvIndex).apply(decoded)
                applyMs += performance.now() - t
                events++
                blockOps += decoded.count
              },
      }),
    )
    const slot = s.addWorkerRank(workerId, rank, { maxNumBatchedTokens: a.chunk, totalKvBlocks: blocksPerWorker })
    if (slot !== e) fail(`worker-rank ${e} got scheduler slot ${slot}`)
    if (index !== null) {
      const w = index.ensureWorker(Number(workerId & 0xffffffffn), Number(workerId >> 32n), rank)
      if (w !== e) fail(`worker-rank ${e} got index slot ${w}`)
    }
  }
  const hasher = new TraceBlockHasher(BLOCK_SIZE)
  const t0 = requests[0]?.timestamp ?? 0
  const idOf = new Map<EngineRequest, number>()
  const sentAt = new Float64Array(requests.length)
  const ttft: number[] = []
  const ttftByClass = labels.map(() => new Samples())
  const engineOf = new Int32Array(requests.length)
  // simulated time of each request's first and latest token, and its output tokens at the end
  const firstAt = new Float64Array(requests.length)
  const lastAt = new Float64Array(requests.length)
  const outputTokens = new Int32Array(requests.length)
  const itl = new Samples()
  const tpot = new Samples()
  const decisionUs: number[] = []
  const log = a.replay ? new CallLog() : null
  const matchUs: number[] = []
  let e2eSum = 0
  let finished = 0
  const spec = a.objectives
  const obj = spec === null ? null : { tight: 0, tightMet: 0, loose: 0, looseMet: 0, shed: 0 }
  if (spec !== null && obj !== null)
    for (let i = 0; i < requests.length; i++) {
      if (i % 2 === 0) obj.tight++
      else obj.loose++
    }
  const perWorker = new Array<number>(ranks).fill(0)
  // a step runs whole when it starts; what it produced becomes visible when it ends
  const stepEnd = new Float64Array(ranks).fill(-1)
  const steps = new BinaryHeap({ capacity: ranks })
  const firsts: number[][] = engines.map(() => [])
  const ends: number[][] = engines.map(() => [])
  // requests that made a token after their first in the engine's running step
  const nexts: number[][] = engines.map(() => [])
  const token = (e: number, r: EngineRequest): number => {
    const i = idOf.get(r) as number
    ;(r.outputTokens === 1 ? firsts[e] : nexts[e])?.push(i)
    return i
  }
  const listeners: RequestListener[] = engines.map((_, e) => ({
    onToken: (r) => {
      token(e, r)
    },
    onFinish: (r) => {
      const i = token(e, r)
      outputTokens[i] = r.outputTokens
      ends[e]?.push(i)
    },
  }))
  const overlap = new Float64Array(ranks)
  // slots whose overlap entry is set, to clear them without a pass over the fleet
  const touched = new Int32Array(ranks)
  let touchedN = 0
  const startStep = (e: number): void => {
    const report = (engines[e] as MockEngine).step()
    stepEnd[e] = report === null ? -1 : now + report.durationMs
    if (report !== null) steps.push(e, stepEnd[e] as number, e)
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
    for (let k = 0; k < touchedN; k++) overlap[touched[k] as number] = 0
    touchedN = 0
    if (index !== null) {
      const t = performance.now()
      const m = n > 0 ? index.findMatches(lo, hi, n) : 0
      matchUs.push((performance.now() - t) * 1000)
      for (let k = 0; k < m; k++) {
        const w = index.matchWorkers[k] as number
        overlap[w] = index.depth(w)
        touched[touchedN++] = w
      }
    } else if (n > 0) {
      for (let e = 0; e < ranks; e++) {
        const h = (engines[e] as MockEngine).pool.prefixHits(lo, hi, n)
        if (h > 0) {
          overlap[e] = h
          touched[touchedN++] = e
        }
      }
    }
    const t = performance.now()
    let d: ReturnType<Scheduler['tryRoute']>
    try {
      d = (s as Scheduler).tryRoute({
        id: String(i),
        isl: r.input_length,
        overlapBlocks: overlap,
        overlapSlots: touched.subarray(0, touchedN),
        seqLo: sLo,
        seqHi: sHi,
        ...(steer && spec !== null ? { ttftObjectiveMs: objectiveMs(spec, i), priority: objectivePriority(i) } : {}),
      })
    } catch (err) {
      // a sheddable request no engine was predicted to serve in time: refused, done with
      if (obj === null || !isKvrError(err, 'KVR_ERR_OBJECTIVE_UNMET')) throw err
      obj.shed++
      return true
    }
    decisionUs.push((performance.now() - t) * 1000)
    log?.route(now, i, overlap, touched, touchedN, sLo, sHi, d === null ? -1 : d.slot)
    if (d === null) return false
    const e = d.slot
    perWorker[e] = (perWorker[e] as number) + 1
    engineOf[i] = e
    idOf.set((engines[e] as MockEngine).submit(expandTokens(r), Math.max(1, r.output_length), listeners[e] as RequestListener), i)
    if (stepEnd[e] === -1) startStep(e)
    return true
  }
  // requests the router queued (every worker-rank queue-busy), first come first served
  const waiting: number[] = []
  let next = 0
  for (;;) {
    const e = steps.peek()
    const arrival = next < requests.length ? ((requests[next] as TraceRequest).timestamp - t0) / a.load : Infinity
    if (e < 0 && arrival === Infinity) break
    if (e < 0 || arrival <= (stepEnd[e] as number)) {
      now = arrival
      sentAt[next] = now
      if (waiting.length > 0 || !route(next)) waiting.push(next)
      next++
      continue
    }
    steps.pop()
    now = stepEnd[e] as number
    for (const i of firsts[e] as number[]) {
      const t = now - (sentAt[i] as number)
      if (spec !== null && obj !== null && t <= objectiveMs(spec, i)) {
        if (i % 2 === 0) obj.tightMet++
        else obj.looseMet++
      }
      ttft.push(t)
      ;(ttftByClass[classOf[e] as number] as Samples).push(t)
      firstAt[i] = now
      lastAt[i] = now
      ;(s as Scheduler).markPrefillComplete(String(i))
      log?.other(OP_PREFILL, now, i)
    }
    for (const i of nexts[e] as number[]) {
      itl.push(now - (lastAt[i] as number))
      lastAt[i] = now
    }
    for (const i of ends[e] as number[]) {
      e2eSum += now - (sentAt[i] as number)
      finished++
      const n = outputTokens[i] as number
      if (n > 1) tpot.push((now - (firstAt[i] as number)) / (n - 1))
      ;(s as Scheduler).free(String(i), n)
      log?.other(OP_FREE, now, i, n)
    }
    ;(firsts[e] as number[]).length = 0
    ;(nexts[e] as number[]).length = 0
    ;(ends[e] as number[]).length = 0
    startStep(e)
    while (waiting.length > 0 && route(waiting[0] as number)) waiting.shift()
  }
  let prompt = 0
  let cached = 0
  const classes: ClassOutcome[] = labels.map((label, c) => ({
    label,
    timing: timingOf(classOf.indexOf(c)),
    engines: 0,
    requests: 0,
    uncachedPrefillTokens: 0,
    ttft: (ttftByClass[c] as Samples).sorted(),
    learned: null,
  }))
  engines.forEach((engine, e) => {
    prompt += engine.stats.promptTokens
    cached += engine.stats.cachedTokens
    const c = classes[classOf[e] as number] as ClassOutcome
    c.engines++
    c.requests += perWorker[e] as number
    c.uncachedPrefillTokens += engine.stats.promptTokens - engine.stats.cachedTokens
    const m = (s as Scheduler).learnedEngine(e)
    if (m === null) return
    c.learned ??= { prefillSpeed: 0, decodeSpeed: 0, prefillLearned: 0, decodeLearned: 0 }
    c.learned.prefillSpeed += m.prefillSpeed
    c.learned.decodeSpeed += m.decodeSpeed
    if (m.prefillSource === 'learned') c.learned.prefillLearned++
    if (m.decodeSource === 'learned') c.learned.decodeLearned++
  })
  for (const c of classes) {
    if (c.learned === null) continue
    c.learned.prefillSpeed /= c.engines
    c.learned.decodeSpeed /= c.engines
  }
  // what the router holds: the heap with the scheduler and index, less the heap without them
  const withBoth = heldBytes()
  index = null
  const withScheduler = heldBytes()
  s = null
  const indexBytes = withBoth - withScheduler
  const schedulerBytes = withScheduler - heldBytes()
  const sorted = (xs: number[]): Float64Array => Float64Array.from(xs).sort()
  return {
    hitRate: prompt > 0 ? cached / prompt : 0,
    ttft: sorted(ttft),
    itl: itl.sorted(),
    tpot: tpot.sorted(),
    errors: requests.length - finished - (obj?.shed ?? 0),
    preemptions: engines.reduce((n, engine) => n + engine.stats.preemptions, 0),
    classes,
    e2eMeanMs: finished > 0 ? e2eSum / finished : 0,
    perWorker,
    decisionUs: sorted(decisionUs),

    matchUs: a.index ? sorted(matchUs) : null,
    events,
    blockOps,
    applyMs,
    log,
    indexBytes: a.index ? indexBytes : null,
    schedulerBytes,
    wallS: (performance.now() - wall0) / 1000,
    objectives: obj,
  }
}

function main(): void {
  const a = parseArgs(process.argv.slice(2))
  const from = a.offset * 60_000
  const slice = readTrace(a.trace).filter((r) => r.timestamp >= from && r.timestamp < from + a.minutes * 60_000)
  if (slice.length === 0) fail('the slice holds no request')
  const requests = a.duplicate > 1 ? duplicateTrace(slice, a.duplicate) : slice
  const ranks = a.workers * a.dpSize
  const bound = cacheBound(requests, BLOCK_SIZE)
  const k = a.kvBlocks > 0 ? a.kvBlocks : Math.ceil((bound.uniqueBlocks / ranks) * a.capacityFactor)
  let need = 0
  for (const r of requests) need = Math.max(need, Math.ceil((r.input_length + Math.max(1, r.output_length)) / BLOCK_SIZE))
  if (k < need) fail(`engines of ${k} KV blocks cannot hold the slice's largest request (${need} blocks): raise --kv-blocks or --capacity-factor`)
  const profiles = a.engineProfile === 'default' ? '' : ` (--engine-profile ${a.engineProfile})`
  const fleet = (a.dpSize > 1 ? `${a.workers} workers × ${a.dpSize} dp ranks = ${ranks} engines` : `${ranks} engines`) + profiles
  console.log(
    `bench:fleet-sim — min ${a.offset} to ${a.offset + a.minutes} of the trace${a.duplicate > 1 ? ` × ${a.duplicate} copies` : ''}: ` +
      `${requests.length} requests, ${fleet} of ${k} KV blocks and a ${a.chunk}-token step, load × ${a.load}; ` +
      `infinite-cache bound ${(bound.hitRate * 100).toFixed(1)}%; overlaps from ${a.index ? "a KvIndex fed with the engines' events" : "the engines' pools"}`,
  )
  const rows: string[][] = []
  const classRows: string[][] = []
  const costRows: string[][] = []
  const objectiveRows: string[][] = []
  const json: Record<string, unknown> = {}
  let rrP90: number | null = null
  const us = (xs: Float64Array | null, q: number): number => (xs === null ? NaN : (percentile(xs, q) ?? NaN))
  // the wall-time figures are of warm code: each mode first routes the slice's first requests once
  const warm = requests.slice(0, Math.min(requests.length, 500))
  for (const mode of a.modes) simulate(mode, warm, a, k)
  for (const mode of a.modes) {
    const o = simulate(mode, requests, a, k)
    const replay = o.log === null ? null : replayDecisions(mode, o.log, requests, a, k)
    if (replay !== null && replay.differ > 0) fail(`${mode}: ${replay.differ} replayed decisions differ from the simulation's`)
    const p = (q: number): number => percentile(o.ttft, q) ?? NaN
    if (mode === 'round-robin') rrP90 = p(0.9)
    // with --objectives: the same slice again, the objectives given to the scheduler
    const steered = a.objectives === null ? null : simulate(mode, requests, a, k, true)
    const objectiveJson: Record<string, unknown> = {}
    for (const [run, x] of [
      ['without', o],
      ['with', steered],
    ] as const) {
      const c = x?.objectives
      if (x === null || c === undefined || c === null) continue
      const share = (met: number, n: number): number => (n > 0 ? met / n : NaN)
      const pct = (v: number): string => `${(v * 100).toFixed(1)}%`
      const ttftP90 = percentile(x.ttft, 0.9) ?? NaN
      objectiveJson[run] = {
        met_share: share(c.tightMet + c.looseMet, c.tight + c.loose),
        tight_met_share: share(c.tightMet, c.tight),
        loose_met_share: share(c.looseMet, c.loose),
        shed: c.shed,
        ttft_p90_ms: ttftP90,
      }
      objectiveRows.push([
        mode,
        run,
        pct(share(c.tightMet + c.looseMet, c.tight + c.loose)),
        pct(share(c.tightMet, c.tight)),
        pct(share(c.looseMet, c.loose)),
        String(c.shed),
        ttftP90.toFixed(0),
      ])
    }
    const spread = Math.max(...o.perWorker) / Math.min(...o.perWorker)
    const q3 = (xs: Float64Array): { p50: number; p90: number; p99: number } => ({ p50: us(xs, 0.5), p90: us(xs, 0.9), p99: us(xs, 0.99) })
    const requestsRouted = o.classes.reduce((n, c) => n + c.requests, 0)
    const uncached = o.classes.reduce((n, c) => n + c.uncachedPrefillTokens, 0)
    json[mode] = {
      hit_rate: o.hitRate,
      hit_rate_over_bound: o.hitRate / bound.hitRate,
      ttft_ms: { p50: p(0.5), p90: p(0.9), p99: p(0.99) },
      // the whole distribution, enough to draw its CDF: percentiles 0, 1, …, 100
      ttft_percentiles_ms: Array.from({ length: 101 }, (_, q) => p(q / 100)),
      // every gap between two tokens of a request, in simulated ms
      itl_ms: q3(o.itl),
      // each request's mean inter-token time
      tpot_ms: q3(o.tpot),
      e2e_mean_ms: o.e2eMeanMs,
      errors: o.errors,
      preemptions: o.preemptions,
      ...(a.objectives === null ? {} : { objectives: objectiveJson }),
      spread: Number.isFinite(spread) ? spread : null,
      classes: Object.fromEntries(
        o.classes.map((c) => [
          c.label,
          {
            profile: c.timing.profile,
            speed: c.timing.speed,
            engines: c.engines,
            requests: c.requests,
            request_share: requestsRouted > 0 ? c.requests / requestsRouted : 0,
            uncached_prefill_tokens: c.uncachedPrefillTokens,
            uncached_prefill_share: uncached > 0 ? c.uncachedPrefillTokens / uncached : 0,
            ttft_ms: q3(c.ttft),
            // against the default model (1 = as fast): the profile's own, and what the scheduler learned by the end
            true_speed: trueSpeeds(c.timing),
            learned:
              c.learned === null
                ? null
                : {
                    prefill_speed: c.learned.prefillSpeed,
                    decode_speed: c.learned.decodeSpeed,
                    engines_prefill_learned: c.learned.prefillLearned,
                    engines_decode_learned: c.learned.decodeLearned,
                  },
          },
        ]),
      ),
      wall: {
        decisions: o.decisionUs.length,
        decision_us: { p50: us(o.decisionUs, 0.5), p99: us(o.decisionUs, 0.99) },
        replayed_decision_us: replay === null ? null : { p50: us(replay.us, 0.5), p99: us(replay.us, 0.99) },
        find_matches_us: o.matchUs === null ? null : { p50: us(o.matchUs, 0.5), p99: us(o.matchUs, 0.99) },
        events: o.events,
        block_ops: o.blockOps,
        apply_block_ops_per_sec: o.applyMs > 0 ? o.blockOps / (o.applyMs / 1000) : null,
        index_bytes: o.indexBytes,
        scheduler_bytes: o.schedulerBytes,
        run_s: o.wallS,
      },
    }
    rows.push([
      mode,
      `${(o.hitRate * 100).toFixed(1)}%`,
      (o.hitRate / bound.hitRate).toFixed(2),
      p(0.5).toFixed(0),
      p(0.9).toFixed(0),
      p(0.99).toFixed(0),
      us(o.itl, 0.9).toFixed(1),
      o.e2eMeanMs.toFixed(0),
      String(o.errors),
      Number.isFinite(spread) ? spread.toFixed(2) : '∞',
      o.wallS.toFixed(1),
    ])
    for (const c of o.classes)
      classRows.push([
        mode,
        c.label,
        String(c.engines),
        `${((c.engines / ranks) * 100).toFixed(0)}%`,
        `${((requestsRouted > 0 ? c.requests / requestsRouted : 0) * 100).toFixed(1)}%`,
        `${((uncached > 0 ? c.uncachedPrefillTokens / uncached : 0) * 100).toFixed(1)}%`,
        us(c.ttft, 0.9).toFixed(0),
        speeds(trueSpeeds(c.timing)),
        c.learned === null ? '–' : speeds({ prefill: c.learned.prefillSpeed, decode: c.learned.decodeSpeed }),
      ])
    const f1 = (x: number): string => (Number.isFinite(x) ? x.toFixed(1) : '–')
    costRows.push([
      mode,
      String(o.decisionUs.length),
      f1(us(o.decisionUs, 0.5)),
      f1(us(o.decisionUs, 0.99)),
      f1(replay === null ? NaN : us(replay.us, 0.5)),
      f1(replay === null ? NaN : us(replay.us, 0.99)),
      f1(us(o.matchUs, 0.5)),
      f1(us(o.matchUs, 0.99)),
      o.applyMs > 0 ? Math.round(o.blockOps / (o.applyMs / 1000)).toLocaleString('en-US') : '–',
      o.indexBytes === null ? '–' : (o.indexBytes / 2 ** 20).toFixed(1),
      (o.schedulerBytes / 2 ** 20).toFixed(1),
    ])
  }
  console.log(textTable(['mode', 'hit rate', '÷ bound', 'TTFT p50', 'TTFT p90', 'TTFT p99', 'ITL p90', 'E2E mean', 'errors', 'spread', 'run s'], rows))
  if (rrP90 !== null) {
    const ratios = rows.filter((r) => r[0] !== 'round-robin').map((r) => `${r[0]} ${(Number(r[4]) / (rrP90 as number)).toFixed(3)}`)
    console.log(`TTFT p90 ÷ round-robin's: ${ratios.join(', ')}`)
  }
  console.log('(times in simulated ms; ITL = every gap between two tokens of a request; spread = max ÷ min requests per engine)')
  if (new Set(a.timings.map(timingLabel)).size > 1) {
    console.log('\nper timing class (profile@speed):')
    console.log(textTable(['mode', 'class', 'engines', 'of fleet', 'requests', 'uncached prefill tokens', 'TTFT p90', 'speed: true', 'learned'], classRows, 2))
    console.log("(speed: prefill / decode against the default model's, 1 = as fast: the profile's own, and what the scheduler learned by the end)")
  }
  if (a.objectives !== null) {
    const o = a.objectives
    console.log(
      `\nlatency objectives (TTFT ${o.tightMs} ms for even requests, ${o.looseMs} ms for odd; priority −1 for i mod 4 < 2), ` +
        'given to the scheduler or not (a shed or unfinished request misses its objective):',
    )
    console.log(textTable(['mode', 'objectives', 'met', 'tight met', 'loose met', 'shed', 'TTFT p90'], objectiveRows, 2))
  }
  console.log('\nwhat the router paid, in wall time on this machine:')
  console.log(
    textTable(
      [
        'mode',
        'decisions',
        'decision p50 µs',
        'p99 µs',
        'replayed p50 µs',
        'p99 µs',
        'find_matches p50 µs',
        'p99 µs',
        'index apply, block ops/s',
        'index MiB',
        'scheduler MiB',
      ],
      costRows,
    ),
  )
  const file = a.out
  const config = {
    minutes: a.minutes,
    offset_minutes: a.offset,
    workers: a.workers,
    dp_size: a.dpSize,
    worker_ranks: ranks,
    duplicate: a.duplicate,
    overlaps_from: a.index ? 'index' : 'engines',
    load: a.load,
    engine_profile: a.engineProfile,
    objectives: a.objectives === null ? null : { spec: 'mix', tight_ms: a.objectives.tightMs, loose_ms: a.objectives.looseMs },
    capacity_factor: a.capacityFactor,
    chunk_tokens: a.chunk,
    kv_blocks_per_engine: k,
    requests: requests.length,
  }
  writeFileSync(file, `${JSON.stringify({ date: new Date().toISOString(), hit_rate_bound: bound.hitRate, config, modes: json }, null, 2)}\n`)
  console.log(`written: ${file}`)
}

main()
