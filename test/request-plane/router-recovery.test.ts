// A router against a real etcd chooses the request plane for a worker whose instance record
// names a TCP address: its worker query goes to that worker's `worker_kv_indexer_query_dp0`
// endpoint over TCP (a worker written in the test), and the dump lands in the router's index.
import t from 'tap'
import { Etcd3 } from 'etcd3'
import { startEtcd } from '../../src/deploy/services.js'
import { cardsPrefix, instancesPrefix } from '../../src/transport/dynamo-names.js'
import { parseServeConfig } from '../../src/config.js'
import { Router } from '../../src/core/router.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { startTestWorker } from '../helpers/dynamo-tcp-worker.js'
import { canon, ev } from '../helpers/recovery.js'
import { waitUntil } from '../helpers/wait.js'

t.test('an etcd record with a TCP transport: recovery over the request plane', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const lease = client.lease(10)
  const id = BigInt(await lease.grant())
  const hex = id.toString(16)
  const worker = await startTestWorker((req, ack, dial) => {
    ack()
    const probe = req.body.toString().includes('"start_event_id":18446744073709551615')
    const answer = probe
      ? '{"TooNew":{"requested_start":18446744073709551615,"requested_end":null,"newest_available":1}}'
      : `{"TreeDump":[${encodeRouterEvent(ev(id, 0, 1, null))},${encodeRouterEvent(ev(id, 1, 2, 1))}]}`
    void dial().then((h) => {
      h.send(Buffer.concat([zeroChecksumData(`{"data":${answer},"complete_final":false}`)]))
      h.finish()
    })
  })
  t.teardown(() => worker.close())
  const cfg = parseServeConfig(
    ['--router-event-threads', '1', '--router-health-probe-interval-secs', '0', '--router-block-size', '64', '--etcd-url', etcd.url],
    {},
  )
  if (cfg === 'help') throw new Error('unexpected help')
  const router = await Router.start(cfg)
  t.teardown(() => router.close())
  await lease
    .put(`${instancesPrefix('dynamo', 'backend', 'generate')}${hex}`)
    .value(JSON.stringify({ http_url: 'http://127.0.0.1:9', transport: { tcp: `127.0.0.1:${worker.port}/${hex}/generate` } }))
  await lease.put(`${cardsPrefix('dynamo', 'backend', 'generate')}${hex}`).value(JSON.stringify({ kv_cache_block_size: 64 }))
  t.teardown(() =>
    lease.revoke().then(
      () => undefined,
      () => undefined,
    ),
  )
  await waitUntil('the dump applied', () => router.recovery?.counters.dumps === 1, 15_000)
  t.equal(router.registry.get(id)?.requestPlane, `127.0.0.1:${worker.port}/${hex}/generate`)
  t.same(
    worker.requests.map((r) => r.path),
    [`${hex}/worker_kv_indexer_query_dp0`, `${hex}/worker_kv_indexer_query_dp0`],
    'the probe and the dump, at the sibling endpoint',
  )
  t.same(canon(await router.pool.overlapScores([1n, 2n], { readYourWrites: true })), [`${id}:0=2/2`])
  const metrics = await router.metrics.registry.getSingleMetricAsString('kvrouter_request_plane_total')
  t.match(metrics, /kvrouter_request_plane_total\{what="streams"\} 2/)
})

/** A data-only two-part message with a zero checksum (a release build's), written by hand. */
function zeroChecksumData(body: string): Buffer {
  const b = Buffer.from(body)
  const prefix = Buffer.alloc(24)
  prefix.writeBigUInt64BE(BigInt(b.length), 8)
  return Buffer.concat([prefix, b])
}
