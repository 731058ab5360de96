// The worker side of Dynamo's TCP request plane: one listener per process, shared by every engine
// and endpoint in it as Dynamo's SharedTcpServer is
// (lib/runtime/src/pipeline/network/ingress/shared_tcp_endpoint.rs@19854ec1). Each frame names
// `{instance_id:x}/{endpoint}`; the server answers each in order with an ACK (an empty reply) once
// the request is taken, `Unknown endpoint: …` for a path nobody serves, or `Server overloaded: …`
// when the engine already has its limit of requests in flight. A taken request's payload is a
// TwoPartCodec message: header = RequestControlMessage JSON
//   {"id", "request_type", "response_type", "payload_codec"?: "json"|"msgpack" (json when absent),
//    "connection_info": {"transport": "tcp_server", "info": "<TcpStreamConnectionInfo JSON>"}, …}
// body = the request in that codec (lib/runtime/src/pipeline/network.rs@0498dbf3). The handler
// then answers on the response stream it dials back to (response-stream.ts).
import { createServer } from 'node:net'
import type { AddressInfo, Server, Socket } from 'node:net'
import { Unpackr } from 'msgpackr'
import { parseJsonExact } from '../../../codec/json.js'
import { ACK, FrameError, RequestFrameReader, encodeReply } from './request-frame.js'
import type { RequestFrame } from './request-frame.js'
import type { CallHomeInfo, PayloadCodec } from './response-stream.js'
import { decodeTwoPart } from './two-part-codec.js'

export interface IncomingRequest {
  /** The request id (RequestControlMessage.id). */
  id: string
  codec: PayloadCodec
  callHome: CallHomeInfo
  headers: Record<string, string>
  /** The body decoded per its codec (u64s as bigint when past 2^53). */
  body: unknown
}

/** The requests of one engine in flight, against its limit. */
export interface InflightGate {
  inflight: number
  readonly maxInflight: number
}

/** Handles a taken request; calls `done` once its response stream is over. */
export type EndpointHandler = (req: IncomingRequest, done: () => void) => void

interface Route {
  handler: EndpointHandler
  gate: InflightGate
}

const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' })

/** A request the worker took but cannot serve: no response stream can be opened for it. */
export class BadRequestError extends Error {}

/** The control header, the call-home address and the body of a taken request. */
export function decodeRequest(frame: RequestFrame): IncomingRequest {
  let control: Record<string, unknown>
  let body: unknown
  let codec: PayloadCodec
  try {
    const msg = decodeTwoPart(frame.payload)
    const c: unknown = JSON.parse(msg.header.toString('utf8'))
    if (typeof c !== 'object' || c === null) throw new BadRequestError('the control header is not a JSON object')
    control = c as Record<string, unknown>
    const pc = control.payload_codec ?? 'json'
    if (pc !== 'json' && pc !== 'msgpack') throw new BadRequestError(`unknown payload_codec ${JSON.stringify(pc)}`)
    codec = pc
    body = codec === 'json' ? parseJsonExact(msg.body.toString('utf8')) : unpackr.unpack(msg.body)
  } catch (err) {
    if (err instanceof BadRequestError) throw err
    throw new BadRequestError(`undecodable request: ${(err as Error).message}`)
  }
  const id = control.id
  const ci = control.connection_info as { transport?: unknown; info?: unknown } | undefined
  if (typeof id !== 'string') throw new BadRequestError('the control header has no request id')
  if (ci?.transport !== 'tcp_server' || typeof ci.info !== 'string') throw new BadRequestError('the control header has no tcp_server connection_info')
  let info: CallHomeInfo
  try {
    info = JSON.parse(ci.info) as CallHomeInfo
  } catch {
    throw new BadRequestError('connection_info.info is not JSON')
  }
  if (typeof info.address !== 'string' || !/:\d+$/.test(info.address) || typeof info.subject !== 'string')
    throw new BadRequestError('connection_info.info needs an address HOST:PORT and a subject')
  if (info.stream_type !== 'response') throw new BadRequestError(`stream_type must be "response", got ${JSON.stringify(info.stream_type)}`)
  if (info.context !== id) throw new BadRequestError(`connection_info context ${JSON.stringify(info.context)} is not the request id ${JSON.stringify(id)}`)
  return { id, codec, callHome: info, headers: frame.headers, body }
}

export class RequestPlaneServer {
  /** Requests taken, refused as overloaded, for unknown paths, undecodable, and connections cut for bad frames. */
  /** `msgpack`: requests taken whose payload was named MessagePack (the rest were JSON). */
  readonly counters = { taken: 0, msgpack: 0, overloaded: 0, unknownEndpoint: 0, badRequests: 0, badFrames: 0 }
  private readonly routes = new Map<string, Route>()
  private readonly server: Server
  private readonly sockets = new Set<Socket>()
  /** HOST:PORT as the instance records advertise it; set by listen(). */
  hostPort = ''

  constructor(private readonly onWarning: (message: string) => void = () => undefined) {
    this.server = createServer({ noDelay: true }, (s) => this.accept(s))
  }

  async listen(host: string, advertiseHost: string, port = 0): Promise<string> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject)
      this.server.listen(port, host, () => {
        this.server.off('error', reject)
        resolve()
      })
    })
    const a = this.server.address() as AddressInfo
    this.hostPort = `${advertiseHost.includes(':') ? `[${advertiseHost}]` : advertiseHost}:${a.port}`
    return this.hostPort
  }

  register(path: string, handler: EndpointHandler, gate: InflightGate): void {
    this.routes.set(path, { handler, gate })
  }

  unregister(path: string): void {
    this.routes.delete(path)
  }

  async close(): Promise<void> {
    if (!this.server.listening) return
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()))
    for (const s of this.sockets) s.destroy()
    await closed
  }

  private accept(s: Socket): void {
    this.sockets.add(s)
    const reader = new RequestFrameReader()
    s.on('close', () => this.sockets.delete(s))
    s.on('error', () => undefined)
    s.on('data', (chunk: Buffer) => {
      let frames: RequestFrame[]
      try {
        frames = reader.push(chunk)
      } catch (err) {
        this.counters.badFrames++
        this.onWarning(`request plane: ${err instanceof FrameError ? err.message : String(err)}; connection closed`)
        s.end(encodeReply(`Read error: ${(err as Error).message}`))
        return
      }
      for (const f of frames) this.take(s, f)
    })
  }

  private take(s: Socket, f: RequestFrame): void {
    const route = this.routes.get(f.path)
    if (route === undefined) {
      this.counters.unknownEndpoint++
      s.write(encodeReply(`Unknown endpoint: ${f.path}`))
      return
    }
    const gate = route.gate
    if (gate.inflight >= gate.maxInflight) {
      this.counters.overloaded++
      s.write(encodeReply(`Server overloaded: ${gate.inflight} requests in flight on ${f.path} (limit ${gate.maxInflight})`))
      return
    }
    let req: IncomingRequest
    try {
      req = decodeRequest(f)
    } catch (err) {
      // taken, as Dynamo acknowledges before it decodes; there is nowhere to answer
      this.counters.badRequests++
      s.write(ACK)
      this.onWarning(`request plane: ${f.path}: ${(err as Error).message}`)
      return
    }
    gate.inflight++
    this.counters.taken++
    if (req.codec === 'msgpack') this.counters.msgpack++
    s.write(ACK)
    let finished = false
    const done = (): void => {
      if (finished) return
      finished = true
      gate.inflight--
    }
    try {
      route.handler(req, done)
    } catch (err) {
      // a handler's bug must not take the process down with it
      this.counters.badRequests++
      this.onWarning(`request plane: ${f.path}: ${(err as Error).message}`)
      done()
    }
  }
}
