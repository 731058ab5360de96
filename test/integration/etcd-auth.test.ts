// etcd with authentication on: credentials in an --etcd-url (`http://user:password@host:port`)
// are etcd's user and password, for the router's discovery and the mocker's registration alike;
// a wrong password is refused with an error that does not show it.
import t from 'tap'
import { Etcd3 } from 'etcd3'
import { startEtcd } from '../../src/deploy/services.js'
import { EtcdDiscovery } from '../../src/transport/etcd.js'
import { EtcdRegistrar } from '../../src/sim/mocker/registration.js'

const NS = 'dynamo'
const COMP = 'backend'
const EP = 'generate'
const PASSWORD = 's3cret-pw'

t.test('an --etcd-url with credentials registers and discovers on an etcd that requires them', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const admin = new Etcd3({ hosts: etcd.url })
  await admin.role('root').create()
  await admin.user('root').create(PASSWORD)
  await admin.user('root').addRole('root')
  await admin.auth.authEnable()
  admin.close()
  const withAuth = etcd.url.replace('http://', `http://root:${PASSWORD}@`)

  // without credentials etcd refuses, so what follows works only with them
  const anonymous = new Etcd3({ hosts: etcd.url })
  await t.rejects(anonymous.get('v1/instances/').exists(), 'etcd requires a user now')
  anonymous.close()

  const reg = await EtcdRegistrar.connect({ url: withAuth, namespace: NS, component: COMP, endpoint: EP })
  t.teardown(() => reg.close())
  const lease = await reg.grant()
  await lease.register({ url: 'http://127.0.0.1:9001', blockSize: 16, totalKvBlocks: 1024, maxNumBatchedTokens: 256 })
  const disco = await EtcdDiscovery.start({ url: withAuth, namespace: NS, component: COMP, endpoint: EP })
  t.teardown(() => disco.close())
  t.equal(disco.workers.get(lease.id)?.url, 'http://127.0.0.1:9001', 'the router discovers the engine the mocker registered')

  const wrong = etcd.url.replace('http://', 'http://root:not-the-pw@')
  const err = (await EtcdRegistrar.connect({ url: wrong, namespace: NS, component: COMP, endpoint: EP, connectTimeoutMs: 2000 }).catch(
    (e: unknown) => e,
  )) as Error
  t.ok(err instanceof Error, 'a wrong password is refused')
  t.match(err.message, /cannot reach etcd at http:\/\/\[redacted\]@127\.0\.0\.1:\d+/, 'the URL is named, its credentials not')
  t.notMatch(err.message, /not-the-pw/)
})
