// The mocker's distributed mode against a real nats-server and etcd (the test harness starts
// them): each engine registers under its own lease (lease id = worker id, Dynamo's record
// format, read back by the router's own discovery), its KV events arrive on NATS in a form the
// router's decoder accepts, its load on kv_metrics in a form the router's intake parses, and
// shutting down revokes the leases at once.
import t from 'tap'
import { connect } from 'nats'
import { Etcd3 } from 'etcd3'
import { startEtcd, startNats } from '../../../src/deploy/services.js'
import { waitUntil } from '../../helpers/wait.js'
import { MockerFleet, type MockerWorker } from '../../../src/sim/mocker/fleet.js'
import { etcdRecord } from '../../../src/sim/mocker/registration.js'
import { outputToken } from '../../../src/sim/mocker/engine.js'
import { cardsPrefix, instancesPrefix, kvEventSubjects, kvMetricsSubject } from '../../../src/transport/dynamo-names.js'
import { EtcdDiscovery } from '../../../src/transport/etcd.js'
import { parseLoadEvent, type WorkerLoad } from '../../../src/transport/nats.js'
import { EventDecoder, EventKind } from '../../../src/codec/event-decoder.js'
import { toRouterEvent, type RouterEvent } from '../../../src/codec/events.js'
import { computeBlockHashes } from '../../../src/codec/hashing.js'
import { isKvrError } from '../../../src/errors.js'

const BS = 16

t.test('engines register in etcd under their leases and publish events and load on NATS', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())

  // a listener on the router's subjects, before any engine exists
  const nc = await connect({ servers: nats.url })
  t.teardown(() => nc.close())
  const decoder = new EventDecoder()
  const events: RouterEvent[] = []
  const loads: WorkerLoad[] = []
  let undecodable = 0
  const [subject] = kvEventSubjects('dynamo', 'backend') as [string]
  nc.subscribe(subject, {
    callback: (_err, msg) => {
      try {
        events.push(toRouterEvent(decoder.decode(msg.data)))
      } catch {
        undecodable++
      }
    },
  })
  nc.subscribe(kvMetricsSubject('dynamo'), {
    callback: (_err, msg) => {
      const l = parseLoadEvent(msg.data)
      if (l === null) undecodable++
      else loads.push(l)
    },
  })
  await nc.flush()
  // the router's discovery, watching
  const disco = await EtcdDiscovery.start({ url: etcd.url, namespace: 'dynamo', component: 'backend', endpoint: 'generate' })
  t.teardown(() => disco.close())
  const removed: bigint[] = []
  disco.on('removed', (id: bigint) => removed.push(id))

  const fleet = await MockerFleet.start({
    numWorkers: 2,
    blockSize: BS,
    numGpuBlocks: 2048,
    maxNumBatchedTokens: 4096,
    speedupRatio: 0,
    natsUrl: nats.url,
    etcdUrl: etcd.url,
    loadIntervalMs: 200,
    modelName: 'mock',
  })
  let closed = false
  t.teardown(() => (closed ? undefined : fleet.close()))
  const [w0, w1] = fleet.workers as [MockerWorker, MockerWorker]
  t.not(w0.workerId, w1.workerId)

  // etcd: two keys per engine, under a lease whose id is the worker id
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  for (const w of fleet.workers) {
    const hex = w.workerId.toString(16)
    const inst = await client.get(`${instancesPrefix('dynamo', 'backend', 'generate')}${hex}`).exec()
    const card = await client.get(`${cardsPrefix('dynamo', 'backend', 'generate')}${hex}`).exec()
    t.equal(inst.kvs[0]?.lease, w.workerId.toString(), 'the instance key lives under the lease named by the worker id')
    t.equal(card.kvs[0]?.lease, w.workerId.toString())
    t.same(JSON.parse(inst.kvs[0]?.value.toString() ?? '{}'), { http_url: w.url, device_type: 'cuda' })
    t.same(JSON.parse(card.kvs[0]?.value.toString() ?? '{}'), {
      kv_cache_block_size: BS,
      runtime_config: { total_kv_blocks: 2048, max_num_batched_tokens: 4096, data_parallel_size: 1, data_parallel_start_rank: 0 },
      display_name: 'mock',
    })
  }
  await waitUntil('both engines discovered', () => disco.workers.size === 2, 5000)
  t.same(
    disco.workers.get(w0.workerId),
    {
      workerId: w0.workerId,
      url: w0.url,
      deviceType: 'gpu',
      blockSize: BS,
      totalKvBlocks: 2048,
      maxNumBatchedTokens: 4096,
      dpStart: 0,
      dpSize: 1,
      kvEvents: null,
      requestPlane: null,
      model: 'mock',
    },
    "the router's discovery reads the record (the model's name from the card's display_name)",
  )

  // a request on engine 0: its Stored events reach NATS and decode with the router's decoder
  const prompt = Array.from({ length: 100 }, (_, i) => i * 7 + 1)
  const r = await fetch(`${w0.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt, max_tokens: 30 }) })
  t.equal(r.status, 200)
  await r.text()
  await fleet.flushEvents()
  await waitUntil('events on NATS', () => events.length === w0.engine.ring.length, 5000)
  t.equal(undecodable, 0, 'every message decodes')
  t.ok(events.length >= 2)
  t.same(
    events.map((e) => e.worker_id),
    events.map(() => w0.workerId),
    'worker id = lease id, exact',
  )
  t.same(
    events.map((e) => e.event.event_id),
    events.map((_, i) => BigInt(i + 1)),
    'ids consecutive from 1',
  )
  const blocks = events.flatMap((e) => (typeof e.event.data === 'object' && 'stored' in e.event.data ? e.event.data.stored.blocks : []))
  const tokens = [...prompt, ...Array.from({ length: 30 }, (_, k) => outputToken(k))]
  t.same(
    blocks.map((b) => b.tokens_hash),
    [...computeBlockHashes(tokens.slice(0, 16 * blocks.length), BS)],
    "tokens_hash is the router's local hash, prompt and decode blocks",
  )
  t.equal(decoder.decodeString(JSON.stringify({ worker_id: 1, event: { event_id: 1, data: 'cleared' } })).kind, EventKind.Cleared)

  // kv_metrics: periodic reports, decoded by the router's intake
  await waitUntil('load reports from both engines', () => new Set(loads.map((l) => l.workerId)).size === 2, 5000)
  // a report taken while the request still ran says so; the next one, after it, must be idle
  const last = (): WorkerLoad | undefined => loads.filter((l) => l.workerId === w0.workerId).at(-1)
  await waitUntil('an idle load report from engine 0', () => last()?.activeBlocks === 0, 5000)
  const l0 = last() as WorkerLoad
  t.same(l0, { workerId: w0.workerId, dpRank: 0, activeBlocks: 0, totalBlocks: 2048, requestsWaiting: 0 })

  // shutdown revokes the leases: the keys go at once, not after the TTL
  const t0 = Date.now()
  await fleet.close()
  closed = true
  const left = await client.getAll().prefix('v1/').keys()
  t.same(left, [], 'no key left')
  await waitUntil('discovery saw both leave', () => removed.length === 2, 5000)
  t.ok(Date.now() - t0 < 3000, 'within seconds, well before the 10 s TTL')
  t.same(new Set(removed), new Set([w0.workerId, w1.workerId]))
})

t.test('the record format', async (t) => {
  const rec = etcdRecord({ namespace: 'ns', component: 'c', endpoint: 'e' }, 0xabcn, {
    url: 'http://h:1',
    blockSize: 64,
    totalKvBlocks: 16384,
    maxNumBatchedTokens: 8192,
  })
  t.same(rec, [
    { key: 'v1/instances/ns/c/e/abc', value: '{"http_url":"http://h:1","device_type":"cuda"}' },
    {
      key: 'v1/mdc/ns/c/e/abc',
      value:
        '{"kv_cache_block_size":64,"runtime_config":{"total_kv_blocks":16384,"max_num_batched_tokens":8192,"data_parallel_size":1,' +
        '"data_parallel_start_rank":0}}',
    },
  ])
})

t.test('unreachable servers at start are errors naming them', async (t) => {
  const e1 = await MockerFleet.start({ etcdUrl: 'http://127.0.0.1:1', speedupRatio: 0 }).catch((e: unknown) => e)
  t.ok(isKvrError(e1, 'KVR_ERR_INVALID_OPTION'))
  t.match((e1 as Error).message, /cannot reach etcd at http:\/\/127\.0\.0\.1:1/)
  const e2 = await MockerFleet.start({ natsUrl: 'nats://127.0.0.1:1', speedupRatio: 0 }).catch((e: unknown) => e)
  t.match((e2 as Error).message, /cannot connect to NATS at nats:\/\/127\.0\.0\.1:1/)
  const e3 = await MockerFleet.start({ routerUrl: 'http://127.0.0.1:1', speedupRatio: 0 }).catch((e: unknown) => e)
  t.match((e3 as Error).message, /cannot reach the router at http:\/\/127\.0\.0\.1:1/)
})

t.test('shutting down while NATS and etcd are gone is bounded and leaves nothing running', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const fleet = await MockerFleet.start({ numWorkers: 2, natsUrl: nats.url, etcdUrl: etcd.url, speedupRatio: 0, loadIntervalMs: 100 })
  const w = fleet.workers[0] as MockerWorker
  const r = await fetch(`${w.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt: Array.from({ length: 200 }, (_, i) => i), max_tokens: 3 }),
  })
  t.equal(r.status, 200, 'serving goes on with NATS down')
  await nats.kill()
  await etcd.kill()
  const r2 = await fetch(`${w.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt: Array.from({ length: 200 }, (_, i) => i + 1), max_tokens: 3 }),
  })
  t.equal(r2.status, 200, 'and with NATS and etcd down')
  const t0 = Date.now()
  await fleet.close()
  // (a NATS client left reconnecting would also keep this test file from ending)
  t.ok(Date.now() - t0 < 6000, `closed in ${Date.now() - t0} ms`)
})
