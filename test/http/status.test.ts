// The status page's routes: the HTML and its security headers, GET /v1/status (workers as
// /v1/workers lists them, counters from the registry, decisions after `since` with their cost
// terms while someone watches), the server-sent-events stream over a real socket, the API key,
// and streams ending when the router drains.
import t from 'tap'
import { createHash } from 'node:crypto'
import { harness, listening, metricSum, tokens } from './helpers.js'

const KEY = 'status-key'
const json = { 'content-type': 'application/json' }

interface Decision {
  seq: number
  worker_id_str: string
  overlap_blocks: number
  blocks: number
  booked: boolean
  candidates: { worker_id_str: string; prefill_blocks: number; decode_blocks: number; logit: number; overlap_blocks: number }[] | null
  candidates_total: number | null
}
interface Status {
  time_ms: number
  router: { router_id: string; mode: string; block_size: number; shards: number }
  workers: { id_str: string; url: string; health?: string; index: string; ranks: unknown[] }[]
  queue: { depth: number }
  requests: { routed: number }
  hit_rate: { sum: number; count: number }
  events: { applied: number; received: number; dropped: number; http_received: number; applied_by_type: Record<string, number> }
  recovery: Record<string, number>
  decision_seq: number
  decisions: Decision[]
}

/** Reads server-sent events from a stream until `done` says enough or `ms` pass. */
async function readEvents(res: Response, done: (events: { event: string; data: string }[]) => boolean, ms = 5000): Promise<{ event: string; data: string }[]> {
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  const dec = new TextDecoder()
  const events: { event: string; data: string }[] = []
  let buf = ''
  const deadline = Date.now() + ms
  try {
    while (!done(events) && Date.now() < deadline) {
      const r = await Promise.race([reader.read(), new Promise<null>((resolve) => setTimeout(() => resolve(null), Math.max(1, deadline - Date.now())))])
      if (r === null || r.done) break
      buf += dec.decode(r.value, { stream: true })
      let at: number
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, at)
        buf = buf.slice(at + 2)
        const event = /^event: (.*)$/m.exec(block)?.[1] ?? 'message'
        const data = /^data: (.*)$/m.exec(block)?.[1] ?? ''
        events.push({ event, data })
      }
    }
  } finally {
    reader.releaseLock()
  }
  return events
}

t.test('the page: open, self-contained, its inline script and style admitted by hash only', async (t) => {
  const h = await harness(['--router-block-size', '4', '--api-key', KEY, '--worker', '5=http://127.0.0.1:9'])
  t.teardown(() => h.close())
  const root = await h.app.fastify.inject({ method: 'GET', url: '/' })
  t.equal(root.statusCode, 302, '/ without a key')
  t.equal(root.headers.location, 'status', 'relative, so a path prefix in front of the router is kept')
  const page = await h.app.fastify.inject({ method: 'GET', url: '/status' })
  t.equal(page.statusCode, 200, '/status without a key: the page asks for it')
  t.match(page.headers['content-type'], /^text\/html; charset=utf-8/)
  t.equal(page.headers['x-content-type-options'], 'nosniff')
  t.notMatch(page.body, '127.0.0.1', 'no worker URL in the page itself')
  t.notMatch(page.body, /<script[^>]+src=|<link[^>]+stylesheet|https?:\/\//, 'nothing loaded from elsewhere')
  const csp = String(page.headers['content-security-policy'])
  const hash = (re: RegExp): string =>
    `'sha256-${createHash('sha256')
      .update(re.exec(page.body)?.[1] ?? '')
      .digest('base64')}'`
  t.match(csp, `script-src ${hash(/<script>([\s\S]*?)<\/script>/)};`, 'the inline script is the one admitted')
  t.match(csp, `style-src ${hash(/<style>([\s\S]*?)<\/style>/)};`)
  t.match(csp, "connect-src 'self'")
  t.match(csp, "default-src 'none'")
  for (const url of ['/v1/status', '/v1/status/stream']) {
    const r = await h.app.fastify.inject({ method: 'GET', url })
    t.equal(r.statusCode, 401, `${url} needs the key`)
    t.notMatch(r.body, '127.0.0.1')
  }
  const ok = await h.app.fastify.inject({ method: 'GET', url: '/v1/status', headers: { authorization: `Bearer ${KEY}` } })
  t.equal(ok.statusCode, 200, 'with the key')
  t.match(ok.body, '"url":"http://127.0.0.1:9"')
})

t.test('GET /v1/status: workers, counters and the decisions after `since`, explained while watched', async (t) => {
  const h = await harness(['--router-block-size', '4', '--worker', '1=http://127.0.0.1:9', '--worker', '2=http://127.0.0.1:10'])
  t.teardown(() => h.close())
  const get = async (url: string): Promise<Status> => {
    const r = await h.app.fastify.inject({ method: 'GET', url })
    t.equal(r.statusCode, 200, url)
    t.equal(r.headers['cache-control'], 'no-store')
    return r.json() as Status
  }
  // nobody watching yet: the decision is kept, without its cost terms
  await h.router.route({ tokens: tokens(8), updateStates: false })
  t.notOk(h.router.decisions.watching)
  let s = await get('/v1/status')
  t.match(s.router, { mode: 'kv', block_size: 4, shards: 1 })
  t.same(
    s.workers.map((w) => w.id_str),
    ['1', '2'],
  )
  const listed = (await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json() as { workers: unknown[] }
  t.same(s.workers, listed.workers, 'the workers exactly as GET /v1/workers lists them (health and all)')
  t.equal(s.requests.routed, 1, 'from the registry Prometheus reads')
  t.equal(s.decision_seq, 1)
  t.equal(s.decisions.length, 1)
  t.match(s.decisions[0], { seq: 1, booked: false, blocks: 2, candidates: null, candidates_total: null })
  t.ok(h.router.decisions.watching, 'the poll turns explanations on')

  // events, then a watched decision with every candidate's terms, the same as /v1/route's
  const ev = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/kv-events',
    headers: json,
    payload: JSON.stringify({
      worker_id: 2,
      event: { event_id: 1, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 11, tokens_hash: 1 }] } } },
    }),
  })
  t.equal(ev.statusCode, 202)
  await h.router.pool.flush()
  await h.router.route({ tokens: tokens(8), updateStates: true })
  const explained = (
    await h.app.fastify.inject({ method: 'POST', url: '/v1/route', headers: json, payload: JSON.stringify({ token_ids: tokens(8) }) })
  ).json() as {
    candidates: unknown[]
  }
  s = await get('/v1/status?since=1')
  t.same(
    s.decisions.map((d) => d.seq),
    [2, 3],
    'only the decisions after `since`',
  )
  const d = s.decisions[0] as Decision
  t.equal(d.booked, true)
  t.equal(d.candidates_total, 2)
  t.equal(d.candidates?.length, 2)
  t.ok(
    d.candidates?.every((c) => typeof c.prefill_blocks === 'number' && typeof c.decode_blocks === 'number' && typeof c.logit === 'number'),
    'each candidate with its cost terms',
  )
  t.ok((d.candidates?.[0]?.logit ?? 0) <= (d.candidates?.[1]?.logit ?? 0), 'cheapest first')
  // the explanation also splits each overlap by storage tier, which the status page does not keep
  const byCost = (explained.candidates as { logit: number; device_blocks?: number; host_blocks?: number; disk_blocks?: number }[])
    .map(({ device_blocks, host_blocks, disk_blocks, ...row }) => {
      t.equal(typeof device_blocks, 'number', 'the explanation gives device_blocks')
      t.ok(host_blocks !== undefined && disk_blocks !== undefined, 'and host_blocks, disk_blocks')
      return row
    })
    .sort((x, y) => x.logit - y.logit)
  t.same(s.decisions[1]?.candidates, byCost, "the same rows as /v1/route's explanation, cheapest first")
  t.equal(s.events.http_received, 1)
  // the predictions of the workers without events are events too (synthetic stores)
  t.ok(s.events.applied >= 1, 'applied events counted')
  t.equal(s.events.applied_by_type.stored, s.events.applied)
  t.equal(s.requests.routed, 3)
  t.ok((await metricSum(h, 'kvrouter_worker_cached_blocks', { worker_id: '2', dp_rank: '0' })) >= 1, "the index's blocks per worker-rank in /metrics too")
  t.equal(s.queue.depth, 0)
  t.ok(s.hit_rate.count >= 3)

  for (const bad of ['since=-1', 'since=x', 'since=1.5']) {
    const r = await h.app.fastify.inject({ method: 'GET', url: `/v1/status?${bad}` })
    t.equal(r.statusCode, 400, bad)
    t.equal(r.json().error.code, 'KVR_ERR_INVALID_REQUEST')
  }
  t.equal((await h.app.fastify.inject({ method: 'GET', url: '/v1/status/stream?interval_ms=10' })).statusCode, 400, 'an interval below 250 ms')
  t.equal((await h.app.fastify.inject({ method: 'HEAD', url: '/v1/status/stream' })).statusCode, 404, 'no HEAD that would open a stream')
  t.equal((await h.app.fastify.inject({ method: 'HEAD', url: '/v1/status' })).statusCode, 200)
})

t.test('GET /v1/status does not wait out an event backlog; GET /v1/workers counts every event taken before it', async (t) => {
  const h = await harness(['--router-block-size', '4', '--worker', '1=http://127.0.0.1:9'])
  t.teardown(() => h.close())
  // a flood: 12,000 events of 64 fresh blocks each, seconds of work for the one shard
  const total = 12_000
  for (let i = 0; i < total; i++) {
    const blocks = Array.from({ length: 64 }, (_, k) => ({ block_hash: BigInt(i * 64 + k + 1), tokens_hash: BigInt(i * 64 + k + 1) }))
    h.router.ingestEvent({ worker_id: 1n, event: { event_id: BigInt(i), dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } })
  }
  const processed = (): number => h.router.pool.counters().reduce((a, c) => a + c.processed, 0)
  const status = await h.app.fastify.inject({ method: 'GET', url: '/v1/status' })
  const at = processed()
  t.equal(status.statusCode, 200)
  t.ok(at < total, `answered with ${at} of ${total} events applied`)
  const shown = (status.json() as { workers: { ranks: { cached_blocks: number }[] }[] }).workers[0]?.ranks[0]?.cached_blocks ?? -1
  t.ok(shown < total * 64, `the blocks held then (${shown})`)
  const workers = await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })
  t.equal((workers.json() as { workers: { ranks: { cached_blocks: number }[] }[] }).workers[0]?.ranks[0]?.cached_blocks, total * 64, 'every block of the flood')
})

t.test('the stream: a snapshot at once, then each interval with the new decisions; it ends when the router drains', async (t) => {
  const h = await harness(['--router-block-size', '4', '--api-key', KEY, '--worker', '1=http://127.0.0.1:9'])
  let closed = false
  t.teardown(async () => {
    if (!closed) await h.close()
  })
  const port = await listening(h)
  const base = `http://127.0.0.1:${port}`
  t.equal((await fetch(`${base}/v1/status/stream`)).status, 401, 'the key is needed')
  const res = await fetch(`${base}/v1/status/stream?interval_ms=250`, { headers: { authorization: `Bearer ${KEY}` } })
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  t.equal(res.headers.get('cache-control'), 'no-store')
  const first = await readEvents(res, (e) => e.length >= 1)
  t.equal(first[0]?.event, 'status')
  const s0 = JSON.parse(first[0]?.data ?? '{}') as Status
  t.equal(s0.workers[0]?.url, 'http://127.0.0.1:9')
  t.equal(s0.decisions.length, 0)
  t.ok(h.router.decisions.watching, 'an open stream turns explanations on')
  await h.router.route({ tokens: tokens(8), updateStates: false })
  const next = await readEvents(res, (e) => e.some((x) => (JSON.parse(x.data) as Status).decisions.length > 0))
  const withDecision = next.map((x) => JSON.parse(x.data) as Status).find((x) => x.decisions.length > 0)
  t.equal(withDecision?.decisions[0]?.seq, 1, 'the decision arrives without asking')
  t.equal(withDecision?.decisions[0]?.candidates?.length, 1, 'explained')
  const later = await readEvents(res, (e) => e.length >= 1)
  t.same((JSON.parse(later[0]?.data ?? '{}') as Status).decisions, [], 'and is not sent again')

  // the drain ends the stream within a tick, not at the drain's deadline
  const t0 = Date.now()
  const shutdown = h.app.shutdown(10_000)
  const rest = await readEvents(res, () => false, 8000)
  t.ok(Date.now() - t0 < 5000, `the stream ended ${Date.now() - t0} ms after the shutdown began`)
  t.ok(
    rest.every((e) => e.event === 'status'),
    'with no error event',
  )
  t.equal((await shutdown).drained, true, 'and the drain did not have to cut it')
  await h.router.close()
  closed = true
  t.notOk(h.router.decisions.watching, 'nobody watches once the stream is gone')
})
