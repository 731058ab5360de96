// The proxy forwards whole SSE events only: a worker whose socket
// dies inside an event must not leave half an event on the client's wire with the router's error
// event glued to it (the openai client then throws a SyntaxError instead of an APIError); one that
// dies inside its first event delivered no token and is retried; a 5xx is retried at its status
// line, not when its body ends; and dynamo_frontend_requests_total counts a stream cut mid-way by
// the worker as 502 and by the client as 499, not as 200.
import t from 'tap'
import type { Test } from 'tap'
import type { ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { chunk, harness, metricSum, sse, tokens, until, workerFleet } from './helpers.js'
import type { Handler } from './helpers.js'

const h = await harness(['--router-block-size', '4', '--proxy-retries', '2'])
await h.app.fastify.listen({ host: '127.0.0.1', port: 0 })
const base = `http://127.0.0.1:${(h.app.fastify.server.address() as AddressInfo).port}`
t.teardown(() => h.close())

/** Scripted workers 100, 101, ...: each test removes them with t.teardown, so one that fails leaves none behind. */
const fleet = (handlers: Handler[]) => workerFleet(h, handlers)
const booked = (): number => h.router.scheduler.stats().bookedRequests

const post = (body: unknown, signal?: AbortSignal) =>
  fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal })

const metric = (name: string, labels: Record<string, string> = {}) => metricSum(h, name, labels)
const requests = (status: number) => metric('dynamo_frontend_requests_total', { endpoint: '/v1/completions', status: String(status) })

/**
 * The events of an SSE body, each checked the way an SSE client reads it: every event is a
 * `data:` line whose payload is JSON or [DONE], and the body ends with an event's blank line.
 */
function events(t: Test, body: string): unknown[] {
  t.ok(/(\r?\n){2}$/.test(body), 'the body ends at the end of an event')
  const out: unknown[] = []
  for (const block of body.split(/\r?\n\r?\n/)) {
    if (block === '') continue
    t.ok(block.startsWith('data: '), `an event: ${block.slice(0, 60)}`)
    const payload = block.slice('data: '.length)
    if (payload === '[DONE]') out.push('[DONE]')
    else {
      try {
        out.push(JSON.parse(payload))
      } catch {
        t.fail(`an event that is not JSON: ${block}`)
      }
    }
  }
  return out
}

const text = (e: unknown): unknown => (e as { choices?: { text?: unknown }[] } | undefined)?.choices?.[0]?.text
const errorOf = (e: unknown): { code?: string; message?: string } | undefined => (e as { error?: { code?: string; message?: string } } | undefined)?.error

/** Writes `parts` apart in time, so that each reaches the router as a read of its own, then runs `last`. */
function writeApart(res: ServerResponse, parts: string[], last: () => void): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' })
  let i = 0
  const next = (): void => {
    if (res.destroyed) return
    if (i < parts.length) {
      res.write(parts[i++])
      setTimeout(next, 20)
    } else last()
  }
  next()
}

t.test('a worker that dies inside an event: the partial event is dropped and the error is an event of its own', async (t) => {
  const third = sse(chunk('three'))
  const scripts: string[][] = [
    // whole events, then a read that ends inside the third
    [sse(chunk('one')), sse(chunk('two')), third.slice(0, 30)],
    // one read with a whole event and the start of the next
    [sse(chunk('one')), sse(chunk('two')) + third.slice(0, 30)],
    // CRLF lines, and an event split over reads that completes before the death
    [sse(chunk('one')).replace(/\n/g, '\r\n'), sse(chunk('two')).slice(0, 25), sse(chunk('two')).slice(25) + third.slice(0, 30)],
  ]
  let n = 0
  const f = await fleet([(_req, _body, res) => writeApart(res, scripts[n++] as string[], () => res.socket?.destroy())])
  t.teardown(() => f.close())
  for (let i = 0; i < scripts.length; i++) {
    const failed = await requests(502)
    const ok = await requests(200)
    const r = await post({ prompt: tokens(12), stream: true })
    t.equal(r.status, 200)
    const evs = events(t, await r.text())
    t.same(evs.slice(0, 2).map(text), ['one', 'two'], `script ${i}: the whole events, in order`)
    t.equal(evs.length, 3, `script ${i}: nothing of the third event`)
    t.match(errorOf(evs[2]), { code: 'KVR_ERR_UPSTREAM', message: /^worker 100 failed mid-stream/ }, `script ${i}: the error event last`)
    await until(() => h.app.proxy.inFlight === 0)
    t.equal((await requests(502)) - failed, 1, `script ${i}: counted as 502`)
    t.equal((await requests(200)) - ok, 0, `script ${i}: not counted as 200`)
  }
  t.equal(booked(), 0)
})

t.test(
  'an event split over reads mid-stream arrives whole and in order; a read of several events and a partial one is cut at the last event end',
  async (t) => {
    const two = sse(chunk('twö ✓'))
    const at = Buffer.from(two).indexOf(Buffer.from('ö')) + 1
    const f = await fleet([
      (_req, _body, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        const bytes = Buffer.from(sse(chunk('one')) + two + sse(chunk('three')) + 'data: [DONE]\n\n')
        const cut1 = Buffer.byteLength(sse(chunk('one'))) + at
        const cut2 = bytes.length - 'data: [DONE]\n\n'.length - 7
        // the second event cut inside a character, and the third cut just before its blank line
        res.write(bytes.subarray(0, cut1))
        setTimeout(() => res.write(bytes.subarray(cut1, cut2)), 20)
        setTimeout(() => res.end(bytes.subarray(cut2)), 40)
      },
    ])
    t.teardown(() => f.close())
    const r = await post({ prompt: tokens(12), stream: true })
    const evs = events(t, await r.text())
    t.same(
      evs.map((e) => (e === '[DONE]' ? e : text(e))),
      ['one', 'twö ✓', 'three', '[DONE]'],
    )
    t.equal(booked(), 0)
  },
)

t.test('an event too long to hold goes out as it comes; a worker that dies inside it: the event is ended before the error event', async (t) => {
  const big = 'data: ' + 'x'.repeat(300 * 1024)
  const f = await fleet([(_req, _body, res) => writeApart(res, [sse(chunk('one')), big], () => res.socket?.destroy())])
  t.teardown(() => f.close())
  const r = await post({ prompt: tokens(12), stream: true })
  const body = await r.text()
  const blocks = body.split('\n\n')
  t.equal(blocks.length, 4, 'three events and the empty rest')
  t.equal(blocks[1], big, 'the long event, whole as far as it came')
  t.match(JSON.parse((blocks[2] as string).slice('data: '.length)), { error: { code: 'KVR_ERR_UPSTREAM' } }, 'the error, an event of its own')
  t.equal(blocks[3], '')
  t.equal(booked(), 0)
})

t.test('a worker that ends its body cleanly inside an event: what it sent is relayed as it is, a 200', async (t) => {
  const f = await fleet([(_req, _body, res) => writeApart(res, [sse(chunk('one'))], () => res.end('data: [DONE]\n'))])
  t.teardown(() => f.close())
  const ok = await requests(200)
  const r = await post({ prompt: tokens(12), stream: true })
  const body = await r.text()
  t.ok(
    body.endsWith(
      '"text":"one","finish_reason":null}],"nvext":{"worker_id":{"prefill_worker_id":100,"prefill_worker_id_str":"100","prefill_dp_rank":0,' +
        '"decode_worker_id":100,"decode_worker_id_str":"100","decode_dp_rank":0}}}\n\ndata: [DONE]\n',
    ),
    'every byte, in order',
  )
  await until(() => h.app.proxy.inFlight === 0)
  t.equal((await requests(200)) - ok, 1)
  t.equal(booked(), 0)
})

t.test('a worker that dies inside its first event delivered no token: retried on another worker, the client sees only that one', async (t) => {
  let asked = 0
  const dieFirst: Handler = (_req, _body, res) => {
    if (asked++ === 0) return writeApart(res, [sse(chunk('lost')).slice(0, 30)], () => res.socket?.destroy())
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.end(sse(chunk('hello')) + 'data: [DONE]\n\n')
  }
  // both workers die on the first request that reaches either, whichever the router picks
  const f = await fleet([dieFirst, dieFirst])
  t.teardown(() => f.close())
  const retries = await metric('kvrouter_proxy_retries_total')
  const before = await metric('kvrouter_proxy_upstream_errors_total', { phase: 'before_first_token' })
  const after = await metric('kvrouter_proxy_upstream_errors_total', { phase: 'after_first_token' })
  const released = h.app.proxy.releasedTotal
  const r = await post({ prompt: tokens(12), stream: true })
  t.equal(r.status, 200)
  const evs = events(t, await r.text())
  t.same(
    evs.map((e) => (e === '[DONE]' ? e : text(e))),
    ['hello', '[DONE]'],
    "only the retry's events",
  )
  t.equal(asked, 2)
  t.equal((await metric('kvrouter_proxy_retries_total')) - retries, 1, 'one retry')
  t.equal((await metric('kvrouter_proxy_upstream_errors_total', { phase: 'before_first_token' })) - before, 1)
  t.equal((await metric('kvrouter_proxy_upstream_errors_total', { phase: 'after_first_token' })) - after, 0)
  t.equal(booked(), 0)
  t.equal(h.app.proxy.releasedTotal, released + 2, 'both bookings released once each')
})

t.test('a pinned worker that dies inside its first event: a 502 answer, not a 200 stream', async (t) => {
  const f = await fleet([(_req, _body, res) => writeApart(res, [sse(chunk('lost')).slice(0, 30)], () => res.socket?.destroy())])
  t.teardown(() => f.close())
  const r = await post({ prompt: tokens(12), stream: true, nvext: { backend_instance_id: 100 } })
  t.equal(r.status, 502)
  t.match(await r.json(), { error: { code: 'KVR_ERR_UPSTREAM', message: /^worker 100 failed before its first token/ } })
  t.equal(booked(), 0)
})

t.test('a 5xx whose body never ends is retried at once, and its upstream request aborted', async (t) => {
  let asked = 0
  let hungClosed = false
  const hang503: Handler = (req, body, res) => {
    if (asked++ === 0) {
      req.socket.on('close', () => (hungClosed = true))
      res.writeHead(503, { 'content-type': 'application/json' })
      res.write('{"error":')
      return
    }
    if ((JSON.parse(body) as { stream?: boolean }).stream === true) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end(sse(chunk('hello')) + 'data: [DONE]\n\n')
    } else {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify(chunk('hello')))
    }
  }
  const f = await fleet([hang503, hang503])
  t.teardown(() => f.close())
  for (const stream of [true, false]) {
    asked = 0
    hungClosed = false
    const started = Date.now()
    // a retry at the status line, not after undici's bodyTimeout (300 s): this fails fast instead
    const r = await post({ prompt: tokens(12), stream }, AbortSignal.timeout(4000))
    t.equal(r.status, 200, `stream ${stream}: answered by the other worker`)
    await r.text()
    t.ok(Date.now() - started < 2000, `stream ${stream}: at once (${Date.now() - started} ms)`)
    t.equal(asked, 2)
    const aborted = await until(() => hungClosed).then(
      () => true,
      () => false,
    )
    t.ok(aborted, `stream ${stream}: the 503's request was aborted`)
    t.equal(booked(), 0)
  }
})

t.test('a client that leaves mid-stream is counted as 499, not 200', async (t) => {
  let upstreamClosed = false
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk('first')))
      res.on('close', () => (upstreamClosed = true))
    },
  ])
  t.teardown(() => f.close())
  const cancelled = await requests(499)
  const ok = await requests(200)
  const ac = new AbortController()
  const r = await post({ prompt: tokens(12), stream: true }, ac.signal)
  const reader = (r.body as ReadableStream<Uint8Array>).getReader()
  await reader.read()
  ac.abort()
  await until(() => upstreamClosed && h.app.proxy.inFlight === 0)
  t.equal((await requests(499)) - cancelled, 1, 'counted as 499')
  t.equal((await requests(200)) - ok, 0, 'not counted as 200')
  t.equal(booked(), 0)
})
