// Process level: two `kv-router serve --router-replica-sync` replicas with a real nats-server and
// etcd, and simulated engines registered in etcd. A stream through replica A is booked on B too;
// B, started while it streams, holds that booking by the time its /ready says ready; each lists
// the other in GET /v1/replicas and in etcd under its lease; the stream's end frees it on B; B
// stopped leaves A's list and the registry.
import t from 'tap'
import type { Test } from 'tap'
import { spawn } from 'node:child_process'
import { Etcd3 } from 'etcd3'
import { startEtcd, startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { cliArgv } from '../helpers/cli.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { replicasPrefix } from '../../src/transport/replica-registry.js'

const BS = 16

const nats = await startNats({ jetstream: false })
t.teardown(() => nats.stop())
const etcd = await startEtcd()
t.teardown(() => etcd.stop())
const client = new Etcd3({ hosts: etcd.url })
t.teardown(() => client.close())
// engines slow enough that a long answer streams for seconds
const fleet = await MockerFleet.start({
  numWorkers: 2,
  blockSize: BS,
  speedupRatio: 1,
  numGpuBlocks: 4096,
  natsUrl: nats.url,
  etcdUrl: etcd.url,
  modelName: 'sim',
})
t.teardown(() => fleet.close())

interface Replica {
  base: string
  id: string
  stop: () => Promise<number | null>
  get: (path: string) => Promise<{ status: number; body: Record<string, unknown>; text: string }>
}

async function router(t: Test): Promise<Replica> {
  const args = [
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-block-size',
    String(BS),
    '--tokenizer',
    'bytes',
    '--router-event-threads',
    '1',
    '--model-name',
    'sim',
  ]
  args.push('--nats-url', nats.url, '--etcd-url', etcd.url, '--router-replica-sync', '--router-replica-catch-up-secs', '10')
  const p = spawn(process.execPath, cliArgv(args), { env: { PATH: process.env.PATH } })
  let out = ''
  let err = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  p.stderr.on('data', (d: Buffer) => (err += d.toString()))
  const exited = new Promise<number | null>((r) => p.on('close', r))
  let stopped = false
  const stop = async (): Promise<number | null> => {
    if (!stopped) p.kill('SIGTERM')
    stopped = true
    return exited
  }
  t.teardown(stop)
  await waitUntil(`listening (${err})`, () => /listening on http:\/\/\S+ .*replica sync as router \d+/.test(out), 20_000)
  const m = /listening on (http:\/\/\S+) .*replica sync as router (\d+)/.exec(out) as RegExpExecArray
  const base = m[1] as string
  const get = async (path: string): Promise<{ status: number; body: Record<string, unknown>; text: string }> => {
    const r = await fetch(base + path)
    const text = await r.text()
    return { status: r.status, body: (text.startsWith('{') ? JSON.parse(text) : {}) as Record<string, unknown>, text }
  }
  return { base, id: m[2] as string, stop, get }
}

const self = (body: Record<string, unknown>): Record<string, unknown> => body['self'] as Record<string, unknown>
const peers = (body: Record<string, unknown>): Record<string, unknown>[] => body['replicas'] as Record<string, unknown>[]
/** Router ids as text: a u64 above 2^53 reads back as a rounded number through JSON.parse. */
const idIn = (text: string, id: string): boolean => text.includes(`"router_id":${id}`)

t.test('two replicas share a stream’s booking, catch up before ready, list and drop each other', async (t) => {
  const a = await router(t)
  await waitUntil('A ready, alone', async () => (await a.get('/ready')).status === 200, 10_000)
  await waitUntil('A knows both workers', async () => ((await a.get('/v1/workers')).body['workers'] as unknown[]).length === 2, 10_000)

  // a long stream through A: booked, first token seen
  const ac = new AbortController()
  const res = await fetch(`${a.base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'sim',
      prompt: 'a prompt long enough to fill a few blocks of sixteen tokens each, and then some more',
      max_tokens: 3000,
      stream: true,
    }),
    signal: ac.signal,
  })
  t.equal(res.status, 200)
  const reader = (res.body as ReadableStream<Uint8Array>).getReader()
  const first = await reader.read()
  t.notOk(first.done, 'streaming')
  t.equal(self((await a.get('/v1/replicas')).body)['bookings'], 1)

  // B starts while A streams: by the time it is ready it holds A's booking
  const b = await router(t)
  let readyAt: Record<string, unknown> | null = null
  await waitUntil(
    'B ready',
    async () => {
      const r = await b.get('/ready')
      if (r.status !== 200) return false
      readyAt = self((await b.get('/v1/replicas')).body)
      return true
    },
    15_000,
    5,
  )
  t.equal(readyAt?.['remote_bookings'], 1, 'A’s booking held the moment B is ready')
  t.equal((readyAt?.['last_catch_up'] as Record<string, unknown> | undefined)?.['outcome'], 'complete')
  const ready = await b.get('/ready')
  t.equal((ready.body['replica_sync'] as Record<string, unknown>)['in_step'], true)
  t.ok(idIn(ready.text, b.id), '/ready names the router id')
  const onB = await b.get('/v1/workers')
  t.equal(
    (onB.body['workers'] as { ranks: { in_flight: number }[] }[]).reduce((s, w) => s + (w.ranks[0]?.in_flight ?? 0), 0),
    1,
    'B counts the stream on its worker',
  )

  // each lists the other, registered in etcd under its lease with its URL
  await waitUntil(
    'each lists the other',
    async () => peers((await a.get('/v1/replicas')).body).some((p) => p['alive'] === true && p['registered'] === true && p['url'] === b.base),
    5000,
  )
  const fromB = await b.get('/v1/replicas')
  const aOnB = peers(fromB.body)[0] as Record<string, unknown>
  t.same([aOnB['kind'], aOnB['alive'], aOnB['registered'], aOnB['url'], aOnB['bookings_held']], ['kv-router', true, true, a.base, 1])
  t.ok(idIn(fromB.text, a.id), 'A’s router id, exact')
  t.type(aOnB['sync_lag_ms'], 'number')
  const keys = await client.getAll().prefix(replicasPrefix('dynamo', 'backend')).exec()
  const byKey = new Map((keys.kvs ?? []).map((kv) => [kv.key.toString(), kv]))
  for (const r of [a, b]) {
    const kv = byKey.get(replicasPrefix('dynamo', 'backend') + BigInt(r.id).toString(16))
    t.ok(kv, `router ${r.id} registered`)
    t.equal(kv?.lease.toString(), r.id, 'its router id is its lease id')
    t.match(kv?.value.toString() ?? '', `"url":"${r.base}"`)
  }
  t.match((await b.get('/metrics')).text, /kvrouter_replica_catch_up_bookings_total 1/)

  // the stream ends (the client goes away): freed on A, then on B
  ac.abort()
  await reader.cancel().catch(() => undefined)
  await waitUntil('freed on B', async () => self((await b.get('/v1/replicas')).body)['remote_bookings'] === 0, 5000)

  // B stops: A drops it at once (its goodbye, its lease revoked)
  t.equal(await b.stop(), 0)
  await waitUntil('B gone from A', async () => peers((await a.get('/v1/replicas')).body).every((p) => p['alive'] === false && p['registered'] === false), 3000)
  const left = await client.getAll().prefix(replicasPrefix('dynamo', 'backend')).keys()
  t.same(left, [replicasPrefix('dynamo', 'backend') + BigInt(a.id).toString(16)], 'only A left in etcd')
  t.match((await a.get('/metrics')).text, /kvrouter_replica_peers 0/)
})
