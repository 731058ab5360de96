// The workload of the index and NATS benchmarks: the Mooncake conversation trace, expanded to
// router block hashes, run through one simulated engine block pool per worker to produce the KV
// events those engines would publish, interleaved in trace order with the router's lookups.
// bench/index.ts replays the result against the sharded index and the single-threaded one, and
// bench/nats.ts publishes its events, so everything that is not the measured work (hashing, pool
// simulation, JSON encoding) happens here, once, before any clock starts.
//
// Worker assignment: a request goes to hash(hash_ids[1], hash_ids[2]) mod W. Every request of
// the trace starts with block 0 (a shared system prompt); the next ids identify the conversation,
// so its follow-up turns land on the worker that already caches their history, as a KV-aware
// router would send them. That gives each worker a realistic mix of long shared prefixes and
// evictions. Round-robin (also offered) scatters conversations over the fleet and leaves little
// reuse beyond block 0, which would make the index far smaller than in a routed fleet.
import { resolve } from 'node:path'
import { BlockPool } from '../../src/sim/mocker/block-pool.js'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'
import { readTrace, TraceBlockHasher, type TraceRequest } from '../../src/sim/replay/trace.js'
import { repoRoot } from './common.js'

export type WorkerAssignment = 'prefix' | 'round-robin'

export interface IndexWorkloadOptions {
  tracePath?: string
  /** Simulated workers (engines). */
  workers?: number
  /** Router and engine block size, in tokens. */
  blockSize?: number
  /** Blocks per worker's pool. */
  capacity?: number
  /** Use only the first N requests of the trace. */
  limit?: number
  assignment?: WorkerAssignment
  /** Worker i gets id workerIdBase + i. */
  workerIdBase?: bigint
}

export interface EventOp {
  kind: 'event'
  workerId: bigint
  /**
   * The RouterEvent as JSON (UTF-8), exactly as an engine would publish it. A view into a
   * shared arena: copy it (e.g. into a ring) rather than transferring its buffer.
   */
  bytes: Uint8Array
  /** Blocks the event stores or removes. */
  blocks: number
}

export interface LookupOp {
  kind: 'lookup'
  /** Local block hashes of the request's complete blocks, as u32 halves (views, like bytes). */
  lo: Uint32Array
  hi: Uint32Array
  n: number
}

export type WorkloadOp = EventOp | LookupOp

export interface IndexWorkloadCounts {
  requests: number
  lookups: number
  /** Blocks over all lookups. */
  lookupBlocks: number
  events: number
  storedEvents: number
  removedEvents: number
  /** Blocks over all events (stored + removed). */
  blocks: number
  storedBlocks: number
  removedBlocks: number
  /** Prompt blocks the pools found cached / had to store. */
  hits: number
  misses: number
  /** Requests whose prompt exceeded a pool's capacity (they produce a lookup but no event). */
  refused: number
  /** Blocks cached over all pools at the end. */
  cachedAtEnd: number
  /** Bytes of event JSON. */
  eventBytes: number
  /** Distinct trace block ids hashed. */
  traceBlocksHashed: number
}

/** The options in effect; plain JSON values, so a benchmark can write them into its results. */
export interface IndexWorkloadSettings {
  tracePath: string
  workers: number
  blockSize: number
  capacity: number
  /** null: the whole trace. */
  limit: number | null
  assignment: WorkerAssignment
  /** Decimal text of the first worker id. */
  workerIdBase: string
}

export interface IndexWorkload {
  options: IndexWorkloadSettings
  ops: WorkloadOp[]
  /** Worker ids, index = worker number. */
  workerIds: bigint[]
  counts: IndexWorkloadCounts
  buildMs: number
}

/** Etcd lease ids are i64 values far above 2^53; so are ours, to exercise the exact u64 paths. */
export const DEFAULT_WORKER_ID_BASE = 7587888130471510000n

/** `<repo root>/data/conversation_trace.jsonl`: the Mooncake trace the repository ships. */
export function defaultTracePath(): string {
  return resolve(repoRoot(), 'data', 'conversation_trace.jsonl')
}

function positiveInt(name: string, v: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!Number.isInteger(v) || v < 1 || v > max) throw new RangeError(`${name} must be an integer in [1, ${max}], got ${String(v)}`)
  return v
}

function mix(a: number, b: number): number {
  let h = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h ^ b, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

/** Worker of a request under the chosen assignment. */
export function assignWorker(req: TraceRequest, index: number, workers: number, assignment: WorkerAssignment): number {
  if (assignment === 'round-robin') return index % workers
  const ids = req.hash_ids
  // A request of one block is all system prompt: any worker serves it equally well.
  if (ids.length < 2) return index % workers
  return mix(ids[1] as number, ids.length > 2 ? (ids[2] as number) : 0xffffffff) % workers
}

/** Growable byte arena: one allocation for all event JSON instead of one per event. */
export class Arena {
  private buf = new Uint8Array(1 << 22)
  private used = 0
  private enc = new TextEncoder()
  bytes = 0

  add(text: string): Uint8Array {
    // JSON of events is ASCII, so the UTF-8 length is the string length.
    const len = text.length
    if (this.used + len > this.buf.length) {
      this.buf = new Uint8Array(Math.max(1 << 22, len))
      this.used = 0
    }
    const view = this.buf.subarray(this.used, this.used + len)
    this.enc.encodeInto(text, view)
    this.used += len
    this.bytes += len
    return view
  }
}

export function buildIndexWorkload(opts: IndexWorkloadOptions = {}): IndexWorkload {
  const t0 = performance.now()
  const workerIdBase = opts.workerIdBase ?? DEFAULT_WORKER_ID_BASE
  const options: IndexWorkloadSettings = {
    tracePath: opts.tracePath ?? defaultTracePath(),
    workers: positiveInt('workers', opts.workers ?? 64, 65534),
    blockSize: positiveInt('blockSize', opts.blockSize ?? 64, 65536),
    capacity: positiveInt('capacity', opts.capacity ?? 4096),
    limit: opts.limit === undefined || opts.limit === Infinity ? null : Math.max(0, Math.floor(opts.limit)),
    assignment: opts.assignment ?? 'prefix',
    workerIdBase: workerIdBase.toString(),
  }
  if (options.assignment !== 'prefix' && options.assignment !== 'round-robin') throw new RangeError(`unknown assignment "${String(options.assignment)}"`)
  if (workerIdBase < 0n || workerIdBase + BigInt(options.workers) - 1n > 0xffffffffffffffffn) throw new RangeError('worker ids must be u64 values')
  if (options.limit !== null && Number.isNaN(options.limit)) throw new RangeError('limit must be a number')
  const trace = readTrace(options.tracePath, { limit: options.limit ?? Infinity })
  const hasher = new TraceBlockHasher(options.blockSize)

  const ops: WorkloadOp[] = []
  const arena = new Arena()
  const counts: IndexWorkloadCounts = {
    requests: trace.length,
    lookups: 0,
    lookupBlocks: 0,
    events: 0,
    storedEvents: 0,
    removedEvents: 0,
    blocks: 0,
    storedBlocks: 0,
    removedBlocks: 0,
    hits: 0,
    misses: 0,
    refused: 0,
    cachedAtEnd: 0,
    eventBytes: 0,
    traceBlocksHashed: 0,
  }
  const sink = (ev: RouterEvent): void => {
    const d = ev.event.data
    let blocks = 0
    if (d !== 'cleared') {
      if ('stored' in d) {
        blocks = d.stored.blocks.length
        counts.storedEvents++
        counts.storedBlocks += blocks
      } else {
        blocks = d.removed.block_hashes.length
        counts.removedEvents++
        counts.removedBlocks += blocks
      }
    }
    ops.push({ kind: 'event', workerId: ev.worker_id, bytes: arena.add(encodeRouterEvent(ev)), blocks })
    counts.events++
    counts.blocks += blocks
  }
  const workerIds: bigint[] = []
  const pools: BlockPool[] = []
  for (let w = 0; w < options.workers; w++) {
    const workerId = workerIdBase + BigInt(w)
    workerIds.push(workerId)
    pools.push(new BlockPool({ capacity: options.capacity, blockSize: options.blockSize, workerId, sink }))
  }

  // Lookups are views into two big arrays: one allocation instead of two per request.
  let total = 0
  for (const req of trace) total += hasher.blockCount(req)
  const allLo = new Uint32Array(total)
  const allHi = new Uint32Array(total)
  let at = 0
  for (let i = 0; i < trace.length; i++) {
    const req = trace[i] as TraceRequest
    const n = hasher.blockCount(req)
    const lo = allLo.subarray(at, at + n)
    const hi = allHi.subarray(at, at + n)
    hasher.hashesInto(req, lo, hi)
    at += n
    // The router looks up first; the engine stores after it was chosen.
    ops.push({ kind: 'lookup', lo, hi, n })
    counts.lookups++
    counts.lookupBlocks += n
    const pool = pools[assignWorker(req, i, options.workers, options.assignment)] as BlockPool
    const r = pool.allocate(i, lo, hi, n)
    if (!r.ok) {
      counts.refused++
      continue
    }
    counts.hits += r.hits
    counts.misses += n - r.hits
    pool.release(i)
  }
  for (const p of pools) counts.cachedAtEnd += p.used
  counts.eventBytes = arena.bytes
  counts.traceBlocksHashed = hasher.hashedTraceBlocks
  return { options, ops, workerIds, counts, buildMs: performance.now() - t0 }
}
