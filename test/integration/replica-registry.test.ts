// The replica registry against a real etcd (and replica sync over a real nats-server), with the
// routers in this process: each replica's key under its lease, whose id is its router id; both
// listed in GET /v1/replicas; a malformed record ignored and counted; a lease revoked behind a
// replica's back is taken again under the same router id; a replica that stops leaves at once.
import t from 'tap'
import type { Test } from 'tap'
import { Etcd3 } from 'etcd3'
import { startEtcd, startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { parseServeConfig } from '../../src/config.js'
import { Router } from '../../src/core/router.js'
import { buildApp } from '../../src/http/server.js'
import type { App } from '../../src/http/server.js'
import { replicasPrefix } from '../../src/transport/replica-registry.js'

const nats = await startNats({ jetstream: false })
t.teardown(() => nats.stop())
const etcd = await startEtcd()
t.teardown(() => etcd.stop())
const client = new Etcd3({ hosts: etcd.url })
t.teardown(() => client.close())
const PREFIX = replicasPrefix('dynamo', 'backend')

interface Replica {
  router: Router
  app: App
  stop: () => Promise<void>
  get: (path: string) => Promise<{ status: number; text: string; body: Record<string, unknown> }>
}

async function replica(t: Test, url: string): Promise<Replica> {
  // no health probes: nothing listens at the workers' addresses, and probes would take them out of routing
  const args = [
    '--router-event-threads',
    '1',
    '--no-router-event-recovery',
    '--router-health-probe-interval-secs',
    '0',
    '--router-block-size',
    '16',
    '--nats-url',
    nats.url,
    '--etcd-url',
    etcd.url,
  ]
  args.push('--router-replica-sync', '--worker', '1=http://127.0.0.1:9001')
  const cfg = parseServeConfig(args, {})
  if (cfg === 'help') throw new Error('help')
  const router = await Router.start(cfg, { replica: { heartbeatMs: 100, silenceMs: 1500 }, registry: { ttlSecs: 2 } })
  const app = await buildApp({ router, tokenizer: null })
  let stopping: Promise<void> | null = null
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      await app.shutdown(100)
      await router.close()
    })())
  t.teardown(stop)
  await router.advertise(url)
  const get = async (path: string): Promise<{ status: number; text: string; body: Record<string, unknown> }> => {
    const r = await app.fastify.inject({ method: 'GET', url: path })
    return { status: r.statusCode, text: r.body, body: r.json() as Record<string, unknown> }
  }
  return { router, app, stop, get }
}

const peers = (body: Record<string, unknown>): Record<string, unknown>[] => body['replicas'] as Record<string, unknown>[]

t.test('replicas register under their leases, list each other, survive a lost lease and leave when they stop', async (t) => {
  const a = await replica(t, 'http://router-a:8000')
  const b = await replica(t, 'http://router-b:8000')
  const ida = a.router.replicas?.routerId as bigint
  const idb = b.router.replicas?.routerId as bigint
  t.equal(a.router.replicaRegistry?.routerId, ida, 'the registry lease is the router id')

  // both keys, each under the lease named by its router id, with the advertised URL
  await waitUntil('both records carry their URL', async () => {
    const kvs = (await client.getAll().prefix(PREFIX).exec()).kvs ?? []
    return kvs.length === 2 && kvs.every((kv) => kv.value.toString().includes('"url":"http://router-'))
  })
  for (const kv of (await client.getAll().prefix(PREFIX).exec()).kvs ?? []) {
    const id = BigInt(`0x${kv.key.toString().slice(PREFIX.length)}`)
    t.ok(id === ida || id === idb, `key ${kv.key.toString()}`)
    t.equal(kv.lease.toString(), id.toString(), 'written under the lease whose id is the router id')
    t.match(kv.value.toString(), `"router_id":${id}`)
  }

  // each lists the other as registered and alive, with its URL, ids exact
  await waitUntil('A lists B', async () =>
    peers((await a.get('/v1/replicas')).body).some((p) => p['registered'] === true && p['alive'] === true && p['url'] === 'http://router-b:8000'),
  )
  const listed = await a.get('/v1/replicas')
  t.match(listed.text, `"router_id":${idb}`)
  t.match(listed.text, `"self":{"router_id":${ida},"url":"http://router-a:8000"`)
  t.equal((listed.body['self'] as Record<string, unknown>)['registered'], true)
  const ready = await a.get('/ready')
  t.equal(ready.status, 200)
  t.match(ready.text, `"replica_sync":{"router_id":${ida},"in_step":true,"connected":true,"peers":1}`)

  // a record that is not one is counted and listed nowhere
  await client.put(`${PREFIX}zz`).value('{"router_id": 1}')
  await client.put(`${PREFIX}ff`).value('not json')
  await waitUntil('malformed counted', () => (a.router.replicaRegistry?.counters.malformed ?? 0) >= 2)
  t.equal(a.router.replicaRegistry?.replicas.size, 2)
  await client.delete().key(`${PREFIX}zz`)
  await client.delete().key(`${PREFIX}ff`)

  // B books; its lease is revoked behind its back: A drops B, then B registers again under the
  // same router id and A holds its booking again
  await b.router.route({ tokens: Array.from({ length: 32 }, (_, i) => i + 1) })
  await waitUntil('A holds B’s booking', () => a.router.scheduler.sequences.remoteSize === 1, 2000)
  const kvb = ((await client.getAll().prefix(PREFIX).exec()).kvs ?? []).find((kv) => kv.key.toString() === PREFIX + idb.toString(16))
  await client.leaseClient.leaseRevoke({ ID: kvb?.lease.toString() ?? '0' })
  await waitUntil('A dropped B', () => a.router.scheduler.sequences.remoteSize === 0, 5000)
  await waitUntil(
    'B registered again, same id',
    () => (b.router.replicaRegistry?.counters.leasesLost ?? 0) >= 1 && a.router.replicaRegistry?.replicas.has(idb.toString()) === true,
    10_000,
  )
  await waitUntil('and its booking is held again', () => a.router.scheduler.sequences.remoteSize === 1, 5000)
  t.equal(b.router.replicas?.routerId, idb, 'the router id stays')

  // B stops: gone from etcd and from A's list at once
  await b.stop()
  await waitUntil('B left', async () => peers((await a.get('/v1/replicas')).body).every((p) => p['alive'] === false && p['registered'] === false), 3000)
  t.same(await client.getAll().prefix(PREFIX).keys(), [PREFIX + ida.toString(16)])
  t.equal(a.router.scheduler.sequences.remoteSize, 0)
})

t.test('without replica sync, GET /v1/replicas says so', async (t) => {
  const cfg = parseServeConfig(['--router-event-threads', '1', '--no-router-event-recovery'], {})
  if (cfg === 'help') throw new Error('help')
  const router = await Router.start(cfg)
  const app = await buildApp({ router, tokenizer: null })
  t.teardown(async () => {
    await app.shutdown(100)
    await router.close()
  })
  const r = await app.fastify.inject({ method: 'GET', url: '/v1/replicas' })
  t.equal(r.statusCode, 200)
  t.same(r.json(), { replica_sync: false, self: null, replicas: [] })
  t.equal((await app.fastify.inject({ method: 'GET', url: '/ready' })).json().replica_sync, null)
})
