// What a shard has counted, read from its control words without a message (the shard publishes
// them per batch; layout in src/thread/protocol.ts), plus what the main thread counts of it.
import { C, E, E_BASE, ENGINE_MALFORMED_NAMES, ENGINE_SKIP_NAMES } from '../thread/protocol.js'
import { REJECT_REASON_COUNT, REJECT_REASON_NAMES } from '../index/kv-index.js'
import type { Shard, ShardHealth } from './shard.js'

/** What a shard made of engines' own KV-event batches (src/transport/engine-intake.ts). */
export interface EngineCounters {
  batches: number
  /** Events decoded to be applied (before de-duplication). */
  events: number
  /** Events not applied, by ENGINE_SKIP_NAMES reason. */
  skipped: Record<string, number>
  /** Blocks stored again while the worker-rank held them. */
  duplicateStores: number
  /** Block removals held back because the hash was stored more often than removed. */
  suppressedRemovals: number
  /** Batches refused whole (one event did not decode), by ENGINE_MALFORMED_NAMES reason. */
  malformed: Record<string, number>
}

export interface ShardCounters {
  shard: number
  health: ShardHealth
  restarts: number
  enqueued: number
  received: number
  processed: number
  applied: number
  malformed: number
  rejected: Record<string, number>
  /** Events applied whole, by kind. */
  appliedByType: { stored: number; removed: number; cleared: number }
  /** Rejections by event kind, then reason. */
  rejectedByType: { stored: Record<string, number>; removed: Record<string, number>; cleared: Record<string, number> }
  blocks: number
  /** Blocks held in lower tiers (host_pinned, disk, external), beside the device entries. */
  lowerBlocks: number
  nodes: number
  workerRanks: number
  queries: number
  /** Events whose decoded worker id belongs to another shard (an envelope whose publisher_id is not its worker_id). */
  misplaced: number
  /** Gaps in worker-ranks' event ids, recovered or not. */
  gaps: number
  ringFull: number
  /** Times the producer slept until the shard had freed half the ring. */
  ringWaits: number
  pendingMessages: number
  lost: number
  /** Engines' batches, over every thread this shard has had. */
  engine: EngineCounters
}

export function readCounters(sh: Shard): ShardCounters {
  const c = sh.ctrl
  const rejected: Record<string, number> = {}
  const rejectedByType: ShardCounters['rejectedByType'] = { stored: {}, removed: {}, cleared: {} }
  const kinds = [rejectedByType.stored, rejectedByType.removed, rejectedByType.cleared]
  for (let k = 0; k < 3; k++) {
    for (let i = 0; i < REJECT_REASON_COUNT; i++) {
      const name = REJECT_REASON_NAMES[i] as string
      const v = Atomics.load(c, C.rejected + k * REJECT_REASON_COUNT + i) >>> 0
      ;(kinds[k] as Record<string, number>)[name] = v
      rejected[name] = (rejected[name] ?? 0) + v
    }
  }
  // processed is published last by the shard: read it first, the rest are at least as new
  const processed = Atomics.load(c, C.processed) >>> 0
  return {
    shard: sh.index,
    health: sh.health,
    restarts: sh.restarts,
    enqueued: sh.enqueued >>> 0,
    received: Atomics.load(c, C.received) >>> 0,
    processed,
    applied: Atomics.load(c, C.applied) >>> 0,
    malformed: Atomics.load(c, C.malformed) >>> 0,
    rejected,
    appliedByType: { stored: Atomics.load(c, C.stored) >>> 0, removed: Atomics.load(c, C.removed) >>> 0, cleared: Atomics.load(c, C.cleared) >>> 0 },
    rejectedByType,
    blocks: Atomics.load(c, C.blocks) >>> 0,
    lowerBlocks: Atomics.load(c, C.lowerBlocks) >>> 0,
    nodes: Atomics.load(c, C.nodes) >>> 0,
    workerRanks: Atomics.load(c, C.workers) >>> 0,
    queries: Atomics.load(c, C.queries) >>> 0,
    misplaced: Atomics.load(c, C.misplaced) >>> 0,
    gaps: Atomics.load(c, C.gaps) >>> 0,
    ringFull: sh.ringFull,
    ringWaits: sh.ringWaits,
    pendingMessages: sh.pending.length - sh.pendingHead,
    lost: sh.lost,
    engine: engineCounters(sh),
  }
}

function engineCounters(sh: Shard): EngineCounters {
  const word = (i: number): number => (sh.engineRetired[i - E_BASE] as number) + (Atomics.load(sh.ctrl, i) >>> 0)
  const skipped: Record<string, number> = {}
  ENGINE_SKIP_NAMES.forEach((name, k) => (skipped[name] = word(E.skipped + k)))
  const malformed: Record<string, number> = {}
  ENGINE_MALFORMED_NAMES.forEach((name, k) => (malformed[name] = word(E.malformed + k)))
  return {
    batches: word(E.batches),
    events: word(E.events),
    skipped,
    duplicateStores: word(E.duplicateStores),
    suppressedRemovals: word(E.suppressedRemovals),
    malformed,
  }
}

/** Adds a dead thread's engine counters to what its shard's earlier threads counted, and zeroes its words. */
export function retireEngineCounters(sh: Shard): Float64Array {
  const retired = sh.engineRetired
  for (let i = E_BASE; i < E.end; i++) {
    retired[i - E_BASE] = (retired[i - E_BASE] as number) + (Atomics.load(sh.ctrl, i) >>> 0)
    Atomics.store(sh.ctrl, i, 0)
  }
  return retired
}
