// A body over --http-body-limit is answered 413 with the catalogue's code, and the client reads
// that answer: the router reads the rest of the upload and drops it before it closes the
// connection. Closed at once, the kernel resets a connection that still has unread bytes, and a
// client still sending sees ECONNRESET instead of the 413.
import t from 'tap'
import type { Test } from 'tap'
import { request } from 'node:http'
import { runCli, waitForOutput } from '../helpers/cli.js'

/** The default --http-body-limit. */
const LIMIT = 16 << 20

/** `kv-router serve` as a user runs it (the embedded fleet of `npm start`), on a free port. */
async function serve(t: Test): Promise<number> {
  const c = runCli([
    'serve',
    '--embedded-fleet',
    '2',
    '--tokenizer',
    'bytes',
    '--router-block-size',
    '16',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-event-threads',
    '1',
  ])
  t.teardown(() => {
    c.p.kill('SIGKILL')
  })
  const m = await waitForOutput(c, /listening on http:\/\/127\.0\.0\.1:(\d+)/)
  if (m === null) throw new Error(`serve did not start: ${c.err()}`)
  return Number(m[1])
}

t.test('an oversized body gets its 413 through fetch, 20 times in a row', async (t) => {
  const port = await serve(t)
  const body = Buffer.alloc(4 * LIMIT, 0x20)
  for (let i = 0; i < 20; i++) {
    const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body })
    t.equal(r.status, 413, `try ${i + 1}`)
    t.equal(((await r.json()) as { error: { code: string } }).error.code, 'KVR_ERR_BODY_TOO_LARGE')
  }
  // and the same for a body that declares no length (chunked): the bytes, not the header, pass the limit
  const chunked = await new Promise<number>((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/route', headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' } },
      (res) => {
        res.resume()
        resolve(res.statusCode ?? 0)
      },
    )
    req.on('error', reject)
    for (let i = 0; i < 4; i++) req.write(body.subarray(0, LIMIT))
    req.end()
  })
  t.equal(chunked, 413)
  // the router still answers afterwards
  const health = await fetch(`http://127.0.0.1:${port}/health`)
  t.equal(health.status, 200)
})

t.test('an upload far beyond the limit is not read for ever: the connection is closed', async (t) => {
  const port = await serve(t)
  // declares 1 TiB and keeps sending: the router stops reading after its drain allowance
  const outcome = await new Promise<string>((resolve) => {
    const req = request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json', 'content-length': String(2 ** 40) } },
      (res) => {
        res.resume()
        resolve(`status ${res.statusCode}`)
      },
    )
    req.on('error', (err) => resolve(`error ${(err as NodeJS.ErrnoException).code}`))
    const chunk = Buffer.alloc(1 << 20, 0x20)
    const pump = (): void => {
      while (req.write(chunk)) {}
      req.once('drain', pump)
    }
    pump()
    setTimeout(() => {
      req.destroy()
      resolve('still open after 20 s')
    }, 20_000).unref()
  })
  t.not(outcome, 'still open after 20 s')
})
