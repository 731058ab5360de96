// Durable mode as processes: engines publish their KV events into the JetStream stream (the
// mocker's --durable-kv-events) and two `kv-router serve --router-durable-kv-events` replicas read
// it, without the worker query, so only the stream can tell them what they missed. The
// nats-server restarts while events flow, one replica crashes (SIGKILL) while events flow and
// starts again, then the server is killed (SIGKILL) and started again: after quiet, each replica's index (GET /v1/kv/dump) holds, per engine,
// exactly the blocks the engine's pool holds.
import t from 'tap'
import { startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { Rng } from '../helpers/rng.js'
import { drive } from '../helpers/zmq-fleet.js'
import { durableRouter, later, metric, mismatch } from '../helpers/durable.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'

const BS = 4

t.test('a nats-server restart and a replica crash mid-stream lose no event', async (t) => {
  const nats = await startNats()
  later(t, () => nats.stop())
  // few blocks per engine: prompts evict, so the stream carries removals too
  const fleet = await MockerFleet.start({
    numWorkers: 3,
    blockSize: BS,
    numGpuBlocks: 48,
    maxNumSeqs: 4,
    speedupRatio: 0,
    natsUrl: nats.url,
    durableKvEvents: true,
    onWarning: () => undefined,
  })
  later(t, () => fleet.close())
  const rng = new Rng(17)
  // served before any router exists: the stream keeps them
  await drive(fleet, rng, 30)
  const a = await durableRouter(t, nats.url, BS)
  let b = await durableRouter(t, nats.url, BS)
  t.not(a.consumer, b.consumer, 'each replica its own consumer')

  // the server restarts while events flow: the engines go on serving, their publishers wait
  const published = (): number => fleet.workers.reduce((n, w) => n + Number(w.engine.ring.newestId), 0)
  const before = published()
  let restarting = true
  const restart = nats.restart().finally(() => (restarting = false))
  do await drive(fleet, rng, 10)
  while (restarting)
  await restart
  t.ok(published() > before, `events were published while the server restarted (${published() - before})`)
  // a replica crashes while events flow, and another start of it follows later
  const more = drive(fleet, rng, 60)
  await b.stop('SIGKILL')
  await more
  await drive(fleet, rng, 30)
  b = await durableRouter(t, nats.url, BS)
  // and the server is killed outright while events flow, deliveries in flight lost with it
  const killed = nats.kill('SIGKILL').then(() => nats.start())
  let down = true
  void killed.finally(() => (down = false))
  do await drive(fleet, rng, 10)
  while (down)
  await killed
  await drive(fleet, rng, 30)
  await fleet.flushEvents()

  let diff = ''
  for (const r of [a, b]) {
    await waitUntil('the index equals the pools', async () => (diff = await mismatch(r.base, fleet)) === '', 30_000, 100)
    t.equal(diff, '', `replica ${r.consumer}: every engine's pool, block for block`)
  }
  t.ok(
    fleet.workers.every((w) => w.engine.pool.cachedTokensHashes().size > 0),
    'the engines hold blocks',
  )
  const total = published()
  // the index can equal the pools while a late message (a removal, a re-store) is still on its way
  await waitUntil('every event applied', async () => (await metric(b.base, 'kvrouter_durable_events_total', 'messages')) >= total, 10_000, 100)
  t.equal(await metric(b.base, 'kvrouter_durable_events_total', 'messages'), total, 'the restarted replica applied every event once')
  t.equal((await metric(b.base, 'kvrouter_durable_catchup_events', 'stream')) > 0, true, 'and says how many it replayed at start')
  t.ok((await metric(b.base, 'kvrouter_durable_catchup_seconds')) >= 0)
  t.ok((await metric(a.base, 'kvrouter_nats_total', 'reconnects')) >= 1, 'the replica that stayed saw the server go and come back')
  await waitUntil('all acknowledged', async () => (await metric(a.base, 'kvrouter_durable_events_total', 'acked')) === total, 10_000, 100)
  t.equal(await metric(a.base, 'kvrouter_durable_events_total', 'messages'), total, 'the replica that stayed applied every event once')
})
