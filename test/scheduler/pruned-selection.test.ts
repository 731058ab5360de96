// The pruned selection (LoadIndex + PrunedSelector) against the full scan: two schedulers with the
// same options and seed, one built with fullScan, take the same operations in lockstep on random
// fleets (1 to 7,000 worker-ranks, dp ranks, capacities, loads, ties, exclusions, held and busy
// workers, overrides, the queue) and must agree on every decision, every error and every wait.
// Also: the single-draw tie-break against the reservoir it replaced, and the latency cost's lower
// bound against the cost.
import t from 'tap'
import type { Test } from 'tap'
import {
  chunkTokens,
  FleetLoad,
  kvUsage,
  LatencyTerms,
  latencyLowerBound,
  ownAtLeast,
  latencyTerms,
  NEAR_TIE,
  prefillSteps,
  prefillTimeMs,
} from '../../src/scheduler/cost.js'
import { DEFAULT_ENGINE_MODEL, EngineModel } from '../../src/scheduler/engine-model.js'
import type { CandidateSets } from '../../src/scheduler/candidates.js'
import type { SchedulerOptionsInput } from '../../src/scheduler/options.js'
import type { Rng } from '../../src/scheduler/rng.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import type { RouteDecision, ScheduleRequest, WorkerRankRef } from '../../src/scheduler/scheduler.js'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import { Selector } from '../../src/scheduler/selector.js'
import type { ActiveSequences } from '../../src/scheduler/active-sequences.js'
import type { WorkerRankInfo } from '../../src/scheduler/worker-ranks.js'
import { WorkerRanks } from '../../src/scheduler/worker-ranks.js'
import { chain, FakeClock } from './fixtures.js'
import type { EngineEstimator } from '../../src/scheduler/engine-estimator.js'

/** One decision, error or wait as text: what the two schedulers must agree on. */
function outcome(f: () => RouteDecision | null): string {
  try {
    const d = f()
    return d === null ? 'wait' : `${d.slot} ${d.workerId}/${d.dpRank} ov=${d.overlapBlocks} booked=${d.booked}`
  } catch (err) {
    return `error ${(err as { code?: string }).code}: ${(err as Error).message}`
  }
}

/** The same calls on a pruned scheduler and a full-scan one. */
class Twin {
  readonly pruned: Scheduler
  readonly full: Scheduler
  readonly clock = new FakeClock()
  /** Queued requests' outcomes, in the order they settled, per scheduler. */
  readonly settled: [string[], string[]] = [[], []]
  decisions = 0
  ties = 0
  /** Engine models published (beyond the default) by plantModels, and whether it ran. */
  models = 0
  planted = false

  constructor(options: SchedulerOptionsInput) {
    this.pruned = new Scheduler(options, { clock: this.clock.now, timers: false })
    this.full = new Scheduler(options, { clock: this.clock.now, timers: false, fullScan: true })
  }

  both<T>(f: (s: Scheduler) => T): [T, T] {
    return [f(this.pruned), f(this.full)]
  }

  route(t: Test, req: ScheduleRequest, where: string): boolean {
    const a = outcome(() => this.pruned.tryRoute(req))
    const b = outcome(() => this.full.tryRoute({ ...req }))
    this.decisions++
    if (a !== b) {
      t.fail(`${where}: pruned ${a}, full scan ${b}`)
      return false
    }
    return true
  }

  schedule(req: ScheduleRequest): void {
    const [a, b] = this.both((s) => s.schedule({ ...req }))
    const record = (k: 0 | 1) => (d: RouteDecision) => this.settled[k].push(`${req.id} ${d.slot} ${d.workerId}/${d.dpRank} ov=${d.overlapBlocks}`)
    const fail = (k: 0 | 1) => (err: unknown) => this.settled[k].push(`${req.id} error ${(err as { code?: string }).code}`)
    a.then(record(0), fail(0))
    b.then(record(1), fail(1))
  }
}

/** The load index's sums and classes recomputed from the scheduler's arrays: what it must hold. */
function checkIndex(t: Test, s: Scheduler, where: string): boolean {
  const cands = (s as unknown as { cands: CandidateSets }).cands
  const index = cands.index
  if (index === undefined) return true
  const w = s.workers
  const seqs = s.sequences
  let open = 0
  let inFlight = 0
  let queueBusy = 0
  let unqueued = 0
  const th = s.options.queueThreshold
  for (let i = 0; i < w.liveCount; i++) {
    const slot = w.liveSlots[i] as number
    const busyWorker = w.slotsOf(w.workerIdOf(slot)).every((r) => cands.eligibility.overloaded(r))
    const isOpen = !s.isHeld(slot) && !busyWorker
    if (index.isOpen(slot) !== isOpen) {
      t.fail(`${where}: slot ${slot} open ${index.isOpen(slot)}, expected ${isOpen}`)
      return false
    }
    if (!isOpen) continue
    const c = index.classOf[slot] as number
    const q = seqs.prefillTokens[slot] as number
    const a = seqs.activeBlocks[slot] as number
    const r = seqs.inFlight[slot] as number
    const g = index.classGroup[c] as number
    const members = Array.from((index.classMembers[c] as Int32Array).subarray(0, index.classCount[c] as number))
    if (index.classQ[c] !== q || index.classA[c] !== a || index.groupR[g] !== r || !members.includes(slot)) {
      t.fail(`${where}: slot ${slot} (q ${q}, a ${a}, r ${r}) filed as q ${index.classQ[c]}, a ${index.classA[c]}, r ${index.groupR[g]}`)
      return false
    }
    open++
    inFlight += r
    if (th !== null && q > th * (w.maxNumBatchedTokens[slot] as number)) queueBusy++
    if (q === 0) unqueued++
  }
  const got = `${index.openCount} ${index.sumInFlight} ${index.queueBusyCount} ${index.unqueuedCount}`
  const want = `${open} ${inFlight} ${queueBusy} ${unqueued}`
  if (got !== want) {
    t.fail(`${where}: index sums ${got}, expected ${want}`)
    return false
  }
  return true
}

interface Fleet {
  workers: { id: bigint; ranks: number; info: WorkerRankInfo }[]
}

function randomInfo(rng: Xoshiro128, uniform: boolean): WorkerRankInfo {
  if (uniform) return { totalKvBlocks: 4096, maxNumBatchedTokens: 4096 }
  const info: WorkerRankInfo = {}
  const x = rng.next()
  if (x < 0.6) info.totalKvBlocks = [0, 512, 4096, 100_000][rng.int(4)] as number
  if (rng.next() < 0.6) info.maxNumBatchedTokens = [256, 2048, 8192, 16384][rng.int(4)] as number
  return info
}

const BS = 16
/** Shared prompt prefixes: requests built on them share hashes, so active blocks are really shared. */
const PREFIXES = Array.from({ length: 6 }, (_, p) => Array.from({ length: 4 + p * 3 }, (_, i) => 1000 * (p + 1) + i))

function prompt(rng: Xoshiro128, uid: number): { lo: Uint32Array; hi: Uint32Array; isl: number } {
  const base = rng.next() < 0.8 ? (PREFIXES[rng.int(PREFIXES.length)] as number[]) : []
  const tail = Array.from({ length: rng.int(12) }, (_, i) => uid * 100 + i)
  const h = chain([...base, ...tail])
  const n = base.length + tail.length
  const isl = rng.next() < 0.1 ? rng.int(n * BS + 1) : n * BS - rng.int(BS)
  return { ...h, isl: Math.max(0, isl) }
}

/** A decision's request with random features (overlaps dense or sparse, exclusions, overrides). */
function request(rng: Xoshiro128, twin: Twin, uid: number, fleet: Fleet): ScheduleRequest {
  const s = twin.pruned
  const p = prompt(rng, uid)
  const req: ScheduleRequest = { id: `d${uid}`, isl: p.isl, seqLo: p.lo, seqHi: p.hi }
  const n = p.lo.length
  const cap = s.workers.slotCapacity
  const x = rng.next()
  if (x < 0.75 && cap > 0) {
    // overlaps: a few worker-ranks, or a share of the fleet, some values equal (ties)
    const k = rng.next() < 0.7 ? 1 + rng.int(Math.min(8, cap)) : Math.max(1, Math.floor(cap * rng.next() * 0.3))
    const slots = new Set<number>()
    for (let i = 0; i < k; i++) slots.add(rng.int(cap + 2))
    const same = 1 + rng.int(Math.max(1, n))
    const list = [...slots]
    // some weighted by storage tier (route-path.ts tieredOverlap): device + 0.75 × host + 0.25 × disk extensions, fractional
    const values = list.map(() => {
      const v = rng.next() < 0.5 ? same : rng.int(n + 3)
      return rng.next() < 0.3 ? v + 0.75 * rng.int(3) + 0.25 * rng.int(3) : v
    })
    const form = rng.int(3)
    if (form !== 2) {
      const dense = new Float64Array(cap + 2)
      list.forEach((sl, i) => {
        dense[sl] = values[i] as number
      })
      req.overlapBlocks = dense
    }
    if (form !== 0) req.overlapSlots = Int32Array.from(list)
    if (form === 2) req.overlapValues = Float64Array.from(values)
  }
  if (rng.next() < 0.15) {
    const ex: WorkerRankRef[] = []
    const all = rng.next() < 0.15
    for (const w of fleet.workers) for (let r = 0; r < w.ranks; r++) if (all || rng.next() < 0.2) ex.push({ workerId: w.id, dpRank: r })
    ex.push({ workerId: 999_999n, dpRank: 0 })
    req.exclude = ex
  }
  const o = rng.next()
  if (o < 0.05) req.overrides = { trackPrefillTokens: false }
  else if (o < 0.1) req.overrides = { assumeKvReuse: false }
  else if (o < 0.13) req.overrides = { overlapScoreWeight: s.options.overlapScoreWeight, overlapScoreCredit: 2 }
  else if (o < 0.15) req.overrides = { overlapScoreWeight: 0.5 + rng.next() }
  else if (o < 0.17) req.overrides = { temperature: 0.5 }
  if (rng.next() < 0.15) req.updateStates = false
  if (rng.next() < 0.03) req.explain = true
  if (rng.next() < 0.2) req.priority = rng.int(3)
  return req
}

function randomOptions(rng: Xoshiro128, seed: number): SchedulerOptionsInput {
  const dynamo = rng.next() < 0.45
  const o: SchedulerOptionsInput = {
    mode: 'kv',
    cost: dynamo ? 'dynamo' : 'latency',
    blockSize: BS,
    seed,
    queueThreshold: rng.next() < 0.5 ? null : [0.5, 2, 4][rng.int(3)],
    trackActiveBlocks: rng.next() < 0.85,
    assumeKvReuse: rng.next() < 0.8,
    trackPrefillTokens: rng.next() < 0.85,
    staleRequestSecs: 600,
  }
  if (rng.next() < 0.2) o.activePrefillTokensThreshold = 200 + rng.int(2000)
  if (rng.next() < 0.15) o.activeDecodeBlocksThreshold = 0.2 + rng.next() * 0.6
  if (rng.next() < 0.1) o.predictedTtlSecs = 30
  if (dynamo) {
    if (rng.next() < 0.3) o.overlapScoreWeight = [0, 0.5, 2][rng.int(3)]
    if (rng.next() < 0.2) o.overlapScoreCredit = 2
    if (rng.next() < 0.2) o.overlapScoreCreditDecay = 0.5
    if (rng.next() < 0.2) o.decodeActiveRequestWeight = 0.7
  }
  return o
}

/** A random fleet driven through both schedulers; returns false at the first disagreement. */
async function run(t: Test, seed: number, size: number, ops: number): Promise<Twin> {
  const rng = new Xoshiro128(seed * 7919 + size)
  const options = randomOptions(rng, seed)
  const twin = new Twin(options)
  const uniform = rng.next() < 0.5
  // worker-ranks in workers of 1 to 8 dp ranks
  const fleet: Fleet = { workers: [] }
  let placed = 0
  let nextId = 1n
  while (placed < size) {
    const ranks = Math.min(size - placed, rng.next() < 0.6 ? 1 : 1 + rng.int(8))
    const info = randomInfo(rng, uniform)
    const id = nextId++
    fleet.workers.push({ id, ranks, info })
    for (let r = 0; r < ranks; r++) twin.both((s) => s.addWorkerRank(id, r, info))
    placed += ranks
  }
  const live: string[] = []
  let uid = 0
  // load: bookings pinned to random ranks (both schedulers list those), about two per rank
  const preload = Math.min(2 * size, 4000)
  for (let i = 0; i < preload; i++) {
    const w = fleet.workers[rng.int(fleet.workers.length)] as Fleet['workers'][number]
    const p = prompt(rng, uid)
    const id = `p${uid++}`
    const req: ScheduleRequest = { id, isl: p.isl, seqLo: p.lo, seqHi: p.hi, workerId: w.id, dpRank: rng.int(w.ranks) }
    const [a, b] = twin.both((s) => outcome(() => s.tryRoute({ ...req })))
    if (a !== b) t.fail(`preload: ${a} vs ${b}`)
    if (rng.next() < 0.5) twin.both((s) => s.markPrefillComplete(id))
  }
  // odd seeds: the worker-ranks have learned engine models of a few speeds and shapes
  if (seed % 2 === 1 && twin.pruned.options.cost === 'latency') {
    twin.models += plantModels(twin, rng)
    twin.planted = true
  }
  for (let op = 0; op < ops; op++) {
    const x = rng.next()
    twin.clock.advance(rng.int(50))
    if (x < 0.12 && live.length > 0) {
      const id = live.splice(rng.int(live.length), 1)[0] as string
      const tokens = rng.int(300)
      twin.both((s) => s.free(id, tokens))
    } else if (x < 0.2 && live.length > 0) {
      const id = live[rng.int(live.length)] as string
      twin.both((s) => s.markPrefillComplete(id))
    } else if (x < 0.22) {
      const w = fleet.workers[rng.int(fleet.workers.length)] as Fleet['workers'][number]
      const on = rng.next() < 0.6
      twin.both((s) => s.setHeld(w.id, on))
    } else if (x < 0.23) {
      const w = fleet.workers[rng.int(fleet.workers.length)] as Fleet['workers'][number]
      const blocks = rng.int(5000)
      const total = rng.next() < 0.5 ? null : 1000 + rng.int(9000)
      const rank = rng.int(w.ranks + 1)
      twin.both((s) => s.reportLoad(w.id, rank, blocks, total))
    } else if (x < 0.235) {
      const patch =
        rng.next() < 0.5
          ? { activePrefillTokensThreshold: rng.next() < 0.3 ? null : 100 + rng.int(3000) }
          : { activeDecodeBlocksThreshold: rng.next() < 0.3 ? null : rng.next() }
      twin.both((s) => s.setBusyThresholds(patch))
    } else if (x < 0.24 && fleet.workers.length > 1) {
      // a worker leaves, or a rank of one
      const i = rng.int(fleet.workers.length)
      const w = fleet.workers[i] as Fleet['workers'][number]
      if (w.ranks > 1 && rng.next() < 0.5) {
        w.ranks--
        twin.both((s) => s.removeWorkerRank(w.id, w.ranks))
      } else {
        fleet.workers.splice(i, 1)
        twin.both((s) => s.removeWorker(w.id))
      }
    } else if (x < 0.245) {
      const id = nextId++
      const ranks = 1 + rng.int(4)
      const info = randomInfo(rng, uniform)
      fleet.workers.push({ id, ranks, info })
      for (let r = 0; r < ranks; r++) twin.both((s) => s.addWorkerRank(id, r, info))
    } else if (x < 0.3) {
      const req = request(rng, twin, uid++, fleet)
      if (req.updateStates === false) req.id = undefined
      twin.schedule(req)
      if (req.updateStates !== false && req.id !== undefined) live.push(req.id)
    } else {
      const req = request(rng, twin, uid++, fleet)
      if (!twin.route(t, req, `seed ${seed}, ${size} worker-ranks, op ${op}`)) break
      if (req.updateStates !== false && twin.pruned.sequences.has(req.id as string)) live.push(req.id as string)
    }
    await Promise.resolve()
    if (op % 25 === 0 && !checkIndex(t, twin.pruned, `seed ${seed}, ${size} worker-ranks, op ${op}`)) break
  }
  twin.both((s) => s.close())
  await new Promise((r) => setImmediate(r))
  t.same(twin.settled[0], twin.settled[1], `seed ${seed}, ${size}: the queued requests settle alike`)
  return twin
}

/**
 * Teaches every live worker-rank of both schedulers the same engine model, one of four kinds (the
 * default, half speed, a larger model's shape, a faster one), from noisy observations; returns
 * how many models the pruned scheduler then holds beyond the default.
 */
function plantModels(twin: Twin, rng: Xoshiro128): number {
  const kinds = [
    [1, 1, 1, 1, 1],
    [2, 2, 2, 2, 2],
    [1.2, 2.5, 2.5, 2.4, 1.3],
    [0.7, 0.6, 0.8, 0.7, 0.9],
  ]
  const d = DEFAULT_ENGINE_MODEL
  const w = twin.pruned.workers
  for (let i = 0; i < w.liveCount; i++) {
    const slot = w.liveSlots[i] as number
    const k = kinds[rng.int(kinds.length)] as number[]
    const e = new EngineModel(d.a * (k[0] as number), d.b * (k[1] as number), d.c * (k[2] as number), d.base * (k[3] as number), d.rise * (k[4] as number))
    for (let j = 0; j < 12; j++) {
      const x = 100 + rng.int(20_000)
      const usage = rng.next()
      const noise = 0.95 + 0.1 * rng.next()
      const ttft = (prefillTimeMs(x, 8192, e) + prefillSteps(x, 8192) * e.decodeMs(usage)) * noise
      const itl = e.decodeMs(usage) * noise
      twin.both((s) => {
        const est = (s as unknown as { estimator: EngineEstimator }).estimator
        est.observeTtft(slot, x, 8192, true, usage, ttft)
        est.observeItl(slot, itl, usage)
      })
    }
  }
  return (twin.pruned as unknown as { estimator: EngineEstimator }).estimator.models.count - 1
}

const SIZES: [number, number, number][] = [
  // worker-ranks, fleets, operations per fleet
  [1, 12, 150],
  [2, 12, 150],
  [3, 12, 150],
  [8, 40, 300],
  [64, 20, 300],
  [1024, 4, 150],
  [7000, 2, 60],
]

for (const [size, fleets, ops] of SIZES) {
  t.test(`random fleets of ${size} worker-ranks: the pruned selection decides as the full scan`, async (t) => {
    let decisions = 0
    let pruned = 0
    let models = 0
    let planted = false
    for (let seed = 1; seed <= fleets; seed++) {
      const twin = await run(t, seed, size, ops)
      models += twin.models
      planted ||= twin.planted
      decisions += twin.decisions
      pruned += twin.pruned.stats().prunedTotal
      t.equal(twin.full.stats().prunedTotal, 0, 'the reference scores every candidate')
    }
    t.ok(decisions > (fleets * ops) / 2, `${decisions} decisions compared`)
    // the rest were refused, waited, or went to the full scan (sampling, explanations, weight overrides)
    t.ok(pruned > decisions / 2, `${pruned} of them by the pruned selection`)
    if (planted) t.ok(models > 0, `${models} learned engine models among the fleets`)
  })
}

t.test('idle identical fleets: the tie among thousands is drawn once, over all of them', async (t) => {
  for (const cost of ['latency', 'dynamo'] as const) {
    const twin = new Twin({ mode: 'kv', cost, blockSize: BS, seed: 5, queueThreshold: null })
    for (let w = 0; w < 3000; w++) twin.both((s) => s.addWorkerRank(BigInt(w + 1), 0, { totalKvBlocks: 1000 }))
    const seen = new Set<number>()
    for (let i = 0; i < 300; i++) {
      const p = chain([i * 7, i * 7 + 1, i * 7 + 2])
      if (!twin.route(t, { id: `r${i}`, isl: 48, seqLo: p.lo, seqHi: p.hi, updateStates: i % 2 === 0 }, `${cost} ${i}`)) break
      const slot = twin.pruned.sequences.slotOfRequest(`r${i}`)
      if (slot >= 0) seen.add(slot)
    }
    // 150 bookings, each on an idle worker-rank drawn from about 3,000: all apart, spread over the fleet
    t.equal(seen.size, 150, `${cost}: every booking on a worker-rank of its own`)
    t.ok(Math.max(...seen) - Math.min(...seen) > 2000, `${cost}: drawn across the fleet (${Math.min(...seen)}..${Math.max(...seen)})`)
  }
})

t.test('members of one class with one overlap but different blocks active cost apart', async (t) => {
  for (const cost of ['latency', 'dynamo'] as const) {
    const twin = new Twin({ mode: 'kv', cost, blockSize: BS, seed: 9, queueThreshold: null })
    // 12 worker-ranks, each one request of 8 blocks after its prefill: one load class (r 1, a 8, q 0)
    for (let w = 0; w < 12; w++) twin.both((s) => s.addWorkerRank(BigInt(w + 1), 0, { totalKvBlocks: 64, maxNumBatchedTokens: 4096 }))
    for (let w = 0; w < 12; w++) {
      // prompts share 0 to 5 leading blocks with the request below
      const shared = w % 6
      const p = chain([...Array.from({ length: shared }, (_, i) => 7000 + i), ...Array.from({ length: 8 - shared }, (_, i) => 100 * w + i)])
      twin.both((s) => s.tryRoute({ id: `b${w}`, isl: 128, seqLo: p.lo, seqHi: p.hi, workerId: BigInt(w + 1), dpRank: 0 }))
      twin.both((s) => s.markPrefillComplete(`b${w}`))
    }
    const req = chain([7000, 7001, 7002, 7003, 7004, 7005, 7006, 7007])
    // the same overlap everywhere: they differ only in the request's blocks already active there
    const overlap = new Float64Array(12).fill(2)
    for (let i = 0; i < 8; i++) {
      if (!twin.route(t, { id: `r${i}`, isl: 128, seqLo: req.lo, seqHi: req.hi, overlapBlocks: overlap, updateStates: false }, `${cost} ${i}`)) break
    }
    const d = twin.pruned.tryRoute({ isl: 128, seqLo: req.lo, seqHi: req.hi, overlapBlocks: overlap, updateStates: false })
    // most of its blocks active there add least: a rank holding 5 of them (slots 5 and 11)
    t.ok(d !== null && d.slot % 6 === 5, `${cost}: chose slot ${d?.slot}`)
  }
})

/** The reservoir of one that the single draw replaced (Selector before it), as the reference for pinned draws. */
function legacyNearTie(logits: Float64Array, inFlight: Int32Array, blocks: Int32Array, m: number, rng: Rng): number {
  let best = Infinity
  for (let i = 0; i < m; i++) best = Math.min(best, logits[i] as number)
  const limit = best + NEAR_TIE * Math.abs(best)
  let chosen = 0
  let req = Infinity
  let blk = Infinity
  let lg = Infinity
  let ties = 0
  for (let i = 0; i < m; i++) {
    const l = logits[i] as number
    if (!(l <= limit)) continue
    const r = inFlight[i] as number
    const b = blocks[i] as number
    if (r < req || (r === req && (b < blk || (b === blk && l < lg)))) {
      req = r
      blk = b
      lg = l
      chosen = i
      ties = 1
    } else if (r === req && b === blk && l === lg) {
      ties++
      if (rng.int(ties) === 0) chosen = i
    }
  }
  return chosen
}

function legacyMin(logits: Float64Array, m: number, rng: Rng): number {
  let best = Infinity
  let chosen = 0
  let ties = 0
  for (let i = 0; i < m; i++) {
    const l = logits[i] as number
    if (l < best) {
      best = l
      chosen = i
      ties = 1
    } else if (l === best) {
      ties++
      if (rng.int(ties) === 0) chosen = i
    }
  }
  return chosen
}

t.test('the single draw: the reservoir of one with pinned draws, uniform with real ones', async (t) => {
  const rng = new Xoshiro128(3)
  const pins = [0, 1 - 2 ** -32].map((p) => ({ next: () => p, int: (n: number) => Math.floor(p * n) }))
  const workers = new WorkerRanks()
  for (let i = 0; i < 64; i++) workers.register(BigInt(i + 1), 0)
  let mismatches = 0
  let tied = 0
  for (let round = 0; round < 2000; round++) {
    const m = 1 + rng.int(40)
    const inFlight = Int32Array.from({ length: 64 }, () => rng.int(3))
    const activeBlocks = Int32Array.from({ length: 64 }, () => rng.int(3))
    const seqs = { inFlight, activeBlocks } as unknown as ActiveSequences
    const slots = Int32Array.from({ length: m }, (_, i) => i)
    const logits = Float64Array.from({ length: m }, () => 1 + rng.int(4) * (rng.next() < 0.5 ? NEAR_TIE / 3 : 1))
    for (const pin of pins) {
      const sel = new Selector(workers, seqs, pin, BS, 8, 'latency')
      sel.logits = Float64Array.from(logits)
      if (sel.nearTiePick(slots, m) !== legacyNearTie(logits, inFlight, activeBlocks, m, pin)) mismatches++
      if (sel.minPick(m) !== legacyMin(logits, m, pin)) mismatches++
    }
    if (logits.filter((l) => l === Math.min(...logits)).length > 1) tied++
  }
  t.equal(mismatches, 0, `pinned draws: the same candidate as the reservoir in 2 × 2 × 2,000 picks (${tied} rounds with exact ties)`)
  // real draws: each of k equal candidates about 1/k of the time
  const seqs = { inFlight: new Int32Array(8), activeBlocks: new Int32Array(8) } as unknown as ActiveSequences
  const sel = new Selector(workers, seqs, new Xoshiro128(11), BS, 8, 'dynamo')
  const counts = new Array<number>(5).fill(0)
  for (let i = 0; i < 20_000; i++) {
    sel.logits.set([3, 2, 2, 5, 2])
    const k = sel.minPick(5)
    counts[k] = (counts[k] ?? 0) + 1
  }
  t.same([counts[0], counts[3]], [0, 0], 'only the equal least')
  for (const k of [1, 2, 4]) t.ok(Math.abs((counts[k] as number) / 20_000 - 1 / 3) < 0.02, `candidate ${k}: ${counts[k]} of 20,000`)
})

t.test("the latency cost's lower bound never exceeds the cost, and grows with the wait, for the default and learned models", async (t) => {
  const rng = new Xoshiro128(17)
  const out = new LatencyTerms()
  let worst = 0
  let over = 0
  let overLinear = 0
  let falls = 0
  for (let i = 0; i < 100_000; i++) {
    const inFlight = rng.next() < 0.2 ? 0 : rng.int(64)
    const maxBatched = [256, 2048, 8192, 10_000_000][rng.int(4)] as number
    const chunk = chunkTokens(maxBatched, inFlight)
    const total = rng.next() < 0.2 ? 0 : 100 + rng.int(100_000)
    const active = rng.int(total + 50)
    const queued = rng.next() < 0.2 ? 0 : 1 + rng.int(rng.next() < 0.5 ? 2 * chunk : 200_000)
    const uncached = rng.next() < 0.05 ? 0 : rng.int(rng.next() < 0.5 ? 2 * chunk : 100_000)
    const added = rng.int(3000)
    // a learned model: each coefficient within 1/20..20 of the default's (the estimator's limits)
    const d = DEFAULT_ENGINE_MODEL
    const r = (): number => 20 ** (2 * rng.next() - 1)
    const e = rng.next() < 0.3 ? d : new EngineModel(d.a * r(), d.b * r(), d.c * r(), d.base * r(), d.rise * r())
    const fleet = new FleetLoad()
    fleet.set(rng.int(5000), rng.next() * 500, 1 + rng.int(500), rng.next() < 0.5 ? d : e)
    const step = inFlight > 0 ? e.decodeMs(kvUsage(active, total)) : 0
    const stepMin = inFlight > 0 ? e.stepMin : 0
    const stepMax = inFlight > 0 ? (total > 0 ? e.stepMax : e.stepMin) : 0
    const wait = queued > 0 ? prefillTimeMs(queued, chunk, e) + prefillSteps(queued, chunk) * step : 0
    const cost = latencyTerms(queued, uncached, inFlight, chunk, active, added, total, fleet, out, e)
    // the bound at this wait and at any smaller one
    const below = wait * rng.next()
    const bound = latencyLowerBound(wait, uncached, inFlight, chunk, stepMin, stepMax, added, total, fleet, e)
    const lower = latencyLowerBound(below, uncached, inFlight, chunk, stepMin, stepMax, added, total, fleet, e)
    // the bound at no wait grown linearly with the wait, by the least own time: below the bound
    const atZero = latencyLowerBound(0, uncached, inFlight, chunk, stepMin, stepMax, added, total, fleet, e)
    const linear = atZero + (wait * (1 + fleet.arrivalsFor(e) * ownAtLeast(0, uncached, chunk, stepMin, e))) / 1000
    if (linear > bound * (1 + 1e-12)) overLinear++
    if (bound > cost * (1 + 1e-12) || lower > cost * (1 + 1e-12)) over++
    if (lower > bound * (1 + 1e-12)) falls++
    if (cost > 0) worst = Math.max(worst, bound / cost)
  }
  t.equal(over, 0, `bound ≤ cost in 100,000 random cases (closest: ${worst.toFixed(6)} of the cost)`)
  t.equal(overLinear, 0, 'the bound at no wait grown with the wait (ownAtLeast) never exceeds the bound')
  t.equal(falls, 0, 'a smaller wait never bounds higher')
  t.ok(worst > 0.99, 'and tight somewhere')
  // nothing to prefill and capacity unknown: the bound is the cost
  const fleet = new FleetLoad()
  const d = DEFAULT_ENGINE_MODEL
  fleet.set(40, 3, 10, d)
  const chunk = chunkTokens(8192, 4)
  const wait = prefillTimeMs(5000, chunk, d) + prefillSteps(5000, chunk) * d.stepMin
  const cost = latencyTerms(5000, 0, 4, chunk, 300, 64, 0, fleet, out, d)
  const bound = latencyLowerBound(wait, 0, 4, chunk, d.stepMin, d.stepMin, 64, 0, fleet, d)
  t.ok(Math.abs(bound - cost) <= 1e-12 * cost, `no prompt: bound ${bound} = cost ${cost}`)
})
