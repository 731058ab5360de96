// The bytes a socket delivered and a decoder has not consumed yet. A chunk that arrives while
// nothing is pending is read in place; only a remainder is copied. Slices handed out by take()
// are views that stay valid: new bytes are only ever written past the last byte handed out.

export class ByteQueue {
  private buf: Buffer = Buffer.alloc(0)
  private start = 0
  private end = 0
  /** Whether buf is ours to write past end (a chunk we were given is not). */
  private owned = false

  get length(): number {
    return this.end - this.start
  }

  push(chunk: Buffer): void {
    if (chunk.length === 0) return
    if (this.start === this.end) {
      this.buf = chunk
      this.start = 0
      this.end = chunk.length
      this.owned = false
      return
    }
    if (this.owned && this.buf.length - this.end >= chunk.length) {
      chunk.copy(this.buf, this.end)
      this.end += chunk.length
      return
    }
    const need = this.length + chunk.length
    const next = Buffer.allocUnsafe(Math.max(64 * 1024, need * 2))
    this.buf.copy(next, 0, this.start, this.end)
    chunk.copy(next, this.length)
    this.buf = next
    this.start = 0
    this.end = need
    this.owned = true
  }

  u16(at: number): number {
    return this.buf.readUInt16BE(this.start + at)
  }

  u32(at: number): number {
    return this.buf.readUInt32BE(this.start + at)
  }

  /** A u64 as a number: exact below 2^53, and far above any size limit past it. */
  u64(at: number): number {
    const p = this.start + at
    return this.buf.readUInt32BE(p) * 4294967296 + this.buf.readUInt32BE(p + 4)
  }

  /** The next n bytes, as a view; they are consumed. */
  take(n: number): Buffer {
    const out = this.buf.subarray(this.start, this.start + n)
    this.skip(n)
    return out
  }

  /** A view of n bytes at offset at, not consumed. */
  peek(at: number, n: number): Buffer {
    return this.buf.subarray(this.start + at, this.start + at + n)
  }

  skip(n: number): void {
    this.start += n
    if (this.start === this.end) {
      // nothing pending: the next chunk is read in place
      this.buf = Buffer.alloc(0)
      this.start = 0
      this.end = 0
      this.owned = false
    }
  }
}
