// The proxy lifecycle against scripted upstreams over real sockets: a client abort mid-stream
// frees the booking and aborts the upstream request; a 500 (or a refused connection) before the
// first token is retried on the next best worker; an upstream that dies mid-stream gives the
// client an error event; a client that stops reading holds the upstream back instead of making
// the router buffer; every booking is released exactly once, also in a seeded mix of all of these
// with clients that leave at random moments.
import t from 'tap'
import { request as httpRequest } from 'node:http'
import type { IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import { fullGc } from '../../src/runtime/heap-settle.js'
import { chunk, harness, listening, sse, tokens, until, upstream, workerFleet } from './helpers.js'
import type { Handler, Harness } from './helpers.js'

const BIG = 18446744073709551557n
const h = await harness(['--router-block-size', '4', '--proxy-retries', '2'])
await h.app.fastify.listen({ host: '127.0.0.1', port: 0 })
const base = `http://127.0.0.1:${(h.app.fastify.server.address() as AddressInfo).port}`
t.teardown(() => h.close())

const fleet = (handlers: Handler[], hh: Harness = h) => workerFleet(hh, handlers)

function booked(): number {
  return h.router.scheduler.stats().bookedRequests
}

t.test('non-streaming: nvext.worker_id with the exact u64 id, booking released', async (t) => {
  const s = await upstream((_req, body, res) => {
    const b = JSON.parse(body) as { prompt: number[] }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(
      JSON.stringify({
        id: 'x',
        object: 'text_completion',
        choices: [{ index: 0, text: `got ${b.prompt.length}`, finish_reason: 'stop' }],
        usage: { prompt_tokens: 8, completion_tokens: 2, total_tokens: 10 },
      }),
    )
  })
  await h.router.addWorker({ id: BIG, url: s.url })
  const released = h.app.proxy.releasedTotal
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(8) }),
  })
  t.equal(r.status, 200)
  const text = await r.text()
  t.match(text, `"decode_worker_id":${BIG}`, 'exact u64 in the response')
  t.match(text, '"text":"got 8"', 'the body was forwarded')
  t.equal(r.headers.get('x-worker-id'), BIG.toString())
  t.equal(booked(), 0)
  t.equal(h.app.proxy.releasedTotal, released + 1, 'released exactly once')
  await h.router.removeWorker(BIG)
  await s.close()
})

t.test("the client's body reaches the worker byte for byte; a body that is not UTF-8 is refused", async (t) => {
  let got: Buffer | null = null
  let calls = 0
  const f = await fleet([
    (_req, _body, res, raw) => {
      calls++
      got = raw
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"id":"x","choices":[]}')
    },
  ])
  // spacing JSON.stringify would not write, an escape, characters of two to four bytes, and
  // padding long enough that the body comes in more than one read
  const sent = Buffer.from(`{ "prompt" : ${JSON.stringify(tokens(8))},\n "user":"\\u00e9 é € 𝄞", "pad":"${'x'.repeat(200_000)}" }`)
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: sent })
  t.equal(r.status, 200)
  await r.text()
  t.ok(got !== null && sent.equals(got), 'the same bytes')
  // a lone continuation byte inside a string: the router would read it as U+FFFD while the
  // worker got the byte, so it is refused
  const bad = Buffer.concat([Buffer.from(`{"prompt":${JSON.stringify(tokens(8))},"user":"a`), Buffer.from([0x80]), Buffer.from('"}')])
  const b = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: bad })
  t.equal(b.status, 400)
  t.match(await b.json(), { error: { code: 'KVR_ERR_INVALID_REQUEST', message: /not valid UTF-8/ } })
  t.equal(calls, 1, 'the refused body never reached a worker')
  await f.close()
})

t.test('client abort mid-stream frees the booking and aborts the upstream request', async (t) => {
  let upstreamClosed = false
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk('first')))
      res.on('close', () => {
        upstreamClosed = true
      })
      // then nothing: the stream stays open until someone closes it
    },
  ])
  const released = h.app.proxy.releasedTotal
  const ac = new AbortController()
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12), stream: true }),
    signal: ac.signal,
  })
  t.equal(r.status, 200)
  const reader = (r.body as ReadableStream<Uint8Array>).getReader()
  const first = await reader.read()
  t.match(Buffer.from(first.value as Uint8Array).toString(), '"decode_worker_id":100', 'first event carries nvext.worker_id')
  t.equal(booked(), 1, 'booked while streaming')
  t.equal(h.router.scheduler.stats().slots.find((s) => s.workerId === 100n)?.prefillTokens, 0, 'the first token completed prefill')
  ac.abort()
  await until(() => booked() === 0 && upstreamClosed)
  t.equal(h.app.proxy.releasedTotal, released + 1, 'released exactly once')
  t.equal(h.app.proxy.inFlight, 0)
  await f.close()
})

t.test('upstream 500 before the first token is retried on the next best worker', async (t) => {
  const hits: string[] = []
  const f = await fleet([
    (_req, _body, res) => {
      hits.push('a')
      res.writeHead(500)
      res.end('boom')
    },
    (_req, _body, res) => {
      hits.push('b')
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk('hello')))
      res.end('data: [DONE]\n\n')
    },
  ])
  // make worker 101 the second choice: it already carries a booked request
  const hold = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/route',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ token_ids: tokens(64, 9000), worker_id: 101, update_states: true, request_id: 'hold' }),
  })
  t.equal(hold.statusCode, 200)
  // decoding, not prefilling: a short prompt could share a prefill step already under way
  h.router.scheduler.markPrefillComplete('hold')
  const released = h.app.proxy.releasedTotal
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12), stream: true }),
  })
  t.equal(r.status, 200)
  const text = await r.text()
  t.same(hits, ['a', 'b'], 'the failing worker first, then the next best')
  t.match(text, '"decode_worker_id":101')
  t.match(text, 'data: [DONE]')
  t.ok(h.router.scheduler.free('hold'))
  t.equal(booked(), 0)
  t.equal(h.app.proxy.releasedTotal, released + 2, 'both bookings released once each')
  const m = await h.app.fastify.inject({ method: 'GET', url: '/metrics' })
  t.match(m.body, /kvrouter_proxy_retries_total [1-9]/)
  await f.close()
})

t.test('a refused connection is retried; when every worker fails the client gets 502', async (t) => {
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(503)
      res.end()
    },
  ])
  await h.router.addWorker({ id: 200n, url: 'http://127.0.0.1:9' }) // nothing listens on port 9
  const released = h.app.proxy.releasedTotal
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12) }),
  })
  t.equal(r.status, 502)
  const body = (await r.json()) as { error: { code: string; message: string } }
  t.equal(body.error.code, 'KVR_ERR_UPSTREAM')
  t.equal(booked(), 0)
  t.equal(h.app.proxy.releasedTotal, released + 2, 'one booking per attempt, each released once')
  await h.router.removeWorker(200n)
  await f.close()
})

t.test('--proxy-retries bounds the attempts: N retries, N + 1 workers asked, however many could be', async (t) => {
  for (const retries of [0, 1, 3]) {
    const hr = await harness(['--router-block-size', '4', '--proxy-retries', String(retries)])
    await hr.app.fastify.listen({ host: '127.0.0.1', port: 0 })
    const url = `http://127.0.0.1:${(hr.app.fastify.server.address() as AddressInfo).port}`
    let hits = 0
    const servers: Awaited<ReturnType<typeof upstream>>[] = []
    for (let i = 0; i < 5; i++) {
      const s = await upstream((_req, _body, res) => {
        hits++
        res.writeHead(500)
        res.end()
      })
      servers.push(s)
      await hr.router.addWorker({ id: BigInt(500 + i), url: s.url })
    }
    const r = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: tokens(12) }),
    })
    t.equal(r.status, 502, `--proxy-retries ${retries}: the failure is answered`)
    t.equal(hits, retries + 1, `--proxy-retries ${retries}: ${retries + 1} of the 5 workers were asked`)
    t.equal(hr.app.proxy.releasedTotal, retries + 1, 'one booking per attempt, each released')
    t.equal(hr.router.scheduler.stats().bookedRequests, 0)
    for (const s of servers) await s.close()
    await hr.close()
  }
})

t.test('nvext priority and router_config_override reach the routing decision, completions and chat', async (t) => {
  const seen: { priority?: number; overrides?: unknown }[] = []
  const route = h.router.route.bind(h.router)
  h.router.route = (input) => {
    seen.push({ priority: input.priority, overrides: input.overrides })
    return route(input)
  }
  t.teardown(() => {
    h.router.route = route
  })
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ id: 'x', object: 'text_completion', choices: [{ index: 0, text: 'ok', finish_reason: 'stop' }] }))
    },
  ])
  const nvext = {
    agent_hints: { priority: -7 },
    router_config_override: {
      overlap_score_weight: 2.5,
      overlap_score_credit: 3,
      router_temperature: 0.25,
      assume_kv_reuse: false,
      track_prefill_tokens: true,
    },
  }
  const want = {
    priority: -7,
    overrides: { overlapScoreWeight: 2.5, overlapScoreCredit: 3, temperature: 0.25, assumeKvReuse: false, trackPrefillTokens: true },
  }
  const a = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12), nvext }),
  })
  t.equal(a.status, 200)
  const b = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: [1, 2, 3].join(' ') }], nvext: { ...nvext, token_data: tokens(12) } }),
  })
  t.equal(b.status, 200)
  t.same(seen, [want, want])
  const bad = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12), nvext: { router_config_override: { router_temperature: -1 } } }),
  })
  t.equal(bad.status, 400, 'a negative override is refused')
  await f.close()
})

t.test('upstream death mid-stream ends the stream with an error event and frees the booking', async (t) => {
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk('one')))
      setTimeout(() => res.socket?.destroy(), 20)
    },
  ])
  const released = h.app.proxy.releasedTotal
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12), stream: true }),
  })
  t.equal(r.status, 200)
  const text = await r.text()
  t.match(text, '"text":"one"')
  t.match(text, /data: \{"error":\{"code":"KVR_ERR_UPSTREAM","message":"worker 100 failed mid-stream/)
  t.notMatch(text, '[DONE]')
  t.equal(booked(), 0)
  t.equal(h.app.proxy.releasedTotal, released + 1)
  await f.close()
})

t.test('the [DONE] event goes out with the end of the body, or on its own when the worker keeps the response open', { timeout: 10_000 }, async (t) => {
  let release: () => void = () => {}
  const clientSawDone = new Promise<void>((r) => (release = r))
  let mode = 0
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk('one')))
      const m = mode++
      setTimeout(() => {
        if (m === 0) res.end(sse(chunk('two')) + 'data: [DONE]\n\n')
        else if (m === 1) {
          // the worker holds the response open after [DONE] until the client has it: a router
          // that kept [DONE] back for the end of the body would wait here for ever
          res.write('data: [DONE]\n\n')
          void clientSawDone.then(() => res.end(': trailing comment\n\n'))
        } else {
          res.write('data: [DONE]\n\n')
          setTimeout(() => res.socket?.destroy(), 20)
        }
      }, 5)
    },
  ])
  const post = () =>
    fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: tokens(8), stream: true }),
    })
  const released = h.app.proxy.releasedTotal
  const whole = await (await post()).text()
  t.match(whole, /"text":"one".*\n\ndata: \{.*"text":"two".*\n\ndata: \[DONE\]\n\n$/s, 'every event in order, [DONE] last')

  const r = await post()
  const reader = (r.body as ReadableStream<Uint8Array>).getReader()
  let got = ''
  while (!got.includes('[DONE]')) {
    const x = await reader.read()
    if (x.done) break
    got += Buffer.from(x.value).toString()
  }
  t.match(got, 'data: [DONE]\n\n', '[DONE] arrived while the worker still held the response open')
  release()
  while (true) {
    const x = await reader.read()
    if (x.done) break
    got += Buffer.from(x.value).toString()
  }
  t.ok(got.endsWith('data: [DONE]\n\n: trailing comment\n\n'), 'what the worker sent after [DONE] follows it')

  const died = await (await post()).text()
  t.match(died, /data: \[DONE\]\n\ndata: \{"error":\{"code":"KVR_ERR_UPSTREAM"/, 'a worker that dies after [DONE]: [DONE], then the error event')
  t.equal(booked(), 0)
  t.equal(h.app.proxy.releasedTotal, released + 3)
  await f.close()
})

t.test('a client that leaves while its request waits in the queue is removed from it', async (t) => {
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"choices":[]}')
    },
  ])
  // queue threshold 4 × max_num_batched_tokens: make the worker queue-busy with a big booking
  await h.router.addWorker({ id: 100n, url: f.servers[0]?.url as string, maxNumBatchedTokens: 1 })
  const hold = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/route',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ token_ids: tokens(64, 7000), update_states: true, request_id: 'big' }),
  })
  t.equal(hold.statusCode, 200)
  const ac = new AbortController()
  const p = fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12) }),
    signal: ac.signal,
  }).catch((e: unknown) => e)
  await until(() => h.router.scheduler.stats().queueDepth === 1)
  ac.abort()
  await p
  await until(() => h.router.scheduler.stats().queueDepth === 0)
  t.equal(h.router.scheduler.stats().cancelledTotal, 1)
  t.ok(h.router.scheduler.free('big'))
  t.equal(booked(), 0)
  await f.close()
})

t.test('a client that stops reading holds the upstream back; nothing is lost when it reads again', async (t) => {
  const EVENT = sse(chunk('x'.repeat(16_000)))
  const LIMIT = 64 * 1024 * 1024
  let written = 0
  let heldBackAt = -1
  let upstreamDone!: () => void
  const finished = new Promise<void>((r) => (upstreamDone = r))
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      const pump = (): void => {
        while (written < LIMIT) {
          written += EVENT.length
          if (!res.write(EVENT)) {
            if (heldBackAt < 0) heldBackAt = written
            res.once('drain', pump)
            return
          }
        }
        res.end('data: [DONE]\n\n')
        upstreamDone()
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
  // the client reads nothing: the upstream must meet a full socket long before LIMIT
  await until(() => heldBackAt > 0)
  await new Promise((r) => setTimeout(r, 200))
  t.ok(written < LIMIT / 2, `the upstream was held back after ${written} bytes, not allowed to write all ${LIMIT}`)
  t.equal(booked(), 1, 'still booked while held back')
  let received = 0
  res.on('data', (b: Buffer) => (received += b.length))
  const ended = new Promise((r) => res.once('end', r))
  res.resume()
  await finished
  await ended
  // the first event grew by nvext.worker_id; every byte after it arrived
  t.ok(received >= LIMIT, `the client got everything once it read again (${received} bytes)`)
  await until(() => booked() === 0)
  t.equal(h.app.proxy.releasedTotal, released + 1, 'released exactly once')
  await f.close()
})

t.test('seeded chaos: streams that finish, fail, die, answer whole or are abandoned all free their bookings', async (t) => {
  // the upstream's behaviour is picked by the request itself (a field the proxy forwards as is)
  const behave = (body: string, res: import('node:http').ServerResponse): void => {
    const mode = (JSON.parse(body) as { user: string }).user
    if (mode === 'fail') {
      res.writeHead(500)
      res.end('boom')
      return
    }
    if (mode === 'whole') {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ choices: [{ text: 'all at once' }], usage: { completion_tokens: 3 } }))
      return
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    let n = 0
    const timer = setInterval(() => {
      if (res.destroyed) return clearInterval(timer)
      if (mode === 'die' && n === 2) {
        clearInterval(timer)
        res.socket?.destroy()
        return
      }
      if (n === 6) {
        clearInterval(timer)
        res.end('data: [DONE]\n\n')
        return
      }
      res.write(sse(chunk(`c${n++}`)))
    }, 3)
  }
  const f = await fleet([(_req, body, res) => behave(body, res), (_req, body, res) => behave(body, res)])
  const released = h.app.proxy.releasedTotal
  const decisions = h.router.scheduler.stats().decisionsTotal
  let seed = 12345
  const rnd = (): number => (seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32
  const modes = ['ok', 'ok', 'fail', 'die', 'whole']
  const runs: Promise<string>[] = []
  for (let i = 0; i < 60; i++) {
    const mode = modes[Math.floor(rnd() * modes.length)] as string
    const abandonAfter = rnd() < 0.3 ? Math.floor(rnd() * 25) : -1
    runs.push(
      (async () => {
        const ac = new AbortController()
        if (abandonAfter >= 0) setTimeout(() => ac.abort(), abandonAfter)
        try {
          const r = await fetch(`${base}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ prompt: tokens(8, 100 * i), stream: mode !== 'whole', user: mode }),
            signal: ac.signal,
          })
          const text = await r.text()
          if (mode === 'ok') {
            t.equal(r.status, 200)
            t.match(text, /"decode_worker_id":10[01]/, 'the first event carries nvext.worker_id')
            t.match(text, /c0[\s\S]*c1[\s\S]*c2[\s\S]*c3[\s\S]*c4[\s\S]*c5[\s\S]*\[DONE\]/, 'every chunk, in order')
          } else if (mode === 'fail') t.equal(r.status, 502, 'both workers fail before the first token')
          else if (mode === 'die') t.match(text, '"code":"KVR_ERR_UPSTREAM"', 'an error event ends the stream')
          else t.match(text, '"worker_id"')
          return mode
        } catch (err) {
          t.ok(abandonAfter >= 0, `only abandoned requests fail on the client (${mode}: ${(err as Error).message})`)
          return 'abandoned'
        }
      })(),
    )
  }
  const outcomes = await Promise.all(runs)
  t.ok(outcomes.includes('abandoned') && outcomes.includes('ok') && outcomes.includes('die'), 'the seed mixes the cases')
  await until(() => booked() === 0 && h.app.proxy.inFlight === 0)
  t.equal(h.app.proxy.releasedTotal - released, h.router.scheduler.stats().decisionsTotal - decisions, 'every booking made was released')
  await f.close()
})

t.test('a first event split over two upstream writes is rewritten once and counted as one chunk', async (t) => {
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      const first = sse(chunk('a'))
      res.write(first.slice(0, 10))
      // apart in time, so each write reaches the router as a read of its own
      setTimeout(() => res.write(first.slice(10)), 20)
      setTimeout(() => res.write(sse(chunk('b'))), 40)
      setTimeout(() => res.end('data: [DONE]\n\n'), 60)
    },
  ])
  const sum = async (): Promise<number> => {
    const text = (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
    const line = text.split('\n').find((l) => l.startsWith('dynamo_component_router_output_sequence_tokens_sum'))
    return Number(line?.split(' ').pop() ?? NaN)
  }
  const before = await sum()
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12), stream: true }),
  })
  const text = await r.text()
  t.equal(text.split('"decode_worker_id":100').length - 1, 1, 'nvext.worker_id added once')
  t.match(text, /"text":"a"[\s\S]*"text":"b"[\s\S]*\[DONE\]/)
  t.equal((await sum()) - before, 3, 'three chunks: the two events and [DONE]')
  await f.close()
})

t.test('shutdown drains: a stream in flight finishes whole, a new connection is refused', async (t) => {
  const h2 = await harness(['--router-block-size', '4'])
  await h2.app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const base2 = `http://127.0.0.1:${(h2.app.fastify.server.address() as AddressInfo).port}`
  let finish: (() => void) | undefined
  const s = await upstream((_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(sse(chunk('first')))
    finish = () => res.end(sse(chunk('last')) + 'data: [DONE]\n\n')
  })
  t.teardown(() => s.close())
  await h2.router.addWorker({ id: 200n, url: s.url })
  const r = await fetch(`${base2}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(8), stream: true }),
  })
  t.equal(r.status, 200)
  const reader = (r.body as ReadableStream<Uint8Array>).getReader()
  await reader.read()
  const closing = h2.app.shutdown(5000)
  // a new connection, as a load balancer's next request would use: refused, not answered 503
  // for as long as the drain takes
  const refused = await new Promise<string>((resolve) => {
    const req = httpRequest(`${base2}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, agent: false }, () =>
      resolve('answered'),
    )
    req.on('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'))
    req.end(JSON.stringify({ prompt: tokens(8), stream: true }))
  })
  t.equal(refused, 'ECONNREFUSED', 'the listener is closed while draining')
  t.equal(h2.app.proxy.inFlight, 1, 'the stream in flight is still being served')
  ;(finish as () => void)()
  let rest = ''
  for (;;) {
    const x = await reader.read()
    if (x.done) break
    rest += Buffer.from(x.value).toString()
  }
  t.match(rest, '"text":"last"', 'the stream in flight ended whole')
  t.match(rest, 'data: [DONE]')
  t.same(await closing, { drained: true, cut: 0 }, 'shutdown reports a complete drain')
  await h2.router.close()
})

t.test('shutdown past its timeout cuts a stream that never ends, frees its booking and returns', async (t) => {
  const h3 = await harness(['--router-block-size', '4'])
  await h3.app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const base3 = `http://127.0.0.1:${(h3.app.fastify.server.address() as AddressInfo).port}`
  let upstreamGone = false
  const s = await upstream((req, _body, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(sse(chunk('first')))
    req.socket.on('close', () => (upstreamGone = true))
    // and never ends
  })
  t.teardown(() => s.close())
  await h3.router.addWorker({ id: 300n, url: s.url })
  const r = await fetch(`${base3}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(8), stream: true }),
  })
  const reader = (r.body as ReadableStream<Uint8Array>).getReader()
  await reader.read()
  t.equal(h3.router.scheduler.stats().bookedRequests, 1)
  const t0 = Date.now()
  const { drained, cut } = await h3.app.shutdown(300)
  t.equal(drained, false, 'shutdown reports that it did not drain')
  t.equal(cut, 1, 'and that it cut the one stream in flight')
  t.ok(Date.now() - t0 < 3000, `it returned soon after its timeout (${Date.now() - t0} ms)`)
  await t.rejects(
    (async () => {
      for (;;) if ((await reader.read()).done) throw new Error('ended cleanly')
    })(),
    'the client sees its connection cut, not a clean end',
  )
  t.equal(h3.router.scheduler.stats().bookedRequests, 0, 'the booking is freed')
  await new Promise((resolve) => setTimeout(resolve, 50))
  t.ok(upstreamGone, 'the upstream request was aborted')
  await h3.router.close()
})

t.test('shutdown returns by its deadline whatever connections are open: unused, headers or a body half sent', async (t) => {
  const h4 = await harness(['--router-block-size', '4'])
  await h4.app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const port = (h4.app.fastify.server.address() as AddressInfo).port
  const { connect } = await import('node:net')
  const open = (first: string) =>
    new Promise<import('node:net').Socket>((resolve) => {
      const c = connect(port, '127.0.0.1', () => {
        if (first !== '') c.write(first)
        resolve(c)
      })
      c.on('error', () => {})
      // read whatever comes (a 503), so the end of the stream is seen and 'close' follows
      c.resume()
    })
  const sockets = [
    await open(''),
    await open('POST /v1/route HTTP/1.1\r\nHost: x\r\n'),
    await open('POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{"token_ids"'),
  ]
  const closedAll = Promise.all(sockets.map((c) => new Promise((resolve) => c.on('close', resolve))))
  const t0 = Date.now()
  // whether the request with half a body is answered 503 or cut depends on whether the router
  // parsed its headers before the shutdown began; either way the shutdown keeps its deadline
  t.type((await h4.app.shutdown(300)).drained, 'boolean')
  t.ok(Date.now() - t0 < 2500, `shutdown returned ${Date.now() - t0} ms after it began (deadline 300 ms)`)
  await closedAll
  t.ok(
    sockets.every((c) => c.destroyed),
    'every connection was closed',
  )
  await h4.router.close()
})

t.test('shutdown waits for a request whose body is still arriving, then serves it', async (t) => {
  const h5 = await harness(['--router-block-size', '4'])
  const port = await listening(h5)
  const s = await upstream((_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify(chunk('whole')))
  })
  t.teardown(() => s.close())
  await h5.router.addWorker({ id: 500n, url: s.url })
  const body = JSON.stringify({ prompt: tokens(8) })
  const { connect } = await import('node:net')
  let answer = ''
  const c = connect(port, '127.0.0.1')
  c.setEncoding('utf8')
  c.on('data', (d: string) => (answer += d))
  const ended = new Promise((resolve) => c.on('close', resolve))
  await new Promise((resolve) => c.on('connect', resolve))
  c.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 5)}`)
  await new Promise((resolve) => setTimeout(resolve, 50))
  const closing = h5.app.shutdown(5000)
  await new Promise((resolve) => setTimeout(resolve, 200))
  c.write(body.slice(5))
  t.same(await closing, { drained: true, cut: 0 }, 'a complete drain: nothing was cut')
  await ended
  t.match(answer, /^HTTP\/1\.1 200 /, 'the request that was arriving was served')
  t.match(answer, '"text":"whole"')
  await h5.router.close()
})

t.test('shutdown does not cut an answer still being written to a slow reader', async (t) => {
  const h6 = await harness(['--router-block-size', '4'])
  const port = await listening(h6)
  let answered = false
  const big = 'a'.repeat(20_000_000)
  const s = await upstream((_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ id: 'x', object: 'text_completion', choices: [{ index: 0, text: big }] }))
    answered = true
  })
  t.teardown(() => s.close())
  await h6.router.addWorker({ id: 600n, url: s.url })
  const body = JSON.stringify({ prompt: tokens(8) })
  const { connect } = await import('node:net')
  const c = connect(port, '127.0.0.1')
  const parts: Buffer[] = []
  c.on('data', (d: Buffer) => parts.push(d))
  const ended = new Promise((resolve) => c.on('close', resolve))
  await new Promise((resolve) => c.on('connect', resolve))
  c.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`)
  c.pause()
  await until(() => answered)
  // the router has the whole answer and writes it into a connection nobody reads yet
  await new Promise((resolve) => setTimeout(resolve, 300))
  const closing = h6.app.shutdown(10_000)
  await new Promise((resolve) => setTimeout(resolve, 100))
  c.resume()
  t.same(await closing, { drained: true, cut: 0 }, 'a complete drain')
  await ended
  const all = Buffer.concat(parts)
  const head = all.subarray(0, all.indexOf('\r\n\r\n')).toString()
  const length = Number(/content-length: (\d+)/i.exec(head)?.[1])
  t.ok(length > 20_000_000, `the answer's length (${length})`)
  t.equal(all.length - head.length - 4, length, 'every byte of it arrived')
  await h6.router.close()
})

t.test('past the first token the router lets go of the prompt, while the stream stays open', async (t) => {
  const gc = fullGc()
  let ref: WeakRef<object> | undefined
  const route = h.router.route.bind(h.router)
  h.router.route = (input) => {
    if (input.tokens !== null && typeof input.tokens === 'object') ref ??= new WeakRef(input.tokens)
    return route(input)
  }
  t.teardown(() => {
    h.router.route = route
  })
  let end: (() => void) | undefined
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(sse(chunk('first')))
      end = () => res.end('data: [DONE]\n\n')
    },
  ])
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(4096), stream: true }),
  })
  const reader = (r.body as ReadableStream<Uint8Array>).getReader()
  await reader.read()
  t.ok(ref !== undefined, 'the prompt went through routing')
  for (let i = 0; i < 10 && ref?.deref() !== undefined; i++) {
    await new Promise((res) => setImmediate(res))
    gc()
  }
  t.equal(ref?.deref(), undefined, 'the prompt array was collected with the stream still open')
  t.equal(h.app.proxy.inFlight, 1)
  ;(end as () => void)()
  while (!(await reader.read()).done);
  await f.close()
})

t.test(
  'a first event ended by CRLF lines gets its worker id and goes out at once; a first chunk with no event end past 256 KiB goes out as it is',
  async (t) => {
    const ends: (() => void)[] = []
    const big = 'x'.repeat(300 * 1024)
    let served = 0
    const f = await fleet([
      (_req, _body, res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        if (served++ === 0) res.write(`data: ${JSON.stringify(chunk('crlf'))}\r\n\r\n`)
        else res.write(big)
        ends.push(() => res.end('data: [DONE]\r\n\r\n'))
      },
    ])
    for (const expectBig of [false, true]) {
      const r = await fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: tokens(8), stream: true }),
      })
      const reader = (r.body as ReadableStream<Uint8Array>).getReader()
      let got = ''
      // read what arrives while the upstream still holds the stream open
      while (got.length < (expectBig ? big.length : 1) || (!expectBig && !got.includes('\n\n'))) {
        const x = await reader.read()
        if (x.done) break
        got += Buffer.from(x.value).toString()
      }
      if (expectBig) t.equal(got, big, 'the unframed chunk, unchanged, before the upstream ends')
      else {
        t.match(got, '"text":"crlf"')
        t.match(got, '"decode_worker_id":100', 'the CRLF-ended first event carries nvext.worker_id before the upstream ends')
      }
      ;(ends.shift() as () => void)()
      while (!(await reader.read()).done);
    }
    await f.close()
  },
)

t.test('a first event split inside a multi-byte character arrives intact', async (t) => {
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      const first = Buffer.from(sse(chunk('héllo wörld ✓')))
      // cut inside the two bytes of é, then apart in time so the router reads them separately
      const at = first.indexOf(Buffer.from('é')) + 1
      res.write(first.subarray(0, at))
      setTimeout(() => res.write(first.subarray(at)), 20)
      setTimeout(() => res.end('data: [DONE]\n\n'), 40)
    },
  ])
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12), stream: true }),
  })
  const text = await r.text()
  t.notMatch(text, '\uFFFD', 'no replacement character')
  const first = JSON.parse((text.split('\n\n')[0] as string).slice('data: '.length)) as {
    choices: { text: string }[]
    nvext: { worker_id: { decode_worker_id: number } }
  }
  t.equal(first.choices[0]?.text, 'héllo wörld ✓')
  t.equal(first.nvext.worker_id.decode_worker_id, 100)
  await f.close()
})

t.test('a retry that finds every other worker busy answers the upstream failure, saying why it was not retried', async (t) => {
  const f = await fleet([
    (_req, _body, res) => {
      res.writeHead(500)
      res.end('boom')
    },
    (_req, _body, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end('data: [DONE]\n\n')
    },
  ])
  // worker 101 carries a request in prefill, so a threshold of 0 makes it busy; 100 is idle
  const hold = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/route',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ token_ids: tokens(64, 7000), worker_id: 101, update_states: true, request_id: 'hold-busy' }),
  })
  t.equal(hold.statusCode, 200)
  const set = await h.app.fastify.inject({
    method: 'POST',
    url: '/busy_threshold',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ active_prefill_tokens_threshold: 0 }),
  })
  t.equal(set.statusCode, 200)
  t.teardown(async () => {
    await h.app.fastify.inject({
      method: 'POST',
      url: '/busy_threshold',
      headers: { 'content-type': 'application/json' },
      payload: JSON.stringify({ active_prefill_tokens_threshold: null }),
    })
  })
  const released = h.app.proxy.releasedTotal
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(12) }),
  })
  t.equal(r.status, 502, 'the failure that happened, not a 503')
  const body = (await r.json()) as { error: { code: string; message: string } }
  t.equal(body.error.code, 'KVR_ERR_UPSTREAM')
  t.match(body.error.message, /^worker 100 failed before its first token.*; not retried: every other worker is busy$/)
  t.equal(h.app.proxy.releasedTotal, released + 1, 'the one booking released once')
  t.ok(h.router.scheduler.free('hold-busy'))
  t.equal(booked(), 0)
  await f.close()
})

t.test('a worker being registered is never routed to before its URL is known', async (t) => {
  const s = await upstream((_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.end('data: [DONE]\n\n')
  })
  const id = 4242n
  // a shard that answers within one event-loop turn would leave no window to watch: each answer
  // is held a few ms, as a busy shard's would be
  const pool = h.router.pool
  const ensure = pool.ensureWorker.bind(pool)
  pool.ensureWorker = async (workerId, dpRank) => {
    await new Promise((r) => setTimeout(r, 5))
    return ensure(workerId, dpRank)
  }
  t.teardown(() => {
    pool.ensureWorker = ensure
  })
  let done = false
  const adding = h.router.addWorker({ id, url: s.url, dpRanks: 2 }).then(() => {
    done = true
  })
  let turns = 0
  while (!done) {
    const ranks = h.router.scheduler.stats().slots.filter((x) => x.workerId === id).length
    if (ranks > 0 && h.router.registry.get(id) === undefined) t.fail(`the scheduler had ${ranks} rank(s) of the worker and the router no URL for it`)
    turns++
    await new Promise((r) => setImmediate(r))
  }
  await adding
  t.ok(turns > 1, 'registration took event-loop turns (the shard is asked), so the window was watched')
  t.equal(h.router.scheduler.stats().slots.filter((x) => x.workerId === id).length, 2, 'both ranks scheduled')
  t.equal(h.router.registry.get(id)?.url, s.url)
  await h.router.removeWorker(id)
  await s.close()
})
