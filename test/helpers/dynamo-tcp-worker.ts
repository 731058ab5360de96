// A small Dynamo worker for the request-plane tests, written from Dynamo's source and not from
// kv-router's codecs (it imports none of src/request-plane/): it listens, reads request frames
// (codec.rs@2a26d793: u16 BE path length | path | u16 BE headers length | headers | u32 BE
// payload length | payload), reads the payload's two-part message (two_part.rs@5b7cf2be: three
// u64 BE — header length, body length, checksum — then header and body), acknowledges with
// `u32 BE length | data`, and dials the frontend back to stream the response
// (tcp/client.rs@5b7cf2be: handshake, prologue, data, sentinel).
import { createConnection, createServer } from 'node:net'
import type { Socket } from 'node:net'
import { xxh3 } from '@node-rs/xxhash'

export interface WorkerRequest {
  path: string
  headers: Record<string, string>
  /** The RequestControlMessage, parsed. */
  control: {
    id: string
    request_type: string
    response_type: string
    payload_codec?: string
    connection_info: { transport: string; info: string }
  }
  body: Buffer
}

/** One two-part message by hand; the checksum is XXH3-64 (seed 0) of header ‖ body unless given. */
export function twoPart(header: Buffer | string | null, body: Buffer | string | null, checksum?: bigint): Buffer {
  const h = Buffer.from(header ?? '')
  const b = Buffer.from(body ?? '')
  const prefix = Buffer.alloc(24)
  prefix.writeBigUInt64BE(BigInt(h.length), 0)
  prefix.writeBigUInt64BE(BigInt(b.length), 8)
  prefix.writeBigUInt64BE(checksum ?? xxh3.xxh64(Buffer.concat([h, b]), 0n), 16)
  return Buffer.concat([prefix, h, b])
}

/** The response connection a worker dials back. */
export class CallHome {
  /** Header-only messages the frontend sent on it (`"stop"`, `"kill"`). */
  readonly received: string[] = []
  closedByFrontend = false
  private buf = Buffer.alloc(0)

  constructor(readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => {
      this.buf = Buffer.concat([this.buf, chunk])
      while (this.buf.length >= 24) {
        const hl = Number(this.buf.readBigUInt64BE(0))
        const bl = Number(this.buf.readBigUInt64BE(8))
        if (this.buf.length < 24 + hl + bl) break
        this.received.push(this.buf.subarray(24, 24 + hl).toString())
        this.buf = this.buf.subarray(24 + hl + bl)
      }
    })
    socket.on('end', () => {
      this.closedByFrontend = true
    })
    socket.on('close', () => {
      this.closedByFrontend = true
    })
    socket.on('error', () => undefined)
  }

  send(bytes: Buffer): void {
    this.socket.write(bytes)
  }

  /** A data message `{"data":…,"complete_final":false}` in JSON. */
  data(item: unknown): void {
    this.send(twoPart(null, JSON.stringify({ data: item, complete_final: false })))
  }

  /** The last data message and the sentinel. */
  finish(): void {
    this.send(twoPart(null, '{"complete_final":true}'))
    this.send(twoPart('"sentinel"', null))
  }
}

export interface TestWorker {
  port: number
  requests: WorkerRequest[]
  /** Request connections accepted. */
  connections: number
  close(): Promise<void>
}

/**
 * Starts the worker. For each request, in order, `onRequest` is called with a function that
 * acknowledges it (empty text = accepted) and one that dials back and sends the handshake, and
 * the prologue unless told not to.
 */
export async function startTestWorker(
  onRequest: (req: WorkerRequest, ack: (text?: string | Buffer) => void, dial: (prologue?: string | null) => Promise<CallHome>) => void,
): Promise<TestWorker> {
  const sockets = new Set<Socket>()
  const w: TestWorker = { port: 0, requests: [], connections: 0, close: async () => undefined }
  const server = createServer((socket) => {
    w.connections++
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => undefined)
    let buf = Buffer.alloc(0)
    socket.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk])
      for (;;) {
        if (buf.length < 2) return
        const pl = buf.readUInt16BE(0)
        if (buf.length < 4 + pl) return
        const hl = buf.readUInt16BE(2 + pl)
        const fixed = 2 + pl + 2 + hl + 4
        if (buf.length < fixed) return
        const n = buf.readUInt32BE(fixed - 4)
        if (buf.length < fixed + n) return
        const payload = buf.subarray(fixed, fixed + n)
        const ctlLen = Number(payload.readBigUInt64BE(0))
        const bodyLen = Number(payload.readBigUInt64BE(8))
        const req: WorkerRequest = {
          path: buf.subarray(2, 2 + pl).toString(),
          headers: JSON.parse(buf.subarray(4 + pl, 4 + pl + hl).toString()) as Record<string, string>,
          control: JSON.parse(payload.subarray(24, 24 + ctlLen).toString()) as WorkerRequest['control'],
          body: Buffer.from(payload.subarray(24 + ctlLen, 24 + ctlLen + bodyLen)),
        }
        buf = buf.subarray(fixed + n)
        w.requests.push(req)
        const ack = (text: string | Buffer = ''): void => {
          // bytes are written as they are (a test's broken acknowledgement)
          if (Buffer.isBuffer(text)) {
            socket.write(text)
            return
          }
          const data = Buffer.from(text)
          const len = Buffer.alloc(4)
          len.writeUInt32BE(data.length, 0)
          socket.write(Buffer.concat([len, data]))
        }
        const dial = (prologue: string | null = '{"error":null}'): Promise<CallHome> => {
          const info = JSON.parse(req.control.connection_info.info) as { address: string; subject: string }
          const colon = info.address.lastIndexOf(':')
          return new Promise((resolve, reject) => {
            const s = createConnection({ host: info.address.slice(0, colon).replace(/^\[|\]$/g, ''), port: Number(info.address.slice(colon + 1)) }, () => {
              const home = new CallHome(s)
              home.send(twoPart(JSON.stringify({ subject: info.subject, stream_type: 'response' }), null))
              if (prologue !== null) home.send(twoPart(prologue, null))
              resolve(home)
            })
            s.once('error', reject)
          })
        }
        onRequest(req, ack, dial)
      }
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  w.port = (server.address() as { port: number }).port
  w.close = async () => {
    for (const s of sockets) s.destroy()
    await new Promise((r) => server.close(r))
  }
  return w
}
