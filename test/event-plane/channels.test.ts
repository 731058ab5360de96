// Dynamo's etcd records of event-plane publishers, both generations, read from keys and values
// written by hand from Dynamo's definitions; which of them are a router's; and the sequence and
// de-duplication bookkeeping the intake keeps per publisher.
import t from 'tap'
import { isBrokerChannel, isWorkerChannel, parseChannel, parseRecordKey, parseSource } from '../../src/event-plane/channels.js'
import type { EventChannelRecord } from '../../src/event-plane/channels.js'
import { SeenPairs } from '../../src/event-plane/dedup.js'
import { PublisherSequences, Seq } from '../../src/event-plane/sequences.js'

function ok<T>(r: { ok: true; value: T } | { ok: false; why: string }): T {
  if (!r.ok) throw new Error(r.why)
  return r.value
}

t.test('Gen-A: component-scoped key and value', async (t) => {
  // key: kv_store.rs event_channel_key `{ns}/{component}/{topic}/{instance_id:x}` under v1/event_channels;
  // value: DiscoveryInstance::EventChannel {namespace, component, topic, instance_id, transport},
  // #[serde(tag = "type")], EventTransport #[serde(tag = "kind", content = "config")]
  // (Gen-A discovery/mod.rs as the reference records it, stored copy 2716126320)
  const c = ok(
    parseChannel(
      'dynamo/backend/kv-events/694d9a1e2f3c4b5a',
      '{"type":"EventChannel","namespace":"dynamo","component":"backend","topic":"kv-events","instance_id":7587888130471510874,' +
        '"transport":{"kind":"Zmq","config":{"endpoint":"tcp://10.0.0.5:41234"}}}',
    ),
  )
  t.same(c, {
    generation: 'A',
    scope: { namespace: 'dynamo', component: 'backend', endpoint: null },
    topic: 'kv-events',
    instanceId: 0x694d9a1e2f3c4b5an,
    transport: { kind: 'zmq', endpoint: 'tcp://10.0.0.5:41234' },
  })
  t.ok(isWorkerChannel(c, 'dynamo', 'backend', 'kv-events'))
  t.notOk(isWorkerChannel(c, 'dynamo', 'prefill', 'kv-events'))
  t.notOk(isWorkerChannel(c, 'dynamo', 'backend', 'kv_metrics'))
})

t.test('Gen-B: endpoint- and component-scoped, percent-encoded segments, scope object', async (t) => {
  // key: kv_store.rs@020f5c17 event_channel_key = `{scope.path_prefix()}/topic/{encode(topic)}/{id:x}`,
  // path_prefix `namespace/{ns}/component/{c}/endpoint/{e}` with encode_event_segment on each
  // (discovery/mod.rs@020f5c17); value: EventChannel {scope, topic, instance_id, transport},
  // EventScope #[serde(tag = "kind", rename_all = "snake_case")], Endpoint {endpoint: EndpointId {namespace, component, name}}
  const e = ok(
    parseChannel(
      'namespace/dyn%2Eprod/component/backend/endpoint/generate/topic/kv-events/1fffffffffffff',
      '{"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace":"dyn.prod","component":"backend","name":"generate"}},' +
        '"topic":"kv-events","instance_id":9007199254740991,"transport":{"kind":"Zmq","config":{"endpoint":"tcp://[::1]:5000"}}}',
    ),
  )
  t.same(e.scope, { namespace: 'dyn.prod', component: 'backend', endpoint: 'generate' })
  t.equal(e.generation, 'B')
  t.equal(e.instanceId, 2n ** 53n - 1n)
  t.ok(isWorkerChannel(e, 'dyn.prod', 'backend', 'kv-events'), 'any endpoint of the component')
  const c = ok(
    parseChannel(
      'namespace/dynamo/component/backend/topic/kv-events/a',
      '{"type":"EventChannel","scope":{"kind":"component","namespace":"dynamo","component":"backend"},"topic":"kv-events","instance_id":10,' +
        '"transport":{"kind":"Nats","config":{"subject_prefix":"namespace.dynamo.component.backend"}}}',
    ),
  )
  t.same([c.scope, c.transport], [{ namespace: 'dynamo', component: 'backend', endpoint: null }, { kind: 'nats' }])
  const n = ok(
    parseChannel(
      'namespace/dynamo/topic/kv_metrics/b',
      '{"type":"EventChannel","scope":{"kind":"namespace","name":"dynamo"},"topic":"kv_metrics","instance_id":11,' +
        '"transport":{"kind":"Zmq","config":{"endpoint":"tcp://h:1"}}}',
    ),
  )
  t.same(n.scope, { namespace: 'dynamo', component: null, endpoint: null })
  t.notOk(isWorkerChannel(n, 'dynamo', 'backend', 'kv_metrics'), 'a namespace-scoped channel is no component publisher')
})

t.test('brokers: ZmqBroker records of component zmq_broker', async (t) => {
  // EventTransport::ZmqBroker {xsub_endpoints, xpub_endpoints}; brokers register under component
  // "zmq_broker" (event_plane/mod.rs@cfdfd698 resolve_zmq_broker)
  const b = ok(
    parseChannel(
      'dynamo/zmq_broker/kv-events/2a',
      '{"type":"EventChannel","namespace":"dynamo","component":"zmq_broker","topic":"kv-events","instance_id":42,' +
        '"transport":{"kind":"ZmqBroker","config":{"xsub_endpoints":["tcp://b1:5555"],"xpub_endpoints":["tcp://b1:5556","tcp://b2:5556"]}}}',
    ),
  )
  t.same(b.transport, { kind: 'broker', xpub: ['tcp://b1:5556', 'tcp://b2:5556'] })
  t.ok(isBrokerChannel(b))
  t.notOk(isBrokerChannel({ ...b, scope: { namespace: 'dynamo', component: 'backend', endpoint: null } } as EventChannelRecord))
})

t.test('EventSource: the worker-rank behind a publisher, ids exact above 2^53', async (t) => {
  // v1/event_sources with the Gen-B key layout (kv_store.rs@020f5c17 event_source_key);
  // DiscoveryInstance::EventSource {scope, topic, publisher_id, metadata}; KV metadata
  // {kv_state_endpoint, worker: {worker_id, dp_rank}, publisher_id}
  const s = ok(
    parseSource(
      'namespace/dynamo/component/backend/endpoint/generate/topic/kv-events/1234',
      '{"type":"EventSource","scope":{"kind":"endpoint","endpoint":{"namespace":"dynamo","component":"backend","name":"generate"}},' +
        '"topic":"kv-events","publisher_id":4660,"metadata":{"kv_state_endpoint":{"namespace":"dynamo","component":"backend","name":"generate"},' +
        '"worker":{"worker_id":7587888130471510874,"dp_rank":3},"publisher_id":4660}}',
    ),
  )
  t.same(s, {
    scope: { namespace: 'dynamo', component: 'backend', endpoint: 'generate' },
    topic: 'kv-events',
    publisherId: 0x1234n,
    workerId: 7587888130471510874n,
    dpRank: 3,
  })
})

t.test('records that are not valid are refused with the reason', async (t) => {
  const zmq = '"transport":{"kind":"Zmq","config":{"endpoint":"tcp://h:1"}}'
  const cases: [string, string, string][] = [
    ['dynamo/backend/kv-events/xyz', `{"type":"EventChannel","namespace":"dynamo","component":"backend","topic":"kv-events",${zmq}}`, 'key'],
    ['dynamo/backend/kv-events/1', 'not json', 'JSON'],
    ['dynamo/backend/kv-events/1', '[1]', 'JSON object'],
    ['dynamo/backend/kv-events/1', `{"type":"Endpoint","namespace":"dynamo","component":"backend","topic":"kv-events",${zmq}}`, 'EventChannel'],
    ['dynamo/backend/kv-events/1', `{"type":"EventChannel","namespace":"dynamo","component":"prefill","topic":"kv-events",${zmq}}`, 'another scope'],
    [
      'dynamo/backend/kv-events/1',
      `{"type":"EventChannel","namespace":"dynamo","component":"backend","topic":"kv-events","transport":{"kind":"Zmq","config":{}}}`,
      'transport',
    ],
    [
      'dynamo/backend/kv-events/1',
      `{"type":"EventChannel","namespace":"dynamo","component":"backend","topic":"kv-events","transport":{"kind":"Zmq","config":{"endpoint":"10.0.0.1:5"}}}`,
      'transport',
    ],
    [
      'namespace/dynamo/component/backend/topic/kv-events/1',
      `{"type":"EventChannel","scope":{"kind":"component","namespace":"dynamo"},"topic":"kv-events",${zmq}}`,
      'scope',
    ],
    [
      'namespace/dyn%2/component/backend/topic/kv-events/1',
      `{"type":"EventChannel","scope":{"kind":"component","namespace":"dyn","component":"backend"},"topic":"kv-events",${zmq}}`,
      'key',
    ],
  ]
  for (const [key, value, why] of cases) {
    const r = parseChannel(key, value)
    t.equal(r.ok, false, `${key} ${value.slice(0, 40)}`)
    if (!r.ok) t.match(r.why, why)
  }
  t.equal(parseSource('dynamo/backend/kv-events/1', '{}').ok, false, 'a Gen-A key is no source key')
  t.equal(parseRecordKey('namespace/a/component/b/endpoint/c/topic/kv-events'), null, 'no id')
})

t.test('sequences per publisher: next, gap, restart, stale; publishers apart', async (t) => {
  const s = new PublisherSequences()
  t.equal(s.see(0, 1, 0, 5), Seq.Next, 'the first message seen, whatever its number')
  t.equal(s.see(0, 1, 0, 6), Seq.Next)
  t.equal(s.see(0, 2, 0, 0), Seq.Next, 'another publisher')
  t.equal(s.see(0, 1, 0, 9), Seq.Gap)
  t.equal(s.missing, 2, 'sequences 7 and 8 never came')
  t.equal(s.see(0, 1, 0, 9), Seq.Stale, 'repeated')
  t.equal(s.see(0, 1, 0, 3), Seq.Stale, 'late')
  t.equal(s.see(0, 1, 0, 0), Seq.Restart, 'back to 0')
  t.equal(s.see(0, 1, 0, 1), Seq.Next)
  t.equal(s.see(0, 2, 0, 1), Seq.Next, 'the other publisher was not disturbed')
  // halves above 2^53 and the carry between them
  t.equal(s.see(0xffffffff, 0xffffffff, 0x7fffffff, 0xffffffff), Seq.Next)
  t.equal(s.see(0xffffffff, 0xffffffff, 0x80000000, 0), Seq.Next, 'the carry into the high half')
  t.equal(s.see(0xffffffff, 0xffffffff, 0x80000000, 2), Seq.Gap)
  t.equal(s.size, 3)
  s.forget(0, 2)
  t.equal(s.size, 2)
  t.equal(s.see(0, 2, 0, 50), Seq.Next, 'a forgotten publisher starts afresh')
})

t.test('broker pairs: a repeat is seen, the oldest pairs go first', async (t) => {
  const d = new SeenPairs(3)
  t.notOk(d.seen(1, 2, 0, 1))
  t.ok(d.seen(1, 2, 0, 1), 'the second broker copy')
  t.notOk(d.seen(1, 2, 0, 2))
  t.notOk(d.seen(9, 2, 0, 1), 'another publisher, same sequence')
  t.notOk(d.seen(1, 2, 0, 3), 'evicts the oldest')
  t.notOk(d.seen(1, 2, 0, 1), 'evicted: no longer known')
  t.ok(d.seen(1, 2, 0, 3))
  t.equal(d.size, 3)
})
