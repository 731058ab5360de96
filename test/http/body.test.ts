import t from 'tap'
import { PassThrough } from 'node:stream'
import { readBody } from '../../src/http/body.js'

type Result = { err: Error | null; bytes: Buffer | undefined; calls: number }

/** Feeds `chunks` to readBody through a stream; resolves with what it reported (and how often). */
function read(chunks: (Buffer | string)[], opts: { limit?: number; contentLength?: string; fail?: Error } = {}): Promise<Result> {
  return new Promise((resolve) => {
    const s = new PassThrough()
    const r: Result = { err: null, bytes: undefined, calls: 0 }
    readBody(s, opts.limit ?? 1 << 20, opts.contentLength, (err, bytes) => {
      r.calls++
      r.err = err
      r.bytes = bytes
      // a second report would show up in `calls`
      setImmediate(() => resolve(r))
    })
    for (const c of chunks) s.write(c)
    if (opts.fail !== undefined) s.destroy(opts.fail)
    else s.end()
  })
}

t.test('a body in one chunk that owns its memory is the body itself: no copy', async (t) => {
  const chunk = Buffer.alloc(25_000, 7)
  const r = await read([chunk], { contentLength: '25000' })
  t.equal(r.err, null)
  t.equal(r.bytes, chunk, 'the very buffer')
})

t.test('a chunk that is a view into a larger buffer is copied', async (t) => {
  const shared = Buffer.alloc(64, 1)
  const view = shared.subarray(8, 40)
  const r = await read([view])
  t.not(r.bytes, view)
  t.same(r.bytes, Buffer.alloc(32, 1))
  shared.fill(2)
  t.same(r.bytes, Buffer.alloc(32, 1), 'the body does not change when the shared memory is reused')
})

t.test('several chunks are joined in order; strings are taken as UTF-8', async (t) => {
  const r = await read([Buffer.from('{"a":'), 'é', Buffer.from('1}')], { contentLength: String(Buffer.byteLength('{"a":é1}')) })
  t.equal(r.err, null)
  t.equal(r.bytes?.toString('utf8'), '{"a":é1}')
})

t.test('an empty body is an empty buffer', async (t) => {
  const r = await read([])
  t.equal(r.err, null)
  t.equal(r.bytes?.length, 0)
})

t.test('over the limit: 413 at once from the Content-Length, or as soon as the bytes pass it', async (t) => {
  const declared = await read([Buffer.alloc(10)], { limit: 100, contentLength: '101' })
  t.match(declared.err, { code: 'KVR_ERR_BODY_TOO_LARGE', statusCode: 413 })
  t.equal(declared.calls, 1)
  const streamed = await read([Buffer.alloc(60), Buffer.alloc(60), Buffer.alloc(60)], { limit: 100 })
  t.match(streamed.err, { code: 'KVR_ERR_BODY_TOO_LARGE', message: /100 bytes/ })
  t.equal(streamed.calls, 1, 'reported once, however much more comes')
  const exact = await read([Buffer.alloc(100)], { limit: 100, contentLength: '100' })
  t.equal(exact.err, null, 'the limit itself is allowed')
})

t.test('a body shorter or longer than its Content-Length is a 400', async (t) => {
  const short = await read([Buffer.alloc(10)], { contentLength: '11' })
  t.match(short.err, { code: 'KVR_ERR_INVALID_REQUEST', message: /10 bytes, its Content-Length says 11/ })
  const long = await read([Buffer.alloc(12)], { contentLength: '11' })
  t.match(long.err, { code: 'KVR_ERR_INVALID_REQUEST' })
})

t.test('a stream that fails (the client went away) is a cancelled request, reported once, not a server error', async (t) => {
  const boom = Object.assign(new Error('aborted'), { code: 'ECONNRESET' })
  const r = await read([Buffer.alloc(10)], { fail: boom })
  t.match(r.err, { code: 'KVR_ERR_REQUEST_CANCELLED', statusCode: 499, message: /went away.*aborted/ })
  t.equal((r.err as Error & { cause?: unknown }).cause, boom, "the stream's error is kept as the cause")
  t.equal(r.calls, 1)
})
