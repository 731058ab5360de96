// One 32-bit mixing step for the router's in-process hashes (worker-rank identities, slot-map
// buckets, seeds, synthetic trace tokens): murmur3's finalizer, which spreads every input bit
// over the whole word, so small or sequential inputs land far apart; and a cheaper combiner of
// three words for the index's hash tables, whose lookups sit on the hot path.

/** murmur3's fmix32: a bijective avalanche of a 32-bit word; the result is unsigned. */
export function fmix32(h: number): number {
  h ^= h >>> 16
  h = Math.imul(h, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

/** Three words into one bucket hash (two multiply-xorshift rounds per word; not a bijection). */
export function mix3(a: number, b: number, c: number): number {
  let h = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h ^ b, 0xc2b2ae35)
  h ^= h >>> 16
  h = Math.imul(h ^ c, 0x27d4eb2f)
  h ^= h >>> 15
  return h
}
