// Dynamo's TCP request-plane frames (lib/runtime/src/pipeline/network/codec.rs@2a26d793):
//
//   frontend → worker   u16 BE path length | endpoint path (UTF-8)
//                       u16 BE headers length | headers (a JSON object of strings)
//                       u32 BE payload length | payload (a TwoPartCodec message, two-part.ts)
//   worker → frontend   u32 BE length | data, one per request in the order they came (pipelined):
//                       empty = accepted; otherwise the refusal's text
//
// Both directions are decoded incrementally from a byte stream with a size limit, checked on the
// declared length before the bytes arrive (Dynamo's DYN_TCP_MAX_MESSAGE_SIZE, 32 MiB).
import { KvrError } from '../errors.js'
import { ByteQueue } from './byte-queue.js'

export const DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024

export interface RequestFrame {
  path: string
  headers: Record<string, string>
  payload: Buffer
}

function tooLarge(what: string, size: number, max: number): KvrError {
  return new KvrError('KVR_ERR_FRAME_TOO_LARGE', `${what} of ${size} bytes is larger than the limit of ${max} bytes`)
}

/** One request frame's bytes. Throws KVR_ERR_FRAME_TOO_LARGE. */
export function encodeRequestFrame(path: string, headers: Record<string, string>, payload: Uint8Array, max = DEFAULT_MAX_MESSAGE_BYTES): Buffer {
  const p = Buffer.from(path, 'utf8')
  const h = Buffer.from(JSON.stringify(headers), 'utf8')
  if (p.length > 0xffff) throw tooLarge('an endpoint path', p.length, 0xffff)
  if (h.length > 0xffff) throw tooLarge('a headers object', h.length, 0xffff)
  const total = 2 + p.length + 2 + h.length + 4 + payload.length
  if (total > max) throw tooLarge('a request frame', total, max)
  const out = Buffer.allocUnsafe(total)
  let o = out.writeUInt16BE(p.length, 0)
  o += p.copy(out, o)
  o = out.writeUInt16BE(h.length, o)
  o += h.copy(out, o)
  o = out.writeUInt32BE(payload.length, o)
  out.set(payload, o)
  return out
}

/** One acknowledgement: empty for accepted, else the refusal's text. */
export function encodeAck(text = ''): Buffer {
  const data = Buffer.from(text, 'utf8')
  const out = Buffer.allocUnsafe(4 + data.length)
  out.writeUInt32BE(data.length, 0)
  data.copy(out, 4)
  return out
}

/** Acknowledgements from a byte stream. push() throws KVR_ERR_FRAME_TOO_LARGE (the stream is then unusable). */
export class AckDecoder {
  private readonly q = new ByteQueue()
  constructor(private readonly max = DEFAULT_MAX_MESSAGE_BYTES) {}

  /** Calls `ack` with each complete acknowledgement's data (a view). */
  push(chunk: Buffer, ack: (data: Buffer) => void): void {
    const q = this.q
    q.push(chunk)
    while (q.length >= 4) {
      const n = q.u32(0)
      if (4 + n > this.max) throw tooLarge('an acknowledgement', 4 + n, this.max)
      if (q.length < 4 + n) return
      q.skip(4)
      ack(q.take(n))
    }
  }
}

/** Request frames from a byte stream (the worker's side, for tests and simulated workers). */
export class RequestFrameDecoder {
  private readonly q = new ByteQueue()
  constructor(private readonly max = DEFAULT_MAX_MESSAGE_BYTES) {}

  /** The frames completed by this chunk. Throws KVR_ERR_FRAME_TOO_LARGE or KVR_ERR_FRAME_MALFORMED. */
  push(chunk: Buffer): RequestFrame[] {
    const q = this.q
    const out: RequestFrame[] = []
    q.push(chunk)
    for (;;) {
      if (q.length < 2) return out
      const pathLen = q.u16(0)
      if (q.length < 4 + pathLen) return out
      const headersLen = q.u16(2 + pathLen)
      const fixed = 2 + pathLen + 2 + headersLen + 4
      if (q.length < fixed) return out
      const payloadLen = q.u32(fixed - 4)
      if (fixed + payloadLen > this.max) throw tooLarge('a request frame', fixed + payloadLen, this.max)
      if (q.length < fixed + payloadLen) return out
      const path = q.peek(2, pathLen).toString('utf8')
      let headers: unknown
      try {
        headers = JSON.parse(q.peek(4 + pathLen, headersLen).toString('utf8'))
      } catch {
        throw new KvrError('KVR_ERR_FRAME_MALFORMED', 'the headers of a request frame are not JSON')
      }
      if (typeof headers !== 'object' || headers === null || Array.isArray(headers) || Object.values(headers).some((v) => typeof v !== 'string'))
        throw new KvrError('KVR_ERR_FRAME_MALFORMED', 'the headers of a request frame are not an object of strings')
      q.skip(fixed)
      out.push({ path, headers: headers as Record<string, string>, payload: q.take(payloadLen) })
    }
  }
}
