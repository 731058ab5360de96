// Event and load transports on their own: HTTP ingest keeps order and batches, reports a run
// of failures once; the kv_metrics payload is what the router's intake parses; load reports
// are throttled on change and repeated periodically.
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { NatsConnection } from 'nats'
import { CallbackPublisher, HttpEventPublisher, LoadPublisher, loadEventJson } from '../../../src/sim/mocker/publisher.js'
import type { EngineLoad } from '../../../src/sim/mocker/engine.js'
import { parseLoadEvent } from '../../../src/transport/nats.js'
import { parseRouterEvent, type RouterEvent } from '../../../src/codec/events.js'
import { waitUntil } from '../../helpers/wait.js'
import { parseJsonExact } from '../../../src/codec/json.js'

const ev = (id: number): RouterEvent => ({
  worker_id: 2n ** 64n - 1n,
  event: { event_id: BigInt(id), dp_rank: 0, data: { removed: { block_hashes: [BigInt(id)] } } },
})

t.test('HTTP ingest: in order, batched, failures told once per run', async (t) => {
  const got: number[] = []
  let posts = 0
  let status = 202
  const auth: string[] = []
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (c: Buffer) => (body += c.toString()))
    req.on('end', () => {
      posts++
      auth.push(req.headers.authorization ?? '')
      if (status === 202) for (const e of parseJsonExact(body) as unknown[]) got.push(Number(parseRouterEvent(JSON.stringify(e)).event.event_id))
      res.writeHead(status)
      res.end(status === 202 ? '' : '{"error":"no"}')
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => server.close())
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`
  const errors: string[] = []
  const p = new HttpEventPublisher({ routerUrl: url, apiKey: 'k', batch: 50, onError: (m) => errors.push(m) })
  for (let i = 1; i <= 300; i++) p.publish(ev(i))
  await p.flush()
  t.same(
    got,
    Array.from({ length: 300 }, (_, i) => i + 1),
    'every event, in order',
  )
  t.ok(posts >= 2 && posts <= 7, `batched (${posts} posts)`)
  t.equal(auth[0], 'Bearer k')
  t.equal(p.delivered, 300)
  status = 401
  p.publish(ev(301))
  await p.flush()
  p.publish(ev(302))
  await p.flush()
  t.equal(errors.length, 1, 'a run of failures is told once')
  t.match(errors[0], /the router answered 401 to 1 KV event\(s\): \{"error":"no"\}/)
  status = 202
  p.publish(ev(303))
  await p.flush()
  t.equal(got.at(-1), 303)
  const dead = new HttpEventPublisher({ routerUrl: 'http://127.0.0.1:1', onError: (m) => errors.push(m) })
  dead.publish(ev(1))
  await dead.close()
  t.equal(dead.lost, 1)
  t.match(errors[1], /cannot post KV events to http:\/\/127\.0\.0\.1:1\/v1\/kv-events/)
  const seen: RouterEvent[] = []
  const cb = new CallbackPublisher((e) => seen.push(e))
  cb.publish(ev(9))
  await cb.flush()
  await cb.close()
  t.equal(seen[0]?.event.event_id, 9n)
})

const load = (active: number, waiting: number): EngineLoad => ({
  workerId: 2n ** 63n + 1n,
  activeBlocks: active,
  totalBlocks: 1000,
  waiting,
  running: 3,
  maxNumSeqs: 256,
  prefixHitRate: 0.25,
})

t.test('kv_metrics: a LoadEvent the router decodes, exact worker id', async (t) => {
  const text = loadEventJson(load(250, 4))
  t.same(JSON.parse(text).data, {
    worker_stats: { data_parallel_rank: 0, request_active_slots: 3, request_total_slots: 256, num_requests_waiting: 4 },
    kv_stats: { kv_active_blocks: 250, kv_total_blocks: 1000, gpu_cache_usage_perc: 0.25, gpu_prefix_cache_hit_rate: 0.25 },
    spec_decode_stats: null,
  })
  t.same(parseLoadEvent(new TextEncoder().encode(text)), { workerId: 2n ** 63n + 1n, dpRank: 0, activeBlocks: 250, totalBlocks: 1000, requestsWaiting: 4 })
})

t.test('load reports: on change, throttled, and periodic', async (t) => {
  const sent: string[] = []
  let closed = false
  const nc = {
    publish: (subject: string, data: Uint8Array) => sent.push(`${subject} ${new TextDecoder().decode(data)}`),
    isClosed: () => closed,
  } as unknown as NatsConnection
  let cur = load(0, 0)
  const lp = new LoadPublisher(nc, 'namespace.dynamo.kv_metrics', () => cur, { intervalMs: 150, minGapMs: 60 })
  t.equal(sent.length, 1, 'one report at start')
  t.match(sent[0], /^namespace\.dynamo\.kv_metrics \{"worker_id":9223372036854775809,/)
  lp.update()
  t.equal(sent.length, 1, 'nothing changed: nothing sent')
  cur = load(10, 1)
  lp.update()
  cur = load(20, 1)
  lp.update()
  t.equal(sent.length, 1, 'changes within the gap wait')
  await waitUntil('the throttled report', () => sent.length === 2, 10_000)
  t.match(sent[1], /"kv_active_blocks":20,/, 'the latest state is sent')
  await waitUntil('a periodic report', () => sent.length >= 3, 10_000)
  lp.close()
  closed = true
  const n = sent.length
  await new Promise((r) => setTimeout(r, 200))
  t.equal(sent.length, n, 'nothing after close')
  t.equal(lp.reports, n)
})
