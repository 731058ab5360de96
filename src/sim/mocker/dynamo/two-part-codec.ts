// Dynamo's TwoPartCodec (lib/runtime/src/pipeline/network/codec/two_part.rs@5448e69a): the message
// inside a TCP request frame, and every message of a response stream.
//
//   u64 BE header length | u64 BE body length | u64 BE checksum | header | body
//
// The checksum is xxh3-64 of header‖body in debug builds and 0 in release builds, and only checked
// when non-zero in a debug build; the mocker writes 0, as a release worker does, and ignores it.

export const TWO_PART_PREFIX = 24

export interface TwoPartMessage {
  /** Empty when the message has no header. */
  header: Buffer
  /** Empty when the message has no body. */
  body: Buffer
}

const EMPTY = Buffer.alloc(0)

/** A header-only, body-only or two-part message. */
export function encodeTwoPart(header: Uint8Array | null, body: Uint8Array | null): Buffer {
  const h = header ?? EMPTY
  const b = body ?? EMPTY
  const out = Buffer.allocUnsafe(TWO_PART_PREFIX + h.length + b.length)
  out.writeBigUInt64BE(BigInt(h.length), 0)
  out.writeBigUInt64BE(BigInt(b.length), 8)
  out.writeBigUInt64BE(0n, 16)
  out.set(h, TWO_PART_PREFIX)
  out.set(b, TWO_PART_PREFIX + h.length)
  return out
}

/** Length of the message at the start of `buf`, or -1 while its prefix is incomplete. */
function messageLength(buf: Buffer, max: number): number {
  if (buf.length < TWO_PART_PREFIX) return -1
  const h = buf.readBigUInt64BE(0)
  const b = buf.readBigUInt64BE(8)
  const total = BigInt(TWO_PART_PREFIX) + h + b
  if (total > BigInt(max)) throw new RangeError(`a two-part message of ${total} bytes exceeds the limit of ${max}`)
  return Number(total)
}

/** Decodes one whole message (a request frame's payload); throws RangeError on bad lengths. */
export function decodeTwoPart(buf: Buffer): TwoPartMessage {
  const n = messageLength(buf, buf.length)
  if (n !== buf.length) throw new RangeError(`a two-part message of ${buf.length} bytes declares ${n < 0 ? 'no complete prefix' : `${n} bytes`}`)
  const h = Number(buf.readBigUInt64BE(0))
  return { header: buf.subarray(TWO_PART_PREFIX, TWO_PART_PREFIX + h), body: buf.subarray(TWO_PART_PREFIX + h) }
}

/** Splits a byte stream into two-part messages. */
export class TwoPartReader {
  private pending: Buffer = EMPTY

  constructor(private readonly maxBytes = 32 * 1024 * 1024) {}

  /** Feeds bytes; returns the messages they complete. Throws RangeError on an oversized one. */
  push(chunk: Buffer): TwoPartMessage[] {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk])
    const out: TwoPartMessage[] = []
    for (;;) {
      const n = messageLength(this.pending, this.maxBytes)
      if (n < 0 || this.pending.length < n) break
      out.push(decodeTwoPart(this.pending.subarray(0, n)))
      this.pending = this.pending.subarray(n)
    }
    return out
  }
}
