// Durable mode as processes, with snapshots: two `kv-router serve --router-durable-kv-events`
// replicas with a low --router-snapshot-threshold, one writing JSON snapshots
// (--router-snapshot-format json), the other binary ones, upload snapshots and purge the stream; a replica
// that stops and starts again while events flow rebuilds from the snapshot and the stream after
// it (the stream alone no longer could), and then holds the same index as the replica that never
// stopped, equal to the engines' pools. A replica started with --router-reset-states starts
// empty, the stream purged and the snapshot gone.
import t from 'tap'
import { connect } from 'nats'
import { startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { Rng } from '../helpers/rng.js'
import { drive, dumpedTokens } from '../helpers/zmq-fleet.js'
import { STREAM, durableRouter, later, metric, mismatch } from '../helpers/durable.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { radixBucket } from '../../src/transport/dynamo-names.js'

const BS = 4

t.test('a restart from the snapshot and the stream after it equals a replica that never stopped; --router-reset-states starts empty', async (t) => {
  const nats = await startNats()
  later(t, () => nats.stop())
  const nc = await connect({ servers: nats.url, maxReconnectAttempts: -1 })
  later(t, () => nc.close())
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
  const rng = new Rng(5)
  const snap = ['--router-snapshot-threshold', '100']
  // whichever snapshots last, the other reads it
  const a = await durableRouter(t, nats.url, BS, [...snap, '--router-snapshot-format', 'json'])
  let b = await durableRouter(t, nats.url, BS, snap)
  await drive(fleet, rng, 150)
  const jsm = await nc.jetstreamManager()
  // either replica may be the one that snapshots and purges
  await waitUntil('a snapshot uploaded and the stream purged', async () => (await jsm.streams.info(STREAM)).state.first_seq > 1, 20_000, 100)
  const uploaded =
    (await metric(a.base, 'kvrouter_durable_snapshots_total', 'uploaded')) + (await metric(b.base, 'kvrouter_durable_snapshots_total', 'uploaded'))
  const purged =
    (await metric(a.base, 'kvrouter_durable_snapshots_total', 'purged_messages')) +
    (await metric(b.base, 'kvrouter_durable_snapshots_total', 'purged_messages'))
  t.ok(uploaded >= 1 && purged > 0, `snapshots uploaded (${uploaded}), messages purged after them (${purged})`)

  // one replica stops; events go on; it starts again
  await b.stop()
  await drive(fleet, rng, 60)
  const first = (await jsm.streams.info(STREAM)).state.first_seq
  t.ok(first > 1, `the stream starts at message ${first}: what came before is only in the snapshot`)
  b = await durableRouter(t, nats.url, BS, snap)
  t.equal(await metric(b.base, 'kvrouter_durable_snapshots_total', 'loaded'), 1, 'it loaded the snapshot')
  t.ok((await metric(b.base, 'kvrouter_durable_catchup_events', 'snapshot')) > 0, 'and says how many events it held')
  await drive(fleet, rng, 40)
  await fleet.flushEvents()

  let diff = ''
  for (const r of [a, b]) {
    await waitUntil('the index equals the pools', async () => (diff = await mismatch(r.base, fleet)) === '', 30_000, 100)
    t.equal(diff, '', `replica ${r.consumer}: every engine's pool, block for block`)
  }
  for (const w of fleet.workers) {
    const dump = async (base: string): Promise<Map<bigint, bigint>> => dumpedTokens(await (await fetch(`${base}/v1/kv/dump?worker_id=${w.workerId}`)).text())
    t.same(await dump(b.base), await dump(a.base), `worker ${w.workerId}: the restarted replica's index is the other's`)
  }

  // every replica stops; one starts with --router-reset-states
  await a.stop()
  await b.stop()
  const os = await nc.jetstream().views.os(radixBucket('dynamo', 'backend'))
  t.ok((await os.info('radix-state')) !== null, 'a snapshot is there before the reset')
  const c = await durableRouter(t, nats.url, BS, ['--router-reset-states'])
  t.equal((await jsm.streams.info(STREAM)).state.messages, 0, 'the stream purged')
  await t.rejects(jsm.streams.info(`OBJ_${radixBucket('dynamo', 'backend')}`), 'the bucket deleted')
  t.equal(await metric(c.base, 'kvrouter_durable_snapshots_total', 'loaded'), 0)
  for (const w of fleet.workers)
    t.equal(dumpedTokens(await (await fetch(`${c.base}/v1/kv/dump?worker_id=${w.workerId}`)).text()).size, 0, `worker ${w.workerId}: nothing indexed`)
  await drive(fleet, rng, 10)
  await waitUntil('new events indexed', async () => (await metric(c.base, 'kvrouter_durable_events_total', 'acked')) > 0, 10_000, 100)
  t.ok((await metric(c.base, 'kvrouter_durable_events_total', 'messages')) > 0, 'what comes after the reset is read')
})
