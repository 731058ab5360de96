// The (publisher_id, sequence) pairs seen last, for a router reading several ZMQ brokers: each
// broker forwards every publisher's messages, so each arrives once per broker. Bounded (Dynamo
// keeps 100,000) and evicted oldest first, which is what Dynamo's LRU does here too, as a pair is
// only ever looked up and inserted once. The pairs live in typed arrays, found through a map from
// a 53-bit mix of the four halves; a mix two pairs share leaves the older one unfound (applied
// again: a repeated store or removal the index takes as it is).
export class SeenPairs {
  private readonly halves: Uint32Array
  private readonly keys: Float64Array
  private readonly slotOf = new Map<number, number>()
  private next = 0
  private filled = 0

  constructor(readonly capacity = 100_000) {
    this.halves = new Uint32Array(capacity * 4)
    this.keys = new Float64Array(capacity)
  }

  /** True when the pair was seen (a duplicate); otherwise it is remembered and false returned. */
  seen(pubHi: number, pubLo: number, seqHi: number, seqLo: number): boolean {
    const key = ((pubLo ^ Math.imul(pubHi, 0x9e3779b1) ^ Math.imul(seqHi, 0x85ebca6b)) >>> 0) * 2097152 + ((seqLo ^ (pubHi >>> 11)) & 0x1fffff)
    const s = this.slotOf.get(key)
    const h = this.halves
    if (s !== undefined && h[s * 4] === pubHi && h[s * 4 + 1] === pubLo && h[s * 4 + 2] === seqHi && h[s * 4 + 3] === seqLo) return true
    const slot = this.next
    if (this.filled === this.capacity) {
      const old = this.keys[slot] as number
      if (this.slotOf.get(old) === slot) this.slotOf.delete(old)
    } else this.filled++
    h[slot * 4] = pubHi
    h[slot * 4 + 1] = pubLo
    h[slot * 4 + 2] = seqHi
    h[slot * 4 + 3] = seqLo
    this.keys[slot] = key
    this.slotOf.set(key, slot)
    this.next = (slot + 1) % this.capacity
    return false
  }

  get size(): number {
    return this.filled
  }
}
