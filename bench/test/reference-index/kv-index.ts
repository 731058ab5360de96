// The KV block index one shard owns: a radix tree whose edges are local block hashes
// (`tokens_hash`), whose nodes know which worker-ranks hold them, plus each worker-rank's map
// from its external block hashes (`block_hash`) to nodes. All of it lives in typed arrays:
//
//   nodes    slot → parent slot + parent generation, edge key (tokens_hash lo/hi), distinct
//            worker count, head of its entry list, next node in the child hash chain.
//            A child hash table keyed by (parent slot, tokens_hash) finds children.
//   entries  one per (worker-rank, block_hash) the index holds: worker, node, block_hash lo/hi,
//            next entry in the lookup hash chain, next entry of the same node.
//            A lookup hash table keyed by (worker, block_hash) finds them.
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
import { mix3 } from '../../../src/codec/hash-mix.js'
import { EventKind, type DecodedEvent } from '../../../src/codec/event-decoder.js'
import type { RouterEvent, StoredBlock } from '../../../src/codec/events.js'
import { u64FromParts } from '../../../src/codec/u64.js'
import { MAX_SLOT, SlotTable } from './slot-table.js'
import {
  type SnapshotPart,
  UP_DETACHED,
  UP_MIXED,
  UP_REF_MASK,
  UP_ROOT,
  WORKER,
  WORKER_LAST_ID,
  newPart,
  sealPart,
} from '../../../src/index/snapshot-format.js'

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
}

export const MAX_WORKER_RANKS = 0xfffe
/** Entries and nodes are named by 26-bit slots in the hash tables. */
export const MAX_BLOCKS = MAX_SLOT - 2
const NO_WORKER = 0xffff
/** Records grow by a quarter: more copies while filling, less memory held idle afterwards. */
const GROWTH = 1.25
const OPEN = 0xffffffff
const NIL = -1
const ROOT = 0

// Node and entry records are laid out as structs inside one Int32Array each, so a hash-chain
// probe touches one cache line instead of one per field. u32 values are stored as int32 bits.
// A free node links the free list through N_FIRST (next) and N_KID (previous), a free entry
// through E_NEXT.
const NS = 8
const N_PARENT = 0
const N_PGEN = 1
const N_GEN = 2
const N_TLO = 3
const N_THI = 4
/** Low 16 bits: distinct workers holding the node. Bit 16: MIXED (below). */
const N_COUNT = 5
const N_FIRST = 6
/**
 * The child attached most recently. Along a conversation's chain nearly every node has exactly
 * one child, so that child is found here and never enters the children table: a walk reads one
 * record per block, and storing or freeing a chain block touches no table. A node's other
 * children live in the table (IN_TABLE), which the parent notes (TABLE_KIDS) so a childless or
 * single-child node answers a miss without probing it.
 */
const N_KID = 7
const COUNT_MASK = 0xffff
/**
 * Set once a worker left this node while the node survived, or a node was re-linked under it:
 * a child may then hold a worker this node does not, so equal worker counts no longer prove
 * equal worker sets and find_matches compares the sets on this edge.
 */
const MIXED = 0x10000
/** This node is in the children table (it is not, or no longer, its parent's N_KID). */
const IN_TABLE = 0x20000
/** Some child of this node is in the children table (set once; cleared when the node is made). */
const TABLE_KIDS = 0x40000
/**
 * The node is free. Free nodes form a doubly linked list through their own records (N_FIRST
 * the next, N_KID the previous), so any free node can be taken out of it in O(1): see newNode.
 */
const FREE = 0x80000
const ES = 5
/** Blocks warmed per pass (KvIndex.warm): enough misses in flight, few enough to stay cached. */
const WARM = 32
/** Fewer blocks than this have too few misses to overlap: the warm-up would only add work. */
const WARM_MIN = 4
const E_W = 0
const E_NODE = 1
const E_LO = 2
const E_HI = 3
const E_NEXT = 4

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

  // --- nodes: NS int32 words each, see N_* ---
  private N: Int32Array<ArrayBuffer>
  private nCap: number
  private nHigh = 1
  private nFreeHead = NIL
  private children = new SlotTable()

  // --- entries: ES int32 words each, see E_* ---
  private E: Int32Array<ArrayBuffer>
  private eCap: number
  private eHigh = 0
  private eFreeHead = NIL
  private lookup = new SlotTable()

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

  /** Per warmed block: the entry its probe will meet, then that entry's node, then its parent. */
  private warmSlots = new Int32Array(WARM)
  /** Where warm() leaves what it loaded, so the loads are not optimised away. */
  private warmSink = 0

  /** Worker-rank slots matched by the last findMatches, in discovery order. */
  matchWorkers = new Int32Array(16)
  matchCount = 0

  constructor(options: KvIndexOptions = {}) {
    this.maxBlocks = Math.min(options.maxBlocks ?? MAX_BLOCKS, MAX_BLOCKS)
    this.maxWorkerRanks = Math.min(options.maxWorkerRanks ?? MAX_WORKER_RANKS, MAX_WORKER_RANKS)
    const cap = Math.max(16, Math.min(options.initialBlocks ?? 1024, this.maxBlocks + 1))
    this.nCap = cap
    this.N = new Int32Array(cap * NS)
    this.eCap = cap
    this.E = new Int32Array(cap * ES)
    // The root holds every worker implicitly and is never freed.
    this.N[ROOT * NS + N_COUNT] = 0
    // no child hint: a zero-filled hint would name slot 0, the root itself, and a first block whose
    // tokens_hash is 0 would then be found as the root
    this.N[ROOT * NS + N_KID] = NIL
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
    if (ev.tier !== 0) return this.reject(RejectReason.NonDeviceTier, ev.kind)
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
      cur = this.E[pe * ES + E_NODE] as number
    }
    const n = ev.count
    let fresh = false
    for (let i = 0; i < n; i++) {
      if ((i & (WARM - 1)) === 0 && n - i >= WARM_MIN) this.warm(w, ev.blockLo, ev.blockHi, i, Math.min(n, i + WARM), false)
      if ((i & 7) === 7 && this.interrupt !== null) this.interrupt()
      // `| 0`: a u32 above 2^31 is a double, boxed into a fresh heap number at every call
      // that is not inlined; an int32 travels as a small integer (the tables compare int32 bits)
      const tokLo = (ev.tokensLo[i] as number) | 0
      const tokHi = (ev.tokensHi[i] as number) | 0
      const bhLo = (ev.blockLo[i] as number) | 0
      const bhHi = (ev.blockHi[i] as number) | 0
      const e = this.findEntry(w, bhLo, bhHi)
      // A node made by this event has no children yet: skip the probe.
      let node = fresh ? NIL : this.findChild(cur, tokLo, tokHi)
      fresh = false
      if (e !== NIL && this.E[e * ES + E_NODE] === node) {
        // held already, right here: an idempotent re-store
        cur = node
        continue
      }
      // A hash the worker already holds at cur or above it would make the chain a cycle.
      if (e !== NIL && this.isAncestorOrSelf(this.E[e * ES + E_NODE] as number, cur)) return this.reject(RejectReason.InvalidBlock, EventKind.Stored)
      if (node === NIL) {
        if (e !== NIL && !this.isAttached(this.E[e * ES + E_NODE] as number)) {
          node = this.E[e * ES + E_NODE] as number
          this.relink(node, cur, tokLo, tokHi)
        } else {
          node = this.newNode(cur, tokLo, tokHi)
          fresh = true
        }
      }
      if (e !== NIL) {
        if (this.E[e * ES + E_NODE] === node) {
          cur = node
          continue
        }
        // The worker's hash named a node elsewhere in the tree: it now names this one.
        this.removeEntry(e)
      } else if (this.liveEntries >= this.maxBlocks) {
        if (((this.N[node * NS + N_COUNT] as number) & COUNT_MASK) === 0) this.freeNode(node)
        return this.reject(RejectReason.Capacity, EventKind.Stored)
      }
      this.addEntry(w, node, bhLo, bhHi)
      cur = node
    }
    this.appliedByKind[EventKind.Stored] = (this.appliedByKind[EventKind.Stored] as number) + 1
    return APPLY_OK
  }

  private applyRemoved(w: number, ev: DecodedEvent): number {
    let first = APPLY_OK
    const n = ev.count
    for (let i = 0; i < n; i++) {
      if ((i & (WARM - 1)) === 0 && n - i >= WARM_MIN) this.warm(w, ev.blockLo, ev.blockHi, i, Math.min(n, i + WARM), true)
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
    let dropped = 0
    let pending = 0
    for (const w of ranks) pending += this.wSize[w] as number
    for (let e = 0; e < this.eHigh && pending > 0; e++) {
      const ew = this.E[e * ES + E_W] as number
      if (ew === NO_WORKER) continue
      if (this.wIdLo[ew] === idLo && this.wIdHi[ew] === idHi && this.wLive[ew] === 1) {
        this.removeEntry(e)
        dropped++
        pending--
      }
    }
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

  /** Drops every entry of the worker-rank slots `ws`, in one pass over the entries. */
  private dropEntriesOf(ws: readonly number[]): number {
    const mark = new Uint8Array(this.wHigh)
    let pending = 0
    for (const w of ws) {
      if (mark[w] === 1) continue
      mark[w] = 1
      pending += this.wSize[w] as number
    }
    let dropped = 0
    for (let e = 0; e < this.eHigh && pending > 0; e++) {
      const w = this.E[e * ES + E_W] as number
      if (w === NO_WORKER || mark[w] !== 1) continue
      this.removeEntry(e)
      dropped++
      pending--
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
    this.matchCount = 0
    if (n === 0) return 0
    // int32 arguments, as in applyStored: no heap number per call
    let cur = this.findChild(ROOT, (lo[0] as number) | 0, (hi[0] as number) | 0)
    if (cur === NIL) return 0
    const N = this.N
    const E = this.E
    const seen = this.seen
    const depthOf = this.depthOf
    const out = this.matchWorkers
    const stamp = this.nextStamp()
    // Every worker of the first block is a candidate whose depth is still open.
    let m = 0
    for (let e = N[cur * NS + N_FIRST] as number; e !== NIL; e = E[e * ES + E_NEXT] as number) {
      const w = E[e * ES + E_W] as number
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
        const child = this.findChild(cur, (lo[i] as number) | 0, (hi[i] as number) | 0)
        if (child === NIL) break
        // A child holds a subset of its parent's workers unless the parent is marked mixed, so
        // there an equal count means nobody left (the reference's O(1) step); otherwise compare.
        const cw = N[cur * NS + N_COUNT] as number
        if ((cw & MIXED) !== 0 || ((N[child * NS + N_COUNT] as number) & COUNT_MASK) !== (cw & COUNT_MASK)) {
          const ms = this.nextMarkStamp()
          const mark = this.mark
          for (let e = N[child * NS + N_FIRST] as number; e !== NIL; e = E[e * ES + E_NEXT] as number) mark[E[e * ES + E_W] as number] = ms
          for (let e = N[cur * NS + N_FIRST] as number; e !== NIL; e = E[e * ES + E_NEXT] as number) {
            const w = E[e * ES + E_W] as number
            if (mark[w] !== ms && seen[w] === stamp && depthOf[w] === OPEN) {
              depthOf[w] = i
              active--
            }
          }
          if (active === 0) break
        }
        cur = child
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
      if (this.wEvSeen[w] === 1) ts.last_event_id = u64FromParts(this.wEvLo[w] as number, this.wEvHi[w] as number)
      out.push(ts)
    }
    return out
  }

  /** Depth of a slot matched by the last findMatches. */
  depth(w: number): number {
    return this.depthOf[w] as number
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

  private isAttached(node: number): boolean {
    const p = this.N[node * NS + N_PARENT] as number
    return p !== NIL && this.N[p * NS + N_GEN] === this.N[node * NS + N_PGEN]
  }

  private findChild(parent: number, lo: number, hi: number): number {
    lo |= 0
    hi |= 0
    const N = this.N
    const gen = N[parent * NS + N_GEN] as number
    const kid = N[parent * NS + N_KID] as number
    if (kid >= 0) {
      const k = kid * NS
      if (N[k + N_TLO] === lo && N[k + N_THI] === hi && N[k + N_PARENT] === parent && N[k + N_PGEN] === gen) return kid
    }
    if (((N[parent * NS + N_COUNT] as number) & TABLE_KIDS) === 0) return NIL
    const t = this.children
    for (let c = t.first(this.childHash(parent, gen, lo, hi)); c !== NIL; c = t.next()) {
      const b = c * NS
      if (N[b + N_TLO] === lo && N[b + N_THI] === hi && N[b + N_PARENT] === parent && N[b + N_PGEN] === gen) return c
    }
    return NIL
  }

  /** True when `node` is `of` or one of its ancestors (following parents while attached). */
  private isAncestorOrSelf(node: number, of: number): boolean {
    let x = of
    for (let steps = 0; x !== NIL && x !== ROOT; steps++) {
      if (x === node) return true
      if (!this.isAttached(x) || steps > this.nHigh) return false
      x = this.N[x * NS + N_PARENT] as number
    }
    return false
  }

  /** Takes a node out of its parent's child lookup (hint or table). */
  private unchainChild(node: number): void {
    const N = this.N
    const b = node * NS
    const cw = N[b + N_COUNT] as number
    if ((cw & IN_TABLE) !== 0) {
      this.children.remove(this.childHash(N[b + N_PARENT] as number, N[b + N_PGEN] as number, N[b + N_TLO] as number, N[b + N_THI] as number), node)
      N[b + N_COUNT] = cw & ~IN_TABLE
    }
    const p = N[b + N_PARENT] as number
    if (p !== NIL && N[p * NS + N_KID] === node) N[p * NS + N_KID] = NIL
  }

  /** Makes an attached node findable from its parent: as the parent's hint, or in the table. */
  private chainChild(node: number): void {
    const N = this.N
    const parent = N[node * NS + N_PARENT] as number
    // the root has a child per distinct first block: all of them go to the table
    if (parent === ROOT) {
      this.tableInsert(node)
      return
    }
    const pb = parent * NS
    const old = N[pb + N_KID] as number
    N[pb + N_KID] = node
    // the previous hint, if still a child of this parent, moves to the table
    if (old >= 0 && old !== node) {
      const ob = old * NS
      if (N[ob + N_PARENT] === parent && N[ob + N_PGEN] === N[pb + N_GEN] && ((N[ob + N_COUNT] as number) & IN_TABLE) === 0) this.tableInsert(old)
    }
  }

  private tableInsert(node: number): void {
    const N = this.N
    const b = node * NS
    const parent = N[b + N_PARENT] as number
    N[b + N_COUNT] = (N[b + N_COUNT] as number) | IN_TABLE
    N[parent * NS + N_COUNT] = (N[parent * NS + N_COUNT] as number) | TABLE_KIDS
    this.children.insert(this.childHash(parent, N[b + N_PGEN] as number, N[b + N_TLO] as number, N[b + N_THI] as number), node)
    if (this.children.needsRebuild) this.rebuildChildren()
  }

  /**
   * Re-inserts the table's own children (it holds only a node's non-hint children, a small part
   * of all nodes), so a rebuild costs the table's size, not a scan of every node. Queries read
   * this table, so the new one is built aside while they keep reading the old one.
   */
  private rebuildChildren(): void {
    const slots = this.children.liveSlots()
    const fresh = new SlotTable()
    fresh.reset(slots.length)
    const N = this.N
    for (let i = 0; i < slots.length; i++) {
      if ((i & 63) === 63 && this.interrupt !== null) this.interrupt()
      const node = slots[i] as number
      const b = node * NS
      fresh.insert(this.childHash(N[b + N_PARENT] as number, N[b + N_PGEN] as number, N[b + N_TLO] as number, N[b + N_THI] as number), node)
    }
    this.children = fresh
  }

  private relink(node: number, parent: number, lo: number, hi: number): void {
    this.unchainChild(node)
    this.N[parent * NS + N_COUNT] = (this.N[parent * NS + N_COUNT] as number) | MIXED
    this.N[node * NS + N_PARENT] = parent
    this.N[node * NS + N_PGEN] = this.N[parent * NS + N_GEN] as number
    this.N[node * NS + N_TLO] = lo
    this.N[node * NS + N_THI] = hi
    this.chainChild(node)
  }

  /**
   * A child goes into the slot next to its parent when that one is free, else the one before
   * it, else the most recently freed slot. A lookup walks a chain one node per block, each
   * node's slot read from its parent's record, so every step is a dependent load; with a
   * chain's nodes side by side, two share a cache line and the hardware prefetcher sees a
   * stream, where scattered nodes cost a miss per block. Chains are stored and evicted whole,
   * so the slots a chain frees are mostly taken by the next chain, side by side again.
   */
  private newNode(parent: number, lo: number, hi: number): number {
    const node = this.takeNode(parent, lo, hi)
    this.N[node * NS + N_PGEN] = this.N[parent * NS + N_GEN] as number
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
    this.N[node * NS + N_PGEN] = ((this.N[ROOT * NS + N_GEN] as number) - 1) | 0
    return node
  }

  /** A slot for a new child of `parent` (see newNode), its record set but for its parent generation. */
  private takeNode(parent: number, lo: number, hi: number): number {
    let node = NIL
    if (parent !== ROOT) {
      node = this.takeFree(parent + 1)
      if (node === NIL) node = this.takeFree(parent - 1)
    }
    if (node === NIL) {
      node = this.nFreeHead
      if (node !== NIL) this.unlinkFree(node)
      else {
        node = this.nHigh++
        if (node >= this.nCap) this.growNodes()
      }
    }
    const N = this.N
    const b = node * NS
    N[b + N_PARENT] = parent
    N[b + N_TLO] = lo
    N[b + N_THI] = hi
    N[b + N_COUNT] = 0
    N[b + N_FIRST] = NIL
    N[b + N_KID] = NIL
    this.liveNodes++
    return node
  }

  private freeNode(node: number): void {
    this.unchainChild(node)
    const N = this.N
    const b = node * NS
    // Bumping the generation detaches every child at once (spec: clear node.children).
    N[b + N_GEN] = ((N[b + N_GEN] as number) + 1) | 0
    N[b + N_PARENT] = NIL
    N[b + N_COUNT] = FREE
    const head = this.nFreeHead
    N[b + N_FIRST] = head
    N[b + N_KID] = NIL
    if (head !== NIL) N[head * NS + N_KID] = node
    this.nFreeHead = node
    this.liveNodes--
  }

  /**
   * The node slot that worker-rank slot `w` holds block hash (lo, hi) in, or -1. For tests and
   * diagnostics: where the allocator put a chain.
   */
  nodeSlotOf(w: number, lo: number, hi: number): number {
    const e = this.findEntry(w, lo, hi)
    return e === NIL ? NIL : (this.E[e * ES + E_NODE] as number)
  }

  /** Takes `node` out of the free list when it is free there; NIL when it is not. */
  private takeFree(node: number): number {
    if (node < 1 || node >= this.nHigh || ((this.N[node * NS + N_COUNT] as number) & FREE) === 0) return NIL
    this.unlinkFree(node)
    return node
  }

  private unlinkFree(node: number): void {
    const N = this.N
    const next = N[node * NS + N_FIRST] as number
    const prev = N[node * NS + N_KID] as number
    if (prev === NIL) this.nFreeHead = next
    else N[prev * NS + N_FIRST] = next
    if (next !== NIL) N[next * NS + N_KID] = prev
  }

  private growNodes(): void {
    this.nCap = Math.min(Math.ceil(this.nCap * GROWTH), MAX_SLOT + 1)
    this.N = this.grownCopy(this.N, this.nCap * NS)
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
   * table and, with `entries`, the entry found there and that entry's node. An index of this
   * size misses every cache at almost every such read (a pointer chase over 16 MB costs about
   * 150 ns a step on the 2-core test machine), and one block's probe waits for each miss in
   * turn. Here the loads of different blocks do not depend on one another, so the CPU keeps
   * many in flight; one level per pass, because each level needs the one before. Only reads:
   * a cell whose fingerprint later turns out not to match just wasted a load.
   */
  private warm(w: number, lo: Uint32Array, hi: Uint32Array, from: number, to: number, entries: boolean): void {
    const t = this.lookup
    const slots = this.warmSlots
    const m = to - from
    let acc = 0
    for (let i = 0; i < m; i++) slots[i] = t.peekHome(mix3(w, (lo[from + i] as number) | 0, (hi[from + i] as number) | 0))
    if (entries) {
      const E = this.E
      const N = this.N
      for (let i = 0; i < m; i++) {
        const e = slots[i] as number
        slots[i] = e < 0 ? NIL : (E[e * ES + E_NODE] as number)
      }
      for (let i = 0; i < m; i++) {
        const node = slots[i] as number
        slots[i] = node < 0 ? NIL : (N[node * NS + N_PARENT] as number)
      }
      for (let i = 0; i < m; i++) {
        const parent = slots[i] as number
        if (parent >= 0) acc ^= N[parent * NS + N_KID] as number
      }
    }
    this.warmSink ^= acc
  }

  private findEntry(w: number, lo: number, hi: number): number {
    lo |= 0
    hi |= 0
    const E = this.E
    const t = this.lookup
    for (let e = t.first(mix3(w, lo, hi)); e !== NIL; e = t.next()) {
      const b = e * ES
      if (E[b + E_LO] === lo && E[b + E_HI] === hi && E[b + E_W] === w) return e
    }
    return NIL
  }

  private addEntry(w: number, node: number, lo: number, hi: number): void {
    let e = this.eFreeHead
    if (e !== NIL) this.eFreeHead = this.E[e * ES + E_NEXT] as number
    else {
      e = this.eHigh++
      if (e >= this.eCap) this.growEntries()
    }
    const E = this.E
    const N = this.N
    const b = e * ES
    E[b + E_W] = w
    E[b + E_NODE] = node
    E[b + E_LO] = lo
    E[b + E_HI] = hi
    const nb = node * NS
    if (!this.nodeHasWorker(node, w)) N[nb + N_COUNT] = (N[nb + N_COUNT] as number) + 1
    E[b + E_NEXT] = N[nb + N_FIRST] as number
    N[nb + N_FIRST] = e
    this.liveEntries++
    this.wSize[w] = (this.wSize[w] as number) + 1
    this.lookup.insert(mix3(w, lo, hi), e)
    if (this.lookup.needsRebuild) this.rebuildLookup()
  }

  private rebuildLookup(): void {
    this.lookup.reset(this.liveEntries)
    const E = this.E
    for (let e = 0; e < this.eHigh; e++) {
      // queries never read this table, so they may run while it is rebuilt (milliseconds)
      if ((e & 63) === 63 && this.interrupt !== null) this.interrupt()
      const b = e * ES
      const w = E[b + E_W] as number
      if (w !== NO_WORKER) this.lookup.insert(mix3(w, E[b + E_LO] as number, E[b + E_HI] as number), e)
    }
  }

  private nodeHasWorker(node: number, w: number): boolean {
    const E = this.E
    for (let e = this.N[node * NS + N_FIRST] as number; e !== NIL; e = E[e * ES + E_NEXT] as number) if (E[e * ES + E_W] === w) return true
    return false
  }

  /** Drops one entry; frees its node when it was the node's last worker. */
  private removeEntry(e: number): void {
    const E = this.E
    const N = this.N
    const b = e * ES
    const w = E[b + E_W] as number
    const node = E[b + E_NODE] as number
    const nb = node * NS
    // unlink from the node's entry list, noting whether the worker stays through another hash
    let prev = NIL
    let still = false
    for (let x = N[nb + N_FIRST] as number; x !== NIL; x = E[x * ES + E_NEXT] as number) {
      if (x === e) {
        if (prev === NIL) N[nb + N_FIRST] = E[b + E_NEXT] as number
        else E[prev * ES + E_NEXT] = E[b + E_NEXT] as number
        continue
      }
      if (E[x * ES + E_W] === w) still = true
      prev = x
    }
    if (!still) {
      N[nb + N_COUNT] = ((N[nb + N_COUNT] as number) - 1) | MIXED
    }
    this.lookup.remove(mix3(w, E[b + E_LO] as number, E[b + E_HI] as number), e)
    E[b + E_W] = NO_WORKER
    E[b + E_NODE] = NIL
    E[b + E_NEXT] = this.eFreeHead
    this.eFreeHead = e
    this.liveEntries--
    this.wSize[w] = (this.wSize[w] as number) - 1
    if (((N[nb + N_COUNT] as number) & COUNT_MASK) === 0) this.freeNode(node)
  }

  private growEntries(): void {
    this.eCap = Math.min(Math.ceil(this.eCap * GROWTH), MAX_SLOT + 1)
    this.E = this.grownCopy(this.E, this.eCap * ES)
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
    for (let node = 1; node < this.nHigh; node++) {
      if (this.N[node * NS + N_PARENT] === NIL) continue
      if (this.isAttached(node)) {
        const p = this.N[node * NS + N_PARENT] as number
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
      for (let e = this.N[node * NS + N_FIRST] as number; e !== NIL; e = this.E[e * ES + E_NEXT] as number) {
        if (this.E[e * ES + E_W] === w) return u64FromParts(this.E[e * ES + E_LO] as number, this.E[e * ES + E_HI] as number)
      }
      return null
    }
    const tok = (node: number): bigint => u64FromParts(this.N[node * NS + N_TLO] as number, this.N[node * NS + N_THI] as number)
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
        for (let e = this.N[node * NS + N_FIRST] as number; e !== NIL; e = this.E[e * ES + E_NEXT] as number) {
          const w = this.E[e * ES + E_W] as number
          const missing: number[] = []
          let parentHash: bigint | null = null
          let needAnchor = false
          for (let x = node; ; ) {
            if (x === top) {
              needAnchor = true
              break
            }
            const p = this.N[x * NS + N_PARENT] as number
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
          blocks.push({ block_hash: u64FromParts(this.E[e * ES + E_LO] as number, this.E[e * ES + E_HI] as number), tokens_hash: tok(node) })
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
    const p = newPart(this.liveWorkers, this.liveNodes - 1, this.liveEntries)
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
    const N = this.N
    const E = this.E
    // a node's number in the part, once written; the chain above a node not yet written is
    // walked up to a written (or top) node and written down from there, so parents come first
    const index = new Int32Array(this.nHigh).fill(NIL)
    const stack = new Int32Array(this.nHigh)
    let n = 0
    let e = 0
    for (let node = 1; node < this.nHigh; node++) {
      if (((N[node * NS + N_COUNT] as number) & FREE) !== 0 || index[node] !== NIL) continue
      let sp = 0
      for (let x = node; ; ) {
        if (sp === stack.length) throw new Error('the index holds a cycle of nodes')
        stack[sp++] = x
        if (!this.isAttached(x)) break
        const parent = N[x * NS + N_PARENT] as number
        if (parent === ROOT || index[parent] !== NIL) break
        x = parent
      }
      while (sp > 0) {
        const x = stack[--sp] as number
        const b = x * NS
        const parent = N[b + N_PARENT] as number
        const ref = !this.isAttached(x) ? UP_DETACHED : parent === ROOT ? UP_ROOT : (index[parent] as number) + 1
        p.up[n] = ((N[b + N_COUNT] as number) & MIXED) !== 0 ? (ref | UP_MIXED) >>> 0 : ref
        p.tokLo[n] = N[b + N_TLO] as number
        p.tokHi[n] = N[b + N_THI] as number
        let c = 0
        for (let en = N[b + N_FIRST] as number; en !== NIL; en = E[en * ES + E_NEXT] as number, c++, e++) {
          p.blockLo[e] = E[en * ES + E_LO] as number
          p.blockHi[e] = E[en * ES + E_HI] as number
          p.owner[e] = wIndex[E[en * ES + E_W] as number] as number
        }
        p.count[n] = c
        index[x] = n++
      }
      if ((node & 4095) === 4095 && this.interrupt !== null) this.interrupt()
    }
    if (n !== p.nodes || e !== p.entries) throw new Error(`snapshot: wrote ${n} nodes and ${e} entries of ${p.nodes} and ${p.entries}`)
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
      if (w !== NIL && (this.wSize[w] as number) > 0) held.push(w)
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
    this.reserve(p.nodes, p.entries)
    const nodeSlot = new Int32Array(p.nodes)
    const { count, owner, blockLo, blockHi, up } = p
    let e = 0
    let added = 0
    for (let i = 0; i < p.nodes; i++) {
      const c = count[i] as number
      let slot = NIL
      // last first: entries are prepended to a node's list, so its order comes back as written
      for (let j = e + c - 1; j >= e; j--) {
        const w = slotOf[owner[j] as number] as number
        if (w === NIL) continue
        const lo = (blockLo[j] as number) | 0
        const hi = (blockHi[j] as number) | 0
        // the worker-rank was emptied above: a hash held already is a repeat in the part
        if (this.findEntry(w, lo, hi) !== NIL) continue
        if (this.liveEntries >= this.maxBlocks) {
          this.reject(RejectReason.Capacity, EventKind.Stored)
          continue
        }
        if (slot === NIL) slot = this.placeNode(p, i, nodeSlot)
        this.addEntry(w, slot, lo, hi)
        added++
      }
      if (slot !== NIL && ((up[i] as number) & UP_MIXED) !== 0) this.N[slot * NS + N_COUNT] = (this.N[slot * NS + N_COUNT] as number) | MIXED
      nodeSlot[i] = slot
      e += c
      if ((i & 255) === 255 && this.interrupt !== null) this.interrupt()
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
   * Room for `nodes` more nodes and `entries` more entries at once, so a load copies each array
   * at most once; an empty lookup table is sized for the entries instead of growing through
   * rebuilds.
   */
  private reserve(nodes: number, entries: number): void {
    const nodeCap = Math.min(this.nHigh + nodes, MAX_SLOT + 1)
    if (nodeCap > this.nCap) {
      this.nCap = nodeCap
      this.N = this.grownCopy(this.N, nodeCap * NS)
    }
    const add = Math.min(entries, this.maxBlocks)
    const entryCap = Math.min(this.eHigh + add, MAX_SLOT + 1)
    if (entryCap > this.eCap) {
      this.eCap = entryCap
      this.E = this.grownCopy(this.E, entryCap * ES)
    }
    if (this.liveEntries === 0 && add > this.lookup.live) this.lookup.reset(add)
  }

  // ------------------------------------------------------------------------------------------
  // introspection

  /** Bytes held by the index's typed arrays (what a cap on blocks bounds). */
  get bytes(): number {
    const b = this.N.byteLength + this.E.byteLength + this.children.bytes + this.lookup.bytes + this.wTable.byteLength
    return b + this.wIdLo.length * 17
  }
}
