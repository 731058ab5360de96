// MessagePack written the way Rust's rmp-serde (`to_vec_named`) writes it, which is how a Dynamo
// worker encodes its event-plane envelopes and RouterEvents: every integer in its most compact
// form (positive fixint, then u8/u16/u32/u64; negative fixint, then i8…i64), strings as fixstr /
// str8 / str16 / str32, byte strings as bin8 / bin16 / bin32, maps and arrays with the smallest
// header (3Hren/msgpack-rust rmp-serde/src/encode.rs@21b206ce). msgpackr is not used here because it writes integers beyond 32 bits as doubles unless
// they are bigints, and bigints always as 64-bit: a reader would see other bytes than a worker's.
//
// One writer is reused for every message of a publisher: the buffer grows and is kept.

const utf8 = new TextEncoder()

export class MsgpackWriter {
  private buf: Buffer
  private pos = 0

  constructor(initial = 1024) {
    this.buf = Buffer.allocUnsafe(initial)
  }

  /** Starts a new message (the previous bytes are dropped). */
  reset(): this {
    this.pos = 0
    return this
  }

  /** A copy of the bytes written since the last reset. */
  bytes(): Buffer {
    return Buffer.from(this.buf.subarray(0, this.pos))
  }

  get length(): number {
    return this.pos
  }

  private room(n: number): void {
    if (this.pos + n <= this.buf.length) return
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.pos + n))
    this.buf.copy(next, 0, 0, this.pos)
    this.buf = next
  }

  private byte(b: number): void {
    this.room(1)
    this.buf[this.pos++] = b
  }

  nil(): this {
    this.byte(0xc0)
    return this
  }

  bool(v: boolean): this {
    this.byte(v ? 0xc3 : 0xc2)
    return this
  }

  /** An unsigned integer (a number ≤ 2^53 − 1 or a bigint < 2^64), most compact form. */
  uint(v: number | bigint): this {
    if (typeof v === 'bigint') {
      if (v < 0n || v > 0xffffffffffffffffn) throw new RangeError(`${v} is not a u64`)
      if (v <= 0xffffffffn) return this.uint(Number(v))
      this.room(9)
      this.buf[this.pos] = 0xcf
      this.buf.writeBigUInt64BE(v, this.pos + 1)
      this.pos += 9
      return this
    }
    if (!Number.isInteger(v) || v < 0 || v > Number.MAX_SAFE_INTEGER) throw new RangeError(`${v} is not an unsigned integer`)
    if (v < 0x80) this.byte(v)
    else if (v <= 0xff) {
      this.room(2)
      this.buf[this.pos] = 0xcc
      this.buf[this.pos + 1] = v
      this.pos += 2
    } else if (v <= 0xffff) {
      this.room(3)
      this.buf[this.pos] = 0xcd
      this.buf.writeUInt16BE(v, this.pos + 1)
      this.pos += 3
    } else if (v <= 0xffffffff) {
      this.room(5)
      this.buf[this.pos] = 0xce
      this.buf.writeUInt32BE(v, this.pos + 1)
      this.pos += 5
    } else {
      this.room(9)
      this.buf[this.pos] = 0xcf
      this.buf.writeBigUInt64BE(BigInt(v), this.pos + 1)
      this.pos += 9
    }
    return this
  }

  /** A signed integer: non-negative ones as uint (as rmp does), negative ones most compact. */
  int(v: number): this {
    if (v >= 0) return this.uint(v)
    if (!Number.isInteger(v) || v < Number.MIN_SAFE_INTEGER) throw new RangeError(`${v} is not an integer`)
    if (v >= -32) this.byte(v & 0xff)
    else if (v >= -0x80) {
      this.room(2)
      this.buf[this.pos] = 0xd0
      this.buf.writeInt8(v, this.pos + 1)
      this.pos += 2
    } else if (v >= -0x8000) {
      this.room(3)
      this.buf[this.pos] = 0xd1
      this.buf.writeInt16BE(v, this.pos + 1)
      this.pos += 3
    } else if (v >= -0x80000000) {
      this.room(5)
      this.buf[this.pos] = 0xd2
      this.buf.writeInt32BE(v, this.pos + 1)
      this.pos += 5
    } else {
      this.room(9)
      this.buf[this.pos] = 0xd3
      this.buf.writeBigInt64BE(BigInt(v), this.pos + 1)
      this.pos += 9
    }
    return this
  }

  float(v: number): this {
    this.room(9)
    this.buf[this.pos] = 0xcb
    this.buf.writeDoubleBE(v, this.pos + 1)
    this.pos += 9
    return this
  }

  private header(n: number, fix: number, fixMax: number, c8: number | null, c16: number, c32: number): void {
    if (n <= fixMax) this.byte(fix | n)
    else if (c8 !== null && n <= 0xff) {
      this.room(2)
      this.buf[this.pos] = c8
      this.buf[this.pos + 1] = n
      this.pos += 2
    } else if (n <= 0xffff) {
      this.room(3)
      this.buf[this.pos] = c16
      this.buf.writeUInt16BE(n, this.pos + 1)
      this.pos += 3
    } else {
      this.room(5)
      this.buf[this.pos] = c32
      this.buf.writeUInt32BE(n, this.pos + 1)
      this.pos += 5
    }
  }

  str(s: string): this {
    // an ASCII key (every field name) needs no encoder
    let ascii = true
    for (let i = 0; i < s.length; i++) {
      if (s.charCodeAt(i) > 0x7f) {
        ascii = false
        break
      }
    }
    if (ascii) {
      this.header(s.length, 0xa0, 31, 0xd9, 0xda, 0xdb)
      this.room(s.length)
      this.buf.write(s, this.pos, 'latin1')
      this.pos += s.length
      return this
    }
    const b = utf8.encode(s)
    this.header(b.length, 0xa0, 31, 0xd9, 0xda, 0xdb)
    this.raw(b)
    return this
  }

  bin(b: Uint8Array): this {
    if (b.length <= 0xff) {
      this.room(2)
      this.buf[this.pos] = 0xc4
      this.buf[this.pos + 1] = b.length
      this.pos += 2
    } else if (b.length <= 0xffff) {
      this.room(3)
      this.buf[this.pos] = 0xc5
      this.buf.writeUInt16BE(b.length, this.pos + 1)
      this.pos += 3
    } else {
      this.room(5)
      this.buf[this.pos] = 0xc6
      this.buf.writeUInt32BE(b.length, this.pos + 1)
      this.pos += 5
    }
    this.raw(b)
    return this
  }

  private raw(b: Uint8Array): void {
    this.room(b.length)
    this.buf.set(b, this.pos)
    this.pos += b.length
  }

  map(n: number): this {
    this.header(n, 0x80, 15, null, 0xde, 0xdf)
    return this
  }

  array(n: number): this {
    this.header(n, 0x90, 15, null, 0xdc, 0xdd)
    return this
  }

  /**
   * Any JSON-like value: null/undefined → nil, integers compact, other numbers as f64, bigint as
   * u64, Uint8Array as bin, arrays, and objects as maps in their key order (undefined members
   * skipped, as serde skips a `skip_serializing_if` field).
   */
  value(v: unknown): this {
    if (v === null || v === undefined) return this.nil()
    switch (typeof v) {
      case 'boolean':
        return this.bool(v)
      case 'number':
        return Number.isInteger(v) && Math.abs(v) <= Number.MAX_SAFE_INTEGER ? this.int(v) : this.float(v)
      case 'bigint':
        return this.uint(v)
      case 'string':
        return this.str(v)
      default:
        break
    }
    if (v instanceof Uint8Array) return this.bin(v)
    if (Array.isArray(v)) {
      this.array(v.length)
      for (const e of v) this.value(e)
      return this
    }
    if (typeof v === 'object') {
      const entries = Object.entries(v as Record<string, unknown>).filter(([, x]) => x !== undefined)
      this.map(entries.length)
      for (const [k, x] of entries) this.str(k).value(x)
      return this
    }
    throw new TypeError(`cannot write a ${typeof v} as MessagePack`)
  }
}
