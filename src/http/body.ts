// Reading a request body whole, for the JSON routes whose bytes the proxy forwards. fastify's own
// reader always copies the body into a buffer of its own; Node's HTTP server already hands each
// chunk over as a buffer of its own, and a body that arrives in one chunk (any but the largest,
// on a local network) is kept as it came. That spares one ArrayBuffer per request, which only a
// GC frees: with 4,096-token prompts the router made 53 KB of them per request, and V8 counts
// that memory against the old generation's headroom until it set off a mark-compact every few
// seconds (bench/HISTORY.md, bench:route, session 13).
import type { Readable } from 'node:stream'
import { KvrError } from '../errors.js'

/**
 * Reads `payload` to its end: `done(null, bytes)`, or `done(err)` once: a body over `limit`
 * bytes (413, as soon as the Content-Length or the bytes received say so), one shorter or longer
 * than its Content-Length (400), or a client that went away mid-upload (499, not a server error).
 * The limit counts the bytes as they arrive; a preParsing hook that decompressed the body would
 * need fastify's check of the encoded length too (none is installed).
 */
export function readBody(payload: Readable, limit: number, contentLength: string | undefined, done: (err: Error | null, bytes?: Buffer) => void): void {
  const declared = contentLength === undefined ? Number.NaN : Number(contentLength)
  if (declared > limit) return done(tooLarge(limit))
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
    if (received > limit) return finish(tooLarge(limit))
    if (first === null) first = b
    else (rest ??= [first]).push(b)
  }
  const onEnd = (): void => {
    if (!Number.isNaN(declared) && received !== declared) return finish(new KvrError('KVR_ERR_INVALID_REQUEST', `the body has ${received} bytes, its Content-Length says ${declared}`))
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

function tooLarge(limit: number): KvrError {
  return new KvrError('KVR_ERR_BODY_TOO_LARGE', `the request body is larger than the limit of ${limit} bytes (--http-body-limit)`)
}
