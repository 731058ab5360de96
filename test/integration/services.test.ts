// Integration test of the services launcher (src/deploy/services.ts):
// real nats-server (JetStream), etcd and haproxy processes, real clients.
import t from 'tap'
import { AckPolicy, DeliverPolicy, Events, StorageType, connect, type NatsConnection } from 'nats'
import { Etcd3 } from 'etcd3'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { haproxyBindPorts, renderHaproxyConfig } from '../../src/deploy/haproxy.js'
import { getFreePort, haproxyConfigPath, startEtcd, startHaproxy, startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'

const enc = new TextEncoder()
const dec = new TextDecoder()

/** Collects events and lets the test wait (with a timeout) for one matching a predicate. */
class Recorder<T> {
  readonly items: T[] = []
  #waiters: Array<{ match: (item: T) => boolean; resolve: (item: T) => void }> = []

  push(item: T): void {
    this.items.push(item)
    this.#waiters = this.#waiters.filter((w) => {
      if (!w.match(item)) return true
      w.resolve(item)
      return false
    })
  }

  waitFor(what: string, match: (item: T) => boolean, timeoutMs = 10_000): Promise<T> {
    const found = this.items.find(match)
    if (found !== undefined) return Promise.resolve(found)
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((w) => w.resolve !== done)
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; saw ${JSON.stringify(this.items)}`))
      }, timeoutMs)
      const done = (item: T): void => {
        clearTimeout(timer)
        resolve(item)
      }
      this.#waiters.push({ match, resolve: done })
    })
  }
}

t.test('NATS: JetStream publish/consume, then restart under a connected client', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())

  t.equal(nats.jetstream, true, 'JetStream enabled by default')
  t.equal(nats.url, `nats://127.0.0.1:${nats.port}`, 'url points at the loopback port')
  t.equal(nats.state, 'running')

  const nc: NatsConnection = await connect({
    servers: nats.url,
    name: 'kvr-services-test',
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
    reconnectJitter: 0,
  })
  t.teardown(async () => {
    if (!nc.isClosed()) await nc.close()
  })
  const statuses = new Recorder<string>()
  void (async () => {
    for await (const s of nc.status()) statuses.push(String(s.type))
  })()

  // (a) stream + publish + durable pull consumer
  const stream = 'KVR_SERVICES_TEST'
  const jsm = await nc.jetstreamManager()
  await jsm.streams.add({ name: stream, subjects: ['kvr.services.>'], storage: StorageType.File })
  const js = nc.jetstream()

  const sent = [
    { subject: 'kvr.services.a', body: 'alpha' },
    { subject: 'kvr.services.b', body: 'beta' },
    { subject: 'kvr.services.c', body: 'gamma' },
  ]
  const acks: Array<{ stream: string; seq: number; duplicate: boolean }> = []
  for (const m of sent) {
    const ack = await js.publish(m.subject, enc.encode(m.body))
    acks.push({ stream: ack.stream, seq: ack.seq, duplicate: ack.duplicate })
  }
  t.same(
    acks,
    [
      { stream, seq: 1, duplicate: false },
      { stream, seq: 2, duplicate: false },
      { stream, seq: 3, duplicate: false },
    ],
    'publish acks carry stream sequence 1..3',
  )

  await jsm.consumers.add(stream, {
    durable_name: 'reader',
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
  })
  const consumer = await js.consumers.get(stream, 'reader')

  const got: Array<{ subject: string; body: string; seq: number; deliverySeq: number; deliveries: number }> = []
  for await (const m of await consumer.fetch({ max_messages: 3, expires: 5_000 })) {
    got.push({
      subject: m.subject,
      body: dec.decode(m.data),
      seq: m.seq,
      deliverySeq: m.info.deliverySequence,
      deliveries: m.info.deliveryCount,
    })
    await m.ackAck()
  }
  t.same(
    got,
    sent.map((m, i) => ({ subject: m.subject, body: m.body, seq: i + 1, deliverySeq: i + 1, deliveries: 1 })),
    'consumer got exactly the published messages, in order, with their sequences',
  )
  const ci = await jsm.consumers.info(stream, 'reader')
  t.equal(ci.num_ack_pending, 0, 'all messages acked')
  t.equal(ci.num_pending, 0, 'nothing left to deliver')
  t.equal(ci.delivered.stream_seq, 3)

  // (b) restart the server on the same port/data dir under the connected client
  const pidBefore = nats.pid
  await nats.restart()
  t.equal(nats.state, 'running')
  t.not(nats.pid, pidBefore, 'a new server process is running')
  t.equal(nats.url, `nats://127.0.0.1:${nats.port}`, 'same url after restart')

  await statuses.waitFor('client reconnect', (s) => s === Events.Reconnect)
  const disconnectAt = statuses.items.indexOf(Events.Disconnect)
  const reconnectAt = statuses.items.indexOf(Events.Reconnect)
  t.ok(disconnectAt >= 0 && disconnectAt < reconnectAt, `client saw disconnect then reconnect (${statuses.items.join(',')})`)

  // the old client works again: a JetStream publish is a request/reply round trip
  const ack4 = await js.publish('kvr.services.d', enc.encode('delta'))
  t.equal(ack4.seq, 4, 'file-backed stream survived the restart (next seq is 4)')

  // a brand-new connection on the same URL works and sees the same stream
  const nc2 = await connect({ servers: nats.url, name: 'kvr-services-test-2' })
  t.teardown(async () => {
    if (!nc2.isClosed()) await nc2.close()
  })
  const info = await (await nc2.jetstreamManager()).streams.info(stream)
  t.equal(info.state.messages, 4)
  t.equal(info.state.last_seq, 4)

  // the durable consumer (and its acks) survived too: only the new message is delivered
  const after: Array<{ body: string; seq: number; deliveries: number }> = []
  const consumer2 = await nc2.jetstream().consumers.get(stream, 'reader')
  for await (const m of await consumer2.fetch({ max_messages: 1, expires: 5_000 })) {
    after.push({ body: dec.decode(m.data), seq: m.seq, deliveries: m.info.deliveryCount })
    await m.ackAck()
  }
  t.same(after, [{ body: 'delta', seq: 4, deliveries: 1 }], 'only the post-restart message is delivered')
})

t.test('etcd: lease + watch, revoke, restart keeps data', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())

  t.equal(etcd.url, `http://127.0.0.1:${etcd.port}`)
  t.not(etcd.peerPort, etcd.port, 'distinct peer port')
  t.equal(etcd.state, 'running')

  let client: Etcd3 | undefined = new Etcd3({ hosts: etcd.url })
  const closeClient = (): void => {
    client?.close()
    client = undefined
  }
  t.teardown(closeClient)
  const c = client

  const prefix = 'kvr/services-test/'
  const leasedKey = `${prefix}leased`
  const durableKey = `${prefix}durable`

  type Ev = { type: 'put' | 'delete'; key: string; value: string; lease: string; modRevision: string }
  const events = new Recorder<Ev>()
  const toEv = (type: Ev['type'], kv: { key: Buffer; value: Buffer; lease: string; mod_revision: string }): Ev => ({
    type,
    key: kv.key.toString(),
    value: kv.value.toString(),
    lease: String(kv.lease),
    modRevision: String(kv.mod_revision),
  })
  const watcher = await c.watch().prefix(prefix).create()
  const watchErrors: string[] = []
  watcher.on('put', (kv) => events.push(toEv('put', kv)))
  watcher.on('delete', (kv) => events.push(toEv('delete', kv)))
  watcher.on('error', (err) => watchErrors.push(err.message))
  t.teardown(() => watcher.cancel())

  // (c) lease-bound key shows up through the watch
  const lease = c.lease(60) // long TTL: only the explicit revoke may delete the key
  const leaseId = await lease.grant()
  t.match(leaseId, /^\d+$/, 'lease granted')
  await lease.put(leasedKey).value('instance-1')

  const put = await events.waitFor('put of leased key', (e) => e.type === 'put' && e.key === leasedKey)
  t.equal(put.value, 'instance-1')
  t.equal(put.lease, leaseId, 'watched key is attached to our lease')
  t.equal(await c.get(leasedKey).string(), 'instance-1')

  await c.put(durableKey).value('stays')
  const durablePut = await events.waitFor('put of durable key', (e) => e.type === 'put' && e.key === durableKey)
  t.equal(durablePut.lease, '0', 'durable key has no lease')

  await lease.revoke()
  const del = await events.waitFor('delete of leased key', (e) => e.type === 'delete' && e.key === leasedKey)
  t.equal(del.key, leasedKey)
  t.equal(await c.get(leasedKey).string(), null, 'leased key is gone after revoke')
  t.equal(await c.get(durableKey).string(), 'stays', 'non-lease key untouched by revoke')
  t.same(
    events.items.map((e) => [e.type, e.key]),
    [
      ['put', leasedKey],
      ['put', durableKey],
      ['delete', leasedKey],
    ],
    'watch saw exactly put, put, delete',
  )
  t.same(watchErrors, [], 'no watch errors')

  // (d) restart etcd (same ports, same data dir); the non-lease key survives
  await watcher.cancel()
  closeClient()
  const pidBefore = etcd.pid
  await etcd.restart()
  t.equal(etcd.state, 'running')
  t.not(etcd.pid, pidBefore, 'a new etcd process is running')

  const c2 = new Etcd3({ hosts: etcd.url })
  t.teardown(() => c2.close())
  const res = await c2.get(durableKey).exec()
  t.equal(res.kvs.length, 1, 'durable key present after restart')
  t.equal(res.kvs[0]?.value.toString(), 'stays')
  t.equal(String(res.kvs[0]?.mod_revision), durablePut.modRevision, 'same revision as before the restart')
  t.equal(await c2.get(leasedKey).string(), null, 'revoked key still gone after restart')
})

t.test('HAProxy: the deployment configuration on loopback; health checks on /ready; stop removes its directory', async (t) => {
  const template = readFileSync(haproxyConfigPath(), 'utf8')
  t.same(haproxyBindPorts(template), [8000, 8404], "the clients' frontend, then the stats one")
  const rendered = renderHaproxyConfig(
    template,
    new Map([
      [8000, 1001],
      [8404, 1002],
    ]),
    [
      { name: 'a', port: 2001 },
      { name: 'b', port: 2002 },
    ],
  )
  t.match(rendered, /\n {2}bind 127\.0\.0\.1:1001\n/)
  t.match(rendered, /\n {2}bind 127\.0\.0\.1:1002\n/)
  t.match(rendered, /\n {2}server a 127\.0\.0\.1:2001\n {2}server b 127\.0\.0\.1:2002\n/, 'one server line per backend, in place of the deployment’s')
  t.notMatch(rendered, /resolvers|router-1:8000/, "Docker's DNS is gone")
  t.match(rendered, /http-check send meth GET uri \/ready/, 'the rest as it is')

  // two backends: one ready, one not
  const backend = (ready: boolean) =>
    createServer((req, res) => {
      res.statusCode = req.url === '/ready' && !ready ? 503 : 200
      res.end('ok')
    })
  const up = backend(true)
  const down = backend(false)
  for (const s of [up, down]) {
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
    t.teardown(() => new Promise<void>((r) => s.close(() => r())))
  }
  const lb = await startHaproxy({
    backends: [
      { name: 'up', port: (up.address() as AddressInfo).port },
      { name: 'down', port: (down.address() as AddressInfo).port },
    ],
  })
  t.teardown(() => lb.stop())
  t.equal(lb.state, 'running')
  await waitUntil('the unready backend DOWN', async () => (await lb.serverStatus()).get('down') === 'DOWN', 15_000, 100)
  t.equal((await lb.serverStatus()).get('up'), 'UP')
  for (let i = 0; i < 3; i++) {
    const res = await fetch(`${lb.url}/anything`)
    await res.text()
    t.same([res.status, res.headers.get('x-router-replica')], [200, 'up'], 'answered by the ready one, named')
  }
  const dir = lb.dataDir
  await lb.stop()
  t.equal(lb.state, 'stopped')
  t.notOk(existsSync(dir), 'its directory is removed')
})

t.test("a server that dies on its own is reported to its starter; HAProxy on a port of the caller's choosing", async (t) => {
  const parent = mkdtempSync(join(tmpdir(), 'kvr-services-parent-'))
  t.teardown(() => rmSync(parent, { recursive: true, force: true }))
  const exits: string[] = []
  const nats = await startNats({ jetstream: false, parentDir: parent, onExit: (how) => exits.push(how) })
  t.teardown(() => nats.stop())
  t.equal(dirname(nats.dataDir), parent, 'its directory is made where the starter says')
  await nats.kill('SIGTERM')
  t.same(exits, [], 'a kill() it was asked for is not reported')
  await nats.start()
  const pid = nats.pid
  if (pid === undefined) return t.fail('no pid')
  process.kill(pid, 'SIGKILL')
  await waitUntil('the exit reported', async () => exits.length > 0, 10_000, 20)
  t.same(exits, ['signal SIGKILL'], 'how it exited')
  t.equal(nats.state, 'down')

  const port = await getFreePort()
  const lb = await startHaproxy({ backends: [{ name: 'none', port: await getFreePort() }], port, parentDir: parent })
  t.teardown(() => lb.stop())
  t.equal(lb.url, `http://127.0.0.1:${port}`, "the clients' frontend on the given port")
  t.not(lb.statsUrl, lb.url, 'the stats frontend on a free one')
  t.equal((await fetch(`${lb.statsUrl}/stats;csv`)).status, 200)
})
