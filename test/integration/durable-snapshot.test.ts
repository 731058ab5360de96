// Durable KV events against a real nats-server with JetStream: snapshots (a replica that starts
// from one equals one that never stopped) and --router-reset-states. One test, two shard pools:
// starting pools is what costs here.
import t from 'tap'
import { waitUntil } from '../helpers/wait.js'
import { chain, removed } from '../helpers/events.js'
import { STREAM, indexOf, indexText, natsAndClient, publishAll, startDurable, startPool } from '../helpers/durable.js'
import type { RouterEvent } from '../../src/codec/events.js'
import { partWorkerIds, readSnapshot } from '../../src/index/snapshot-format.js'
import { SNAPSHOT_FORMAT_KEY, SNAPSHOT_SEQ_KEY } from '../../src/transport/durable.js'
import { RADIX_STATE_OBJECT, radixBucket } from '../../src/transport/dynamo-names.js'

t.test('from the snapshot and the stream after it, a replica equals one that never stopped; --router-reset-states is the first replica’s only', async (t) => {
  const { nc } = await natsAndClient(t)
  const poolA = await startPool(t)
  // discovery knows workers 1 to 5: worker 6's blocks are dropped before a snapshot
  const known = new Set([1n, 2n, 3n, 4n, 5n])
  const a = await startDurable(t, {
    nc,
    pool: poolA,
    instanceId: 1n,
    snapshotThreshold: 5,
    checkMs: 100,
    discovered: () => known,
    removeWorker: (id) => poolA.removeWorker(id),
  })
  const events: RouterEvent[] = [chain(6, null, [61, 62])]
  for (let w = 1; w <= 4; w++) {
    events.push(chain(w, null, [w * 10 + 1, w * 10 + 2, w * 10 + 3]))
    events.push(chain(w, w * 10 + 3, [w * 10 + 4]))
    events.push(removed(w, [(w * 10 + 2) * 100]))
  }
  const first = await publishAll(nc, events)
  await waitUntil('a snapshot uploaded and the stream purged', () => a.counters.snapshotsUploaded >= 1 && a.counters.purged > 0, 10_000)
  t.equal(a.counters.workersDropped, 1, 'the worker discovery does not know was dropped first')
  t.notOk((await indexOf(poolA)).has(6n))
  const js = nc.jetstream()
  const os = await js.views.os(radixBucket('dynamo', 'backend'))
  const info = await os.info(RADIX_STATE_OBJECT)
  t.ok(info !== null, 'radix-state in the bucket')
  const seq = Number(info?.metadata?.[SNAPSHOT_SEQ_KEY])
  t.ok(seq >= 1 && seq <= first, `it stands for message ${seq}`)
  t.equal(info?.metadata?.[SNAPSHOT_FORMAT_KEY], 'binary', 'binary by default, and its metadata says so')
  const body = (await os.getBlob(RADIX_STATE_OBJECT)) as Uint8Array
  const parts = readSnapshot(body)
  t.ok(parts.reduce((n, p) => n + p.entries, 0) > 0, 'a binary snapshot of the index')
  const ids: number[] = []
  for (const p of parts) partWorkerIds(body, p, (lo) => ids.push(lo))
  t.notOk(ids.includes(6), 'none of worker 6')

  // more after the snapshot; then a second replica starts from the snapshot and what follows it
  const more = [chain(1, 14, [15, 16]), chain(5, null, [51]), removed(3, [3400])]
  const lastSeq = await publishAll(nc, more)
  const jsm = await nc.jetstreamManager()
  const state = (await jsm.streams.info(STREAM)).state
  t.ok(state.first_seq > 1, `messages before ${state.first_seq} are purged: the stream alone cannot rebuild the index`)
  const poolB = await startPool(t)
  const b = await startDurable(t, { nc, pool: poolB, instanceId: 2n, snapshotThreshold: 1_000_000 })
  t.equal(b.counters.snapshotsLoaded, 1, 'the snapshot was loaded')
  t.ok(b.catchUp.snapshotEvents > 0)
  await waitUntil(
    'both applied the last message',
    async () =>
      (await jsm.consumers.info(STREAM, b.consumer)).ack_floor.stream_seq === lastSeq &&
      (await jsm.consumers.info(STREAM, a.consumer)).ack_floor.stream_seq === lastSeq,
  )
  const ia = await indexOf(poolA)
  const ib = await indexOf(poolB)
  t.same(ib, ia, 'the same index')
  t.equal(ia.get(1n)?.size, 5, 'worker 1: 11, 13, 14 and 15, 16')
  t.equal(ia.get(3n)?.size, 2)
  t.equal(ia.get(5n)?.size, 1)
  t.not(b.catchUp.seconds, null, 'caught up')

  // --router-reset-states while replica A reads the stream: a reset would pull the floor from
  // under it, so it is skipped and the snapshot loaded instead (in B's pool, emptied)
  await b.close()
  const empty = async (): Promise<void> => {
    for (const id of new Set((await poolB.treeSizes()).map((x) => x.worker_id))) await poolB.removeWorker(id)
  }
  await empty()
  const warnings: string[] = []
  const skipped = await startDurable(t, { nc, pool: poolB, instanceId: 32n, resetStates: true, warn: (m) => warnings.push(m) })
  t.match(warnings.join('\n'), /--router-reset-states ignored: replica\(s\) 1 read the stream/)
  t.equal(skipped.counters.snapshotsLoaded, 1, 'the snapshot loaded instead')
  await waitUntil('what is there loaded instead', async () => indexText(await indexOf(poolB)) === indexText(await indexOf(poolA)))
  t.same(await indexOf(poolB), await indexOf(poolA))
  await skipped.close()

  // no replica reads it any more: the first that starts resets
  await a.close()
  await empty()
  const reset = await startDurable(t, { nc, pool: poolB, instanceId: 33n, resetStates: true })
  t.equal((await jsm.streams.info(STREAM)).state.messages, 0, 'the stream purged')
  await t.rejects(jsm.streams.info(`OBJ_${radixBucket('dynamo', 'backend')}`), 'the bucket deleted')
  await new Promise((r) => setTimeout(r, 300))
  t.equal((await indexOf(poolB)).size, 0, 'the index starts empty')
  t.equal(reset.counters.snapshotsLoaded, 0)
  await publishAll(nc, [chain(9, null, [90])])
  await waitUntil('new events still come in', async () => (await indexOf(poolB)).get(9n)?.size === 1)
})
