// Engines' own KV-event batches (vLLM, SGLang), decoded here rather than on the main thread: the
// ZMQ listener hands this shard the batch's MessagePack as it came, and its events are read
// straight into the decoder's reused DecodedEvent and applied. What decoding needs to remember
// per worker-rank (salted chains, the refcounts that de-duplicate stores and removals) lives
// here too: a worker always maps to this one shard.
//
// The listener has ordered the batches (replaying gaps through the engine's socket), so these
// events never pass the event-id gap detection or the holds of parking.ts. A malformed batch is
// counted by reason and refused from its malformed event on (the events before it are applied,
// as the engine sent them); anything but a KvrError is a bug and restarts the shard.
import { EngineSkip } from '../../src/codec/engine-events.js'
import { EngineStreamDecoder } from '../../src/codec/engine-stream.js'
import { DecodedEvent, EventKind } from '../../src/codec/event-decoder.js'
import { KvrError } from '../../src/errors.js'
import { EngineDedup } from '../../src/index/engine-dedup.js'
import { E, E_BASE, ENGINE_SKIP_NAMES, HEARTBEAT } from '../../src/thread/protocol.js'
import { ENGINE_BATCH, ENGINE_RESET, EngineReset, readU32 } from '../../src/thread/records.js'
import { interrupt } from './queries.js'
import { counters, ctrl, index } from './state.js'
import { rejected } from './apply.js'
import { SAMPLE_ENGINE_MALFORMED, sample } from './log.js'
import { post } from './post.js'

/** One decoder per block size a batch names (the router's: one in practice). */
const decoders = new Map<number, EngineStreamDecoder>()
const dedup = new EngineDedup()
/** A batch's events, decoded before any is applied (reused: grown to the longest batch seen). */
const pending: DecodedEvent[] = []
/** Per pending event, the index of its skip reason, or -1 when it is applied. */
let skips = new Int8Array(64)
/** The published counters, E_BASE-relative. */
const engine = new Float64Array(E.end - E_BASE)
/** Worker-ranks whose block-size mismatch the main thread was told of (it warns once for each). */
const noted = new Set<string>()
const MAX_NOTED = 65536
/** Per listener ("lo:hi:rank"), the other ranks its batches named: a restart resets them too. */
const otherRanks = new Map<string, number[]>()
const SKIP_INDEX: Record<EngineSkip, number> = { block_size_mismatch: 0, attention_kind: 1, unknown_event: 2, empty: 3 }
if (ENGINE_SKIP_NAMES.some((n, i) => SKIP_INDEX[n] !== i)) throw new Error('engine skip words out of order')

function bump(at: number): void {
  engine[at] = (engine[at] as number) + 1
}

function decoderFor(blockSize: number): EngineStreamDecoder {
  let d = decoders.get(blockSize)
  if (d === undefined) decoders.set(blockSize, (d = new EngineStreamDecoder(blockSize)))
  return d
}

/** An ENGINE_BATCH record (one too short is counted as processed and dropped). */
export function onEngineBatch(bytes: Uint8Array): void {
  const at = ENGINE_BATCH.at
  if (bytes.length >= ENGINE_BATCH.length) {
    batch(bytes.subarray(ENGINE_BATCH.length), readU32(bytes, at.workerLo), readU32(bytes, at.workerHi), readU32(bytes, at.rank), readU32(bytes, at.blockSize))
  }
  counters.processed++
  publish()
}

/** An ENGINE_RESET record. */
export function onEngineReset(bytes: Uint8Array): void {
  const at = ENGINE_RESET.at
  if (bytes.length >= ENGINE_RESET.length) reset(readU32(bytes, at.workerLo), readU32(bytes, at.workerHi), readU32(bytes, at.rank), bytes[at.flag] as number)
  counters.processed++
  publish()
}

function batch(payload: Uint8Array, lo: number, hi: number, listenerRank: number, blockSize: number): void {
  counters.received++
  bump(E.batches - E_BASE)
  Atomics.add(ctrl, HEARTBEAT, 1)
  const dec = decoderFor(blockSize)
  // Every event is decoded before any is applied: a batch with a malformed event is refused
  // whole, as a decoder that reads the batch at once (vLLM's own, Dynamo's) refuses it.
  let n = 0
  let rank = listenerRank
  try {
    const count = dec.begin(payload)
    // the batch's own rank names the engine's; a batch without one is the listener's rank
    rank = dec.batchRank ?? listenerRank
    if (skips.length < count) skips = new Int8Array(Math.max(count, skips.length * 2))
    for (; n < count; n++) {
      // a batch of thousands of events must not hold lookups up
      if ((n & 15) === 15) interrupt()
      let ev = pending[n]
      if (ev === undefined) pending.push((ev = new DecodedEvent()))
      const skip = dec.next(lo, hi, rank, ev)
      skips[n] = skip === null ? -1 : SKIP_INDEX[skip]
      if (skip === EngineSkip.BlockSizeMismatch) note(lo, hi, rank, dec)
    }
  } catch (err) {
    if (!(err instanceof KvrError)) throw err
    const code = err.code
    const reason = code === 'KVR_ERR_EVENT_MALFORMED_MSGPACK' ? 0 : code === 'KVR_ERR_EVENT_WRONG_TYPE' ? 1 : code === 'KVR_ERR_EVENT_INVALID_NUMBER' ? 2 : 3
    bump(E.malformed - E_BASE + reason)
    sample(SAMPLE_ENGINE_MALFORMED, { code, error: err.message, lo, hi, dp_rank: rank })
    return
  }
  if (rank !== listenerRank) rememberRank(lo, hi, listenerRank, rank)
  let counts = dedup.counts(lo, hi, rank)
  for (let i = 0; i < n; i++) {
    if ((i & 15) === 15) interrupt()
    const skip = skips[i] as number
    if (skip >= 0) {
      bump(E.skipped - E_BASE + skip)
      continue
    }
    const ev = pending[i] as DecodedEvent
    bump(E.events - E_BASE)
    if (ev.kind === EventKind.Cleared) {
      // the index clears every rank of the worker, and the counts go with it, as Dynamo's do
      dedup.forgetWorker(lo, hi)
      counts = dedup.counts(lo, hi, rank)
    } else if (!dedup.filter(counts, ev)) continue
    const r = index.apply(ev)
    if (r === 0) counters.applied++
    else rejected(ev, r)
  }
  engine[E.duplicateStores - E_BASE] = dedup.duplicateStores
  engine[E.suppressedRemovals - E_BASE] = dedup.suppressedRemovals
}

function rememberRank(lo: number, hi: number, listenerRank: number, rank: number): void {
  const key = `${lo}:${hi}:${listenerRank}`
  const ranks = otherRanks.get(key)
  if (ranks === undefined) otherRanks.set(key, [rank])
  else if (!ranks.includes(rank)) ranks.push(rank)
}

function reset(lo: number, hi: number, rank: number, how: number): void {
  if (how === EngineReset.Rank) {
    // the restarted engine rank's blocks, and of any rank its batches named
    const key = `${lo}:${hi}:${rank}`
    for (const r of [rank, ...(otherRanks.get(key) ?? [])]) {
      index.resetWorkerRank(lo, hi, r)
      dedup.forgetRank(lo, hi, r)
      for (const d of decoders.values()) d.forgetRank(lo, hi, r)
      noted.delete(`${lo}:${hi}:${r}`)
    }
    otherRanks.delete(key)
    return
  }
  if (how === EngineReset.Worker) index.clearWorker(lo, hi, false)
  dedup.forgetWorker(lo, hi)
  for (const d of decoders.values()) d.forgetWorker(lo, hi)
  const prefix = `${lo}:${hi}:`
  for (const k of [...otherRanks.keys()]) if (k.startsWith(prefix)) otherRanks.delete(k)
  for (const k of [...noted]) if (k.startsWith(prefix)) noted.delete(k)
}

/** Tells the main thread of a block-size mismatch, once per worker-rank, so it can warn. */
function note(lo: number, hi: number, rank: number, dec: EngineStreamDecoder): void {
  const key = `${lo}:${hi}:${rank}`
  const m = dec.lastMismatch
  if (noted.has(key) || m === null) return
  if (noted.size >= MAX_NOTED) noted.clear()
  noted.add(key)
  post({ kind: 'engineNote', lo, hi, rank, eventBlockSize: m.eventBlockSize, routerBlockSize: m.routerBlockSize })
}

function publish(): void {
  for (let i = 0; i < engine.length; i++) Atomics.store(ctrl, E_BASE + i, (engine[i] as number) | 0)
}
