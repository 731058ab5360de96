// Approximate mode (--no-router-kv-events): with no KV events from the workers, the
// router predicts their caches from its own decisions. Every decision stores the request's
// complete blocks on the chosen worker-rank with a TTL; routing the same prefix there again
// refreshes it; expiry removes it; above a size cap the entries closest to expiry go first,
// deepest blocks first among equal expiries (leaves before their parents).
//
// The index itself is not touched here: predicted blocks leave as synthetic Stored / Removed
// events through an ApproxSink, so the same sharded index serves both modes. Entries are keyed
// by (sequence hash, slot); the lazy min-heap holds (expiry, entry, stamp) nodes and skips
// nodes whose entry was refreshed or removed since (the stamp changed).
import { BinaryHeap } from './binary-heap.js'
import { growTo } from './typed-arrays.js'
import { U64SlotMap } from './u64-slot-map.js'
import type { WorkerRanks } from './worker-ranks.js'

/**
 * Receives the synthetic events. Arrays are only valid during the call (the tracker and the
 * caller reuse them): copy what you keep. stored() = Stored{parent_hash: null, blocks:
 * [{tokens_hash: local[i], block_hash: seq[i]}]}; removed() = Removed{block_hashes: seq[..n]}.
 */
export interface ApproxSink {
  stored(workerId: bigint, dpRank: number, localLo: Uint32Array, localHi: Uint32Array, seqLo: Uint32Array, seqHi: Uint32Array, n: number): void
  removed(workerId: bigint, dpRank: number, seqLo: Uint32Array, seqHi: Uint32Array, n: number): void
}

export interface ApproxTrackerOptions {
  ttlMs: number
  maxTreeSize: number
  pruneTargetRatio: number
}

/** The heap is rebuilt from live entries once stale nodes outnumber them this many times. */
const REBUILD_FACTOR = 50
const REBUILD_MIN = 4096

export class ApproxTracker {
  /** Removals emitted because of TTL expiry / size pruning (metrics). */
  expiredTotal = 0
  prunedTotal = 0

  private readonly entries = new U64SlotMap(1024)
  private expiry = new Float64Array(1024)
  private position = new Int32Array(1024)
  private stamp = new Int32Array(1024)

  // Heap of node ids. Order: earlier expiry first (primary key); then deeper position (secondary
  // key, negated); then sequence hash (hi, lo); then slot. Nodes hold a copy of all of it, so
  // that reusing an entry index can never reorder nodes already in the heap. Not indexed: stale
  // nodes are skipped when they surface, never removed from the middle.
  private readonly heap = new BinaryHeap<ApproxTracker>({ capacity: 1024, indexed: false, tie: ApproxTracker.tieBreak, owner: this })
  private nLo = new Uint32Array(1024)
  private nHi = new Uint32Array(1024)
  private nSlot = new Int32Array(1024)
  private nEntry = new Int32Array(1024)
  private nStamp = new Int32Array(1024)
  private nodeFree: number[] = []
  private nodeTop = 0

  // removal batch, grouped by slot before it goes to the sink
  private rLo = new Uint32Array(256)
  private rHi = new Uint32Array(256)
  private rSlot = new Int32Array(256)
  private rN = 0
  private outLo = new Uint32Array(256)
  private outHi = new Uint32Array(256)

  constructor(
    private readonly workers: WorkerRanks,
    private readonly sink: ApproxSink,
    private readonly opts: ApproxTrackerOptions,
  ) {
    this.entries.onGrow = (cap) => {
      this.expiry = growTo(this.expiry, cap)
      this.position = growTo(this.position, cap)
      this.stamp = growTo(this.stamp, cap)
    }
  }

  /** Predicted (block, worker-rank) pairs held: Σ over ranks of the blocks recorded for them. */
  get size(): number {
    return this.entries.size
  }

  /** Heap nodes, live and stale (tests check the rebuild). */
  get heapSize(): number {
    return this.heap.size
  }

  /** Records a routing decision: the n complete blocks now live on `slot` until now + TTL. */
  record(slot: number, localLo: Uint32Array, localHi: Uint32Array, seqLo: Uint32Array, seqHi: Uint32Array, n: number, now: number): void {
    this.expire(now)
    if (n <= 0) return
    const exp = now + this.opts.ttlMs
    const entries = this.entries
    for (let i = 0; i < n; i++) {
      const lo = seqLo[i] as number
      const hi = seqHi[i] as number
      let e = entries.find(lo, hi, slot)
      if (e < 0) e = entries.insert(lo, hi, slot)
      this.expiry[e] = exp
      this.position[e] = i
      this.stamp[e] = ((this.stamp[e] as number) + 1) | 0
      this.pushNode(e)
    }
    this.sink.stored(this.workers.workerIdOf(slot), this.workers.dpRankOf(slot), localLo, localHi, seqLo, seqHi, n)
    if (entries.size > this.opts.maxTreeSize) this.prune()
    const heapN = this.heap.size
    if (heapN > REBUILD_MIN && heapN > REBUILD_FACTOR * entries.size) this.rebuild()
  }

  /**
   * How many of the prompt's leading blocks are predicted on `slot` and not expired at `now`
   * (the predict-on-route side index: its walk stops at the first block not there).
   */
  prefixDepth(slot: number, seqLo: Uint32Array, seqHi: Uint32Array, n: number, now: number): number {
    const entries = this.entries
    let i = 0
    for (; i < n; i++) {
      const e = entries.find(seqLo[i] as number, seqHi[i] as number, slot)
      if (e < 0 || (this.expiry[e] as number) <= now) break
    }
    return i
  }

  /** Removes every entry whose expiry is ≤ now; returns how many. */
  expire(now: number): number {
    let n = 0
    while (this.heap.size > 0) {
      const node = this.heap.peek()
      if (this.isStale(node)) {
        this.popNode()
        continue
      }
      if (this.heap.primaryOf(node) > now) break
      this.popNode()
      this.take(node)
      n++
    }
    this.expiredTotal += n
    this.flush()
    return n
  }

  /** Earliest pending expiry (ms on the caller's clock), Infinity when empty. */
  nextExpiry(): number {
    while (this.heap.size > 0) {
      const node = this.heap.peek()
      if (!this.isStale(node)) return this.heap.primaryOf(node)
      this.popNode()
    }
    return Infinity
  }

  /** Forgets a worker-rank's entries without events (the index drops the worker itself). */
  removeSlot(slot: number): number {
    const entries = this.entries
    let n = 0
    for (let e = 0; e < entries.highWater; e++) {
      if (entries.slot[e] === slot) {
        this.stamp[e] = ((this.stamp[e] as number) + 1) | 0
        entries.delete(e)
        n++
      }
    }
    return n
  }

  /** Size pruning: pop in heap order until floor(max × ratio) entries remain. */
  private prune(): void {
    const target = Math.floor(this.opts.maxTreeSize * this.opts.pruneTargetRatio)
    let n = 0
    while (this.entries.size > target && this.heap.size > 0) {
      const node = this.popNode()
      if (this.isStale(node)) continue
      this.take(node)
      n++
    }
    this.prunedTotal += n
    this.flush()
  }

  private isStale(node: number): boolean {
    const e = this.nEntry[node] as number
    return this.stamp[e] !== this.nStamp[node] || this.entries.slot[e] !== this.nSlot[node]
  }

  /** Deletes a node's entry and queues its Removed. The node must already be out of the heap. */
  private take(node: number): void {
    const e = this.nEntry[node] as number
    this.stamp[e] = ((this.stamp[e] as number) + 1) | 0
    this.entries.delete(e)
    if (this.rN === this.rLo.length) {
      this.rLo = growTo(this.rLo, this.rN * 2)
      this.rHi = growTo(this.rHi, this.rN * 2)
      this.rSlot = growTo(this.rSlot, this.rN * 2)
    }
    this.rLo[this.rN] = this.nLo[node] as number
    this.rHi[this.rN] = this.nHi[node] as number
    this.rSlot[this.rN] = this.nSlot[node] as number
    this.rN++
  }

  /** Emits the queued removals, one Removed per worker-rank, in heap order within each. */
  private flush(): void {
    const total = this.rN
    if (total === 0) return
    if (this.outLo.length < total) {
      this.outLo = new Uint32Array(total)
      this.outHi = new Uint32Array(total)
    }
    const done = this.rSlot
    for (let i = 0; i < total; i++) {
      const slot = done[i] as number
      if (slot < 0) continue
      let k = 0
      for (let j = i; j < total; j++) {
        if (done[j] === slot) {
          this.outLo[k] = this.rLo[j] as number
          this.outHi[k] = this.rHi[j] as number
          k++
          done[j] = -1
        }
      }
      // The worker-rank may have been removed meanwhile; its blocks went with it.
      if (this.workers.isLive(slot)) this.sink.removed(this.workers.workerIdOf(slot), this.workers.dpRankOf(slot), this.outLo, this.outHi, k)
    }
    this.rN = 0
  }

  // ---- heap of nodes ----

  private pushNode(e: number): void {
    this.heap.push(this.newNode(e), this.expiry[e] as number, -(this.position[e] as number))
  }

  /** A node id for entry e, with a copy of e's hash, slot and stamp. */
  private newNode(e: number): number {
    let node = this.nodeFree.pop()
    if (node === undefined) {
      node = this.nodeTop++
      if (node >= this.nLo.length) this.growNodes(node + 1)
    }
    this.nLo[node] = this.entries.lo[e] as number
    this.nHi[node] = this.entries.hi[e] as number
    this.nSlot[node] = this.entries.slot[e] as number
    this.nEntry[node] = e
    this.nStamp[node] = this.stamp[e] as number
    return node
  }

  /**
   * Pops the top node, returns it and recycles its id at once: its fields stay readable until the
   * next pushNode(), and every caller reads them (isStale, take) before pushing again.
   */
  private popNode(): number {
    const top = this.heap.pop()
    this.nodeFree.push(top)
    return top
  }

  /** Order among nodes of equal expiry and position: sequence hash (hi, lo), then slot. */
  private static tieBreak(t: ApproxTracker, a: number, b: number): boolean {
    const ha = t.nHi[a] as number
    const hb = t.nHi[b] as number
    if (ha !== hb) return ha < hb
    const la = t.nLo[a] as number
    const lb = t.nLo[b] as number
    if (la !== lb) return la < lb
    return (t.nSlot[a] as number) < (t.nSlot[b] as number)
  }

  private rebuild(): void {
    this.heap.clear()
    this.nodeFree.length = 0
    this.nodeTop = 0
    const entries = this.entries
    for (let e = 0; e < entries.highWater; e++) {
      if (entries.slot[e] === -1) continue
      this.heap.append(this.newNode(e), this.expiry[e] as number, -(this.position[e] as number))
    }
    this.heap.heapify()
  }

  private growNodes(n: number): void {
    const cap = Math.max(n, this.nLo.length * 2)
    this.nLo = growTo(this.nLo, cap)
    this.nHi = growTo(this.nHi, cap)
    this.nSlot = growTo(this.nSlot, cap)
    this.nEntry = growTo(this.nEntry, cap)
    this.nStamp = growTo(this.nStamp, cap)
  }
}

/** A sink for a tracker whose predictions stay in the scheduler (predict-on-route). */
export const NO_SINK: ApproxSink = {
  stored() {},
  removed() {},
}
