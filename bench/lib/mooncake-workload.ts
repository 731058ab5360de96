// The workload of Dynamo's indexer benchmark (`mooncake_bench`), rebuilt on this repository's
// own parts so that `bench:index --mooncake` reports figures in Dynamo's units. What Dynamo does,
// with the source each fact comes from, is in docs/benchmarks.md § bench:index; in short:
//
//   1. the trace's requests (optionally each id stretched into `lengthFactor` ids, and the
//      whole trace copied `duplication` times under disjoint ids) are dealt uniformly at random
//      (seeded) over W workers;
//   2. each worker's requests go through its own mock engine (prefix caching on, no batch or
//      sequence cap, steps take no time) whose KV events are collected. Every trace id is one
//      full block of `blockSize` tokens (the last, partial one included), so at the default
//      block size of 512 one id is one block;
//   3. each worker's lookups (all the request's blocks) and events are merged into one timeline,
//      normalised to [0, 1] per worker; the replay scales it to a chosen duration.
//
// Differences, on purpose: the engines run in virtual time (an event happens at its request's
// arrival, as with steps that take no time, but without the wall-clock jitter of Dynamo's
// real-time generation pass), and the engine is src/sim/mocker/engine.ts, not Dynamo's mocker.
import { MockEngine } from '../../src/sim/mocker/engine.js'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'
import { EventDecoder } from '../../src/codec/event-decoder.js'
import { DecodedEvent } from '../../src/codec/decoded-event.js'
import { fillTraceBlock, readTrace, TRACE_BLOCK_TOKENS, TraceBlockHasher, type TraceRequest } from '../../src/sim/replay/trace.js'
import { uniformDraws } from './stats.js'
import { Arena, DEFAULT_WORKER_ID_BASE, defaultTracePath } from './index-workload.js'

export interface MooncakeWorkloadOptions {
  tracePath?: string
  /** Simulated inference workers; Dynamo's default is 256. */
  workers?: number
  /** Engine and router block size in tokens; must divide 512. Dynamo's blog-era default is 512. */
  blockSize?: number
  /** KV blocks per engine; the Flash Indexer post used 16,384. */
  gpuBlocks?: number
  /** First N requests of the trace. */
  limit?: number
  /** Each trace id becomes this many consecutive ids (Dynamo's --trace-length-factor). */
  lengthFactor?: number
  /** Copies of the trace under disjoint ids (Dynamo's --trace-duplication-factor). */
  duplication?: number
  /** Seed of the request-to-worker deal. */
  seed?: number
}

export interface MooncakeWorkloadSettings {
  tracePath: string
  workers: number
  blockSize: number
  gpuBlocks: number
  limit: number | null
  lengthFactor: number
  duplication: number
  seed: number
}

/** One timeline entry: a lookup or a KV event, at `at` ∈ [0, 1] of its worker's span. */
export type MooncakeOp =
  | { kind: 'lookup'; at: number; lo: Uint32Array; hi: Uint32Array; n: number }
  | { kind: 'event'; at: number; workerId: bigint; bytes: Uint8Array; decoded: DecodedEvent; stored: number; removed: number }

export interface MooncakeCounts {
  requests: number
  /** find_matches calls (one per request). */
  lookups: number
  lookupBlocks: number
  events: number
  storedEvents: number
  removedEvents: number
  clearedEvents: number
  storedBlocks: number
  removedBlocks: number
  /** Workers that got at least one request. */
  activeWorkers: number
  /** Prompt tokens the engines found cached over prompt tokens. */
  engineHitRate: number
  /** Requests longer than an engine's KV (prompt + output): looked up, never run. */
  refused: number
}

export interface MooncakeWorkload {
  options: MooncakeWorkloadSettings
  /** Sorted by `at`; a request's lookup before its events. */
  ops: MooncakeOp[]
  workerIds: bigint[]
  counts: MooncakeCounts
  buildMs: number
}

function positiveInt(name: string, v: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!Number.isInteger(v) || v < 1 || v > max) throw new RangeError(`${name} must be an integer in [1, ${max}], got ${String(v)}`)
  return v
}

/** Each request `duplication` times in a row, copy d with every id shifted by d × (the largest id + 1): disjoint prompts. */
export function duplicateTrace(trace: readonly TraceRequest[], duplication: number): TraceRequest[] {
  let max = 0
  for (const r of trace) for (const h of r.hash_ids) if (h > max) max = h
  const copies: TraceRequest[] = []
  for (const r of trace) for (let d = 0; d < duplication; d++) copies.push({ ...r, hash_ids: r.hash_ids.map((h) => h + (max + 1) * d) })
  return copies
}

/** Dynamo's length expansion and duplication, applied to the trace before it is dealt out. */
export function expandTrace(trace: readonly TraceRequest[], lengthFactor: number, duplication: number): TraceRequest[] {
  let out = trace.map((r) => ({ ...r, hash_ids: r.hash_ids.flatMap((h) => Array.from({ length: lengthFactor }, (_, j) => h * lengthFactor + j)) }))
  if (duplication > 1) out = duplicateTrace(out, duplication)
  // every id is a full block: the prompt is the whole id list, as Dynamo's token expansion makes it
  return out.map((r) => ({ ...r, input_length: r.hash_ids.length * TRACE_BLOCK_TOKENS }))
}

/** A copy of a decoded event that the next decode will not overwrite. */
function detach(ev: DecodedEvent): DecodedEvent {
  const d = new DecodedEvent()
  Object.assign(d, ev)
  d.blockLo = ev.blockLo.slice(0, Math.max(1, ev.count))
  d.blockHi = ev.blockHi.slice(0, Math.max(1, ev.count))
  d.tokensLo = ev.tokensLo.slice(0, Math.max(1, ev.count))
  d.tokensHi = ev.tokensHi.slice(0, Math.max(1, ev.count))
  return d
}

export function buildMooncakeWorkload(opts: MooncakeWorkloadOptions = {}): MooncakeWorkload {
  const t0 = performance.now()
  const options: MooncakeWorkloadSettings = {
    tracePath: opts.tracePath ?? defaultTracePath(),
    workers: positiveInt('workers', opts.workers ?? 256, 65534),
    blockSize: positiveInt('blockSize', opts.blockSize ?? 512, TRACE_BLOCK_TOKENS),
    gpuBlocks: positiveInt('gpuBlocks', opts.gpuBlocks ?? 16384, 1 << 26),
    limit: opts.limit === undefined ? null : positiveInt('limit', opts.limit),
    lengthFactor: positiveInt('lengthFactor', opts.lengthFactor ?? 1, 64),
    duplication: positiveInt('duplication', opts.duplication ?? 1, 1024),
    seed: opts.seed ?? 42,
  }
  const bs = options.blockSize
  if (TRACE_BLOCK_TOKENS % bs !== 0) throw new RangeError(`blockSize must divide ${TRACE_BLOCK_TOKENS}, got ${bs}`)
  const raw = readTrace(options.tracePath, { limit: options.limit ?? Infinity })
  const trace = expandTrace(raw, options.lengthFactor, options.duplication)

  // the deal: uniform and seeded, like Dynamo's partition_trace (not its exact draws)
  const draw = uniformDraws(options.seed)
  const perWorker: TraceRequest[][] = Array.from({ length: options.workers }, () => [])
  for (const r of trace) (perWorker[Math.floor(draw() * options.workers)] as TraceRequest[]).push(r)

  const hasher = new TraceBlockHasher(bs)
  const decoder = new EventDecoder()
  const arena = new Arena()
  const counts: MooncakeCounts = {
    requests: trace.length,
    lookups: 0,
    lookupBlocks: 0,
    events: 0,
    storedEvents: 0,
    removedEvents: 0,
    clearedEvents: 0,
    storedBlocks: 0,
    removedBlocks: 0,
    activeWorkers: 0,
    engineHitRate: 0,
    refused: 0,
  }
  let promptTokens = 0
  let cachedTokens = 0
  const timed: { at: number; worker: number; seq: number; op: MooncakeOp }[] = []
  const workerIds: bigint[] = []
  for (let w = 0; w < options.workers; w++) {
    const workerId = DEFAULT_WORKER_ID_BASE + BigInt(w)
    workerIds.push(workerId)
    const reqs = perWorker[w] as TraceRequest[]
    if (reqs.length === 0) continue
    counts.activeWorkers++
    const first = (reqs[0] as TraceRequest).timestamp
    const span = (reqs[reqs.length - 1] as TraceRequest).timestamp - first
    let now = 0
    let seq = 0
    const onEvent = (ev: RouterEvent): void => {
      const bytes = arena.add(encodeRouterEvent(ev))
      const decoded = detach(decoder.decode(bytes))
      const d = ev.event.data
      let stored = 0
      let removed = 0
      if (d === 'cleared') counts.clearedEvents++
      else if ('stored' in d) {
        stored = d.stored.blocks.length
        counts.storedEvents++
      } else {
        removed = d.removed.block_hashes.length
        counts.removedEvents++
      }
      counts.events++
      counts.storedBlocks += stored
      counts.removedBlocks += removed
      timed.push({ at: now, worker: w, seq: seq++, op: { kind: 'event', at: now, workerId, bytes, decoded, stored, removed } })
    }
    const engine = new MockEngine({
      workerId,
      blockSize: bs,
      numGpuBlocks: options.gpuBlocks,
      maxNumSeqs: 1 << 20,
      maxNumBatchedTokens: 1 << 30,
      speedupRatio: 0,
      autoStep: false,
      ringSize: 16,
      now: () => now,
      onEvent,
    })
    for (let i = 0; i < reqs.length; ) {
      const ts = (reqs[i] as TraceRequest).timestamp
      now = span === 0 ? 0 : (ts - first) / span
      // requests with one timestamp arrive together, as Dynamo submits them before it sleeps
      for (; i < reqs.length && (reqs[i] as TraceRequest).timestamp === ts; i++) {
        const r = reqs[i] as TraceRequest
        const h = hasher.hashes(r)
        counts.lookups++
        counts.lookupBlocks += h.n
        timed.push({ at: now, worker: w, seq: seq++, op: { kind: 'lookup', at: now, lo: h.lo, hi: h.hi, n: h.n } })
        if (Math.ceil((r.input_length + Math.max(1, r.output_length)) / bs) > options.gpuBlocks) {
          counts.refused++
          continue
        }
        const prompt = new Uint32Array(r.input_length)
        for (let k = 0; k < r.hash_ids.length; k++) fillTraceBlock(r.hash_ids[k] as number, prompt, k * TRACE_BLOCK_TOKENS)
        engine.submit(prompt, Math.max(1, r.output_length))
      }
      while (engine.step() !== null) {}
    }
    promptTokens += engine.stats.promptTokens
    cachedTokens += engine.stats.cachedTokens
    engine.close()
  }
  counts.engineHitRate = promptTokens === 0 ? 0 : cachedTokens / promptTokens
  // time order over the fleet; ties keep each worker's own order (its lookup before its events)
  timed.sort((a, b) => a.at - b.at || a.worker - b.worker || a.seq - b.seq)
  return { options, ops: timed.map((x) => x.op), workerIds, counts, buildMs: performance.now() - t0 }
}
