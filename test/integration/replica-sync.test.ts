// Replica sync between router replicas in this process, over a real nats-server: bookings,
// prefill completions and frees reach the peer within 50 ms; own events are ignored; session
// bindings are shared; synced replicas alternating on requests place them as one router would
// (and unsynced ones do not); a booking published by hand in Dynamo's format is applied, and ours
// have Dynamo's shape; a late replica holds its peers' bookings (and session bindings) before it
// is in step; a lone one
// is in step at once; malformed messages are counted. Peers leaving and NATS restarts:
// replica-peers.test.ts.
import t from 'tap'
import type { Test } from 'tap'
import { connect } from 'nats'
import type { NatsConnection } from 'nats'
import { startNats } from '../../src/deploy/services.js'
import type { NatsServer } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { Router } from '../../src/core/router.js'
import type { RouterDeps } from '../../src/core/router.js'
import { BS, inStep, makeExact, prompt, routerConfig, slotLoad, startReplica, subjects, WORKERS } from '../helpers/replica-sync.js'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'
let nats: NatsServer
let pub: NatsConnection
t.before(async () => {
  nats = await startNats({ jetstream: false })
  pub = await connect({ servers: nats.url })
})
t.teardown(async () => {
  await pub?.close()
  await nats?.stop()
})

const replica = (t: Test, routerId: bigint, extra: string[] = [], deps: RouterDeps = {}): Promise<Router> => startReplica(t, nats.url, routerId, extra, deps)
const exact = (...routers: Router[]): Promise<void> => makeExact(pub, ...routers)

t.test('a booking reaches the peer at once, then its prefill completion and its free; own events are ignored', async (t) => {
  const a = await replica(t, 11n)
  const b = await replica(t, 12n)
  await Promise.all([inStep(a), inStep(b)])
  await exact(a, b)
  const t0 = performance.now()
  const { decision } = await a.route({ tokens: prompt(2, 3, 1) })
  await waitUntil('B holds the booking', () => b.scheduler.sequences.remoteSize === 1, 1000, 1)
  const ms = performance.now() - t0
  // sent as it is made, not with the next heartbeat (1 s); the bound leaves room for a loaded machine
  t.ok(ms < 500, `visible on the peer after ${ms.toFixed(1)} ms`)
  t.same(slotLoad(b, decision.workerId), { inFlight: 1, prefill: 80, blocks: 5 }, 'the same load as on A')
  t.same(slotLoad(a, decision.workerId), slotLoad(b, decision.workerId))
  a.scheduler.markPrefillComplete(decision.requestId as string)
  await waitUntil('prefill completed on B', () => slotLoad(b, decision.workerId).prefill === 0, 1000, 1)
  a.scheduler.free(decision.requestId as string)
  await waitUntil('freed on B', () => b.scheduler.sequences.remoteSize === 0, 1000, 1)
  t.same(slotLoad(b, decision.workerId), { inFlight: 0, prefill: 0, blocks: 0 })
  t.equal(b.replicas?.counters.received.get('add:applied'), 1)
  const ca = a.replicas?.counters
  t.same(ca?.published, { add: 1, prefill_completed: 1, free: 1, session_binding: 0 })
  t.equal(ca?.received.size, 0, 'A does not hear its own events (no echo)')
  // one carrying A's router id from elsewhere (a replica given the same id) is left alone
  pub.publish(
    subjects.events,
    `{"request_id":"echo","worker":{"worker_id":1,"dp_rank":0},"data":{"AddRequest":{"token_sequence":null,"isl":16,"overlap":0,` +
      `"expected_output_tokens":null}},"router_id":11}`,
  )
  await waitUntil('counted as own', () => ca?.received.get('add:own') === 1, 1000, 1)
  t.equal(a.scheduler.sequences.remoteSize, 0)
  await waitUntil('B took it for A’s', () => b.scheduler.sequences.remoteSize === 1, 1000, 1)
  pub.publish(subjects.events, '{"request_id":"echo","worker":{"worker_id":1,"dp_rank":0},"data":"Free","router_id":11}')
  await waitUntil('and frees it', () => b.scheduler.sequences.remoteSize === 0, 1000, 1)
  // the metrics say the same
  const text = await b.metrics.registry.metrics()
  t.match(text, /kvrouter_replica_events_received_total\{type="prefill_completed",outcome="applied"\} 1/)
  t.match(text, /kvrouter_replica_in_step 1/)
  t.match(text, /kvrouter_replica_peers 1/)
})

t.test('a session bound on one replica is bound on the other: its next turn goes to the same worker there', async (t) => {
  const ttl = ['--router-session-affinity-ttl-secs', '60']
  const a = await replica(t, 31n, ttl)
  const b = await replica(t, 32n, ttl)
  await Promise.all([inStep(a), inStep(b)])
  await exact(a, b)
  const first = await a.route({ tokens: prompt(0, 4, 71), sessionId: 'conv-1' })
  const w = first.decision.workerId
  await waitUntil('B holds the binding', () => b.sessions?.get('conv-1', performance.now())?.workerId === w, 1000, 1)
  // B books the same worker so heavily that the cost alone would send the turn elsewhere
  for (let i = 0; i < 6; i++) await b.route({ tokens: prompt(0, 40, 500 + i), workerId: w, id: `heavy-${i}` })
  const free = await b.route({ tokens: prompt(0, 4, 72), updateStates: false })
  t.not(free.decision.workerId, w, 'without the session the turn would go elsewhere')
  const turn = await b.route({ tokens: prompt(0, 4, 73), sessionId: 'conv-1' })
  t.equal(turn.decision.workerId, w, "the session's worker, as A bound it")
  t.equal(b.sessions?.counters.hits, 1)
  t.equal(a.replicas?.counters.published.session_binding, 1)
  t.equal(b.replicas?.counters.received.get('session_binding:applied'), 1)
  // and B's binding (refreshed by its own turn) reaches A
  await waitUntil('A heard B refresh it', () => a.replicas?.counters.received.get('session_binding:applied') === 1, 1000, 1)
  // malformed or unknown-worker bindings are counted and bind nothing
  const before = b.replicas?.counters.malformed ?? 0
  pub.publish(subjects.sessions, '{"router_id":99,"session_id":"","worker_id":1,"dp_rank":0,"ttl_ms":1000}')
  pub.publish(subjects.sessions, '{"router_id":99,"session_id":"x","worker_id":1,"dp_rank":-1,"ttl_ms":1000}')
  pub.publish(subjects.sessions, 'not json')
  pub.publish(subjects.sessions, '{"router_id":99,"session_id":"ghost","worker_id":777,"dp_rank":0,"ttl_ms":1000}')
  await waitUntil(
    'counted',
    () => (b.replicas?.counters.malformed ?? 0) - before === 3 && b.replicas?.counters.received.get('session_binding:unknown_worker') === 1,
    1000,
    1,
  )
  t.equal(b.sessions?.get('ghost', performance.now()), undefined)
})

t.test('a replica that starts after a session was bound takes the binding from its catch-up, for the time left; a newer one it holds stays', async (t) => {
  const ttl = ['--router-session-affinity-ttl-secs', '60']
  const a = await replica(t, 41n, ttl)
  await inStep(a)
  const first = await a.route({ tokens: prompt(0, 4, 81), sessionId: 'conv-late' })
  const w = first.decision.workerId
  const b = await replica(t, 42n, ttl)
  await inStep(b)
  const got = b.sessions?.get('conv-late', performance.now())
  t.equal(got?.workerId, w, 'B holds the binding A made before B started')
  const left = (got?.expiresAt ?? 0) - performance.now()
  t.ok(left > 50_000 && left <= 60_000, `for the time it had left on A (${left.toFixed(0)} ms)`)
  t.equal(b.replicas?.counters.catchUpSessions, 1)
  t.equal(b.replicas?.counters.received.get('session_binding:applied'), undefined, 'not from a live message: B was not there')
  // bound on each side without a message (as if B's own were newer), and one A alone holds
  const other = w === 1n ? 2n : 1n
  const now = performance.now()
  a.sessions?.bind('conv-both', w, 0, now, 10_000)
  b.sessions?.bind('conv-both', other, 0, now)
  a.sessions?.bind('conv-a', w, 0, now, 10_000)
  await b.replicas?.catchUp(String(a.replicas?.routerId), false)
  t.equal(b.sessions?.get('conv-both', performance.now())?.workerId, other, "B's own binding stays")
  const taken = b.sessions?.get('conv-a', performance.now())
  t.equal(taken?.workerId, w, 'the one B lacked is taken')
  t.ok((taken?.expiresAt ?? 0) - performance.now() <= 10_000, 'for its 10 s left, not the full TTL')
  t.equal(b.replicas?.counters.catchUpSessions, 2)
  t.match(await b.metrics.registry.metrics(), /^kvrouter_replica_catch_up_sessions_total 2$/m)
})

/** Loads each worker differently (pinned bookings), so the costs below have no ties. */
async function preload(r: Router): Promise<void> {
  for (let w = 1; w <= WORKERS; w++) await r.route({ tokens: prompt(0, w * 3, 900 + w), workerId: BigInt(w), id: `pre-${w}` })
}

/** 16 requests sharing prefixes, some freed or completed along the way; returns the workers chosen. */
async function sequence(pick: (i: number) => Router, settle: () => Promise<void>): Promise<bigint[]> {
  const chosen: bigint[] = []
  const ids: [Router, string][] = []
  for (let i = 0; i < 16; i++) {
    const r = pick(i)
    const { decision } = await r.route({ tokens: prompt(i % 3 === 0 ? 0 : 4, 1 + ((i * 5) % 7), i), id: `q${i}` })
    chosen.push(decision.workerId)
    ids.push([r, decision.requestId as string])
    if (i % 4 === 1) (ids[i - 1] as [Router, string])[0].scheduler.markPrefillComplete((ids[i - 1] as [Router, string])[1])
    if (i % 5 === 4) (ids[i - 3] as [Router, string])[0].scheduler.free((ids[i - 3] as [Router, string])[1])
    await settle()
  }
  return chosen
}

t.test('replicas alternating on requests that share prefixes place them as one router would; unsynced ones do not', async (t) => {
  const flags = ['--no-router-replica-spread']
  // one router
  const one = await replica(t, 20n, flags)
  await inStep(one)
  await exact(one)
  await preload(one)
  const single = await sequence(
    () => one,
    async () => undefined,
  )
  await one.close()
  // two synced replicas, alternating; each request waits until the peer has seen the last event
  const a = await replica(t, 21n, flags)
  const b = await replica(t, 22n, flags)
  await Promise.all([inStep(a), inStep(b)])
  await exact(a, b)
  await preload(a)
  const seen = (): number => (a.replicas?.counters.published.add ?? 0) + (b.replicas?.counters.published.add ?? 0)
  const synced = async (): Promise<void> => {
    const pa = a.replicas?.counters
    const pb = b.replicas?.counters
    const sent = (c: typeof pa): number => (c === undefined ? 0 : c.published.add + c.published.free + c.published.prefill_completed)
    const got = (c: typeof pa): number => [...(c?.received.entries() ?? [])].filter(([k]) => !k.endsWith(':own')).reduce((s, [, v]) => s + v, 0)
    await waitUntil('peers in sync', () => a.replicas?.queued === 0 && b.replicas?.queued === 0 && got(pb) === sent(pa) && got(pa) === sent(pb), 2000, 1)
  }
  await synced()
  const pair = await sequence((i) => (i % 2 === 0 ? a : b), synced)
  t.ok(seen() >= 16)
  t.same(pair, single, 'the same worker for every request as the single router')
  for (let w = 1; w <= WORKERS; w++) t.same(slotLoad(a, BigInt(w)), slotLoad(b, BigInt(w)), `worker ${w}: both replicas see the whole load`)
  await a.close()
  await b.close()
  // the control: two replicas without sync, same requests
  const plain = async (): Promise<Router> => {
    const cfg = routerConfig(nats.url)
    const r = await Router.start(cfg)
    t.teardown(() => r.close())
    return r
  }
  const c = await plain()
  const d = await plain()
  await exact(c, d)
  await preload(c)
  await preload(d)
  const apart = await sequence(
    (i) => (i % 2 === 0 ? c : d),
    async () => undefined,
  )
  t.notSame(apart, single, 'without sync each replica sees half the load and places requests otherwise')
})

t.test("a booking published by hand in Dynamo's format is applied; ours have Dynamo's shape and exact hashes", async (t) => {
  const b = await replica(t, 31n)
  await inStep(b)
  await exact(b)
  // a Dynamo router (Era B fields), hashes and router id above 2^53
  const dyn =
    '{"request_id":"dyn-1","worker":{"worker_id":3,"dp_rank":0},"data":{"AddRequest":{"token_sequence":[18446744073709551615,9007199254740993,12],' +
    '"isl":100,"overlap":1,"expected_output_tokens":null}},"router_id":9223372036854775807,"lora_name":null}'
  pub.publish(subjects.events, dyn)
  await waitUntil('the Dynamo booking applied', () => b.scheduler.sequences.remoteSize === 1, 2000, 1)
  t.same(slotLoad(b, 3n), { inFlight: 1, prefill: 100 - BS, blocks: 3 })
  t.equal(b.replicas?.peerInfo()[0]?.kind, 'dynamo', 'no heartbeat: a Dynamo router')
  t.equal(b.replicas?.peerInfo()[0]?.routerId, '9223372036854775807')
  pub.publish(subjects.events, '{"request_id":"dyn-1","worker":{"worker_id":3,"dp_rank":0},"data":"MarkPrefillCompleted","router_id":9223372036854775807}')
  await waitUntil('prefill completed', () => slotLoad(b, 3n).prefill === 0, 2000, 1)
  pub.publish(subjects.events, '{"request_id":"dyn-1","worker":{"worker_id":3,"dp_rank":0},"data":"Free","router_id":9223372036854775807}')
  await waitUntil('freed', () => b.scheduler.sequences.remoteSize === 0, 2000, 1)

  // what this router publishes, read off the wire
  const got: string[] = []
  const sub = pub.subscribe(subjects.events, { callback: (_e, m) => got.push(m.string()) })
  t.teardown(() => sub.unsubscribe())
  await pub.flush()
  const tokens = prompt(3, 0, 0)
  const { decision } = await b.route({ tokens, id: 'ours-1' })
  b.scheduler.free('ours-1')
  await waitUntil('our events on the wire', () => got.length >= 2, 2000, 1)
  const add = got[0] as string
  const seq = computeSequenceHashes(computeBlockHashes(tokens, BS))
  t.match(add, `"token_sequence":[${[...seq].join(',')}]`, 'the prompt’s sequence hashes, exact')
  t.match(add, `"worker":{"worker_id":${decision.workerId},"dp_rank":0}`)
  t.match(add, /"router_id":31,/)
  t.match(
    add,
    new RegExp(
      '^\\{"request_id":"ours-1",.*"data":\\{"AddRequest":\\{"token_sequence":\\[[0-9,]+\\],"isl":48,"overlap":0,"expected_output_tokens":null,' +
        '"track_prefill_tokens":true,"prefill_load_hint":\\{"initial_effective_prefill_tokens":48,',
    ),
  )
  t.match(
    got[1] as string,
    /^\{"request_id":"ours-1","worker":\{"worker_id":\d+,"dp_rank":0\},"data":"Free","router_id":31,"lora_name":null,"published_at":[0-9.]+\}$/,
  )
})

t.test('a replica started after its peer has bookings holds them before it is in step; a lone one is in step at once', async (t) => {
  const a = await replica(t, 41n)
  await inStep(a)
  t.equal(a.replicas?.counters.catchUps.alone, 1, 'nobody answered: alone, in step at once')
  t.ok((a.replicas?.lastCatchUp?.ms ?? 1e9) < 1000, `in step after ${a.replicas?.lastCatchUp?.ms.toFixed(1)} ms`)
  await exact(a)
  const ds = []
  for (let i = 0; i < 3; i++) ds.push((await a.route({ tokens: prompt(2, i + 1, 70 + i) })).decision)
  a.scheduler.markPrefillComplete(ds[0]?.requestId as string)
  const b = await replica(t, 42n)
  t.equal(b.replicas?.inStep, false, 'not in step while it asks')
  await inStep(b)
  t.equal(b.scheduler.sequences.remoteSize, 3, 'all three held the moment it is in step')
  t.equal(b.replicas?.counters.catchUps.complete, 1)
  t.equal(b.replicas?.counters.catchUpBookings, 3)
  for (let w = 1; w <= WORKERS; w++) t.same(slotLoad(b, BigInt(w)), slotLoad(a, BigInt(w)), `worker ${w}: the same load as on A`)
  // and it keeps following: a free on A reaches B
  a.scheduler.free(ds[1]?.requestId as string)
  await waitUntil('freed on B', () => b.scheduler.sequences.remoteSize === 2, 1000, 1)
})

t.test('malformed messages are counted and change nothing', async (t) => {
  const b = await replica(t, 51n)
  await inStep(b)
  await exact(b)
  const before = b.replicas?.counters.malformed ?? -1
  pub.publish(subjects.events, 'not json')
  pub.publish(subjects.events, '{"request_id":"x","worker":{"worker_id":1},"data":"Explode","router_id":1}')
  pub.publish(subjects.events, '{"request_id":"x","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":[-5]}},"router_id":1}')
  pub.publish(subjects.heartbeats, '{"router_id":"nope"}')
  pub.publish(subjects.catchUp, '[]', { reply: '_INBOX.nobody' })
  await waitUntil('counted', () => (b.replicas?.counters.malformed ?? 0) - before === 5, 2000, 1)
  t.equal(b.scheduler.sequences.remoteSize, 0)
  t.equal(b.replicas?.peerInfo().length, 0, 'no peer made up from them')
  t.match(await b.metrics.registry.metrics(), /kvrouter_replica_events_malformed_total 5/)
  // a booking on a worker it does not know is dropped and counted
  pub.publish(
    subjects.events,
    '{"request_id":"y","worker":{"worker_id":99,"dp_rank":0},"data":{"AddRequest":{"token_sequence":null,"isl":16,"overlap":0,' +
      '"expected_output_tokens":null}},"router_id":5}',
  )
  await waitUntil('unknown worker counted', () => b.replicas?.counters.received.get('add:unknown_worker') === 1, 2000, 1)
})
