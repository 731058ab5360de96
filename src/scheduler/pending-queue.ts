// The waiting room: a max-heap over dense waiter handles, so push, pop and removing an arbitrary
// waiter (a client that went away) are O(log n) with no allocation. Equal keys leave in arrival
// order (an arrival number breaks ties), so fcfs stays stable when two requests arrive within one
// clock tick. The BinaryHeap is a min-heap, so it holds the negated key: -x < -y exactly when
// x > y, and negation is exact, so keyOf() gives back the key pushed.

import { BinaryHeap } from './binary-heap.js'

export class PendingQueue {
  private readonly heap = new BinaryHeap({ capacity: 64 })
  private counter = 0

  get size(): number {
    return this.heap.size
  }

  has(handle: number): boolean {
    return this.heap.has(handle)
  }

  push(handle: number, key: number): void {
    this.heap.push(handle, -key, this.counter++)
  }

  /**
   * Puts back a handle that pop() returned, with its key and its place among equal keys, as if
   * it had never left (a waiter that could not be dispatched yet).
   */
  restore(handle: number): void {
    this.heap.reinsert(handle)
  }

  /** Handle with the highest key, -1 when empty. */
  peek(): number {
    return this.heap.peek()
  }

  pop(): number {
    return this.heap.pop()
  }

  /** Removes a queued handle; false when it is not queued. */
  remove(handle: number): boolean {
    return this.heap.remove(handle)
  }

  keyOf(handle: number): number {
    return -this.heap.primaryOf(handle)
  }
}
