// The call-home listener: one TCP server per router process that workers dial back to stream
// their responses (Dynamo's TcpStreamServer, tcp/server.rs@a073a2d5). Each request names it in
// its control header with a fresh subject; the worker's first message on the new connection is
// the handshake naming that subject, which hands the connection to the waiting ResponseStream.
// A connection that names no waiting subject, sends no handshake in time, or sends bytes that do
// not decode is counted and dropped; no worker input can throw past this module.
//
// Newer Dynamo main multiplexes responses over a few persistent connections per worker
// (`tcp_response_mux_v1`, tcp/mux.rs@06d22825) and newer still moves them to QUIC; neither
// could be shown to be in a release, so only this call-home path is implemented
// (docs/dynamo-compatibility.md).
import { createServer, isIP } from 'node:net'
import type { Server, Socket } from 'node:net'
import { networkInterfaces } from 'node:os'
import { KvrError } from '../errors.js'
import { limited } from '../runtime/log.js'
import type { RequestPlaneCounters } from './counters.js'
import { handshakeSubject } from './control-message.js'
import type { ResponseStream } from './response-stream.js'
import { DEFAULT_MAX_MESSAGE_BYTES } from './tcp-frame.js'
import { TwoPartDecoder } from './two-part.js'

export interface ResponseListenerOptions {
  /** The address to listen on; default 0.0.0.0. */
  host?: string
  /** Default 0: any free port. */
  port?: number
  /** The host workers dial; default the listening host, or this machine's first external IPv4 for 0.0.0.0. */
  advertiseHost?: string
  maxMessageBytes?: number
  /** How long a new connection has to send its handshake. Default 10 s. */
  handshakeTimeoutMs?: number
  counters: RequestPlaneCounters
}

function externalIPv4(): string {
  for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address
  return '127.0.0.1'
}

export class ResponseListener {
  private readonly waiting = new Map<string, ResponseStream<unknown>>()
  private readonly sockets = new Set<Socket>()

  private constructor(
    private readonly server: Server,
    /** `ip:port` as the control header's connection_info names it. */
    readonly address: string,
    private readonly opts: ResponseListenerOptions,
  ) {
    server.on('connection', (s) => this.accept(s))
  }

  static start(opts: ResponseListenerOptions): Promise<ResponseListener> {
    const host = opts.host ?? '0.0.0.0'
    return new Promise((resolve, reject) => {
      const server = createServer()
      server.once('error', reject)
      server.listen(opts.port ?? 0, host, () => {
        server.off('error', reject)
        const port = (server.address() as { port: number }).port
        let adv = opts.advertiseHost ?? (host === '0.0.0.0' || host === '::' ? externalIPv4() : host)
        if (isIP(adv) === 6) adv = `[${adv}]`
        resolve(new ResponseListener(server, `${adv}:${port}`, opts))
      })
    })
  }

  /** A stream whose worker is about to be sent the request. */
  expect(stream: ResponseStream<unknown>): void {
    this.waiting.set(stream.subject, stream)
  }

  /** The stream ended or its request was never accepted. */
  forget(subject: string): void {
    this.waiting.delete(subject)
  }

  /** Streams waiting for their worker to dial back. */
  get pending(): number {
    return this.waiting.size
  }

  private accept(socket: Socket): void {
    this.sockets.add(socket)
    socket.setNoDelay(true)
    const decoder = new TwoPartDecoder(this.opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES)
    let stream: ResponseStream<unknown> | null = null
    const handshakeTimer = setTimeout(() => socket.destroy(), this.opts.handshakeTimeoutMs ?? 10_000)
    socket.on('data', (chunk: Buffer) => {
      try {
        decoder.push(chunk, (m) => {
          if (stream !== null) {
            stream.message(m)
            return
          }
          if (m.body.length > 0) throw new KvrError('KVR_ERR_FRAME_MALFORMED', 'the first message of a response connection is not a handshake')
          const subject = handshakeSubject(m.header)
          const s = this.waiting.get(subject)
          if (s === undefined)
            throw new KvrError('KVR_ERR_FRAME_MALFORMED', `a response connection names subject ${subject.slice(0, 64)}, which no request waits for`)
          this.waiting.delete(subject)
          clearTimeout(handshakeTimer)
          stream = s
          s.attach(socket)
        })
      } catch (err) {
        this.opts.counters.malformed++
        limited.warn(
          'request_plane_malformed',
          { error: (err as Error).message, remote: `${socket.remoteAddress}:${socket.remotePort}` },
          'a response connection from a worker sent what the request plane does not read: dropped',
        )
        const s = stream as ResponseStream<unknown> | null
        if (s !== null) s.fail(err as Error)
        socket.destroy()
      }
    })
    socket.on('error', () => undefined)
    socket.on('close', () => {
      clearTimeout(handshakeTimer)
      this.sockets.delete(socket)
      ;(stream as ResponseStream<unknown> | null)?.closed()
    })
  }

  async close(): Promise<void> {
    for (const s of this.waiting.values()) s.fail(new KvrError('KVR_ERR_SHUTTING_DOWN', 'the router is shutting down'))
    for (const s of this.sockets) s.destroy()
    await new Promise<void>((r) => this.server.close(() => r()))
  }
}
