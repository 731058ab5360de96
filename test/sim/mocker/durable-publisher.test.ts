// `kv-router mocker --durable-kv-events` against a real nats-server with JetStream: Dynamo's
// stream name and subjects, and every event stored once and in order across a server restart.
import t from 'tap'
import { connect } from 'nats'
import { startNats } from '../../../src/deploy/services.js'
import { waitUntil } from '../../helpers/wait.js'
import { parseRouterEvent } from '../../../src/codec/events.js'
import { MockerFleet } from '../../../src/sim/mocker/fleet.js'
import { kvEventsQueueSubject, kvEventsStream, radixBucket, slugify } from '../../../src/transport/dynamo-names.js'

const STREAM = 'namespace-dynamo-component-backend-kv-events'

t.test("names: Dynamo's slug of the stream and the bucket", async (t) => {
  t.equal(kvEventsStream('dynamo', 'backend'), STREAM)
  t.equal(kvEventsQueueSubject(STREAM), `${STREAM}.queue`)
  t.equal(radixBucket('dynamo', 'backend'), 'namespace-dynamo-component-backend-radix-bucket')
  t.equal(kvEventsStream('My_NS', 'vllm_worker'), 'namespace-my-ns-component-vllm-worker-kv-events', 'lowercase, "_" and "." both "-"')
  t.equal(slugify('_a.b c'), 'a-b-c', 'leading "_" dropped, anything else "-"')
})

t.test('every event stored once and in order, across a server restart', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const fleet = await MockerFleet.start({
    numWorkers: 2,
    blockSize: 4,
    numGpuBlocks: 40,
    speedupRatio: 0,
    natsUrl: nats.url,
    durableKvEvents: true,
    onWarning: () => undefined,
  })
  t.teardown(() => fleet.close())
  const nc = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 })
  t.teardown(() => nc.close())
  const jsm = await nc.jetstreamManager()
  const si = await jsm.streams.info(STREAM)
  t.same(si.config.subjects, [`${STREAM}.*`], 'the stream is made with Dynamo’s subjects')
  t.equal(si.config.max_age, 3_600_000_000_000, 'and an hour of retention')

  let tok = 1
  const serve = async (n: number): Promise<void> => {
    for (let i = 0; i < n; i++) {
      const prompt = Array.from({ length: 4 + (i % 9) * 4 }, () => tok++ % 997)
      fleet.workers[i % 2]?.engine.submit(prompt, 2)
    }
    await waitUntil('engines idle', () => fleet.workers.every((w) => w.engine.runningCount + w.engine.waitingCount === 0), 20_000)
  }
  await serve(30)
  const restarted = nats.restart()
  await serve(30)
  await restarted
  await serve(30)
  await fleet.flushEvents()
  const msgs = (await jsm.streams.info(STREAM)).state.messages
  const published = fleet.workers.reduce((n, w) => n + Number(w.engine.ring.newestId), 0)
  t.ok(published > 100, `events published (${published})`)
  t.equal(msgs, published, 'every event stored, once')
  // per worker, the event ids in stream order follow each other
  await jsm.consumers.add(STREAM, { durable_name: 'check', ack_policy: 'none' as never, deliver_policy: 'all' as never })
  const c = await nc.jetstream().consumers.get(STREAM, 'check')
  const last = new Map<bigint, bigint>()
  let ordered = true
  let read = 0
  for await (const m of await c.fetch({ max_messages: msgs, expires: 5000 })) {
    const ev = parseRouterEvent(m.data)
    const prev = last.get(ev.worker_id)
    if (prev !== undefined && ev.event.event_id !== prev + 1n) ordered = false
    last.set(ev.worker_id, ev.event.event_id)
    read++
  }
  t.equal(read, msgs)
  t.ok(ordered, 'in order, none missing')
  t.same([...last.values()].sort(), fleet.workers.map((w) => w.engine.ring.newestId).sort(), "up to each engine's newest")
})
