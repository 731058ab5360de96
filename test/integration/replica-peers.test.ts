// Replica sync, peers coming and going over a real nats-server: a peer that says goodbye or goes
// silent has its bookings dropped; one heard again is asked for its bookings; a NATS restart under
// two replicas loses no queued event and each catches up again.
import t from 'tap'
import type { Test } from 'tap'
import { connect } from 'nats'
import type { NatsConnection } from 'nats'
import { startNats } from '../../src/deploy/services.js'
import type { NatsServer } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import type { Router, RouterDeps } from '../../src/core/router.js'
import { inStep, makeExact, prompt, slotLoad, startReplica, subjects } from '../helpers/replica-sync.js'

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
        '{"request_id":"p-1","worker":{"worker_id":2,"dp_rank":0},"data":{"AddRequest":{"token_sequence":[5,6],"isl":32,"overlap":0,' +
        '"expected_output_tokens":null,"track_prefill_tokens":true,"prefill_load_hint":{"initial_effective_prefill_tokens":32,' +
        '"expected_prefill_duration":null}}},"router_id":777,"lora_name":null}'
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
    () =>
      (a.replicas?.counters.reconnects ?? 0) >= 1 && (b.replicas?.counters.reconnects ?? 0) >= 1 && a.replicas?.inStep === true && b.replicas?.inStep === true,
    15_000,
  )
  const same = (): boolean => [1n, 2n, 3n, 4n].every((w) => JSON.stringify(slotLoad(a, w)) === JSON.stringify(slotLoad(b, w)))
  await waitUntil('B holds Y only, as A does', () => b.scheduler.sequences.remoteSize === 1 && same(), 5000)
  t.equal(a.replicas?.queued, 0)
  t.same(a.replicas?.counters.published, { add: 2, prefill_completed: 0, free: 1, session_binding: 0 }, 'what was queued went out')
  const catchUps = (r: Router): number => Object.values(r.replicas?.counters.catchUps ?? {}).reduce((x, v) => x + v, 0)
  t.ok(catchUps(a) >= 2 && catchUps(b) >= 2, 'each caught up again after reconnecting')
  t.equal(slotLoad(b, y.workerId).inFlight, slotLoad(a, y.workerId).inFlight)
})
