// The log lines of the router's connections, against real servers: a NATS load report that does
// not decode, the NATS connection lost and back, a replica-sync message that does not decode, an
// etcd record that is not one, the etcd watch lost and back.
import t from 'tap'
import { once } from 'node:events'
import { connect } from 'nats'
import { Etcd3 } from 'etcd3'
import { startEtcd, startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { captureProcessLog } from '../helpers/log.js'
import type { LogRecord } from '../helpers/log.js'
import { activeSequencesSubject, instancesPrefix, kvMetricsSubject } from '../../src/transport/dynamo-names.js'
import { NatsIntake } from '../../src/transport/nats.js'
import { EtcdDiscovery } from '../../src/transport/etcd.js'
import { ShardPool } from '../../src/shards/pool.js'
import { Router } from '../../src/core/router.js'
import { config } from '../http/helpers.js'

const capture = captureProcessLog('info', 60_000)
const line = (cls: string): LogRecord | undefined => capture.records.find((x) => x.class === cls)

t.test('NATS: a load report that does not decode, the connection lost and back; replica sync: a message that does not decode', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const intake = await NatsIntake.start({ url: nats.url, namespace: 'dynamo', component: 'backend', pool })
  t.teardown(() => intake.close())
  const router = await Router.start(config(['--router-replica-sync', '--nats-url', nats.url]))
  t.teardown(() => router.close())
  const pub = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 })
  t.teardown(() => pub.close())
  pub.publish(kvMetricsSubject('dynamo'), 'not a load report')
  pub.publish(activeSequencesSubject('dynamo', 'backend'), '{"request_id":')
  await pub.flush()
  await waitUntil('the lines', () => line('nats_metrics_malformed') !== undefined && line('replica_malformed') !== undefined)
  t.match(line('nats_metrics_malformed'), { level: 'warn', subject: 'namespace.dynamo.kv_metrics', bytes: 17, suppressed: 0 })
  t.match(line('replica_malformed'), { level: 'warn', what: 'a booking event', error: String })

  const back = once(intake, 'reconnected')
  await nats.restart()
  await back
  await waitUntil('the reconnection lines', () => line('nats_reconnected') !== undefined && line('replica_nats_reconnected') !== undefined, 15_000)
  t.match(line('nats_disconnected'), { level: 'warn', server: String })
  t.match(line('nats_reconnected'), { level: 'info', server: String })
  t.match(line('replica_nats_disconnected'), { level: 'warn' })
})

t.test('etcd: a record that is not one, the watch lost and back', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const disco = await EtcdDiscovery.start({ url: etcd.url, namespace: 'dynamo', component: 'backend', endpoint: 'generate' })
  t.teardown(() => disco.close())
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const key = `${instancesPrefix('dynamo', 'backend', 'generate')}1a`
  await client.put(key).value('{not json')
  await waitUntil('the malformed line', () => line('etcd_malformed') !== undefined)
  t.match(line('etcd_malformed'), { level: 'warn', key, error: String })
  const reconnected = once(disco, 'reconnected')
  await etcd.restart()
  await reconnected
  t.match(line('etcd_disconnected'), { level: 'warn' })
  await waitUntil('the reconnection line', () => line('etcd_reconnected') !== undefined)
  t.match(line('etcd_reconnected'), { level: 'info', workers: 0 })
})
