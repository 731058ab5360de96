// The one MessagePack reader of the decoders that run in the shards (Dynamo's RouterEvents in
// dynamo-msgpack.ts, engines' batches in engine-stream.ts): a cursor over bytes read in place,
// with the header readers and a skip that checks framing. It builds no JS value: callers read
// what they need as numbers or compare bytes, which is why it stays beside msgpackr
// (`npm run bench:zmq` puts this reader at 1.7–1.8× msgpackr's decode rate on engines' batches).
// Errors are the caller's: a subclass says how a truncated or ill-formed value is reported.
import type { KvrError } from '../errors.js'

/** What a value is, from its first byte. */
export const MpKind = { Int: 1, Nil: 2, Str: 3, Bin: 4, Array: 5, Map: 6, Other: 7 } as const

export function mpKindOf(m: number): number {
  if (m <= 0x7f || m >= 0xe0) return MpKind.Int
  if (m <= 0x8f) return MpKind.Map
  if (m <= 0x9f) return MpKind.Array
  if (m <= 0xbf) return MpKind.Str
  if (m === 0xc0) return MpKind.Nil
  if (m >= 0xc4 && m <= 0xc6) return MpKind.Bin
  if (m >= 0xcc && m <= 0xd3) return MpKind.Int
  if (m >= 0xd9 && m <= 0xdb) return MpKind.Str
  if (m === 0xdc || m === 0xdd) return MpKind.Array
  if (m === 0xde || m === 0xdf) return MpKind.Map
  return MpKind.Other
}

export abstract class MsgpackCursor {
  buf: Uint8Array = new Uint8Array(0)
  pos = 0
  end = 0
  /** The last length read from a header. */
  len = 0
  /** Saved element counts of the containers skip() is inside. */
  private readonly levels: Int32Array

  /** maxDepth: how deeply skip() follows nested containers before refusing the value. */
  constructor(readonly maxDepth: number) {
    this.levels = new Int32Array(maxDepth + 1)
  }

  /** The error for a value cut short by the end of the input. */
  abstract truncated(): KvrError
  /** The error for bytes that are no MessagePack (0xc1, or nesting beyond maxDepth). */
  abstract malformed(what: string): KvrError

  reset(bytes: Uint8Array, end: number = bytes.length): void {
    this.buf = bytes
    this.pos = 0
    this.end = end
  }

  u32At(p: number): number {
    const b = this.buf
    return (((b[p] as number) << 24) | ((b[p + 1] as number) << 16) | ((b[p + 2] as number) << 8) | (b[p + 3] as number)) >>> 0
  }

  u16At(p: number): number {
    return ((this.buf[p] as number) << 8) | (this.buf[p + 1] as number)
  }

  /** The length header of the value at pos (array, map, str or bin by `lo`..`lo + 15` fix form and the 8/16/32 markers). */
  private header(fixLo: number, fixMask: number, m8: number, m16: number, m32: number): boolean {
    const buf = this.buf
    const p = this.pos
    const b = buf[p]
    if (b === undefined || p >= this.end) return false
    if (b >= fixLo && b <= fixLo + fixMask) {
      this.len = b & fixMask
      this.pos = p + 1
    } else if (b === m8) {
      if (p + 2 > this.end) throw this.truncated()
      this.len = buf[p + 1] as number
      this.pos = p + 2
    } else if (b === m16) {
      if (p + 3 > this.end) throw this.truncated()
      this.len = this.u16At(p + 1)
      this.pos = p + 3
    } else if (b === m32) {
      if (p + 5 > this.end) throw this.truncated()
      this.len = this.u32At(p + 1)
      this.pos = p + 5
    } else return false
    return true
  }

  /** An array header at pos: true with len set and pos at its first element; false (pos kept) when it is none. */
  arrayHeader(): boolean {
    return this.header(0x90, 0x0f, -1, 0xdc, 0xdd)
  }

  mapHeader(): boolean {
    return this.header(0x80, 0x0f, -1, 0xde, 0xdf)
  }

  strHeader(): boolean {
    return this.header(0xa0, 0x1f, 0xd9, 0xda, 0xdb)
  }

  binHeader(): boolean {
    return this.header(0x100, 0, 0xc4, 0xc5, 0xc6)
  }

  /** Whether the value at p is the string `lit`. */
  isStringAt(p: number, lit: Uint8Array): boolean {
    const save = this.pos
    this.pos = p
    const ok = this.strHeader() && this.len === lit.length && this.bytesAre(this.pos, lit)
    this.pos = save
    return ok
  }

  bytesAre(p: number, lit: Uint8Array): boolean {
    const buf = this.buf
    for (let i = 0; i < lit.length; i++) if (buf[p + i] !== lit[i]) return false
    return true
  }

  /**
   * Moves pos past one whole value, nested ones included, without recursion: `left` counts the
   * values still to pass in the innermost container, `levels` those of the containers around it.
   * Every value takes at least a byte, so a count beyond the bytes left, or a length past the
   * end, is a truncated input.
   */
  skip(): void {
    const buf = this.buf
    const end = this.end
    const levels = this.levels
    let p = this.pos
    let left = 1
    let depth = 0
    for (;;) {
      while (left === 0) {
        if (depth === 0) {
          if (p > end) throw this.truncated()
          this.pos = p
          return
        }
        left = levels[--depth] as number
      }
      const b = buf[p] as number
      left--
      // ints and floats first: token ids are most of an engine batch's bytes (a value cut short
      // at the end leaves p past end, which the check at the end refuses)
      if (b <= 0x7f || b >= 0xe0) {
        p++
        continue
      }
      if (b >= 0xca && b <= 0xd3) {
        p += SCALAR_BYTES[b - 0xca] as number
        continue
      }
      if (p >= end) throw this.truncated()
      p++
      let n = 0
      if (b <= 0x8f) n = 2 * (b & 0x0f)
      else if (b <= 0x9f) n = b & 0x0f
      else if (b <= 0xbf) p += b & 0x1f
      else {
        if (b === 0xc0 || b === 0xc2 || b === 0xc3) continue
        if (b === 0xc1) {
          this.pos = p - 1
          throw this.malformed('byte 0xc1 is never used in MessagePack')
        }
        // the length field that follows, if any, must be there to be read
        const need = LENGTH_BYTES[b - 0xc4] as number
        if (p + need > end) throw this.truncated()
        switch (b) {
          case 0xc4:
          case 0xd9:
            p += 1 + (buf[p] as number)
            break
          case 0xc5:
          case 0xda:
            p += 2 + this.u16At(p)
            break
          case 0xc6:
          case 0xdb:
            p += 4 + this.u32At(p)
            break
          case 0xc7:
            p += 2 + (buf[p] as number)
            break
          case 0xc8:
            p += 3 + this.u16At(p)
            break
          case 0xc9:
            p += 5 + this.u32At(p)
            break
          case 0xdc:
            n = this.u16At(p)
            p += 2
            break
          case 0xdd:
            n = this.u32At(p)
            p += 4
            break
          case 0xde:
            n = 2 * this.u16At(p)
            p += 2
            break
          case 0xdf:
            n = 2 * this.u32At(p)
            p += 4
            break
          default:
            p += FIXED_BYTES[b - 0xc4] as number
        }
      }
      if (n > 0) {
        if (n > end - p) throw this.truncated()
        if (depth === this.maxDepth) {
          this.pos = p
          throw this.malformed('nesting too deep')
        }
        levels[depth++] = left
        left = n
      } else if (p > end) throw this.truncated()
    }
  }
}

/** Bytes of uint8..64, int8..64 with their type byte. */
export const INT_BYTES = [2, 3, 5, 9, 2, 3, 5, 9]
/** Bytes of float32, float64, then INT_BYTES, from type byte 0xca on. */
const SCALAR_BYTES = [5, 9, ...INT_BYTES]

// Per first byte from 0xc4 to 0xdf: the bytes of its length field, and the fixed size of its
// payload for the types that have one (floats, ints, fixext).
// biome-ignore format: one entry per type byte
const LENGTH_BYTES = [
  1, 2, 4, // bin 8/16/32
  2, 3, 5, // ext 8/16/32 (length, then the type byte)
  4, 8, 1, 2, 4, 8, 1, 2, 4, 8, // float32/64, uint8..64, int8..64
  2, 3, 5, 9, 17, // fixext 1/2/4/8/16 (type byte included)
  1, 2, 4, // str 8/16/32
  2, 4, 2, 4, // array 16/32, map 16/32
]
// biome-ignore format: one entry per type byte
const FIXED_BYTES = [
  0, 0, 0,
  0, 0, 0,
  4, 8, 1, 2, 4, 8, 1, 2, 4, 8,
  2, 3, 5, 9, 17,
  0, 0, 0,
  0, 0, 0, 0,
]
