// The KV block index one shard owns: a radix tree whose edges are local block hashes
// (`tokens_hash`), whose nodes know which worker-ranks hold them, plus each worker-rank's map
// from its external block hashes (`block_hash`) to nodes. All of it lives in one Int32Array of
// 7-word records, each holding at most one (worker-rank, block_hash) entry:
//
//   node      parent slot + flags, generation and parent generation (16 bits each), edge key
//             (tokens_hash lo/hi), distinct worker count + the worker-rank of its first entry,
//             that entry's block_hash lo/hi. Nearly every node has one holder (a conversation's
//             chain), so node and entry cost one record and one cache line between them.
//   overflow  a node's further entries: the node's slot + flags, next overflow entry of the node,
//             worker-rank, block_hash lo/hi. A side table maps a node to its first one.
//
// An entry is named by its record's slot (a node's own for its first entry), which the lookup
// table keyed by (worker-rank, block_hash) finds. A child is found in the slot beside its parent
// (where the allocator puts it when it can), else in the children table keyed by (parent slot,
// generation, tokens_hash).
//
// Semantics follow Dynamo's radix-tree indexer (the reference below) with these deliberate,
// documented choices:
// - A node is freed the moment its last worker leaves it. Its children are detached by bumping
//   the node's generation: a child whose recorded parent generation no longer matches is
//   unreachable from the root, exactly like the reference's "clear node.children", and its
//   subtree stays intact so the worker can re-link it later. No empty node is ever kept.
// - Re-linking (a stored block whose hash the worker already knows under another place) moves a
//   detached node under the new parent; a node still attached elsewhere is not torn away from
//   its other holders: the worker's entry moves to a fresh node instead. A re-link that would
//   make a node its own ancestor aborts the event with `invalid_block` (the reference checks
//   only the direct self-reference, which is the common case of this rule).
// - A worker may reach one node through several block hashes (e.g. LoRA variants with equal
//   token content); it stays in the node until its last such hash is removed.
// - find_matches keeps the reference's O(1) "equal count ⇒ same set" step.
import { mix3 } from '../codec/hash-mix.js'
import { EventKind, type DecodedEvent } from '../codec/event-decoder.js'
import type { RouterEvent, StoredBlock } from '../codec/events.js'
import { u64FromParts } from '../codec/u64.js'
import { LOWER_TIERS, LowerTiers } from './lower-tiers.js'
import { MAX_SLOT, SlotTable } from './slot-table.js'
import {
  LOWER,
  LOWER_HAS_PARENT,
  type SnapshotPart,
  UP_DETACHED,
  UP_MIXED,
  UP_REF_MASK,
  UP_ROOT,
  WORKER,
  WORKER_LAST_ID,
  newPart,
  sealPart,
} from './snapshot-format.js'

export const RejectReason = {
  ParentBlockNotFound: 0,
  BlockNotFound: 1,
  InvalidBlock: 2,
  Capacity: 3,
  TooManyWorkers: 4,
  NonDeviceTier: 5,
} as const
export type RejectReason = (typeof RejectReason)[keyof typeof RejectReason]
/** Metric label values, indexed by RejectReason (Dynamo's status names first). */
export const REJECT_REASON_NAMES = ['parent_block_not_found', 'block_not_found', 'invalid_block', 'capacity', 'too_many_workers', 'non_device_tier'] as const
export const REJECT_REASON_COUNT = REJECT_REASON_NAMES.length

/** Result of applying one event: 0 when every part applied, else 1 + the first RejectReason. */
export const APPLY_OK = 0

export interface KvIndexOptions {
  /** Cap on held (block, worker-rank) entries; stores beyond it are rejected as `capacity`. */
  maxBlocks?: number
  /** Initial entry capacity; arrays grow by half as needed. */
  initialBlocks?: number
  /** Cap on registered worker-ranks; events of further ones are rejected as `too_many_workers`. */
  maxWorkerRanks?: number
}

export interface OverlapScore {
  worker_id: bigint
  dp_rank: number
  overlap_blocks: number
  tree_size: number
  /** treeSizes() only: the event id of the last event applied for this worker-rank, if any. */
  last_event_id?: bigint
  /** overlapScores() while lower tiers hold blocks: the match extended through host, then disk (cumulative). */
  overlap_host?: number
  overlap_disk?: number
  /** treeSizes() only, when not 0: blocks the worker-rank holds in lower tiers (not in tree_size). */
  lower_tier_blocks?: number
}

export const MAX_WORKER_RANKS = 0xfffe
/** Entries and nodes are named by 26-bit slots in the hash tables. */
export const MAX_BLOCKS = MAX_SLOT - 2
const NO_WORKER = 0xffff
const LOWER_TIER_NAMES = ['host_pinned', 'disk', 'external'] as const
/** Records grow by a quarter: more copies while filling, less memory held idle afterwards. */
const GROWTH = 1.25
const OPEN = 0xffffffff
const NIL = -1
const ROOT = 0

// Records are structs inside one Int32Array, so a probe touches one cache line instead of one
// per field. u32 values are stored as int32 bits.
const RS = 7
/** Bits 0–25: a node's parent slot, an overflow entry's node slot; bits 26–31: the flags below. */
const R_UP = 0
/** Bits 0–15: the node's generation, kept across every reuse of the slot; bits 16–31: its parent's. */
const R_GEN = 1
/** A node's tokens_hash; an overflow entry's next (R_TLO). */
const R_TLO = 2
const R_THI = 3
/** Bits 0–15: distinct workers holding the node; bits 16–31: the worker-rank of the record's entry. */
const R_CW = 4
const R_BLO = 5
const R_BHI = 6
const UP_SLOT = MAX_SLOT + 2
const COUNT_MASK = 0xffff
const GEN_MASK = 0xffff
/** No entry in the record: a worker-rank of 0xffff in R_CW's top half. */
const CW_EMPTY = NO_WORKER << 16
/**
 * Set once a worker left this node while the node survived, or a node was re-linked under it:
 * a child may then hold a worker this node does not, so equal worker counts no longer prove
 * equal worker sets and find_matches compares the sets on this edge.
 */
const MIXED = 1 << 26
/** This node is in the children table (it is not in a slot beside its parent). */
const IN_TABLE = 1 << 27
/** Some child of this node is in the children table (set once; cleared when the node is made). */
const TABLE_KIDS = 1 << 28
/** The record is an overflow entry of the node in its slot bits, not a node. */
const OVERFLOW = 1 << 29
/** The record is free. */
const FREE = 1 << 30
/** The node has overflow entries: the heads table names the first. */
const HEADS = 1 << 31
/** What a child's R_UP equals, masked, when it is a node whose parent is the slot compared. */
const KEY_MASK = UP_SLOT | OVERFLOW | FREE
/** Blocks warmed per pass (KvIndex.warm): enough misses in flight, few enough to stay cached. */
const WARM = 32
/** Fewer blocks than this have too few misses to overlap: the warm-up would only add work. */
const WARM_MIN = 4

function growI32(a: Int32Array, n: number, fill: number): Int32Array<ArrayBuffer> {
  const b = new Int32Array(n)
  b.set(a)
  b.fill(fill, a.length)
  return b
}
function growU32(a: Uint32Array, n: number): Uint32Array<ArrayBuffer> {
  const b = new Uint32Array(n)
  b.set(a)
  return b
}

/**
 * The stamp after `stamp` for an array of stamps (a slot is marked when it holds the current
 * one): on the wrap to 0 the array is cleared, so no old mark passes for a new one.
 */
function stampAfter(stamp: number, marks: Uint32Array): number {
  const next = (stamp + 1) >>> 0
  if (next !== 0) return next
  marks.fill(0)
  return 1
}

export class KvIndex {
  readonly maxBlocks: number
  readonly maxWorkerRanks: number

  // --- counters (read by the shard and published to shared memory) ---
  /** Events fully applied, by kind: [stored, removed, cleared]. */
  readonly appliedByKind = new Float64Array(4)
  /** Rejections by RejectReason (a batched remove counts each missing hash). */
  readonly rejectedByReason = new Float64Array(REJECT_REASON_COUNT)
  /** The same rejections by event kind too, [kind × REJECT_REASON_COUNT + reason] (the event_type label). */
  readonly rejectedByKindReason = new Float64Array(4 * REJECT_REASON_COUNT)
  liveEntries = 0
  liveNodes = 1
  liveWorkers = 0

  // --- worker-ranks ---
  private wIdLo = new Uint32Array(16)
  private wIdHi = new Uint32Array(16)
  private wRank = new Uint32Array(16)
  /** Entries held per worker-rank: the tree size of Dynamo's find_matches. */
  private wSize = new Uint32Array(16)
  private wLive = new Uint8Array(16)
  /** Last event id seen per worker-rank (halves), and whether one was seen. */
  private wEvLo = new Uint32Array(16)
  private wEvHi = new Uint32Array(16)
  private wEvSeen = new Uint8Array(16)
  private wTable = new Int32Array(32).fill(NIL)
  private wHigh = 0
  private wFree: number[] = []

  // --- records: RS int32 words each, see R_* ---
  private R: Int32Array<ArrayBuffer>
  private rCap: number
  private rHigh = 1
  /**
   * Free records, most recently freed on top. A record taken out of turn (beside a new child's
   * parent) stays in it and is skipped when popped, so taking one touches no other record.
   */
  private freeStack = new Int32Array(64)
  private freeTop = 0
  /** Children not in a slot beside their parent, by (parent, generation, tokens_hash). */
  private children = new SlotTable()
  /**
   * Entries by (worker-rank, block_hash). Every removed block leaves a tombstone here, and at a
   * fleet's steady churn a rebuild at the default load came every ~50,000 removes (5 per pass
   * of the benchmark, 13 ms each); a roomier table (+1.7 bytes per entry) rebuilds once.
   */
  private lookup = new SlotTable(16, 0.45)
  /** The first overflow entry of each node that has some, by node slot. */
  private heads = new SlotTable()

  // --- query scratch ---
  private seen = new Uint32Array(16)
  private depthOf = new Uint32Array(16)
  private stamp = 0
  private mark = new Uint32Array(16)
  private markStamp = 0
  /**
   * Called between blocks of a long event (every 8 blocks) and inside long rebuilds and copies:
   * a shard answers waiting queries there, so a lookup never waits for a whole large event. The
   * structure is consistent at these points; findMatches may run from inside it.
   */
  interrupt: (() => void) | null = null

  /** Per warmed block: the entry its probe will meet, then that entry's node. */
  private warmSlots = new Int32Array(WARM)
  /** Where warm() leaves what it loaded, so the loads are not optimised away. */
  private warmSink = 0

  /** Worker-rank slots matched by the last findMatches, in discovery order. */
  matchWorkers = new Int32Array(16)
  matchCount = 0

  // --- lower tiers (host_pinned, disk, external): made at their first block, see lower-tiers.ts ---
  private lower: LowerTiers | null = null
  /** Blocks held in lower tiers, counted against maxBlocks with the device entries. */
  lowerEntries = 0
  /** The node at each depth of the last findMatches' walk: [d − 1] is the node at depth d. */
  private path = new Int32Array(64)
  /** Whether the last findMatches extended its matches through lower tiers (hostOf/diskOf are set). */
  private tiered = false
  private hostOf = new Uint32Array(16)
  private diskOf = new Uint32Array(16)

  constructor(options: KvIndexOptions = {}) {
    this.maxBlocks = Math.min(options.maxBlocks ?? MAX_BLOCKS, MAX_BLOCKS)
    this.maxWorkerRanks = Math.min(options.maxWorkerRanks ?? MAX_WORKER_RANKS, MAX_WORKER_RANKS)
    const cap = Math.max(16, Math.min(options.initialBlocks ?? 1024, this.maxBlocks + 1))
    this.rCap = cap
    this.R = new Int32Array((cap + 1) * RS)
    // The root holds every worker implicitly, has no entry of its own and is never freed.
    this.R[ROOT * RS + R_CW] = CW_EMPTY
  }

  // ------------------------------------------------------------------------------------------
  // worker-ranks

  /** Slot of a worker-rank, or -1. */
  workerSlot(idLo: number, idHi: number, rank: number): number {
    const t = this.wTable
    const mask = t.length - 1
    for (let i = mix3(idLo, idHi, rank) & mask; ; i = (i + 1) & mask) {
      const w = t[i] as number
      if (w === NIL) return NIL
      if (this.wIdLo[w] === idLo && this.wIdHi[w] === idHi && this.wRank[w] === rank) return w
    }
  }

  /** Slot of a worker-rank, registering it when new; -1 when the index holds too many. */
  ensureWorker(idLo: number, idHi: number, rank: number): number {
    const found = this.workerSlot(idLo, idHi, rank)
    if (found !== NIL) return found
    if (this.liveWorkers >= this.maxWorkerRanks) return NIL
    let w: number
    if (this.wFree.length > 0) w = this.wFree.pop() as number
    else {
      w = this.wHigh++
      if (w >= this.wIdLo.length) this.growWorkers(this.wIdLo.length * 2)
    }
    this.wIdLo[w] = idLo
    this.wIdHi[w] = idHi
    this.wRank[w] = rank
    this.wSize[w] = 0
    this.wLive[w] = 1
    this.wEvSeen[w] = 0
    this.liveWorkers++
    if (this.liveWorkers * 2 > this.wTable.length) this.rebuildWorkerTable(this.wTable.length * 2)
    else this.insertWorkerKey(w)
    return w
  }

  private insertWorkerKey(w: number): void {
    const t = this.wTable
    const mask = t.length - 1
    let i = mix3(this.wIdLo[w] as number, this.wIdHi[w] as number, this.wRank[w] as number) & mask
    while (t[i] !== NIL) i = (i + 1) & mask
    t[i] = w
  }

  private rebuildWorkerTable(size: number): void {
    this.wTable = new Int32Array(size).fill(NIL)
    for (let w = 0; w < this.wHigh; w++) if (this.wLive[w] === 1) this.insertWorkerKey(w)
  }

  private growWorkers(n: number): void {
    this.wIdLo = growU32(this.wIdLo, n)
    this.wIdHi = growU32(this.wIdHi, n)
    this.wRank = growU32(this.wRank, n)
    this.wSize = growU32(this.wSize, n)
    const live = new Uint8Array(n)
    live.set(this.wLive)
    this.wLive = live
    this.wEvLo = growU32(this.wEvLo, n)
    this.wEvHi = growU32(this.wEvHi, n)
    const seen = new Uint8Array(n)
    seen.set(this.wEvSeen)
    this.wEvSeen = seen
    this.seen = growU32(this.seen, n)
    this.depthOf = growU32(this.depthOf, n)
    this.mark = growU32(this.mark, n)
    this.matchWorkers = growI32(this.matchWorkers, n, 0)
    this.hostOf = growU32(this.hostOf, n)
    this.diskOf = growU32(this.diskOf, n)
  }

  private dropWorker(w: number): void {
    this.wLive[w] = 0
    this.liveWorkers--
    this.wFree.push(w)
    this.rebuildWorkerTable(this.wTable.length)
  }

  workerIdLo(w: number): number {
    return this.wIdLo[w] as number
  }
  workerIdHi(w: number): number {
    return this.wIdHi[w] as number
  }
  workerRank(w: number): number {
    return this.wRank[w] as number
  }
  /** Number of blocks the worker-rank holds (its tree size). */
  treeSize(w: number): number {
    return this.wSize[w] as number
  }

  // ------------------------------------------------------------------------------------------
  // events

  /**
   * Applies one decoded event for worker-rank (ev.worker, ev.dpRank). Returns APPLY_OK or
   * 1 + the RejectReason of the first failure; every failure is also counted.
   */
  apply(ev: DecodedEvent): number {
    const w = this.ensureWorker(ev.workerLo, ev.workerHi, ev.dpRank)
    if (w === NIL) return this.reject(RejectReason.TooManyWorkers, ev.kind)
    // last = max(last, id): a replayed older event does not move it back
    if (this.wEvSeen[w] === 0 || ev.eventIdHi > (this.wEvHi[w] as number) || (ev.eventIdHi === this.wEvHi[w] && ev.eventIdLo > (this.wEvLo[w] as number))) {
      this.wEvLo[w] = ev.eventIdLo
      this.wEvHi[w] = ev.eventIdHi
    }
    this.wEvSeen[w] = 1
    // a lower tier's block is a residency of its own; a Cleared of any tier clears every tier
    if (ev.tier !== 0 && ev.kind !== EventKind.Cleared) return this.applyLower(w, ev)
    if (ev.kind === EventKind.Stored) return this.applyStored(w, ev)
    if (ev.kind === EventKind.Removed) return this.applyRemoved(w, ev)
    this.clearWorker(ev.workerLo, ev.workerHi, false)
    this.appliedByKind[EventKind.Cleared] = (this.appliedByKind[EventKind.Cleared] as number) + 1
    return APPLY_OK
  }

  private reject(reason: RejectReason, kind: EventKind): number {
    this.rejectedByReason[reason] = (this.rejectedByReason[reason] as number) + 1
    const k = kind * REJECT_REASON_COUNT + reason
    this.rejectedByKindReason[k] = (this.rejectedByKindReason[k] as number) + 1
    return reason + 1
  }

  private applyStored(w: number, ev: DecodedEvent): number {
    let cur = ROOT
    if (ev.hasParent) {
      const pe = this.findEntry(w, ev.parentLo, ev.parentHi)
      if (pe === NIL) return this.reject(RejectReason.ParentBlockNotFound, EventKind.Stored)
      cur = this.nodeOf(pe)
    }
    const n = ev.count
    let fresh = false
    for (let i = 0; i < n; i++) {
      if ((i & (WARM - 1)) === 0 && n - i >= WARM_MIN) this.warm(w, ev.blockLo, ev.blockHi, i, Math.min(n, i + WARM))
      if ((i & 7) === 7 && this.interrupt !== null) this.interrupt()
      // `| 0`: a u32 above 2^31 is a double, boxed into a fresh heap number at every call
      // that is not inlined; an int32 travels as a small integer (the tables compare int32 bits)
      const tokLo = (ev.tokensLo[i] as number) | 0
      const tokHi = (ev.tokensHi[i] as number) | 0
      const bhLo = (ev.blockLo[i] as number) | 0
      const bhHi = (ev.blockHi[i] as number) | 0
      const e = this.findEntry(w, bhLo, bhHi)
      const held = e === NIL ? NIL : this.nodeOf(e)
      // A node made by this event has no children yet: skip the probe.
      let node = fresh ? NIL : this.findChild(cur, tokLo, tokHi)
      fresh = false
      if (e !== NIL && held === node) {
        // held already, right here: an idempotent re-store
        cur = node
        continue
      }
      // A hash the worker already holds at cur or above it would make the chain a cycle.
      if (e !== NIL && this.isAncestorOrSelf(held, cur)) return this.reject(RejectReason.InvalidBlock, EventKind.Stored)
      if (node === NIL) {
        if (e !== NIL && !this.isAttached(held)) {
          node = held
          this.relink(node, cur, tokLo, tokHi)
        } else {
          node = this.newNode(cur, tokLo, tokHi)
          fresh = true
        }
      }
      if (e !== NIL) {
        if (held === node) {
          cur = node
          continue
        }
        // The worker's hash named a node elsewhere in the tree: it now names this one.
        this.removeEntry(e)
      } else if (this.liveEntries + this.lowerEntries >= this.maxBlocks) {
        if (((this.R[node * RS + R_CW] as number) & COUNT_MASK) === 0) this.freeNode(node)
        return this.reject(RejectReason.Capacity, EventKind.Stored)
      }
      this.addEntry(w, node, bhLo, bhHi)
      cur = node
    }
    this.appliedByKind[EventKind.Stored] = (this.appliedByKind[EventKind.Stored] as number) + 1
    return APPLY_OK
  }

  /** A Stored or Removed of a lower tier (Dynamo's StorageTier host_pinned, disk, external). */
  private applyLower(w: number, ev: DecodedEvent): number {
    const L = (this.lower ??= new LowerTiers())
    const tier = ev.tier - 1
    const n = ev.count
    let first = APPLY_OK
    if (ev.kind === EventKind.Stored) {
      let has = ev.hasParent
      let plo = ev.parentLo
      let phi = ev.parentHi
      for (let i = 0; i < n; i++) {
        const blo = ev.blockLo[i] as number
        const bhi = ev.blockHi[i] as number
        if (L.find(w, tier, blo, bhi) === NIL && this.liveEntries + this.lowerEntries >= this.maxBlocks) {
          first = this.reject(RejectReason.Capacity, EventKind.Stored)
          break
        }
        if (L.add(w, tier, has, plo, phi, ev.tokensLo[i] as number, ev.tokensHi[i] as number, blo, bhi)) this.lowerEntries++
        has = true
        plo = blo
        phi = bhi
        if ((i & 7) === 7 && this.interrupt !== null) this.interrupt()
      }
    } else {
      for (let i = 0; i < n; i++) {
        if (L.remove(w, tier, ev.blockLo[i] as number, ev.blockHi[i] as number)) this.lowerEntries--
        else {
          const r = this.reject(RejectReason.BlockNotFound, EventKind.Removed)
          if (first === APPLY_OK) first = r
        }
      }
    }
    if (first === APPLY_OK) this.appliedByKind[ev.kind] = (this.appliedByKind[ev.kind] as number) + 1
    return first
  }

  /** Blocks the worker-rank slot holds in lower tiers. */
  lowerBlocksOf(w: number): number {
    return this.lower === null ? 0 : this.lower.blocksOf(w)
  }

  /** Blocks held per lower tier: [host_pinned, disk, external]. */
  lowerTierBlocks(): number[] {
    const out: number[] = []
    for (let t = 0; t < LOWER_TIERS; t++) out.push(this.lower === null ? 0 : (this.lower.perTier[t] as number))
    return out
  }

  private applyRemoved(w: number, ev: DecodedEvent): number {
    let first = APPLY_OK
    const n = ev.count
    for (let i = 0; i < n; i++) {
      if ((i & (WARM - 1)) === 0 && n - i >= WARM_MIN) this.warm(w, ev.blockLo, ev.blockHi, i, Math.min(n, i + WARM))
      const e = this.findEntry(w, (ev.blockLo[i] as number) | 0, (ev.blockHi[i] as number) | 0)
      if (e === NIL) {
        const r = this.reject(RejectReason.BlockNotFound, EventKind.Removed)
        if (first === APPLY_OK) first = r
        continue
      }
      this.removeEntry(e)
      if ((i & 7) === 7 && this.interrupt !== null) this.interrupt()
    }
    if (first === APPLY_OK) this.appliedByKind[EventKind.Removed] = (this.appliedByKind[EventKind.Removed] as number) + 1
    return first
  }

  /**
   * Drops every block of every rank of a worker (a Cleared event). With `forget`, the worker's
   * ranks are unregistered as well (remove_worker). Returns the number of blocks dropped.
   */
  clearWorker(idLo: number, idHi: number, forget: boolean): number {
    const ranks: number[] = []
    for (let w = 0; w < this.wHigh; w++) {
      if (this.wLive[w] === 1 && this.wIdLo[w] === idLo && this.wIdHi[w] === idHi) ranks.push(w)
    }
    if (ranks.length === 0) return 0
    const dropped = this.dropEntriesOf(ranks)
    if (forget) for (const w of ranks) this.dropWorker(w)
    return dropped
  }

  removeWorker(idLo: number, idHi: number): number {
    return this.clearWorker(idLo, idHi, true)
  }

  /**
   * The last event id applied for a worker-rank, as a u64's halves in `out`; false when the
   * worker-rank is unknown or has applied none since it was registered or last reset.
   */
  lastEventId(idLo: number, idHi: number, rank: number, out: { lo: number; hi: number }): boolean {
    const w = this.workerSlot(idLo, idHi, rank)
    if (w === NIL || this.wEvSeen[w] !== 1) return false
    out.lo = this.wEvLo[w] as number
    out.hi = this.wEvHi[w] as number
    return true
  }

  /**
   * Drops one worker-rank's blocks and forgets its last event id (before a tree dump rebuilds
   * it: the dump's ids are synthetic, so the next live event is taken whatever its id).
   */
  resetWorkerRank(idLo: number, idHi: number, rank: number): number {
    const w = this.workerSlot(idLo, idHi, rank)
    if (w === NIL) return 0
    this.wEvSeen[w] = 0
    return this.dropEntriesOf([w])
  }

  /** Drops every entry of the worker-rank slots `ws`, in one pass over the records. */
  private dropEntriesOf(ws: readonly number[]): number {
    const mark = new Uint8Array(NO_WORKER + 1)
    let pending = 0
    for (const w of ws) {
      if (mark[w] === 1) continue
      mark[w] = 1
      pending += this.wSize[w] as number
    }
    let dropped = 0
    if (this.lower !== null && this.lowerEntries > 0) {
      const n = this.lower.dropMarked(mark)
      this.lowerEntries -= n
      dropped += n
    }
    for (let e = 0; e < this.rHigh && pending > 0; e++) {
      const w = (this.R[e * RS + R_CW] as number) >>> 16
      if (mark[w] !== 1) continue
      this.removeEntry(e)
      dropped++
      pending--
      // removing a node's first entry moves its next one into this record: look again
      e--
    }
    return dropped
  }

  /** Sets a worker-rank's last event id (after a dump that stands for the events up to it). */
  setEventId(idLo: number, idHi: number, rank: number, lastLo: number, lastHi: number): void {
    const w = this.workerSlot(idLo, idHi, rank)
    if (w === NIL) return
    this.wEvLo[w] = lastLo
    this.wEvHi[w] = lastHi
    this.wEvSeen[w] = 1
  }

  /** Forgets a worker-rank's last event id, so its next event is taken whatever its id. */
  forgetEventId(idLo: number, idHi: number, rank: number): void {
    const w = this.workerSlot(idLo, idHi, rank)
    if (w !== NIL) this.wEvSeen[w] = 0
  }

  // ------------------------------------------------------------------------------------------
  // queries

  /**
   * Longest cached contiguous prefix, in blocks, per worker-rank (find_matches). The matched slots
   * land in `matchWorkers[0..return)`, their depths in `depth(slot)`, sizes in `treeSize(slot)`.
   */
  findMatches(lo: Uint32Array, hi: Uint32Array, n: number, earlyExit = false): number {
    const m = this.deviceMatches(lo, hi, n, earlyExit)
    this.tiered = false
    if (this.lowerEntries === 0 || n === 0) return m
    return this.extendLower(lo, hi, n, m)
  }

  /**
   * Extends the device matches through the lower tiers (Dynamo's query_lower_tiers): each matched
   * worker-rank from its last device block, and every worker-rank holding a parentless lower-tier
   * block of the first hash from the root. Those are added to the matches with device depth 0.
   */
  private extendLower(lo: Uint32Array, hi: Uint32Array, n: number, m: number): number {
    const L = this.lower as LowerTiers
    const out = this.matchWorkers
    const seen = this.seen
    const depthOf = this.depthOf
    const stamp = this.nextStamp()
    for (let k = 0; k < m; k++) seen[out[k] as number] = stamp
    const h = L.rootHolders(lo[0] as number, hi[0] as number)
    for (let j = 0; j < h; j++) {
      const w = L.holders[j] as number
      if (seen[w] === stamp || this.wLive[w] !== 1) continue
      seen[w] = stamp
      depthOf[w] = 0
      out[m++] = w
    }
    const R = this.R
    for (let k = 0; k < m; k++) {
      const w = out[k] as number
      const d = depthOf[w] as number
      this.hostOf[w] = d
      this.diskOf[w] = d
      if (L.blocksOf(w) === 0) continue
      let e = NIL
      if (d > 0) {
        const node = this.path[d - 1] as number
        for (e = this.firstHolder(node); e !== NIL; e = this.nextHolder(node, e)) if ((R[e * RS + R_CW] as number) >>> 16 === w) break
        if (e === NIL) continue
      }
      L.extend(w, lo, hi, n, d, e !== NIL, e === NIL ? 0 : (R[e * RS + R_BLO] as number), e === NIL ? 0 : (R[e * RS + R_BHI] as number))
      this.hostOf[w] = L.hostDepth
      this.diskOf[w] = L.diskDepth
    }
    this.tiered = true
    this.matchCount = m
    return m
  }

  /** The device part of findMatches: the radix tree's longest prefix per worker-rank. */
  private deviceMatches(lo: Uint32Array, hi: Uint32Array, n: number, earlyExit: boolean): number {
    this.matchCount = 0
    if (n === 0) return 0
    if (this.path.length < n) this.path = new Int32Array(Math.max(n, this.path.length * 2))
    const path = this.path
    // int32 arguments, as in applyStored: no heap number per call
    let cur = this.findChild(ROOT, (lo[0] as number) | 0, (hi[0] as number) | 0)
    if (cur === NIL) return 0
    path[0] = cur
    const R = this.R
    const seen = this.seen
    const depthOf = this.depthOf
    const out = this.matchWorkers
    const stamp = this.nextStamp()
    // Every worker of the first block is a candidate whose depth is still open.
    let m = 0
    // the holders: the node's own entry, then its overflow list (a call per node, not per holder)
    for (let e = this.firstHolder(cur); e !== NIL; e = e === cur ? this.overflowOf(cur) : (R[e * RS + R_TLO] as number)) {
      const w = (R[e * RS + R_CW] as number) >>> 16
      if (seen[w] !== stamp) {
        seen[w] = stamp
        depthOf[w] = OPEN
        out[m++] = w
      }
    }
    let active = m
    let depth = 1
    if (!(earlyExit && active === 1)) {
      for (let i = 1; i < n; i++) {
        // the child beside its parent (after it, or before it: a chain stored into slots a chain
        // freed runs backwards), checked here without a call: a long match is a walk down one
        // chain, and this is nearly every step of it
        const tl = (lo[i] as number) | 0
        const th = (hi[i] as number) | 0
        const gen = (R[cur * RS + R_GEN] as number) & GEN_MASK
        let child = cur + 1
        let a = child * RS
        if (((R[a + R_UP] as number) & KEY_MASK) !== cur || R[a + R_TLO] !== tl || R[a + R_THI] !== th || (R[a + R_GEN] as number) >>> 16 !== gen) {
          child = cur - 1
          a = child * RS
          if (((R[a + R_UP] as number) & KEY_MASK) !== cur || R[a + R_TLO] !== tl || R[a + R_THI] !== th || (R[a + R_GEN] as number) >>> 16 !== gen) {
            child = this.findChild(cur, tl, th)
            if (child === NIL) break
          }
        }
        // A child holds a subset of its parent's workers unless the parent is marked mixed, so
        // there an equal count means nobody left (the reference's O(1) step); otherwise compare.
        if (
          ((R[cur * RS + R_UP] as number) & MIXED) !== 0 ||
          ((R[child * RS + R_CW] as number) & COUNT_MASK) !== ((R[cur * RS + R_CW] as number) & COUNT_MASK)
        ) {
          const ms = this.nextMarkStamp()
          const mark = this.mark
          for (let e = this.firstHolder(child); e !== NIL; e = e === child ? this.overflowOf(child) : (R[e * RS + R_TLO] as number)) {
            mark[(R[e * RS + R_CW] as number) >>> 16] = ms
          }
          for (let e = this.firstHolder(cur); e !== NIL; e = e === cur ? this.overflowOf(cur) : (R[e * RS + R_TLO] as number)) {
            const w = (R[e * RS + R_CW] as number) >>> 16
            if (mark[w] !== ms && seen[w] === stamp && depthOf[w] === OPEN) {
              depthOf[w] = i
              active--
            }
          }
          if (active === 0) break
        }
        cur = child
        path[i] = child
        depth = i + 1
        if (earlyExit && active === 1) break
      }
    }
    for (let k = 0; k < m; k++) {
      const w = out[k] as number
      if (depthOf[w] === OPEN) depthOf[w] = depth
    }
    this.matchCount = m
    return m
  }

  /** findMatches over u64 local hashes, as objects: for tests, tools and the HTTP edge. */
  overlapScores(local: BigUint64Array | readonly bigint[], earlyExit = false): OverlapScore[] {
    const n = local.length
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    for (let i = 0; i < n; i++) {
      const v = local[i] as bigint
      lo[i] = Number(v & 0xffffffffn)
      hi[i] = Number(v >> 32n)
    }
    const m = this.findMatches(lo, hi, n, earlyExit)
    const out: OverlapScore[] = []
    for (let i = 0; i < m; i++) {
      const w = this.matchWorkers[i] as number
      out.push({
        worker_id: u64FromParts(this.wIdLo[w] as number, this.wIdHi[w] as number),
        dp_rank: this.wRank[w] as number,
        overlap_blocks: this.depthOf[w] as number,
        tree_size: this.wSize[w] as number,
        ...(this.tiered ? { overlap_host: this.hostOf[w] as number, overlap_disk: this.diskOf[w] as number } : {}),
      })
    }
    return out
  }

  /** Tree sizes of every registered worker-rank. */
  treeSizes(): OverlapScore[] {
    const out: OverlapScore[] = []
    for (let w = 0; w < this.wHigh; w++) {
      if (this.wLive[w] !== 1) continue
      const ts: OverlapScore = {
        worker_id: u64FromParts(this.wIdLo[w] as number, this.wIdHi[w] as number),
        dp_rank: this.wRank[w] as number,
        overlap_blocks: 0,
        tree_size: this.wSize[w] as number,
      }
      const lower = this.lowerBlocksOf(w)
      if (lower > 0) ts.lower_tier_blocks = lower
      if (this.wEvSeen[w] === 1) ts.last_event_id = u64FromParts(this.wEvLo[w] as number, this.wEvHi[w] as number)
      out.push(ts)
    }
    return out
  }

  /** Depth of a slot matched by the last findMatches. */
  depth(w: number): number {
    return this.depthOf[w] as number
  }

  /** Depth through device then host blocks of a slot matched by the last findMatches (≥ depth). */
  hostDepth(w: number): number {
    return this.tiered ? (this.hostOf[w] as number) : (this.depthOf[w] as number)
  }

  /** Depth through device, host, then disk and external blocks (≥ hostDepth). */
  diskDepth(w: number): number {
    return this.tiered ? (this.diskOf[w] as number) : (this.depthOf[w] as number)
  }

  private nextMarkStamp(): number {
    return (this.markStamp = stampAfter(this.markStamp, this.mark))
  }

  private nextStamp(): number {
    return (this.stamp = stampAfter(this.stamp, this.seen))
  }

  // ------------------------------------------------------------------------------------------
  // children

  private childHash(parent: number, gen: number, lo: number, hi: number): number {
    return mix3(parent ^ Math.imul(gen, 0x9e3779b1), lo, hi)
  }

  /** True when the record is a live node (not free, not an overflow entry). */
  private isNode(x: number): boolean {
    return ((this.R[x * RS + R_UP] as number) & (FREE | OVERFLOW)) === 0
  }

  private isAttached(node: number): boolean {
    const R = this.R
    const up = R[node * RS + R_UP] as number
    if ((up & (FREE | OVERFLOW)) !== 0) return false
    return ((R[(up & UP_SLOT) * RS + R_GEN] as number) & GEN_MASK) === (R[node * RS + R_GEN] as number) >>> 16
  }

  private findChild(parent: number, lo: number, hi: number): number {
    lo |= 0
    hi |= 0
    const R = this.R
    const pb = parent * RS
    const gen = (R[pb + R_GEN] as number) & GEN_MASK
    // beside the parent, where the allocator puts a child when it can (never for the root's)
    if (parent !== ROOT) {
      const a = pb + RS
      if (((R[a + R_UP] as number) & KEY_MASK) === parent && R[a + R_TLO] === lo && R[a + R_THI] === hi && (R[a + R_GEN] as number) >>> 16 === gen) {
        return parent + 1
      }
      const b = pb - RS
      if (((R[b + R_UP] as number) & KEY_MASK) === parent && R[b + R_TLO] === lo && R[b + R_THI] === hi && (R[b + R_GEN] as number) >>> 16 === gen) {
        return parent - 1
      }
    }
    if (((R[pb + R_UP] as number) & TABLE_KIDS) === 0) return NIL
    const t = this.children
    for (let c = t.first(this.childHash(parent, gen, lo, hi)); c !== NIL; c = t.next()) {
      const b = c * RS
      if (((R[b + R_UP] as number) & KEY_MASK) === parent && R[b + R_TLO] === lo && R[b + R_THI] === hi && (R[b + R_GEN] as number) >>> 16 === gen) return c
    }
    return NIL
  }

  /** True when `node` is `of` or one of its ancestors (following parents while attached). */
  private isAncestorOrSelf(node: number, of: number): boolean {
    let x = of
    for (let steps = 0; x !== NIL && x !== ROOT; steps++) {
      if (x === node) return true
      if (!this.isAttached(x) || steps > this.rHigh) return false
      x = (this.R[x * RS + R_UP] as number) & UP_SLOT
    }
    return false
  }

  /** Takes a node out of the children table, if it is there. */
  private unchainChild(node: number): void {
    const R = this.R
    const b = node * RS
    const up = R[b + R_UP] as number
    if ((up & IN_TABLE) !== 0) {
      this.children.remove(this.childHash(up & UP_SLOT, (R[b + R_GEN] as number) >>> 16, R[b + R_TLO] as number, R[b + R_THI] as number), node)
      R[b + R_UP] = up & ~IN_TABLE
    }
  }

  /** Makes an attached node findable from its parent: beside it, or in the table. */
  private chainChild(node: number): void {
    const parent = (this.R[node * RS + R_UP] as number) & UP_SLOT
    if (parent === ROOT || (node !== parent + 1 && node !== parent - 1)) this.tableInsert(node)
  }

  private tableInsert(node: number): void {
    const R = this.R
    const b = node * RS
    const up = R[b + R_UP] as number
    const parent = up & UP_SLOT
    R[b + R_UP] = up | IN_TABLE
    R[parent * RS + R_UP] = (R[parent * RS + R_UP] as number) | TABLE_KIDS
    this.children.insert(this.childHash(parent, (R[b + R_GEN] as number) >>> 16, R[b + R_TLO] as number, R[b + R_THI] as number), node)
    if (this.children.needsRebuild) this.rebuildChildren()
  }

  /**
   * Re-inserts the table's own children (it holds only the children not beside their parent, a
   * small part of all nodes), so a rebuild costs the table's size, not a scan of every node.
   * Queries read this table, so the new one is built aside while they keep reading the old one.
   */
  private rebuildChildren(): void {
    const slots = this.children.liveSlots()
    const fresh = new SlotTable()
    fresh.reset(slots.length)
    const R = this.R
    for (let i = 0; i < slots.length; i++) {
      if ((i & 63) === 63 && this.interrupt !== null) this.interrupt()
      const node = slots[i] as number
      const b = node * RS
      fresh.insert(this.childHash((R[b + R_UP] as number) & UP_SLOT, (R[b + R_GEN] as number) >>> 16, R[b + R_TLO] as number, R[b + R_THI] as number), node)
    }
    this.children = fresh
  }

  private relink(node: number, parent: number, lo: number, hi: number): void {
    this.unchainChild(node)
    const R = this.R
    R[parent * RS + R_UP] = (R[parent * RS + R_UP] as number) | MIXED
    const b = node * RS
    R[b + R_UP] = ((R[b + R_UP] as number) & ~UP_SLOT) | parent
    R[b + R_GEN] = ((R[b + R_GEN] as number) & GEN_MASK) | (((R[parent * RS + R_GEN] as number) & GEN_MASK) << 16)
    R[b + R_TLO] = lo
    R[b + R_THI] = hi
    this.chainChild(node)
  }

  /**
   * A child goes into the slot next to its parent when that one is free, else the one before
   * it, else the most recently freed slot. A lookup walks a chain one node per block, each a
   * dependent load; with a chain's nodes side by side, the walk reads neighbouring cache lines
   * the hardware prefetcher sees as a stream, and the child is found beside its parent without
   * a table probe. Chains are stored and evicted whole, so the slots a chain frees are mostly
   * taken by the next chain, side by side again.
   */
  private newNode(parent: number, lo: number, hi: number): number {
    const node = this.takeNode(parent, lo, hi)
    const R = this.R
    const b = node * RS
    R[b + R_GEN] = ((R[b + R_GEN] as number) & GEN_MASK) | (((R[parent * RS + R_GEN] as number) & GEN_MASK) << 16)
    this.chainChild(node)
    return node
  }

  /**
   * A node that is the top of a detached subtree from the start (a snapshot's): its parent is the
   * root under a generation the root never has (the root is never freed, so its generation stays
   * 0), so it is unreachable and in no child lookup, as a node whose parent was freed.
   */
  private newDetachedNode(lo: number, hi: number): number {
    const node = this.takeNode(ROOT, lo, hi)
    const b = node * RS
    this.R[b + R_GEN] = ((this.R[b + R_GEN] as number) & GEN_MASK) | (GEN_MASK << 16)
    return node
  }

  /** A slot for a new child of `parent` (see newNode), its record set but for its parent generation. */
  private takeNode(parent: number, lo: number, hi: number): number {
    let node = NIL
    if (parent !== ROOT) {
      node = this.takeFree(parent + 1)
      if (node === NIL) node = this.takeFree(parent - 1)
    }
    if (node === NIL) node = this.takeRecord()
    const R = this.R
    const b = node * RS
    R[b + R_UP] = parent
    R[b + R_TLO] = lo
    R[b + R_THI] = hi
    R[b + R_CW] = CW_EMPTY
    R[b + R_BLO] = 0
    R[b + R_BHI] = 0
    this.liveNodes++
    return node
  }

  /** The most recently freed record, else a new one. */
  private takeRecord(): number {
    const R = this.R
    while (this.freeTop > 0) {
      const x = this.freeStack[--this.freeTop] as number
      if (((R[x * RS + R_UP] as number) & FREE) !== 0) {
        R[x * RS + R_UP] = 0
        return x
      }
    }
    const x = this.rHigh++
    if (x >= this.rCap) this.growRecords()
    return x
  }

  private freeNode(node: number): void {
    this.unchainChild(node)
    const R = this.R
    const b = node * RS
    // Bumping the generation detaches every child at once (spec: clear node.children).
    const gen = ((R[b + R_GEN] as number) + 1) & GEN_MASK
    R[b + R_GEN] = gen
    // 16 bits wrap: children detached 65,536 generations ago would match again, so detach them
    // for good first (a scan once per 65,536 frees of one slot)
    if (gen === 0) this.detachChildrenOf(node)
    this.liveNodes--
    this.freeRecord(node)
  }

  /** Makes every node recorded under `parent` a detached top (see newDetachedNode). */
  private detachChildrenOf(parent: number): void {
    const R = this.R
    for (let x = 1; x < this.rHigh; x++) {
      const b = x * RS
      if (((R[b + R_UP] as number) & KEY_MASK) !== parent) continue
      this.unchainChild(x)
      R[b + R_UP] = ((R[b + R_UP] as number) & ~UP_SLOT) | ROOT
      R[b + R_GEN] = ((R[b + R_GEN] as number) & GEN_MASK) | (GEN_MASK << 16)
    }
  }

  private freeRecord(x: number): void {
    const R = this.R
    const b = x * RS
    R[b + R_UP] = FREE | UP_SLOT
    R[b + R_CW] = CW_EMPTY
    if (this.freeTop === this.freeStack.length) this.compactFree()
    this.freeStack[this.freeTop++] = x
  }

  /**
   * Drops from the free stack the records taken out of turn and the repeats of one record (freed,
   * taken beside a parent, freed again), keeping the order; grows it if it is still full.
   */
  private compactFree(): void {
    const R = this.R
    const st = this.freeStack
    let n = 0
    // a free record's R_THI is unused: it marks the ones kept
    for (let i = 0; i < this.freeTop; i++) {
      const x = st[i] as number
      if (((R[x * RS + R_UP] as number) & FREE) !== 0) R[x * RS + R_THI] = 0
    }
    for (let i = this.freeTop - 1; i >= 0; i--) {
      const x = st[i] as number
      if (((R[x * RS + R_UP] as number) & FREE) === 0 || R[x * RS + R_THI] === 1) st[i] = NIL
      else R[x * RS + R_THI] = 1
    }
    for (let i = 0; i < this.freeTop; i++) if (st[i] !== NIL) st[n++] = st[i] as number
    this.freeTop = n
    if (n * 2 > st.length) this.freeStack = growI32(st, st.length * 2, 0)
  }

  /**
   * The node slot that worker-rank slot `w` holds block hash (lo, hi) in, or -1. For tests and
   * diagnostics: where the allocator put a chain.
   */
  nodeSlotOf(w: number, lo: number, hi: number): number {
    const e = this.findEntry(w, lo, hi)
    return e === NIL ? NIL : this.nodeOf(e)
  }

  /** Takes record `x` when it is free (its entry in the free stack is skipped later); NIL when it is not. */
  private takeFree(x: number): number {
    if (x < 1 || x >= this.rHigh || ((this.R[x * RS + R_UP] as number) & FREE) === 0) return NIL
    this.R[x * RS + R_UP] = 0
    return x
  }

  private growRecords(): void {
    this.rCap = Math.min(Math.ceil(this.rCap * GROWTH), MAX_SLOT + 1)
    // one record more than the cap: findChild reads the slot after its parent unchecked
    this.R = this.grownCopy(this.R, (this.rCap + 1) * RS)
  }

  /**
   * A larger copy of a record array. A copy of millions of words takes milliseconds, so it
   * goes in chunks with interrupts between: queries then read the old array, which nothing
   * changes until the copy replaces it.
   */
  private grownCopy(a: Int32Array<ArrayBuffer>, words: number): Int32Array<ArrayBuffer> {
    const n = new Int32Array(words)
    const CHUNK = 1 << 14
    for (let at = 0; at < a.length; at += CHUNK) {
      if (at > 0 && this.interrupt !== null) this.interrupt()
      n.set(a.subarray(at, Math.min(a.length, at + CHUNK)), at)
    }
    return n
  }

  // ------------------------------------------------------------------------------------------
  // entries

  /**
   * Loads what the probes of blocks [from, to) will read: each block's home cell in the lookup
   * table and the record found there. An index of this size misses every cache at almost every
   * such read, and one block's probe waits for each miss in turn. Here the loads of different
   * blocks do not depend on one another, so the CPU keeps many in flight; one level per pass,
   * because each level needs the one before. Only reads: a cell whose fingerprint later turns
   * out not to match just wasted a load.
   */
  private warm(w: number, lo: Uint32Array, hi: Uint32Array, from: number, to: number): void {
    const t = this.lookup
    const slots = this.warmSlots
    const R = this.R
    const m = to - from
    let acc = 0
    for (let i = 0; i < m; i++) slots[i] = t.peekHome(mix3(w, (lo[from + i] as number) | 0, (hi[from + i] as number) | 0))
    for (let i = 0; i < m; i++) {
      const e = slots[i] as number
      if (e >= 0) acc ^= R[e * RS + R_UP] as number
    }
    this.warmSink ^= acc
  }

  private findEntry(w: number, lo: number, hi: number): number {
    lo |= 0
    hi |= 0
    const R = this.R
    const t = this.lookup
    for (let e = t.first(mix3(w, lo, hi)); e !== NIL; e = t.next()) {
      const b = e * RS
      if (R[b + R_BLO] === lo && R[b + R_BHI] === hi && (R[b + R_CW] as number) >>> 16 === w) return e
    }
    return NIL
  }

  /** The node an entry belongs to: its own record, or the one an overflow entry names. */
  private nodeOf(e: number): number {
    const up = this.R[e * RS + R_UP] as number
    return (up & OVERFLOW) !== 0 ? up & UP_SLOT : e
  }

  /** The node's first entry (its own record), or NIL when it holds none. */
  private firstHolder(node: number): number {
    return (this.R[node * RS + R_CW] as number) >>> 16 === NO_WORKER ? NIL : node
  }

  /** The entry after `e` among the node's. */
  private nextHolder(node: number, e: number): number {
    return e !== node ? (this.R[e * RS + R_TLO] as number) : this.overflowOf(node)
  }

  /** The node's first overflow entry, or NIL. */
  private overflowOf(node: number): number {
    return ((this.R[node * RS + R_UP] as number) & HEADS) === 0 ? NIL : this.headOf(node)
  }

  private headHash(node: number): number {
    return mix3(node, 0x2545f491, 0x4f6cdd1d)
  }

  /** The first overflow entry of a node flagged HEADS. */
  private headOf(node: number): number {
    const R = this.R
    const t = this.heads
    for (let x = t.first(this.headHash(node)); x !== NIL; x = t.next()) {
      if (((R[x * RS + R_UP] as number) & (UP_SLOT | OVERFLOW)) === (node | OVERFLOW)) return x
    }
    throw new Error(`index: node ${node} is flagged with overflow entries and has none`)
  }

  /** Makes `x` (an overflow entry of `node`, or NIL) the node's first overflow entry. */
  private setHead(node: number, old: number, x: number): void {
    const R = this.R
    const h = this.headHash(node)
    if (old !== NIL) this.heads.remove(h, old)
    if (x === NIL) {
      R[node * RS + R_UP] = (R[node * RS + R_UP] as number) & ~HEADS
      return
    }
    R[node * RS + R_UP] = (R[node * RS + R_UP] as number) | HEADS
    this.heads.insert(h, x)
    if (this.heads.needsRebuild) {
      const slots = this.heads.liveSlots()
      this.heads.reset(slots.length)
      for (let i = 0; i < slots.length; i++) {
        const s = slots[i] as number
        this.heads.insert(this.headHash((R[s * RS + R_UP] as number) & UP_SLOT), s)
      }
    }
  }

  /** Adds an entry: the node's own record when it holds none yet, else an overflow record first in its list. */
  private addEntry(w: number, node: number, lo: number, hi: number): void {
    const nb = node * RS
    let count = (this.R[nb + R_CW] as number) & COUNT_MASK
    if (!this.nodeHasWorker(node, w)) count++
    let e = node
    if ((this.R[nb + R_CW] as number) >>> 16 === NO_WORKER) {
      const R = this.R
      R[nb + R_CW] = (w << 16) | count
      R[nb + R_BLO] = lo
      R[nb + R_BHI] = hi
    } else {
      e = this.takeRecord()
      const R = this.R
      R[nb + R_CW] = ((R[nb + R_CW] as number) & ~COUNT_MASK) | count
      const b = e * RS
      const old = ((R[nb + R_UP] as number) & HEADS) === 0 ? NIL : this.headOf(node)
      R[b + R_UP] = OVERFLOW | node
      R[b + R_TLO] = old
      R[b + R_THI] = 0
      R[b + R_CW] = w << 16
      R[b + R_BLO] = lo
      R[b + R_BHI] = hi
      this.setHead(node, old, e)
    }
    this.liveEntries++
    this.wSize[w] = (this.wSize[w] as number) + 1
    this.lookup.insert(mix3(w, lo, hi), e)
    if (this.lookup.needsRebuild) this.rebuildLookup()
  }

  private rebuildLookup(): void {
    this.lookup.reset(this.liveEntries)
    const R = this.R
    for (let e = 0; e < this.rHigh; e++) {
      // queries never read this table, so they may run while it is rebuilt (milliseconds)
      if ((e & 63) === 63 && this.interrupt !== null) this.interrupt()
      const b = e * RS
      const w = (R[b + R_CW] as number) >>> 16
      if (w !== NO_WORKER) this.lookup.insert(mix3(w, R[b + R_BLO] as number, R[b + R_BHI] as number), e)
    }
  }

  private nodeHasWorker(node: number, w: number): boolean {
    const R = this.R
    for (let e = this.firstHolder(node); e !== NIL; e = this.nextHolder(node, e)) if ((R[e * RS + R_CW] as number) >>> 16 === w) return true
    return false
  }

  /**
   * Drops one entry; frees its node when it was the node's last worker. A node's first entry
   * is replaced by its next one, which moves into the node's record (a new slot for it).
   */
  private removeEntry(e: number): void {
    const R = this.R
    const b = e * RS
    const w = (R[b + R_CW] as number) >>> 16
    const node = this.nodeOf(e)
    const nb = node * RS
    this.lookup.remove(mix3(w, R[b + R_BLO] as number, R[b + R_BHI] as number), e)
    // unlink it, noting whether the worker stays through another hash
    let still = false
    const head = ((R[nb + R_UP] as number) & HEADS) === 0 ? NIL : this.headOf(node)
    if (e !== node && (R[nb + R_CW] as number) >>> 16 === w) still = true
    let prev = NIL
    for (let x = head; x !== NIL; x = R[x * RS + R_TLO] as number) {
      if (x === e) {
        if (prev === NIL) this.setHead(node, head, R[b + R_TLO] as number)
        else R[prev * RS + R_TLO] = R[b + R_TLO] as number
        continue
      }
      if ((R[x * RS + R_CW] as number) >>> 16 === w) still = true
      prev = x
    }
    let count = (R[nb + R_CW] as number) & COUNT_MASK
    if (!still) {
      count--
      R[nb + R_UP] = (R[nb + R_UP] as number) | MIXED
    }
    if (e === node) {
      // the node's own entry: its first overflow entry takes the record's place
      if (head !== NIL) {
        const hb = head * RS
        const hw = (R[hb + R_CW] as number) >>> 16
        R[nb + R_CW] = (hw << 16) | count
        R[nb + R_BLO] = R[hb + R_BLO] as number
        R[nb + R_BHI] = R[hb + R_BHI] as number
        this.setHead(node, head, R[hb + R_TLO] as number)
        const h = mix3(hw, R[hb + R_BLO] as number, R[hb + R_BHI] as number)
        this.lookup.remove(h, head)
        this.lookup.insert(h, node)
        this.freeRecord(head)
      } else R[nb + R_CW] = CW_EMPTY | count
    } else {
      R[nb + R_CW] = ((R[nb + R_CW] as number) & ~COUNT_MASK) | count
      this.freeRecord(e)
    }
    this.liveEntries--
    this.wSize[w] = (this.wSize[w] as number) - 1
    if (count === 0) this.freeNode(node)
  }

  // ------------------------------------------------------------------------------------------
  // dump

  /**
   * The whole index as events that rebuild it in an empty index (a dump): parents before
   * children, one single-block Stored per (node, worker-rank) with the parent's hash as that
   * worker knows it. Two shapes the reference dump loses are kept: a worker that holds a block
   * but not its parent is bridged through synthetic hashes that are removed again, and a
   * detached subtree is rebuilt under a temporary anchor that is removed at the end. Replaying
   * the result gives the same find_matches answers and the same tree sizes. Cold path.
   */
  dump(): RouterEvent[] {
    const events: RouterEvent[] = []
    const children = new Map<number, number[]>()
    const detachedTops: number[] = []
    for (let node = 1; node < this.rHigh; node++) {
      if (!this.isNode(node)) continue
      if (this.isAttached(node)) {
        const p = (this.R[node * RS + R_UP] as number) & UP_SLOT
        const list = children.get(p)
        if (list === undefined) children.set(p, [node])
        else list.push(node)
      } else detachedTops.push(node)
    }
    let eventId = 0n
    const push = (w: number, data: RouterEvent['event']['data']): void => {
      events.push({
        worker_id: u64FromParts(this.wIdLo[w] as number, this.wIdHi[w] as number),
        event: { event_id: eventId++, data, dp_rank: this.wRank[w] as number },
      })
    }
    let synthCounter = 0
    const synth = (w: number): bigint => {
      for (;;) {
        synthCounter++
        if (this.findEntry(w, synthCounter, 0xfffffffe) === NIL) return u64FromParts(synthCounter, 0xfffffffe)
      }
    }
    const heldBh = (w: number, node: number): bigint | null => {
      for (let e = this.firstHolder(node); e !== NIL; e = this.nextHolder(node, e)) {
        if ((this.R[e * RS + R_CW] as number) >>> 16 === w) return u64FromParts(this.R[e * RS + R_BLO] as number, this.R[e * RS + R_BHI] as number)
      }
      return null
    }
    const tok = (node: number): bigint => u64FromParts(this.R[node * RS + R_TLO] as number, this.R[node * RS + R_THI] as number)
    let anchorCounter = 0

    const region = (top: number): void => {
      let anchorTok = 0n
      const anchors = new Map<number, bigint>()
      if (top !== ROOT) {
        do anchorCounter++
        while (this.findChild(ROOT, anchorCounter, 0xffffffff) !== NIL)
        anchorTok = u64FromParts(anchorCounter, 0xffffffff)
      }
      const queue = top === ROOT ? [...(children.get(ROOT) ?? [])] : [top]
      for (let qi = 0; qi < queue.length; qi++) {
        const node = queue[qi] as number
        for (let e = this.firstHolder(node); e !== NIL; e = this.nextHolder(node, e)) {
          const w = (this.R[e * RS + R_CW] as number) >>> 16
          const missing: number[] = []
          let parentHash: bigint | null = null
          let needAnchor = false
          for (let x = node; ; ) {
            if (x === top) {
              needAnchor = true
              break
            }
            const p = (this.R[x * RS + R_UP] as number) & UP_SLOT
            if (p === ROOT) break
            const held = heldBh(w, p)
            if (held !== null) {
              parentHash = held
              break
            }
            missing.push(p)
            x = p
          }
          const blocks: StoredBlock[] = []
          const bridges: bigint[] = []
          if (needAnchor) {
            const a = anchors.get(w)
            if (a === undefined) {
              const h = synth(w)
              anchors.set(w, h)
              blocks.push({ block_hash: h, tokens_hash: anchorTok })
            } else parentHash = a
          }
          for (let i = missing.length - 1; i >= 0; i--) {
            const h = synth(w)
            bridges.push(h)
            blocks.push({ block_hash: h, tokens_hash: tok(missing[i] as number) })
          }
          blocks.push({ block_hash: u64FromParts(this.R[e * RS + R_BLO] as number, this.R[e * RS + R_BHI] as number), tokens_hash: tok(node) })
          push(w, { stored: { parent_hash: parentHash, blocks } })
          if (bridges.length > 0) push(w, { removed: { block_hashes: bridges } })
        }
        const kids = children.get(node)
        if (kids !== undefined) for (const k of kids) queue.push(k)
      }
      for (const [w, h] of anchors) push(w, { removed: { block_hashes: [h] } })
    }

    region(ROOT)
    for (const top of detachedTops) region(top)
    // lower-tier blocks: one Stored each, with its tier and its parent as stored (they need no parent present)
    this.lower?.forEach((b) => {
      events.push({
        worker_id: u64FromParts(this.wIdLo[b.w] as number, this.wIdHi[b.w] as number),
        storage_tier: LOWER_TIER_NAMES[b.tier] as (typeof LOWER_TIER_NAMES)[number],
        event: {
          event_id: eventId++,
          data: {
            stored: {
              parent_hash: b.hasParent ? u64FromParts(b.parentLo, b.parentHi) : null,
              blocks: [{ block_hash: u64FromParts(b.blockLo, b.blockHi), tokens_hash: u64FromParts(b.tokLo, b.tokHi) }],
            },
          },
          dp_rank: this.wRank[b.w] as number,
        },
      })
    })
    return events
  }

  // ------------------------------------------------------------------------------------------
  // snapshots (the layout: src/index/snapshot-format.ts)

  /**
   * The whole index as one binary snapshot part, written from its arrays: every registered
   * worker-rank with its last event id, every node parents first (detached subtrees too, and the
   * MIXED flags find_matches relies on), each node's entries. Linear in the index, one buffer, no
   * object per block; long ones answer queries in between (nothing changes meanwhile).
   */
  writeSnapshotPart(): Uint8Array {
    const p = newPart(this.liveWorkers, this.liveNodes - 1, this.liveEntries, this.lowerEntries)
    const wIndex = new Int32Array(this.wHigh)
    let k = 0
    for (let w = 0; w < this.wHigh; w++) {
      if (this.wLive[w] !== 1) continue
      const o = k * WORKER.words
      p.worker[o + WORKER.idLo] = this.wIdLo[w] as number
      p.worker[o + WORKER.idHi] = this.wIdHi[w] as number
      p.worker[o + WORKER.rank] = this.wRank[w] as number
      p.worker[o + WORKER.flags] = this.wEvSeen[w] === 1 ? WORKER_LAST_ID : 0
      p.worker[o + WORKER.lastIdLo] = this.wEvLo[w] as number
      p.worker[o + WORKER.lastIdHi] = this.wEvHi[w] as number
      wIndex[w] = k++
    }
    const R = this.R
    // a node's number in the part, once written; the chain above a node not yet written is
    // walked up to a written (or top) node and written down from there, so parents come first
    const index = new Int32Array(this.rHigh).fill(NIL)
    const stack = new Int32Array(this.rHigh)
    let n = 0
    let e = 0
    for (let node = 1; node < this.rHigh; node++) {
      if (!this.isNode(node) || index[node] !== NIL) continue
      let sp = 0
      for (let x = node; ; ) {
        if (sp === stack.length) throw new Error('the index holds a cycle of nodes')
        stack[sp++] = x
        if (!this.isAttached(x)) break
        const parent = (R[x * RS + R_UP] as number) & UP_SLOT
        if (parent === ROOT || index[parent] !== NIL) break
        x = parent
      }
      while (sp > 0) {
        const x = stack[--sp] as number
        const b = x * RS
        const parent = (R[b + R_UP] as number) & UP_SLOT
        const ref = !this.isAttached(x) ? UP_DETACHED : parent === ROOT ? UP_ROOT : (index[parent] as number) + 1
        p.up[n] = ((R[b + R_UP] as number) & MIXED) !== 0 ? (ref | UP_MIXED) >>> 0 : ref
        p.tokLo[n] = R[b + R_TLO] as number
        p.tokHi[n] = R[b + R_THI] as number
        let c = 0
        for (let en = this.firstHolder(x); en !== NIL; en = this.nextHolder(x, en), c++, e++) {
          p.blockLo[e] = R[en * RS + R_BLO] as number
          p.blockHi[e] = R[en * RS + R_BHI] as number
          p.owner[e] = wIndex[(R[en * RS + R_CW] as number) >>> 16] as number
        }
        p.count[n] = c
        index[x] = n++
      }
      if ((node & 4095) === 4095 && this.interrupt !== null) this.interrupt()
    }
    if (n !== p.nodes || e !== p.entries) throw new Error(`snapshot: wrote ${n} nodes and ${e} entries of ${p.nodes} and ${p.entries}`)
    let l = 0
    this.lower?.forEach((b) => {
      const o = l++ * LOWER.words
      const q = p.lower
      q[o + LOWER.ownerTier] = ((wIndex[b.w] as number) | (b.tier << 16) | (b.hasParent ? LOWER_HAS_PARENT : 0)) >>> 0
      q[o + LOWER.parentLo] = b.parentLo
      q[o + LOWER.parentHi] = b.parentHi
      q[o + LOWER.tokLo] = b.tokLo
      q[o + LOWER.tokHi] = b.tokHi
      q[o + LOWER.blockLo] = b.blockLo
      q[o + LOWER.blockHi] = b.blockHi
    })
    if (l !== p.lowerBlocks) throw new Error(`snapshot: wrote ${l} lower-tier blocks of ${p.lowerBlocks}`)
    return sealPart(p)
  }

  /**
   * Loads a part that checkPart accepted, as a tree dump of each of its worker-ranks that `take`
   * marks (1 per worker-rank of the part): the worker-rank's blocks are dropped first, then it
   * gets the part's entries and its last event id. A node is merged with the one that exists
   * under the same parent and tokens hash, else created, from the part's columns, without
   * decoding anything. A node that no taken worker-rank holds is not created, and its children
   * become tops of detached subtrees, as a replay of their events would leave them. Entries past
   * the cap are refused as `capacity`, worker-ranks past theirs as `too_many_workers`. Returns
   * the entries added.
   */
  loadSnapshotPart(p: SnapshotPart, take: Uint8Array): number {
    const slotOf = new Int32Array(p.workers).fill(NIL)
    const held: number[] = []
    for (let i = 0; i < p.workers; i++) {
      if (take[i] !== 1) continue
      const lo = p.workerIdLo(i)
      const hi = p.workerIdHi(i)
      const rank = p.workerRank(i)
      let w = this.workerSlot(lo, hi, rank)
      if (w !== NIL && ((this.wSize[w] as number) > 0 || this.lowerBlocksOf(w) > 0)) held.push(w)
      if (w === NIL) w = this.ensureWorker(lo, hi, rank)
      if (w === NIL) {
        this.reject(RejectReason.TooManyWorkers, EventKind.Stored)
        continue
      }
      slotOf[i] = w
      const o = i * WORKER.words
      this.wEvSeen[w] = ((p.worker[o + WORKER.flags] as number) & WORKER_LAST_ID) !== 0 ? 1 : 0
      this.wEvLo[w] = p.worker[o + WORKER.lastIdLo] as number
      this.wEvHi[w] = p.worker[o + WORKER.lastIdHi] as number
    }
    if (held.length > 0) this.dropEntriesOf(held)
    this.reserve(p.entries)
    const nodeSlot = new Int32Array(p.nodes)
    const { count, owner, blockLo, blockHi, up } = p
    let e = 0
    let added = 0
    for (let i = 0; i < p.nodes; i++) {
      const c = count[i] as number
      let slot = NIL
      // the first into the node's own record, then the rest last first: they are prepended to
      // its overflow list, so its order comes back as written
      for (let k = 0; k < c; k++) {
        const j = k === 0 ? e : e + c - k
        const w = slotOf[owner[j] as number] as number
        if (w === NIL) continue
        const lo = (blockLo[j] as number) | 0
        const hi = (blockHi[j] as number) | 0
        // the worker-rank was emptied above: a hash held already is a repeat in the part
        if (this.findEntry(w, lo, hi) !== NIL) continue
        if (this.liveEntries + this.lowerEntries >= this.maxBlocks) {
          this.reject(RejectReason.Capacity, EventKind.Stored)
          continue
        }
        if (slot === NIL) slot = this.placeNode(p, i, nodeSlot)
        this.addEntry(w, slot, lo, hi)
        added++
      }
      if (slot !== NIL && ((up[i] as number) & UP_MIXED) !== 0) this.R[slot * RS + R_UP] = (this.R[slot * RS + R_UP] as number) | MIXED
      nodeSlot[i] = slot
      e += c
      if ((i & 255) === 255 && this.interrupt !== null) this.interrupt()
    }
    return added + this.loadLower(p, slotOf)
  }

  /** The part's lower-tier blocks of the taken worker-ranks (`slotOf` not −1). */
  private loadLower(p: SnapshotPart, slotOf: Int32Array): number {
    const q = p.lower
    let added = 0
    for (let i = 0; i < p.lowerBlocks; i++) {
      const o = i * LOWER.words
      const ot = q[o + LOWER.ownerTier] as number
      const w = slotOf[ot & 0xffff] as number
      if (w === NIL) continue
      if (this.liveEntries + this.lowerEntries >= this.maxBlocks) {
        this.reject(RejectReason.Capacity, EventKind.Stored)
        continue
      }
      const L = (this.lower ??= new LowerTiers())
      const has = (ot & LOWER_HAS_PARENT) !== 0
      const tier = (ot >>> 16) & 3
      if (
        L.add(
          w,
          tier,
          has,
          q[o + LOWER.parentLo] as number,
          q[o + LOWER.parentHi] as number,
          q[o + LOWER.tokLo] as number,
          q[o + LOWER.tokHi] as number,
          q[o + LOWER.blockLo] as number,
          q[o + LOWER.blockHi] as number,
        )
      ) {
        this.lowerEntries++
        added++
      }
    }
    return added
  }

  /** The slot of node `i` of a part being loaded: merged with an existing child, created, or a detached top. */
  private placeNode(p: SnapshotPart, i: number, nodeSlot: Int32Array): number {
    const ref = (p.up[i] as number) & UP_REF_MASK
    const lo = (p.tokLo[i] as number) | 0
    const hi = (p.tokHi[i] as number) | 0
    const parent = ref === UP_ROOT ? ROOT : ref === UP_DETACHED ? NIL : (nodeSlot[ref - 1] as number)
    if (parent === NIL) return this.newDetachedNode(lo, hi)
    const found = this.findChild(parent, lo, hi)
    return found !== NIL ? found : this.newNode(parent, lo, hi)
  }

  /**
   * Room for `entries` more entries at once (every node holds one, in its own record), so a load
   * copies the records at most once; an empty lookup table is sized for the entries instead of
   * growing through rebuilds.
   */
  private reserve(entries: number): void {
    const add = Math.min(entries, this.maxBlocks)
    const cap = Math.min(this.rHigh + add, MAX_SLOT + 1)
    if (cap > this.rCap) {
      this.rCap = cap
      this.R = this.grownCopy(this.R, (cap + 1) * RS)
    }
    if (this.liveEntries === 0 && add > this.lookup.live) this.lookup.reset(add)
  }

  // ------------------------------------------------------------------------------------------
  // introspection

  /** Bytes held by the index's typed arrays (what a cap on blocks bounds). */
  get bytes(): number {
    const b = this.R.byteLength + this.freeStack.byteLength + this.children.bytes + this.lookup.bytes + this.heads.bytes + this.wTable.byteLength
    return b + this.wIdLo.length * 25 + this.path.byteLength + (this.lower === null ? 0 : this.lower.bytes)
  }
}
