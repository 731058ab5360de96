// Reference-counted active blocks per worker-rank (spec §4.4): a block hash is active on a slot
// while any booked request on that slot references it, so a prefix shared by many requests on
// one worker counts once. Two maps:
//
//   pairs   (hash, slot) -> refcount            O(1) acquire on booking, O(1) release by index
//   hashes  hash -> doubly linked list of its pairs
//
// The second map lets a routing decision count, for every slot at once, how many of the
// request's hashes are already active there (potential_decode_blocks, spec §4.2) in
// O(blocks + Σ slots holding each block) instead of O(blocks × slots) lookups.
import { U64SlotMap } from './u64-slot-map.js'

export class BlockRefs {
  private pairs = new U64SlotMap(4096)
  private hashes = new U64SlotMap(4096)
  private ref = new Int32Array(4096)
  private pairHash = new Int32Array(4096)
  private prev = new Int32Array(4096)
  private nextInHash = new Int32Array(4096)
  private head = new Int32Array(4096)
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
    }
  }

  /** Distinct (hash, slot) pairs held. */
  get size(): number {
    return this.pairs.size
  }

  /** Takes one reference on (hash, slot); returns the pair index to release later. */
  acquire(slot: number, lo: number, hi: number): number {
    let p = this.pairs.find(lo, hi, slot)
    if (p >= 0) {
      this.ref[p] = (this.ref[p] as number) + 1
      this.created = false
      return p
    }
    p = this.pairs.insert(lo, hi, slot)
    let h = this.hashes.find(lo, hi, 0)
    if (h < 0) {
      h = this.hashes.insert(lo, hi, 0)
      this.head[h] = -1
    }
    const first = this.head[h] as number
    this.nextInHash[p] = first
    this.prev[p] = -1
    if (first >= 0) this.prev[first] = p
    this.head[h] = p
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
    if (this.head[h] === -1) this.hashes.delete(h)
    this.pairs.delete(p)
    return true
  }

  /** present[slot] += number of the n hashes already active on slot (present is not cleared). */
  countPresent(lo: ArrayLike<number>, hi: ArrayLike<number>, n: number, present: Int32Array): void {
    const hashes = this.hashes
    const pairSlot = this.pairs.slot
    const head = this.head
    const nextInHash = this.nextInHash
    for (let i = 0; i < n; i++) {
      const h = hashes.find(lo[i] as number, hi[i] as number, 0)
      if (h < 0) continue
      for (let p = head[h] as number; p >= 0; p = nextInHash[p] as number) {
        const s = pairSlot[p] as number
        present[s] = (present[s] as number) + 1
      }
    }
  }

  /** Reference count of (hash, slot); 0 when not active. For tests and debugging. */
  refCount(slot: number, lo: number, hi: number): number {
    const p = this.pairs.find(lo, hi, slot)
    return p < 0 ? 0 : (this.ref[p] as number)
  }
}

function resize(a: Int32Array, n: number): Int32Array {
  const b = new Int32Array(n)
  b.set(a.subarray(0, Math.min(a.length, n)))
  return b
}
