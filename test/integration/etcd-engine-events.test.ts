// Workers discovered through etcd with their engine's own KV-event endpoints: a real etcd, mocker
// engines publishing vLLM-style over ZMQ (PUB + replay ROUTER), a router reading both. The index
// fills from the endpoint the instance record names, follows it when the record changes, and
// stops with the lease; data_parallel_size ranks are read on port + rank; fields that are not
// valid leave the worker registered without events, counted and warned about once.
import t from 'tap'
import type { Test } from 'tap'
import { once } from 'node:events'
import { Etcd3 } from 'etcd3'
import type { Lease } from 'etcd3'
import { Router } from '../../src/core/router.js'
import { buildApp } from '../../src/http/server.js'
import type { App } from '../../src/http/server.js'
import type { MockerFleet, MockerWorker } from '../../src/sim/mocker/fleet.js'
import { cardsPrefix, instancesPrefix } from '../../src/transport/dynamo-names.js'
import { EtcdDiscovery } from '../../src/transport/etcd.js'
import type { DiscoveredWorker } from '../../src/transport/etcd.js'
import { config } from '../http/helpers.js'
import { Rng } from '../helpers/rng.js'
import { startEtcd } from '../../src/deploy/services.js'
import type { EtcdServer } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { drive, dumpedTokens, sortedByKey, zmqFleet } from '../helpers/zmq-fleet.js'
import { captureProcessLog, warnings } from '../helpers/log.js'

const BS = 4
const NS = 'dynamo'
const COMP = 'backend'
const EP = 'generate'

interface Registration {
  id: bigint
  lease: Lease
  /** Writes the instance record (the URL and the given fields). */
  instance(fields: Record<string, unknown>): Promise<void>
}

/** A worker's lease and its model card; the instance record is written by the test. */
async function leased(client: Etcd3, dpSize = 1): Promise<Registration> {
  const lease = client.lease(30)
  const id = BigInt(await lease.grant())
  const hex = id.toString(16)
  await lease
    .put(`${cardsPrefix(NS, COMP, EP)}${hex}`)
    .value(JSON.stringify({ kv_cache_block_size: BS, runtime_config: { total_kv_blocks: 64, data_parallel_size: dpSize } }))
  return {
    id,
    lease,
    instance: async (fields) => {
      await lease.put(`${instancesPrefix(NS, COMP, EP)}${hex}`).value(JSON.stringify({ http_url: 'http://127.0.0.1:9', device_type: 'cuda', ...fields }))
    },
  }
}

/** Engine i's endpoints in a fleet of n engines (PUB base + i, replay base + n + i). */
function endpoints(base: number, n: number, i: number): Record<string, string> {
  return { kv_events_endpoint: `tcp://127.0.0.1:${base + i}`, replay_endpoint: `tcp://127.0.0.1:${base + n + i}`, kv_events_topic: 'kv-events' }
}

async function etcdAndClient(t: Test): Promise<{ etcd: EtcdServer; client: Etcd3 }> {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  return { etcd, client }
}

async function startRouter(t: Test, etcdUrl: string): Promise<App> {
  const router = await Router.start(config(['--router-block-size', String(BS), '--etcd-url', etcdUrl]))
  t.teardown(() => router.close())
  const app = await buildApp({ router, tokenizer: null })
  t.teardown(() => app.shutdown(1000))
  return app
}

const get = async (app: App, url: string): Promise<string> => (await app.fastify.inject({ method: 'GET', url })).body
const indexed = async (app: App, id: bigint): Promise<Map<bigint, bigint>> => dumpedTokens(await get(app, `/v1/kv/dump?worker_id=${id}`))
const cachedOf = (fleet: MockerFleet, i: number): Map<bigint, bigint> => sortedByKey((fleet.workers[i] as MockerWorker).engine.pool.cachedTokensHashes())

function counter(metrics: string, name: string, label: string): number {
  const m = new RegExp(`^${name}\\{[a-z]+="${label}"\\} (\\d+)$`, 'm').exec(metrics)
  return m === null ? -1 : Number(m[1])
}

/** Prompts of tokens from `from` on, into engine i alone; returns once their events are out. */
async function serveOnly(fleet: MockerFleet, i: number, from: number): Promise<void> {
  const engine = (fleet.workers[i] as MockerWorker).engine
  for (let r = 0; r < 4; r++) engine.submit([from + r, from + 10, from + 20, from + 30, from + 40 + r, from + 50, from + 60, from + 70, from + 80 + r], 3)
  await waitUntil(`engine ${i} idle`, () => engine.runningCount + engine.waitingCount === 0, 20_000)
  await fleet.flushEvents()
}

/** Waits until the index holds exactly engine i's blocks for the worker. */
async function holdsEngine(app: App, id: bigint, fleet: MockerFleet, i: number, what: string): Promise<Map<bigint, bigint>> {
  await waitUntil(
    what,
    async () => {
      const want = cachedOf(fleet, i)
      const h = await indexed(app, id)
      return want.size > 0 && h.size === want.size && [...want].every(([k, v]) => h.get(k) === v)
    },
    15_000,
    50,
  )
  return indexed(app, id)
}

t.test('an etcd worker naming kv_events_endpoint is indexed from its engine; a changed endpoint moves the listener; the lease ending stops it', async (t) => {
  const { etcd, client } = await etcdAndClient(t)
  const { fleet, base } = await zmqFleet(t, { numWorkers: 2, numGpuBlocks: 24, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS })
  const rng = new Rng(21)
  // served before the router starts: it learns them through the replay sockets
  await drive(fleet, rng, 20)
  t.notSame(cachedOf(fleet, 0), cachedOf(fleet, 1), 'the two engines cache different blocks')
  const w = await leased(client)
  await w.instance(endpoints(base, 2, 0))
  const app = await startRouter(t, etcd.url)

  t.same(await holdsEngine(app, w.id, fleet, 0, 'engine 0 indexed'), cachedOf(fleet, 0), "the index holds engine 0's blocks")
  const listed = JSON.parse(await get(app, '/v1/workers')) as { workers: { source: string; index: string; ranks: { cached_blocks: number }[] }[] }
  t.match(listed.workers, [{ source: 'etcd', index: 'exact', ranks: [{ cached_blocks: cachedOf(fleet, 0).size }] }], 'GET /v1/workers counts its blocks')

  // the record now names engine 1: its listener replaces engine 0's, whose blocks go
  await w.instance(endpoints(base, 2, 1))
  await holdsEngine(app, w.id, fleet, 1, 'engine 1 indexed')
  // both serve prompts of their own, engine 0 first: only engine 1's reach the index
  await serveOnly(fleet, 0, 100_000)
  await serveOnly(fleet, 1, 200_000)
  const after = await holdsEngine(app, w.id, fleet, 1, 'engine 1 indexed live')
  t.same(after, cachedOf(fleet, 1), "only engine 1's blocks, also after both engines served more")
  const own = [...cachedOf(fleet, 0).keys()].filter((h) => !cachedOf(fleet, 1).has(h))
  t.ok(own.length > 0, 'engine 0 holds blocks of its own')
  t.notOk(
    own.some((h) => after.has(h)),
    'none of them is in the index',
  )

  // the lease ends: the worker, its blocks and its listener go
  const metrics = async () => get(app, '/metrics')
  await w.lease.revoke()
  await waitUntil(
    'the worker and its blocks removed',
    async () => (JSON.parse(await get(app, '/v1/workers')) as { workers: unknown[] }).workers.length === 0 && (await indexed(app, w.id)).size === 0,
  )
  const batches = counter(await metrics(), 'kvrouter_zmq_total', 'batches')
  t.ok(batches > 0, 'batches were read')
  await drive(fleet, rng, 20)
  await new Promise((r) => setTimeout(r, 300))
  t.equal(counter(await metrics(), 'kvrouter_zmq_total', 'batches'), batches, 'no batch read after the removal: the listener stopped')
  t.equal((await indexed(app, w.id)).size, 0, 'nothing indexed for it again')
  t.equal(counter(await metrics(), 'kvrouter_zmq_total', 'sink_errors'), 0)
})

t.test('data_parallel_size 2: rank r is read on the endpoint port + r', async (t) => {
  const { etcd, client } = await etcdAndClient(t)
  // engines 0 and 1 of a fleet stand for the two ranks (PUB base, base + 1; replay base + 2, base + 3)
  const { fleet, base } = await zmqFleet(t, { numWorkers: 2, numGpuBlocks: 24, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS })
  const w = await leased(client, 2)
  await w.instance(endpoints(base, 2, 0))
  const app = await startRouter(t, etcd.url)
  // only the second engine serves: what the index holds came through the port + 1 listener
  await serveOnly(fleet, 1, 100)
  t.equal(cachedOf(fleet, 0).size, 0, 'the first engine cached nothing')
  t.same(await holdsEngine(app, w.id, fleet, 1, "the second rank's engine indexed"), cachedOf(fleet, 1))
  const listed = JSON.parse(await get(app, '/v1/workers')) as { workers: { dp_size: number; ranks: { index: string }[] }[] }
  t.match(listed.workers, [{ dp_size: 2, ranks: [{ index: 'exact' }, { index: 'exact' }] }], 'both ranks listened to, both replays complete')
  await w.lease.revoke()
})

t.test('invalid kv-events fields: the worker is registered without events, counted and warned about once per value', async (t) => {
  const { etcd, client } = await etcdAndClient(t)
  const { fleet, base } = await zmqFleet(t, { numWorkers: 1, numGpuBlocks: 24, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS })
  const capture = captureProcessLog()
  const said = (): string[] => warnings(capture, 'KVR_KV_EVENTS_INVALID')
  const w = await leased(client)
  // the engine's own bind address, copied from its --kv-events-config
  await w.instance({ kv_events_endpoint: `tcp://*:${base}` })
  const app = await startRouter(t, etcd.url)
  const metrics = async () => get(app, '/metrics')
  const listed = JSON.parse(await get(app, '/v1/workers')) as { workers: { id: number; source: string }[] }
  t.match(listed.workers, [{ source: 'etcd' }], 'registered, routable')
  t.equal(counter(await metrics(), 'kvrouter_etcd_total', 'bad_kv_events'), 1)
  t.equal(counter(await metrics(), 'kvrouter_zmq_total', 'batches'), -1, 'no listener was ever started')
  await waitUntil('the warning', () => said().length === 1)
  t.match(said()[0], /kv_events_endpoint must be tcp:\/\/HOST:PORT, got "tcp:\/\/\*:\d+"; tcp:\/\/\*:PORT is where the engine binds/)

  // the same record again is not counted again; a fixed one is read
  await w.instance({ kv_events_endpoint: `tcp://*:${base}` })
  await w.instance({ kv_events_endpoint: `tcp://127.0.0.1:${base}`, replay_endpoint: `tcp://127.0.0.1:${base + 1}` })
  const rng = new Rng(3)
  await drive(fleet, rng, 10)
  await holdsEngine(app, w.id, fleet, 0, 'indexed once the record is fixed')
  t.equal(counter(await metrics(), 'kvrouter_etcd_total', 'bad_kv_events'), 1, 'counted once per value')

  // broken again, another way: the listener stops, the worker stays
  await w.instance({ kv_events_endpoint: `tcp://127.0.0.1:${base}`, kv_events_topic: 5 })
  await waitUntil('counted', async () => counter(await metrics(), 'kvrouter_etcd_total', 'bad_kv_events') === 2)
  t.match(said()[1], /kv_events_topic must be a string/)
  // discovery counts the record at once; the router re-registers the worker, and stops its
  // listener, just after
  let batches = -1
  await waitUntil(
    'no batch read while the engine serves',
    async () => {
      const b = counter(await metrics(), 'kvrouter_zmq_total', 'batches')
      if (b === batches) return true
      batches = b
      await drive(fleet, rng, 3)
      await new Promise((r) => setTimeout(r, 200))
      return false
    },
    15_000,
    0,
  )
  await drive(fleet, rng, 10)
  await new Promise((r) => setTimeout(r, 300))
  t.equal(counter(await metrics(), 'kvrouter_zmq_total', 'batches'), batches, 'its listener stopped')
  t.equal((JSON.parse(await get(app, '/v1/workers')) as { workers: unknown[] }).workers.length, 1, 'still registered')
  t.equal(said().length, 2)
  await w.lease.revoke()
})

t.test('discovery: a changed endpoint is an update, the same record again is not', async (t) => {
  const { etcd, client } = await etcdAndClient(t)
  const d = await EtcdDiscovery.start({ url: etcd.url, namespace: NS, component: COMP, endpoint: EP })
  t.teardown(() => d.close())
  const updates: DiscoveredWorker[] = []
  d.on('updated', (w: DiscoveredWorker) => updates.push(w))
  const w = await leased(client)
  const added = once(d, 'added')
  await w.instance(endpoints(5000, 1, 0))
  await added
  const puts = d.counters.puts
  await w.instance(endpoints(5000, 1, 0))
  await w.instance({ ...endpoints(5000, 1, 0), replay_endpoint: 'tcp://127.0.0.1:6001' })
  await waitUntil('both puts seen', () => d.counters.puts === puts + 2)
  t.same(
    updates.map((u) => u.kvEvents),
    [{ endpoint: 'tcp://127.0.0.1:5000', replay: 'tcp://127.0.0.1:6001', topic: 'kv-events' }],
    'one update, for the changed replay endpoint',
  )
  await w.lease.revoke()
})

t.test('a mocker fleet with --etcd-url and --kv-events-zmq names its publishers in its own records, as a router reaches them', async (t) => {
  const { etcd } = await etcdAndClient(t)
  const { MockerFleet } = await import('../../src/sim/mocker/fleet.js')
  let fleet: MockerFleet | undefined
  let base = 0
  for (let attempt = 0; fleet === undefined; attempt++) {
    base = 20000 + Math.floor(Math.random() * 20000) * 2
    try {
      // bound on every interface: the record must carry an address a router can dial
      fleet = await MockerFleet.start({
        numWorkers: 2,
        blockSize: BS,
        numGpuBlocks: 24,
        speedupRatio: 0,
        etcdUrl: etcd.url,
        kvEventsZmq: `tcp://*:${base}`,
        kvEventsReplayZmq: `tcp://*:${base + 2}`,
      })
    } catch (err) {
      if (attempt > 10 || !/cannot bind/.test((err as Error).message)) throw err
    }
  }
  const f = fleet
  t.teardown(() => f.close())
  const app = await startRouter(t, etcd.url)
  const rng = new Rng(5)
  await drive(f, rng, 12)
  for (let i = 0; i < 2; i++) {
    const id = (f.workers[i] as MockerWorker).workerId
    t.same(await holdsEngine(app, id, f, i, `engine ${i} indexed through the endpoints in its record`), cachedOf(f, i))
  }
  const listed = JSON.parse(await get(app, '/v1/workers')) as { workers: { kv_events_endpoint: string; replay_endpoint: string }[] }
  t.same(listed.workers.map((w) => [w.kv_events_endpoint, w.replay_endpoint]).sort(), [
    [`tcp://127.0.0.1:${base}`, `tcp://127.0.0.1:${base + 2}`],
    [`tcp://127.0.0.1:${base + 1}`, `tcp://127.0.0.1:${base + 3}`],
  ])
})
