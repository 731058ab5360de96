// Reference-counted active blocks per worker-rank (spec §4.4): a block hash is active on a slot
// while any booked request on that slot references it, so a prefix shared by many requests on
// one worker counts once. Two maps:
//
//   hashes  block hash -> entry h, with the number of slots holding it and a list of its pairs
//   pairs   (h, slot)  -> refcount            O(1) acquire on booking, O(1) release by index
//
// The hash level lets a routing decision find, for every slot at once, how many of the
// request's blocks are already active there (potential_decode_blocks, spec §4.2) without a
// lookup per (block, slot).
import { U64SlotMap } from './u64-slot-map.js'

export class BlockRefs {
  private pairs = new U64SlotMap(4096)
  private hashes = new U64SlotMap(4096)
  private ref = new Int32Array(4096)
  private pairHash = new Int32Array(4096)
  private prev = new Int32Array(4096)
  private nextInHash = new Int32Array(4096)
  private head = new Int32Array(4096)
  private holders = new Int32Array(4096)
  /** Set by acquire(): true when the pair was created (the block became active on the slot). */
  created = false

  constructor() {
    this.pairs.onGrow = (cap) => {
      this.ref = resize(this.ref, cap)
      this.pairHash = resize(this.pairHash, cap)
      this.prev = resize(this.prev, cap)
      this.nextInHash = resize(this.nextInHash, cap)
    }
    this.hashes.onGrow = (cap) => {
      this.head = resize(this.head, cap)
      this.holders = resize(this.holders, cap)
    }
  }

  /** Distinct (hash, slot) pairs held. */
  get size(): number {
    return this.pairs.size
  }

  /** Takes one reference on (hash, slot); returns the pair index to release later. */
  acquire(slot: number, lo: number, hi: number): number {
    let h = this.hashes.find(lo, hi, 0)
    let p: number
    if (h < 0) {
      // A hash nobody holds has no pairs: skip the pair lookup.
      h = this.hashes.insert(lo, hi, 0)
      this.head[h] = -1
      this.holders[h] = 0
    } else {
      p = this.pairs.find(h, 0, slot)
      if (p >= 0) {
        this.ref[p] = (this.ref[p] as number) + 1
        this.created = false
        return p
      }
    }
    p = this.pairs.insert(h, 0, slot)
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
   * present[slot] = how many of the n hashes are active on slot, for every slot holding any
   * (entries of other slots are left untouched; the caller zeroes the ones it reads).
   *
   * Tracking hashes are chained sequence hashes, and every booking references its whole chain,
   * so the slots holding block i+1 are a subset of those holding block i and the answer is the
   * depth of the longest active prefix. That makes the walk cheap: stop at the first block
   * nobody holds, and list a block's holders only where their number drops. Should the subset
   * property not hold (hashes that are not chained), the number of holders grows somewhere
   * along the walk, and the exact per-block count is used instead.
   */
  countPresent(lo: ArrayLike<number>, hi: ArrayLike<number>, n: number, present: Int32Array): void {
    if (n === 0) return
    const hashes = this.hashes
    const holders = this.holders
    let last = hashes.find(lo[0] as number, hi[0] as number, 0)
    if (last < 0) return
    let lastCount = holders[last] as number
    for (let i = 1; i < n; i++) {
      const h = hashes.find(lo[i] as number, hi[i] as number, 0)
      const c = h < 0 ? 0 : (holders[h] as number)
      if (c === lastCount) {
        last = h
        continue
      }
      if (c > lastCount) {
        this.countExact(lo, hi, n, present)
        return
      }
      this.setHolders(last, present, i)
      if (c === 0) return
      last = h
      lastCount = c
    }
    this.setHolders(last, present, n)
  }

  /** Reference count of (hash, slot); 0 when not active. For tests and debugging. */
  refCount(slot: number, lo: number, hi: number): number {
    const h = this.hashes.find(lo, hi, 0)
    if (h < 0) return 0
    const p = this.pairs.find(h, 0, slot)
    return p < 0 ? 0 : (this.ref[p] as number)
  }

  private setHolders(h: number, present: Int32Array, depth: number): void {
    const pairSlot = this.pairs.slot
    const nextInHash = this.nextInHash
    for (let p = this.head[h] as number; p >= 0; p = nextInHash[p] as number) present[pairSlot[p] as number] = depth
  }

  private countExact(lo: ArrayLike<number>, hi: ArrayLike<number>, n: number, present: Int32Array): void {
    const pairSlot = this.pairs.slot
    const nextInHash = this.nextInHash
    // Undo the depths written so far: clear every slot that holds any of the blocks, then count.
    for (let i = 0; i < n; i++) {
      const h = this.hashes.find(lo[i] as number, hi[i] as number, 0)
      if (h >= 0) for (let p = this.head[h] as number; p >= 0; p = nextInHash[p] as number) present[pairSlot[p] as number] = 0
    }
    for (let i = 0; i < n; i++) {
      const h = this.hashes.find(lo[i] as number, hi[i] as number, 0)
      if (h < 0) continue
      for (let p = this.head[h] as number; p >= 0; p = nextInHash[p] as number) {
        const s = pairSlot[p] as number
        present[s] = (present[s] as number) + 1
      }
    }
  }
}

function resize(a: Int32Array, n: number): Int32Array<ArrayBuffer> {
  const b = new Int32Array(n)
  b.set(a.subarray(0, Math.min(a.length, n)))
  return b
}
