// Worker discovery against a real etcd: lease-based registration, removal, restart resync.
import t from 'tap'
import { once } from 'node:events'
import { Etcd3 } from 'etcd3'
import { startEtcd, getFreePort } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { cardsPrefix, instancesPrefix } from '../../src/transport/dynamo-names.js'
import { EtcdDiscovery, toWorker, type DiscoveredWorker } from '../../src/transport/etcd.js'
import { ShardPool } from '../../src/shards/pool.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { chain } from '../helpers/events.js'
import { captureProcessLog, warnings as warnLines } from '../helpers/log.js'

const NS = 'dynamo'
const COMP = 'backend'
const EP = 'generate'

/** Registers a worker the way an engine wrapper would: two keys under its own lease. */
async function register(
  client: Etcd3,
  opts: { url: string; device?: string; blockSize?: number; dpSize?: number; ttl?: number },
): Promise<{ id: bigint; revoke: () => Promise<void> }> {
  const lease = client.lease(opts.ttl ?? 10)
  const id = BigInt(await lease.grant())
  const hex = id.toString(16)
  await lease.put(`${instancesPrefix(NS, COMP, EP)}${hex}`).value(JSON.stringify({ http_url: opts.url, device_type: opts.device ?? 'cuda' }))
  await lease.put(`${cardsPrefix(NS, COMP, EP)}${hex}`).value(
    JSON.stringify({
      kv_cache_block_size: opts.blockSize ?? 64,
      runtime_config: { total_kv_blocks: 4096, max_num_batched_tokens: 8192, data_parallel_size: opts.dpSize ?? 1 },
    }),
  )
  return { id, revoke: () => lease.revoke() }
}

t.test('a leased worker appears with its record and disappears, from discovery and the index, when the lease ends', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const early = await register(client, { url: 'http://127.0.0.1:9001', device: 'cpu', blockSize: 16, dpSize: 2 })

  const disco = await EtcdDiscovery.start({ url: etcd.url, namespace: NS, component: COMP, endpoint: EP })
  t.teardown(() => disco.close())
  const pool = await ShardPool.start({ shards: 2 })
  t.teardown(() => pool.close())
  const removals: Promise<void>[] = []
  disco.on('removed', (id: bigint) => removals.push(pool.removeWorker(id)))

  const first = disco.workers.get(early.id)
  t.same(
    first,
    {
      workerId: early.id,
      url: 'http://127.0.0.1:9001',
      deviceType: 'cpu',
      blockSize: 16,
      totalKvBlocks: 4096,
      maxNumBatchedTokens: 8192,
      dpStart: 0,
      dpSize: 2,
      kvEvents: null,
      requestPlane: null,
      model: null,
    },
    'listed at start',
  )

  const added = once(disco, 'added')
  const late = await register(client, { url: 'http://127.0.0.1:9002' })
  const [w] = (await added) as [DiscoveredWorker]
  t.equal(w.url, 'http://127.0.0.1:9002')
  await waitUntil('model card applied', () => disco.workers.get(late.id)?.blockSize === 64)

  // the late worker holds blocks in the index; its lease ends; within 2 s it is gone from both
  pool.push(Buffer.from(encodeRouterEvent(chain(late.id, null, [1, 2]))))
  t.equal((await pool.overlapScores([1n, 2n], { readYourWrites: true })).length, 1)
  const removed = once(disco, 'removed')
  const t0 = Date.now()
  await late.revoke()
  const [gone] = (await removed) as [bigint]
  t.equal(gone, late.id)
  t.notOk(disco.workers.has(late.id))
  await waitUntil('the index forgot the worker', async () => (await pool.overlapScores([1n, 2n], { readYourWrites: true })).length === 0, 2000)
  t.ok(Date.now() - t0 < 2000, 'gone from discovery and the index within 2 s')
  t.ok(disco.workers.has(early.id), 'the other worker stays')
  // a lease left running keeps its keep-alive timer, and with it this process, alive; its
  // removal must reach the pool before the teardown closes it
  const earlyGone = once(disco, 'removed')
  await early.revoke()
  await earlyGone
  await Promise.all(removals)
})

t.test('etcd restarted under discovery: it reconnects and resyncs', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const disco = await EtcdDiscovery.start({ url: etcd.url, namespace: NS, component: COMP, endpoint: EP })
  t.teardown(() => disco.close())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const a = await register(client, { url: 'http://127.0.0.1:9101', ttl: 30 })
  await waitUntil('registered', () => disco.workers.has(a.id))
  const resyncs = disco.counters.resyncs
  const reconnected = once(disco, 'reconnected')
  await etcd.restart()
  await waitUntil('disconnect noticed or already back', () => disco.counters.disconnects > 0, 15_000)
  await reconnected
  t.equal(disco.connected, true)
  t.ok(disco.counters.resyncs > resyncs, 'a full re-list ran after the reconnection')
  t.ok(disco.workers.has(a.id), 'the worker survived the restart (its lease did)')
  // changes after the restart are seen again
  const added = once(disco, 'added')
  const b = await register(client, { url: 'http://127.0.0.1:9102', ttl: 30 })
  const [w] = (await added) as [DiscoveredWorker]
  t.equal(w.workerId, b.id)
  const removed = once(disco, 'removed')
  await a.revoke()
  t.same(await removed, [a.id])
  await b.revoke()
})

t.test('records: parsing rules and malformed values', async (t) => {
  t.equal(toWorker(1n, {}), null, 'no instance key, not routable')
  t.equal(toWorker(1n, { instance: { http_url: 'ftp://x' } }), null, 'not an http URL')
  t.same(toWorker(2n, { instance: { transport: { http: 'http://h:1' } } }), {
    workerId: 2n,
    url: 'http://h:1',
    deviceType: 'gpu',
    blockSize: null,
    totalKvBlocks: null,
    maxNumBatchedTokens: null,
    dpStart: 0,
    dpSize: 1,
    kvEvents: null,
    requestPlane: null,
    model: null,
  })
  // a current Dynamo worker: a TCP request-plane address and no HTTP URL, its card wrapped in a
  // DiscoveryInstance::Model record (lib/runtime/src/discovery/mod.rs@5f4d5bb8; the record shape
  // the mocker's golden in test/sim/mocker/dynamo-worker.test.ts transcribes)
  const tcpOnly = toWorker(5n, {
    instance: {
      type: 'Endpoint',
      component: 'backend',
      endpoint: 'generate',
      namespace: 'dynamo',
      instance_id: 5,
      transport: { tcp: '10.0.0.5:7000/5/generate' },
    },
    card: {
      type: 'Model',
      namespace: 'dynamo',
      component: 'backend',
      endpoint: 'generate',
      instance_id: 5,
      card_json: { display_name: 'llama', kv_cache_block_size: 32, runtime_config: { total_kv_blocks: 100, data_parallel_size: 2 } },
    },
  })
  t.match(
    tcpOnly,
    { url: '', requestPlane: '10.0.0.5:7000/5/generate', model: 'llama', blockSize: 32, totalKvBlocks: 100, dpSize: 2 },
    'routable over the request plane',
  )
  t.equal(toWorker(6n, { instance: { transport: { tcp: 'not an address' } } }), null, 'neither an HTTP URL nor a TCP address: not routable')
  t.equal(toWorker(7n, { instance: { transport: { nats_tcp: 'x' } } }), null, 'another transport: not routable')
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  await client.put(`${instancesPrefix(NS, COMP, EP)}zz`).value('{}')
  await client.put(`${instancesPrefix(NS, COMP, EP)}abc`).value('not json')
  await client.put(`${instancesPrefix(NS, COMP, EP)}ffffffffffffffff`).value('{"http_url":"http://127.0.0.1:9"}')
  const disco = await EtcdDiscovery.start({ url: etcd.url, namespace: NS, component: COMP, endpoint: EP })
  t.teardown(() => disco.close())
  t.same([...disco.workers.keys()], [0xffffffffffffffffn], 'u64 ids from hex keys stay exact; bad keys and values are skipped')
  t.equal(disco.counters.malformed, 1)
})

t.test('records: the kv-events fields of an instance, checked as --worker and POST /v1/workers check them', async (t) => {
  const url = { http_url: 'http://h:1' }
  t.same(toWorker(3n, { instance: { ...url, kv_events_endpoint: 'tcp://h:5557', replay_endpoint: 'tcp://h:5558', kv_events_topic: 'kv-events' } })?.kvEvents, {
    endpoint: 'tcp://h:5557',
    replay: 'tcp://h:5558',
    topic: 'kv-events',
  })
  t.same(
    toWorker(3n, { instance: { ...url, kv_events_endpoint: 'tcp://h:5557', replay_endpoint: null } })?.kvEvents,
    { endpoint: 'tcp://h:5557', replay: null, topic: '' },
    'null is absent',
  )
  const card = (dp: number) => ({ runtime_config: { data_parallel_size: dp } })
  t.equal(toWorker(3n, { instance: { ...url, kv_events_endpoint: 'tcp://h:65535' }, card: card(1) })?.kvEvents?.endpoint, 'tcp://h:65535')
  for (const [fields, dp, why] of [
    [
      { kv_events_endpoint: 'tcp://*:5557' },
      1,
      /^kv_events_endpoint must be tcp:\/\/HOST:PORT, got "tcp:\/\/\*:5557"; tcp:\/\/\*:PORT is where the engine binds/,
    ],
    [{ kv_events_endpoint: 5557 }, 1, /^kv_events_endpoint must be tcp:\/\/HOST:PORT, got 5557$/],
    [{ kv_events_endpoint: 'tcp://h:1', replay_endpoint: 'tcp://h' }, 1, /^replay_endpoint must be tcp/],
    [{ replay_endpoint: 'tcp://h:2' }, 1, /^replay_endpoint and kv_events_topic need kv_events_endpoint$/],
    [{ kv_events_endpoint: 'tcp://h:1', kv_events_topic: 7 }, 1, /^kv_events_topic must be a string/],
    [
      { kv_events_endpoint: 'tcp://h:65535' },
      2,
      /^kv_events_endpoint must be tcp:\/\/HOST:PORT with PORT \+ data_parallel_size - 1 at most 65535 \(data_parallel_size 2\)/,
    ],
  ] as const) {
    const why2: string[] = []
    const w = toWorker(3n, { instance: { ...url, ...fields }, card: card(dp) }, (m) => why2.push(m))
    t.equal(w?.url, 'http://h:1', 'still a worker')
    t.equal(w?.kvEvents, null, 'without events')
    t.match(why2, [why])
  }
  const none: string[] = []
  t.equal(toWorker(3n, { instance: url }, (m) => none.push(m))?.kvEvents, null)
  t.same(none, [], 'no fields, nothing to tell')
})

t.test('an unreachable etcd at start is a clear error naming the URL', async (t) => {
  const port = await getFreePort()
  await t.rejects(EtcdDiscovery.start({ url: `http://127.0.0.1:${port}`, namespace: NS, component: COMP, endpoint: EP, dialTimeoutMs: 300 }), {
    code: 'KVR_ERR_INVALID_OPTION',
    message: new RegExp(`cannot reach etcd at http://127\\.0\\.0\\.1:${port}`),
  })
})

t.test('a comma-separated --etcd-url is several endpoints: discovery starts when one of them is up', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const dead = `http://127.0.0.1:${await getFreePort()}`
  const d = await EtcdDiscovery.start({ url: `${dead},${etcd.url}`, namespace: NS, component: COMP, endpoint: EP, dialTimeoutMs: 3000 })
  t.teardown(() => d.close())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const w = await register(client, { url: 'http://127.0.0.1:9' })
  await waitUntil('the worker discovered', () => d.workers.has(w.id))
  t.equal(d.workers.get(w.id)?.url, 'http://127.0.0.1:9', 'a worker registered through the live endpoint is seen')
})

t.test('a router started against etcd has the workers etcd lists registered by the time start() returns', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const a = await register(client, { url: 'http://127.0.0.1:9011' })
  const b = await register(client, { url: 'http://127.0.0.1:9012' })
  t.teardown(() =>
    Promise.all([a.revoke(), b.revoke()]).then(
      () => undefined,
      () => undefined,
    ),
  )
  const { parseServeConfig } = await import('../../src/config.js')
  const { Router } = await import('../../src/core/router.js')
  const cfg = parseServeConfig(['--router-event-threads', '1', '--router-block-size', '64', '--etcd-url', etcd.url], {})
  if (cfg === 'help') return t.fail('help')
  const router = await Router.start(cfg)
  t.teardown(() => router.close())
  t.same(
    router.registry
      .all()
      .map((w) => w.id)
      .sort(),
    [a.id, b.id].sort(),
    'both, with no wait',
  )
})

t.test('a worker announcing another block size is misconfigured, out of kv routing, until its card says the right one', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const { parseServeConfig } = await import('../../src/config.js')
  const { Router } = await import('../../src/core/router.js')
  // no health probes: nothing listens at the workers' addresses
  const cfg = parseServeConfig(
    [
      '--router-event-threads',
      '1',
      '--no-router-event-recovery',
      '--router-health-probe-interval-secs',
      '0',
      '--router-block-size',
      '64',
      '--etcd-url',
      etcd.url,
    ],
    {},
  )
  if (cfg === 'help') return t.fail('help')
  const router = await Router.start(cfg)
  t.teardown(() => router.close())
  const capture = captureProcessLog()
  const said = (): string[] => warnLines(capture, 'KVR_BLOCK_SIZE_MISMATCH')
  const good = await register(client, { url: 'http://127.0.0.1:9021' })
  const lease = client.lease(10)
  const id = BigInt(await lease.grant())
  const card = (bs: number): string => JSON.stringify({ kv_cache_block_size: bs, runtime_config: { total_kv_blocks: 4096, max_num_batched_tokens: 8192 } })
  await lease.put(`${instancesPrefix(NS, COMP, EP)}${id.toString(16)}`).value(JSON.stringify({ http_url: 'http://127.0.0.1:9022' }))
  await lease.put(`${cardsPrefix(NS, COMP, EP)}${id.toString(16)}`).value(card(32))
  t.teardown(() =>
    Promise.all([good.revoke(), lease.revoke()]).then(
      () => undefined,
      () => undefined,
    ),
  )
  const stateOf = (w: bigint): string => router.health.state(w, false)
  await waitUntil('both registered, one misconfigured', () => router.registry.size === 2 && stateOf(id) === 'misconfigured')
  t.equal(stateOf(good.id), 'healthy')
  t.match(router.health.reason(id), "block size 32, the router's is 64")
  t.match(said(), [`worker ${id} announces block size 32, the router hashes with 64`])
  const routed = new Set<bigint>()
  for (let i = 0; i < 20; i++)
    routed.add((await router.route({ tokens: Array.from({ length: 128 }, (_, k) => i * 1000 + k), updateStates: false })).decision.workerId)
  t.same([...routed], [good.id], 'every decision for the other worker')
  await lease.put(`${cardsPrefix(NS, COMP, EP)}${id.toString(16)}`).value(card(64))
  await waitUntil('healthy with the right block size', () => stateOf(id) === 'healthy')
  for (let i = 0; i < 40 && !routed.has(id); i++)
    routed.add((await router.route({ tokens: Array.from({ length: 128 }, (_, k) => 50_000 + i * 1000 + k), updateStates: false })).decision.workerId)
  t.ok(routed.has(id), 'routed once fixed')
  t.equal(said().length, 1, 'warned once')
})
