// The request-plane client: sends a request to one worker endpoint over Dynamo's TCP request
// plane and hands back its response stream. Per worker `host:port` it keeps a few connections,
// each carrying many requests at once (connection.ts); the response comes back on a connection
// the worker dials to this process's call-home listener (response-listener.ts), started on first
// use. The frame (tcp-frame.ts) carries the endpoint path, the headers `request-id` and
// `x-endpoint-path`, and a two-part message (two-part.ts): the RequestControlMessage
// (control-message.ts) and the request in the payload codec (payload-codec.ts).
//
// Errors a caller maps: KVR_ERR_WORKER_OVERLOADED (503 with Retry-After; try another worker),
// KVR_ERR_ACK_TIMEOUT and KVR_ERR_RESPONSE_STREAM (the worker may be gone; try another),
// KVR_ERR_WORKER_REJECTED (the worker does not serve that endpoint).
import { randomUUID } from 'node:crypto'
import { KvrError } from '../errors.js'
import type { InstanceAddress } from './address.js'
import { parseInstanceAddress } from './address.js'
import { RequestConnection } from './connection.js'
import { encodeControlHeader } from './control-message.js'
import type { RequestPlaneCounters } from './counters.js'
import { newCounters } from './counters.js'
import type { PayloadCodec } from './payload-codec.js'
import { encodePayload } from './payload-codec.js'
import { ResponseListener } from './response-listener.js'
import type { ResponseListenerOptions } from './response-listener.js'
import { ResponseStream } from './response-stream.js'
import { DEFAULT_MAX_MESSAGE_BYTES, encodeRequestFrame } from './tcp-frame.js'
import { encodeTwoPart } from './two-part.js'

export interface RequestPlaneClientOptions {
  /** Dynamo's DYN_TCP_REQUEST_TIMEOUT: the acknowledgement's deadline, and the dial-back's. Default 5000 ms. */
  ackTimeoutMs?: number
  connectTimeoutMs?: number
  /** Dynamo's DYN_TCP_MAX_MESSAGE_SIZE. Default 32 MiB. */
  maxMessageBytes?: number
  /** Connections per worker address. Default 4. */
  connectionsPerWorker?: number
  /** Requests waiting for their acknowledgement on one connection before another is opened. Default 64. */
  inFlightPerConnection?: number
  /** After `"stop"`, the wait before `"kill"`. Default 2000 ms. */
  killAfterMs?: number
  /** The call-home listener's address options. */
  listener?: Omit<ResponseListenerOptions, 'counters' | 'maxMessageBytes'>
  /** The payload codec of requests that do not name one (--request-plane-codec). Default json, which every Dynamo worker reads. */
  codec?: PayloadCodec
}

export interface RequestOptions {
  codec?: PayloadCodec
  /** The request's id (its `request-id` header and control-header id); default a fresh UUID. */
  requestId?: string
  /** Aborting it stops the worker's stream. */
  signal?: AbortSignal
  /** Items as the JSON bytes of each `data` (codec json). */
  raw?: boolean
  /** The payload is already its bytes in the codec (encodeRequest, payload-codec.ts). */
  encoded?: boolean
}

export class RequestPlaneClient {
  readonly counters: RequestPlaneCounters = newCounters()
  private readonly pools = new Map<string, RequestConnection[]>()
  private readonly opening = new Map<string, Promise<RequestConnection>>()
  private listener: Promise<ResponseListener> | null = null
  private closed = false
  private readonly o: Required<Omit<RequestPlaneClientOptions, 'listener' | 'codec'>>
  /** The payload codec of requests that do not name one. */
  readonly codec: PayloadCodec

  constructor(private readonly options: RequestPlaneClientOptions = {}) {
    this.codec = options.codec ?? 'json'
    this.o = {
      ackTimeoutMs: options.ackTimeoutMs ?? 5000,
      connectTimeoutMs: options.connectTimeoutMs ?? 5000,
      maxMessageBytes: options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES,
      connectionsPerWorker: options.connectionsPerWorker ?? 4,
      inFlightPerConnection: options.inFlightPerConnection ?? 64,
      killAfterMs: options.killAfterMs ?? 2000,
    }
  }

  /** The call-home listener, started on first use. */
  responseListener(): Promise<ResponseListener> {
    this.listener ??= ResponseListener.start({ ...this.options.listener, maxMessageBytes: this.o.maxMessageBytes, counters: this.counters })
    return this.listener
  }

  /** Open connections to workers. */
  get connections(): number {
    let n = 0
    for (const list of this.pools.values()) n += list.length
    return n
  }

  /**
   * Sends `payload` to the endpoint at `address` and resolves, once the worker accepted it, to its
   * response stream. Rejects with the codes in the header comment, KVR_ERR_INSTANCE_ADDRESS or
   * KVR_ERR_FRAME_TOO_LARGE.
   */
  async request<T = unknown>(address: string | InstanceAddress, payload: unknown, opts: RequestOptions = {}): Promise<ResponseStream<T>> {
    if (this.closed) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the request-plane client is closed')
    const a = typeof address === 'string' ? parseInstanceAddress(address) : address
    const codec = opts.codec ?? this.codec
    if (opts.raw === true && codec !== 'json') throw new KvrError('KVR_ERR_INVALID_OPTION', 'raw response items need the json codec')
    const id = opts.requestId ?? randomUUID()
    const subject = randomUUID()
    const listener = await this.responseListener()
    const header = encodeControlHeader({ id, codec, address: listener.address, subject })
    const frame = encodeRequestFrame(
      a.endpointPath,
      { 'request-id': id, 'x-endpoint-path': a.endpointPath },
      encodeTwoPart(header, opts.encoded === true ? (payload as Uint8Array) : encodePayload(payload, codec), this.o.maxMessageBytes),
      this.o.maxMessageBytes,
    )
    const stream = new ResponseStream<T>(subject, {
      codec,
      connectTimeoutMs: this.o.ackTimeoutMs,
      killAfterMs: this.o.killAfterMs,
      counters: this.counters,
      onEnd: () => listener.forget(subject),
      ...(opts.raw === undefined ? {} : { raw: opts.raw }),
      ...(opts.signal === undefined ? {} : { signal: opts.signal }),
    })
    // registered before the request leaves: the worker may dial back before its acknowledgement arrives
    listener.expect(stream as ResponseStream<unknown>)
    try {
      const conn = await this.connection(a)
      await conn.send(frame, this.o.ackTimeoutMs)
    } catch (err) {
      stream.abandon(err as Error)
      throw err
    }
    return stream
  }

  /** A connection to a's worker with room for one more request: the least busy, or a new one. */
  private async connection(a: InstanceAddress): Promise<RequestConnection> {
    const list = this.pools.get(a.hostPort) ?? []
    let best: RequestConnection | null = null
    for (const c of list) if (c.usable && (best === null || c.inFlight < best.inFlight)) best = c
    if (best !== null && (best.inFlight < this.o.inFlightPerConnection || list.length >= this.o.connectionsPerWorker)) return best
    const opening = this.opening.get(a.hostPort)
    if (opening !== undefined) return opening
    const p = RequestConnection.open(a.host, a.port, a.hostPort, {
      connectTimeoutMs: this.o.connectTimeoutMs,
      maxMessageBytes: this.o.maxMessageBytes,
      counters: this.counters,
      onClose: (c) => this.dropConnection(c),
    })
    this.opening.set(a.hostPort, p)
    try {
      const c = await p
      if (this.closed) {
        c.close()
        throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the request-plane client is closed')
      }
      const now = this.pools.get(a.hostPort) ?? []
      now.push(c)
      this.pools.set(a.hostPort, now)
      return c
    } finally {
      this.opening.delete(a.hostPort)
    }
  }

  private dropConnection(c: RequestConnection): void {
    const list = this.pools.get(c.hostPort)
    if (list === undefined) return
    const i = list.indexOf(c)
    if (i >= 0) list.splice(i, 1)
    if (list.length === 0) this.pools.delete(c.hostPort)
  }

  /** Closes every connection and the listener; requests in flight fail. */
  async close(): Promise<void> {
    this.closed = true
    for (const list of [...this.pools.values()]) for (const c of [...list]) c.close()
    const l = this.listener
    this.listener = null
    if (l !== null) await (await l).close()
  }
}
