// A hash map keyed by (u64 as two u32 halves, slot) in typed arrays, with stable entry indices.
// Chaining (bucket heads + next links) rather than open addressing, because callers keep entry
// indices in their own parallel arrays and in per-request lists: an entry must never move when
// another one is deleted. Freed entries go on a free list threaded through `next`.
import { fmix32 } from '../codec/hash-mix.js'

export class U64SlotMap {
  lo: Uint32Array
  hi: Uint32Array
  slot: Int32Array
  /** Bucket chain link for live entries, free-list link for freed ones. */
  next: Int32Array
  size = 0
  /** Set by findOrInsert(): whether the key was absent. */
  inserted = false
  /** Called after the entry arrays grew, so owners can grow their parallel arrays to match. */
  onGrow: ((capacity: number) => void) | undefined

  private buckets: Int32Array
  /** warm()'s bucket heads. */
  private heads = new Int32Array(0)
  private mask: number
  private top = 0
  private freeHead = -1

  /**
   * `bucketsPerEntry` (a power of two): buckets per entry of capacity. Each entry a lookup walks
   * past is a read of its own; with millions of entries, far beyond the caches, a miss. Four
   * keep chains at a quarter of an entry on average when full, for 12 more bytes per entry.
   */
  constructor(
    initialCapacity = 1024,
    private readonly bucketsPerEntry = 1,
  ) {
    if (!(bucketsPerEntry >= 1 && (bucketsPerEntry & (bucketsPerEntry - 1)) === 0))
      throw new RangeError(`bucketsPerEntry ${bucketsPerEntry} is not a power of two`)
    let cap = 16
    while (cap < initialCapacity) cap *= 2
    this.lo = new Uint32Array(cap)
    this.hi = new Uint32Array(cap)
    this.slot = new Int32Array(cap)
    this.next = new Int32Array(cap)
    this.buckets = new Int32Array(cap * bucketsPerEntry).fill(-1)
    this.mask = cap * bucketsPerEntry - 1
  }

  /** One past the highest entry index ever used; entries below it with slot −1 are free. */
  get highWater(): number {
    return this.top
  }

  get capacity(): number {
    return this.lo.length
  }

  /** Entry index of the key, or -1. */
  find(lo: number, hi: number, slot: number): number {
    let e = this.buckets[mix(lo, hi, slot) & this.mask] as number
    while (e >= 0) {
      if (this.lo[e] === lo && this.hi[e] === hi && this.slot[e] === slot) return e
      e = this.next[e] as number
    }
    return -1
  }

  /**
   * out[i] = find(lo[i], hi[i], slot) for i < n. The buckets are read first, then the chains: each
   * pass's loads are independent of each other, so their misses overlap (a big map's lookups are
   * its misses).
   */
  findAll(lo: ArrayLike<number>, hi: ArrayLike<number>, n: number, slot: number, out: Int32Array): void {
    const buckets = this.buckets
    const mask = this.mask
    for (let i = 0; i < n; i++) out[i] = buckets[mix(lo[i] as number, hi[i] as number, slot) & mask] as number
    const keyLo = this.lo
    const keyHi = this.hi
    const keySlot = this.slot
    const next = this.next
    for (let i = 0; i < n; i++) {
      const l = lo[i] as number
      const h = hi[i] as number
      let e = out[i] as number
      while (e >= 0 && !(keyLo[e] === l && keyHi[e] === h && keySlot[e] === slot)) e = next[e] as number
      out[i] = e
    }
  }

  /**
   * Reads the buckets and the chains' first keys that lookups of (lo[i], hi, slot) will read, for
   * i < n with lo[i] ≥ 0 (entry indices of another map, as BlockRefs' pairs are keyed): their
   * misses overlap here rather than one lookup after the other. Returns what it read, summed, so
   * that the reads stay.
   */
  warm(lo: Int32Array, hi: number, n: number, slot: number): number {
    if (this.heads.length < n) this.heads = new Int32Array(Math.max(n, this.heads.length * 2))
    const heads = this.heads
    const buckets = this.buckets
    const mask = this.mask
    for (let i = 0; i < n; i++) {
      const l = lo[i] as number
      heads[i] = l >= 0 ? (buckets[mix(l, hi, slot) & mask] as number) : -1
    }
    const keyLo = this.lo
    const keySlot = this.slot
    let sum = 0
    for (let i = 0; i < n; i++) {
      const e = heads[i] as number
      if (e >= 0) sum += (keyLo[e] as number) + (keySlot[e] as number)
    }
    return sum
  }

  /** Entry index of the key, inserted when absent (then `inserted` is true). One hash, one walk. */
  findOrInsert(lo: number, hi: number, slot: number): number {
    let e = this.buckets[mix(lo, hi, slot) & this.mask] as number
    while (e >= 0) {
      if (this.lo[e] === lo && this.hi[e] === hi && this.slot[e] === slot) {
        this.inserted = false
        return e
      }
      e = this.next[e] as number
    }
    this.inserted = true
    return this.insert(lo, hi, slot)
  }

  /** Inserts a key the caller knows to be absent; returns its entry index. */
  insert(lo: number, hi: number, slot: number): number {
    let e = this.freeHead
    if (e >= 0) {
      this.freeHead = this.next[e] as number
    } else {
      if (this.top === this.lo.length) this.grow()
      e = this.top++
    }
    this.lo[e] = lo
    this.hi[e] = hi
    this.slot[e] = slot
    const b = mix(lo, hi, slot) & this.mask
    this.next[e] = this.buckets[b] as number
    this.buckets[b] = e
    this.size++
    return e
  }

  /** Deletes a live entry by index. */
  delete(e: number): void {
    const b = mix(this.lo[e] as number, this.hi[e] as number, this.slot[e] as number) & this.mask
    let cur = this.buckets[b] as number
    if (cur === e) {
      this.buckets[b] = this.next[e] as number
    } else {
      while (cur >= 0) {
        const nxt = this.next[cur] as number
        if (nxt === e) {
          this.next[cur] = this.next[e] as number
          break
        }
        cur = nxt
      }
    }
    this.slot[e] = -1
    this.next[e] = this.freeHead
    this.freeHead = e
    this.size--
  }

  clear(): void {
    this.buckets.fill(-1)
    this.top = 0
    this.freeHead = -1
    this.size = 0
  }

  private grow(): void {
    const cap = this.lo.length * 2
    const lo = new Uint32Array(cap)
    lo.set(this.lo)
    const hi = new Uint32Array(cap)
    hi.set(this.hi)
    const slot = new Int32Array(cap)
    slot.set(this.slot)
    this.lo = lo
    this.hi = hi
    this.slot = slot
    this.next = new Int32Array(cap)
    this.buckets = new Int32Array(cap * this.bucketsPerEntry).fill(-1)
    this.mask = cap * this.bucketsPerEntry - 1
    // Only reached with an empty free list, so every entry below top is live: relink them all.
    for (let e = 0; e < this.top; e++) {
      const b = mix(lo[e] as number, hi[e] as number, slot[e] as number) & this.mask
      this.next[e] = this.buckets[b] as number
      this.buckets[b] = e
    }
    this.onGrow?.(cap)
  }
}

/** The three key words folded and finalized: hashes from tests (small integers) spread too. Only bucket placement depends on it. */
export function mix(lo: number, hi: number, slot: number): number {
  return fmix32(Math.imul(lo ^ Math.imul(slot + 1, 0x85ebca6b), 0x9e3779b1) ^ hi)
}
