// The proxy's own chunked framing (src/http/proxy/chunked.ts) and its first-event rewrite: what a client
// reads off the wire must be exactly what Node's own framing would have produced.
import t from 'tap'
import { createServer } from 'node:http'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { connect } from 'node:net'
import { chunkFrame, ChunkWriter } from '../../../src/http/proxy/chunked.js'
import { endsEvent, endsWithDone, eventEnd, injectWorkerId, lastEventEnd } from '../../../src/http/proxy/sse.js'

/** Decodes a chunked body; throws on any framing error. */
function unchunk(body: Buffer): Buffer[] {
  const chunks: Buffer[] = []
  let at = 0
  for (;;) {
    const eol = body.indexOf('\r\n', at)
    if (eol < 0) throw new Error(`no size line at ${at}`)
    const line = body.toString('latin1', at, eol)
    if (!/^[0-9a-f]+$/.test(line)) throw new Error(`bad size line ${JSON.stringify(line)}`)
    const n = parseInt(line, 16)
    if (n === 0) {
      if (body.toString('latin1', eol + 2) !== '\r\n') throw new Error('bad last chunk')
      return chunks
    }
    const data = body.subarray(eol + 2, eol + 2 + n)
    if (data.length !== n || body.toString('latin1', eol + 2 + n, eol + 4 + n) !== '\r\n') throw new Error(`chunk of ${n} bytes cut short`)
    chunks.push(Buffer.from(data))
    at = eol + 4 + n
  }
}

t.test('chunkFrame: size line in lowercase hex, data, CRLF, for sizes across every digit count', async (t) => {
  for (const n of [1, 9, 10, 15, 16, 17, 255, 256, 4095, 4096, 4097, 65535, 65536, 1 << 20]) {
    const data = Buffer.alloc(n)
    for (let i = 0; i < n; i++) data[i] = (i * 31 + n) & 0xff
    const frame = chunkFrame(data)
    const eol = frame.indexOf('\r\n')
    t.equal(frame.toString('latin1', 0, eol), n.toString(16), `size line of ${n}`)
    t.equal(frame.length, eol + 2 + n + 2, `length of ${n}`)
    t.ok(frame.subarray(eol + 2, eol + 2 + n).equals(data), `data of ${n}`)
    t.equal(frame.toString('latin1', frame.length - 2), '\r\n', `trailing CRLF of ${n}`)
  }
  const view = Buffer.from('xxhello, worldyy').subarray(2, 14)
  t.equal(chunkFrame(view).toString(), 'c\r\nhello, world\r\n', 'a view frames only its own bytes')
})

/**
 * A server whose handler streams `parts` through a ChunkWriter, then ends the response: with
 * res.end(), or with ChunkWriter.end() given the last part (`lastWithEnd`). `writes` counts the
 * socket writes each end took.
 */
async function server(parts: string[], lastWithEnd = false, writes: number[] = []): Promise<{ port: number; close: () => Promise<void> }> {
  const srv = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume()
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      const w = new ChunkWriter(res)
      const body = lastWithEnd ? parts.slice(0, -1) : parts
      w.begin(Buffer.from(body[0] as string))
      for (const p of body.slice(1)) w.write(Buffer.from(p))
      const sock = res.socket as unknown as { _write: (...a: unknown[]) => void; _writev: (...a: unknown[]) => void } | null
      let n = 0
      const spy = (name: '_write' | '_writev'): void => {
        if (sock === null) return
        const orig = sock[name]
        sock[name] = function (this: unknown, ...a: unknown[]) {
          n++
          return orig.apply(this, a)
        }
      }
      spy('_write')
      spy('_writev')
      if (lastWithEnd) w.end(Buffer.from(parts[parts.length - 1] as string))
      else res.end()
      writes.push(n)
      if (sock !== null) {
        delete (sock as Partial<typeof sock>)._write
        delete (sock as Partial<typeof sock>)._writev
      }
    })
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  return { port: (srv.address() as { port: number }).port, close: () => new Promise<void>((r) => srv.close(() => r())) }
}

/** Sends raw request text on one connection; resolves with everything read once `done` says so or the peer closes. */
function rawExchange(port: number, request: string, done: (got: Buffer) => boolean): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1', () => s.write(request))
    let got = Buffer.alloc(0)
    s.on('data', (d: Buffer) => {
      got = Buffer.concat([got, d])
      if (done(got)) {
        s.destroy()
        resolve(got)
      }
    })
    s.on('end', () => resolve(got))
    s.on('error', reject)
  })
}

const PARTS = ['data: {"a":1}\n\n', 'data: {"b":2}\n\n', 'x'.repeat(70_000), 'data: [DONE]\n\n']

t.test('ChunkWriter: HTTP/1.1 responses are chunked correctly and keep the connection for the next request', async (t) => {
  const s = await server(PARTS)
  t.teardown(s.close)
  const req = 'POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n'
  const twoEnds = (b: Buffer): boolean => b.toString('latin1').split('\r\n0\r\n\r\n').length === 3
  const got = await rawExchange(s.port, req + req, twoEnds)
  const text = got.toString('latin1')
  const responses = text.split('HTTP/1.1 200 OK\r\n').slice(1)
  t.equal(responses.length, 2, 'both requests on one connection were answered')
  for (const r of responses) {
    const [head, body] = [r.slice(0, r.indexOf('\r\n\r\n')), r.slice(r.indexOf('\r\n\r\n') + 4)]
    t.match(head.toLowerCase(), 'transfer-encoding: chunked')
    t.notMatch(head.toLowerCase(), 'connection: close')
    const chunks = unchunk(Buffer.from(body, 'latin1'))
    t.same(
      chunks.map((c) => c.toString('latin1')),
      PARTS,
      'one chunk per write, every byte in order',
    )
  }
})

t.test('ChunkWriter.end: the last chunk and the end of the body in one socket write, framed as before', async (t) => {
  const writes: number[] = []
  const s = await server(PARTS, true, writes)
  t.teardown(s.close)
  const req = 'POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n'
  const twoEnds = (b: Buffer): boolean => b.toString('latin1').split('\r\n0\r\n\r\n').length === 3
  const got = await rawExchange(s.port, req + req, twoEnds)
  const responses = got.toString('latin1').split('HTTP/1.1 200 OK\r\n').slice(1)
  t.equal(responses.length, 2, 'the connection served the next request too')
  for (const r of responses) {
    t.same(
      unchunk(Buffer.from(r.slice(r.indexOf('\r\n\r\n') + 4), 'latin1')).map((c) => c.toString('latin1')),
      PARTS,
      'every part in order, the last one in its own chunk',
    )
  }
  // the second request is pipelined: Node holds its response in the response object until the
  // first one is done, and flushes it later, so only the first is counted at the socket
  t.equal(writes.length, 2)
  t.equal(writes[0], 1, 'one socket write for the last chunk and the end')
  const baseline: number[] = []
  const s2 = await server(PARTS, false, baseline)
  t.teardown(s2.close)
  await rawExchange(s2.port, req, (b) => b.toString('latin1').includes('\r\n0\r\n\r\n'))
  t.same(baseline, [1], 'res.end() alone is one write as well (the spy counts what it should)')
})

t.test('ChunkWriter.end: an HTTP/1.0 client gets the last part unframed, then the end of the connection', async (t) => {
  const s = await server(PARTS, true)
  t.teardown(s.close)
  const got = await rawExchange(s.port, 'POST / HTTP/1.0\r\nhost: x\r\ncontent-length: 0\r\n\r\n', () => false)
  const text = got.toString('latin1')
  t.equal(text.slice(text.indexOf('\r\n\r\n') + 4), PARTS.join(''))
})

t.test('endsWithDone: the [DONE] event and its blank line at the very end of a chunk, LF or CRLF', async (t) => {
  const yes = ['data: [DONE]\n\n', 'data:[DONE]\n\n', 'data: [DONE]\r\n\r\n', 'data: {"a":1}\n\ndata: [DONE]\n\n', '[DONE]\n\n']
  const no = ['data: [DONE]\n', 'data: [DONE]', 'data: [DONE]\n\ndata: {"a":1}\n\n', 'data: {"t":"[DONE]"}\n\n', 'data: [DONE] \n\n', '\n\n', '', 'ONE]\n\n']
  for (const x of yes) t.ok(endsWithDone(Buffer.from(x)), JSON.stringify(x))
  for (const x of no) t.notOk(endsWithDone(Buffer.from(x)), JSON.stringify(x))
})

t.test('ChunkWriter: an HTTP/1.0 client gets the plain body and the end of the connection', async (t) => {
  const s = await server(PARTS)
  t.teardown(s.close)
  const got = await rawExchange(s.port, 'POST / HTTP/1.0\r\nhost: x\r\ncontent-length: 0\r\n\r\n', () => false)
  const text = got.toString('latin1')
  t.notMatch(text.toLowerCase(), 'transfer-encoding: chunked')
  t.equal(text.slice(text.indexOf('\r\n\r\n') + 4), PARTS.join(''), 'the body unframed')
})

t.test('injectWorkerId: the spliced event parses to the event plus nvext.worker_id', async (t) => {
  const rank = { workerId: 18446744073709551615n, dpRank: 3 }
  const cases: [string, Record<string, unknown>][] = [
    ['data: {"id":"c","choices":[{"text":"hi"}]}\n\n', { id: 'c', choices: [{ text: 'hi' }] }],
    ['data:{"id":"c"}\n\n', { id: 'c' }],
    ['data: {}\n\n', {}],
    ['data: { \n }\n\n', {}],
    ['data: {"a":{"b":"}"} }\n\n', { a: { b: '}' } }],
    ['data: {"nvext":{"keep":true},"a":1}\n\n', { nvext: { keep: true }, a: 1 }],
    ['data: {"text":"the word \\"nvext\\" in a string"}\n\n', { text: 'the word "nvext" in a string' }],
    [': comment\ndata: {"a":1}\n\n', { a: 1 }],
    ['data: {"a":1}\r\n\r\n', { a: 1 }],
    ['data: {"n\\u0076ext":{"keep":1},"a":1}\n\n', { nvext: { keep: 1 }, a: 1 }],
    ['data: {"t":"caf\\u00e9"}\n\n', { t: 'café' }],
  ]
  for (const [event, obj] of cases) {
    const out = injectWorkerId(event, rank)
    t.ok(out.endsWith('\n\n'), `${JSON.stringify(event)} still ends its event`)
    const data = out.slice(out.indexOf('data:') + 5).trim()
    // the bare integer (not its string twin) made a string, to compare it exactly
    const exact = data.replace(/(?<!")18446744073709551615(?!")/g, '"u64max"')
    const s = '18446744073709551615'
    const ids = {
      prefill_worker_id: 'u64max',
      prefill_worker_id_str: s,
      prefill_dp_rank: 3,
      decode_worker_id: 'u64max',
      decode_worker_id_str: s,
      decode_dp_rank: 3,
    }
    const want = { ...obj, nvext: { ...((obj.nvext as object | undefined) ?? {}), worker_id: ids } }
    t.same(JSON.parse(exact), want, `${JSON.stringify(event)} gains nvext.worker_id with exact ids`)
    t.equal(out.slice(0, out.indexOf('data:')), event.slice(0, event.indexOf('data:')), 'lines before data: kept')
  }
  for (const event of ['data: [DONE]\n\n', 'event: ping\n\n', 'data: "text"\n\n', 'data: {"a":\n\n', 'data: {"a":1}\nid: {1}\n\n']) {
    t.equal(injectWorkerId(event, rank), event, `${JSON.stringify(event)} passes unchanged`)
  }
})

t.test('eventEnd: the first blank line, with LF or CRLF line ends', async (t) => {
  t.equal(eventEnd('data: x\n\nmore'), 9)
  t.equal(eventEnd('data: x\r\n\r\nmore'), 11)
  t.equal(eventEnd('data: x\r\n\r\ndata: y\n\n'), 11, 'the earlier of the two')
  t.equal(eventEnd('data: x\n\ndata: y\r\n\r\n'), 9)
  t.equal(eventEnd('data: x\ndata: y\n'), -1, 'not ended yet')
  t.equal(eventEnd('data: x\r\n'), -1)
})

t.test('endsEvent: a chunk that ends with a blank line, LF or CRLF, and no other', async (t) => {
  const yes = ['data: x\n\n', '\n\n', 'data: x\r\n\r\n', 'data: x\r\n\n', 'data: [DONE]\n\n', ': comment\n\n']
  const no = ['', '\n', 'data: x\n', 'data: x\r\n', 'data: x\n\r\n', '\r\n\r', 'data: x\n\ndata: y', 'data: x\n\n ', '\r\n', 'x\r\n\r\nx']
  for (const x of yes) t.ok(endsEvent(Buffer.from(x)), JSON.stringify(x))
  for (const x of no) t.notOk(endsEvent(Buffer.from(x)), JSON.stringify(x))
})

t.test('lastEventEnd: just past the last blank line, LF or CRLF; 0 when there is none', async (t) => {
  const at = (s: string): number => lastEventEnd(Buffer.from(s))
  t.equal(at('data: x\n\ndata: y\n\ndata: z'), 18)
  t.equal(at('data: x\r\n\r\ndata: y'), 11)
  t.equal(at('data: x\r\n\r\ndata: y\n\nz'), 20, 'the later of the two')
  t.equal(at('data: x\n\ndata: y\r\n\r\nz'), 20)
  t.equal(at('data: x\n\n'), 9, 'the whole chunk')
  t.equal(at('data: x\ndata: y\n'), 0, 'no event ends')
  t.equal(at(''), 0)
})
