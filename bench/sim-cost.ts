// Virtual-time fleet simulation for cost design: the real Scheduler in front of MockEngines
// stepped in simulated time (no wall clock, no machine noise). Dev tool.
import { readTrace, TraceBlockHasher } from '../src/sim/replay/trace.js'
import type { TraceRequest } from '../src/sim/replay/trace.js'
import { expandTokens } from '../src/sim/replay/trace.js'
import { cacheBound } from '../src/sim/replay/bound.js'
import { sequenceHashesInto } from '../src/codec/hashing.js'
import { MockEngine } from '../src/sim/mocker/engine.js'
import type { EngineRequest } from '../src/sim/mocker/engine.js'
import { Scheduler } from '../src/scheduler/scheduler.js'
import type { SchedulerOptionsInput } from '../src/scheduler/options.js'
import { join } from 'node:path'
import { repoRoot } from './lib/common.js'

const BS = 64
import * as fs from 'node:fs'
const require_fs = () => fs

interface Opts {
  minutes: number
  offset: number
  workers: number
  load: number
  capacityFactor: number
  chunk: number
  variants: Record<string, SchedulerOptionsInput>
}

function mean(xs: number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length
}

function pct(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor(q * (s.length - 1)))] ?? NaN
}

function run(name: string, sched: SchedulerOptionsInput, reqs: TraceRequest[], o: Opts, k: number): string {
  let now = 0
  const engines: MockEngine[] = []
  const s = new Scheduler({ blockSize: BS, seed: Number(process.env.SIM_SEED ?? 1), ...sched }, { timers: false, clock: () => now })
  for (let i = 0; i < o.workers; i++) {
    engines.push(new MockEngine({ workerId: BigInt(i + 1), blockSize: BS, numGpuBlocks: k, maxNumBatchedTokens: o.chunk, autoStep: false, now: () => now }))
    s.addWorkerRank(BigInt(i + 1), 0, { maxNumBatchedTokens: o.chunk, totalKvBlocks: k })
  }
  const hasher = new TraceBlockHasher(BS)
  const t0 = reqs[0]?.timestamp ?? 0
  const arrival = reqs.map((r) => (r.timestamp - t0) / o.load)
  const ttft: number[] = []
  const info = new Map<string, { t: number; q: number; qmin: number; cachedHere: number; cachedMax: number; isl: number; slot: number; r: number; ttft?: number }>()
  const e2e: number[] = []
  const perWorker = new Array<number>(o.workers).fill(0)
  const stepEnd = new Array<number>(o.workers).fill(-1)
  const firsts: { id: string; at: number; e: number }[][] = engines.map(() => [])
  const pendingFirst: string[][] = engines.map(() => [])
  const pendingDone: string[][] = engines.map(() => [])
  const idOf = new Map<EngineRequest, string>()
  const sentAt = new Map<string, number>()
  const waiting: number[] = []
  const ov = new Float64Array(o.workers)
  const listener = (e: number) => ({
    onToken: (r: EngineRequest) => {
      if (r.outputTokens === 1) pendingFirst[e]?.push(idOf.get(r) as string)
    },
    onFinish: (r: EngineRequest) => {
      if (r.outputTokens === 1) pendingFirst[e]?.push(idOf.get(r) as string)
      pendingDone[e]?.push(idOf.get(r) as string)
    },
  })
  const listeners = engines.map((_, e) => listener(e))
  void firsts
  const startStep = (e: number): void => {
    const eng = engines[e] as MockEngine
    const rep = eng.step()
    if (rep === null) {
      stepEnd[e] = -1
      return
    }
    stepEnd[e] = now + rep.durationMs
  }
  const tryRoute = (i: number): boolean => {
    const r = reqs[i] as TraceRequest
    const n = hasher.blockCount(r)
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    hasher.hashesInto(r, lo, hi)
    const sLo = new Uint32Array(n)
    const sHi = new Uint32Array(n)
    sequenceHashesInto(lo, hi, n, sLo, sHi)
    for (let e = 0; e < o.workers; e++) ov[e] = n > 0 ? (engines[e] as MockEngine).pool.prefixHits(lo, hi, n) : 0
    const id = `r${i}`
    const qs = Array.from({ length: o.workers }, (_, e) => s.sequences.prefillTokens[e] as number)
    const d = s.tryRoute({ id, isl: r.input_length, overlapBlocks: ov, seqLo: sLo, seqHi: sHi })
    if (d === null) return false
    info.set(id, { t: now, q: qs[d.slot] as number, qmin: Math.min(...qs), cachedHere: (ov[d.slot] as number) * BS, cachedMax: Math.max(...ov) * BS, isl: r.input_length, slot: d.slot, r: s.sequences.inFlight[d.slot] as number })
    const e = d.slot
    perWorker[e] = (perWorker[e] ?? 0) + 1
    const er = (engines[e] as MockEngine).submit(expandTokens(r), Math.max(1, r.output_length), listeners[e])
    idOf.set(er, id)
    if (stepEnd[e] === -1) startStep(e)
    return true
  }
  let next = 0
  for (;;) {
    let tEng = Infinity
    let which = -1
    for (let e = 0; e < o.workers; e++) if ((stepEnd[e] as number) >= 0 && (stepEnd[e] as number) < tEng) (tEng = stepEnd[e] as number), (which = e)
    const tArr = next < reqs.length ? (arrival[next] as number) : Infinity
    if (tArr === Infinity && which < 0) break
    if (tArr <= tEng) {
      now = tArr
      sentAt.set(`r${next}`, now)
      if (waiting.length > 0 || !tryRoute(next)) waiting.push(next)
      next++
    } else {
      now = tEng
      const e = which
      for (const id of pendingFirst[e] as string[]) {
        ttft.push(now - (sentAt.get(id) as number))
        const inf = info.get(id)
        if (inf !== undefined) inf.ttft = now - (sentAt.get(id) as number)
        s.markPrefillComplete(id)
      }
      for (const id of pendingDone[e] as string[]) {
        e2e.push(now - (sentAt.get(id) as number))
        s.free(id)
      }
      ;(pendingFirst[e] as string[]).length = 0
      ;(pendingDone[e] as string[]).length = 0
      startStep(e)
      while (waiting.length > 0 && tryRoute(waiting[0] as number)) waiting.shift()
    }
  }
  let prompt = 0
  let cached = 0
  for (const e of engines) {
    prompt += e.stats.promptTokens
    cached += e.stats.cachedTokens
  }
  const spread = Math.max(...perWorker) / Math.min(...perWorker)
  if (process.env.SIM_DUMP !== undefined) {
    const rows = [...info.entries()].map(([id, v]) => ({ id, ...v }))
    require_fs().writeFileSync(`${process.env.SIM_DUMP}-${name}.json`, JSON.stringify({ perWorker, rows }))
  }
  return `${name.padEnd(28)} hit ${((cached / prompt) * 100).toFixed(1)}%  ttft p50 ${pct(ttft, 0.5).toFixed(0)} p90 ${pct(ttft, 0.9).toFixed(0)} p99 ${pct(ttft, 0.99).toFixed(0)} ms  spread ${spread.toFixed(2)} [${perWorker.join(" ")}]  mean ttft ${mean(ttft).toFixed(0)} e2e ${mean(e2e).toFixed(0)} p90 ${pct(e2e, 0.9).toFixed(0)}`
}

const argv = process.argv.slice(2)
const arg = (n: string, d: number): number => {
  const i = argv.indexOf(n)
  return i >= 0 ? Number(argv[i + 1]) : d
}
const o: Opts = {
  minutes: arg('--minutes', 20),
  offset: arg('--offset', 0),
  workers: arg('--workers', 8),
  load: arg('--load', 8),
  capacityFactor: arg('--capacity-factor', 1.25),
  chunk: arg('--chunk', 8192),
  variants: {},
}
const all = readTrace(join(repoRoot(), 'data', 'conversation_trace.jsonl'))
const reqs = all.filter((r) => r.timestamp >= o.offset * 60_000 && r.timestamp < (o.offset + o.minutes) * 60_000)
const bound = cacheBound(reqs, BS)
const k = Math.ceil((bound.uniqueBlocks / o.workers) * o.capacityFactor)
console.log(`slice ${o.offset}+${o.minutes} min: ${reqs.length} requests, bound ${(bound.hitRate * 100).toFixed(1)}%, K ${k}, load ${o.load}, chunk ${o.chunk}`)
const V: Record<string, SchedulerOptionsInput> = {
  latency: { cost: 'latency' },
  dynamo: { cost: 'dynamo' },
  tuned: { cost: 'dynamo', overlapScoreWeight: 10, overlapScoreCredit: 5 },
  'round-robin': { mode: 'round-robin' },
  'least-loaded': { mode: 'least-loaded' },
}
const pick = (process.env.SIM_VARIANTS ?? 'latency,dynamo,tuned,round-robin').split(',')
for (const v of pick) {
  const t = performance.now()
  console.log(`${run(v, V[v] ?? {}, reqs, o, k)}  [${((performance.now() - t) / 1000).toFixed(0)} s]`)
}
