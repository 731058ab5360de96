// Dynamo's TwoPartCodec (lib/runtime/src/pipeline/network/codec/two_part.rs@5b7cf2be):
//
//   u64 BE header length | u64 BE body length | u64 BE checksum | header | body
//
// The checksum is XXH3-64 (seed 0) of header and body together. Older releases check it on every
// message; newer release builds write 0 and check only a nonzero one (the reference's
// two_part.rs@5448e69a), so kv-router always writes the real checksum and checks a nonzero one.
// The request's control header and body, the call-home handshake, prologue, data and control
// messages of a response stream all travel in this framing.
import { KvrError } from '../errors.js'
import { xxh3_64 } from '../codec/hashing.js'
import { ByteQueue } from './byte-queue.js'
import { DEFAULT_MAX_MESSAGE_BYTES } from './tcp-frame.js'

export interface TwoPartMessage {
  /** Empty when the message has no header. */
  header: Buffer
  /** Empty when the message has no body. */
  body: Buffer
}

const PREFIX = 24

/** XXH3-64 (seed 0) of a ‖ b. */
function checksumOf(a: Uint8Array, b: Uint8Array): bigint {
  if (b.length === 0) return xxh3_64(a, 0n)
  if (a.length === 0) return xxh3_64(b, 0n)
  return xxh3_64(Buffer.concat([a, b]), 0n)
}

/** One message's bytes. Throws KVR_ERR_FRAME_TOO_LARGE. */
export function encodeTwoPart(header: Uint8Array, body: Uint8Array, max = DEFAULT_MAX_MESSAGE_BYTES): Buffer {
  const total = PREFIX + header.length + body.length
  if (total > max) throw new KvrError('KVR_ERR_FRAME_TOO_LARGE', `a two-part message of ${total} bytes is larger than the limit of ${max} bytes`)
  const out = Buffer.allocUnsafe(total)
  out.writeBigUInt64BE(BigInt(header.length), 0)
  out.writeBigUInt64BE(BigInt(body.length), 8)
  out.writeBigUInt64BE(checksumOf(header, body), 16)
  out.set(header, PREFIX)
  out.set(body, PREFIX + header.length)
  return out
}

/** Two-part messages from a byte stream. After push() throws, the stream is unusable. */
export class TwoPartDecoder {
  private readonly q = new ByteQueue()
  constructor(private readonly max = DEFAULT_MAX_MESSAGE_BYTES) {}

  /** Bytes received and not yet a whole message. */
  get buffered(): number {
    return this.q.length
  }

  /** Calls `message` with each complete message (views). Throws KVR_ERR_FRAME_TOO_LARGE or KVR_ERR_FRAME_MALFORMED. */
  push(chunk: Buffer, message: (m: TwoPartMessage) => void): void {
    const q = this.q
    q.push(chunk)
    while (q.length >= PREFIX) {
      const headerLen = q.u64(0)
      const bodyLen = q.u64(8)
      const total = PREFIX + headerLen + bodyLen
      if (total > this.max) throw new KvrError('KVR_ERR_FRAME_TOO_LARGE', `a two-part message of ${total} bytes is larger than the limit of ${this.max} bytes`)
      if (q.length < total) return
      const sumHi = q.u32(16)
      const sumLo = q.u32(20)
      q.skip(PREFIX)
      const header = q.take(headerLen)
      const body = q.take(bodyLen)
      if ((sumHi !== 0 || sumLo !== 0) && checksumOf(header, body) !== ((BigInt(sumHi) << 32n) | BigInt(sumLo)))
        throw new KvrError('KVR_ERR_FRAME_MALFORMED', 'a two-part message whose checksum does not match its bytes')
      message({ header, body })
    }
  }
}
