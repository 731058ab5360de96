// One TCP connection to a worker's request-plane server. Requests are written back to back
// (pipelined) and the worker acknowledges them in the order they came, so each acknowledgement
// settles the oldest request still waiting (egress/tcp_client.rs@c0150325: FIFO correlation, no
// ids). A request not acknowledged in time fails alone; its slot stays in the queue and swallows
// its late acknowledgement, the connection takes no new request, and it closes once nothing it
// carries waits any more. A connection whose acknowledgements do not decode, or that is lost,
// fails everything waiting on it.
import { createConnection } from 'node:net'
import type { Socket } from 'node:net'
import { KvrError } from '../errors.js'
import type { RequestPlaneCounters } from './counters.js'
import { AckDecoder } from './tcp-frame.js'

interface Slot {
  resolve: () => void
  reject: (err: Error) => void
  timer: NodeJS.Timeout | null
  settled: boolean
}

const OVERLOADED = /^Server (overloaded|unavailable)\b/

export class RequestConnection {
  private readonly slots: Slot[] = []
  private head = 0
  private readonly acks: AckDecoder
  private draining = false
  private closed = false

  private constructor(
    private readonly socket: Socket,
    readonly hostPort: string,
    maxMessageBytes: number,
    private readonly counters: RequestPlaneCounters,
    private readonly onClose: (c: RequestConnection) => void,
  ) {
    this.acks = new AckDecoder(maxMessageBytes)
    socket.setNoDelay(true)
    socket.on('data', (chunk: Buffer) => {
      try {
        this.acks.push(chunk, (data) => this.acked(data))
      } catch (err) {
        this.counters.malformed++
        this.fail(err as Error)
      }
    })
    socket.on('error', (err) => this.fail(new KvrError('KVR_ERR_RESPONSE_STREAM', `the connection to ${hostPort} failed: ${err.message}`)))
    socket.on('close', () => this.fail(new KvrError('KVR_ERR_RESPONSE_STREAM', `the connection to ${hostPort} closed`)))
  }

  /** Opens a connection; rejects with KVR_ERR_RESPONSE_STREAM when it cannot be opened in time. */
  static open(
    host: string,
    port: number,
    hostPort: string,
    opts: { connectTimeoutMs: number; maxMessageBytes: number; counters: RequestPlaneCounters; onClose: (c: RequestConnection) => void },
  ): Promise<RequestConnection> {
    return new Promise((resolve, reject) => {
      const socket = createConnection({ host, port })
      const timer = setTimeout(() => socket.destroy(new Error(`no connection within ${opts.connectTimeoutMs} ms`)), opts.connectTimeoutMs)
      const failed = (err: Error): void => {
        clearTimeout(timer)
        opts.counters.connectionErrors++
        reject(new KvrError('KVR_ERR_RESPONSE_STREAM', `cannot connect to worker ${hostPort}: ${err.message}`))
      }
      socket.once('error', failed)
      socket.once('connect', () => {
        clearTimeout(timer)
        socket.off('error', failed)
        resolve(new RequestConnection(socket, hostPort, opts.maxMessageBytes, opts.counters, opts.onClose))
      })
    })
  }

  /** Requests waiting for their acknowledgement. */
  get inFlight(): number {
    return this.slots.length - this.head
  }

  /** Whether a new request may be written here. */
  get usable(): boolean {
    return !this.closed && !this.draining
  }

  /**
   * Writes one request frame; resolves when the worker accepts it. Rejects with
   * KVR_ERR_WORKER_OVERLOADED, KVR_ERR_WORKER_REJECTED, KVR_ERR_ACK_TIMEOUT or (connection lost)
   * KVR_ERR_RESPONSE_STREAM.
   */
  send(frame: Buffer, ackTimeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.closed) {
        reject(new KvrError('KVR_ERR_RESPONSE_STREAM', `the connection to ${this.hostPort} is closed`))
        return
      }
      const slot: Slot = { resolve, reject, timer: null, settled: false }
      slot.timer = setTimeout(() => {
        if (slot.settled) return
        slot.settled = true
        this.counters.ackTimeouts++
        this.draining = true
        reject(new KvrError('KVR_ERR_ACK_TIMEOUT', `worker ${this.hostPort} did not acknowledge the request within ${ackTimeoutMs} ms`))
        this.closeIfIdle()
      }, ackTimeoutMs)
      this.slots.push(slot)
      this.counters.requests++
      this.socket.write(frame)
    })
  }

  private acked(data: Buffer): void {
    const slot = this.slots[this.head]
    if (slot === undefined) {
      // an acknowledgement for no request: the worker's framing and ours disagree
      this.counters.malformed++
      this.fail(new KvrError('KVR_ERR_FRAME_MALFORMED', `worker ${this.hostPort} acknowledged a request it was not sent`))
      return
    }
    this.slots[this.head++] = undefined as unknown as Slot
    if (this.head > 1024 && this.head * 2 > this.slots.length) {
      this.slots.splice(0, this.head)
      this.head = 0
    }
    if (!slot.settled) {
      slot.settled = true
      if (slot.timer !== null) clearTimeout(slot.timer)
      if (data.length === 0) {
        this.counters.accepted++
        slot.resolve()
      } else {
        const text = data.toString('utf8')
        const overloaded = OVERLOADED.test(text)
        if (overloaded) this.counters.overloaded++
        else this.counters.rejected++
        slot.reject(
          new KvrError(
            overloaded ? 'KVR_ERR_WORKER_OVERLOADED' : 'KVR_ERR_WORKER_REJECTED',
            `worker ${this.hostPort} refused the request: ${text.slice(0, 300)}`,
          ),
        )
      }
    }
    this.closeIfIdle()
  }

  /** A draining connection closes when no request on it waits for a live caller. */
  private closeIfIdle(): void {
    if (!this.draining) return
    for (let i = this.head; i < this.slots.length; i++) if (!(this.slots[i] as Slot).settled) return
    this.close()
  }

  private fail(err: Error): void {
    if (this.closed) return
    this.closed = true
    let waiting = false
    for (let i = this.head; i < this.slots.length; i++) {
      const slot = this.slots[i] as Slot
      if (slot.settled) continue
      waiting = true
      slot.settled = true
      if (slot.timer !== null) clearTimeout(slot.timer)
      slot.reject(err)
    }
    if (waiting && !(err instanceof KvrError && err.code !== 'KVR_ERR_RESPONSE_STREAM')) this.counters.connectionErrors++
    this.slots.length = 0
    this.head = 0
    this.socket.destroy()
    this.onClose(this)
  }

  close(): void {
    this.fail(new KvrError('KVR_ERR_RESPONSE_STREAM', `the connection to ${this.hostPort} was closed by the router`))
  }
}
