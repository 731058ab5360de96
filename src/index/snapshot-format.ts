// The index's binary snapshot (docs/architecture.md, "Snapshots"): one versioned layout that every
// shard writes straight from its typed arrays (KvIndex.writeSnapshotPart) and loads straight back
// (KvIndex.loadSnapshotPart), with no event objects, no text and no bigints. This module is the
// layout and its checks; the main thread only assembles parts and reads the header, and each
// shard checks the parts it loads before anything is applied.
//
//   file   header (32 bytes) · part table (16 bytes a part) · parts, each at an 8-aligned offset
//   part   head (16 bytes) · workers · nodes as columns · entries as columns
//          [· lower-tier blocks: a u32 count, then LOWER.words u32 per block]
//
// The lower-tier section is there only when the part holds lower-tier (host_pinned, disk,
// external) blocks; a snapshot with such a part is version 2, one without is version 1 as
// before, and both are read (a version 1 part is a part without the section).
// Integers are little-endian u32 (a u64 is two, low half first); the columns are read through
// typed-array views, so a part is never copied on a little-endian host (a big-endian one refuses
// snapshots). Nodes come parents first, so a node names its parent by a smaller index: a
// snapshot cannot describe a cycle, and one pass loads it.
import { crc32 } from 'node:zlib'
import { KvrError } from '../errors.js'

export const SNAPSHOT_MAGIC = 'KVRSNAP\0'
export const SNAPSHOT_VERSION = 1
/** The version of a snapshot some part of which holds lower-tier blocks. */
export const SNAPSHOT_VERSION_TIERS = 2

/** Header fields, by byte offset. `crc` covers the header before it and the whole part table. */
export const HEADER = { magic: 0, version: 8, parts: 12, lengthLo: 16, lengthHi: 20, flags: 24, crc: 28, bytes: 32 } as const
/** A part table row: where a part lies in the file. */
export const TABLE_ROW = { offsetLo: 0, offsetHi: 4, length: 8, reserved: 12, bytes: 16 } as const
/** A part's head. `crc` covers the part's bytes but itself. */
export const PART_HEAD = { workers: 0, nodes: 4, entries: 8, crc: 12, bytes: 16 } as const
/** A worker-rank of a part, in u32 words. */
export const WORKER = { idLo: 0, idHi: 1, rank: 2, flags: 3, lastIdLo: 4, lastIdHi: 5, words: 6 } as const
/** Worker flag: lastIdLo/Hi hold the id of the last event applied for it. */
export const WORKER_LAST_ID = 1
/**
 * A lower-tier block, in u32 words: its worker-rank in the part (bits 0–15), its tier − 1 (bits
 * 16–17: host_pinned, disk, external) and LOWER_HAS_PARENT; its parent hash (0 without one),
 * tokens hash and block hash; a reserved word (0).
 */
export const LOWER = { ownerTier: 0, parentLo: 1, parentHi: 2, tokLo: 3, tokHi: 4, blockLo: 5, blockHi: 6, reserved: 7, words: 8 } as const
export const LOWER_HAS_PARENT = 1 << 20
const LOWER_KNOWN = 0xffff | (3 << 16) | LOWER_HAS_PARENT

/**
 * A node's `up` word: bits 0–29 name its parent (UP_ROOT, node k as k + 1, or UP_DETACHED for the
 * top of a subtree cut off the tree and kept for re-linking), bit 31 is the index's MIXED flag
 * (a child may hold a worker this node does not); bit 30 is reserved (0).
 */
export const UP_ROOT = 0
export const UP_DETACHED = 0x3fffffff
export const UP_REF_MASK = 0x3fffffff
export const UP_MIXED = 0x80000000
const UP_RESERVED = 0x40000000
/** Worker-ranks a part can name: entries name them by a u16. */
export const MAX_PART_WORKERS = 0xffff
const PART_ALIGN = 8

const LITTLE_ENDIAN = new Uint8Array(Uint32Array.of(1).buffer)[0] === 1

/** Byte offsets of a part's columns, and its length. */
export interface PartLayout {
  workers: number
  up: number
  tokLo: number
  tokHi: number
  count: number
  blockLo: number
  blockHi: number
  owner: number
  length: number
}

/** The layout of a part of `w` worker-ranks, `n` nodes and `e` entries. */
export function partLayout(w: number, n: number, e: number): PartLayout {
  const workers = PART_HEAD.bytes
  const up = workers + 4 * WORKER.words * w
  const tokLo = up + 4 * n
  const tokHi = tokLo + 4 * n
  const count = tokHi + 4 * n
  const blockLo = count + 4 * n
  const blockHi = blockLo + 4 * e
  const owner = blockHi + 4 * e
  // arithmetic, not bitwise: counts read from a damaged head must not wrap around to a plausible length
  const length = Math.ceil((owner + 2 * e) / 4) * 4
  return { workers, up, tokLo, tokHi, count, blockLo, blockHi, owner, length }
}

function invalid(message: string): KvrError {
  return new KvrError('KVR_ERR_SNAPSHOT_INVALID', message)
}

function endianCheck(): void {
  if (!LITTLE_ENDIAN) throw invalid('binary snapshots are read and written on little-endian hosts only')
}

function view(b: Uint8Array): DataView {
  return new DataView(b.buffer, b.byteOffset, b.byteLength)
}

/** Lower-tier blocks a part of `base` bytes (its layout's length) and `bytes` in all holds, or −1 when the sizes disagree. */
function lowerCount(bytes: Uint8Array, base: number): number {
  if (bytes.length === base) return 0
  if (bytes.length < base + 4) return -1
  const l = view(bytes).getUint32(base, true)
  return bytes.length === base + 4 + 4 * LOWER.words * l ? l : -1
}

/**
 * One part as typed-array views over its bytes (which must start 4-aligned in their buffer).
 * The views are not checked: checkPart is.
 */
export class SnapshotPart {
  readonly workers: number
  readonly nodes: number
  readonly entries: number
  /** WORKER.words u32 per worker-rank. */
  readonly worker: Uint32Array
  readonly up: Uint32Array
  readonly tokLo: Uint32Array
  readonly tokHi: Uint32Array
  /** Entries per node; a node's entries follow those of the nodes before it. */
  readonly count: Uint32Array
  readonly blockLo: Uint32Array
  readonly blockHi: Uint32Array
  /** The worker-rank (index into `worker`) of each entry. */
  readonly owner: Uint16Array
  readonly lowerBlocks: number
  /** LOWER.words u32 per lower-tier block. */
  readonly lower: Uint32Array

  constructor(readonly bytes: Uint8Array) {
    endianCheck()
    const v = view(bytes)
    this.workers = v.getUint32(PART_HEAD.workers, true)
    this.nodes = v.getUint32(PART_HEAD.nodes, true)
    this.entries = v.getUint32(PART_HEAD.entries, true)
    const l = partLayout(this.workers, this.nodes, this.entries)
    if (bytes.length < l.length) throw invalid(`a part of ${bytes.length} bytes says it holds ${l.length}`)
    const lower = lowerCount(bytes, l.length)
    if (lower < 0) throw invalid(`a part of ${bytes.length} bytes says it holds ${l.length} and a lower-tier section that does not fit`)
    this.lowerBlocks = lower
    if (bytes.byteOffset % 4 !== 0) throw invalid('a part is not 4-aligned')
    const u32 = (at: number, n: number): Uint32Array => new Uint32Array(bytes.buffer, bytes.byteOffset + at, n)
    this.worker = u32(l.workers, WORKER.words * this.workers)
    this.up = u32(l.up, this.nodes)
    this.tokLo = u32(l.tokLo, this.nodes)
    this.tokHi = u32(l.tokHi, this.nodes)
    this.count = u32(l.count, this.nodes)
    this.blockLo = u32(l.blockLo, this.entries)
    this.blockHi = u32(l.blockHi, this.entries)
    this.owner = new Uint16Array(bytes.buffer, bytes.byteOffset + l.owner, this.entries)
    this.lower = lower === 0 ? new Uint32Array(0) : u32(l.length + 4, LOWER.words * lower)
  }

  workerIdLo(i: number): number {
    return this.worker[i * WORKER.words + WORKER.idLo] as number
  }
  workerIdHi(i: number): number {
    return this.worker[i * WORKER.words + WORKER.idHi] as number
  }
  workerRank(i: number): number {
    return this.worker[i * WORKER.words + WORKER.rank] as number
  }
}

/** A new part of these counts, zeroed, its head written (the crc by sealPart, once it is filled). */
export function newPart(workers: number, nodes: number, entries: number, lower = 0): SnapshotPart {
  if (workers > MAX_PART_WORKERS) throw invalid(`a part holds at most ${MAX_PART_WORKERS} worker-ranks, not ${workers}`)
  const base = partLayout(workers, nodes, entries).length
  const bytes = new Uint8Array(lower === 0 ? base : base + 4 + 4 * LOWER.words * lower)
  const v = view(bytes)
  if (lower > 0) v.setUint32(base, lower, true)
  v.setUint32(PART_HEAD.workers, workers, true)
  v.setUint32(PART_HEAD.nodes, nodes, true)
  v.setUint32(PART_HEAD.entries, entries, true)
  return new SnapshotPart(bytes)
}

function partCrc(bytes: Uint8Array): number {
  return crc32(bytes.subarray(PART_HEAD.crc + 4), crc32(bytes.subarray(0, PART_HEAD.crc)))
}

/** Writes a filled part's crc into its head. */
export function sealPart(part: SnapshotPart): Uint8Array {
  view(part.bytes).setUint32(PART_HEAD.crc, partCrc(part.bytes), true)
  return part.bytes
}

/**
 * A part checked whole before any of it is applied: its crc, and every reference in it (each
 * node's parent before it, at least one entry per node and the counts adding up, each entry's
 * worker-rank in the part, no worker-rank twice, no unknown flag). Throws KVR_ERR_SNAPSHOT_INVALID.
 */
export function checkPart(bytes: Uint8Array, where = 'a part'): SnapshotPart {
  if (bytes.length < PART_HEAD.bytes) throw invalid(`${where} is truncated: ${bytes.length} bytes`)
  const p = new SnapshotPart(bytes)
  const want = view(bytes).getUint32(PART_HEAD.crc, true)
  if (partCrc(bytes) !== want) throw invalid(`${where} is corrupt: its checksum does not match`)
  if (p.workers > MAX_PART_WORKERS) throw invalid(`${where} names ${p.workers} worker-ranks, more than ${MAX_PART_WORKERS}`)
  const seen = new Set<string>()
  for (let i = 0; i < p.workers; i++) {
    const key = `${p.workerIdLo(i)}:${p.workerIdHi(i)}:${p.workerRank(i)}`
    if (seen.has(key)) throw invalid(`${where} names worker-rank ${key} twice`)
    seen.add(key)
    if (((p.worker[i * WORKER.words + WORKER.flags] as number) & ~WORKER_LAST_ID) !== 0) throw invalid(`${where}: worker-rank ${i} has unknown flags`)
  }
  let total = 0
  const { up, count, owner } = p
  for (let i = 0; i < p.nodes; i++) {
    const u = up[i] as number
    const ref = u & UP_REF_MASK
    if ((u & UP_RESERVED) !== 0) throw invalid(`${where}: node ${i} has unknown flags`)
    if (ref !== UP_DETACHED && ref > i) throw invalid(`${where}: node ${i} names node ${ref - 1} as its parent, which does not come before it`)
    const c = count[i] as number
    if (c === 0) throw invalid(`${where}: node ${i} has no entry`)
    total += c
  }
  if (total !== p.entries) throw invalid(`${where}: its nodes hold ${total} entries, its head says ${p.entries}`)
  for (let j = 0; j < p.entries; j++) if ((owner[j] as number) >= p.workers) throw invalid(`${where}: entry ${j} names worker-rank ${owner[j]} of ${p.workers}`)
  const q = p.lower
  for (let j = 0; j < p.lowerBlocks; j++) {
    const ot = q[j * LOWER.words + LOWER.ownerTier] as number
    if ((ot & ~LOWER_KNOWN) !== 0 || ((ot >>> 16) & 3) === 3 || q[j * LOWER.words + LOWER.reserved] !== 0)
      throw invalid(`${where}: lower-tier block ${j} has unknown flags`)
    if ((ot & 0xffff) >= p.workers) throw invalid(`${where}: lower-tier block ${j} names worker-rank ${ot & 0xffff} of ${p.workers}`)
  }
  return p
}

/** Where a part lies in a snapshot, and what its head says it holds. */
export interface PartRef {
  offset: number
  length: number
  workers: number
  nodes: number
  entries: number
}

/** One snapshot of the parts (each sealed), as its bytes. */
export function assembleSnapshot(parts: readonly Uint8Array[]): Uint8Array {
  endianCheck()
  const tableEnd = HEADER.bytes + TABLE_ROW.bytes * parts.length
  let at = align(tableEnd)
  const offsets: number[] = []
  for (const p of parts) {
    offsets.push(at)
    at = align(at + p.length)
  }
  const out = new Uint8Array(at)
  const v = view(out)
  for (let i = 0; i < SNAPSHOT_MAGIC.length; i++) out[HEADER.magic + i] = SNAPSHOT_MAGIC.charCodeAt(i)
  const tiers = parts.some(hasLowerSection)
  v.setUint32(HEADER.version, tiers ? SNAPSHOT_VERSION_TIERS : SNAPSHOT_VERSION, true)
  v.setUint32(HEADER.parts, parts.length, true)
  v.setUint32(HEADER.lengthLo, at >>> 0, true)
  v.setUint32(HEADER.lengthHi, Math.floor(at / 2 ** 32), true)
  parts.forEach((p, i) => {
    const row = HEADER.bytes + TABLE_ROW.bytes * i
    const off = offsets[i] as number
    v.setUint32(row + TABLE_ROW.offsetLo, off >>> 0, true)
    v.setUint32(row + TABLE_ROW.offsetHi, Math.floor(off / 2 ** 32), true)
    v.setUint32(row + TABLE_ROW.length, p.length, true)
    out.set(p, off)
  })
  v.setUint32(HEADER.crc, headerCrc(out, tableEnd), true)
  return out
}

/** Whether a part carries the lower-tier section (its bytes run past its layout). */
function hasLowerSection(p: Uint8Array): boolean {
  const v = view(p)
  return p.length > partLayout(v.getUint32(PART_HEAD.workers, true), v.getUint32(PART_HEAD.nodes, true), v.getUint32(PART_HEAD.entries, true)).length
}

const align = (n: number): number => Math.ceil(n / PART_ALIGN) * PART_ALIGN

function headerCrc(b: Uint8Array, tableEnd: number): number {
  return crc32(b.subarray(HEADER.bytes, tableEnd), crc32(b.subarray(0, HEADER.crc)))
}

/** True when `bytes` starts as a binary snapshot does (whatever its version). */
export function isBinarySnapshot(bytes: Uint8Array): boolean {
  if (bytes.length < SNAPSHOT_MAGIC.length) return false
  for (let i = 0; i < SNAPSHOT_MAGIC.length; i++) if (bytes[i] !== SNAPSHOT_MAGIC.charCodeAt(i)) return false
  return true
}

/**
 * The parts of a snapshot, after checking its header and part table: magic, version, length
 * (a truncated snapshot is refused here), checksum, and that every part lies inside the file,
 * aligned, in order, as long as its head says. The parts themselves are checked by checkPart.
 * Throws KVR_ERR_SNAPSHOT_INVALID.
 */
export function readSnapshot(bytes: Uint8Array): PartRef[] {
  endianCheck()
  if (!isBinarySnapshot(bytes)) throw invalid('not a kv-router binary snapshot (no KVRSNAP header)')
  if (bytes.length < HEADER.bytes) throw invalid(`truncated: ${bytes.length} bytes, less than its header`)
  const v = view(bytes)
  const version = v.getUint32(HEADER.version, true)
  if (version !== SNAPSHOT_VERSION && version !== SNAPSHOT_VERSION_TIERS)
    throw invalid(`version ${version}; this router reads versions ${SNAPSHOT_VERSION} and ${SNAPSHOT_VERSION_TIERS}`)
  const length = v.getUint32(HEADER.lengthLo, true) + v.getUint32(HEADER.lengthHi, true) * 2 ** 32
  if (bytes.length < length) throw invalid(`truncated: ${bytes.length} of its ${length} bytes`)
  if (bytes.length > length) throw invalid(`${bytes.length} bytes where its header says ${length}`)
  const n = v.getUint32(HEADER.parts, true)
  const tableEnd = HEADER.bytes + TABLE_ROW.bytes * n
  if (tableEnd > length) throw invalid(`its part table (${n} parts) runs past its end`)
  if (headerCrc(bytes, tableEnd) !== v.getUint32(HEADER.crc, true)) throw invalid('corrupt: the checksum of its header does not match')
  if (v.getUint32(HEADER.flags, true) !== 0) throw invalid('its header has unknown flags')
  const parts: PartRef[] = []
  let end = tableEnd
  for (let i = 0; i < n; i++) {
    const row = HEADER.bytes + TABLE_ROW.bytes * i
    const offset = v.getUint32(row + TABLE_ROW.offsetLo, true) + v.getUint32(row + TABLE_ROW.offsetHi, true) * 2 ** 32
    const len = v.getUint32(row + TABLE_ROW.length, true)
    if (v.getUint32(row + TABLE_ROW.reserved, true) !== 0) throw invalid(`part ${i}: its row in the part table has unknown fields`)
    if (offset % PART_ALIGN !== 0 || offset < end || offset + len > length || len < PART_HEAD.bytes)
      throw invalid(`part ${i} (${len} bytes at ${offset}) does not lie in order inside the snapshot`)
    const workers = v.getUint32(offset + PART_HEAD.workers, true)
    const nodes = v.getUint32(offset + PART_HEAD.nodes, true)
    const entries = v.getUint32(offset + PART_HEAD.entries, true)
    const base = partLayout(workers, nodes, entries).length
    if (len < base || lowerCount(bytes.subarray(offset, offset + len), base) < 0 || (version === SNAPSHOT_VERSION && len !== base))
      throw invalid(`part ${i} is ${len} bytes, its head says otherwise`)
    zeros(bytes, end, offset)
    parts.push({ offset, length: len, workers, nodes, entries })
    end = offset + len
  }
  zeros(bytes, end, length)
  return parts
}

/** The padding between parts is zero: no byte of a snapshot goes unchecked. */
function zeros(b: Uint8Array, from: number, to: number): void {
  for (let i = from; i < to; i++) if (b[i] !== 0) throw invalid(`corrupt: byte ${i}, between its parts, is not zero`)
}

/** The worker ids (lo, hi) a part names, from its bytes as they are (before checkPart: for routing it). */
export function partWorkerIds(bytes: Uint8Array, part: PartRef, each: (lo: number, hi: number) => void): void {
  const v = view(bytes)
  for (let i = 0; i < part.workers; i++) {
    const at = part.offset + PART_HEAD.bytes + 4 * (i * WORKER.words)
    each(v.getUint32(at + 4 * WORKER.idLo, true), v.getUint32(at + 4 * WORKER.idHi, true))
  }
}
