// One request's response stream, as the worker sends it on the connection it dials back
// (tcp/client.rs@5b7cf2be): a prologue (`{"error":null}`, or the error that kept the stream from
// starting), data messages, and `"sentinel"`. The caller reads the items as an async iterable
// and ends with the message marked `complete_final`; a stream that ends without it is an error
// (Dynamo's egress turns it into one too, network.rs@7feb2b81). A caller that goes away (its
// signal aborts, or it stops iterating) sends `"stop"`, then `"kill"` when the worker has not
// ended the stream a moment later, then drops the connection.
import type { Socket } from 'node:net'
import { KvrError } from '../errors.js'
import type { RequestPlaneCounters } from './counters.js'
import { controlOf, encodeControl, prologueError, unwrapData, unwrapJsonBytes } from './control-message.js'
import type { Control, Wrapped } from './control-message.js'
import type { PayloadCodec } from './payload-codec.js'
import type { TwoPartMessage } from './two-part.js'
import { encodeTwoPart } from './two-part.js'

export interface ResponseStreamOptions {
  codec: PayloadCodec
  /** Items as the worker's JSON bytes of each `data` (JSON codec only), not decoded values. */
  raw?: boolean
  /** How long the worker has to dial back after accepting the request. */
  connectTimeoutMs: number
  /** After `"stop"`, how long before `"kill"`, and after that before the connection is dropped. */
  killAfterMs: number
  signal?: AbortSignal
  counters: RequestPlaneCounters
  /** Called once the stream has ended, however it ended. */
  onEnd: () => void
}

type State = 'waiting' | 'prologue' | 'open' | 'ended'

/** Above this many unread items the connection is paused, below the low mark resumed. */
const HIGH_WATER = 64
const LOW_WATER = 16

export class ResponseStream<T> implements AsyncIterableIterator<T> {
  private state: State = 'waiting'
  private readonly items: T[] = []
  private error: Error | null = null
  private finalSeen = false
  private socket: Socket | null = null
  private waiter: { resolve: (r: IteratorResult<T>) => void; reject: (err: Error) => void } | null = null
  private cancelled = false
  private timer: NodeJS.Timeout | null = null
  private readonly abortListener: (() => void) | null = null
  private ended = false

  constructor(
    readonly subject: string,
    private readonly opts: ResponseStreamOptions,
  ) {
    this.timer = setTimeout(
      () => this.fail(new KvrError('KVR_ERR_ACK_TIMEOUT', `the worker did not open the response stream within ${opts.connectTimeoutMs} ms`)),
      opts.connectTimeoutMs,
    )
    const signal = opts.signal
    if (signal !== undefined) {
      if (signal.aborted) queueMicrotask(() => this.cancel())
      else {
        this.abortListener = () => this.cancel()
        signal.addEventListener('abort', this.abortListener, { once: true })
      }
    }
  }

  [Symbol.asyncIterator](): this {
    return this
  }

  next(): Promise<IteratorResult<T>> {
    const item = this.items.shift()
    if (item !== undefined) {
      if (this.items.length < LOW_WATER && this.socket?.isPaused() === true) this.socket.resume()
      return Promise.resolve({ value: item, done: false })
    }
    if (this.error !== null) return Promise.reject(this.error)
    if (this.finalSeen || this.state === 'ended') return Promise.resolve({ value: undefined, done: true })
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject }
    })
  }

  /** The caller stopped reading: the worker is told to stop. */
  return(): Promise<IteratorResult<T>> {
    this.cancel()
    return Promise.resolve({ value: undefined, done: true })
  }

  /** The caller went away: `"stop"`, then `"kill"`, then the connection is dropped. */
  cancel(): void {
    // after the final message there is nothing to stop: the sentinel follows
    if (this.cancelled || this.ended || this.finalSeen) return
    this.cancelled = true
    this.error ??= new KvrError('KVR_ERR_REQUEST_CANCELLED', 'the response stream was cancelled by its caller')
    this.wake()
    if (this.socket !== null) {
      // unread items are dropped: the worker's close must be seen even when reading was paused
      this.items.length = 0
      this.socket.resume()
      this.stopWorker()
    }
  }

  private stopWorker(): void {
    this.opts.counters.stops++
    this.control('stop')
    this.clearTimer()
    this.timer = setTimeout(() => {
      this.opts.counters.kills++
      this.control('kill')
      this.timer = setTimeout(() => this.end(), this.opts.killAfterMs)
    }, this.opts.killAfterMs)
  }

  private control(c: Control): void {
    if (this.socket !== null && !this.socket.destroyed) this.socket.write(encodeTwoPart(encodeControl(c), Buffer.alloc(0)))
  }

  /** The worker dialled back with this stream's subject (response-listener.ts). */
  attach(socket: Socket): void {
    this.socket = socket
    this.state = 'prologue'
    this.opts.counters.streams++
    if (this.cancelled) this.stopWorker()
    else this.clearTimer()
  }

  /** One message after the handshake. Throws KVR_ERR_FRAME_MALFORMED (the listener drops the connection). */
  message(m: TwoPartMessage): void {
    const header = m.header.length > 0
    const body = m.body.length > 0
    if (this.state === 'prologue') {
      if (!header || body) throw new KvrError('KVR_ERR_FRAME_MALFORMED', 'the response stream does not start with its prologue')
      const error = prologueError(m.header)
      this.state = 'open'
      if (error !== null) this.fail(new KvrError('KVR_ERR_RESPONSE_STREAM', `the worker could not start the response stream: ${error}`))
      return
    }
    if (this.state !== 'open') return
    if (header && !body) {
      const c = controlOf(m.header)
      if (c !== 'sentinel') throw new KvrError('KVR_ERR_FRAME_MALFORMED', `the worker sent "${c}" on its response stream`)
      if (!this.finalSeen && !this.cancelled) this.fail(new KvrError('KVR_ERR_RESPONSE_STREAM', 'the response stream ended without its final message'))
      else this.end()
      return
    }
    if (header || !body) throw new KvrError('KVR_ERR_FRAME_MALFORMED', 'a response stream message that is neither data nor control')
    if (this.cancelled) return
    const w: Wrapped<unknown> = this.opts.raw === true ? unwrapJsonBytes(m.body) : unwrapData(m.body, this.opts.codec)
    if (w.data !== undefined) this.items.push(w.data as T)
    if (w.final && !this.finalSeen) {
      this.finalSeen = true
      // the sentinel follows; a worker that never sends it does not hold the stream open
      this.clearTimer()
      this.timer = setTimeout(() => this.end(), this.opts.killAfterMs)
    }
    if (this.items.length > HIGH_WATER && this.socket !== null && !this.socket.isPaused()) this.socket.pause()
    this.wake()
  }

  /** The worker's connection closed. */
  closed(): void {
    if (this.state === 'ended') return
    if (this.finalSeen || this.cancelled) this.end()
    else this.fail(new KvrError('KVR_ERR_RESPONSE_STREAM', 'the response stream connection closed before its final message'))
  }

  /** Its request was never accepted: ends it without counting a stream error. */
  abandon(err: Error): void {
    this.error ??= err
    this.cancelled = true
    this.end()
  }

  /** Ends the stream with an error; the connection is dropped. */
  fail(err: Error): void {
    if (this.state === 'ended') return
    if (!this.cancelled) {
      this.opts.counters.streamErrors++
      this.error ??= err
    }
    this.socket?.destroy()
    this.end()
  }

  private end(): void {
    if (this.ended) return
    this.ended = true
    this.state = 'ended'
    this.clearTimer()
    if (this.abortListener !== null) this.opts.signal?.removeEventListener('abort', this.abortListener)
    // the worker waits for the frontend to close the connection after its sentinel; one that was
    // told to stop, or failed, is dropped
    if (this.socket !== null && !this.socket.destroyed) {
      if (this.finalSeen && !this.cancelled && this.error === null) this.socket.end()
      else this.socket.destroy()
    }
    this.wake()
    this.opts.onEnd()
  }

  private clearTimer(): void {
    if (this.timer !== null) clearTimeout(this.timer)
    this.timer = null
  }

  private wake(): void {
    const w = this.waiter
    if (w === null) return
    const item = this.items.shift()
    if (item !== undefined) {
      this.waiter = null
      w.resolve({ value: item, done: false })
    } else if (this.error !== null) {
      this.waiter = null
      w.reject(this.error)
    } else if (this.finalSeen || this.state === 'ended') {
      this.waiter = null
      w.resolve({ value: undefined, done: true })
    }
  }
}
