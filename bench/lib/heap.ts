// The scheduler's binary heap (src/scheduler/binary-heap.ts) under its two owners, for
// `npm run bench:micro`:
//   (a) approximate mode: ApproxTracker.record + TTL expiry over a 200k-block stream on 8
//       worker-ranks. Prompts share a few system prefixes, so many records refresh entries and
//       leave stale heap nodes behind; the clock moves so that expiry runs all along, and the
//       tracker is drained at the end. Figure: blocks recorded per second.
//   (b) the waiting room: PendingQueue churn at a steady depth, each step one push plus one of
//       pop (70%), removal of an arbitrary waiter (20%) or pop + restore + pop (10%). Keys are
//       fcfs-like (arrival order, four arrivals per tick so ties are common, a few priority
//       jumps). Figure: queue operations per second.
// Inputs are generated before timing; both cases alternate in one process so that each runs
// with the other's code warm, as in a router with approximate mode on. Medians over REPS.
// Only public APIs of the two classes are used, so the same file measures an older tree too.
import { ApproxTracker } from '../../src/scheduler/approximate.js'
import type { ApproxSink } from '../../src/scheduler/approximate.js'
import { PendingQueue } from '../../src/scheduler/pending-queue.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import { WorkerRanks } from '../../src/scheduler/worker-ranks.js'
import { median } from './common.js'

const WORKERS = 8
const TOTAL_BLOCKS = 200_000
const TTL_MS = 10_000
const MS_PER_REQUEST = 5
const QUEUE_DEPTH = 10_000
const QUEUE_STEPS = 1_000_000

/**
 * Per second of wall time, and per second of this process's CPU time (user + system): the latter
 * moves less when other tenants take the cores.
 */
interface Rate {
  wall: number
  cpu: number
}

interface Mark {
  wall: bigint
  cpu: NodeJS.CpuUsage
}

function mark(): Mark {
  return { wall: process.hrtime.bigint(), cpu: process.cpuUsage() }
}

function rate(count: number, m: Mark): Rate {
  const wall = Number(process.hrtime.bigint() - m.wall) / 1e9
  const cpu = process.cpuUsage(m.cpu)
  return { wall: count / wall, cpu: count / ((cpu.user + cpu.system) / 1e6) }
}

// ---- (a) approximate mode ----------------------------------------------------------------

interface Req {
  slot: number
  seqLo: Uint32Array
  seqHi: Uint32Array
  localLo: Uint32Array
  localHi: Uint32Array
}

function approxStream(): { reqs: Req[]; blocks: number } {
  const rng = new Xoshiro128(7)
  const PREFIXES = 48
  const prefixLen = Array.from({ length: PREFIXES }, () => 8 + rng.int(25))
  const reqs: Req[] = []
  let blocks = 0
  let unique = 1 << 20
  while (blocks < TOTAL_BLOCKS) {
    // a skewed choice of system prompt: a few are hot
    const p = Math.floor(PREFIXES * rng.next() ** 2)
    const pl = prefixLen[p] as number
    const n = pl + 4 + rng.int(45)
    const seqLo = new Uint32Array(n)
    const seqHi = new Uint32Array(n)
    for (let i = 0; i < n; i++) {
      seqLo[i] = i < pl ? (p << 8) | i : unique++
      seqHi[i] = i < pl ? 0x51 : 0x52
    }
    // prefix affinity most of the time, as a KV-aware router would route
    const slot = rng.next() < 0.8 ? p % WORKERS : rng.int(WORKERS)
    reqs.push({ slot, seqLo, seqHi, localLo: seqLo, localHi: seqHi })
    blocks += n
  }
  return { reqs, blocks }
}

function benchApprox(reqs: Req[], blocks: number): Rate {
  const workers = new WorkerRanks()
  for (let w = 0; w < WORKERS; w++) workers.register(BigInt(100 + w), 0)
  let stored = 0
  let removed = 0
  const sink: ApproxSink = {
    stored: (_w, _r, _ll, _lh, _sl, _sh, n) => {
      stored += n
    },
    removed: (_w, _r, _sl, _sh, n) => {
      removed += n
    },
  }
  const tr = new ApproxTracker(workers, sink, { ttlMs: TTL_MS, maxTreeSize: 1 << 20, pruneTargetRatio: 0.8 })
  let now = 0
  const t0 = mark()
  for (let i = 0; i < reqs.length; i++) {
    const r = reqs[i] as Req
    now += MS_PER_REQUEST
    tr.record(r.slot, r.localLo, r.localHi, r.seqLo, r.seqHi, r.seqLo.length, now)
  }
  tr.expire(Infinity)
  const out = rate(blocks, t0)
  if (stored !== blocks || tr.size !== 0 || removed === 0) throw new Error(`approx state drifted: stored ${stored}, size ${tr.size}`)
  return out
}

// ---- (b) the waiting room ----------------------------------------------------------------

interface Churn {
  keys: Float64Array
  ops: Uint8Array
  victims: Int32Array
}

const OP_POP = 0
const OP_REMOVE = 1
const OP_RESTORE = 2

function churnInputs(): Churn {
  const rng = new Xoshiro128(11)
  const n = QUEUE_DEPTH + QUEUE_STEPS
  const keys = new Float64Array(n)
  for (let i = 0; i < n; i++) keys[i] = -(i >> 2) + (rng.next() < 0.05 ? 1 + rng.int(50) : 0)
  const ops = new Uint8Array(QUEUE_STEPS)
  const victims = new Int32Array(QUEUE_STEPS)
  for (let i = 0; i < QUEUE_STEPS; i++) {
    const r = rng.next()
    ops[i] = r < 0.7 ? OP_POP : r < 0.9 ? OP_REMOVE : OP_RESTORE
    // after the step's push, handles 0..QUEUE_DEPTH are all queued
    victims[i] = rng.int(QUEUE_DEPTH + 1)
  }
  return { keys, ops, victims }
}

function benchQueue(c: Churn): Rate {
  const q = new PendingQueue()
  const keys = c.keys
  for (let h = 0; h < QUEUE_DEPTH; h++) q.push(h, keys[h] as number)
  // the one free handle, as the scheduler's free list would hand it out
  let free = QUEUE_DEPTH
  let ops = 0
  const t0 = mark()
  for (let i = 0; i < QUEUE_STEPS; i++) {
    q.push(free, keys[QUEUE_DEPTH + i] as number)
    const op = c.ops[i] as number
    if (op === OP_POP) {
      free = q.pop()
      ops += 2
    } else if (op === OP_REMOVE) {
      free = c.victims[i] as number
      q.remove(free)
      ops += 2
    } else {
      q.restore(q.pop())
      free = q.pop()
      ops += 4
    }
  }
  const out = rate(ops, t0)
  if (q.size !== QUEUE_DEPTH || q.has(free)) throw new Error(`queue state drifted: size ${q.size}`)
  return out
}

export interface HeapFigures {
  blocks: number
  requests: number
  workers: number
  ttl_ms: number
  queue_depth: number
  queue_steps: number
  /** Blocks recorded per second (wall, and per CPU-second), medians. */
  approx_blocks_per_sec: number
  approx_blocks_per_cpu_sec: number
  /** Queue operations per second (wall, and per CPU-second), medians. */
  queue_ops_per_sec: number
  queue_ops_per_cpu_sec: number
}

export function benchHeap(reps: number): HeapFigures {
  const { reqs, blocks } = approxStream()
  const churn = churnInputs()
  // one untimed round of each so that both are optimised before the timed ones
  benchApprox(reqs, blocks)
  benchQueue(churn)
  const approxReps: Rate[] = []
  const queueReps: Rate[] = []
  for (let r = 0; r < reps; r++) {
    approxReps.push(benchApprox(reqs, blocks))
    queueReps.push(benchQueue(churn))
  }
  const wall = (xs: Rate[]): number => Math.round(median(xs.map((x) => x.wall)))
  const cpu = (xs: Rate[]): number => Math.round(median(xs.map((x) => x.cpu)))
  return {
    blocks,
    requests: reqs.length,
    workers: WORKERS,
    ttl_ms: TTL_MS,
    queue_depth: QUEUE_DEPTH,
    queue_steps: QUEUE_STEPS,
    approx_blocks_per_sec: wall(approxReps),
    approx_blocks_per_cpu_sec: cpu(approxReps),
    queue_ops_per_sec: wall(queueReps),
    queue_ops_per_cpu_sec: cpu(queueReps),
  }
}
