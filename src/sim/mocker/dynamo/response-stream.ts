// The response stream of one request: the worker dials back ("calls home") to the address the
// frontend put in the request's connection_info and speaks TwoPartCodec on that connection
// (lib/runtime/src/pipeline/network/tcp/client.rs@5b7cf2be; ingress/push_handler.rs):
//
//   worker → frontend  header {"subject":"<uuid>","stream_type":"response"}    the handshake
//   worker → frontend  header {"error":null} (or {"error":"…"})                  the prologue
//   worker → frontend  body   {"data":<item>,"complete_final":false}          per item
//   worker → frontend  body   {"data":null,"complete_final":true}             the clean end
//   worker → frontend  header "sentinel"                                       then close
//   frontend → worker  header "stop" | "kill"                                 cancellation
//
// Bodies use the request's payload codec (JSON, or named MessagePack); headers are JSON.
import { connect } from 'node:net'
import type { Socket } from 'node:net'
import { MsgpackWriter } from './msgpack-writer.js'
import { TwoPartReader, encodeTwoPart } from './two-part-codec.js'

export type PayloadCodec = 'json' | 'msgpack'

/** TcpStreamConnectionInfo, from the `info` string of the request's connection_info. */
export interface CallHomeInfo {
  address: string
  subject: string
  context: string
  stream_type: string
}

export type Cancel = 'stop' | 'kill'

const HEADER_SENTINEL = Buffer.from('"sentinel"')

export class ResponseStream {
  private readonly writer: MsgpackWriter | null
  private ended = false
  private cancelled: Cancel | null = null
  /** Items sent so far (the final marker not counted). */
  items = 0
  /** Called once when the stream ends or is cut. */
  onEnd: () => void = () => undefined

  private constructor(
    private readonly socket: Socket,
    readonly codec: PayloadCodec,
    private readonly onCancel: (c: Cancel) => void,
  ) {
    this.writer = codec === 'msgpack' ? new MsgpackWriter(256) : null
    const reader = new TwoPartReader(1 << 20)
    socket.on('data', (chunk: Buffer) => {
      let msgs: ReturnType<TwoPartReader['push']>
      try {
        msgs = reader.push(chunk)
      } catch {
        this.cancel('kill')
        return
      }
      for (const m of msgs) {
        const t = m.header.toString('utf8')
        if (t === '"stop"') this.cancel('stop')
        else if (t === '"kill"') this.cancel('kill')
      }
    })
    // the frontend going away ends the request as a kill does
    socket.on('close', () => this.cancel('kill'))
    socket.on('error', () => undefined)
  }

  /**
   * Dials the frontend and sends the handshake and the prologue (`error` set for a request that
   * fails before its first item: the stream then ends). Rejects when the address cannot be reached.
   */
  static open(info: CallHomeInfo, codec: PayloadCodec, onCancel: (c: Cancel) => void, error: string | null = null): Promise<ResponseStream> {
    const colon = info.address.lastIndexOf(':')
    const host = info.address.slice(0, colon).replace(/^\[|\]$/g, '')
    const port = Number(info.address.slice(colon + 1))
    return new Promise((resolve, reject) => {
      const socket = connect({ host, port, noDelay: true })
      socket.once('error', reject)
      socket.once('connect', () => {
        socket.off('error', reject)
        const s = new ResponseStream(socket, codec, onCancel)
        s.header(JSON.stringify({ subject: info.subject, stream_type: 'response' }))
        s.header(error === null ? '{"error":null}' : JSON.stringify({ error }))
        resolve(s)
      })
    })
  }

  private cancel(c: Cancel): void {
    if (this.ended) return
    if (this.cancelled !== null && (this.cancelled === 'kill' || c === 'stop')) return
    this.cancelled = c
    this.onCancel(c)
  }

  private header(json: string): void {
    this.socket.write(encodeTwoPart(Buffer.from(json, 'utf8'), null))
  }

  /** One stream item of a JSON stream, as JSON text (which keeps u64s exact). */
  sendJson(json: string): void {
    if (this.ended) return
    this.items++
    this.socket.write(encodeTwoPart(null, Buffer.from(`{"data":${json},"complete_final":false}`, 'utf8')))
  }

  /** One stream item of a MessagePack stream, as a value for the writer. */
  sendValue(value: unknown): void {
    if (this.ended) return
    this.items++
    this.socket.write(encodeTwoPart(null, (this.writer as MsgpackWriter).reset().map(2).str('data').value(value).str('complete_final').bool(false).bytes()))
  }

  /** One item given both ways; the stream's codec picks. */
  send(json: () => string, value: () => unknown): void {
    if (this.writer === null) this.sendJson(json())
    else this.sendValue(value())
  }

  private body(json: string, value: unknown): void {
    const bytes = this.writer === null ? Buffer.from(json, 'utf8') : this.writer.reset().value(value).bytes()
    this.socket.write(encodeTwoPart(null, bytes))
  }

  /**
   * Ends the stream: the complete_final marker (unless the frontend killed the stream, which
   * stops the writer at once; and after an error prologue, which has no items) and the sentinel,
   * then the connection is closed.
   */
  end(final = true): void {
    if (this.ended) return
    this.ended = true
    this.onEnd()
    if (final && this.cancelled !== 'kill') this.body('{"data":null,"complete_final":true}', { data: null, complete_final: true })
    this.socket.end(encodeTwoPart(HEADER_SENTINEL, null))
  }

  /** Cuts the connection without the closing messages (shutdown). */
  destroy(): void {
    if (!this.ended) this.onEnd()
    this.ended = true
    this.socket.destroy()
  }
}
