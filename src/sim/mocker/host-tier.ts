// The host (CPU) offload tier of a simulated engine (`kv-router mocker --num-cpu-blocks N`): N
// blocks in LRU order that keep what the device pool evicts, so a later request finds them there
// and loads them back instead of recomputing them. The block pool (block-pool.ts) offloads a block
// here when it evicts it from the device and looks here after a device miss; this file only keeps
// the blocks and says which were stored and which evicted since the pool last asked, from which
// the pool builds the tier's KV events (vLLM's `medium: "CPU"`, Dynamo's `host_pinned`).
//
// A block stored and evicted again within one allocation (more blocks offloaded at once than
// the tier holds) is reported as neither: the events describe the tier's state after the
// allocation, not each step on the way.
//
// Per block: its sequence hash (the key), its local hash, its parent's sequence hash (the event
// names it), and its token ids when the pool keeps them (vLLM's events carry them).
import { u64FromParts } from '../../codec/u64.js'

const EMPTY = -1

export class HostTier {
  readonly capacity: number
  readonly blockSize: number
  readonly seqLo: Uint32Array
  readonly seqHi: Uint32Array
  readonly tokLo: Uint32Array
  readonly tokHi: Uint32Array
  readonly parLo: Uint32Array
  readonly parHi: Uint32Array
  /** 1: the block has a parent (not the prompt's first block). */
  readonly hasPar: Uint8Array
  /** Token ids, blockSize per slot; null when the pool does not keep them. */
  readonly tokens: Uint32Array | null
  /** 1: the slot's token ids are known. */
  readonly hasTok: Uint8Array
  private readonly prev: Int32Array
  private readonly next: Int32Array
  private readonly table: Int32Array
  private readonly mask: number
  private readonly shift: number
  /** Slots handed out so far; slots are never freed, only reused by eviction. */
  private count = 0

  // --- what changed since the last takeChanges ---
  /** The batch a slot was stored in (0: an earlier one, or reported already). */
  private readonly stamp: Uint32Array
  private batch = 1
  /** Slots stored in this batch, in order (a slot reused within the batch may appear twice). */
  private readonly storedSlots: number[] = []
  /** Blocks of earlier batches evicted in this one. */
  readonly removedLo: number[] = []
  readonly removedHi: number[] = []

  /** Blocks stored, and evicted, over the tier's life. */
  stored = 0
  evictions = 0

  constructor(capacity: number, blockSize: number, keepTokens: boolean) {
    this.capacity = capacity
    this.blockSize = blockSize
    this.seqLo = new Uint32Array(capacity)
    this.seqHi = new Uint32Array(capacity)
    this.tokLo = new Uint32Array(capacity)
    this.tokHi = new Uint32Array(capacity)
    this.parLo = new Uint32Array(capacity)
    this.parHi = new Uint32Array(capacity)
    this.hasPar = new Uint8Array(capacity)
    this.tokens = keepTokens ? new Uint32Array(capacity * blockSize) : null
    this.hasTok = new Uint8Array(capacity)
    this.prev = new Int32Array(capacity + 1).fill(EMPTY)
    this.next = new Int32Array(capacity + 1).fill(EMPTY)
    this.prev[capacity] = capacity
    this.next[capacity] = capacity
    this.stamp = new Uint32Array(capacity)
    let bits = 4
    while (1 << bits < capacity * 2) bits++
    this.table = new Int32Array(1 << bits).fill(EMPTY)
    this.mask = (1 << bits) - 1
    this.shift = 32 - bits
  }

  /** Blocks the tier holds. */
  get used(): number {
    return this.count
  }

  /** The slot holding this sequence hash, or -1. */
  find(lo: number, hi: number): number {
    const t = this.table
    const mask = this.mask
    for (let i = this.home(lo, hi); ; i = (i + 1) & mask) {
      const s = t[i] as number
      if (s === EMPTY) return EMPTY
      if (this.seqLo[s] === lo && this.seqHi[s] === hi) return s
    }
  }

  /** Makes slot s the most recently used. */
  touch(s: number): void {
    this.unlink(s)
    this.push(s)
  }

  /**
   * Keeps a block the device evicted: a block held already is only touched; otherwise it takes a
   * free slot or the least recently used one's. `tokens` from `tokOff` are its token ids (null:
   * unknown). Returns the slot.
   */
  offload(
    seqLo: number,
    seqHi: number,
    tokLo: number,
    tokHi: number,
    hasPar: boolean,
    parLo: number,
    parHi: number,
    tokens: Uint32Array | null,
    tokOff: number,
  ): number {
    const f = this.find(seqLo, seqHi)
    if (f !== EMPTY) {
      this.touch(f)
      return f
    }
    let s: number
    if (this.count < this.capacity) s = this.count++
    else {
      s = this.next[this.capacity] as number
      this.unlink(s)
      this.remove(s)
      this.evictions++
      // stored in this batch: the tier never reports it (see the top of the file)
      if (this.stamp[s] === this.batch) this.stamp[s] = 0
      else {
        this.removedLo.push(this.seqLo[s] as number)
        this.removedHi.push(this.seqHi[s] as number)
      }
    }
    this.seqLo[s] = seqLo
    this.seqHi[s] = seqHi
    this.tokLo[s] = tokLo
    this.tokHi[s] = tokHi
    this.hasPar[s] = hasPar ? 1 : 0
    this.parLo[s] = parLo
    this.parHi[s] = parHi
    const bs = this.blockSize
    if (this.tokens !== null && tokens !== null) {
      this.tokens.set(tokens.subarray(tokOff, tokOff + bs), s * bs)
      this.hasTok[s] = 1
    } else this.hasTok[s] = 0
    this.insert(s)
    this.push(s)
    this.stamp[s] = this.batch
    this.storedSlots.push(s)
    this.stored++
    return s
  }

  /** True when blocks were stored or evicted since the last takeChanges. */
  get changed(): boolean {
    return this.storedSlots.length > 0 || this.removedLo.length > 0
  }

  /**
   * Ends the batch: calls `stored` for each block stored in it that the tier still holds, in
   * order, after the caller read `removedLo`/`removedHi` (which this clears).
   */
  takeChanges(stored: (slot: number) => void): void {
    const b = this.batch
    for (const s of this.storedSlots) {
      if (this.stamp[s] !== b) continue
      this.stamp[s] = 0
      stored(s)
    }
    this.storedSlots.length = 0
    this.removedLo.length = 0
    this.removedHi.length = 0
    this.batch = (this.batch + 1) >>> 0
    if (this.batch === 0) {
      // after 2^32 batches a stale stamp could equal the new batch: start the stamps over
      this.stamp.fill(0)
      this.batch = 1
    }
  }

  /** The sequence hashes of every block held. Cold path. */
  cachedBlocks(): Set<bigint> {
    const out = new Set<bigint>()
    for (let s = 0; s < this.count; s++) out.add(u64FromParts(this.seqLo[s] as number, this.seqHi[s] as number))
    return out
  }

  /** The sequence hashes held, least recently used first. Cold path. */
  lruOrder(): bigint[] {
    const out: bigint[] = []
    const c = this.capacity
    for (let s = this.next[c] as number; s !== c; s = this.next[s] as number) out.push(u64FromParts(this.seqLo[s] as number, this.seqHi[s] as number))
    return out
  }

  private push(s: number): void {
    const c = this.capacity
    const last = this.prev[c] as number
    this.prev[s] = last
    this.next[s] = c
    this.next[last] = s
    this.prev[c] = s
  }

  private unlink(s: number): void {
    const p = this.prev[s] as number
    const nx = this.next[s] as number
    this.next[p] = nx
    this.prev[nx] = p
  }

  // the device pool's table scheme (block-pool.ts): multiplicative hashing, linear probing,
  // backward-shift deletion
  private home(lo: number, hi: number): number {
    return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> this.shift
  }

  private insert(s: number): void {
    const t = this.table
    const mask = this.mask
    let i = this.home(this.seqLo[s] as number, this.seqHi[s] as number)
    while (t[i] !== EMPTY) i = (i + 1) & mask
    t[i] = s
  }

  private remove(s: number): void {
    const t = this.table
    const mask = this.mask
    let i = this.home(this.seqLo[s] as number, this.seqHi[s] as number)
    while (t[i] !== s) i = (i + 1) & mask
    let j = i
    for (;;) {
      j = (j + 1) & mask
      const x = t[j] as number
      if (x === EMPTY) break
      const h = this.home(this.seqLo[x] as number, this.seqHi[x] as number)
      if (i <= j ? h <= i || h > j : h <= i && h > j) {
        t[i] = x
        i = j
      }
    }
    t[i] = EMPTY
  }
}
