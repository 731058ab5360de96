// HTTP/1.1 chunked framing for the proxy's streamed responses, written straight to the client's
// socket. ServerResponse.write frames a chunk as four separate writes (size, CRLF, data, CRLF)
// under a cork it lifts on the next tick, so every forwarded SSE event cost a nextTick, four
// buffered-write records and a writev: a one-off allocation profile of the router under
// `node dist/bench/proxy.js` put that machinery at a quarter of everything it allocated. One
// frame in one buffer is one plain write.
//
// The response object keeps owning the exchange: it writes the status line and headers, and its
// end() writes the last chunk (`0 CRLF CRLF`) and frees the connection for the next request, so
// keep-alive bookkeeping is Node's. Frames written here only ever go between the two, on the same
// socket, hence in order.
import type { ServerResponse } from 'node:http'
import type { Socket } from 'node:net'

const CR = 13
const LF = 10
/** ASCII of 0-9a-f. */
const HEX = Buffer.from('0123456789abcdef', 'latin1')

/** Hex digits of a positive length. */
function hexDigits(n: number): number {
  let d = 1
  while (n >= 16) {
    n = Math.floor(n / 16)
    d++
  }
  return d
}

/** One whole chunk (size line, data, CRLF) of `data`'s bytes, in a buffer of its own. */
export function chunkFrame(data: Uint8Array): Buffer {
  const len = data.byteLength
  const digits = hexDigits(len)
  const frame = Buffer.allocUnsafe(digits + 4 + len)
  let n = len
  for (let i = digits - 1; i >= 0; i--) {
    frame[i] = HEX[n & 15] as number
    n = Math.floor(n / 16)
  }
  frame[digits] = CR
  frame[digits + 1] = LF
  frame.set(data, digits + 2)
  frame[digits + 2 + len] = CR
  frame[digits + 3 + len] = LF
  return frame
}

/**
 * Where a hijacked response's body goes once its headers are sent: the raw socket when Node frames
 * the response in chunks (any HTTP/1.1 client), or the response itself otherwise (an HTTP/1.0
 * client, where Node ends the body by closing the connection and there is nothing to frame).
 */
export class ChunkWriter {
  private socket: Socket | null = null

  constructor(private readonly res: ServerResponse) {}

  /** Sends the status line and headers with the first chunk, in one write; false when the socket is full. */
  begin(first: Uint8Array): boolean {
    const s = this.res.socket
    if (s === null) return this.res.write(first)
    s.cork()
    this.res.flushHeaders()
    // Node decides on chunked framing when it stores the headers (writeHead or flushHeaders)
    if ((this.res as unknown as { chunkedEncoding?: boolean }).chunkedEncoding === true) this.socket = s
    const ok = this.write(first)
    s.uncork()
    return ok
  }

  /** Writes one chunk; false when the client's socket is full (wait with onceDrained). */
  write(data: Uint8Array): boolean {
    if (data.byteLength === 0) return true
    return this.socket !== null ? this.socket.write(chunkFrame(data)) : this.res.write(data)
  }

  /**
   * Writes `last` (when given) and ends the response, in one write to the socket: a stream's
   * final event and the end of its body reach the client in one packet, a syscall and a wake-up
   * fewer per stream. ServerResponse.end() flushes a corked socket whole, so the frame buffered
   * here goes out with its last chunk.
   */
  end(last: Uint8Array | null): void {
    const s = this.socket
    if (last === null || last.byteLength === 0) {
      this.res.end()
    } else if (s === null) {
      this.res.end(last)
    } else {
      s.cork()
      s.write(chunkFrame(last))
      this.res.end()
      if (s.writableCorked > 0) s.uncork()
    }
  }

  /** Calls `fn` once when the client's socket has room again. */
  onceDrained(fn: () => void): void {
    if (this.socket !== null) this.socket.once('drain', fn)
    else this.res.once('drain', fn)
  }

  offDrained(fn: () => void): void {
    if (this.socket !== null) this.socket.off('drain', fn)
    else this.res.off('drain', fn)
  }
}
