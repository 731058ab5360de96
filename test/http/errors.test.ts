// Every route's error paths through inject(): malformed JSON, wrong types, token ids out of
// range, empty prompts, unknown pinned workers, oversized bodies, missing or wrong API keys.
import { connect } from 'node:net'
import t from 'tap'
import { harness, listening, tokens, upstream } from './helpers.js'

const KEY = 'sekret'
const h = await harness(['--api-key', KEY, '--router-block-size', '4', '--http-body-limit', '4096', '--worker', '5=http://127.0.0.1:9'])
t.teardown(() => h.close())
const auth = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' }

async function call(method: 'GET' | 'POST' | 'DELETE', url: string, payload?: string, headers: Record<string, string> = auth) {
  const res = await h.app.fastify.inject({ method, url, payload, headers })
  let body: { error?: { code: string; message: string } } & Record<string, unknown> = {}
  try {
    body = res.json()
  } catch {
    // non-JSON bodies are checked by status only
  }
  return { status: res.statusCode, body, headers: res.headers }
}

const mutating: [string, string, string][] = [
  ['POST', '/v1/completions', JSON.stringify({ prompt: tokens(8) })],
  ['POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] })],
  ['POST', '/v1/route', JSON.stringify({ token_ids: tokens(8) })],
  ['POST', '/v1/overlap', JSON.stringify({ token_ids: tokens(8) })],
  ['POST', '/v1/kv-events', '[]'],
  ['POST', '/v1/workers', JSON.stringify({ id: 9, url: 'http://127.0.0.1:9' })],
  ['DELETE', '/v1/workers/5', ''],
  ['POST', '/v1/route/x/prefill-complete', ''],
  ['DELETE', '/v1/route/x', ''],
  ['POST', '/busy_threshold', '{}'],
]

t.test('api key: missing or wrong → 401 on every route but the probes and /metrics', async (t) => {
  for (const [method, url, payload] of mutating) {
    const none = await call(method as 'POST', url, payload, { 'content-type': 'application/json' })
    t.equal(none.status, 401, `${method} ${url} without a key`)
    t.equal(none.body.error?.code, 'KVR_ERR_UNAUTHORIZED')
    t.match(none.body.error?.message, /missing/)
    const wrong = await call(method as 'POST', url, payload, { 'content-type': 'application/json', authorization: 'Bearer nope' })
    t.equal(wrong.status, 401, `${method} ${url} with a wrong key`)
    t.match(wrong.body.error?.message, /wrong API key/)
    const scheme = await call(method as 'POST', url, payload, { 'content-type': 'application/json', authorization: 'Basic k' })
    t.equal(scheme.status, 401, `${method} ${url} with another scheme`)
    t.match(scheme.body.error?.message, /must be `Bearer KEY`/)
    const bare = await call(method as 'POST', url, payload, { 'content-type': 'application/json', authorization: 'k' })
    t.match(bare.body.error?.message, /must be `Bearer KEY`/, 'the key alone, no scheme')
  }
  for (const scheme of ['Bearer', 'bearer', 'BEARER']) {
    const ok = await call('POST', '/busy_threshold', '{}', { 'content-type': 'application/json', authorization: `${scheme} ${KEY}` })
    t.equal(ok.status, 200, `the key under the scheme spelt ${scheme}`)
  }
  t.equal(
    (await call('POST', '/busy_threshold', '{}', { 'content-type': 'application/json', authorization: `Bearer ${KEY}x` })).status,
    401,
    'the key with a byte more',
  )
  // the probes and the metrics stay open; every other read needs the key (worker URLs, the fleet)
  for (const url of ['/health', '/ready', '/metrics', '/health?x=1']) t.equal((await call('GET', url, undefined, {})).status, 200, `GET ${url}`)
  for (const url of ['/v1/models', '/v1/workers', '/busy_threshold', '/v1/kv/dump', '/v1/kv/dump?worker_id=5', '/no/such/route']) {
    const r = await call('GET', url, undefined, {})
    t.equal(r.status, 401, `GET ${url} without a key`)
    t.notMatch(JSON.stringify(r.body), '127.0.0.1', 'no worker URL in the refusal')
    t.equal((await call('GET', url, undefined, { authorization: `Bearer ${KEY}` })).status, url === '/no/such/route' ? 404 : 200, `GET ${url} with the key`)
  }
})

t.test('malformed JSON → 400 KVR_ERR_INVALID_REQUEST on every JSON route', async (t) => {
  for (const url of ['/v1/completions', '/v1/chat/completions', '/v1/route', '/v1/overlap', '/v1/workers', '/busy_threshold']) {
    const r = await call('POST', url, '{"prompt": [1, 2,')
    t.equal(r.status, 400, url)
    t.equal(r.body.error?.code, 'KVR_ERR_INVALID_REQUEST', url)
  }
  const ev = await call('POST', '/v1/kv-events', '{"worker_id": 1, "event": {')
  t.equal(ev.status, 400)
  t.match(ev.body.error?.code, /^KVR_ERR_EVENT_/)
  const notObj = await call('POST', '/v1/route', '[1,2,3]')
  t.equal(notObj.status, 400)
  t.match(notObj.body.error?.message, /JSON object/)
  const trailing = await call('POST', '/v1/route', '{"token_ids":[1,2,3,4]} x')
  t.equal(trailing.status, 400)
})

t.test('wrong types → 400', async (t) => {
  const cases: [string, unknown][] = [
    ['/v1/completions', { prompt: 5 }],
    ['/v1/completions', { prompt: tokens(8), stream: 'yes' }],
    ['/v1/completions', { prompt: tokens(8), max_tokens: 1.5 }],
    ['/v1/completions', { prompt: tokens(8), nvext: { backend_instance_id: 'abc' } }],
    ['/v1/completions', { prompt: tokens(8), nvext: { agent_hints: { priority: 'high' } } }],
    ['/v1/completions', { prompt: tokens(8), nvext: { router_config_override: { router_temperature: -1 } } }],
    ['/v1/completions', { prompt: [['a'], ['b']] }],
    ['/v1/chat/completions', { messages: 'hi' }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: [5] }] }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: [null] }] }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'text', text: 7 }] }] }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'text' }] }] }],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: [{ text: 'no type' }] }] }],
    ['/v1/chat/completions', { messages: [] }],
    ['/v1/route', { token_ids: 'abc' }],
    ['/v1/route', { token_ids: tokens(8), update_states: 'yes' }],
    ['/v1/route', { token_ids: tokens(8), router_config_override: { overlap_score_weight: 'x' } }],
    ['/v1/route', { token_ids: tokens(8), router_config_override: { overlap_score_credit: -2 } }],
    ['/v1/completions', { prompt: tokens(8), nvext: { router_config_override: { overlap_score_credit: 'high' } } }],
    ['/v1/route', { token_ids: tokens(8), request_id: 7, update_states: true }],
    ['/v1/route', { token_ids: tokens(8), worker_id: -3 }],
    ['/v1/route', { token_ids: tokens(8), dp_rank: 1.5 }],
    ['/v1/route', { token_ids: tokens(8), priority: 'x' }],
    ['/v1/route', { token_ids: tokens(8), isl: 1e300 }],
    ['/v1/route', { token_ids: tokens(8), isl: 2 ** 32 }],
    ['/v1/route', { token_ids: tokens(8), isl: -1 }],
    ['/v1/route', { block_hashes: [1, 'x'] }],
    ['/v1/route', { block_hashes: ['18446744073709551616'] }],
    ['/v1/route', {}],
    ['/v1/workers', { id: 9, url: 'ftp://x' }],
    ['/v1/workers', { id: 'nine', url: 'http://127.0.0.1:9' }],
    ['/v1/workers', { url: 'http://127.0.0.1:9' }],
    ['/v1/workers', { id: 9, url: 'http://127.0.0.1:9', device_type: 'tpu' }],
    ['/busy_threshold', { active_decode_blocks_threshold: 2 }],
  ]
  for (const [url, body] of cases) {
    const r = await call('POST', url, JSON.stringify(body))
    t.equal(r.status, 400, `${url} ${JSON.stringify(body)}`)
    t.match(r.body.error?.code, /^KVR_ERR_/, 'coded error')
  }
  const media = await call('POST', '/v1/completions', 'prompt=1', { ...auth, 'content-type': 'text/plain' })
  t.equal(media.status, 415)
  t.equal(media.body.error?.code, 'KVR_ERR_UNSUPPORTED_MEDIA_TYPE')
})

t.test('token ids out of range → 400 KVR_ERR_TOKEN_OUT_OF_RANGE naming the index', async (t) => {
  for (const bad of ['-1', '4294967296', '1.5', '1e3', '"7"', '007', 'null']) {
    const r = await call('POST', '/v1/route', `{"token_ids":[1,2,${bad},4,5]}`)
    t.equal(r.status, 400, bad)
    t.equal(r.body.error?.code, 'KVR_ERR_TOKEN_OUT_OF_RANGE', bad)
    t.match(r.body.error?.message, /token_ids\[2\]/, bad)
    const o = await call('POST', '/v1/overlap', `{"token_ids":[1,2,${bad},4,5]}`)
    t.equal(o.body.error?.code, 'KVR_ERR_TOKEN_OUT_OF_RANGE', `overlap ${bad}`)
  }
  for (const bad of [-1, 4294967296, 1.5]) {
    const r = await call('POST', '/v1/completions', JSON.stringify({ prompt: [1, 2, 3, 4, bad] }))
    t.equal(r.status, 400, String(bad))
    t.equal(r.body.error?.code, 'KVR_ERR_TOKEN_OUT_OF_RANGE')
    t.match(r.body.error?.message, /4/)
  }
  const huge = await call('POST', '/v1/completions', '{"prompt":[1,2,3,18446744073709551615]}')
  t.equal(huge.body.error?.code, 'KVR_ERR_TOKEN_OUT_OF_RANGE', 'a 20-digit token is refused, not rounded')
})

t.test('empty prompt → 400 KVR_ERR_EMPTY_PROMPT', async (t) => {
  for (const [url, body] of [
    ['/v1/completions', { prompt: '' }],
    ['/v1/completions', { prompt: [] }],
    ['/v1/route', { token_ids: [] }],
    ['/v1/route', { block_hashes: [] }],
  ] as [string, unknown][]) {
    const r = await call('POST', url, JSON.stringify(body))
    t.equal(r.status, 400, url)
    t.equal(r.body.error?.code, 'KVR_ERR_EMPTY_PROMPT')
  }
})

t.test('text prompt without a tokenizer in kv mode → clear 400', async (t) => {
  const r = await call('POST', '/v1/completions', JSON.stringify({ prompt: 'hello' }))
  t.equal(r.status, 400)
  t.equal(r.body.error?.code, 'KVR_ERR_NO_TOKENIZER')
  t.match(r.body.error?.message, /--tokenizer/)
  const c = await call('POST', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }))
  t.equal(c.body.error?.code, 'KVR_ERR_NO_TOKENIZER')
})

t.test('unknown pinned worker → 404 KVR_ERR_UNKNOWN_WORKER', async (t) => {
  const a = await call('POST', '/v1/completions', JSON.stringify({ prompt: tokens(8), nvext: { backend_instance_id: '18446744073709551615' } }))
  t.equal(a.status, 404)
  t.equal(a.body.error?.code, 'KVR_ERR_UNKNOWN_WORKER')
  t.match(a.body.error?.message, /18446744073709551615/, 'the u64 id is exact in the message')
  const b = await call('POST', '/v1/route', JSON.stringify({ token_ids: tokens(8), worker_id: 77 }))
  t.equal(b.status, 404)
  const c = await call('POST', '/v1/completions', JSON.stringify({ prompt: tokens(8) }), { ...auth, 'x-worker-instance-id': '6' })
  t.equal(c.status, 404, 'header pin')
  const d = await call('POST', '/v1/route', JSON.stringify({ token_ids: tokens(8), worker_id: 5, dp_rank: 3 }))
  t.equal(d.status, 404, 'unknown rank of a known worker')
  const e = await call('DELETE', '/v1/workers/12345')
  t.equal(e.status, 404)
  t.equal(e.body.error?.code, 'KVR_ERR_UNKNOWN_WORKER')
})

t.test('unknown booked request → 404', async (t) => {
  const a = await call('POST', '/v1/route/nope/prefill-complete', '')
  t.equal(a.status, 404)
  t.equal(a.body.error?.code, 'KVR_ERR_UNKNOWN_REQUEST')
  const b = await call('DELETE', '/v1/route/nope')
  t.equal(b.status, 404)
})

t.test('oversized body → 413 KVR_ERR_BODY_TOO_LARGE on every POST route', async (t) => {
  const big = JSON.stringify({ prompt: tokens(3000), token_ids: tokens(3000) })
  for (const [, url] of mutating.filter(([m, u]) => m === 'POST' && !u.includes('prefill'))) {
    const r = await call('POST', url, big)
    t.equal(r.status, 413, url)
    t.equal(r.body.error?.code, 'KVR_ERR_BODY_TOO_LARGE', url)
  }
})

t.test('unknown route → 404 JSON (with the key; without it, 401 first)', async (t) => {
  const r = await call('GET', '/v2/nothing', undefined, { authorization: `Bearer ${KEY}` })
  t.equal(r.status, 404)
  t.equal(r.body.error?.code, 'KVR_ERR_NOT_FOUND')
})

t.test('events: a bad event refuses the whole batch', async (t) => {
  const ok = '{"worker_id":5,"event":{"event_id":1,"data":"cleared","dp_rank":0}}'
  const r = await call('POST', '/v1/kv-events', `[${ok},{"worker_id":5,"event":{"event_id":2,"data":"exploded","dp_rank":0}}]`)
  t.equal(r.status, 400)
  t.equal(r.body.error?.code, 'KVR_ERR_EVENT_UNKNOWN_VARIANT')
  t.match(r.body.error?.message, /^event 1:/)
  const notObj = await call('POST', '/v1/kv-events', '[1,2]')
  t.equal(notObj.status, 400)
  t.equal(notObj.body.error?.code, 'KVR_ERR_EVENT_WRONG_TYPE')
  const unterminated = await call('POST', '/v1/kv-events', `[${ok}`)
  t.equal(unterminated.status, 400)
  const before = h.router.pool.counters()[0]?.enqueued ?? 0
  t.equal(before, 0, 'nothing was pushed')
  const good = await call('POST', '/v1/kv-events', ok)
  t.equal(good.status, 202)
  t.same(good.body, { accepted: 1, backpressure: false })
})

t.test('chat content parts: text parts with their text and parts of other types pass the schema', async (t) => {
  const content = [
    { type: 'text', text: 'look' },
    { type: 'image_url', image_url: { url: 'data:image/png;base64,AA==' } },
  ]
  const r = await call(
    'POST',
    '/v1/chat/completions',
    JSON.stringify({
      messages: [
        { role: 'user', content },
        { role: 'assistant', content: null },
      ],
      nvext: { token_data: tokens(8) },
    }),
  )
  t.not(r.status, 400, `not refused as invalid (${r.status} ${r.body.error?.code ?? ''})`)
})

t.test('events: refused batches are counted, and a full backlog refuses with 503 before taking anything', async (t) => {
  const refused = async (): Promise<number> => Number(/^kvrouter_http_events_refused_total (\d+)$/m.exec(await h.router.metrics.registry.metrics())?.[1])
  const n0 = await refused()
  t.equal((await call('POST', '/v1/kv-events', '[1]')).status, 400)
  t.equal((await call('POST', '/v1/kv-events', '[{"worker_id":5}] trailing')).status, 400)
  t.equal(await refused(), n0 + 2, 'each refused batch counted once, whatever refused it')
  const ok = '{"worker_id":5,"event":{"event_id":1,"data":"cleared","dp_rank":0}}'
  const enqueued = h.router.pool.counters()[0]?.enqueued ?? 0
  // the pool's own cap is tested in test/shards/pool.test.ts; here, what the route does with it
  Object.defineProperty(h.router.pool, 'backlogFull', { configurable: true, get: () => true })
  try {
    const r = await call('POST', '/v1/kv-events', `[${ok}]`)
    t.equal(r.status, 503)
    t.equal(r.body.error?.code, 'KVR_ERR_EVENT_BACKLOG')
    t.equal(r.headers['retry-after'], '1')
    t.match(r.body.error?.message, /wait for the indexer shards/)
  } finally {
    delete (h.router.pool as unknown as Record<string, unknown>).backlogFull
  }
  t.equal(h.router.pool.counters()[0]?.enqueued ?? 0, enqueued, 'nothing of it was taken')
  t.equal(await refused(), n0 + 3)
  t.equal((await call('POST', '/v1/kv-events', `[${ok}]`)).status, 202, 'taken again once the backlog has room')
  // messages the pool refuses before any shard sees them count as malformed events
  const malformed = async (): Promise<number> =>
    Number(/^dynamo_component_kv_cache_events_applied\{event_type="unknown",status="malformed"\} (\d+)$/m.exec(await h.router.metrics.registry.metrics())?.[1])
  const m0 = await malformed()
  h.router.pool.push(new Uint8Array(0))
  t.equal(await malformed(), m0 + 1)
})

t.test('events: every element must be an object, and nothing may follow the array', async (t) => {
  const ok = '{"worker_id":5,"event":{"event_id":1,"data":"cleared","dp_rank":0}}'
  const cases: [string, string, RegExp][] = [
    [`["x",${ok}]`, 'KVR_ERR_EVENT_WRONG_TYPE', /RouterEvent object/],
    [`[${ok},"x"]`, 'KVR_ERR_EVENT_WRONG_TYPE', /RouterEvent object/],
    [`[[${ok}]]`, 'KVR_ERR_EVENT_WRONG_TYPE', /RouterEvent object/],
    [`[${ok}] garbage`, 'KVR_ERR_EVENT_MALFORMED_JSON', /after the events array/],
    [`[${ok}${ok}]`, 'KVR_ERR_EVENT_MALFORMED_JSON', /expected "," or "\]"/],
    [`[${ok},]`, 'KVR_ERR_EVENT_MALFORMED_JSON', /trailing comma/],
    [`[,${ok}]`, 'KVR_ERR_EVENT_WRONG_TYPE', /RouterEvent object/],
  ]
  const before = h.router.pool.counters()[0]?.enqueued ?? 0
  for (const [body, code, message] of cases) {
    const r = await call('POST', '/v1/kv-events', body)
    t.equal(r.status, 400, body)
    t.equal(r.body.error?.code, code, body)
    t.match(r.body.error?.message, message, body)
  }
  t.equal(h.router.pool.counters()[0]?.enqueued ?? 0, before, 'none of them pushed an event')
  const two = await call('POST', '/v1/kv-events', ` [ ${ok} , ${ok} ] `)
  t.same(two.body, { accepted: 2, backpressure: false }, 'whitespace anywhere between elements is fine')
})

t.test('scanned routes: no body is a 400, not a crash', async (t) => {
  for (const url of ['/v1/route', '/v1/overlap', '/v1/kv-events']) {
    const r = await call('POST', url, undefined, { authorization: `Bearer ${KEY}` })
    t.equal(r.status, 400, url)
    t.match(r.body.error?.code, /^KVR_ERR_(INVALID_REQUEST|EVENT_MALFORMED_JSON)$/, url)
  }
})

t.test('/v1/route members: u64 exact, "__proto__" inert, escaped names read', async (t) => {
  const big = '18446744073709551557'
  const pinned = await call('POST', '/v1/route', `{"token_ids":[1,2,3,4],"worker_id":${big}}`)
  t.equal(pinned.status, 404)
  t.equal(pinned.body.error?.code, 'KVR_ERR_UNKNOWN_WORKER')
  t.match(pinned.body.error?.message, big, 'the id in the error is the one sent, not a rounded double')
  const proto = await call('POST', '/v1/route', '{"token_ids":[1,2,3,4],"__proto__":{"update_states":true}}')
  t.equal(proto.status, 200)
  t.equal(proto.body.request_id, undefined, 'a "__proto__" member is an ordinary ignored member: nothing is booked')
  t.equal(h.router.scheduler.sequences.size, 0)
  const escaped = await call('POST', '/v1/route', '{"token\\u005fids":[1,2,3,4],"update_st\\u0061tes":false}')
  t.equal(escaped.status, 200, 'an escaped member name is the same name')
  t.equal(escaped.body.worker_id, 5)
  const control = await call('POST', '/v1/route', '{"a\nb":1,"token_ids":[1,2,3,4]}')
  t.equal(control.status, 400, 'a raw control character in a member name is refused, as JSON.parse refuses it')
  t.match(control.body.error?.message, /member name/)
})

t.test('errors before any route runs are catalogue JSON too: bad path encoding, bad HTTP framing, oversized headers', async (t) => {
  for (const url of ['/v1/workers/%zz', '/v1/route/%FF%FE']) {
    const r = await call('DELETE', url)
    t.equal(r.status, 400, url)
    t.equal(r.body.error?.code, 'KVR_ERR_INVALID_REQUEST', url)
  }
  const own = await harness(['--router-block-size', '4'])
  t.teardown(() => own.close())
  const port = await listening(own)
  const raw = (text: string): Promise<string> =>
    new Promise((resolve, reject) => {
      const s = connect(port, '127.0.0.1', () => s.end(text))
      let got = ''
      s.setEncoding('latin1')
      s.on('data', (d: string) => (got += d))
      s.on('close', () => resolve(got))
      s.on('error', reject)
    })
  const cases: [string, string, number, string][] = [
    [
      'a Content-Length that is not a number',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: -1\r\n\r\n{}',
      400,
      'KVR_ERR_MALFORMED_HTTP',
    ],
    [
      'Content-Length with Transfer-Encoding',
      'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
      400,
      'KVR_ERR_MALFORMED_HTTP',
    ],
    ['an unknown method', 'FOO / HTTP/1.1\r\nHost: x\r\n\r\n', 400, 'KVR_ERR_MALFORMED_HTTP'],
    ['headers over the limit', `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`, 431, 'KVR_ERR_HEADERS_TOO_LARGE'],
  ]
  for (const [what, text, status, code] of cases) {
    const got = await raw(text)
    t.match(got, new RegExp(`^HTTP/1\\.1 ${status} `), what)
    const body = got.slice(got.indexOf('\r\n\r\n') + 4)
    t.match(JSON.parse(body), { error: { code } }, what)
  }
})

t.test('unusable worker URLs, non-UTF-8 scanned bodies, loose dp ranks, priorities beyond i32 → 400', async (t) => {
  for (const url of ['http://', 'http://exa mple:80', 'http://127.0.0.1:99999', 'https://:80']) {
    const r = await call('POST', '/v1/workers', JSON.stringify({ id: 11, url }))
    t.equal(r.status, 400, url)
    t.match(r.body.error, { code: 'KVR_ERR_INVALID_REQUEST', message: /url must be/ }, url)
  }
  t.equal(h.router.registry.get(11n), undefined, 'none of them registered')
  const bad = Buffer.concat([Buffer.from('{"token_ids":[1,2,3,4],"update_states":true,"request_id":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')])
  for (const url of ['/v1/route', '/v1/overlap', '/v1/kv-events']) {
    const res = await h.app.fastify.inject({ method: 'POST', url, payload: bad, headers: auth })
    t.equal(res.statusCode, 400, url)
    t.match(res.json(), { error: { code: 'KVR_ERR_INVALID_REQUEST', message: /UTF-8/ } }, url)
  }
  t.equal(h.router.scheduler.stats().bookedRequests, 0, 'nothing booked under replacement characters')
  const pin = { ...auth, 'x-worker-instance-id': '5' }
  for (const rank of ['', '0x0', '1e0', ' 1']) {
    const r = await call('POST', '/v1/completions', JSON.stringify({ prompt: tokens(8) }), { ...pin, 'x-dp-rank': rank })
    t.equal(r.status, 400, `x-dp-rank ${JSON.stringify(rank)}`)
    t.match(r.body.error?.message, /decimal integer/)
  }
  const unpinned = await call('POST', '/v1/completions', JSON.stringify({ prompt: tokens(8) }), { ...auth, 'x-dp-rank': '0' })
  t.equal(unpinned.status, 400)
  t.match(unpinned.body.error?.message, /needs the worker/)
  const rankOnly = await call('POST', '/v1/route', JSON.stringify({ token_ids: tokens(8), dp_rank: 0 }))
  t.equal(rankOnly.status, 400)
  t.match(rankOnly.body.error?.message, /needs the worker/)
  for (const p of ['2147483648', '-2147483649', '1e300']) {
    const r = await call('POST', '/v1/route', `{"token_ids":[1,2,3,4],"priority":${p}}`)
    t.equal(r.status, 400, `priority ${p}`)
    t.match(r.body.error?.message, /priority must be an integer in \[-2\^31, 2\^31\)/)
  }
  t.equal((await call('POST', '/v1/route', '{"token_ids":[1,2,3,4],"priority":-2147483648}')).status, 200, 'the i32 minimum is taken')
})

t.test('a parse error on a connection that is being answered closes it without a status line in the answer', async (t) => {
  const own = await harness(['--router-block-size', '4'])
  t.teardown(() => own.close())
  let finish: (() => void) | undefined
  const s = await upstream((_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(`data: ${JSON.stringify({ id: 'c', choices: [{ index: 0, text: 'a' }] })}\n\n`)
    finish = () => res.end('data: [DONE]\n\n')
  })
  t.teardown(() => {
    finish?.()
    return s.close()
  })
  await own.router.addWorker({ id: 8n, url: s.url })
  const port = await listening(own)
  const body = JSON.stringify({ prompt: tokens(8), stream: true })
  let got = ''
  const c = connect(port, '127.0.0.1')
  c.setEncoding('latin1')
  c.on('data', (d: string) => (got += d))
  c.on('error', () => {})
  const closed = new Promise((resolve) => c.on('close', resolve))
  await new Promise((resolve) => c.on('connect', resolve))
  c.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`)
  const end = Date.now() + 5000
  while (!got.includes('"text":"a"') && Date.now() < end) await new Promise((resolve) => setTimeout(resolve, 10))
  t.match(got, /^HTTP\/1\.1 200 /, 'the stream is under way')
  c.write('GARBAGE GARBAGE\r\n\r\n')
  await closed
  t.equal(got.split('HTTP/1.1 ').length - 1, 1, 'one status line only: none written into the stream')
})

t.test('every answered inference request is counted in dynamo_frontend_requests_total, once', async (t) => {
  // refusals before the proxy takes the request count too, not only those the proxy answers
  const count = async (endpoint: string, status: number): Promise<number> => {
    let n = 0
    for (const line of (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body.split('\n')) {
      if (line.startsWith('dynamo_frontend_requests_total{') && line.includes(`endpoint="${endpoint}"`) && line.includes(`status="${status}"`))
        n += Number(line.slice(line.lastIndexOf(' ') + 1))
    }
    return n
  }
  const cases: [string, string, Record<string, string>, number, string][] = [
    ['/v1/completions', '{"prompt": [1,', auth, 400, 'malformed JSON'],
    ['/v1/completions', '{"prompt": 5}', auth, 400, 'a prompt of the wrong type'],
    ['/v1/completions', '{"prompt": ""}', auth, 400, 'an empty prompt'],
    ['/v1/completions', '{"prompt": [1]}', { ...auth, 'content-type': 'text/csv' }, 415, 'not JSON'],
    ['/v1/completions', JSON.stringify({ prompt: tokens(2000) }), auth, 413, 'a body over the limit'],
    ['/v1/completions', '{"prompt": [1]}', { 'content-type': 'application/json' }, 401, 'no key'],
    ['/v1/chat/completions', '{"messages": []}', auth, 400, 'no messages'],
    ['/v1/chat/completions', '{"messages": [{"role": "user", "content": 5}]}', auth, 400, 'content of the wrong type'],
    ['/v1/completions', JSON.stringify({ prompt: tokens(8), nvext: { backend_instance_id: '18446744073709551615' } }), auth, 404, 'an unknown pinned worker'],
    ['/v1/completions', JSON.stringify({ prompt: tokens(8), nvext: { backend_instance_id: 5 } }), auth, 502, 'proxied to a dead worker (the proxy counts it)'],
  ]
  for (const [url, payload, headers, status, what] of cases) {
    const before = await count(url, status)
    const r = await h.app.fastify.inject({ method: 'POST', url, payload, headers })
    t.equal(r.statusCode, status, what)
    t.equal(await count(url, status), before + 1, `${what}: counted once`)
  }
})

t.test('--no-public-metrics: /metrics needs the key too; the probes never do', async (t) => {
  const closed = await harness(['--api-key', KEY, '--no-public-metrics', '--router-block-size', '4'])
  t.teardown(() => closed.close())
  // /ready wants a worker that can take a request
  await closed.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9' })
  const get = async (url: string, headers: Record<string, string> = {}) => (await closed.app.fastify.inject({ method: 'GET', url, headers })).statusCode
  t.equal(await get('/metrics'), 401)
  t.equal(await get('/metrics', { authorization: `Bearer ${KEY}` }), 200)
  t.equal(await get('/health'), 200)
  t.equal(await get('/ready'), 200)
})
