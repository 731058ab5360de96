// A Dynamo frontend played by hand for the mocker's Dynamo mode tests: request frames and
// TwoPartCodec messages written byte by byte from Dynamo's source, and a call-home listener that
// records what each worker stream sends. Nothing here is shared with the code under test.
//
//   request frame  u16 BE path len | path | u16 BE headers len | headers JSON | u32 BE payload len | payload
//                  (lib/runtime/src/pipeline/network/codec.rs@2a26d793)
//   two-part       u64 BE header len | u64 BE body len | u64 BE checksum | header | body
//                  (lib/runtime/src/pipeline/network/codec/two_part.rs@5448e69a)
//   reply          u32 BE len | bytes, empty = ACK (ingress/shared_tcp_endpoint.rs@19854ec1)
import { randomUUID } from 'node:crypto'
import { connect, createServer } from 'node:net'
import type { AddressInfo, Server, Socket } from 'node:net'

export function twoPart(header: Buffer | null, body: Buffer | null): Buffer {
  const h = header ?? Buffer.alloc(0)
  const b = body ?? Buffer.alloc(0)
  const prefix = Buffer.alloc(24)
  prefix.writeBigUInt64BE(BigInt(h.length), 0)
  prefix.writeBigUInt64BE(BigInt(b.length), 8)
  return Buffer.concat([prefix, h, b])
}

export function requestFrame(path: string, headers: Record<string, string>, payload: Buffer): Buffer {
  const p = Buffer.from(path, 'utf8')
  const h = Buffer.from(JSON.stringify(headers), 'utf8')
  const out = Buffer.alloc(2 + p.length + 2 + h.length + 4 + payload.length)
  let at = out.writeUInt16BE(p.length, 0)
  at += p.copy(out, at)
  at = out.writeUInt16BE(h.length, at)
  at += h.copy(out, at)
  at = out.writeUInt32BE(payload.length, at)
  payload.copy(out, at)
  return out
}

export interface Message {
  header: Buffer
  body: Buffer
}

/** One call-home connection: the messages in order, and its end. */
export class CallHome {
  readonly messages: Message[] = []
  ended = false
  private pending = Buffer.alloc(0)

  constructor(readonly socket: Socket) {
    socket.on('data', (c: Buffer) => {
      this.pending = Buffer.concat([this.pending, c])
      while (this.pending.length >= 24) {
        const h = Number(this.pending.readBigUInt64BE(0))
        const b = Number(this.pending.readBigUInt64BE(8))
        if (this.pending.length < 24 + h + b) break
        this.messages.push({ header: this.pending.subarray(24, 24 + h), body: this.pending.subarray(24 + h, 24 + h + b) })
        this.pending = this.pending.subarray(24 + h + b)
      }
    })
    socket.on('end', () => {
      this.ended = true
      socket.end()
    })
    socket.on('close', () => (this.ended = true))
    socket.on('error', () => undefined)
  }

  /** The subject of its handshake (its first message), once received. */
  get subject(): string | null {
    const m = this.messages[0]
    if (m === undefined) return null
    return (JSON.parse(m.header.toString('utf8')) as { subject?: string }).subject ?? null
  }

  /** Sends a control message (`"stop"`, `"kill"`) to the worker. */
  control(word: 'stop' | 'kill'): void {
    this.socket.write(twoPart(Buffer.from(JSON.stringify(word)), null))
  }
}

/** The frontend's TCP stream server (TcpStreamServer): workers dial it. */
export class CallHomeServer {
  readonly streams: CallHome[] = []
  private readonly server: Server
  address = ''

  constructor() {
    this.server = createServer((s) => this.streams.push(new CallHome(s)))
  }

  async listen(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r))
    this.address = `127.0.0.1:${(this.server.address() as AddressInfo).port}`
    return this.address
  }

  bySubject(subject: string): CallHome | undefined {
    return this.streams.find((s) => s.subject === subject)
  }

  async close(): Promise<void> {
    for (const s of this.streams) s.socket.destroy()
    await new Promise<void>((r) => this.server.close(() => r()))
  }
}

/** A request's payload: the RequestControlMessage header and its body (lib/runtime/src/pipeline/network.rs@0498dbf3). */
export function requestPayload(callHome: string, body: Buffer, codec: 'json' | 'msgpack' | null): { payload: Buffer; id: string; subject: string } {
  const id = randomUUID()
  const subject = randomUUID()
  const info = JSON.stringify({ address: callHome, subject, context: id, stream_type: 'response' })
  const control: Record<string, unknown> = { id, request_type: 'single_in', response_type: 'many_out' }
  if (codec !== null) control.payload_codec = codec
  control.connection_info = { transport: 'tcp_server', info }
  return { payload: twoPart(Buffer.from(JSON.stringify(control)), body), id, subject }
}

/** A connection to a worker's request plane; replies are read in order. */
export class RequestConnection {
  readonly replies: Buffer[] = []
  private pending = Buffer.alloc(0)

  private constructor(readonly socket: Socket) {
    socket.on('data', (c: Buffer) => {
      this.pending = Buffer.concat([this.pending, c])
      while (this.pending.length >= 4) {
        const n = this.pending.readUInt32BE(0)
        if (this.pending.length < 4 + n) break
        this.replies.push(Buffer.from(this.pending.subarray(0, 4 + n)))
        this.pending = this.pending.subarray(4 + n)
      }
    })
    socket.on('error', () => undefined)
  }

  static open(hostPort: string): Promise<RequestConnection> {
    const i = hostPort.lastIndexOf(':')
    return new Promise((resolve, reject) => {
      const s = connect({ host: hostPort.slice(0, i), port: Number(hostPort.slice(i + 1)) })
      s.once('error', reject)
      s.once('connect', () => resolve(new RequestConnection(s)))
    })
  }

  send(frame: Buffer): void {
    this.socket.write(frame)
  }

  close(): void {
    this.socket.destroy()
  }
}
