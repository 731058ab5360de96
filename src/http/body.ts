// Reading a request body whole, for the JSON routes whose bytes the proxy forwards. fastify's own
// reader always copies the body into a buffer of its own; Node's HTTP server already hands each
// chunk over as a buffer of its own, and a body that arrives in one chunk (any but the largest,
// on a local network) is kept as it came. That spares one ArrayBuffer per request, which only a
// GC frees: with 4,096-token prompts the router made 53 KB of them per request, and V8 counts
// that memory against the old generation's headroom until it set off a mark-compact every few
// seconds under load.
import type { Readable } from 'node:stream'
import { KvrError } from '../errors.js'

/**
 * An oversized upload is read to its end and dropped before the 413 is sent, up to this many bytes
 * past the limit and this long. Answered mid-upload, the client would be still sending when the
 * connection closes behind the answer, and the kernel resets a connection with unread bytes: the
 * client sees ECONNRESET or EPIPE, not the 413. Beyond the allowance the 413 goes at once and the
 * connection is closed: a client that sends that much past the limit is not waited for.
 */
const DRAIN_BYTES = 256 * 1024 * 1024
const DRAIN_MS = 10_000

/**
 * Reads `payload` to its end: `done(null, bytes)`, or `done(err)` once: a body over `limit`
 * bytes (413 once the rest is drained, see DRAIN_BYTES), one shorter or longer than its
 * Content-Length (400), or a client that went away mid-upload (499, not a server error).
 * The limit counts the bytes as they arrive; a preParsing hook that decompressed the body would
 * need fastify's check of the encoded length too (none is installed).
 */
export function readBody(payload: Readable, limit: number, contentLength: string | undefined, done: (err: Error | null, bytes?: Buffer) => void): void {
  const declared = contentLength === undefined ? Number.NaN : Number(contentLength)
  if (declared > limit) return drain(payload, limit, declared, 0, done)
  let received = 0
  let first: Buffer | null = null
  let rest: Buffer[] | null = null
  const finish = (err: Error | null, bytes?: Buffer): void => {
    payload.off('data', onData)
    payload.off('end', onEnd)
    payload.off('error', onError)
    done(err, bytes)
  }
  const onData = (chunk: Buffer | string): void => {
    const b = typeof chunk === 'string' ? Buffer.from(chunk) : chunk
    received += b.length
    if (received > limit) {
      payload.off('data', onData)
      payload.off('end', onEnd)
      payload.off('error', onError)
      first = null
      rest = null
      return drain(payload, limit, declared, received, done)
    }
    if (first === null) first = b
    else (rest ??= [first]).push(b)
  }
  const onEnd = (): void => {
    if (!Number.isNaN(declared) && received !== declared)
      return finish(new KvrError('KVR_ERR_INVALID_REQUEST', `the body has ${received} bytes, its Content-Length says ${declared}`))
    if (rest !== null) return finish(null, Buffer.concat(rest, received))
    if (first === null) return finish(null, Buffer.alloc(0))
    // a view into memory something else may reuse (a shared read buffer) is copied; a buffer
    // that owns its memory is the body itself
    const owned = first.byteOffset === 0 && first.buffer.byteLength === first.length
    finish(null, owned ? first : Buffer.from(first))
  }
  const onError = (err: Error): void => {
    finish(new KvrError('KVR_ERR_REQUEST_CANCELLED', `the client went away before its body was complete (${err.message})`, { cause: err }))
  }
  payload.on('data', onData)
  payload.on('end', onEnd)
  payload.on('error', onError)
  payload.resume()
}

/** Reads and drops the rest of an oversized body, then answers 413 (see DRAIN_BYTES). */
function drain(payload: Readable, limit: number, declared: number, received: number, done: (err: Error | null) => void): void {
  const err = tooLarge(limit)
  if (declared - received > DRAIN_BYTES) return closeAfter(payload, err, done)
  let dropped = received
  let settled = false
  const settle = (close: boolean): void => {
    if (settled) return
    settled = true
    clearTimeout(timer)
    payload.off('data', onData)
    payload.off('end', onEnd)
    payload.off('error', onEnd)
    if (close) closeAfter(payload, err, done)
    else done(err)
  }
  const onData = (chunk: Buffer | string): void => {
    dropped += chunk.length
    if (dropped - received > DRAIN_BYTES) settle(true)
  }
  const onEnd = (): void => settle(false)
  const timer = setTimeout(() => settle(true), DRAIN_MS)
  payload.on('data', onData)
  payload.on('end', onEnd)
  payload.on('error', onEnd)
  payload.resume()
}

/** Answers `err` and closes the connection behind the answer, without reading the rest. */
function closeAfter(payload: Readable, err: KvrError, done: (err: Error | null) => void): void {
  const res = (payload as Readable & { socket?: { _httpMessage?: { setHeader(name: string, value: string): void } } }).socket?._httpMessage
  res?.setHeader('connection', 'close')
  payload.pause()
  done(err)
}

function tooLarge(limit: number): KvrError {
  return new KvrError('KVR_ERR_BODY_TOO_LARGE', `the request body is larger than the limit of ${limit} bytes (--http-body-limit)`)
}
