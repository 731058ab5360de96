// The KV block index one shard owns (spec §3): a radix tree whose edges are local block hashes
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
// Semantics follow spec §3.2–3.4 with these deliberate, documented choices:
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
// - find_matches keeps the reference's O(1) "equal count ⇒ same set" step (spec §3.3 step 4).
import { EventKind, type DecodedEvent } from './event-decoder.js'
import type { RouterEvent, StoredBlock } from './events.js'
import { u64FromParts } from './u64.js'

export const RejectReason = {
  ParentBlockNotFound: 0,
  BlockNotFound: 1,
  InvalidBlock: 2,
  Capacity: 3,
  TooManyWorkers: 4,
  NonDeviceTier: 5,
} as const
export type RejectReason = (typeof RejectReason)[keyof typeof RejectReason]
/** Metric label values, indexed by RejectReason (spec §3.2 status names first). */
export const REJECT_REASON_NAMES = ['parent_block_not_found', 'block_not_found', 'invalid_block', 'capacity', 'too_many_workers', 'non_device_tier'] as const
export const REJECT_REASON_COUNT = REJECT_REASON_NAMES.length

/** Result of applying one event: 0 when every part applied, else 1 + the first RejectReason. */
export const APPLY_OK = 0

export interface KvIndexOptions {
  /** Cap on held (block, worker-rank) entries; stores beyond it are rejected as `capacity`. */
  maxBlocks?: number
  /** Initial entry capacity; arrays grow by half as needed. */
  initialBlocks?: number
}

export interface OverlapScore {
  worker_id: bigint
  dp_rank: number
  overlap_blocks: number
  tree_size: number
}

export const MAX_WORKER_RANKS = 0xfffe
const NO_WORKER = 0xffff
const NIL = -1
const ROOT = 0

function mix3(a: number, b: number, c: number): number {
  let h = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h ^ b, 0xc2b2ae35)
  h ^= h >>> 16
  h = Math.imul(h ^ c, 0x27d4eb2f)
  h ^= h >>> 15
  return h
}

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
function growU16(a: Uint16Array, n: number, fill: number): Uint16Array<ArrayBuffer> {
  const b = new Uint16Array(n)
  b.set(a)
  b.fill(fill, a.length)
  return b
}

export class KvIndex {
  readonly maxBlocks: number

  // --- counters (read by the shard and published to shared memory) ---
  /** Events fully applied, by kind: [stored, removed, cleared]. */
  readonly appliedByKind = new Float64Array(4)
  /** Rejections by RejectReason (a batched remove counts each missing hash). */
  readonly rejectedByReason = new Float64Array(REJECT_REASON_COUNT)
  liveEntries = 0
  liveNodes = 1
  liveWorkers = 0

  // --- worker-ranks ---
  private wIdLo = new Uint32Array(16)
  private wIdHi = new Uint32Array(16)
  private wRank = new Uint32Array(16)
  /** Entries held per worker-rank: the tree size of spec §3.3 step 6. */
  private wSize = new Uint32Array(16)
  private wLive = new Uint8Array(16)
  private wTable = new Int32Array(32).fill(NIL)
  private wHigh = 0
  private wFree: number[] = []

  // --- nodes ---
  private nParent: Int32Array
  private nParentGen: Uint32Array
  private nGen: Uint32Array
  private nTokLo: Uint32Array
  private nTokHi: Uint32Array
  private nCount: Uint16Array
  private nFirst: Int32Array
  private nChain: Int32Array
  private nHigh = 1
  private nFreeHead = NIL
  private childBuckets: Int32Array
  private childMask: number

  // --- entries ---
  private eWorker: Uint16Array
  private eNode: Int32Array
  private eBhLo: Uint32Array
  private eBhHi: Uint32Array
  private eChain: Int32Array
  private eNext: Int32Array
  private eHigh = 0
  private eFreeHead = NIL
  private lookupBuckets: Int32Array
  private lookupMask: number

  // --- query scratch ---
  private seen = new Uint32Array(16)
  private mark = new Uint32Array(16)
  private depthOf = new Uint32Array(16)
  private stamp = 0
  private markStamp = 0
  /** Worker-rank slots matched by the last findMatches, in discovery order. */
  matchWorkers = new Int32Array(16)
  matchCount = 0

  constructor(options: KvIndexOptions = {}) {
    this.maxBlocks = options.maxBlocks ?? Number.MAX_SAFE_INTEGER
    const cap = Math.max(16, Math.min(options.initialBlocks ?? 1024, this.maxBlocks + 1))
    this.nParent = new Int32Array(cap).fill(NIL)
    this.nParentGen = new Uint32Array(cap)
    this.nGen = new Uint32Array(cap)
    this.nTokLo = new Uint32Array(cap)
    this.nTokHi = new Uint32Array(cap)
    this.nCount = new Uint16Array(cap)
    this.nFirst = new Int32Array(cap).fill(NIL)
    this.nChain = new Int32Array(cap).fill(NIL)
    this.eWorker = new Uint16Array(cap).fill(NO_WORKER)
    this.eNode = new Int32Array(cap).fill(NIL)
    this.eBhLo = new Uint32Array(cap)
    this.eBhHi = new Uint32Array(cap)
    this.eChain = new Int32Array(cap).fill(NIL)
    this.eNext = new Int32Array(cap).fill(NIL)
    let b = 16
    while (b * 2 < cap) b *= 2
    this.childBuckets = new Int32Array(b).fill(NIL)
    this.childMask = b - 1
    this.lookupBuckets = new Int32Array(b).fill(NIL)
    this.lookupMask = b - 1
    // The root holds every worker implicitly and is never freed.
    this.nCount[ROOT] = 0
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
    let w: number
    if (this.wFree.length > 0) w = this.wFree.pop() as number
    else {
      if (this.wHigh >= MAX_WORKER_RANKS) return NIL
      w = this.wHigh++
      if (w >= this.wIdLo.length) this.growWorkers(this.wIdLo.length * 2)
    }
    this.wIdLo[w] = idLo
    this.wIdHi[w] = idHi
    this.wRank[w] = rank
    this.wSize[w] = 0
    this.wLive[w] = 1
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
    this.seen = growU32(this.seen, n)
    this.mark = growU32(this.mark, n)
    this.depthOf = growU32(this.depthOf, n)
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
  /** Number of blocks the worker-rank holds (spec §3.3 tree size). */
  treeSize(w: number): number {
    return this.wSize[w] as number
  }
  isWorkerLive(w: number): boolean {
    return this.wLive[w] === 1
  }
  /** Upper bound of worker slots, for iteration with isWorkerLive. */
  get workerSlots(): number {
    return this.wHigh
  }

  // ------------------------------------------------------------------------------------------
  // events

  /**
   * Applies one decoded event for worker-rank (ev.worker, ev.dpRank). Returns APPLY_OK or
   * 1 + the RejectReason of the first failure; every failure is also counted.
   */
  apply(ev: DecodedEvent): number {
    const w = this.ensureWorker(ev.workerLo, ev.workerHi, ev.dpRank)
    if (w === NIL) return this.reject(RejectReason.TooManyWorkers)
    if (ev.tier !== 0) return this.reject(RejectReason.NonDeviceTier)
    if (ev.kind === EventKind.Stored) return this.applyStored(w, ev)
    if (ev.kind === EventKind.Removed) return this.applyRemoved(w, ev)
    this.clearWorker(ev.workerLo, ev.workerHi, false)
    this.appliedByKind[EventKind.Cleared] = (this.appliedByKind[EventKind.Cleared] as number) + 1
    return APPLY_OK
  }

  private reject(reason: RejectReason): number {
    this.rejectedByReason[reason] = (this.rejectedByReason[reason] as number) + 1
    return reason + 1
  }

  private applyStored(w: number, ev: DecodedEvent): number {
    let cur = ROOT
    if (ev.hasParent) {
      const pe = this.findEntry(w, ev.parentLo, ev.parentHi)
      if (pe === NIL) return this.reject(RejectReason.ParentBlockNotFound)
      cur = this.eNode[pe] as number
    }
    const n = ev.count
    for (let i = 0; i < n; i++) {
      const tokLo = ev.tokensLo[i] as number
      const tokHi = ev.tokensHi[i] as number
      const bhLo = ev.blockLo[i] as number
      const bhHi = ev.blockHi[i] as number
      const e = this.findEntry(w, bhLo, bhHi)
      // A hash the worker already holds at cur or above it would make the chain a cycle.
      if (e !== NIL && this.isAncestorOrSelf(this.eNode[e] as number, cur)) return this.reject(RejectReason.InvalidBlock)
      let node = this.findChild(cur, tokLo, tokHi)
      if (node === NIL) {
        if (e !== NIL && !this.isAttached(this.eNode[e] as number)) {
          node = this.eNode[e] as number
          this.relink(node, cur, tokLo, tokHi)
        } else {
          node = this.newNode(cur, tokLo, tokHi)
        }
      }
      if (e !== NIL) {
        if (this.eNode[e] === node) {
          cur = node
          continue
        }
        // The worker's hash named a node elsewhere in the tree: it now names this one.
        this.removeEntry(e)
      } else if (this.liveEntries >= this.maxBlocks) {
        if (this.nCount[node] === 0) this.freeNode(node)
        return this.reject(RejectReason.Capacity)
      }
      this.addEntry(w, node, bhLo, bhHi)
      cur = node
    }
    this.appliedByKind[EventKind.Stored] = (this.appliedByKind[EventKind.Stored] as number) + 1
    return APPLY_OK
  }

  private applyRemoved(w: number, ev: DecodedEvent): number {
    let first = APPLY_OK
    for (let i = 0; i < ev.count; i++) {
      const e = this.findEntry(w, ev.blockLo[i] as number, ev.blockHi[i] as number)
      if (e === NIL) {
        const r = this.reject(RejectReason.BlockNotFound)
        if (first === APPLY_OK) first = r
        continue
      }
      this.removeEntry(e)
    }
    if (first === APPLY_OK) this.appliedByKind[EventKind.Removed] = (this.appliedByKind[EventKind.Removed] as number) + 1
    return first
  }

  /**
   * Drops every block of every rank of a worker (spec §3.2 Cleared). With `forget`, the worker's
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
      const ew = this.eWorker[e] as number
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

  // ------------------------------------------------------------------------------------------
  // queries

  /**
   * Longest cached contiguous prefix, in blocks, per worker-rank (spec §3.3). The matched slots
   * land in `matchWorkers[0..return)`, their depths in `depth(slot)`, sizes in `treeSize(slot)`.
   */
  findMatches(lo: Uint32Array, hi: Uint32Array, n: number, earlyExit = false): number {
    this.matchCount = 0
    if (n === 0) return 0
    let cur = this.findChild(ROOT, lo[0] as number, hi[0] as number)
    if (cur === NIL) return 0
    const stamp = this.nextStamp()
    let activeNode = cur
    let activeCount = this.nCount[cur] as number
    let depth = 1
    if (!(earlyExit && activeCount === 1)) {
      for (let i = 1; i < n; i++) {
        const child = this.findChild(cur, lo[i] as number, hi[i] as number)
        if (child === NIL) break
        const cc = this.nCount[child] as number
        if (cc < activeCount) {
          // Workers of the active set missing from the child stop at depth i.
          const m = this.nextMarkStamp()
          for (let e = this.nFirst[child] as number; e !== NIL; e = this.eNext[e] as number) this.mark[this.eWorker[e] as number] = m
          for (let e = this.nFirst[activeNode] as number; e !== NIL; e = this.eNext[e] as number) {
            const w = this.eWorker[e] as number
            if (this.mark[w] !== m) this.score(w, i, stamp)
          }
          activeNode = child
          activeCount = cc
        }
        cur = child
        depth = i + 1
        if (earlyExit && activeCount === 1) break
      }
    }
    for (let e = this.nFirst[activeNode] as number; e !== NIL; e = this.eNext[e] as number) this.score(this.eWorker[e] as number, depth, stamp)
    return this.matchCount
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
      out.push({ worker_id: u64FromParts(this.wIdLo[w] as number, this.wIdHi[w] as number), dp_rank: this.wRank[w] as number, overlap_blocks: this.depthOf[w] as number, tree_size: this.wSize[w] as number })
    }
    return out
  }

  /** Tree sizes of every registered worker-rank. */
  treeSizes(): OverlapScore[] {
    const out: OverlapScore[] = []
    for (let w = 0; w < this.wHigh; w++) {
      if (this.wLive[w] !== 1) continue
      out.push({ worker_id: u64FromParts(this.wIdLo[w] as number, this.wIdHi[w] as number), dp_rank: this.wRank[w] as number, overlap_blocks: 0, tree_size: this.wSize[w] as number })
    }
    return out
  }

  /** Depth of a slot matched by the last findMatches. */
  depth(w: number): number {
    return this.depthOf[w] as number
  }

  private score(w: number, depth: number, stamp: number): void {
    if (this.seen[w] !== stamp) {
      this.seen[w] = stamp
      this.matchWorkers[this.matchCount++] = w
    }
    this.depthOf[w] = depth
  }

  private nextStamp(): number {
    this.stamp = (this.stamp + 1) >>> 0
    if (this.stamp === 0) {
      this.seen.fill(0)
      this.stamp = 1
    }
    return this.stamp
  }

  private nextMarkStamp(): number {
    this.markStamp = (this.markStamp + 1) >>> 0
    if (this.markStamp === 0) {
      this.mark.fill(0)
      this.markStamp = 1
    }
    return this.markStamp
  }

  // ------------------------------------------------------------------------------------------
  // children

  private childBucket(parent: number, lo: number, hi: number): number {
    return mix3(parent, lo, hi) & this.childMask
  }

  private isAttached(node: number): boolean {
    const p = this.nParent[node] as number
    return p !== NIL && this.nGen[p] === this.nParentGen[node]
  }

  private findChild(parent: number, lo: number, hi: number): number {
    const gen = this.nGen[parent] as number
    for (let c = this.childBuckets[this.childBucket(parent, lo, hi)] as number; c !== NIL; c = this.nChain[c] as number) {
      if (this.nTokLo[c] === lo && this.nTokHi[c] === hi && this.nParent[c] === parent && this.nParentGen[c] === gen) return c
    }
    return NIL
  }

  /** True when `node` is `of` or one of its ancestors (following parents while attached). */
  private isAncestorOrSelf(node: number, of: number): boolean {
    let x = of
    for (let steps = 0; x !== NIL && x !== ROOT; steps++) {
      if (x === node) return true
      if (!this.isAttached(x) || steps > this.nHigh) return false
      x = this.nParent[x] as number
    }
    return false
  }

  private unchainChild(node: number): void {
    const b = this.childBucket(this.nParent[node] as number, this.nTokLo[node] as number, this.nTokHi[node] as number)
    let c = this.childBuckets[b] as number
    if (c === node) {
      this.childBuckets[b] = this.nChain[node] as number
      return
    }
    while (c !== NIL) {
      const next = this.nChain[c] as number
      if (next === node) {
        this.nChain[c] = this.nChain[node] as number
        return
      }
      c = next
    }
  }

  private chainChild(node: number): void {
    const b = this.childBucket(this.nParent[node] as number, this.nTokLo[node] as number, this.nTokHi[node] as number)
    this.nChain[node] = this.childBuckets[b] as number
    this.childBuckets[b] = node
  }

  private relink(node: number, parent: number, lo: number, hi: number): void {
    this.unchainChild(node)
    this.nParent[node] = parent
    this.nParentGen[node] = this.nGen[parent] as number
    this.nTokLo[node] = lo
    this.nTokHi[node] = hi
    this.chainChild(node)
  }

  private newNode(parent: number, lo: number, hi: number): number {
    let node = this.nFreeHead
    if (node !== NIL) this.nFreeHead = this.nChain[node] as number
    else {
      node = this.nHigh++
      if (node >= this.nParent.length) this.growNodes()
    }
    this.nParent[node] = parent
    this.nParentGen[node] = this.nGen[parent] as number
    this.nTokLo[node] = lo
    this.nTokHi[node] = hi
    this.nCount[node] = 0
    this.nFirst[node] = NIL
    this.liveNodes++
    this.chainChild(node)
    if (this.liveNodes > this.childBuckets.length * 2) this.rehashChildren(this.childBuckets.length * 2)
    return node
  }

  private freeNode(node: number): void {
    this.unchainChild(node)
    // Bumping the generation detaches every child at once (spec: clear node.children).
    this.nGen[node] = ((this.nGen[node] as number) + 1) >>> 0
    this.nParent[node] = NIL
    this.nChain[node] = this.nFreeHead
    this.nFreeHead = node
    this.liveNodes--
  }

  private growNodes(): void {
    const n = Math.ceil(this.nParent.length * 1.5)
    this.nParent = growI32(this.nParent, n, NIL)
    this.nParentGen = growU32(this.nParentGen, n)
    this.nGen = growU32(this.nGen, n)
    this.nTokLo = growU32(this.nTokLo, n)
    this.nTokHi = growU32(this.nTokHi, n)
    this.nCount = growU16(this.nCount, n, 0)
    this.nFirst = growI32(this.nFirst, n, NIL)
    this.nChain = growI32(this.nChain, n, NIL)
  }

  private rehashChildren(size: number): void {
    this.childBuckets = new Int32Array(size).fill(NIL)
    this.childMask = size - 1
    for (let node = 1; node < this.nHigh; node++) {
      if (this.nParent[node] !== NIL) this.chainChild(node)
    }
  }

  // ------------------------------------------------------------------------------------------
  // entries

  private lookupBucket(w: number, lo: number, hi: number): number {
    return mix3(w, lo, hi) & this.lookupMask
  }

  private findEntry(w: number, lo: number, hi: number): number {
    for (let e = this.lookupBuckets[this.lookupBucket(w, lo, hi)] as number; e !== NIL; e = this.eChain[e] as number) {
      if (this.eBhLo[e] === lo && this.eBhHi[e] === hi && this.eWorker[e] === w) return e
    }
    return NIL
  }

  private addEntry(w: number, node: number, lo: number, hi: number): void {
    let e = this.eFreeHead
    if (e !== NIL) this.eFreeHead = this.eChain[e] as number
    else {
      e = this.eHigh++
      if (e >= this.eWorker.length) this.growEntries()
    }
    this.eWorker[e] = w
    this.eNode[e] = node
    this.eBhLo[e] = lo
    this.eBhHi[e] = hi
    if (!this.nodeHasWorker(node, w)) this.nCount[node] = (this.nCount[node] as number) + 1
    this.eNext[e] = this.nFirst[node] as number
    this.nFirst[node] = e
    this.liveEntries++
    this.wSize[w] = (this.wSize[w] as number) + 1
    if (this.liveEntries > this.lookupBuckets.length * 2) this.rehashLookup(this.lookupBuckets.length * 2)
    else {
      const b = this.lookupBucket(w, lo, hi)
      this.eChain[e] = this.lookupBuckets[b] as number
      this.lookupBuckets[b] = e
    }
  }

  private nodeHasWorker(node: number, w: number): boolean {
    for (let e = this.nFirst[node] as number; e !== NIL; e = this.eNext[e] as number) if (this.eWorker[e] === w) return true
    return false
  }

  /** Drops one entry; frees its node when it was the node's last worker. */
  private removeEntry(e: number): void {
    const w = this.eWorker[e] as number
    const node = this.eNode[e] as number
    // unlink from the node's entry list, noting whether the worker stays through another hash
    let prev = NIL
    let still = false
    for (let x = this.nFirst[node] as number; x !== NIL; x = this.eNext[x] as number) {
      if (x === e) {
        if (prev === NIL) this.nFirst[node] = this.eNext[e] as number
        else this.eNext[prev] = this.eNext[e] as number
        continue
      }
      if (this.eWorker[x] === w) still = true
      prev = x
    }
    if (!still) this.nCount[node] = (this.nCount[node] as number) - 1
    // unlink from the lookup chain
    const b = this.lookupBucket(w, this.eBhLo[e] as number, this.eBhHi[e] as number)
    let c = this.lookupBuckets[b] as number
    if (c === e) this.lookupBuckets[b] = this.eChain[e] as number
    else {
      while (c !== NIL) {
        const next = this.eChain[c] as number
        if (next === e) {
          this.eChain[c] = this.eChain[e] as number
          break
        }
        c = next
      }
    }
    this.eWorker[e] = NO_WORKER
    this.eNode[e] = NIL
    this.eNext[e] = NIL
    this.eChain[e] = this.eFreeHead
    this.eFreeHead = e
    this.liveEntries--
    this.wSize[w] = (this.wSize[w] as number) - 1
    if (this.nCount[node] === 0) this.freeNode(node)
  }

  private growEntries(): void {
    const n = Math.ceil(this.eWorker.length * 1.5)
    this.eWorker = growU16(this.eWorker, n, NO_WORKER)
    this.eNode = growI32(this.eNode, n, NIL)
    this.eBhLo = growU32(this.eBhLo, n)
    this.eBhHi = growU32(this.eBhHi, n)
    this.eChain = growI32(this.eChain, n, NIL)
    this.eNext = growI32(this.eNext, n, NIL)
  }

  private rehashLookup(size: number): void {
    this.lookupBuckets = new Int32Array(size).fill(NIL)
    this.lookupMask = size - 1
    for (let e = 0; e < this.eHigh; e++) {
      const w = this.eWorker[e] as number
      if (w === NO_WORKER) continue
      const b = this.lookupBucket(w, this.eBhLo[e] as number, this.eBhHi[e] as number)
      this.eChain[e] = this.lookupBuckets[b] as number
      this.lookupBuckets[b] = e
    }
  }

  // ------------------------------------------------------------------------------------------
  // dump

  /**
   * The whole index as events that rebuild it in an empty index (spec §3.4): parents before
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
      if (this.nParent[node] === NIL) continue
      if (this.isAttached(node)) {
        const p = this.nParent[node] as number
        const list = children.get(p)
        if (list === undefined) children.set(p, [node])
        else list.push(node)
      } else detachedTops.push(node)
    }
    let eventId = 0n
    const push = (w: number, data: RouterEvent['event']['data']): void => {
      events.push({ worker_id: u64FromParts(this.wIdLo[w] as number, this.wIdHi[w] as number), event: { event_id: eventId++, data, dp_rank: this.wRank[w] as number } })
    }
    let synthCounter = 0
    const synth = (w: number): bigint => {
      for (;;) {
        synthCounter++
        if (this.findEntry(w, synthCounter, 0xfffffffe) === NIL) return u64FromParts(synthCounter, 0xfffffffe)
      }
    }
    const heldBh = (w: number, node: number): bigint | null => {
      for (let e = this.nFirst[node] as number; e !== NIL; e = this.eNext[e] as number) {
        if (this.eWorker[e] === w) return u64FromParts(this.eBhLo[e] as number, this.eBhHi[e] as number)
      }
      return null
    }
    const tok = (node: number): bigint => u64FromParts(this.nTokLo[node] as number, this.nTokHi[node] as number)
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
        for (let e = this.nFirst[node] as number; e !== NIL; e = this.eNext[e] as number) {
          const w = this.eWorker[e] as number
          const missing: number[] = []
          let parentHash: bigint | null = null
          let needAnchor = false
          for (let x = node; ; ) {
            if (x === top) {
              needAnchor = true
              break
            }
            const p = this.nParent[x] as number
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
          blocks.push({ block_hash: u64FromParts(this.eBhLo[e] as number, this.eBhHi[e] as number), tokens_hash: tok(node) })
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
  // introspection

  /** Bytes held by the index's typed arrays (what a cap on blocks bounds). */
  get bytes(): number {
    let b = 0
    for (const a of [this.nParent, this.nParentGen, this.nGen, this.nTokLo, this.nTokHi, this.nCount, this.nFirst, this.nChain, this.childBuckets, this.eWorker, this.eNode, this.eBhLo, this.eBhHi, this.eChain, this.eNext, this.lookupBuckets, this.wTable]) b += a.byteLength
    return b + this.wIdLo.length * 17
  }
}
