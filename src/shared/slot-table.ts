// Open-addressing hash table from a 32-bit key hash to a record slot, for the index's two maps
// (children by (parent, tokens_hash); entries by (worker, block_hash)). A cell packs 6 bits of
// the hash above a 26-bit slot, so a probe sequence stays inside one or two cache lines and only
// a fingerprint match reads the record itself to compare the full key. The table never sees the
// keys, so growing it is the owner's job: it re-inserts every live record (see `needsRebuild`).
//
// Deletion leaves a tombstone; tombstones are reused by inserts and dropped by rebuilds.

export const SLOT_BITS = 26
export const SLOT_MASK = (1 << SLOT_BITS) - 1
/** Largest slot a cell can name; the two top values are the sentinels below. */
export const MAX_SLOT = SLOT_MASK - 2
const EMPTY = -1
const TOMB = -2
const MAX_LOAD = 0.6

export class SlotTable {
  cells: Int32Array<ArrayBuffer>
  private mask: number
  /** Cells holding a slot. */
  live = 0
  /** Cells holding a slot or a tombstone. */
  private used = 0
  private i = 0
  private fp = 0

  constructor(size = 16) {
    this.cells = new Int32Array(size).fill(EMPTY)
    this.mask = size - 1
  }

  /** First slot whose fingerprint matches `hash`, or -1; continue with `next()`. */
  first(hash: number): number {
    this.fp = hash >>> SLOT_BITS
    this.i = hash & this.mask
    return this.scan()
  }

  next(): number {
    this.i = (this.i + 1) & this.mask
    return this.scan()
  }

  private scan(): number {
    const cells = this.cells
    const mask = this.mask
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
      i = (i + 1) & mask
    }
  }

  /** Adds a slot under `hash`; the caller knows it is absent. */
  insert(hash: number, slot: number): void {
    const cells = this.cells
    const mask = this.mask
    let i = hash & mask
    for (;;) {
      const v = cells[i] as number
      if (v === EMPTY) {
        this.used++
        break
      }
      if (v === TOMB) break
      i = (i + 1) & mask
    }
    cells[i] = ((hash >>> SLOT_BITS) << SLOT_BITS) | slot
    this.live++
  }

  /** Removes the cell that holds `slot` under `hash`; false when there is none. */
  remove(hash: number, slot: number): boolean {
    const want = ((hash >>> SLOT_BITS) << SLOT_BITS) | slot
    const cells = this.cells
    const mask = this.mask
    for (let i = hash & mask; ; i = (i + 1) & mask) {
      const v = cells[i] as number
      if (v === EMPTY) return false
      if (v === want) {
        cells[i] = TOMB
        this.live--
        return true
      }
    }
  }

  /** True when the owner should call `reset()` and re-insert every live slot. */
  get needsRebuild(): boolean {
    return this.used > this.cells.length * MAX_LOAD
  }

  /** Empties the table, sized so `live` records fill at most 60% of it. */
  reset(live: number): void {
    let size = 16
    while (size * 0.45 < live) size *= 2
    if (size !== this.cells.length) {
      this.cells = new Int32Array(size)
      this.mask = size - 1
    }
    this.cells.fill(EMPTY)
    this.live = 0
    this.used = 0
  }

  get bytes(): number {
    return this.cells.byteLength
  }
}
