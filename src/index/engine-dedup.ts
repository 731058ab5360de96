// De-duplication of an engine's own KV events per worker-rank, as Dynamo's worker-side event
// processor does it: vLLM can report one block hash stored twice (two requests that computed
// the same block) and then removed twice, while the index holds it once. Every stored block
// counts its engine block_hash up; a removed hash is applied only when its count drops to 0;
// a hash never counted (stored before the router listened) passes through. AllBlocksCleared,
// and a restart of the engine, start the counts over.
//
// The counts live in one open-addressing table per worker-rank, keyed by the hash's u32 halves,
// so counting a block allocates nothing.
import { type DecodedEvent, EventKind, StorageTier } from '../codec/event-decoder.js'

const EMPTY_LOAD = 0.5

/** block_hash → times stored and not yet removed, for one worker-rank. */
export class HashCounts {
  private lo = new Uint32Array(64)
  private hi = new Uint32Array(64)
  /** 0 marks an empty cell. */
  private n = new Int32Array(64)
  private mask = 63
  size = 0

  constructor(private readonly max: number) {}

  private home(lo: number, hi: number): number {
    let h = Math.imul(lo, 0x9e3779b1) ^ Math.imul(hi ^ 0x2545f491, 0x85ebca6b)
    h ^= h >>> 15
    return h & this.mask
  }

  private find(lo: number, hi: number): number {
    for (let i = this.home(lo, hi); ; i = (i + 1) & this.mask) {
      if (this.n[i] === 0) return -1 - i
      if (this.lo[i] === lo && this.hi[i] === hi) return i
    }
  }

  /** Counts one store of the hash; returns its count before, or -1 when the table is full and it is not counted. */
  add(lo: number, hi: number): number {
    const i = this.find(lo, hi)
    if (i >= 0) {
      this.n[i] = (this.n[i] as number) + 1
      return (this.n[i] as number) - 1
    }
    if (this.size >= this.max) return -1
    if (this.size + 1 > (this.mask + 1) * EMPTY_LOAD) {
      this.grow()
      return this.add(lo, hi)
    }
    const at = -1 - i
    this.lo[at] = lo
    this.hi[at] = hi
    this.n[at] = 1
    this.size++
    return 0
  }

  /** Counts one removal; returns the count after it, or -1 when the hash is not counted. */
  remove(lo: number, hi: number): number {
    const i = this.find(lo, hi)
    if (i < 0) return -1
    const left = (this.n[i] as number) - 1
    if (left > 0) this.n[i] = left
    else this.drop(i)
    return left
  }

  /** Empties cell i, shifting back the cells of its probe run that belong before it. */
  private drop(i: number): void {
    const mask = this.mask
    let hole = i
    for (let j = (i + 1) & mask; this.n[j] !== 0; j = (j + 1) & mask) {
      const k = this.home(this.lo[j] as number, this.hi[j] as number)
      // j's entry may move into the hole when its home is not in (hole, j], cyclically
      const between = hole <= j ? k > hole && k <= j : k > hole || k <= j
      if (between) continue
      this.lo[hole] = this.lo[j] as number
      this.hi[hole] = this.hi[j] as number
      this.n[hole] = this.n[j] as number
      hole = j
    }
    this.n[hole] = 0
    this.size--
  }

  private grow(): void {
    const lo = this.lo
    const hi = this.hi
    const n = this.n
    const cap = (this.mask + 1) * 2
    this.lo = new Uint32Array(cap)
    this.hi = new Uint32Array(cap)
    this.n = new Int32Array(cap)
    this.mask = cap - 1
    for (let i = 0; i < n.length; i++) {
      if (n[i] === 0) continue
      const at = -1 - this.find(lo[i] as number, hi[i] as number)
      this.lo[at] = lo[i] as number
      this.hi[at] = hi[i] as number
      this.n[at] = n[i] as number
    }
  }
}

/** The counts of every worker-rank a shard holds engine events of. */
export class EngineDedup {
  private readonly ranks = new Map<string, HashCounts>()
  /** Blocks stored again while the worker-rank held them (applied: the index re-stores idempotently). */
  duplicateStores = 0
  /** Block removals held back because the hash is still stored by another count. */
  suppressedRemovals = 0

  /** `maxPerRank` bounds each table: hashes beyond it are not counted, so their removals pass through. */
  constructor(private readonly maxPerRank = 1 << 22) {}

  /** The counts of a worker-rank (made when new): looked up once per batch. */
  counts(lo: number, hi: number, rank: number): HashCounts {
    const key = `${lo}:${hi}:${rank}`
    let c = this.ranks.get(key)
    if (c === undefined) this.ranks.set(key, (c = new HashCounts(this.maxPerRank)))
    return c
  }

  /**
   * Counts a decoded event of the worker-rank whose counts are `c`, and drops from a removal the
   * hashes still stored. Returns false when nothing of the event is left to apply. Events of
   * other tiers than the device are not counted (the index does not hold them).
   */
  filter(c: HashCounts, ev: DecodedEvent): boolean {
    if (ev.tier !== StorageTier.Device) return true
    if (ev.kind === EventKind.Stored) {
      for (let i = 0; i < ev.count; i++) if (c.add(ev.blockLo[i] as number, ev.blockHi[i] as number) > 0) this.duplicateStores++
      return true
    }
    if (ev.kind === EventKind.Removed) {
      let k = 0
      for (let i = 0; i < ev.count; i++) {
        const lo = ev.blockLo[i] as number
        const hi = ev.blockHi[i] as number
        if (c.remove(lo, hi) > 0) {
          this.suppressedRemovals++
          continue
        }
        ev.blockLo[k] = lo
        ev.blockHi[k] = hi
        k++
      }
      ev.count = k
      return k > 0
    }
    return true
  }

  forgetRank(lo: number, hi: number, rank: number): void {
    this.ranks.delete(`${lo}:${hi}:${rank}`)
  }

  forgetWorker(lo: number, hi: number): void {
    const prefix = `${lo}:${hi}:`
    for (const k of [...this.ranks.keys()]) if (k.startsWith(prefix)) this.ranks.delete(k)
  }
}
