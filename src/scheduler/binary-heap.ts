// A binary min-heap of integer handles, shared by the scheduler's waiting room (PendingQueue) and
// approximate mode's expiry heap (ApproxTracker). Handles sit in an Int32Array and their keys in
// Float64Arrays indexed by handle, so push and pop are O(log n) and allocate nothing once the
// arrays have grown to the high-water mark.
//
// Each handle carries two ordering keys, compared here (smaller primary first, then smaller
// secondary), and the owner may add a tie-break for handles equal on both. The keys live in the
// heap rather than behind an owner's comparator because a comparator call site shared by two
// owners turns polymorphic in V8 once both run, and the sift loops would dispatch on every
// comparison. The tie-break is a call, but only on full key ties, and only one owner gives one.
// It is a plain function given the owner as an argument rather than a closure over the owner: a
// closure per owner would be a new call target for every owner created, and optimised heap code
// that had inlined one would be thrown away when that owner is collected.
//
// Tracking each handle's position (for has() and remove()) is optional: it is a write per sift
// step at a scattered index, which a heap with lazy deletion never needs.
import { grow } from './typed-arrays.js'

/**
 * True when handle `a` must leave the heap before handle `b`, `owner` being the heap's owner. A
 * strict order: false for a = b.
 */
export type TieBreak<O> = (owner: O, a: number, b: number) => boolean

export interface BinaryHeapOptions<O> {
  /** Initial room for handles 0..capacity-1 and as many heap slots; both grow on demand. */
  capacity?: number
  /** Track positions, so that has() and remove() work (default true). */
  indexed?: boolean
  /** Orders handles whose keys are both equal; without it their order is unspecified. */
  tie?: TieBreak<O>
  /** Passed to tie. */
  owner?: O
}

export class BinaryHeap<O = unknown> {
  private heap: Int32Array
  /** Position of each handle in heap, -1 when it is not in the heap; empty when not indexed. */
  private pos: Int32Array
  private primary: Float64Array
  private secondary: Float64Array
  private n = 0
  private readonly indexed: boolean
  private readonly tie: TieBreak<O> | null
  private readonly owner: O | null

  constructor(opts: BinaryHeapOptions<O> = {}) {
    const cap = Math.max(1, opts.capacity ?? 64)
    this.indexed = opts.indexed ?? true
    this.tie = opts.tie ?? null
    this.owner = opts.owner ?? null
    this.heap = new Int32Array(cap)
    this.pos = new Int32Array(this.indexed ? cap : 0).fill(-1)
    this.primary = new Float64Array(cap)
    this.secondary = new Float64Array(cap)
  }

  get size(): number {
    return this.n
  }

  has(handle: number): boolean {
    if (!this.indexed) throw new Error('has() needs an indexed heap')
    return handle >= 0 && handle < this.pos.length && (this.pos[handle] as number) >= 0
  }

  /** The first handle, -1 when empty. */
  peek(): number {
    return this.n === 0 ? -1 : (this.heap[0] as number)
  }

  /** The primary key a handle was last pushed with (it stays readable after the handle leaves). */
  primaryOf(handle: number): number {
    return this.primary[handle] as number
  }

  secondaryOf(handle: number): number {
    return this.secondary[handle] as number
  }

  /** Adds a handle (a non-negative integer) that is not in the heap, with its keys. */
  push(handle: number, primary: number, secondary: number): void {
    if (handle >= this.primary.length) this.growHandles(handle)
    this.primary[handle] = primary
    this.secondary[handle] = secondary
    this.reinsert(handle)
  }

  /** Adds a handle that is not in the heap with the keys it was last pushed with. */
  reinsert(handle: number): void {
    if (this.n === this.heap.length) this.heap = grow(this.heap, this.n + 1)
    this.up(this.n++, handle)
  }

  /** Removes and returns the first handle, -1 when empty. */
  pop(): number {
    if (this.n === 0) return -1
    const top = this.heap[0] as number
    this.removeAt(0)
    return top
  }

  /** Removes a handle wherever it is; false when it is not in the heap. Indexed heaps only. */
  remove(handle: number): boolean {
    if (!this.has(handle)) return false
    this.removeAt(this.pos[handle] as number)
    return true
  }

  clear(): void {
    if (this.indexed) for (let i = 0; i < this.n; i++) this.pos[this.heap[i] as number] = -1
    this.n = 0
  }

  /**
   * Adds a handle at the end without ordering it, for bulk loading: once every handle is in,
   * heapify() orders them all in O(n) rather than O(n log n). In between, only append() and
   * heapify() may be called.
   */
  append(handle: number, primary: number, secondary: number): void {
    if (handle >= this.primary.length) this.growHandles(handle)
    if (this.n === this.heap.length) this.heap = grow(this.heap, this.n + 1)
    this.primary[handle] = primary
    this.secondary[handle] = secondary
    const i = this.n++
    this.heap[i] = handle
    if (this.indexed) this.pos[handle] = i
  }

  heapify(): void {
    for (let i = (this.n >> 1) - 1; i >= 0; i--) this.down(i, this.heap[i] as number)
  }

  private before(a: number, b: number): boolean {
    const pa = this.primary[a] as number
    const pb = this.primary[b] as number
    if (pa !== pb) return pa < pb
    const sa = this.secondary[a] as number
    const sb = this.secondary[b] as number
    return sa < sb || (sa === sb && this.tied(a, b))
  }

  private tied(a: number, b: number): boolean {
    return this.tie?.(this.owner as O, a, b) === true
  }

  private removeAt(i: number): void {
    const heap = this.heap
    if (this.indexed) this.pos[heap[i] as number] = -1
    const last = --this.n
    if (i === last) return
    const moved = heap[last] as number
    // the last handle may belong above the hole (removal from another subtree) or below it
    if (i > 0 && this.before(moved, heap[(i - 1) >> 1] as number)) this.up(i, moved)
    else this.down(i, moved)
  }

  // The sift loops compare keys inline, with h's keys read once, rather than through before():
  // the tie-break call inside the loop would make the compiler reload the key arrays on every
  // comparison; inline, the call sits on the full-tie path only.

  /** Moves the hole at i up until h fits there, and puts h in it. */
  private up(i: number, h: number): void {
    const heap = this.heap
    const pos = this.pos
    const indexed = this.indexed
    const pk = this.primary
    const sk = this.secondary
    const hp = pk[h] as number
    const hs = sk[h] as number
    while (i > 0) {
      const p = (i - 1) >> 1
      const ph = heap[p] as number
      const pp = pk[ph] as number
      const ps = sk[ph] as number
      if (!(hp < pp || (hp === pp && (hs < ps || (hs === ps && this.tied(h, ph)))))) break
      heap[i] = ph
      if (indexed) pos[ph] = i
      i = p
    }
    heap[i] = h
    if (indexed) pos[h] = i
  }

  /** Moves the hole at i down until h fits there, and puts h in it. */
  private down(i: number, h: number): void {
    const heap = this.heap
    const pos = this.pos
    const indexed = this.indexed
    const pk = this.primary
    const sk = this.secondary
    const n = this.n
    const hp = pk[h] as number
    const hs = sk[h] as number
    for (;;) {
      const l = 2 * i + 1
      if (l >= n) break
      // c: the child that leaves first
      let c = l
      let ch = heap[l] as number
      let cp = pk[ch] as number
      let cs = sk[ch] as number
      const r = l + 1
      if (r < n) {
        const rh = heap[r] as number
        const rp = pk[rh] as number
        const rs = sk[rh] as number
        if (rp < cp || (rp === cp && (rs < cs || (rs === cs && this.tied(rh, ch))))) {
          c = r
          ch = rh
          cp = rp
          cs = rs
        }
      }
      if (!(cp < hp || (cp === hp && (cs < hs || (cs === hs && this.tied(ch, h)))))) break
      heap[i] = ch
      if (indexed) pos[ch] = i
      i = c
    }
    heap[i] = h
    if (indexed) pos[h] = i
  }

  private growHandles(handle: number): void {
    const cap = Math.max(handle + 1, this.primary.length * 2)
    this.primary = grow(this.primary, cap)
    this.secondary = grow(this.secondary, cap)
    if (!this.indexed) return
    const old = this.pos.length
    this.pos = grow(this.pos, cap)
    this.pos.fill(-1, old)
  }
}
