// Durable snapshots in both formats against a real nats-server with JetStream: a replica that
// writes JSON (--router-snapshot-format json) and one that writes binary read each other's; a
// JSON array of RouterEvents in serde's layout, as kv-router wrote it before binary snapshots
// (no format in its metadata), is loaded; a binary snapshot that is truncated, corrupt or of
// another version is refused, counted and applied nowhere, and the replica then starts from the
// stream alone. Two shard pools for the file, emptied between replicas: starting pools is what
// costs here.
import t from 'tap'
import { waitUntil } from '../helpers/wait.js'
import { chain, removed } from '../helpers/events.js'
import { STREAM, indexOf, indexText, natsAndClient, publishAll, startDurable } from '../helpers/durable.js'
import { ShardPool } from '../../src/shards/pool.js'
import { HEADER, PART_HEAD, isBinarySnapshot, readSnapshot } from '../../src/index/snapshot-format.js'
import { SNAPSHOT_FORMAT_KEY, SNAPSHOT_SEQ_KEY } from '../../src/transport/durable.js'
import { RADIX_STATE_OBJECT, radixBucket } from '../../src/transport/dynamo-names.js'
import { ensureKvEventsStream } from '../../src/transport/jetstream.js'
import type { NatsConnection } from 'nats'

const poolA = await ShardPool.start({ shards: 2 })
const poolB = await ShardPool.start({ shards: 3 })
t.teardown(async () => {
  await poolA.close()
  await poolB.close()
})

async function empty(pool: ShardPool): Promise<void> {
  for (const id of new Set((await pool.treeSizes()).map((x) => x.worker_id))) await pool.removeWorker(id)
}

async function upload(nc: NatsConnection, body: Uint8Array, metadata: Record<string, string>): Promise<void> {
  const os = await nc.jetstream().views.os(radixBucket('dynamo', 'backend'))
  await os.putBlob({ name: RADIX_STATE_OBJECT, metadata }, body)
}

/** The stream, made as the first replica or worker would, before anything is published. */
async function stream(nc: NatsConnection): Promise<void> {
  await ensureKvEventsStream(await nc.jetstreamManager(), 'dynamo', 'backend')
}

async function acked(nc: NatsConnection, consumer: string, seq: number): Promise<void> {
  const jsm = await nc.jetstreamManager()
  await waitUntil(`${consumer} applied message ${seq}`, async () => (await jsm.consumers.info(STREAM, consumer)).ack_floor.stream_seq >= seq)
}

t.test('a replica writing JSON and one writing binary load each other’s snapshots', async (t) => {
  await Promise.all([empty(poolA), empty(poolB)])
  const { nc } = await natsAndClient(t)
  const a = await startDurable(t, { nc, pool: poolA, instanceId: 1n, snapshotFormat: 'json', snapshotThreshold: 1_000_000 })
  const first = await publishAll(nc, [chain(1, null, [1, 2, 3]), chain(2, null, [1, 4]), chain(2n ** 64n - 1n, null, [5], 3), removed(1, [300])])
  await acked(nc, a.consumer, first)
  await a.snapshot()
  const os = await nc.jetstream().views.os(radixBucket('dynamo', 'backend'))
  const info = await os.info(RADIX_STATE_OBJECT)
  t.equal(info?.metadata?.[SNAPSHOT_FORMAT_KEY], 'json', 'its metadata names the format')
  t.equal(a.lastSnapshot?.format, 'json')
  const body = Buffer.from((await os.getBlob(RADIX_STATE_OBJECT)) as Uint8Array).toString()
  t.match(body, /^\[\{"worker_id":/, 'a JSON array of RouterEvents')
  const last = await publishAll(nc, [chain(1, 2, [6]), chain(3, null, [7])])
  const b = await startDurable(t, { nc, pool: poolB, instanceId: 2n })
  t.equal(b.counters.snapshotsLoaded, 1, 'the binary replica loaded the JSON snapshot')
  t.equal(b.catchUp.snapshotEvents, 5, 'its events')
  await acked(nc, b.consumer, last)
  await acked(nc, a.consumer, last)
  t.equal(indexText(await indexOf(poolB)), indexText(await indexOf(poolA)), 'the same index')
  t.equal((await indexOf(poolB)).get(2n ** 64n - 1n)?.size, 1, 'a u64 worker id at its limit, rank 3')

  // and the reverse: the binary replica snapshots, the JSON one starts again from it
  await b.snapshot()
  t.equal((await os.info(RADIX_STATE_OBJECT))?.metadata?.[SNAPSHOT_FORMAT_KEY], 'binary')
  t.equal(b.lastSnapshot?.format, 'binary')
  t.equal(b.lastSnapshot?.events, 7, 'its block entries')
  t.ok(isBinarySnapshot((await os.getBlob(RADIX_STATE_OBJECT)) as Uint8Array))
  await a.close()
  await empty(poolA)
  const again = await startDurable(t, { nc, pool: poolA, instanceId: 3n, snapshotFormat: 'json' })
  t.equal(again.counters.snapshotsLoaded, 1, 'the JSON replica loaded the binary snapshot')
  t.equal(again.catchUp.seconds, 0, 'nothing after it in the stream')
  t.equal(indexText(await indexOf(poolA)), indexText(await indexOf(poolB)), 'the same index')
  t.same(
    (await poolA.treeSizes()).map((s) => `${s.worker_id}:${s.dp_rank}@${s.last_event_id}`).sort(),
    (await poolB.treeSizes()).map((s) => `${s.worker_id}:${s.dp_rank}@${s.last_event_id}`).sort(),
    'and the same last event ids: a binary snapshot keeps them',
  )
})

t.test('a JSON snapshot as kv-router wrote it before binary ones (serde’s RouterEvent layout, no format named) is loaded', async (t) => {
  await Promise.all([empty(poolA), empty(poolB)])
  const { nc } = await natsAndClient(t)
  await stream(nc)
  const seq = await publishAll(nc, [chain(9, null, [1])])
  // RouterEvents as serde_json writes them (recent fields included), ids past 2^53 exact
  const body = `[{"worker_id":18446744073709551615,"storage_tier":"device","event":{"event_id":0,"data":{"stored":{"parent_hash":null,\
"start_position":null,"blocks":[{"block_hash":100,"tokens_hash":1,"mm_extra_info":null},{"block_hash":200,"tokens_hash":2,"mm_extra_info":null}]}},\
"dp_rank":0}},{"worker_id":18446744073709551615,"storage_tier":"device","event":{"event_id":1,"data":{"stored":{"parent_hash":200,\
"start_position":null,"blocks":[{"block_hash":9007199254740993,"tokens_hash":18446744073709551614,"mm_extra_info":null}]}},"dp_rank":0}},\
{"worker_id":5,"event":{"event_id":2,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":100,"tokens_hash":1,"mm_extra_info":null}]}},\
"dp_rank":1}}]`
  await upload(nc, Buffer.from(body), { [SNAPSHOT_SEQ_KEY]: String(seq) })
  const more = await publishAll(nc, [removed(5, [100], 1), chain(9, 1, [2])])
  const d = await startDurable(t, { nc, pool: poolA, instanceId: 4n })
  t.equal(d.counters.snapshotsLoaded, 1, 'loaded')
  t.equal(d.counters.snapshotLoadsFailed, 0)
  t.equal(d.catchUp.snapshotEvents, 3)
  await acked(nc, d.consumer, more)
  const index = await indexOf(poolA)
  t.same(
    [...(index.get(2n ** 64n - 1n) ?? [])],
    [
      [100n, 1n],
      [200n, 2n],
      [9007199254740993n, 18446744073709551614n],
    ],
    'its blocks, u64s exact',
  )
  t.equal(index.get(5n)?.size ?? 0, 0, 'the stream after it applied on top (a removal)')
  t.equal(index.get(9n)?.size ?? 0, 0, 'only the stream after the snapshot was replayed: a store under the block of message 1 is refused')
  const scores = await poolA.overlapScores([1n, 2n, 18446744073709551614n])
  t.same(
    scores.map((s) => `${s.worker_id}:${s.dp_rank}=${s.overlap_blocks}`),
    ['18446744073709551615:0=3'],
  )
})

t.test('a binary snapshot truncated, corrupt or of another version is refused, counted and applied nowhere; the replica starts from the stream', async (t) => {
  await Promise.all([empty(poolA), empty(poolB)])
  const { nc } = await natsAndClient(t)
  await stream(nc)
  // the stream holds every message: a replica without a snapshot rebuilds the index from it
  const seq = await publishAll(nc, [chain(1, null, [1, 2]), chain(2, null, [3]), removed(1, [200]), chain(4, null, [4, 5], 1)])
  // a snapshot of another index (worker 77), so what of it got applied would show
  poolB.push(
    Buffer.from(
      JSON.stringify({
        worker_id: 77,
        event: { event_id: 1, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 1, tokens_hash: 1 }] } } },
      }),
    ),
  )
  poolB.push(
    Buffer.from(
      JSON.stringify({
        worker_id: 2,
        event: { event_id: 1, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 8, tokens_hash: 8 }] } } },
      }),
    ),
  )
  const good = await poolB.snapshot()
  const flipped = good.slice()
  const held = readSnapshot(good).find((p) => p.entries > 0) as { offset: number }
  flipped[held.offset + PART_HEAD.bytes + 2] = (flipped[held.offset + PART_HEAD.bytes + 2] as number) ^ 1
  const version = good.slice()
  new DataView(version.buffer).setUint32(HEADER.version, 7, true)
  const cases: [string, Uint8Array, string, RegExp][] = [
    ['truncated', good.subarray(0, good.length - 16), 'binary', /truncated/],
    ['a byte flipped', flipped, 'binary', /checksum does not match/],
    ['of version 7', version, 'binary', /version 7; this router reads versions 1 and 2/],
    ['named binary but JSON', Buffer.from('[]'), 'binary', /not a kv-router binary snapshot/],
    ['of a format no kv-router writes', good, 'bincode', /format "bincode", which this router does not read/],
  ]
  let id = 10n
  for (const [what, body, format, re] of cases) {
    await upload(nc, body, { [SNAPSHOT_SEQ_KEY]: String(seq), [SNAPSHOT_FORMAT_KEY]: format })
    const warnings: string[] = []
    await empty(poolA)
    const d = await startDurable(t, { nc, pool: poolA, instanceId: id++, warn: (m) => warnings.push(m) })
    t.equal(d.counters.snapshotLoadsFailed, 1, `${what}: counted`)
    t.equal(d.counters.snapshotsLoaded, 0, `${what}: not loaded`)
    t.match(warnings.join('\n'), re, `${what}: the warning says why`)
    await acked(nc, d.consumer, seq)
    const index = await indexOf(poolA)
    t.equal(
      indexText(index),
      indexText(
        new Map([
          [1n, new Map([[100n, 1n]])],
          [2n, new Map([[300n, 3n]])],
          [
            4n,
            new Map([
              [400n, 4n],
              [500n, 5n],
            ]),
          ],
        ]),
      ),
      `${what}: nothing of it applied, the stream replayed whole`,
    )
    await d.close()
  }
  // the sound one loads
  await upload(nc, good, { [SNAPSHOT_SEQ_KEY]: String(seq), [SNAPSHOT_FORMAT_KEY]: 'binary' })
  await empty(poolA)
  const d = await startDurable(t, { nc, pool: poolA, instanceId: 99n })
  t.equal(d.counters.snapshotsLoaded, 1)
  t.equal(indexText(await indexOf(poolA)), indexText(await indexOf(poolB)), 'the sound snapshot is what the index holds')
})
