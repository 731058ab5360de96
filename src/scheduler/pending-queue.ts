// The waiting room: an indexed binary max-heap over dense waiter handles. Keys and positions
// live in typed arrays indexed by handle, so push, pop and removing an arbitrary waiter (a client
// that went away) are O(log n) with no allocation. Equal keys leave in arrival order (a sequence
// number breaks ties), so fcfs stays stable when two requests arrive within one clock tick.

import { grow, growTo } from './typed-arrays.js'

export class PendingQueue {
  private heap = new Int32Array(64)
  private key = new Float64Array(64)
  private seq = new Float64Array(64)
  /** Position of a handle in heap, -1 when not queued. */
  private pos = new Int32Array(64).fill(-1)
  private n = 0
  private counter = 0

  get size(): number {
    return this.n
  }

  has(handle: number): boolean {
    return handle < this.pos.length && (this.pos[handle] as number) >= 0
  }

  push(handle: number, key: number): void {
    this.ensureHandle(handle)
    if (this.n === this.heap.length) this.heap = grow(this.heap, this.n + 1)
    this.key[handle] = key
    this.seq[handle] = this.counter++
    const i = this.n++
    this.heap[i] = handle
    this.pos[handle] = i
    this.up(i)
  }

  /**
   * Puts back a handle that pop() returned, with its key and its place among equal keys, as if
   * it had never left (a waiter that could not be dispatched yet).
   */
  restore(handle: number): void {
    if (this.n === this.heap.length) this.heap = grow(this.heap, this.n + 1)
    const i = this.n++
    this.heap[i] = handle
    this.pos[handle] = i
    this.up(i)
  }

  /** Handle with the highest key, -1 when empty. */
  peek(): number {
    return this.n === 0 ? -1 : (this.heap[0] as number)
  }

  pop(): number {
    if (this.n === 0) return -1
    const top = this.heap[0] as number
    this.removeAt(0)
    return top
  }

  /** Removes a queued handle; false when it is not queued. */
  remove(handle: number): boolean {
    if (!this.has(handle)) return false
    this.removeAt(this.pos[handle] as number)
    return true
  }

  keyOf(handle: number): number {
    return this.key[handle] as number
  }

  private removeAt(i: number): void {
    const gone = this.heap[i] as number
    this.pos[gone] = -1
    const last = --this.n
    if (i === last) return
    const moved = this.heap[last] as number
    this.heap[i] = moved
    this.pos[moved] = i
    if (i > 0 && this.before(moved, this.heap[(i - 1) >> 1] as number)) this.up(i)
    else this.down(i)
  }

  /** a leaves before b: higher key, then earlier push. */
  private before(a: number, b: number): boolean {
    const ka = this.key[a] as number
    const kb = this.key[b] as number
    return ka > kb || (ka === kb && (this.seq[a] as number) < (this.seq[b] as number))
  }

  private up(i: number): void {
    const heap = this.heap
    const h = heap[i] as number
    while (i > 0) {
      const p = (i - 1) >> 1
      const ph = heap[p] as number
      if (!this.before(h, ph)) break
      heap[i] = ph
      this.pos[ph] = i
      i = p
    }
    heap[i] = h
    this.pos[h] = i
  }

  private down(i: number): void {
    const heap = this.heap
    const n = this.n
    const h = heap[i] as number
    for (;;) {
      const l = 2 * i + 1
      if (l >= n) break
      const r = l + 1
      let c = l
      if (r < n && this.before(heap[r] as number, heap[l] as number)) c = r
      const ch = heap[c] as number
      if (!this.before(ch, h)) break
      heap[i] = ch
      this.pos[ch] = i
      i = c
    }
    heap[i] = h
    this.pos[h] = i
  }

  private ensureHandle(handle: number): void {
    if (handle < this.pos.length) return
    const cap = Math.max(handle + 1, this.pos.length * 2)
    this.key = growTo(this.key, cap)
    this.seq = growTo(this.seq, cap)
    const old = this.pos.length
    this.pos = growTo(this.pos, cap)
    this.pos.fill(-1, old)
  }
}
