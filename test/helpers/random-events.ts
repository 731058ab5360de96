// Seeded random event streams shared by the index property test and the shard pool tests:
// mostly engine-like chained hashes, some collisions, unknown parents, removals, clears.
import type { RouterEvent } from '../../src/codec/events.js'
import type { Rng } from './rng.js'
import { stored, removed, cleared } from './events.js'

export const WORKERS = [1n, 2n, 2n ** 60n + 3n, 77n, 1234567890123n]
export const RANKS = [0, 1]
export const TOKENS = [1n, 2n, 3n, 4n, 5n, 6n]

export class EventStream {
  private known = new Map<string, bigint[]>()
  constructor(
    private rng: Rng,
    private workers: readonly bigint[] = WORKERS.slice(0, 3),
    private maxBlocks = 4,
  ) {}

  private hashesOf(key: string): bigint[] {
    let l = this.known.get(key)
    if (l === undefined) this.known.set(key, (l = []))
    return l
  }

  /** The next event, or a worker to forget (remove_worker). */
  next(): { ev?: RouterEvent; forget?: bigint } {
    const r = this.rng
    const w = r.pick(this.workers)
    const rank = r.pick(RANKS)
    const known = this.hashesOf(`${w}:${rank}`)
    const roll = r.next()
    if (roll < 0.62) {
      let parent: bigint | null = null
      if (known.length > 0 && r.next() < 0.7) parent = r.pick(known)
      else if (r.next() < 0.05) parent = 9999n
      const blocks: [bigint, bigint][] = []
      let chainHash = parent ?? 7n
      for (let i = 0, n = 1 + r.int(this.maxBlocks); i < n; i++) {
        const tok = r.pick(TOKENS)
        chainHash = r.next() < 0.75 ? ((chainHash * 31n + tok) % 997n) + 1000n : BigInt(1000 + r.int(40))
        blocks.push([chainHash, tok])
        known.push(chainHash)
      }
      return { ev: stored(w, parent, blocks, rank) }
    }
    if (roll < 0.94) {
      const hashes: bigint[] = []
      for (let i = 0, n = 1 + r.int(3); i < n; i++) hashes.push(known.length > 0 && r.next() < 0.9 ? r.pick(known) : BigInt(5000 + r.int(10)))
      return { ev: removed(w, hashes, rank) }
    }
    if (roll < 0.985) return { ev: cleared(w, rank) }
    return { forget: w }
  }
}

export function randomQuery(r: Rng): bigint[] {
  const q: bigint[] = []
  for (let i = 0, n = r.int(7); i < n; i++) q.push(r.pick(TOKENS))
  return q
}
