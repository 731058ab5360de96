// Log lines of the router in one process: the line of each request (a streamed completion proxied
// to simulated engines, a unary one, /v1/route, a refusal, the probes), and the rate-limited line
// of each kind of failure the router also counts: a worker that fails, requests refused, a KV
// event batch refused, event messages the shards drop or refuse, recoveries, a shard restart.
import t from 'tap'
import type { AddressInfo } from 'node:net'
import { Router } from '../../src/core/router.js'
import { buildApp } from '../../src/http/server.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { captureProcessLog, captured } from '../helpers/log.js'
import type { LogRecord } from '../helpers/log.js'
import { config, harness, listening, until, upstream } from './helpers.js'

const post = async (base: string, path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; text: string }> => {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) })
  return { status: r.status, text: await r.text() }
}

const requests = (records: LogRecord[], route: string): LogRecord[] => records.filter((x) => x.msg === 'request' && x.route === route)

t.test('a request line per request: worker, rank, overlap, TTFT and duration of a proxied completion', async (t) => {
  const router = await Router.start(config(['--router-block-size', '4']))
  t.teardown(() => router.close())
  const fleet = await MockerFleet.start({ numWorkers: 2, firstWorkerId: 41n, blockSize: 4, speedupRatio: 0, onEvent: (e) => void router.ingestEvent(e) })
  t.teardown(() => fleet.close())
  for (const e of fleet.workers) await router.addWorker({ id: e.workerId, url: e.url })
  const { logger, capture } = captured('info')
  const app = await buildApp({ router, tokenizer: null, logger })
  t.teardown(() => app.shutdown(1000))
  await app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const base = `http://127.0.0.1:${(app.fastify.server.address() as AddressInfo).port}`
  const prompt = Array.from({ length: 16 }, (_, i) => 500 + i)

  const first = await post(base, '/v1/completions', { prompt, max_tokens: 3, stream: true })
  t.equal(first.status, 200)
  await router.pool.flush()
  const second = await post(base, '/v1/completions', { prompt, max_tokens: 3, stream: true })
  t.equal(second.status, 200)
  t.equal((await post(base, '/v1/completions', { prompt, max_tokens: 2 })).status, 200)
  t.equal((await post(base, '/v1/route', { token_ids: prompt })).status, 200)
  t.equal((await post(base, '/v1/completions', { prompt: [] })).status, 400)
  await fetch(`${base}/health`)
  await until(() => requests(capture.records, '/v1/completions').length === 4)

  const [a, b, unary, refused] = requests(capture.records, '/v1/completions') as [LogRecord, LogRecord, LogRecord, LogRecord]
  for (const x of [a, b]) {
    t.match(x, { level: 'info', method: 'POST', status: 200, stream: true, model: 'kv-router-model', dp_rank: 0, request_id: String })
    t.ok(x.worker_id === '41' || x.worker_id === '42', `the worker chosen (${x.worker_id})`)
    t.ok(
      typeof x.ttft_ms === 'number' && typeof x.duration_ms === 'number' && x.ttft_ms <= x.duration_ms,
      `TTFT ${x.ttft_ms} ms within the duration ${x.duration_ms} ms`,
    )
    t.notOk('code' in x || 'attempts' in x, 'no error, one attempt')
  }
  t.equal(a.overlap_blocks, 0, 'the first prompt was new')
  t.equal(b.overlap_blocks, 4, 'the second found its 4 blocks cached')
  t.equal(b.worker_id, a.worker_id, 'where they are')
  t.match(unary, { status: 200, stream: false, overlap_blocks: 4 })
  t.notOk('ttft_ms' in unary, 'no TTFT for an answer that is not streamed')
  t.match(refused, { status: 400, method: 'POST', duration_ms: Number })
  t.notOk('worker_id' in refused, 'refused before routing: no worker')
  t.match(requests(capture.records, '/v1/route'), [{ status: 200, worker_id: a.worker_id, overlap_blocks: 4, dp_rank: 0 }])
  t.same(requests(capture.records, '/health'), [], 'probes are not logged at info')
})

t.test('probes at debug; no request lines when info is off', async (t) => {
  const h = await harness()
  t.teardown(() => h.close())
  const debug = captured('debug')
  const warn = captured('warn')
  for (const logger of [debug.logger, warn.logger]) {
    const app = await buildApp({ router: h.router, tokenizer: null, logger })
    t.teardown(() => app.shutdown(1000))
    await app.fastify.inject({ method: 'GET', url: '/health' })
    await app.fastify.inject({ method: 'GET', url: '/v1/workers?token=x' })
  }
  t.match(
    debug.capture.records.map((x) => [x.level, x.route]),
    [
      ['debug', '/health'],
      ['info', '/v1/workers'],
    ],
  )
  t.equal(warn.capture.text, '', 'nothing at warn')
})

t.test('failures: one line per class, with the worker, the code and what went wrong', async (t) => {
  const capture = captureProcessLog('info', 60_000)
  const h = await harness(['--router-block-size', '4', '--proxy-retries', '1'])
  t.teardown(() => h.close())
  const base = `http://127.0.0.1:${await listening(h)}`
  // two workers that refuse connections, one of them with credentials in its URL
  await h.router.addWorker({ id: 7n, url: 'http://alice:s3cret@127.0.0.1:1' })
  await h.router.addWorker({ id: 8n, url: 'http://127.0.0.1:1' })
  t.equal((await post(base, '/v1/completions', { prompt: [1, 2, 3, 4], max_tokens: 1 })).status, 502)
  const failed = capture.records.filter((x) => x.class === 'upstream_failed')
  t.equal(failed.length, 1, 'the second failure, a moment later, is held back')
  t.match(failed[0], { level: 'warn', code: 'KVR_ERR_UPSTREAM', phase: 'before_first_token', dp_rank: 0, retried: true, suppressed: 0, request_id: String })
  t.notMatch(capture.text, 's3cret', "a worker URL's credentials are not written")
  t.match(requests(capture.records, '/v1/completions'), [{ status: 502, attempts: 2, code: 'KVR_ERR_UPSTREAM' }])

  // every worker busy: refused with 503
  await h.router.removeWorker(7n)
  await h.router.removeWorker(8n)
  const s = await upstream((_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{}')
  })
  t.teardown(() => s.close())
  await h.router.addWorker({ id: 9n, url: s.url })
  h.router.scheduler.setBusyThresholds({ activePrefillTokensThreshold: 0 })
  t.equal((await post(base, '/v1/route', { token_ids: [1, 2, 3, 4, 5], update_states: true })).status, 200)
  t.equal((await post(base, '/v1/completions', { prompt: [1, 2, 3, 4], max_tokens: 1 })).status, 503)
  t.match(
    capture.records.filter((x) => x.class === 'requests_rejected'),
    [{ level: 'warn', code: 'KVR_ERR_ALL_WORKERS_BUSY', route: '/v1/completions' }],
  )

  // a KV event batch that does not decode
  t.equal((await post(base, '/v1/kv-events', [{ worker_id: 9, event: { event_id: 1 } }])).status, 400)
  t.match(
    capture.records.filter((x) => x.class === 'http_events_refused'),
    [{ level: 'warn', code: /^KVR_ERR_EVENT_/, error: String, client: '127.0.0.1' }],
  )

  // what the shards drop or refuse: a message that does not decode (as from NATS), a store under
  // a parent the worker does not hold, a gap in a worker's event ids
  h.router.ingest(Buffer.from('{"worker_id":9,"event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":"nope"}}}}'))
  h.router.ingestEvent({
    worker_id: 9n,
    event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: 99n, blocks: [{ block_hash: 1n, tokens_hash: 2n }] } } },
  })
  h.router.ingestEvent({ worker_id: 9n, event: { event_id: 5n, dp_rank: 0, data: 'cleared' } })
  await h.router.pool.flush()
  // the shard's sample travels by message: let it arrive
  await new Promise((r) => setTimeout(r, 100))
  h.router.pool.logWatch.poll()
  t.match(
    capture.records.find((x) => x.class === 'events_malformed'),
    { level: 'warn', count: 1, last: { code: /^KVR_ERR_EVENT_/, error: String } },
  )
  t.match(
    capture.records.find((x) => x.class === 'events_rejected'),
    {
      level: 'warn',
      count: 1,
      reasons: { parent_block_not_found: 1 },
      last: { reason: 'parent_block_not_found', worker_id: '9', event_id: '1', dp_rank: 0 },
    },
  )
  t.match(
    capture.records.find((x) => x.class === 'event_gaps'),
    { level: 'warn', count: 1 },
  )

  // a shard thread that dies
  const restarted = new Promise((r) => h.router.pool.once('shardRestarted', r))
  await h.router.pool.terminateShard(0)
  await restarted
  t.match(
    capture.records.find((x) => x.class === 'shard_restarted'),
    { level: 'error', shard: 0, restarts: 1, events_lost: Number },
  )
})

t.test('recoveries: started and finished, or failed with the code the warning had', async (t) => {
  const capture = captureProcessLog('info', 60_000)
  const router = await Router.start(config(['--router-block-size', '4', '--router-event-recovery']))
  t.teardown(() => router.close())
  const fleet = await MockerFleet.start({ numWorkers: 1, firstWorkerId: 61n, blockSize: 4, speedupRatio: 0, onEvent: (e) => void router.ingestEvent(e) })
  t.teardown(() => fleet.close())
  await router.addWorker({ id: 61n, url: fleet.workers[0]?.url as string })
  await until(() => router.recovery?.counters.dumps === 1)
  t.match(
    capture.records.find((x) => x.class === 'recovery_started'),
    { level: 'info', worker_id: '61', dp_rank: 0, what: 'dump' },
  )
  t.match(
    capture.records.find((x) => x.class === 'recovery_finished'),
    { level: 'info', worker_id: '61', dp_rank: 0, what: 'dump', bytes: Number },
  )
  // a worker that answers the probe, then an error
  const up = await upstream((_req, body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(body.includes('"start_event_id":18446744073709551615') ? '{"TooNew":{"newest_available":0}}' : '{"Error":"ring lost"}')
  })
  t.teardown(() => up.close())
  await router.addWorker({ id: 62n, url: up.url })
  await until(() => router.recovery?.counters.failed === 1)
  t.match(
    capture.records.find((x) => x.class === 'recovery_failed'),
    { level: 'warn', code: 'KVR_INDEX_DEGRADED', worker_id: '62', dp_rank: 0, why: /ring lost/ },
  )
})
