// The callback-driven proxy run (ProxyRun / UpstreamExchange) and the [DONE] hold, on the paths
// test/http/proxy.test.ts does not pin down. Every booking is released once and the run's
// bookkeeping (inFlight, dynamo_frontend_inflight_requests, dynamo_frontend_requests_total)
// settles on: a client that leaves while its upstream has not answered, while it waits in the
// queue, or while its prompt is still being tokenized; unary bodies that are not JSON; a pinned
// worker that fails; a dispatcher that throws at once; all workers busy. The [DONE] hold keeps
// every byte in order for an HTTP/1.0 client and for a client that reads slowly.
import t from 'tap'
import { request as httpRequest } from 'node:http'
import type { IncomingMessage } from 'node:http'
import { connect } from 'node:net'
import type { AddressInfo, Socket } from 'node:net'
import { Agent, buildConnector, Dispatcher } from 'undici'
import type { TextTokenizer } from '../../src/tokenizer/tokenizer.js'
import { chunk, harness, metricSum, sse, tokens, until, workerFleet } from './helpers.js'
import type { Handler, Harness } from './helpers.js'

const h = await harness(['--router-block-size', '4', '--proxy-retries', '2'])
await h.app.fastify.listen({ host: '127.0.0.1', port: 0 })
const base = `http://127.0.0.1:${(h.app.fastify.server.address() as AddressInfo).port}`
t.teardown(() => h.close())

const post = (body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) =>
  fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body), signal })

const fleet = (handlers: Handler[], hh: Harness = h) => workerFleet(hh, handlers)

const booked = (hh: Harness = h): number => hh.router.scheduler.stats().bookedRequests

const metric = (name: string, labels: Record<string, string> = {}, hh: Harness = h) => metricSum(hh, name, labels)
const requests = (status: number, hh: Harness = h) => metric('dynamo_frontend_requests_total', { endpoint: '/v1/completions', status: String(status) }, hh)
const inflightGauge = (hh: Harness = h) => metric('dynamo_frontend_inflight_requests', {}, hh)

t.test('a client that leaves while its upstream has not answered: upstream aborted, booking released once, 499 counted, nothing in flight', async (t) => {
  let asked = 0
  let upstreamClosed = false
  const f = await fleet([
    (req) => {
      asked++
      req.socket.on('close', () => (upstreamClosed = true))
      // never answers
    },
  ])
  const released = h.app.proxy.releasedTotal
  const cancelled = await requests(499)
  const ac = new AbortController()
  const p = post({ prompt: tokens(12), stream: true }, {}, ac.signal).catch((e: unknown) => e)
  await until(() => asked === 1)
  t.equal(booked(), 1, 'booked while waiting for the headers')
  t.equal(h.app.proxy.inFlight, 1)
  ac.abort()
  await p
  await until(() => booked() === 0 && h.app.proxy.inFlight === 0 && upstreamClosed)
  t.equal(h.app.proxy.releasedTotal, released + 1, 'released exactly once')
  t.equal(asked, 1, 'not retried elsewhere')
  t.equal((await requests(499)) - cancelled, 1, 'counted as a cancelled request')
  t.equal(await inflightGauge(), 0, 'dynamo_frontend_inflight_requests back to 0')
  await f.close()
})

t.test('a client that leaves while the connection to its worker is still being made: booking freed at once, the request never sent', async (t) => {
  // a connector that holds every connect until the test lets it go: a worker slow to accept
  const real = buildConnector({})
  const held: (() => void)[] = []
  const agent = new Agent({ connect: (opts, cb) => void held.push(() => real(opts, cb)) })
  const hc = await harness(['--router-block-size', '4'], null, agent)
  await hc.app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const port = (hc.app.fastify.server.address() as AddressInfo).port
  let asked = 0
  const f = await fleet(
    [
      (_req, _body, res) => {
        asked++
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.end(sse(chunk('late')) + 'data: [DONE]\n\n')
      },
    ],
    hc,
  )
  t.teardown(async () => {
    for (const go of held.splice(0)) go()
    await f.close()
    await hc.close()
    await agent.close()
  })
  const released = hc.app.proxy.releasedTotal
  const ac = new AbortController()
  const p = fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(8), stream: true }),
    signal: ac.signal,
  }).catch((e: unknown) => e)
  await until(() => held.length === 1)
  t.equal(booked(hc), 1, 'booked while the connect is pending')
  ac.abort()
  await p
  await until(() => booked(hc) === 0 && hc.app.proxy.inFlight === 0)
  t.equal(hc.app.proxy.releasedTotal, released + 1, 'freed once, before the connect finished')
  t.equal(held.length, 1, 'the connect is still pending')
  ;(held.shift() as () => void)()
  // the connection comes up; the request must not go out on it
  await new Promise((r) => setTimeout(r, 100))
  t.equal(asked, 0, 'the worker never got the request')
  t.equal(hc.app.proxy.releasedTotal, released + 1, 'still released once')
  t.equal(await inflightGauge(hc), 0)
})

t.test('a client that leaves while queued: removed from the queue, 499 counted, nothing in flight', async (t) => {
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"choices":[]}')
    },
  ])
  await h.router.addWorker({ id: 100n, url: f.servers[0]?.url as string, maxNumBatchedTokens: 1 })
  const hold = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/route',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ token_ids: tokens(64, 7000), update_states: true, request_id: 'review-big' }),
  })
  t.equal(hold.statusCode, 200)
  const cancelled = await requests(499)
  const released = h.app.proxy.releasedTotal
  const ac = new AbortController()
  const p = post({ prompt: tokens(12) }, {}, ac.signal).catch((e: unknown) => e)
  await until(() => h.router.scheduler.stats().queueDepth === 1)
  t.equal(h.app.proxy.inFlight, 1, 'a queued request is in flight')
  ac.abort()
  await p
  await until(() => h.router.scheduler.stats().queueDepth === 0 && h.app.proxy.inFlight === 0)
  t.equal((await requests(499)) - cancelled, 1, 'counted as a cancelled request')
  t.equal(await inflightGauge(), 0)
  t.equal(h.app.proxy.releasedTotal, released, 'no booking was made, none released')
  t.ok(h.router.scheduler.free('review-big'))
  t.equal(booked(), 0)
  await f.close()
})

t.test('unary bodies that are not JSON: retried, then 502 naming the cause; one release per attempt', async (t) => {
  let hits = 0
  const notJson = (_req: IncomingMessage, _body: string, res: import('node:http').ServerResponse): void => {
    hits++
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('this is not json')
  }
  const f = await fleet([notJson, notJson, notJson])
  const released = h.app.proxy.releasedTotal
  const failed = await requests(502)
  const r = await post({ prompt: tokens(12) })
  t.equal(r.status, 502)
  const body = (await r.json()) as { error: { code: string; message: string } }
  t.equal(body.error.code, 'KVR_ERR_UPSTREAM')
  t.match(body.error.message, 'answered a body that is not JSON')
  t.equal(hits, 3, 'the first attempt and two retries')
  t.equal(h.app.proxy.releasedTotal, released + 3, 'each booking released once')
  t.equal(booked(), 0)
  t.equal(h.app.proxy.inFlight, 0)
  t.equal((await requests(502)) - failed, 1)
  await f.close()
})

t.test('a pinned worker that fails is not retried elsewhere: 502, one booking released', async (t) => {
  const hits: string[] = []
  const f = await fleet([
    (_req, _body, res) => {
      hits.push('a')
      res.writeHead(500)
      res.end('boom')
    },
    (_req, _body, res) => {
      hits.push('b')
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"choices":[]}')
    },
  ])
  const released = h.app.proxy.releasedTotal
  const r = await post({ prompt: tokens(12), stream: true }, { 'x-worker-instance-id': '100' })
  t.equal(r.status, 502)
  t.equal(((await r.json()) as { error: { code: string } }).error.code, 'KVR_ERR_UPSTREAM')
  t.same(hits, ['a'], 'only the pinned worker was asked')
  t.equal(h.app.proxy.releasedTotal, released + 1)
  t.equal(booked(), 0)
  t.equal(h.app.proxy.inFlight, 0)
  await f.close()
})

t.test('every worker busy: 503 with Retry-After through the proxy, rejection counted, nothing booked or in flight', async (t) => {
  let hits = 0
  const f = await fleet([
    (_req, _body, res) => {
      hits++
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"choices":[]}')
    },
  ])
  const hold = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/route',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ token_ids: tokens(64, 5000), worker_id: 100, update_states: true, request_id: 'review-busy' }),
  })
  t.equal(hold.statusCode, 200)
  await h.app.fastify.inject({
    method: 'POST',
    url: '/busy_threshold',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ active_prefill_tokens_threshold: 0 }),
  })
  t.teardown(async () => {
    await h.app.fastify.inject({
      method: 'POST',
      url: '/busy_threshold',
      headers: { 'content-type': 'application/json' },
      payload: JSON.stringify({ active_prefill_tokens_threshold: null }),
    })
  })
  const rejected = await metric('dynamo_frontend_model_rejection_total', { endpoint: '/v1/completions' })
  const busy = await requests(503)
  const r = await post({ prompt: tokens(12), stream: true })
  t.equal(r.status, 503)
  t.equal(r.headers.get('retry-after'), '1')
  const body = (await r.json()) as { code: number; error: { code: string } }
  t.equal(body.error.code, 'KVR_ERR_ALL_WORKERS_BUSY')
  t.equal(body.code, 503)
  t.equal(hits, 0)
  t.equal((await metric('dynamo_frontend_model_rejection_total', { endpoint: '/v1/completions' })) - rejected, 1, 'one rejection')
  t.equal((await requests(503)) - busy, 1)
  t.equal(h.app.proxy.inFlight, 0)
  t.equal(await inflightGauge(), 0)
  t.ok(h.router.scheduler.free('review-busy'))
  t.equal(booked(), 0)
  await f.close()
})

/** Sends one raw HTTP request; resolves with all it reads until the router closes the connection. */
function raw(port: number, request: string, onData: (got: string) => void = () => {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(port, '127.0.0.1', () => s.write(request))
    let got = ''
    s.on('data', (d: Buffer) => {
      got += d.toString('latin1')
      onData(got)
    })
    s.on('end', () => resolve(got))
    s.on('error', reject)
  })
}

t.test('an HTTP/1.0 client gets the stream unframed, [DONE] last, with or without the end of the upstream body', async (t) => {
  const port = (h.app.fastify.server.address() as AddressInfo).port
  let sawDone: () => void = () => {}
  let mode = 0
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk('one')))
      const m = mode++
      setTimeout(() => {
        if (m === 0) res.end(sse(chunk('two')) + 'data: [DONE]\n\n')
        else {
          res.write(sse(chunk('two')) + 'data: [DONE]\n\n')
          new Promise<void>((r) => (sawDone = r)).then(() => res.end(': trailing\n\n'))
        }
      }, 10)
    },
  ])
  const released = h.app.proxy.releasedTotal
  const payload = JSON.stringify({ prompt: tokens(8), stream: true })
  const req = `POST /v1/completions HTTP/1.0\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${payload.length}\r\n\r\n${payload}`
  for (const held of [false, true]) {
    const got = await raw(port, req, (g) => {
      if (held && g.includes('data: [DONE]\n\n')) sawDone()
    })
    const head = got.slice(0, got.indexOf('\r\n\r\n')).toLowerCase()
    const body = got.slice(got.indexOf('\r\n\r\n') + 4)
    t.match(head, /^http\/1\.[01] 200/)
    t.notMatch(head, 'transfer-encoding: chunked')
    t.match(
      body,
      /^data: \{[^\n]*"text":"one"[^\n]*"decode_worker_id":100[^\n]*\}\n\ndata: \{[^\n]*"text":"two"[^\n]*\}\n\ndata: \[DONE\]\n\n/,
      'every event in order, unframed',
    )
    t.equal(body.split('[DONE]').length - 1, 1, '[DONE] once')
    if (held) t.ok(body.endsWith('data: [DONE]\n\n: trailing\n\n'), 'what followed [DONE] came after it')
    else t.ok(body.endsWith('data: [DONE]\n\n'), '[DONE] last')
  }
  await until(() => booked() === 0 && h.app.proxy.inFlight === 0)
  t.equal(h.app.proxy.releasedTotal, released + 2)
  await f.close()
})

t.test('a slow reader: a [DONE] the worker sends without ending its body reaches the client after every event, once', { timeout: 30_000 }, async (t) => {
  const EVENT = sse(chunk('y'.repeat(16_000)))
  const N = 300
  let sawDone: () => void = () => {}
  let heldBack = false
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      let n = 0
      const pump = (): void => {
        while (n < N) {
          n++
          if (!res.write(EVENT)) {
            heldBack = true
            res.once('drain', pump)
            return
          }
        }
        res.write('data: [DONE]\n\n')
        new Promise<void>((r) => (sawDone = r)).then(() => res.end(': bye\n\n'))
      }
      pump()
    },
  ])
  const released = h.app.proxy.releasedTotal
  const res = await new Promise<IncomingMessage>((resolve, reject) => {
    const req = httpRequest(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' } }, resolve)
    req.on('error', reject)
    req.end(JSON.stringify({ prompt: tokens(12), stream: true }))
  })
  res.pause()
  await until(() => heldBack)
  await new Promise((r) => setTimeout(r, 100))
  const parts: Buffer[] = []
  let tailSeen = ''
  res.on('data', (b: Buffer) => {
    parts.push(b)
    tailSeen = (tailSeen + b.toString('latin1')).slice(-64)
    if (tailSeen.endsWith('data: [DONE]\n\n')) sawDone()
  })
  const ended = new Promise((r) => res.once('end', r))
  res.resume()
  await ended
  const text = Buffer.concat(parts).toString('utf8')
  t.equal(text.split('"text":"yyyy').length - 1, N, 'every event arrived')
  t.ok(text.endsWith(`${EVENT}data: [DONE]\n\n: bye\n\n`), '[DONE] after the last event, then what followed it')
  t.equal(text.split('[DONE]').length - 1, 1, '[DONE] once')
  await until(() => booked() === 0 && h.app.proxy.inFlight === 0)
  t.equal(h.app.proxy.releasedTotal, released + 1)
  await f.close()
})

/** Throws `thrown` from dispatch() itself, as a dispatcher that refuses a request at once may (an embedder's may throw a non-Error). */
class Refusing extends Dispatcher {
  calls = 0
  constructor(private readonly thrown: unknown) {
    super()
  }
  override dispatch(): boolean {
    this.calls++
    throw this.thrown
  }
  override close(): Promise<void> {
    return Promise.resolve()
  }
  override destroy(): Promise<void> {
    return Promise.resolve()
  }
}

t.test('a dispatcher that throws synchronously: retried, then 502; every booking released; the router keeps serving', async (t) => {
  const d = new Refusing(new Error('refused at once'))
  const hr = await harness(['--router-block-size', '4', '--proxy-retries', '1'], null, d)
  t.teardown(() => hr.close())
  await hr.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9' })
  await hr.router.addWorker({ id: 2n, url: 'http://127.0.0.1:9' })
  const r = await hr.app.fastify.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ prompt: tokens(8), stream: true }),
  })
  t.equal(r.statusCode, 502)
  const body = r.json() as { error: { code: string; message: string } }
  t.equal(body.error.code, 'KVR_ERR_UPSTREAM')
  t.match(body.error.message, /did not answer: refused at once/)
  t.equal(d.calls, 2, 'first attempt and one retry')
  t.equal(hr.app.proxy.releasedTotal, 2)
  t.equal(booked(hr), 0)
  t.equal(hr.app.proxy.inFlight, 0)
  t.equal(await inflightGauge(hr), 0)
  t.equal(await hr.app.proxy.drain(100), true, 'drain resolves at once')
  t.equal((await hr.app.fastify.inject({ method: 'GET', url: '/health' })).statusCode, 200)
})

t.test('a client that leaves while its prompt is being tokenized: the run hears of it, no booking is held', { timeout: 20_000 }, async (t) => {
  // a tokenizer in worker threads answers a macrotask later: the client's disconnect can land
  // between the route handler and the proxy run, before the run listens for it
  let calls = 0
  let release: () => void = () => {}
  const tokenized = new Promise<void>((r) => (release = r))
  const tok: TextTokenizer = {
    kind: 'bytes',
    chatTemplate: null,
    async encode(text: string) {
      calls++
      await tokenized
      return Buffer.from(text, 'utf8')
    },
    encodeChat() {
      throw new Error('not sent here')
    },
    async close() {},
  }
  const ht = await harness(['--router-block-size', '4'], tok)
  await ht.app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const port = (ht.app.fastify.server.address() as AddressInfo).port
  const serverSockets: Socket[] = []
  ht.app.fastify.server.on('connection', (s: Socket) => serverSockets.push(s))
  let asked = 0
  const f = await fleet(
    [
      (_req, _body, res) => {
        asked++
        // a long generation: the first token, then it goes on for as long as nobody stops it
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write(sse(chunk('first')))
      },
    ],
    ht,
  )
  t.teardown(async () => {
    await f.close()
    await ht.close()
  })
  const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', headers: { 'content-type': 'application/json' }, agent: false })
  req.on('error', () => {})
  req.end(JSON.stringify({ prompt: 'a prompt as text', stream: true }))
  await until(() => calls === 1)
  req.destroy()
  await until(() => serverSockets.length === 1 && (serverSockets[0] as Socket).destroyed)
  await new Promise((r) => setImmediate(r))
  release()
  await new Promise((r) => setTimeout(r, 100))
  let settled = true
  await until(() => booked(ht) === 0 && ht.app.proxy.inFlight === 0, 2000).catch(() => (settled = false))
  t.ok(settled, `the run ended and freed what it booked (booked ${booked(ht)}, in flight ${ht.app.proxy.inFlight}, upstream asked ${asked} time(s))`)
})

t.test('a worker that dies after its headers, then one that ends its stream empty: both retried, the third answers; one release per attempt', async (t) => {
  let hits = 0
  const behave = (_req: IncomingMessage, _body: string, res: import('node:http').ServerResponse): void => {
    const n = hits++
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    if (n === 0) {
      res.flushHeaders()
      setTimeout(() => res.socket?.destroy(), 10)
    } else if (n === 1) res.end()
    else res.end(sse(chunk('third time')) + 'data: [DONE]\n\n')
  }
  const f = await fleet([behave, behave, behave])
  const released = h.app.proxy.releasedTotal
  const before = await metric('kvrouter_proxy_upstream_errors_total', { phase: 'before_first_token' })
  const retried = await metric('kvrouter_proxy_retries_total')
  const r = await post({ prompt: tokens(12), stream: true })
  t.equal(r.status, 200)
  const text = await r.text()
  t.match(text, /^data: \{[^\n]*"text":"third time"[^\n]*"worker_id"[^\n]*\}\n\ndata: \[DONE\]\n\n$/)
  t.equal(hits, 3)
  t.equal(h.app.proxy.releasedTotal, released + 3)
  t.equal((await metric('kvrouter_proxy_upstream_errors_total', { phase: 'before_first_token' })) - before, 2)
  t.equal((await metric('kvrouter_proxy_retries_total')) - retried, 2)
  await until(() => booked() === 0 && h.app.proxy.inFlight === 0)
  await f.close()
})

t.test('a keep-alive connection: a stream whose [DONE] went out with the end of the body leaves the socket uncorked and serves the next request', async (t) => {
  const port = (h.app.fastify.server.address() as AddressInfo).port
  const serverSockets: Socket[] = []
  const onConn = (s: Socket): void => {
    serverSockets.push(s)
  }
  h.app.fastify.server.on('connection', onConn)
  t.teardown(() => {
    h.app.fastify.server.off('connection', onConn)
  })
  let n = 0
  const f = await fleet([
    (_req, _body, res) => {
      const k = n++
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk(`one-${k}`)))
      setTimeout(() => res.end(sse(chunk(`two-${k}`)) + 'data: [DONE]\n\n'), 10)
    },
  ])
  const released = h.app.proxy.releasedTotal
  const payload = JSON.stringify({ prompt: tokens(8), stream: true })
  const req = `POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${payload.length}\r\n\r\n${payload}`
  const c = connect(port, '127.0.0.1')
  c.on('error', () => {})
  let got = ''
  let wake: () => void = () => {}
  c.on('data', (d: Buffer) => {
    got += d.toString('latin1')
    wake()
  })
  const ends = (): number => got.split('\r\n0\r\n\r\n').length - 1
  const waitEnds = async (k: number): Promise<void> => {
    while (ends() < k) await new Promise<void>((r) => (wake = r))
  }
  await new Promise<void>((r) => c.once('connect', () => r()))
  c.write(req)
  await waitEnds(1)
  await until(() => h.app.proxy.inFlight === 0)
  t.equal(serverSockets.length, 1)
  t.equal(serverSockets[0]?.writableCorked, 0, 'the client socket is not left corked')
  c.write(req)
  await waitEnds(2)
  c.destroy()
  const responses = got.split('HTTP/1.1 200 OK\r\n').slice(1)
  t.equal(responses.length, 2, 'both requests answered on one connection')
  for (const [i, r] of responses.entries()) {
    let body = r.slice(r.indexOf('\r\n\r\n') + 4)
    const data: string[] = []
    for (;;) {
      const eol = body.indexOf('\r\n')
      const size = parseInt(body.slice(0, eol), 16)
      if (size === 0) break
      data.push(body.slice(eol + 2, eol + 2 + size))
      t.equal(body.slice(eol + 2 + size, eol + 4 + size), '\r\n', 'each chunk framed')
      body = body.slice(eol + 4 + size)
    }
    const text = data.join('')
    t.match(
      text,
      new RegExp(
        `^data: \\{[^\\n]*"text":"one-${i}"[^\\n]*"worker_id"[^\\n]*\\}\\n\\ndata: \\{[^\\n]*"text":"two-${i}"[^\\n]*\\}\\n\\ndata: \\[DONE\\]\\n\\n$`,
      ),
      `response ${i}: every event once, in order`,
    )
  }
  t.equal(h.app.proxy.releasedTotal, released + 2)
  t.equal(booked(), 0)
  await f.close()
})

t.test('a dispatcher that throws a non-Error: the client gets 502, the booking is released, no unhandled rejection', async (t) => {
  const d = new Refusing(null)
  const hr = await harness(['--router-block-size', '4', '--proxy-retries', '0'], null, d)
  t.teardown(() => hr.close())
  await hr.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9' })
  const r = await hr.app.fastify.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ prompt: tokens(8) }),
  })
  t.equal(d.calls, 1)
  t.equal(r.statusCode, 502)
  t.equal((r.json() as { error: { code: string } }).error.code, 'KVR_ERR_UPSTREAM')
  t.equal(booked(hr), 0, 'the booking is released')
  t.equal(hr.app.proxy.inFlight, 0)
})
