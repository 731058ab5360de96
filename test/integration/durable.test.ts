// Durable KV events (src/transport/durable.ts) against a real nats-server with JetStream: the
// stream and consumer as Dynamo names and configures them, acknowledgements only after the shards
// applied, and the consumers of replicas that are gone. One shard pool for the file: starting
// pools is what costs here.
import t from 'tap'
import { connect } from 'nats'
import { startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { chain, removed } from '../helpers/events.js'
import { encodeEnvelopeMsgpack, encodeRouterEventMsgpack } from '../../support/dynamo-msgpack.js'
import { STREAM, indexOf, natsAndClient, publishAll, startDurable } from '../helpers/durable.js'
import { ShardPool } from '../../src/shards/pool.js'
import { DurableKvEvents } from '../../src/transport/durable.js'

const pool = await ShardPool.start({ shards: 2 })
t.teardown(() => pool.close())

t.test('the stream and a consumer named by the instance id; JSON and MessagePack events applied, and acknowledged only once applied', async (t) => {
  const { nc } = await natsAndClient(t)
  const d = await startDurable(t, { nc, pool, instanceId: 18446744073709551n })
  const jsm = await nc.jetstreamManager()
  const si = await jsm.streams.info(STREAM)
  t.same(si.config.subjects, [`${STREAM}.*`], "Dynamo's queue subjects")
  t.equal(si.config.max_age, 3_600_000_000_000, 'an hour of retention')
  const ci = await jsm.consumers.info(STREAM, '18446744073709551')
  t.equal(d.consumer, '18446744073709551')
  t.equal(ci.config.durable_name, '18446744073709551', 'durable, named by the instance id in decimal')
  t.equal(ci.config.ack_policy, 'all')
  t.equal(ci.config.inactive_threshold, 3_600_000_000_000, 'removed by the server after an hour without a reader')

  const w1 = 2n ** 63n + 5n
  const w2 = 11n
  const env = encodeEnvelopeMsgpack({ publisher_id: 99, sequence: 0, payload: encodeRouterEventMsgpack(chain(w2, null, [7, 8])) })
  const last = await publishAll(nc, [chain(w1, null, [1, 2, 3]), env, removed(w1, [300])])
  await waitUntil('three messages applied', async () => (await indexOf(pool)).get(w2)?.size === 2 && (await indexOf(pool)).get(w1)?.size === 2)
  await waitUntil('acknowledged', async () => (await jsm.consumers.info(STREAM, d.consumer)).ack_floor.stream_seq === last)
  t.equal(d.counters.messages, 3)
  t.equal(d.counters.acked, 3)

  // a shard that has not applied a message holds its acknowledgement back
  const shard = pool.shardOf(w2)
  pool.blockShard(shard, 3000)
  await new Promise((r) => setTimeout(r, 300))
  const seq = await publishAll(nc, [chain(w2, 8, [9])])
  await waitUntil('delivered', async () => (await jsm.consumers.info(STREAM, d.consumer)).delivered.stream_seq === seq, 2000)
  await new Promise((r) => setTimeout(r, 200))
  t.equal((await jsm.consumers.info(STREAM, d.consumer)).ack_floor.stream_seq, last, 'delivered, not acknowledged while its shard has not applied it')
  await waitUntil('acknowledged once applied', async () => (await jsm.consumers.info(STREAM, d.consumer)).ack_floor.stream_seq === seq, 5000)
  t.equal((await indexOf(pool)).get(w2)?.size, 3)
})

t.test("a replica's consumer goes with it: deleted on close, and removed by the server when the replica vanished", async (t) => {
  const { nats, nc } = await natsAndClient(t)
  const jsm = await nc.jetstreamManager()
  const names = async (): Promise<string[]> => (await jsm.consumers.list(STREAM).next()).map((c) => c.name).sort()
  const stays = await startDurable(t, { nc, pool, instanceId: 41n })
  const clean = await startDurable(t, { nc, pool, instanceId: 42n })
  // its own connection, dropped without a word: a replica that crashed
  const lost = await connect({ servers: nats.url })
  const vanishing = await DurableKvEvents.start({
    nc: lost,
    namespace: 'dynamo',
    component: 'backend',
    pool,
    instanceId: 43n,
    snapshotThreshold: 1_000_000,
    resetStates: false,
    consumerInactiveMs: 1500,
  })
  t.same(await names(), ['41', '42', '43'])
  await clean.close()
  t.same(await names(), ['41', '43'], 'a replica that stops deletes its consumer')
  await lost.close()
  await waitUntil('the vanished replica’s consumer removed', async () => (await names()).length === 1, 15_000, 200)
  t.same(await names(), ['41'], 'only the live replica’s is left')
  t.equal(stays.consumer, '41')
  await vanishing.close()
})

t.test('a consumer deleted under a replica is made again after the last message applied: nothing lost, nothing twice', async (t) => {
  const { nc } = await natsAndClient(t)
  const d = await startDurable(t, { nc, pool, instanceId: 51n })
  const jsm = await nc.jetstreamManager()
  const w = 2n ** 40n + 3n
  await publishAll(nc, [chain(w, null, [1, 2]), chain(w, 2, [3])])
  await waitUntil('applied', () => d.counters.acked === 2)
  await jsm.consumers.delete(STREAM, d.consumer)
  const last = await publishAll(nc, [chain(w, 3, [4]), removed(w, [100]), chain(w, 4, [5])])
  await waitUntil(
    'the consumer made again and the rest applied',
    async () => d.counters.acked === 5 && (await jsm.consumers.info(STREAM, d.consumer).catch(() => null))?.ack_floor.stream_seq === last,
    15_000,
    50,
  )
  t.ok(d.counters.repositioned >= 1, 'repositioned')
  t.equal(d.counters.messages, 5, 'each message applied once')
  const ci = await jsm.consumers.info(STREAM, d.consumer)
  t.equal(ci.config.opt_start_seq, last - 2, 'the new consumer starts after the last message applied')
  t.same([...((await indexOf(pool)).get(w) ?? new Map()).keys()].sort(), [200n, 300n, 400n, 500n])
})

t.test('a server without JetStream: one clear error', async (t) => {
  const plain = await startNats({ jetstream: false })
  t.teardown(() => plain.stop())
  const nc = await connect({ servers: plain.url })
  t.teardown(() => nc.close())
  await t.rejects(DurableKvEvents.start({ nc, namespace: 'dynamo', component: 'backend', pool, instanceId: 1n, snapshotThreshold: 10, resetStates: false }), {
    code: 'KVR_ERR_INVALID_OPTION',
    message: /--router-durable-kv-events needs JetStream on the NATS server \(nats-server --jetstream\)/,
  })
})
