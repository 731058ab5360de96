// Dynamo's worker query over the TCP request plane, against a worker written in the test: the
// endpoint and body it is sent, each generation of answer, refusals; and the router's recovery
// of missed events through it (IndexRecovery with a worker whose address is a TCP one), a
// registration's dump and a gap's range landing in a real shard pool.
import t from 'tap'
import type { Test } from 'tap'
import { RequestPlaneClient } from '../../src/request-plane/client.js'
import { queryWorkerOverTcp } from '../../src/request-plane/worker-query.js'
import { ShardPool } from '../../src/shards/pool.js'
import { IndexRecovery } from '../../src/shards/recovery.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import type { RouterEvent } from '../../src/codec/events.js'
import { startTestWorker } from '../helpers/dynamo-tcp-worker.js'
import type { TestWorker, WorkerRequest } from '../helpers/dynamo-tcp-worker.js'
import { canon, ev } from '../helpers/recovery.js'
import { until } from '../http/helpers.js'

const U64_MAX = 18446744073709551615n
const list = (es: RouterEvent[]): string => `[${es.map(encodeRouterEvent).join(',')}]`

/** A worker whose every query is answered with `answer(request)`: a JSON text, or a refusal's text as `{ack}`. */
async function queryWorker(t: Test, answer: (req: WorkerRequest) => string | { ack: string }): Promise<{ worker: TestWorker; client: RequestPlaneClient }> {
  const worker = await startTestWorker((req, ack, dial) => {
    const a = answer(req)
    if (typeof a !== 'string') {
      ack(a.ack)
      return
    }
    ack()
    void dial().then((h) => {
      // the answer is a raw JSON item of the wrapper, exactly as the worker's serde writes it
      h.send(Buffer.concat([twoPartData(`{"data":${a},"complete_final":false}`)]))
      h.finish()
    })
  })
  const client = new RequestPlaneClient({ listener: { host: '127.0.0.1' }, ackTimeoutMs: 2000 })
  t.teardown(async () => {
    await client.close()
    await worker.close()
  })
  return { worker, client }
}

/** A data-only two-part message with a zero checksum (a release build's). */
function twoPartData(body: string): Buffer {
  const b = Buffer.from(body)
  const prefix = Buffer.alloc(24)
  prefix.writeBigUInt64BE(BigInt(b.length), 8)
  return Buffer.concat([prefix, b])
}

t.test('the query goes to the sibling endpoint of the rank, with exact u64s, and each answer is read', async (t) => {
  const evs = list([ev(U64_MAX, 3, 3, 2)])
  const answers = [
    `{"Events":${evs}}`,
    `{"TreeDump":{"events":${evs},"last_event_id":18446744073709551614}}`,
    '{"TooNew":{"requested_start":18446744073709551615,"requested_end":null,"newest_available":41}}',
    '{"InvalidRange":{"start_id":9,"end_id":2}}',
    '{"Error":"no local indexer"}',
    '{"StateAgentRecovery":{"response":{},"receipt":1}}',
    { ack: 'Unknown endpoint: 1f/worker_kv_indexer_query_dp1' },
    { ack: 'Server overloaded: busy' },
  ]
  const { worker, client } = await queryWorker(t, () => answers.shift() ?? '{"Error":"done"}')
  const q = { workerId: U64_MAX, dpRank: 1, start: 3n, end: 4n }
  const addr = `127.0.0.1:${worker.port}/1f/generate`
  const e = await queryWorkerOverTcp(client, addr, q)
  t.match(e, { kind: 'Events', lastEventId: null })
  t.equal(e.kind === 'Events' ? Buffer.from(e.events).toString() : '', evs, 'the events as the worker wrote them')
  const req = worker.requests[0] as WorkerRequest
  t.equal(req.path, '1f/worker_kv_indexer_query_dp1')
  t.equal(req.headers['x-endpoint-path'], '1f/worker_kv_indexer_query_dp1')
  t.equal(req.body.toString(), '{"worker_id":18446744073709551615,"dp_rank":1,"start_event_id":3,"end_event_id":4}')
  const d = await queryWorkerOverTcp(client, addr, { ...q, start: null, end: null })
  t.match(d, { kind: 'TreeDump', lastEventId: 18446744073709551614n })
  t.equal(d.kind === 'TreeDump' ? Buffer.from(d.events).toString() : '', evs)
  t.equal(worker.requests[1]?.body.toString(), '{"worker_id":18446744073709551615,"dp_rank":1,"start_event_id":null,"end_event_id":null}')
  t.same(await queryWorkerOverTcp(client, addr, q), { kind: 'TooNew', newest: 41n })
  t.match(await queryWorkerOverTcp(client, addr, q), { kind: 'refused', final: true, why: /InvalidRange/ })
  t.match(await queryWorkerOverTcp(client, addr, q), { kind: 'refused', final: true, why: /no local indexer/ })
  t.match(await queryWorkerOverTcp(client, addr, q), { kind: 'refused', final: true, ignored: 'StateAgentRecovery' })
  t.match(await queryWorkerOverTcp(client, addr, q), { kind: 'refused', final: true, why: /Unknown endpoint/ }, 'a worker without the endpoint')
  t.match(await queryWorkerOverTcp(client, addr, q), { kind: 'refused', final: false, why: /overloaded/ }, 'a busy one is asked again')
  t.match(await queryWorkerOverTcp(client, 'not an address', q), { kind: 'refused', final: true })
  t.equal(client.counters.stops, 0, 'a one-answer stream ends without a stop')
})

t.test('recovery through the request plane: a registration rebuilt from a dump, a gap filled with its range', async (t) => {
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const { worker, client } = await queryWorker(t, (req) => {
    const q = JSON.parse(req.body.toString().replace(/(\d{16,})/g, '"$1"')) as { start_event_id: string | number | null }
    if (q.start_event_id === '18446744073709551615') return '{"TooNew":{"requested_start":18446744073709551615,"requested_end":null,"newest_available":2}}'
    // v2 dump: synthetic ids, the real watermark beside them
    if (q.start_event_id === null) return `{"TreeDump":{"events":${list([ev(7n, 0, 1, null), ev(7n, 1, 2, 1)])},"last_event_id":2}}`
    // v1 range
    return `{"Events":${list([ev(7n, 3, 3, 2), ev(7n, 4, 4, 3)])}}`
  })
  const recovery = new IndexRecovery(pool, { urlOf: () => `tcp://127.0.0.1:${worker.port}/7/generate`, requestPlane: client, attempts: 1 })
  t.teardown(() => recovery.close())
  t.equal(await recovery.workerAdded(7n, 1), true, 'rebuilt')
  t.same(canon(await pool.overlapScores([1n, 2n], { readYourWrites: true })), ['7:0=2/2'], 'the dump is in the index')
  t.equal(worker.requests[0]?.path, '7/worker_kv_indexer_query_dp0')
  // live events skip ids 3 and 4: the shard holds 5 until the range arrives over TCP
  pool.push(Buffer.from(encodeRouterEvent(ev(7n, 5, 5, 4))))
  await until(() => recovery.counters.ranges === 1)
  t.same(canon(await pool.overlapScores([1n, 2n, 3n, 4n, 5n], { readYourWrites: true })), ['7:0=5/5'], 'the range, then the held event')
  t.match(recovery.counters, { gaps: 1, ranges: 1, dumps: 1, failed: 0, ignored: 0 })
  t.equal(recovery.stateOf(7n, 0), 'exact')
})

t.test('a worker answering a newer variant: ignored, counted, the recovery failed', async (t) => {
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const { worker, client } = await queryWorker(t, (req) =>
    req.body.toString().includes('"start_event_id":18446744073709551615')
      ? '{"TooNew":{"requested_start":1,"requested_end":null,"newest_available":0}}'
      : '{"TreeDumpFailed":{"reason":"too big"}}',
  )
  const recovery = new IndexRecovery(pool, { urlOf: () => `tcp://127.0.0.1:${worker.port}/generate`, requestPlane: client, attempts: 1 })
  t.teardown(() => recovery.close())
  t.equal(await recovery.workerAdded(9n, 1), false)
  t.match(recovery.counters, { ignored: 1, failed: 1, dumps: 0 })
  t.equal(recovery.stateOf(9n, 0), 'degraded')
})
