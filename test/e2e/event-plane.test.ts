// `kv-router serve --etcd-url` in front of a Dynamo fleet on its default ZMQ event plane: a worker
// registered in etcd with its endpoint-scoped event channel and source, publishing RouterEvents
// on its own socket; the router finds the publisher in etcd, subscribes, and its index (GET
// /v1/workers, GET /v1/kv/dump) shows the worker's blocks; the metrics count them. With
// `--event-plane nats` the same fleet's ZMQ publishers are not read.
import t from 'tap'
import type { Test } from 'tap'
import { Etcd3 } from 'etcd3'
import { Router } from '../../src/core/router.js'
import { buildApp } from '../../src/http/server.js'
import type { App } from '../../src/http/server.js'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { startEtcd } from '../../src/deploy/services.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { ev } from '../helpers/recovery.js'
import { cardsPrefix, instancesPrefix } from '../../src/transport/dynamo-names.js'
import { config } from '../http/helpers.js'
import { chain } from '../helpers/events.js'
import { waitUntil } from '../helpers/wait.js'
import { planePublisher, putGenB } from '../helpers/event-plane.js'

const NS = 'dynamo'
const COMP = 'backend'
const EP = 'generate'

async function fleet(
  t: Test,
  o: { httpUrl?: string; dpSize?: number; dpRank?: number } = {},
): Promise<{ url: string; client: Etcd3; workerId: bigint; pub: Awaited<ReturnType<typeof planePublisher>> }> {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const lease = client.lease(30)
  // its keepalive would otherwise go on asking the stopped etcd, and hold the process open
  t.teardown(() => lease.release())
  const workerId = BigInt(await lease.grant())
  const hex = workerId.toString(16)
  await lease.put(`${instancesPrefix(NS, COMP, EP)}${hex}`).value(JSON.stringify({ http_url: o.httpUrl ?? 'http://127.0.0.1:9', device_type: 'cuda' }))
  await lease
    .put(`${cardsPrefix(NS, COMP, EP)}${hex}`)
    .value(JSON.stringify({ kv_cache_block_size: 4, runtime_config: { total_kv_blocks: 64, data_parallel_size: o.dpSize ?? 2 } }))
  const pub = await planePublisher(0x5eedn)
  t.teardown(() => pub.close())
  await putGenB(lease, { ns: NS, component: COMP, endpoint: EP, publisherId: pub.publisherId, zmq: pub.endpoint, workerId, dpRank: o.dpRank ?? 1 })
  return { url: etcd.url, client, workerId, pub }
}

async function serve(t: Test, argv: string[]): Promise<{ router: Router; app: App }> {
  const router = await Router.start(config(['--router-block-size', '4', ...argv]))
  t.teardown(() => router.close())
  const app = await buildApp({ router, tokenizer: null })
  t.teardown(() => app.shutdown(1000))
  return { router, app }
}

const get = async (app: App, url: string): Promise<string> => (await app.fastify.inject({ method: 'GET', url })).body

t.test('serve --etcd-url reads the ZMQ event plane: the index shows the blocks', async (t) => {
  const { url, workerId, pub } = await fleet(t)
  const { router, app } = await serve(t, ['--etcd-url', url])
  t.ok(router.eventPlane !== null, 'the event plane is read by default')
  await pub.subscribed()
  await pub.publish(chain(workerId, null, [1, 2, 3], 1))
  await pub.publish(chain(workerId, 3, [4], 1))
  await pub.publish(chain(workerId, null, [9], 0))

  const ranks = async (): Promise<number[]> => {
    const w = (JSON.parse(await get(app, '/v1/workers')) as { workers: { id_str: string; ranks: { cached_blocks: number }[] }[] }).workers.find(
      (x) => x.id_str === String(workerId),
    )
    return w?.ranks.map((r) => r.cached_blocks) ?? []
  }
  await waitUntil('the blocks are indexed', async () => (await ranks()).join() === '1,4', 15_000, 50)
  t.same(await ranks(), [1, 4], 'rank 0 holds one block, rank 1 four')
  const dump = await get(app, `/v1/kv/dump?worker_id=${workerId}`)
  for (const h of ['100', '200', '300', '400', '900']) t.match(dump, h, `block ${h} in the dump`)

  const metrics = await get(app, '/metrics')
  t.match(metrics, /^kvrouter_event_plane_total\{what="applied"\} 3$/m)
  t.match(metrics, /^kvrouter_event_plane_subscriptions\{kind="direct"\} 1$/m)
  t.match(metrics, /^kvrouter_event_plane_dropped_total\{reason="topic"\} 0$/m)
})

t.test('serve --etcd-url --event-plane nats does not read ZMQ publishers', async (t) => {
  const { url, workerId } = await fleet(t)
  const { router, app } = await serve(t, ['--etcd-url', url, '--event-plane', 'nats'])
  t.equal(router.eventPlane, null)
  t.notMatch(await get(app, '/metrics'), /^kvrouter_event_plane_total\{/m, 'no series')
  const listed = JSON.parse(await get(app, '/v1/workers')) as { workers: { id_str: string; index: string }[] }
  t.match(
    listed.workers.find((w) => w.id_str === String(workerId)),
    { index: 'no-events' },
    'the worker is registered and waits for events from elsewhere',
  )
})

t.test("a sequence gap on the event plane rebuilds a recoverable worker's rank from its dump", async (t) => {
  // a worker answering the worker query: TooNew to the probe, its cached set as a dump otherwise
  let dump: string[] = []
  const dumps: string[] = []
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (d: Buffer) => (body += d.toString()))
    req.on('end', () => {
      res.setHeader('content-type', 'application/json')
      if (body.includes('"start_event_id":18446744073709551615')) {
        res.end('{"TooNew":{"requested_start":18446744073709551615,"requested_end":null,"newest_available":0}}')
        return
      }
      dumps.push(body)
      res.end(`{"TreeDump":[${dump.join(',')}]}`)
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => server.close())
  const httpUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const { url, workerId, pub } = await fleet(t, { httpUrl, dpSize: 1, dpRank: 0 })
  const { router, app } = await serve(t, ['--etcd-url', url, '--router-event-recovery'])
  await pub.subscribed()
  await waitUntil('the registration dump', () => dumps.length === 1)
  // event ids without a gap: only the publisher's sequence numbers tell of the loss
  await pub.publish(ev(workerId, 1, 1, null))
  // sequences 1 to 4 are lost; the worker's cache now holds blocks 1 and 9
  dump = [encodeRouterEvent(ev(workerId, 0, 1, null)), encodeRouterEvent(ev(workerId, 1, 9, 1))]
  pub.sequence = 5n
  await pub.publish(ev(workerId, 2, 2, 1))
  await waitUntil('the dump after the gap', () => dumps.length === 2, 15_000)
  t.match(dumps[1], /"worker_id":\d+,"dp_rank":0,"start_event_id":null/, 'a dump of the rank the EventSource names')
  t.equal(router.eventPlane?.counters.gaps, 1)
  await waitUntil('the dump applied', async () => (await get(app, `/v1/kv/dump?worker_id=${workerId}`)).includes('900'), 15_000, 50)
  t.equal(router.recovery?.counters.dumps, 2)
})
