// The bare proxy of bench/proxy.ts: the benchmark reads the router's overhead less the bare
// proxy's as the router's own work, which holds only if the bare proxy does a proxy's whole
// forwarding: the body as it came, round-robin, every chunk passed back as it comes, and the
// upstream request aborted when the client goes.
import t from 'tap'
import type { Test } from 'tap'
import { createServer } from 'node:http'
import type { ServerResponse } from 'node:http'
import { once } from 'node:events'
import { Agent, request } from 'undici'
import { bareProxy } from '../proxy.js'

interface Upstream {
  url: string
  bodies: string[]
  /** How each request ended on the upstream's side: its answer finished, or the proxy closed it first. */
  endings: ('finished' | 'closed early')[]
  /** Lets the answer under way go on to its last chunk. */
  release: () => void
}

/** An SSE upstream: one event at once, one more when released, then the end of the answer. */
async function upstream(t: Test, name: string): Promise<Upstream> {
  const u: Upstream = { url: '', bodies: [], endings: [], release: () => {} }
  const waiting: ServerResponse[] = []
  u.release = () => {
    for (const res of waiting.splice(0)) {
      res.write(`data: ${name} second\n\n`)
      res.end('data: [DONE]\n\n')
    }
  }
  const srv = createServer((req, res) => {
    let body = ''
    req.setEncoding('utf8')
    req.on('data', (c: string) => (body += c))
    req.on('end', () => {
      u.bodies.push(body)
      res.on('close', () => u.endings.push(res.writableFinished ? 'finished' : 'closed early'))
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(`data: ${name} first ${body.length}\n\n`)
      waiting.push(res)
    })
  })
  srv.listen(0, '127.0.0.1')
  await once(srv, 'listening')
  t.teardown(() => {
    srv.closeAllConnections()
    srv.close()
  })
  u.url = `http://127.0.0.1:${(srv.address() as { port: number }).port}`
  return u
}

/** Waits until `cond` holds, polling; fails the test after 5 s instead of hanging it. */
async function until(cond: () => boolean): Promise<boolean> {
  for (let i = 0; i < 500 && !cond(); i++) await new Promise((r) => setTimeout(r, 10))
  return cond()
}

t.test('the body forwarded as it came, round-robin, every chunk passed back', async (t) => {
  const a = await upstream(t, 'a')
  const b = await upstream(t, 'b')
  const proxy = await bareProxy([a.url, b.url])
  const client = new Agent()
  t.teardown(async () => {
    await client.close()
    await proxy.close()
  })
  const bodies = ['{"prompt":[1,2,3]}', `{"prompt":"${'é'.repeat(40_000)}"}`]
  const answers: string[] = []
  for (const body of bodies) {
    const res = await request(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, dispatcher: client })
    t.equal(res.statusCode, 200)
    t.equal(res.headers['content-type'], 'text/event-stream')
    // the second event is sent only once the first has come through: passed back as it came
    let text = ''
    for await (const c of res.body) {
      if (text === '') {
        a.release()
        b.release()
      }
      text += (c as Buffer).toString()
    }
    answers.push(text)
  }
  t.same(a.bodies, [bodies[0]], 'the first request to the first upstream, byte for byte')
  t.same(b.bodies, [bodies[1]], 'the second to the second, a body read in many chunks')
  t.same(answers, [
    `data: a first ${bodies[0]?.length}\n\ndata: a second\n\ndata: [DONE]\n\n`,
    `data: b first ${bodies[1]?.length}\n\ndata: b second\n\ndata: [DONE]\n\n`,
  ])
  t.ok(await until(() => a.endings.length + b.endings.length === 2))
  t.same([...a.endings, ...b.endings], ['finished', 'finished'])
})

t.test('a client gone mid-stream aborts the upstream request', async (t) => {
  const a = await upstream(t, 'a')
  const proxy = await bareProxy([a.url])
  const client = new Agent()
  t.teardown(async () => {
    await client.close()
    await proxy.close()
  })
  const res = await request(`${proxy.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}', dispatcher: client })
  // leaving the loop destroys the body, and with it the connection: the client is gone
  for await (const _ of res.body) break
  t.ok(await until(() => a.endings.length === 1), 'the upstream saw its request end')
  t.same(a.endings, ['closed early'], 'before its answer finished')
})
