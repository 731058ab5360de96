// Open-addressing hash table from a 32-bit key hash to a record slot, for the index's two maps
// (children by (parent, tokens_hash); entries by (worker, block_hash)). A cell packs 6 bits of
// the hash above a 26-bit slot, so a probe sequence stays inside one or two cache lines and only
// a fingerprint match reads the record itself to compare the full key. The table never sees the
// keys, so growing it is the owner's job: it re-inserts every live record (see `needsRebuild`).
//
// Deletion leaves a tombstone, unless the next cell is empty: then the cell and the tombstones
// just before it become empty again. Tombstones are reused by inserts and dropped by rebuilds.

export const SLOT_BITS = 26
export const SLOT_MASK = (1 << SLOT_BITS) - 1
/** Largest slot a cell can name; the two top values are the sentinels below. */
export const MAX_SLOT = SLOT_MASK - 2
const EMPTY = -1
const TOMB = -2
const MAX_LOAD = 0.75
/** Load right after a rebuild. Sizes are not powers of two, so this holds exactly. */
const TARGET_LOAD = 0.55
const TWO32 = 4294967296

export class SlotTable {
  cells: Int32Array<ArrayBuffer>
  private size: number
  /** Cells holding a slot. */
  live = 0
  /** Cells holding a slot or a tombstone. */
  private used = 0
  private i = 0
  private fp = 0

  constructor(size = 16) {
    this.cells = new Int32Array(size).fill(EMPTY)
    this.size = size
  }

  /** Home cell: a multiply-high of re-mixed bits, so it is independent of the fingerprint. */
  private home(hash: number): number {
    return Math.floor(((Math.imul(hash, 0x9e3779b1) >>> 0) * this.size) / TWO32)
  }

  /**
   * The slot in `hash`'s home cell, or -1 when it holds none: a single load, made ahead of the
   * real probe so that its cache miss overlaps others (see KvIndex.warm).
   */
  peekHome(hash: number): number {
    const v = this.cells[this.home(hash)] as number
    return v === EMPTY || v === TOMB ? -1 : v & SLOT_MASK
  }

  /** First slot whose fingerprint matches `hash`, or -1; continue with `next()`. */
  first(hash: number): number {
    this.fp = hash >>> SLOT_BITS
    this.i = this.home(hash)
    return this.scan()
  }

  next(): number {
    this.i = this.i + 1 === this.size ? 0 : this.i + 1
    return this.scan()
  }

  private scan(): number {
    const cells = this.cells
    const size = this.size
    const fp = this.fp
    let i = this.i
    for (;;) {
      const v = cells[i] as number
      if (v === EMPTY) {
        this.i = i
        return -1
      }
      if (v !== TOMB && v >>> SLOT_BITS === fp) {
        this.i = i
        return v & SLOT_MASK
      }
      if (++i === size) i = 0
    }
  }

  /** Adds a slot under `hash`; the caller knows it is absent. */
  insert(hash: number, slot: number): void {
    const cells = this.cells
    const size = this.size
    let i = this.home(hash)
    for (;;) {
      const v = cells[i] as number
      if (v === EMPTY) {
        this.used++
        break
      }
      if (v === TOMB) break
      if (++i === size) i = 0
    }
    cells[i] = ((hash >>> SLOT_BITS) << SLOT_BITS) | slot
    this.live++
  }

  /** Removes the cell that holds `slot` under `hash`; false when there is none. */
  remove(hash: number, slot: number): boolean {
    const want = ((hash >>> SLOT_BITS) << SLOT_BITS) | slot
    const cells = this.cells
    const size = this.size
    for (let i = this.home(hash); ; i = i + 1 === size ? 0 : i + 1) {
      const v = cells[i] as number
      if (v === EMPTY) return false
      if (v === want) {
        // A cell followed by an empty one ends every probe through it, so it can be empty too,
        // and so can the tombstones before it: fewer tombstones for probes to step over.
        if (cells[i + 1 === size ? 0 : i + 1] === EMPTY) {
          cells[i] = EMPTY
          this.used--
          for (let j = i === 0 ? size - 1 : i - 1; cells[j] === TOMB; j = j === 0 ? size - 1 : j - 1) {
            cells[j] = EMPTY
            this.used--
          }
        } else cells[i] = TOMB
        this.live--
        return true
      }
    }
  }

  /** True when the owner should call `reset()` and re-insert every live slot. */
  get needsRebuild(): boolean {
    return this.used > this.cells.length * MAX_LOAD
  }

  /** The slots currently held, in cell order: what a rebuild re-inserts without a full scan. */
  liveSlots(): Int32Array {
    const out = new Int32Array(this.live)
    let n = 0
    const cells = this.cells
    for (let i = 0; i < cells.length; i++) {
      const v = cells[i] as number
      if (v !== EMPTY && v !== TOMB) out[n++] = v & SLOT_MASK
    }
    return out
  }

  /** Empties the table, sized so `live` records fill TARGET_LOAD of it. */
  reset(live: number): void {
    const size = Math.max(16, Math.ceil(live / TARGET_LOAD))
    if (size !== this.cells.length) {
      this.cells = new Int32Array(size)
      this.size = size
    }
    this.cells.fill(EMPTY)
    this.live = 0
    this.used = 0
  }

  get bytes(): number {
    return this.cells.byteLength
  }
}
