// KV events through a real nats-server into the shard pool.
import t from 'tap'
import { once } from 'node:events'
import { connect } from 'nats'
import { startNats, getFreePort } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { kvEventSubjects, kvMetricsSubject } from '../../src/transport/dynamo-names.js'
import { NatsIntake, parseLoadEvent } from '../../src/transport/nats.js'
import { ShardPool } from '../../src/shards/pool.js'
import { encodeEnvelope, encodeRouterEvent } from '../../src/codec/events.js'
import { stored } from '../helpers/events.js'
import { encodeEnvelopeMsgpack, encodeRouterEventMsgpack } from '../../support/dynamo-msgpack.js'
import { shardOf } from '../../src/thread/protocol.js'
import { u64Hi, u64Lo } from '../../src/codec/u64.js'

const enc = new TextEncoder()

t.test('raw and enveloped events with u64 values above 2^53 reach the index; NATS restart is survived', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const pool = await ShardPool.start({ shards: 2 })
  t.teardown(() => pool.close())
  const intake = await NatsIntake.start({ url: nats.url, namespace: 'dynamo', component: 'backend', pool })
  t.teardown(() => intake.close())
  t.equal(intake.connected, true)

  const pub = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 })
  t.teardown(() => pub.close())
  const [subject, oldSubject] = kvEventSubjects('dynamo', 'backend') as [string, string]
  t.equal(subject, 'namespace.dynamo.component.backend.kv-events')
  const w1 = 2n ** 63n + 11n
  const w2 = 2n ** 60n + 7n
  const big = 2n ** 64n - 5n
  pub.publish(
    subject,
    enc.encode(
      encodeRouterEvent(
        stored(w1, null, [
          [big, 2n ** 53n + 1n],
          [big - 1n, 2n ** 62n],
        ]),
      ),
    ),
  )
  pub.publish(
    oldSubject,
    enc.encode(encodeEnvelope({ publisher_id: w2, sequence: 0n, published_at: 1n, payload: stored(w2, null, [[big - 2n, 2n ** 53n + 1n]]) })),
  )
  await pub.flush()
  await waitUntil('two messages at the intake', () => intake.counters.messages === 2)
  const scores = await pool.overlapScores([2n ** 53n + 1n, 2n ** 62n], { readYourWrites: true })
  const byId = new Map(scores.map((s) => [s.worker_id, s.overlap_blocks]))
  t.equal(byId.get(w1), 2, 'raw event, exact u64 worker id and hashes')
  t.equal(byId.get(w2), 1, 'enveloped event on the older subject')

  // the server goes away and comes back: readiness follows, ingestion resumes
  const down = once(intake, 'disconnected')
  const up = once(intake, 'reconnected')
  await nats.restart()
  await down
  await up
  t.equal(intake.connected, true)
  t.ok(intake.counters.disconnects >= 1 && intake.counters.reconnects >= 1)
  await waitUntil('publisher reconnected', () => !pub.isClosed() && pub.info !== undefined)
  await new Promise((r) => setTimeout(r, 200))
  pub.publish(
    subject,
    enc.encode(
      encodeRouterEvent(
        stored(
          w2,
          null,
          [
            [5n, 2n ** 53n + 1n],
            [6n, 2n ** 62n],
          ],
          1,
        ),
      ),
    ),
  )
  await pub.flush()
  await waitUntil('the event after the restart', () => intake.counters.messages === 3)
  const after = await pool.overlapScores([2n ** 53n + 1n, 2n ** 62n], { readYourWrites: true })
  t.ok(
    after.some((s) => s.worker_id === w2 && s.dp_rank === 1 && s.overlap_blocks === 2),
    'ingested after the restart',
  )
})

t.test("Dynamo's MessagePack events, named and positional, bare and enveloped, reach the index beside JSON ones; malformed ones are counted", async (t) => {
  const nats = await startNats({ jetstream: false })
  t.teardown(() => nats.stop())
  const pool = await ShardPool.start({ shards: 2 })
  t.teardown(() => pool.close())
  const intake = await NatsIntake.start({ url: nats.url, namespace: 'dynamo', component: 'backend', pool })
  t.teardown(() => intake.close())
  const pub = await connect({ servers: nats.url })
  t.teardown(() => pub.close())
  const [subject, oldSubject] = kvEventSubjects('dynamo', 'backend') as [string, string]

  const shard = (id: bigint): number => shardOf(u64Lo(id), u64Hi(id), 2)
  /** A publisher id whose shard is not the worker's: the scan must read the RouterEvent inside. */
  const otherPublisher = (w: bigint): bigint => {
    let p = 2n ** 62n + 1n
    while (shard(p) === shard(w)) p++
    return p
  }
  const toks: [bigint, bigint] = [2n ** 53n + 3n, 2n ** 63n + 4n]
  const ev = (w: bigint) =>
    stored(w, null, [
      [2n ** 64n - 9n, toks[0]],
      [2n ** 64n - 8n, toks[1]],
    ])
  const ids = Array.from({ length: 8 }, (_, i) => 2n ** 60n + BigInt(i) * 977n)
  const [jsonBare, jsonEnv, named, namedEnv, positional, positionalEnv, mixedEnv, oldSubj] = ids as bigint[] as [
    bigint,
    bigint,
    bigint,
    bigint,
    bigint,
    bigint,
    bigint,
    bigint,
  ]
  t.ok(ids.some((w) => shard(w) === 0) && ids.some((w) => shard(w) === 1), 'workers on both shards')
  const messages: [string, Uint8Array][] = [
    [subject, enc.encode(encodeRouterEvent(ev(jsonBare)))],
    [subject, enc.encode(encodeEnvelope({ publisher_id: jsonEnv, sequence: 0n, published_at: 1n, payload: ev(jsonEnv) }))],
    [subject, encodeRouterEventMsgpack(ev(named))],
    [subject, encodeEnvelopeMsgpack({ publisher_id: otherPublisher(namedEnv), sequence: 0, payload: encodeRouterEventMsgpack(ev(namedEnv)) })],
    [subject, encodeRouterEventMsgpack(ev(positional), 'positional')],
    [
      subject,
      encodeEnvelopeMsgpack(
        { publisher_id: otherPublisher(positionalEnv), sequence: 0, payload: encodeRouterEventMsgpack(ev(positionalEnv), 'positional') },
        'positional',
      ),
    ],
    [subject, encodeEnvelopeMsgpack({ publisher_id: otherPublisher(mixedEnv), sequence: 0, payload: encodeRouterEventMsgpack(ev(mixedEnv), 'positional') })],
    [oldSubject, encodeEnvelopeMsgpack({ publisher_id: otherPublisher(oldSubj), sequence: 0, payload: encodeRouterEventMsgpack(ev(oldSubj)) })],
  ]
  const good = encodeEnvelopeMsgpack({ publisher_id: 1, sequence: 1, payload: encodeRouterEventMsgpack(ev(5n)) })
  const malformed = [
    good.subarray(0, good.length - 3),
    new Uint8Array([0xc1]),
    new Uint8Array([0x81, 0xa9, ...enc.encode('worker_id'), 0xcf, 1]),
    encodeEnvelopeMsgpack({ publisher_id: 1, sequence: 2, payload: new Uint8Array([0x91, 0x05]) }),
  ]
  for (const [subj, m] of messages) pub.publish(subj, m)
  for (const m of malformed) pub.publish(subject, m)
  await pub.flush()
  const total = messages.length + malformed.length
  await waitUntil('every message processed', () => pool.counters().reduce((n, c) => n + c.processed, 0) === total)
  const scores = await pool.overlapScores(toks, { readYourWrites: true })
  const byId = new Map(scores.map((s) => [s.worker_id, s.overlap_blocks]))
  for (const [name, w] of Object.entries({ jsonBare, jsonEnv, named, namedEnv, positional, positionalEnv, mixedEnv, oldSubj })) t.equal(byId.get(w), 2, name)
  t.equal(byId.size, ids.length, 'no other worker')
  const c = pool.counters()
  t.equal(
    c.reduce((n, x) => n + x.malformed, 0),
    malformed.length,
    'malformed MessagePack counted as malformed',
  )
  t.equal(
    c.reduce((n, x) => n + x.misplaced, 0),
    0,
    'each went straight to the shard of its worker',
  )
  t.equal(pool.rerouted, 0)
  t.equal(intake.counters.messages, total)
})

t.test('worker load metrics on kv_metrics', async (t) => {
  const nats = await startNats({ jetstream: false })
  t.teardown(() => nats.stop())
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const intake = await NatsIntake.start({ url: nats.url, namespace: 'ns1', component: 'backend', pool })
  t.teardown(() => intake.close())
  const pub = await connect({ servers: nats.url })
  t.teardown(() => pub.close())
  const got = once(intake, 'load')
  const id = 18446744073709551557n
  pub.publish(
    kvMetricsSubject('ns1'),
    enc.encode(
      `{"worker_id":${id},"data":{"worker_stats":{"data_parallel_rank":2,"request_active_slots":3,"request_total_slots":8,` +
        `"num_requests_waiting":4},"kv_stats":{"kv_active_blocks":120,"kv_total_blocks":1000,"gpu_cache_usage_perc":0.12,` +
        `"gpu_prefix_cache_hit_rate":0.5},"spec_decode_stats":null}}`,
    ),
  )
  pub.publish(kvMetricsSubject('ns1'), enc.encode('{"nope":1}'))
  const [load] = (await got) as [ReturnType<typeof parseLoadEvent>]
  t.same(load, { workerId: id, dpRank: 2, activeBlocks: 120, totalBlocks: 1000, requestsWaiting: 4 })
  await waitUntil('the malformed one counted', () => intake.counters.metricsMalformed === 1)
  t.same(parseLoadEvent(enc.encode('{"worker_id":5,"dp_rank":1,"active_decode_blocks":9}')), {
    workerId: 5n,
    dpRank: 1,
    activeBlocks: 9,
    totalBlocks: null,
    requestsWaiting: null,
  })
  t.equal(parseLoadEvent(enc.encode('{"worker_id":5,')), null)
  // the top-level worker_id, exactly
  const busy = '"data":{"kv_stats":{"kv_active_blocks":999,"kv_total_blocks":1000}}'
  t.equal(parseLoadEvent(enc.encode(`{"worker_id":1.9,${busy}}`)), null, 'a fraction is no worker id')
  t.equal(parseLoadEvent(enc.encode(`{"worker_id":-1,${busy}}`)), null)
  t.equal(parseLoadEvent(enc.encode(`{"worker_id":18446744073709551616,${busy}}`)), null, '2^64 is out of range')
  t.equal(parseLoadEvent(enc.encode(`{"meta":{"worker_id":1},${busy}}`)), null, 'a nested id is not the worker id')
  t.equal(parseLoadEvent(enc.encode(`{"meta":{"worker_id":1},"worker_id":"7",${busy}}`))?.workerId, 7n, 'the top-level one, as a decimal string too')
  t.equal(parseLoadEvent(enc.encode(`[{"worker_id":1}]`)), null)
})

t.test('an unreachable server at start is a clear error naming the URL', async (t) => {
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const port = await getFreePort()
  await t.rejects(NatsIntake.start({ url: `nats://127.0.0.1:${port}`, namespace: 'dynamo', component: 'backend', pool, connectTimeoutMs: 1000 }), {
    code: 'KVR_ERR_INVALID_OPTION',
    message: new RegExp(`cannot connect to NATS at nats://127\\.0\\.0\\.1:${port}`),
  })
  await t.rejects(NatsIntake.start({ url: 'nats://127.0.0.1:1', namespace: 'bad ns', component: 'backend', pool }), { message: /namespace/ })
})

t.test('a comma-separated --nats-url is several servers: the intake connects when one of them is up', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const dead = `nats://127.0.0.1:${await getFreePort()}`
  for (const url of [`${dead},${nats.url}`, `${nats.url}, ${dead}`]) {
    const intake = await NatsIntake.start({ url, namespace: 'dynamo', component: 'backend', pool, connectTimeoutMs: 3000 })
    t.equal(intake.connected, true, url)
    await intake.close()
  }
})

t.test("endpoint-scoped workers' subjects are read; other subjects of the component are not", async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const intake = await NatsIntake.start({ url: nats.url, namespace: 'dynamo', component: 'backend', pool })
  t.teardown(() => intake.close())
  const pub = await connect({ servers: nats.url })
  t.teardown(() => pub.close())
  // Gen-B subject: EventScope::Endpoint subject(topic) = `namespace.{ns}.component.{c}.endpoint.{e}.{topic}`,
  // segments percent-encoded (lib/runtime/src/discovery/mod.rs@020f5c17, as kv_store.rs@020f5c17 uses it)
  const msg = (worker: bigint, tok: number): Uint8Array =>
    encodeEnvelopeMsgpack({ publisher_id: 5n, sequence: 0n, payload: encodeRouterEventMsgpack(stored(worker, null, [[tok * 100, tok]])) })
  pub.publish('namespace.dynamo.component.backend.endpoint.generate.kv-events', msg(31n, 1))
  pub.publish('namespace.dynamo.component.backend.endpoint.gen%2Eerate.kv-events', msg(32n, 1))
  // not KV-event subjects of this component: a two-token endpoint, another topic, another component
  pub.publish('namespace.dynamo.component.backend.endpoint.a.b.kv-events', msg(33n, 1))
  pub.publish('namespace.dynamo.component.backend.endpoint.generate.kv_metrics', msg(34n, 1))
  pub.publish('namespace.dynamo.component.prefill.endpoint.generate.kv-events', msg(35n, 1))
  pub.publish('namespace.dynamo.component.backend.kv-events', msg(36n, 1))
  await pub.flush()
  await waitUntil('the component subject read', () => intake.counters.messages >= 3)
  const ids = (await pool.overlapScores([1n], { readYourWrites: true })).map((s) => s.worker_id).sort()
  t.same(ids, [31n, 32n, 36n], 'both endpoints and the component subject, nothing else')
  t.equal(intake.counters.messages, 3)
})
