// The TCP request plane's frames (lib/runtime/src/pipeline/network/codec.rs@2a26d793), frontend to
// worker, pipelined on one connection:
//
//   u16 BE path length | path (`{instance_id:x}/{endpoint}`) | u16 BE headers length |
//   headers (JSON object of strings) | u32 BE payload length | payload (a TwoPartCodec message)
//
// and one reply per frame, in order: `u32 BE length | bytes`, empty for "accepted", else an error
// text such as `Server overloaded: …` that the frontend turns into a 503.

export interface RequestFrame {
  path: string
  headers: Record<string, string>
  payload: Buffer
}

const EMPTY = Buffer.alloc(0)

/** A reply: the length prefix and the text (empty = the ACK). */
export function encodeReply(text: string): Buffer {
  const body = Buffer.from(text, 'utf8')
  const out = Buffer.allocUnsafe(4 + body.length)
  out.writeUInt32BE(body.length, 0)
  body.copy(out, 4)
  return out
}

export const ACK = encodeReply('')

/** A malformed frame: the connection cannot be read further. */
export class FrameError extends Error {}

/** Splits a connection's bytes into request frames. */
export class RequestFrameReader {
  private pending: Buffer = EMPTY

  constructor(private readonly maxBytes = 32 * 1024 * 1024) {}

  /** Feeds bytes; returns the frames they complete. Throws FrameError. */
  push(chunk: Buffer): RequestFrame[] {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk])
    const out: RequestFrame[] = []
    for (;;) {
      const f = this.next()
      if (f === null) break
      out.push(f)
    }
    return out
  }

  private next(): RequestFrame | null {
    const b = this.pending
    if (b.length < 2) return null
    const pathLen = b.readUInt16BE(0)
    if (b.length < 2 + pathLen + 2) return null
    const hdrAt = 2 + pathLen
    const hdrLen = b.readUInt16BE(hdrAt)
    const payAt = hdrAt + 2 + hdrLen
    if (b.length < payAt + 4) return null
    const payLen = b.readUInt32BE(payAt)
    if (payLen > this.maxBytes) throw new FrameError(`a request payload of ${payLen} bytes exceeds the limit of ${this.maxBytes}`)
    const end = payAt + 4 + payLen
    if (b.length < end) return null
    const path = b.toString('utf8', 2, hdrAt)
    let headers: Record<string, string> = {}
    if (hdrLen > 0) {
      try {
        const h: unknown = JSON.parse(b.toString('utf8', hdrAt + 2, payAt))
        if (typeof h === 'object' && h !== null && !Array.isArray(h)) headers = h as Record<string, string>
      } catch {
        throw new FrameError('the request headers are not a JSON object')
      }
    }
    // a copy: the payload outlives the connection's buffer
    const payload = Buffer.from(b.subarray(payAt + 4, end))
    this.pending = b.subarray(end)
    return { path, headers, payload }
  }
}
