// Reference-counted active blocks per worker-rank: a block hash is active on a slot
// while any booked request on that slot references it, so a prefix shared by many requests on
// one worker counts once. Two maps:
//
//   hashes  block hash -> entry h, with the number of slots holding it and a list of its pairs
//   pairs   (h, slot)  -> refcount            O(1) acquire on booking, O(1) release by index
//
// The hash level lets a routing decision find, for every slot at once, how many of the
// request's blocks are already active there (Dynamo's potential_decode_blocks) without a
// lookup per (block, slot).
//
// Each hash entry also remembers which hash preceded it in the requests that reference it
// (pred). That is what lets countPresent() take the cheap prefix walk only where it is provably
// exact, whatever hashes callers pass (see there).
import { growTo } from './typed-arrays.js'
import { U64SlotMap } from './u64-slot-map.js'

/** pred[h] when h was referenced as the first block of a request. */
const PRED_FIRST = -1
/** pred[h] once h has been referenced after two different hashes (or after none and after one). */
const PRED_MIXED = -2

export class BlockRefs {
  // four buckets an entry: at thousands of worker-ranks the maps hold millions of entries, and
  // shorter chains take about a quarter off a booking's lookups there (bench:route's decisions)
  private pairs = new U64SlotMap(4096, 4)
  private hashes = new U64SlotMap(4096, 4)
  private ref = new Int32Array(4096)
  private pairHash = new Int32Array(4096)
  private prev = new Int32Array(4096)
  private nextInHash = new Int32Array(4096)
  private head = new Int32Array(4096)
  private holders = new Int32Array(4096)
  /**
   * Per hash entry: the hash entry that preceded it in every request that referenced it since the
   * entry was created, PRED_FIRST when it was always a request's first block, PRED_MIXED otherwise.
   * Only reset when the entry is deleted, so it can stay MIXED longer than needed (slower, never
   * wrong). An entry index in pred[h] is always live: each reference to h came with a reference to
   * that predecessor on the same slot, released together with it.
   */
  private pred = new Int32Array(4096)
  /** Hash entries (or -1) of the blocks of the last countPresent(), for the booking that follows. */
  private seen = new Int32Array(256)
  private seenN = 0
  /** Set by every acquisition: true when the pair was created (the block became active on the slot). */
  created = false
  /** What the last warm() read (kept so that its reads are). */
  warmed = 0

  constructor() {
    this.pairs.onGrow = (cap) => {
      this.ref = growTo(this.ref, cap)
      this.pairHash = growTo(this.pairHash, cap)
      this.prev = growTo(this.prev, cap)
      this.nextInHash = growTo(this.nextInHash, cap)
    }
    this.hashes.onGrow = (cap) => {
      this.head = growTo(this.head, cap)
      this.holders = growTo(this.holders, cap)
      this.pred = growTo(this.pred, cap)
    }
  }

  /** Distinct (hash, slot) pairs held. */
  get size(): number {
    return this.pairs.size
  }

  /**
   * Takes one reference on each of the n hashes on slot, as one request's blocks in order;
   * pairsOut[i] receives the pair index to release later. Returns how many blocks became active
   * on the slot (pairs created).
   */
  acquireAll(slot: number, lo: ArrayLike<number>, hi: ArrayLike<number>, n: number, pairsOut: Int32Array): number {
    const hashes = this.hashes
    const seen = this.seen
    const seenN = this.seenN
    this.seenN = 0
    let created = 0
    let before = PRED_FIRST
    // the pairs of the blocks held somewhere are looked up below, one after the other: their
    // buckets read first, at once (stale entries of `seen` cost a read, nothing more)
    this.warmed = this.pairs.warm(seen, 0, Math.min(n, seenN), slot)
    for (let i = 0; i < n; i++) {
      const l = lo[i] as number
      const u = hi[i] as number
      // The routing decision just looked these hashes up (countPresent); reuse an entry it found
      // when it still holds this very key, which also covers a caller that changed the arrays.
      let h = i < seenN ? (seen[i] as number) : -1
      let fresh = false
      if (h < 0 || hashes.slot[h] !== 0 || hashes.lo[h] !== l || hashes.hi[h] !== u) {
        h = hashes.findOrInsert(l, u, 0)
        fresh = hashes.inserted
      }
      const p = this.acquireEntry(h, fresh, slot, before)
      pairsOut[i] = p
      if (this.created) created++
      before = h
    }
    return created
  }

  /**
   * Takes one reference on (hash, slot) for a block with no known predecessor (tests and
   * debugging; bookings go through acquireAll). Returns the pair index to release later.
   */
  acquire(slot: number, lo: number, hi: number): number {
    const h = this.hashes.findOrInsert(lo, hi, 0)
    return this.acquireEntry(h, this.hashes.inserted, slot, PRED_MIXED)
  }

  private acquireEntry(h: number, fresh: boolean, slot: number, before: number): number {
    let p: number
    if (fresh) {
      // A hash nobody holds has no pairs: skip the pair lookup.
      this.head[h] = -1
      this.holders[h] = 0
      this.pred[h] = before
      p = this.pairs.insert(h, 0, slot)
    } else {
      if (this.pred[h] !== before) this.pred[h] = PRED_MIXED
      p = this.pairs.findOrInsert(h, 0, slot)
      if (!this.pairs.inserted) {
        this.ref[p] = (this.ref[p] as number) + 1
        this.created = false
        return p
      }
    }
    const first = this.head[h] as number
    this.nextInHash[p] = first
    this.prev[p] = -1
    if (first >= 0) this.prev[first] = p
    this.head[h] = p
    this.holders[h] = (this.holders[h] as number) + 1
    this.pairHash[p] = h
    this.ref[p] = 1
    this.created = true
    return p
  }

  /** Drops one reference; true when it was the last (the block left the slot). */
  release(p: number): boolean {
    const r = (this.ref[p] as number) - 1
    this.ref[p] = r
    if (r > 0) return false
    const h = this.pairHash[p] as number
    const pv = this.prev[p] as number
    const nx = this.nextInHash[p] as number
    if (pv >= 0) this.nextInHash[pv] = nx
    else this.head[h] = nx
    if (nx >= 0) this.prev[nx] = pv
    this.holders[h] = (this.holders[h] as number) - 1
    if (nx < 0 && pv < 0) this.hashes.delete(h)
    this.pairs.delete(p)
    return true
  }

  /**
   * present[slot] = how many of the n hashes are active on slot. Only slots holding some block
   * are written (assigned or added to), so the caller zeroes the entries it will read first; or,
   * given `touched`, keeps present all zeros between calls: each slot written is listed there
   * once (their number is returned) for the caller to read and zero. Exact for any hashes; a hash listed twice counts twice, as in Dynamo's filter-and-count.
   *
   * The fast part: while block i's every reference came right after block i−1 (pred), every slot
   * holding block i also holds block i−1, so along that chain the answer per slot is the depth of
   * its longest active prefix: walk the chain and list a block's holders only where their number
   * drops. Router-computed chained sequence hashes keep the whole cached prefix on
   * this path. Past the chain (a block nobody holds, or one also referenced elsewhere in another
   * order), every remaining block is looked up and its holders counted one by one: cheap when
   * nobody holds it, and needed because arbitrary caller hashes may reappear anywhere.
   */
  countPresent(lo: ArrayLike<number>, hi: ArrayLike<number>, n: number, present: Int32Array, touched?: Int32Array): number {
    const hashes = this.hashes
    const holders = this.holders
    if (this.seen.length < n) this.seen = new Int32Array(Math.max(n, this.seen.length * 2))
    const seen = this.seen
    hashes.findAll(lo, hi, n, 0, seen)
    let i = 0
    let last = -1
    let lastCount = 0
    let touchedN = 0
    for (; i < n; i++) {
      const h = seen[i] as number
      if (h < 0 || (i > 0 && this.pred[h] !== last)) break
      const c = holders[h] as number
      if (c !== lastCount && last >= 0) touchedN = this.setDepth(last, present, i, touched, touchedN)
      last = h
      lastCount = c
    }
    if (last >= 0) touchedN = this.setDepth(last, present, i, touched, touchedN)
    const pairSlot = this.pairs.slot
    const nextInHash = this.nextInHash
    this.seenN = n
    for (; i < n; i++) {
      const h = seen[i] as number
      if (h < 0) continue
      for (let p = this.head[h] as number; p >= 0; p = nextInHash[p] as number) {
        const s = pairSlot[p] as number
        const v = present[s] as number
        if (v === 0 && touched !== undefined) touched[touchedN++] = s
        present[s] = v + 1
      }
    }
    return touchedN
  }

  /** The block hash of pair p into lo[i] and hi[i] (replica catch-up reads a booking's blocks back). */
  hashOfPair(p: number, lo: Uint32Array, hi: Uint32Array, i: number): void {
    const h = this.pairHash[p] as number
    lo[i] = this.hashes.lo[h] as number
    hi[i] = this.hashes.hi[h] as number
  }

  /** Reference count of (hash, slot); 0 when not active. For tests and debugging. */
  refCount(slot: number, lo: number, hi: number): number {
    const h = this.hashes.find(lo, hi, 0)
    if (h < 0) return 0
    const p = this.pairs.find(h, 0, slot)
    return p < 0 ? 0 : (this.ref[p] as number)
  }

  /** Every holder of hash entry h is active to exactly this depth (so far along the chain); slots seen first go to `touched`. */
  private setDepth(h: number, present: Int32Array, depth: number, touched: Int32Array | undefined, touchedN: number): number {
    const pairSlot = this.pairs.slot
    const nextInHash = this.nextInHash
    for (let p = this.head[h] as number; p >= 0; p = nextInHash[p] as number) {
      const s = pairSlot[p] as number
      if (present[s] === 0 && touched !== undefined) touched[touchedN++] = s
      present[s] = depth
    }
    return touchedN
  }
}
