// Shared-memory layout between the main thread and the indexer shards. One file is the single
// source of truth for every word position, as both sides index the same Int32Arrays.
//
// Per shard, a control block (Int32Array over `ctrl`):
//
//   word            writer  meaning
//   RING_WRITE      main    event ring write position (bytes, mod 2^32)
//   RING_READ       shard   event ring read position
//   QRING_WRITE     main    query ring write index (slot ids, mod 2^32)
//   QRING_READ      shard   query ring read index
//   DOORBELL        main    bumped + notified to wake a sleeping shard
//   SLEEPING        shard   1 while the shard waits on DOORBELL (main only notifies then)
//   CONTROL_POSTED  main    control calls posted (comlink); rings DOORBELL too
//   PRODUCER_WAIT   main    1 while main waits for ring space (shard notifies RING_READ then)
//   HEARTBEAT       shard   bumped at least every heartbeat interval, busy or idle
//   STATE           shard   ShardState
//   C.*             shard   counters, u32 that wrap (main widens them by reading often)
//   QRING_BASE..    main    the query ring: QRING_SIZE slot ids
//
// Shared by all shards, the query board (Int32Array over `board`), QUERY_SLOTS slots:
//
//   slot header   N (blocks), PENDING (bit k set while shard k owes its answer), FLAGS, then
//                 per shard BARRIER (applied-message count to wait for, or -1)
//   hashes        lo[maxBlocks], hi[maxBlocks]
//   results       per shard: COUNT, then maxResults × (idLo, idHi, rank, depth, treeSize, hostDepth,
//                 diskDepth): the depths through device, then host, then disk and external blocks
//
// State of a query slot (main thread's view):
//
//   free ──write hashes, PENDING = all shard bits, push id to every shard──▶ asked
//   asked ──each shard: write results, clear its bit with one Atomics.and (the one that
//           clears the last bit notifies)──▶ answered
//   asked ──shard dies: main clears its bit the same way (idempotent); if the bit was still
//           set, its part of the answer is empty and the shard is reported recovering──▶ answered
//
// One atomic op both marks a shard done and counts it, so a shard dying at any instant leaves
// no ambiguity; the bitmask is why a pool has at most MAX_SHARDS shards.
//   answered ──main merges──▶ free
//
// Ahead of the slots, two board-wide words: ANSWERS counts finished queries (bumped by whoever
// clears a slot's last bit) and MAIN_WAITING says the main thread sleeps on ANSWERS. The main
// thread collects the queries of one event-loop turn, rings each shard once, and wakes once for
// however many answers have landed, instead of a futex round trip per query.

// Words are grouped by writer and by how often they change, each group on its own 128-byte
// stretch (two cache lines, as adjacent-line prefetchers pair them). Packed together, the
// shard's heartbeat (bumped every few blocks) and the main thread's ring position (bumped every
// push) shared a line, and every check for waiting queries missed the cache after each push.
import { fmix32 } from '../codec/hash-mix.js'
import type { RouterEvent } from '../codec/events.js'
import type { OverlapScore } from '../index/kv-index.js'

const LINE = 32
/** Main thread, every push. */
export const RING_WRITE = 0
export const PRODUCER_WAIT = 1
/** Main thread, per query and per control call: a shard polls this group between blocks. */
export const QRING_WRITE = LINE
export const DOORBELL = LINE + 1
/** Bumped by main after posting a control call: a shard about to sleep yields to its event loop first. */
export const CONTROL_POSTED = LINE + 2
/** Shard, per batch of messages. */
export const RING_READ = 2 * LINE
export const QRING_READ = 2 * LINE + 1
export const SLEEPING = 2 * LINE + 2
export const STATE = 2 * LINE + 3
/** Shard, every few blocks of work; main reads it once per watchdog tick. */
export const HEARTBEAT = 3 * LINE
/** Main thread, per query: the query ring's slot ids. */
export const QRING_BASE = 5 * LINE
export const QRING_SIZE = 256
export const ENGINE_SKIP_NAMES = ['block_size_mismatch', 'attention_kind', 'unknown_event', 'empty'] as const
/** Why an engine batch was refused: the KvrError codes of bad input, then anything else a KvrError says. */
export const ENGINE_MALFORMED_NAMES = ['malformed_msgpack', 'wrong_type', 'invalid_number', 'other'] as const

/**
 * Consecutive words from `base`, one per name unless `widths` gives more, by name; `end` is one
 * past the last. Both sides read and write the counters by these names.
 */
function words<const N extends string>(base: number, names: readonly N[], widths: Partial<Record<N, number>> = {}): Readonly<Record<N | 'end', number>> {
  const at = {} as Record<N | 'end', number>
  let w = base
  for (const n of names) {
    at[n] = w
    w += widths[n] ?? 1
  }
  at.end = w
  return Object.freeze(at)
}

/** Rejection words: one per event kind (stored, removed, cleared) and RejectReason (kv-index.ts). */
export const C_REJECTED_WORDS = 18
/**
 * Shard counters, published per batch, read by main at scrape time. rejected: word rejected +
 * (kind − 1) × REJECT_REASON_COUNT + reason; misplaced: events whose decoded worker belongs to
 * another shard (sent back to go there, counted); gaps: gaps in a worker-rank's event ids,
 * recovered or not.
 */
export const C = words(
  4 * LINE,
  [
    'received',
    'applied',
    'malformed',
    'processed',
    'blocks',
    'nodes',
    'workers',
    'queries',
    'stored',
    'removed',
    'cleared',
    'rejected',
    'misplaced',
    'gaps',
    'lowerBlocks',
  ],
  { rejected: C_REJECTED_WORDS },
)
/**
 * Shard, per engine batch: what became of engines' own KV events (workers/shard/engine.ts).
 * skipped has a word per ENGINE_SKIP_NAMES entry, malformed one per ENGINE_MALFORMED_NAMES.
 */
export const E_BASE = QRING_BASE + QRING_SIZE
export const E = words(E_BASE, ['batches', 'events', 'skipped', 'duplicateStores', 'suppressedRemovals', 'malformed'], {
  skipped: ENGINE_SKIP_NAMES.length,
  malformed: ENGINE_MALFORMED_NAMES.length,
})
export const CTRL_WORDS = E_BASE + LINE
if (C.end > QRING_BASE) throw new Error('shard counters overrun their line')
if (E.end > CTRL_WORDS) throw new Error('engine counters overrun their line')

export const ShardState = { Starting: 0, Running: 1, Stopping: 2, Stopped: 3 } as const
export type ShardState = (typeof ShardState)[keyof typeof ShardState]

// query slot header
export const B_ANSWERS = 0
export const B_MAIN_WAITING = 1
export const BOARD_HEADER_WORDS = 16
export const Q_N = 0
export const Q_PENDING = 1
export const Q_FLAGS = 2
export const Q_SHARD_BASE = 4
/** Per shard in the slot header: BARRIER. */
export const Q_PER_SHARD = 1
/** PENDING is one Int32 bitmask. */
export const MAX_SHARDS = 31
export const QF_EARLY_EXIT = 1
export const RESULT_WORDS = 7

export interface BoardGeometry {
  shards: number
  slots: number
  maxBlocks: number
  maxResults: number
}

/** Word offsets inside the board for one geometry. */
export class BoardLayout {
  readonly headerWords: number
  readonly resultWords: number
  readonly slotWords: number
  readonly totalWords: number

  constructor(readonly g: BoardGeometry) {
    this.headerWords = Q_SHARD_BASE + g.shards * Q_PER_SHARD
    this.resultWords = 1 + g.maxResults * RESULT_WORDS
    this.slotWords = this.headerWords + 2 * g.maxBlocks + g.shards * this.resultWords
    this.totalWords = BOARD_HEADER_WORDS + g.slots * this.slotWords
  }

  slot(s: number): number {
    return BOARD_HEADER_WORDS + s * this.slotWords
  }
  barrier(s: number, shard: number): number {
    return this.slot(s) + Q_SHARD_BASE + shard * Q_PER_SHARD
  }
  lo(s: number): number {
    return this.slot(s) + this.headerWords
  }
  hi(s: number): number {
    return this.slot(s) + this.headerWords + this.g.maxBlocks
  }
  results(s: number, shard: number): number {
    return this.slot(s) + this.headerWords + 2 * this.g.maxBlocks + shard * this.resultWords
  }
}

// the records' kinds are used by transports that only name them
export { EngineReset, RecoveryKind } from './records.js'

/** What the main thread hands a shard thread in workerData. */
export interface ShardInit {
  index: number
  shards: number
  ctrl: SharedArrayBuffer
  ring: SharedArrayBuffer
  board: SharedArrayBuffer
  geometry: BoardGeometry
  maxBlocks: number
  heartbeatMs: number
  spinUs: number
  yieldMaxMs: number
}

/** Partition of worker ids over shards: every event and rank of a worker lands on one shard. */
export function shardOf(idLo: number, idHi: number, shards: number): number {
  return fmix32(fmix32(idLo) ^ idHi) % shards
}

// ---- thread entry points and their messages ----

/** A thread entry point under workers/, as this build has it (.ts under the test runner, .js built). */
function entry(name: string): URL {
  return new URL(`../../workers/${name}${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url)
}

/** The indexer shard thread (workers/shard/main.ts). */
export const SHARD_ENTRY: URL = entry('shard/main')
/** The tokenizer thread (workers/tokenize.ts), run by piscina. */
export const TOKENIZE_ENTRY: URL = entry('tokenize')

export interface ShardStats {
  received: number
  applied: number
  malformed: number
  processed: number
  blocks: number
  nodes: number
  workerRanks: number
  bytes: number
}

/**
 * What a shard thread answers over comlink (the control calls; events and queries go through the
 * shared memory above). `seq` is a barrier: the call runs once the shard has processed that many
 * messages of its ring, so it sees every event pushed before it.
 */
export interface ShardApi {
  barrier(seq: number): Promise<number>
  ensureWorker(idLo: number, idHi: number, rank: number, seq: number): Promise<boolean>
  treeSizes(seq: number): Promise<OverlapScore[]>
  dump(seq: number): Promise<RouterEvent[]>
  /** The shard's index as a binary snapshot part (src/index/snapshot-format.ts), transferred. */
  snapshot(seq: number): Promise<Uint8Array>
  /**
   * Checks the parts of a snapshot at `parts` (offset, length pairs into `buf`) and keeps them
   * under `ticket` until its SNAPSHOT record: null when every part is sound, else why not.
   */
  stageSnapshot(buf: SharedArrayBuffer, parts: readonly number[], ticket: number): Promise<string | null>
  stats(): Promise<ShardStats>
  /** Fault injection: blocks the thread (no heartbeat) so stall detection can be exercised. */
  block(ms: number): Promise<void>
  shutdown(seq: number): Promise<ShardStats>
}
