// The index's lower storage tiers (host_pinned, disk, external), beside its device radix tree and
// touched only once some worker-rank has a block in one of them. Each tier is a continuation
// index, as Dynamo's lower-tier indexer is (lib/kv-router/src/indexer/lower_tier.rs and
// lower_tier_indexers.rs @1783f723): a worker-rank's block there is an edge
// (parent block_hash or none, tokens_hash) → block_hash, separate from any device copy of the
// same block. A query extends each worker-rank's device match block by block through the host
// tier from its last device block, then through disk, then external (tiers it holds nothing in
// are skipped), so the host and disk overlaps are cumulative through the tiers before them.
//
// Records are 8-word structs in one Int32Array; three SlotTables find them by
// (worker-rank, tier, block_hash), by (worker-rank, tier, parent, tokens_hash) and, for blocks
// without a parent, by (tier, tokens_hash): the workers a lower-tier match may start at the root.
import { mix3 } from '../codec/hash-mix.js'
import { SlotTable } from './slot-table.js'

/** Lower tiers by index: StorageTier − 1. */
export const LOWER_TIERS = 3
const LS = 8
/** Worker-rank slot (bits 0–15), tier (16–17), HAS_PARENT; −1 when free. */
const L_WT = 0
const L_PLO = 1
const L_PHI = 2
const L_TLO = 3
const L_THI = 4
const L_BLO = 5
const L_BHI = 6
const HAS_PARENT = 1 << 20
const NIL = -1

/** One record as the dump and the snapshot carry it. */
export interface LowerBlock {
  w: number
  tier: number
  hasParent: boolean
  parentLo: number
  parentHi: number
  tokLo: number
  tokHi: number
  blockLo: number
  blockHi: number
}

export class LowerTiers {
  private R = new Int32Array(64 * LS)
  private high = 0
  private free: number[] = []
  private byBlock = new SlotTable()
  private byEdge = new SlotTable()
  private roots = new SlotTable()
  /** Blocks per (worker-rank, tier): [w × LOWER_TIERS + tier]. */
  private counts = new Uint32Array(16 * LOWER_TIERS)
  /** Blocks per worker-rank, any lower tier. */
  private perWorker = new Uint32Array(16)
  /** Blocks per tier. */
  readonly perTier = new Float64Array(LOWER_TIERS)
  live = 0

  /** Blocks the worker-rank holds in lower tiers. */
  blocksOf(w: number): number {
    return w < this.perWorker.length ? (this.perWorker[w] as number) : 0
  }

  private wt(w: number, tier: number): number {
    return w | (tier << 16)
  }

  private blockKey(wt: number, lo: number, hi: number): number {
    return mix3(wt, lo, hi)
  }
  private edgeKey(wt: number, hasParent: boolean, plo: number, phi: number, tlo: number, thi: number): number {
    return mix3(mix3(wt ^ (hasParent ? HAS_PARENT : 0), plo, phi), tlo, thi)
  }
  private rootKey(tier: number, tlo: number, thi: number): number {
    return mix3(0x5bd1e995 ^ tier, tlo, thi)
  }

  /** The record of (worker-rank, tier, block_hash), or −1. */
  find(w: number, tier: number, lo: number, hi: number): number {
    lo |= 0
    hi |= 0
    const wt = this.wt(w, tier)
    const R = this.R
    for (let r = this.byBlock.first(this.blockKey(wt, lo, hi)); r !== NIL; r = this.byBlock.next()) {
      const b = r * LS
      if (R[b + L_BLO] === lo && R[b + L_BHI] === hi && ((R[b + L_WT] as number) & 0x3ffff) === wt) return r
    }
    return NIL
  }

  /** The record continuing (parent) with tokens_hash for the worker-rank in a tier, or −1. */
  private edge(wt: number, hasParent: boolean, plo: number, phi: number, tlo: number, thi: number): number {
    const R = this.R
    const want = hasParent ? wt | HAS_PARENT : wt
    for (let r = this.byEdge.first(this.edgeKey(wt, hasParent, plo, phi, tlo, thi)); r !== NIL; r = this.byEdge.next()) {
      const b = r * LS
      if (R[b + L_WT] === want && R[b + L_TLO] === tlo && R[b + L_THI] === thi && (!hasParent || (R[b + L_PLO] === plo && R[b + L_PHI] === phi))) return r
    }
    return NIL
  }

  /**
   * Stores one block. A block hash the worker-rank already holds in the tier, or an edge it
   * already continues to another hash, keeps its first mapping (Dynamo's rule for conflicting
   * lower-tier stores). Returns true when a record was added.
   */
  add(w: number, tier: number, hasParent: boolean, plo: number, phi: number, tlo: number, thi: number, blo: number, bhi: number): boolean {
    plo = hasParent ? plo | 0 : 0
    phi = hasParent ? phi | 0 : 0
    tlo |= 0
    thi |= 0
    blo |= 0
    bhi |= 0
    if (this.find(w, tier, blo, bhi) !== NIL) return false
    const wt = this.wt(w, tier)
    if (this.edge(wt, hasParent, plo, phi, tlo, thi) !== NIL) return false
    const r = this.take()
    const R = this.R
    const b = r * LS
    R[b + L_WT] = hasParent ? wt | HAS_PARENT : wt
    R[b + L_PLO] = plo
    R[b + L_PHI] = phi
    R[b + L_TLO] = tlo
    R[b + L_THI] = thi
    R[b + L_BLO] = blo
    R[b + L_BHI] = bhi
    this.byBlock.insert(this.blockKey(wt, blo, bhi), r)
    if (this.byBlock.needsRebuild) this.rebuild(this.byBlock, (x) => this.blockKeyOf(x))
    this.byEdge.insert(this.edgeKey(wt, hasParent, plo, phi, tlo, thi), r)
    if (this.byEdge.needsRebuild) this.rebuild(this.byEdge, (x) => this.edgeKeyOf(x))
    if (!hasParent) {
      this.roots.insert(this.rootKey(tier, tlo, thi), r)
      if (this.roots.needsRebuild) this.rebuild(this.roots, (x) => this.rootKeyOf(x), true)
    }
    this.count(w, tier, 1)
    return true
  }

  /** Removes (worker-rank, tier, block_hash); false when it is not held. */
  remove(w: number, tier: number, lo: number, hi: number): boolean {
    const r = this.find(w, tier, lo, hi)
    if (r === NIL) return false
    this.removeRecord(r)
    return true
  }

  /** Drops every record of the worker-rank slots marked 1 in `mark`; returns how many. */
  dropMarked(mark: Uint8Array): number {
    let n = 0
    const R = this.R
    for (let r = 0; r < this.high; r++) {
      const v = R[r * LS + L_WT] as number
      if (v !== NIL && mark[v & 0xffff] === 1) {
        this.removeRecord(r)
        n++
      }
    }
    return n
  }

  private removeRecord(r: number): void {
    const R = this.R
    const b = r * LS
    const v = R[b + L_WT] as number
    const w = v & 0xffff
    const tier = (v >>> 16) & 3
    this.byBlock.remove(this.blockKeyOf(r), r)
    this.byEdge.remove(this.edgeKeyOf(r), r)
    if ((v & HAS_PARENT) === 0) this.roots.remove(this.rootKeyOf(r), r)
    R[b + L_WT] = NIL
    this.free.push(r)
    this.count(w, tier, -1)
  }

  private count(w: number, tier: number, d: number): void {
    if (w >= this.perWorker.length) {
      const n = Math.max(w + 1, this.perWorker.length * 2)
      const pw = new Uint32Array(n)
      pw.set(this.perWorker)
      this.perWorker = pw
      const c = new Uint32Array(n * LOWER_TIERS)
      c.set(this.counts)
      this.counts = c
    }
    const k = w * LOWER_TIERS + tier
    this.counts[k] = (this.counts[k] as number) + d
    this.perWorker[w] = (this.perWorker[w] as number) + d
    this.perTier[tier] = (this.perTier[tier] as number) + d
    this.live += d
  }

  private take(): number {
    const r = this.free.pop()
    if (r !== undefined) return r
    const x = this.high++
    if (x * LS >= this.R.length) {
      const n = new Int32Array(this.R.length * 2)
      n.set(this.R)
      this.R = n
    }
    return x
  }

  private blockKeyOf(r: number): number {
    const b = r * LS
    return this.blockKey((this.R[b + L_WT] as number) & 0x3ffff, this.R[b + L_BLO] as number, this.R[b + L_BHI] as number)
  }
  private edgeKeyOf(r: number): number {
    const R = this.R
    const b = r * LS
    const v = R[b + L_WT] as number
    return this.edgeKey(v & 0x3ffff, (v & HAS_PARENT) !== 0, R[b + L_PLO] as number, R[b + L_PHI] as number, R[b + L_TLO] as number, R[b + L_THI] as number)
  }
  private rootKeyOf(r: number): number {
    const b = r * LS
    return this.rootKey(((this.R[b + L_WT] as number) >>> 16) & 3, this.R[b + L_TLO] as number, this.R[b + L_THI] as number)
  }

  private rebuild(t: SlotTable, key: (r: number) => number, rootsOnly = false): void {
    const R = this.R
    let n = 0
    for (let r = 0; r < this.high; r++) {
      const v = R[r * LS + L_WT] as number
      if (v !== NIL && (!rootsOnly || (v & HAS_PARENT) === 0)) n++
    }
    t.reset(n)
    for (let r = 0; r < this.high; r++) {
      const v = R[r * LS + L_WT] as number
      if (v !== NIL && (!rootsOnly || (v & HAS_PARENT) === 0)) t.insert(key(r), r)
    }
  }

  // ------------------------------------------------------------------------------------------
  // queries

  /** Worker-rank slots the last rootHolders() found (a slot may repeat, once per tier). */
  holders = new Int32Array(16)

  /**
   * The worker-ranks holding, in some lower tier, a parentless block of tokens_hash (lo, hi):
   * where a lower-tier match may start for a worker-rank with no device match. They land in
   * `holders[0..return)`.
   */
  rootHolders(lo: number, hi: number): number {
    lo |= 0
    hi |= 0
    const R = this.R
    let k = 0
    for (let tier = 0; tier < LOWER_TIERS; tier++) {
      for (let r = this.roots.first(this.rootKey(tier, lo, hi)); r !== NIL; r = this.roots.next()) {
        const b = r * LS
        const v = R[b + L_WT] as number
        if ((v & HAS_PARENT) !== 0 || ((v >>> 16) & 3) !== tier || R[b + L_TLO] !== lo || R[b + L_THI] !== hi) continue
        if (k === this.holders.length) {
          const h = new Int32Array(k * 2)
          h.set(this.holders)
          this.holders = h
        }
        this.holders[k++] = v & 0xffff
      }
    }
    return k
  }

  /** Cumulative depths of the last extend(): through host, then through disk and external. */
  hostDepth = 0
  diskDepth = 0

  /**
   * Extends a worker-rank's device match of `depth` blocks (its last block `last` when
   * `hasLast`) through host, then disk, then external. Sets hostDepth and diskDepth.
   */
  extend(w: number, lo: Uint32Array, hi: Uint32Array, n: number, depth: number, hasLast: boolean, lastLo: number, lastHi: number): void {
    let pos = depth
    let has = hasLast
    let plo = has ? lastLo | 0 : 0
    let phi = has ? lastHi | 0 : 0
    const R = this.R
    for (let tier = 0; tier < LOWER_TIERS; tier++) {
      if ((this.counts[w * LOWER_TIERS + tier] as number) !== 0) {
        const wt = this.wt(w, tier)
        while (pos < n) {
          const r = this.edge(wt, has, plo, phi, (lo[pos] as number) | 0, (hi[pos] as number) | 0)
          if (r === NIL) break
          plo = R[r * LS + L_BLO] as number
          phi = R[r * LS + L_BHI] as number
          has = true
          pos++
        }
      }
      if (tier === 0) this.hostDepth = pos
    }
    this.diskDepth = pos
  }

  /** Every record, for dumps and snapshots. */
  forEach(each: (b: LowerBlock) => void): void {
    const R = this.R
    for (let r = 0; r < this.high; r++) {
      const b = r * LS
      const v = R[b + L_WT] as number
      if (v === NIL) continue
      each({
        w: v & 0xffff,
        tier: (v >>> 16) & 3,
        hasParent: (v & HAS_PARENT) !== 0,
        parentLo: (R[b + L_PLO] as number) >>> 0,
        parentHi: (R[b + L_PHI] as number) >>> 0,
        tokLo: (R[b + L_TLO] as number) >>> 0,
        tokHi: (R[b + L_THI] as number) >>> 0,
        blockLo: (R[b + L_BLO] as number) >>> 0,
        blockHi: (R[b + L_BHI] as number) >>> 0,
      })
    }
  }

  get bytes(): number {
    return this.R.byteLength + this.byBlock.bytes + this.byEdge.bytes + this.roots.bytes + this.counts.byteLength + this.perWorker.byteLength
  }
}
