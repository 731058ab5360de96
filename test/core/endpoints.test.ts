// The endpoint checks every source of registrations shares (--worker, POST /v1/workers, etcd
// records): a value that cannot work is a KvrError(KVR_ERR_INVALID_ENDPOINT) naming the field as
// that source spells it.
import t from 'tap'
import { engineEventsSpec, RECORD_FIELDS, rankEndpoint, tcpEndpoint, urlList, workerUrl } from '../../src/core/endpoints.js'
import { isKvrError } from '../../src/errors.js'

t.test('engine KV-event endpoints: every dp rank on a port', async (t) => {
  t.same(engineEventsSpec({ endpoint: 'tcp://h:5557', replay: null, topic: undefined }, 2, RECORD_FIELDS), {
    endpoint: 'tcp://h:5557',
    replay: null,
    topic: '',
  })
  t.equal(engineEventsSpec({ endpoint: null, replay: undefined, topic: null }, 1, RECORD_FIELDS), null, 'none named')
  const refused: [Record<string, unknown>, number, RegExp][] = [
    [{ endpoint: 'tcp://h:65535' }, 2, /^kv_events_endpoint must be tcp:\/\/HOST:PORT with PORT \+ dp_size - 1 at most 65535 \(dp_size 2\)/],
    [{ endpoint: 'tcp://*:5557' }, 1, /tcp:\/\/\*:PORT is where the engine binds/],
    [{ replay: 'tcp://h:1' }, 1, /^replay_endpoint and kv_events_topic need kv_events_endpoint$/],
    [{ endpoint: 'tcp://h:1', topic: 3 }, 1, /^kv_events_topic must be a string, got 3$/],
  ]
  for (const [f, ranks, re] of refused) {
    try {
      engineEventsSpec({ endpoint: f.endpoint, replay: f.replay, topic: f.topic }, ranks, RECORD_FIELDS)
      t.fail(`accepted ${JSON.stringify(f)}`)
    } catch (err) {
      t.ok(isKvrError(err, 'KVR_ERR_INVALID_ENDPOINT'), 'a catalogued error')
      t.match((err as Error).message, re)
    }
  }
})

t.test('tcp endpoints, rank endpoints, worker URLs, server lists', async (t) => {
  t.same(tcpEndpoint('tcp://[::1]:6000'), { host: '[::1]', port: 6000 })
  t.equal(tcpEndpoint('tcp://h:0'), null)
  t.equal(rankEndpoint('tcp://h:5557', 3), 'tcp://h:5560')
  t.throws(() => rankEndpoint('h:1', 0), { code: 'KVR_ERR_INVALID_ENDPOINT' })
  t.equal(workerUrl('http://w:8000//'), 'http://w:8000')
  t.equal(workerUrl('http://w:99999'), null)
  t.same(urlList(' nats://a:1, ,nats://b:2'), ['nats://a:1', 'nats://b:2'])
})
