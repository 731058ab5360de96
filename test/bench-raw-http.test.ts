// The raw-socket client of bench/raw-http.ts, against a real server that writes its answer a byte
// at a time: the diagnosis that compares it with Node's HTTP stack is only worth its figures if it
// decodes every split of a chunked body, reuses its connection and reports a cut stream as one.
import t from 'tap'
import type { Test } from 'tap'
import { createServer } from 'node:net'
import type { Server, Socket } from 'node:net'
import { once } from 'node:events'
import { rawClient } from '../bench/raw-http.js'

/** The events of one response: its status, its data joined, and how it ended. */
interface Heard {
  status: number
  data: string
  ended: 'end' | 'error'
}

function ask(send: ReturnType<typeof rawClient>, body: string): Promise<Heard> {
  return new Promise((resolve) => {
    let status = 0
    let data = ''
    send(Buffer.from(body), {
      head: (s) => (status = s),
      data: (b) => (data += b.toString('latin1')),
      end: () => resolve({ status, data, ended: 'end' }),
      error: () => resolve({ status, data, ended: 'error' }),
    })
  })
}

/** Writes `bytes` one at a time, each after the last was flushed, so that reads split anywhere. */
async function trickle(s: Socket, bytes: string): Promise<void> {
  for (const c of bytes) await new Promise<void>((r) => s.write(c, 'latin1', () => setImmediate(r)))
}

/** A server that reads a whole request (head and Content-Length body), then lets `answer` write. */
async function server(t: Test, answer: (s: Socket, body: string) => Promise<void>): Promise<{ url: string; connections: () => number; bodies: string[] }> {
  let connections = 0
  const bodies: string[] = []
  const open = new Set<Socket>()
  const srv: Server = createServer((s) => {
    connections++
    open.add(s)
    s.on('close', () => open.delete(s))
    let buf = ''
    let busy = false
    s.on('data', (d: Buffer) => {
      buf += d.toString('latin1')
      const e = buf.indexOf('\r\n\r\n')
      if (busy || e < 0) return
      const len = Number(/content-length: (\d+)/i.exec(buf.slice(0, e))?.[1] ?? 0)
      if (buf.length < e + 4 + len) return
      const body = buf.slice(e + 4, e + 4 + len)
      bodies.push(body)
      buf = buf.slice(e + 4 + len)
      busy = true
      void answer(s, body).then(() => (busy = false))
    })
    s.on('error', () => {})
  })
  srv.listen(0, '127.0.0.1')
  await once(srv, 'listening')
  // the client keeps its connections alive and has no close of its own: they end from this side
  t.teardown(() => {
    for (const s of open) s.destroy()
    srv.close()
  })
  const port = (srv.address() as { port: number }).port
  return { url: `http://127.0.0.1:${port}`, connections: () => connections, bodies }
}

const HEAD = 'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n'

t.test('a chunked body split at every byte is decoded whole, sizes in either case of hex, on one kept-alive connection', async (t) => {
  const events = ['data: {"a":1}\n\n', `data: ${'x'.repeat(0x1a - 8)}\n\n`, `data: ${'y'.repeat(0xbc)}\n\n`]
  const sizes = (upper: boolean): string[] => events.map((e) => (upper ? e.length.toString(16).toUpperCase() : e.length.toString(16)))
  let n = 0
  const { url, connections, bodies } = await server(t, async (s) => {
    const upper = n++ % 2 === 1
    const hex = sizes(upper)
    await trickle(s, HEAD + events.map((e, i) => `${hex[i]}\r\n${e}\r\n`).join('') + '0\r\n\r\n')
  })
  t.ok(
    sizes(true).some((h) => /[A-F]/.test(h)),
    'the upper-case sizes hold letters',
  )
  const send = rawClient([url])
  for (const body of ['{"prompt":[1]}', '{"prompt":[2,3]}']) {
    const heard = await ask(send, body)
    t.same(heard, { status: 200, data: events.join(''), ended: 'end' })
  }
  t.same(bodies, ['{"prompt":[1]}', '{"prompt":[2,3]}'], 'each request reached the server with its body')
  t.equal(connections(), 1, "the second request went on the first one's connection")
})

t.test('a connection cut inside the body ends the answer as an error, and the next request opens a new one', async (t) => {
  let n = 0
  const { url, connections } = await server(t, async (s) => {
    if (n++ === 0) {
      await trickle(s, `${HEAD}f\r\ndata: {"a":1}\n\n\r\n8\r\ndata`)
      s.destroy()
    } else await trickle(s, `${HEAD}5\r\nhello\r\n0\r\n\r\n`)
  })
  const send = rawClient([url])
  const cut = await ask(send, '{}')
  t.equal(cut.ended, 'error')
  t.equal(cut.data, 'data: {"a":1}\n\ndata', 'what came before the cut was passed on as it came')
  t.same(await ask(send, '{}'), { status: 200, data: 'hello', ended: 'end' })
  t.equal(connections(), 2)
})

t.test('an idle connection the server closes leaves the pool', async (t) => {
  let n = 0
  const { url, connections } = await server(t, async (s) => {
    await trickle(s, `${HEAD}2\r\nok\r\n0\r\n\r\n`)
    // the upstream's keep-alive timeout, early
    if (n++ === 0) s.end()
  })
  const send = rawClient([url])
  t.same(await ask(send, '{}'), { status: 200, data: 'ok', ended: 'end' })
  await new Promise((r) => setTimeout(r, 50))
  t.same(await ask(send, '{}'), { status: 200, data: 'ok', ended: 'end' }, 'the second request did not go on the closed connection')
  t.equal(connections(), 2)
})

t.test('round-robin over the upstreams', async (t) => {
  const a = await server(t, (s) => trickle(s, `${HEAD}1\r\na\r\n0\r\n\r\n`))
  const b = await server(t, (s) => trickle(s, `${HEAD}1\r\nb\r\n0\r\n\r\n`))
  const send = rawClient([a.url, b.url])
  const got: string[] = []
  for (let i = 0; i < 4; i++) got.push((await ask(send, '{}')).data)
  t.same(got, ['a', 'b', 'a', 'b'])
})
