// The pruned selection against the full scan on the benchmarks' request stream: a slice of the
// Mooncake conversation trace (data/, as bench:e2e and bench:fleet-sim replay it) through two
// schedulers in lockstep in front of simulated engines (bench:fleet-sim's loop, virtual time).
// The pruned scheduler gets each request's overlaps as the route path gives them (the slots that
// hold a prefix and their blocks), the full scan a dense array; every decision must be the same.
import t from 'tap'
import { sequenceHashesInto } from '../../src/codec/hashing.js'
import type { EngineRequest, RequestListener } from '../../src/sim/mocker/engine.js'
import { MockEngine } from '../../src/sim/mocker/engine.js'
import { cacheBound } from '../../src/sim/replay/bound.js'
import type { TraceRequest } from '../../src/sim/replay/trace.js'
import { expandTokens, readTrace, TraceBlockHasher } from '../../src/sim/replay/trace.js'
import type { SchedulerOptionsInput } from '../../src/scheduler/options.js'
import type { RouteDecision } from '../../src/scheduler/scheduler.js'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import { fromRoot } from '../helpers/paths.js'

const TRACE = fromRoot('data', 'conversation_trace.jsonl')
const BLOCK_SIZE = 64

interface Run {
  decisions: number
  pruned: number
  mismatches: string[]
  hitRate: number
}

/** Replays `requests` to `workers` × `ranks` engines at `load` × the trace's rate. */
function replay(options: SchedulerOptionsInput, requests: TraceRequest[], workers: number, ranks: number, load: number): Run {
  let now = 0
  const mk = (fullScan: boolean): Scheduler => new Scheduler({ blockSize: BLOCK_SIZE, seed: 1, ...options }, { timers: false, clock: () => now, fullScan })
  const pruned = mk(false)
  const full = mk(true)
  const n = workers * ranks
  const bound = cacheBound(requests, BLOCK_SIZE)
  // bench:fleet-sim's capacity, and room for the slice's longest prompt however many engines share it
  const blocksPerEngine = Math.max(Math.ceil((bound.uniqueBlocks / n) * 1.25), 2048)
  const engines: MockEngine[] = []
  for (let w = 0; w < workers; w++) {
    for (let r = 0; r < ranks; r++) {
      engines.push(
        new MockEngine({
          workerId: BigInt(w + 1),
          blockSize: BLOCK_SIZE,
          numGpuBlocks: blocksPerEngine,
          maxNumBatchedTokens: 8192,
          autoStep: false,
          now: () => now,
        }),
      )
      for (const s of [pruned, full]) s.addWorkerRank(BigInt(w + 1), r, { maxNumBatchedTokens: 8192, totalKvBlocks: blocksPerEngine })
    }
  }
  const hasher = new TraceBlockHasher(BLOCK_SIZE)
  const t0 = requests[0]?.timestamp ?? 0
  const stepEnd = new Float64Array(n).fill(-1)
  const firsts: number[][] = engines.map(() => [])
  const ends: number[][] = engines.map(() => [])
  const idOf = new Map<EngineRequest, number>()
  const listeners: RequestListener[] = engines.map((_, e) => ({
    onToken: (r) => {
      if (r.outputTokens === 1) firsts[e]?.push(idOf.get(r) as number)
    },
    onFinish: (r) => {
      if (r.outputTokens === 1) firsts[e]?.push(idOf.get(r) as number)
      ends[e]?.push(idOf.get(r) as number)
    },
  }))
  const out: Run = { decisions: 0, pruned: 0, mismatches: [], hitRate: 0 }
  const dense = new Float64Array(n)
  const line = (d: RouteDecision | null): string => (d === null ? 'wait' : `${d.slot} ov=${d.overlapBlocks}`)
  const route = (i: number): boolean => {
    const r = requests[i] as TraceRequest
    const k = hasher.blockCount(r)
    const lo = new Uint32Array(k)
    const hi = new Uint32Array(k)
    hasher.hashesInto(r, lo, hi)
    const sLo = new Uint32Array(k)
    const sHi = new Uint32Array(k)
    sequenceHashesInto(lo, hi, k, sLo, sHi)
    const slots: number[] = []
    const values: number[] = []
    for (let e = 0; e < n; e++) {
      dense[e] = k > 0 ? (engines[e] as MockEngine).pool.prefixHits(lo, hi, k) : 0
      if (dense[e] !== 0) {
        slots.push(e)
        values.push(dense[e] as number)
      }
    }
    const base = { id: String(i), isl: r.input_length, seqLo: sLo, seqHi: sHi }
    const a = pruned.tryRoute({ ...base, overlapSlots: slots, overlapValues: values })
    const b = full.tryRoute({ ...base, overlapBlocks: dense })
    out.decisions++
    if (line(a) !== line(b)) out.mismatches.push(`request ${i}: pruned ${line(a)}, full scan ${line(b)}`)
    if (a === null) return false
    const e = a.slot
    idOf.set((engines[e] as MockEngine).submit(expandTokens(r), Math.max(1, r.output_length), listeners[e] as RequestListener), i)
    if (stepEnd[e] === -1) {
      const report = (engines[e] as MockEngine).step()
      stepEnd[e] = report === null ? -1 : now + report.durationMs
    }
    return true
  }
  const waiting: number[] = []
  let next = 0
  while (out.mismatches.length === 0) {
    let e = -1
    for (let w = 0; w < n; w++) if ((stepEnd[w] as number) >= 0 && (e < 0 || (stepEnd[w] as number) < (stepEnd[e] as number))) e = w
    const arrival = next < requests.length ? ((requests[next] as TraceRequest).timestamp - t0) / load : Infinity
    if (e < 0 && arrival === Infinity) break
    if (e < 0 || arrival <= (stepEnd[e] as number)) {
      now = arrival
      if (waiting.length > 0 || !route(next)) waiting.push(next)
      next++
      continue
    }
    now = stepEnd[e] as number
    for (const i of firsts[e] as number[]) for (const s of [pruned, full]) s.markPrefillComplete(String(i))
    for (const i of ends[e] as number[]) for (const s of [pruned, full]) s.free(String(i))
    ;(firsts[e] as number[]).length = 0
    ;(ends[e] as number[]).length = 0
    const report = (engines[e] as MockEngine).step()
    stepEnd[e] = report === null ? -1 : now + report.durationMs
    while (waiting.length > 0 && out.mismatches.length === 0 && route(waiting[0] as number)) waiting.shift()
  }
  let prompt = 0
  let cached = 0
  for (const e of engines) {
    prompt += e.stats.promptTokens
    cached += e.stats.cachedTokens
  }
  out.hitRate = prompt > 0 ? cached / prompt : 0
  out.pruned = pruned.stats().prunedTotal
  return out
}

const requests = readTrace(TRACE).filter((r) => r.timestamp < 4 * 60_000)

const CASES: { name: string; options: SchedulerOptionsInput; workers: number; ranks: number; load: number }[] = [
  { name: 'latency cost, 8 engines', options: { mode: 'kv' }, workers: 8, ranks: 1, load: 8 },
  { name: "Dynamo's cost, 8 engines", options: { mode: 'kv', cost: 'dynamo' }, workers: 8, ranks: 1, load: 8 },
  { name: 'latency cost, 64 engines as 16 workers × 4 dp ranks', options: { mode: 'kv' }, workers: 16, ranks: 4, load: 48 },
  {
    name: "Dynamo's cost tuned, 64 engines",
    options: { mode: 'kv', cost: 'dynamo', overlapScoreWeight: 10, overlapScoreCredit: 5 },
    workers: 64,
    ranks: 1,
    load: 48,
  },
  { name: 'latency cost, 256 engines, queue threshold 1', options: { mode: 'kv', queueThreshold: 1 }, workers: 256, ranks: 1, load: 160 },
]

for (const c of CASES) {
  t.test(c.name, async (t) => {
    const r = replay(c.options, requests, c.workers, c.ranks, c.load)
    t.same(r.mismatches, [], `${r.decisions} decisions on ${requests.length} requests of the trace's first 4 minutes`)
    t.ok(r.decisions >= requests.length, 'every request decided')
    t.equal(r.pruned, requests.length, 'each booked by the pruned selection')
    // the stream is the real one: prefixes are cached and found
    t.ok(r.hitRate > 0.1, `hit rate ${(r.hitRate * 100).toFixed(1)}%`)
  })
}
