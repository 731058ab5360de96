// Replica sync between router replicas in this process, over a real nats-server: bookings,
// prefill completions and frees reach the peer within 50 ms; own events are ignored; synced
// replicas alternating on requests place them as one router would (and unsynced ones do not);
// a booking published by hand in Dynamo's format is applied, and ours have Dynamo's shape; a late
// replica holds its peers' bookings before it is in step; a lone one is in step at once;
// malformed messages are counted; a peer that says goodbye or goes silent has its bookings dropped.
import t from 'tap'
import type { Test } from 'tap'
import { connect } from 'nats'
import type { NatsConnection } from 'nats'
import { startNats } from '../helpers/services.js'
import type { NatsServer } from '../helpers/services.js'
import { waitUntil } from '../helpers/wait.js'
import { parseServeConfig } from '../../src/config.js'
import { Router } from '../../src/core/router.js'
import type { RouterDeps } from '../../src/core/router.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'
import { kvEventsSubject } from '../../src/transport/dynamo-names.js'
import { replicaSubjects } from '../../src/transport/replica-sync.js'

const BS = 16
const WORKERS = 4
const subjects = replicaSubjects('dynamo', 'backend')

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

/** A router replica with WORKERS static workers, all made exact by a first (cleared) KV event. */
async function replica(t: Test, routerId: bigint, extra: string[] = [], deps: RouterDeps = {}): Promise<Router> {
  const args = ['--router-event-threads', '1', '--no-router-event-recovery', '--router-block-size', String(BS), '--router-queue-threshold', 'none', '--nats-url', nats.url]
  args.push('--router-replica-sync', '--router-replica-catch-up-secs', '5', ...extra)
  for (let w = 1; w <= WORKERS; w++) args.push('--worker', `${w}=http://127.0.0.1:${9000 + w}`)
  const cfg = parseServeConfig(args, {})
  if (cfg === 'help') throw new Error('help')
  const r = await Router.start(cfg, { routerId, replica: { heartbeatMs: 100, silenceMs: 1500 }, ...deps })
  t.teardown(() => r.close())
  return r
}

/**
 * Makes every worker exact on every router: a cleared event each on NATS, again until every
 * router has one (a router just started may not have subscribed yet).
 */
async function exact(...routers: Router[]): Promise<void> {
  let last = 0
  await waitUntil('workers exact', () => {
    if (Date.now() - last > 200) {
      last = Date.now()
      for (let w = 1; w <= WORKERS; w++) pub.publish(kvEventsSubject('dynamo', 'backend'), encodeRouterEvent({ worker_id: BigInt(w), event: { event_id: 1n, dp_rank: 0, data: 'cleared' } }))
    }
    return routers.every((r) => r.eventSources.size === 0)
  })
}

const inStep = (r: Router): Promise<void> => waitUntil('in step', () => r.replicas?.inStep === true, 8000)

/** Tokens of a prompt: `prefix` shared blocks then `own` blocks of its own. */
function prompt(prefix: number, own: number, seed: number): number[] {
  const out: number[] = []
  for (let i = 0; i < prefix * BS; i++) out.push(1000 + i)
  for (let i = 0; i < own * BS; i++) out.push(50_000 + seed * 997 + i)
  return out
}

const slotLoad = (r: Router, worker: bigint): { inFlight: number; prefill: number; blocks: number } => {
  const s = r.scheduler.stats().slots.find((x) => x.workerId === worker)
  return { inFlight: s?.inFlight ?? -1, prefill: s?.prefillTokens ?? -1, blocks: s?.activeBlocks ?? -1 }
}

t.test('a booking reaches the peer within 50 ms, then its prefill completion and its free; own events are ignored', async (t) => {
  const a = await replica(t, 11n)
  const b = await replica(t, 12n)
  await Promise.all([inStep(a), inStep(b)])
  await exact(a, b)
  const t0 = performance.now()
  const { decision } = await a.route({ tokens: prompt(2, 3, 1) })
  await waitUntil('B holds the booking', () => b.scheduler.sequences.remoteSize === 1, 1000, 1)
  const ms = performance.now() - t0
  t.ok(ms < 50, `visible on the peer after ${ms.toFixed(1)} ms`)
  t.same(slotLoad(b, decision.workerId), { inFlight: 1, prefill: 80, blocks: 5 }, 'the same load as on A')
  t.same(slotLoad(a, decision.workerId), slotLoad(b, decision.workerId))
  a.scheduler.markPrefillComplete(decision.requestId as string)
  await waitUntil('prefill completed on B', () => slotLoad(b, decision.workerId).prefill === 0, 1000, 1)
  a.scheduler.free(decision.requestId as string)
  await waitUntil('freed on B', () => b.scheduler.sequences.remoteSize === 0, 1000, 1)
  t.same(slotLoad(b, decision.workerId), { inFlight: 0, prefill: 0, blocks: 0 })
  t.equal(b.replicas?.counters.received.get('add:applied'), 1)
  const ca = a.replicas?.counters
  t.same(ca?.published, { add: 1, prefill_completed: 1, free: 1 })
  t.equal(ca?.received.size, 0, 'A does not hear its own events (no echo)')
  // one carrying A's router id from elsewhere (a replica given the same id) is left alone
  pub.publish(
    subjects.events,
    `{"request_id":"echo","worker":{"worker_id":1,"dp_rank":0},"data":{"AddRequest":{"token_sequence":null,"isl":16,"overlap":0,"expected_output_tokens":null}},"router_id":11}`,
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
    const args = ['--router-event-threads', '1', '--no-router-event-recovery', '--router-block-size', String(BS), '--router-queue-threshold', 'none', '--nats-url', nats.url]
    for (let w = 1; w <= WORKERS; w++) args.push('--worker', `${w}=http://127.0.0.1:${9000 + w}`)
    const cfg = parseServeConfig(args, {})
    if (cfg === 'help') throw new Error('help')
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
    '{"request_id":"dyn-1","worker":{"worker_id":3,"dp_rank":0},"data":{"AddRequest":{"token_sequence":[18446744073709551615,9007199254740993,12],"isl":100,"overlap":1,"expected_output_tokens":null}},"router_id":9223372036854775807,"lora_name":null}'
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
    /^\{"request_id":"ours-1",.*"data":\{"AddRequest":\{"token_sequence":\[[0-9,]+\],"isl":48,"overlap":0,"expected_output_tokens":null,"track_prefill_tokens":true,"prefill_load_hint":\{"initial_effective_prefill_tokens":48,/,
  )
  t.match(got[1] as string, /^\{"request_id":"ours-1","worker":\{"worker_id":\d+,"dp_rank":0\},"data":"Free","router_id":31,"lora_name":null,"published_at":[0-9.]+\}$/)
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
    '{"request_id":"y","worker":{"worker_id":99,"dp_rank":0},"data":{"AddRequest":{"token_sequence":null,"isl":16,"overlap":0,"expected_output_tokens":null}},"router_id":5}',
  )
  await waitUntil('unknown worker counted', () => b.replicas?.counters.received.get('add:unknown_worker') === 1, 2000, 1)
})

t.test('a peer that says goodbye, or goes silent, has its bookings dropped', async (t) => {
  const a = await replica(t, 61n)
  const b = await replica(t, 62n)
  await Promise.all([inStep(a), inStep(b)])
  await exact(a, b)
  await waitUntil('each sees the other', () => a.replicas?.livePeers === 1 && b.replicas?.livePeers === 1)
  await b.route({ tokens: prompt(1, 1, 1) })
  await waitUntil('A holds it', () => a.scheduler.sequences.remoteSize === 1, 1000, 1)
  await b.close()
  await waitUntil('dropped at the goodbye', () => a.scheduler.sequences.remoteSize === 0, 1000, 1)
  t.equal(a.replicas?.counters.remoteDropped.peer_gone, 1)
  t.equal(a.replicas?.livePeers, 0)

  // silence: C's connection is cut without a goodbye
  const c = await replica(t, 63n)
  await inStep(c)
  await c.route({ tokens: prompt(1, 2, 2) })
  await waitUntil('A holds C’s booking', () => a.scheduler.sequences.remoteSize === 1, 1000, 1)
  const nc = (c.replicas as unknown as { nc: NatsConnection }).nc
  const t0 = performance.now()
  await nc.close()
  await waitUntil('dropped after the silence', () => a.scheduler.sequences.remoteSize === 0, 6000, 5)
  const ms = performance.now() - t0
  t.ok(ms >= 1300 && ms < 4000, `dropped ${ms.toFixed(0)} ms after C fell silent (limit 1500 ms)`)
  t.equal(a.replicas?.peerInfo().find((p) => p.routerId === '63')?.alive, false)
})

t.test('a peer heard again after it was taken for gone is asked for its bookings, and its answer is applied', async (t) => {
  const a = await replica(t, 71n)
  await inStep(a)
  await exact(a)
  // a kv-router peer played by hand: heartbeats, then silence, then heartbeats again
  const beat = (): void => pub.publish(subjects.heartbeats, `{"router_id":777,"url":"http://peer:1","host":"peer","sent_at":${Date.now()},"bookings":1}`)
  const asked: { target: unknown; reply: string }[] = []
  const sub = pub.subscribe(subjects.catchUp, {
    callback: (_e, m) => {
      const body = JSON.parse(m.string()) as { router_id: number; target: unknown }
      if (body.router_id !== 71) return
      asked.push({ target: body.target, reply: m.reply ?? '' })
      const booking =
        '{"request_id":"p-1","worker":{"worker_id":2,"dp_rank":0},"data":{"AddRequest":{"token_sequence":[5,6],"isl":32,"overlap":0,"expected_output_tokens":null,"track_prefill_tokens":true,"prefill_load_hint":{"initial_effective_prefill_tokens":32,"expected_prefill_duration":null}}},"router_id":777,"lora_name":null}'
      m.respond(`{"router_id":777,"url":"http://peer:1","peers":[],"part":0,"last":true,"count":1}\n${booking}`)
    },
  })
  t.teardown(() => sub.unsubscribe())
  await pub.flush()
  beat()
  await waitUntil('A asked the new peer', () => asked.length === 1, 2000, 1)
  t.equal(asked[0]?.target, 777, 'a catch-up aimed at that peer')
  await waitUntil('its booking held', () => a.scheduler.sequences.remoteSize === 1, 2000, 1)
  t.same(slotLoad(a, 2n), { inFlight: 1, prefill: 32, blocks: 2 })
  await waitUntil('gone after the silence', () => a.scheduler.sequences.remoteSize === 0, 6000, 5)
  beat()
  await waitUntil('asked again', () => asked.length === 2, 2000, 1)
  await waitUntil('held again', () => a.scheduler.sequences.remoteSize === 1, 2000, 1)
  const peer = a.replicas?.peerInfo().find((p) => p.routerId === '777')
  t.same([peer?.alive, peer?.kind, peer?.url, peer?.bookingsHeld, peer?.reportedBookings], [true, 'kv-router', 'http://peer:1', 1, 1])
})

t.test('NATS restarted under two replicas: events queued while it was down go out, and each catches up again', async (t) => {
  const a = await replica(t, 81n)
  const b = await replica(t, 82n)
  await Promise.all([inStep(a), inStep(b)])
  await exact(a, b)
  const x = (await a.route({ tokens: prompt(1, 1, 81) })).decision
  await waitUntil('B holds X', () => b.scheduler.sequences.remoteSize === 1, 2000, 1)
  await nats.kill()
  await waitUntil('both see NATS down', () => a.replicas?.connected === false && b.replicas?.connected === false, 5000)
  const y = (await a.route({ tokens: prompt(1, 2, 82) })).decision
  a.scheduler.free(x.requestId as string)
  await new Promise((r) => setImmediate(r))
  t.equal(a.replicas?.queued, 2, 'held while NATS is down')
  t.match(await a.metrics.registry.metrics(), /kvrouter_replica_queue_depth 2/)
  await nats.start()
  await waitUntil(
    'both reconnected and in step again',
    () => (a.replicas?.counters.reconnects ?? 0) >= 1 && (b.replicas?.counters.reconnects ?? 0) >= 1 && a.replicas?.inStep === true && b.replicas?.inStep === true,
    15_000,
  )
  const same = (): boolean => [1n, 2n, 3n, 4n].every((w) => JSON.stringify(slotLoad(a, w)) === JSON.stringify(slotLoad(b, w)))
  await waitUntil('B holds Y only, as A does', () => b.scheduler.sequences.remoteSize === 1 && same(), 5000)
  t.equal(a.replicas?.queued, 0)
  t.same(a.replicas?.counters.published, { add: 2, prefill_completed: 0, free: 1 }, 'what was queued went out')
  const catchUps = (r: Router): number => Object.values(r.replicas?.counters.catchUps ?? {}).reduce((x, v) => x + v, 0)
  t.ok(catchUps(a) >= 2 && catchUps(b) >= 2, 'each caught up again after reconnecting')
  t.equal(slotLoad(b, y.workerId).inFlight, slotLoad(a, y.workerId).inFlight)
})
