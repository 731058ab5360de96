// Dynamo's ZMQ event plane against a real etcd and real ZMQ sockets: publishers registered in
// both record generations are subscribed to and their events reach the index; a record that goes
// closes its SUB; malformed messages are counted and change nothing; a sequence gap and a
// restart reach the router's hooks with the publisher's worker-rank; messages through two
// brokers are applied once.
import t from 'tap'
import type { Test } from 'tap'
import { Etcd3 } from 'etcd3'
import { startEtcd } from '../../src/deploy/services.js'
import { ShardPool } from '../../src/shards/pool.js'
import { ChannelDiscovery } from '../../src/event-plane/discovery.js'
import { EventPlaneIntake } from '../../src/event-plane/intake.js'
import type { EventPlaneHooks } from '../../src/event-plane/intake.js'
import { chain } from '../helpers/events.js'
import { waitUntil } from '../helpers/wait.js'
import { frameOf, messageOf, planePublisher, putGenA, putGenB, u64be } from '../helpers/event-plane.js'
import type { PlanePublisher } from '../helpers/event-plane.js'
import { encodeEnvelopeMsgpack } from '../../support/dynamo-msgpack.js'

/** A fixstr's bytes: its header byte, then the text. */
const hexOf = (s: string, head: string): string => head + Buffer.from(s).toString('hex')

const NS = 'dynamo'
const COMP = 'backend'

interface Setup {
  client: Etcd3
  pool: ShardPool
  discovery: ChannelDiscovery
  intake: EventPlaneIntake
  calls: string[]
}

async function setup(t: Test): Promise<Setup> {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const pool = await ShardPool.start({ shards: 2 })
  t.teardown(() => pool.close())
  const discovery = await ChannelDiscovery.start(etcd.url)
  t.teardown(() => discovery.close())
  const calls: string[] = []
  const hooks: EventPlaneHooks = {
    gap: (w, r) => calls.push(`gap ${w}:${r}`),
    restart: (w, r) => {
      calls.push(`restart ${w}:${r}`)
      pool.resetWorkerRank(w, r)
    },
  }
  const intake = EventPlaneIntake.start({ discovery, namespace: NS, component: COMP, pool, hooks })
  t.teardown(() => intake.close())
  return { client, pool, discovery, intake, calls }
}

async function publisher(t: Test, id: bigint): Promise<PlanePublisher> {
  const p = await planePublisher(id)
  t.teardown(() => p.close())
  return p
}

const overlap = async (pool: ShardPool, tokens: bigint[]): Promise<[string, number][]> =>
  (await pool.overlapScores(tokens, { readYourWrites: true })).map((s) => [`${s.worker_id}:${s.dp_rank}`, s.overlap_blocks] as [string, number]).sort()

t.test('Gen-A and Gen-B publishers are read; a record that goes closes its SUB', async (t) => {
  const { client, pool, intake } = await setup(t)
  const a = await publisher(t, 0x1111n)
  const b = await publisher(t, 2n ** 53n - 3n)
  await putGenA(client, { ns: NS, component: COMP, instanceId: 0xaaaan, zmq: a.endpoint })
  const keys = await putGenB(client, {
    ns: NS,
    component: COMP,
    endpoint: 'generate',
    publisherId: b.publisherId,
    zmq: b.endpoint,
    workerId: 2n ** 60n + 5n,
    dpRank: 1,
  })
  // another component's publisher, and a namespace-scoped one: not this router's
  const other = await publisher(t, 0x3333n)
  await putGenA(client, { ns: NS, component: 'prefill', instanceId: 0xbbbbn, zmq: other.endpoint })
  t.same(await Promise.all([a.subscribed(), b.subscribed()]), ['kv-events', 'kv-events'], 'both SUBs subscribe to the topic')

  await a.publish(chain(21, null, [1, 2, 3]))
  await b.publish(chain(2n ** 60n + 5n, null, [1, 2], 1))
  await waitUntil('both applied', () => intake.counters.applied === 2)
  t.same(
    await overlap(pool, [1n, 2n, 3n]),
    [
      [`${2n ** 60n + 5n}:1`, 2],
      ['21:0', 3],
    ],
    'the index holds both workers',
  )
  t.same(intake.endpoints.direct.sort(), [a.endpoint, b.endpoint].sort(), 'the prefill publisher is not subscribed to')

  await client.delete().key(keys.channelKey)
  await waitUntil('SUB closed', () => intake.endpoints.direct.length === 1)
  t.same(intake.endpoints.direct, [a.endpoint])
})

t.test('malformed messages are counted by reason and change nothing; the loop reads on', async (t) => {
  const { client, pool, intake, discovery } = await setup(t)
  const p = await publisher(t, 77n)
  await putGenA(client, { ns: NS, component: COMP, instanceId: 1n, zmq: p.endpoint })
  await p.subscribed()
  await p.publish(chain(5, null, [1, 2]))
  await waitUntil('first applied', () => intake.counters.applied === 1)
  const before = await overlap(pool, [1n, 2n, 3n, 4n])

  const good = messageOf(chain(5, 2, [3, 4]), 77n, 1n)
  const [f0, f1, f2, f3] = good as [Buffer, Buffer, Buffer, Buffer]
  await p.send([f0, f1, f2])
  await p.send([f0, f1.subarray(2), f2, f3])
  await p.send([f0, f1, f2, Buffer.concat([Buffer.from([2]), f3.subarray(1)])])
  await p.send([f0, f1, f2, frameOf(Buffer.from('{"publisher_id":77}'))])
  await p.send([f0, u64be(78n), f2, f3])
  await p.send(messageOf(chain(5, 2, [3, 4]), 77n, 1n, 'kv-events', 'kv_metrics'))
  // a ZMQ prefix match the exact topic check refuses
  await p.send([Buffer.from('kv-events-prefix-collision'), f1, f2, f3])
  await waitUntil('all dropped', () => Object.values(intake.drops).reduce((x, y) => x + y, 0) === 7)
  t.same(
    Object.fromEntries(Object.entries(intake.drops).filter(([, n]) => n > 0)),
    { frame_count: 1, id_frame: 1, frame_version: 1, envelope: 1, id_mismatch: 1, envelope_topic: 1, topic: 1 },
    'each counted under its reason',
  )
  t.same(await overlap(pool, [1n, 2n, 3n, 4n]), before, 'the index is unchanged')
  t.equal(intake.counters.applied, 1)

  // the envelope is good, its RouterEvent is not (an explicit nil residency_domain): the shard refuses it
  const badEvent = Buffer.from(
    '83' +
      hexOf('worker_id', 'a9') +
      '05' +
      hexOf('residency_domain', 'b0') +
      'c0' +
      hexOf('event', 'a5') +
      '82' +
      hexOf('event_id', 'a8') +
      '09' +
      hexOf('data', 'a4') +
      hexOf('cleared', 'a7'),
    'hex',
  )
  await p.send([f0, f1, f2, frameOf(encodeEnvelopeMsgpack({ publisher_id: 77n, sequence: 1n, payload: badEvent }))])
  await waitUntil('refused by the shard', () => pool.counters().reduce((n, c) => n + c.malformed, 0) === 1)
  t.same(await overlap(pool, [1n, 2n, 3n, 4n]), before, 'the index is still unchanged')
  await p.send(messageOf(chain(5, 2, [3, 4]), 77n, 2n))
  await waitUntil('the loop reads on', () => intake.counters.applied === 3)
  // a record naming an endpoint ZMQ cannot connect to is skipped, counted once
  await putGenA(client, { ns: NS, component: COMP, instanceId: 2n, zmq: 'tcp://:x' })
  await putGenA(client, { ns: NS, component: COMP, instanceId: 3n, zmq: 'tcp://:x' })
  await waitUntil('both records seen', () => discovery.channels.size === 3)
  t.equal(intake.counters.badEndpoints, 1, 'counted once for the endpoint')
  t.same(intake.endpoints.direct, [p.endpoint])
  t.same(await overlap(pool, [1n, 2n, 3n, 4n]), [['5:0', 4]], 'a good message after them is applied')
})

t.test('a gap and a restart reach the hooks with the worker-rank of the EventSource record', async (t) => {
  const { client, pool, intake, calls } = await setup(t)
  const p = await publisher(t, 0xfeedn)
  const worker = 2n ** 63n + 9n
  await putGenB(client, { ns: NS, component: COMP, endpoint: 'generate', publisherId: p.publisherId, zmq: p.endpoint, workerId: worker, dpRank: 2 })
  await p.subscribed()
  await p.publish(chain(worker, null, [1], 2))
  await p.publish(chain(worker, 1, [2], 2))
  p.sequence = 5n
  await p.publish(chain(worker, 2, [3], 2))
  await waitUntil('three applied', () => intake.counters.applied === 3)
  t.same(calls, [`gap ${worker}:2`], 'sequences 2 to 4 never came: the worker-rank goes to recovery')
  t.equal(intake.counters.gaps, 1)
  t.same(await overlap(pool, [1n, 2n, 3n]), [[`${worker}:2`, 3]])

  // the publisher starts over: its worker-rank is reset before its new first event is applied
  p.sequence = 0n
  await p.publish(chain(worker, null, [7], 2))
  await waitUntil('restart applied', () => intake.counters.applied === 4)
  t.same(calls, [`gap ${worker}:2`, `restart ${worker}:2`])
  t.equal(intake.counters.restarts, 1)
  t.same(await overlap(pool, [1n, 2n, 3n]), [], "the old process's blocks are gone")
  t.same(await overlap(pool, [7n]), [[`${worker}:2`, 1]], "the new one's are there")

  // a late repeat of a sequence already applied is dropped as stale
  await p.publish(chain(worker, 7, [8], 2))
  p.sequence = 1n
  await p.publish(chain(worker, 8, [9], 2))
  await waitUntil('stale counted', () => intake.counters.stale === 1)
  t.equal(intake.counters.applied, 5)
  t.same(await overlap(pool, [7n, 8n, 9n]), [[`${worker}:2`, 2]], 'the repeat was not applied')
})

t.test('a new publisher on the same endpoint is a restart, the worker-rank read from its event', async (t) => {
  const { client, intake, calls } = await setup(t)
  const first = await publisher(t, 1n)
  await putGenA(client, { ns: NS, component: COMP, instanceId: 9n, zmq: first.endpoint })
  await first.subscribed()
  await first.publish(chain(12, null, [1], 0))
  await waitUntil('applied', () => intake.counters.applied === 1)
  // the same endpoint, another publisher_id (a restarted process on the same port)
  await first.send(messageOf(chain(12, null, [5], 1), 2n, 3n))
  await waitUntil('second applied', () => intake.counters.applied === 2)
  t.same(calls, ['restart 12:1', 'gap 12:1'], 'reset, then its missed first messages go to recovery')
})

t.test('two brokers: each message is applied once, duplicates counted; subjects of both scopes are read', async (t) => {
  const { client, pool, intake } = await setup(t)
  const x1 = await publisher(t, 0n)
  const x2 = await publisher(t, 0n)
  await client
    .put('v1/event_channels/dynamo/zmq_broker/kv-events/5')
    .value(
      '{"type":"EventChannel","namespace":"dynamo","component":"zmq_broker","topic":"kv-events","instance_id":5,' +
        `"transport":{"kind":"ZmqBroker","config":{"xsub_endpoints":["tcp://127.0.0.1:1"],"xpub_endpoints":["${x1.endpoint}","${x2.endpoint}"]}}}`,
    )
  const subs = new Set<string>()
  for (const x of [x1, x2]) for (let i = 0; i < 2; i++) subs.add(await x.subscribed())
  t.same([...subs].sort(), ['kv-events', 'namespace.dynamo.component.backend.'], 'subscribed to the component subject and the bare topic')
  const subject = 'namespace.dynamo.component.backend.endpoint.generate.kv-events'
  for (let seq = 0n; seq < 3n; seq++) {
    const m = messageOf(
      chain(40, seq === 0n ? null : Number(seq), [Number(seq) + 1]),
      0x99n,
      seq,
      seq === 1n ? 'namespace.dynamo.component.backend.kv-events' : subject,
    )
    await x1.send(m)
    await x2.send(m)
  }
  await waitUntil('all six read', () => intake.counters.messages === 6)
  t.equal(intake.counters.applied, 3)
  t.equal(intake.counters.duplicates, 3)
  t.equal(intake.counters.gaps + intake.counters.stale, 0, 'no copy looked like a gap or a repeat')
  t.same(await overlap(pool, [1n, 2n, 3n]), [['40:0', 3]])
  t.same(intake.endpoints.brokers.sort(), [x1.endpoint, x2.endpoint].sort())
})
