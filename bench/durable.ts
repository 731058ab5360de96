// Durable catch-up: how fast a replica that starts replays the JetStream stream into its shards.
// Two workloads, each published into the durable stream of a real nats-server before any replica
// exists: `mooncake`, the index benchmark's events (bench/lib/index-workload.ts: 22,119 events
// storing or removing 2.77 M blocks, RouterEvent JSON), and `small`, 200,000 events of one block
// each (chains of 50 blocks over 64 workers), where the cost per message shows. A replica
// (ShardPool + DurableKvEvents, as `serve --router-durable-kv-events` runs them) then starts with a
// fresh consumer, and the clock runs from its consumer's creation until the shards have applied
// the last message and it is acknowledged (DurableKvEvents.catchUp). Repeated --reps times per
// workload, each a new replica. The last mooncake replica then takes snapshots of its index, in
// turn binary and JSON, --snapshot-reps times each (dump with the intake held, encoding, upload,
// purge), and after each take a new replica starts from that snapshot alone: its start time is
// the snapshot's load.
// Run: `npm run bench:durable [-- --reps R --shards S --snapshot-reps K]`.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { connect } from 'nats'
import { buildIndexWorkload } from './lib/index-workload.js'
import { median, resultsDir } from './lib/common.js'
import { startNats } from '../src/deploy/services.js'
import { encodeRouterEvent } from '../src/codec/events.js'
import { ShardPool } from '../src/shards/pool.js'
import { DurableKvEvents, SNAPSHOT_FORMATS, type SnapshotFormat } from '../src/transport/durable.js'
import { RADIX_STATE_OBJECT, kvEventsQueueSubject } from '../src/transport/dynamo-names.js'
import { ensureKvEventsStream } from '../src/transport/jetstream.js'

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`)
  return i < 0 ? dflt : Number(process.argv[i + 1])
}
const reps = arg('reps', 3)
const shards = arg('shards', 1)
const snapshotReps = arg('snapshot-reps', 3)

interface Workload {
  messages: Uint8Array[]
  blocks: number
  bytes: number
}

function mooncake(): Workload {
  const ops = buildIndexWorkload({}).ops.filter((o) => o.kind === 'event') as { bytes: Uint8Array; blocks: number }[]
  return { messages: ops.map((o) => o.bytes), blocks: ops.reduce((s, o) => s + o.blocks, 0), bytes: ops.reduce((s, o) => s + o.bytes.length, 0) }
}

function small(): Workload {
  const enc = new TextEncoder()
  const messages: Uint8Array[] = []
  const ids = new Map<number, bigint>()
  for (let i = 0; i < 200_000; i++) {
    const w = i % 64
    const id = (ids.get(w) ?? 0n) + 1n
    ids.set(w, id)
    const pos = Math.floor(i / 64) % 50
    const h = BigInt(w) * 1_000_000n + BigInt(i)
    const parent = pos === 0 ? null : h - 64n
    messages.push(
      enc.encode(
        encodeRouterEvent({
          worker_id: 7_000_000_000n + BigInt(w),
          event: { event_id: id, dp_rank: 0, data: { stored: { parent_hash: parent, blocks: [{ block_hash: h, tokens_hash: h ^ 0x5bd1e995n }] } } },
        }),
      ),
    )
  }
  return { messages, blocks: messages.length, bytes: messages.reduce((s, m) => s + m.length, 0) }
}

const workloads = { mooncake: mooncake(), small: small() }
type Name = keyof typeof workloads

const nats = await startNats()
const nc = await connect({ servers: nats.url })
const until = async (cond: () => boolean): Promise<void> => {
  while (!cond()) await new Promise((r) => setTimeout(r, 1))
}

interface Replica {
  pool: ShardPool
  d: DurableKvEvents
  /** ms from the start call until it returned (the snapshot loaded, the consumer made). */
  startMs: number
}

let nextId = 1
async function replica(component: Name): Promise<Replica> {
  const pool = await ShardPool.start({ shards })
  const t0 = performance.now()
  const d = await DurableKvEvents.start({
    nc,
    namespace: 'dynamo',
    component,
    pool,
    instanceId: BigInt(nextId++),
    snapshotThreshold: Number.MAX_SAFE_INTEGER,
    resetStates: false,
    warn: (m) => console.error(m),
  })
  return { pool, d, startMs: performance.now() - t0 }
}

async function stop(r: Replica): Promise<void> {
  await r.d.close()
  await r.pool.close()
}

const runs: Record<Name, number[]> = { mooncake: [], small: [] }
interface SnapshotRuns {
  /** Seconds: the whole take (snapshot()), its dump with the intake held, its encoding and upload; a new replica's start from it. */
  take: number[]
  dump: number[]
  upload: number[]
  load: number[]
  megabytes: number
  /** Events of the snapshot (a binary one's block entries), as the loading replica counted them. */
  events: number
}
const snapshots = Object.fromEntries(
  SNAPSHOT_FORMATS.map((f) => [f, { take: [], dump: [], upload: [], load: [], megabytes: 0, events: 0 } as SnapshotRuns]),
) as Record<SnapshotFormat, SnapshotRuns>
try {
  const jsm = await nc.jetstreamManager()
  const js = nc.jetstream()
  for (const name of ['small', 'mooncake'] as Name[]) {
    const w = workloads[name]
    // a stream of its own per workload: the workload's name is the component
    const stream = await ensureKvEventsStream(jsm, 'dynamo', name)
    const subject = kvEventsQueueSubject(stream)
    const f0 = performance.now()
    // a window of publishes in flight, as a busy fleet of workers keeps the server
    const window: Promise<unknown>[] = []
    for (const m of w.messages) {
      window.push(js.publish(subject, m))
      if (window.length >= 256) await Promise.all(window.splice(0))
    }
    await Promise.all(window)
    console.log(`${name}: ${w.messages.length} events, ${(w.bytes / 1e6).toFixed(1)} MB into ${stream} in ${((performance.now() - f0) / 1000).toFixed(1)} s`)
    for (let rep = 0; rep < reps; rep++) {
      const r = await replica(name)
      await until(() => r.d.catchUp.seconds !== null)
      const c = r.pool.counters()
      if (r.d.catchUp.events !== w.messages.length || c.reduce((s, x) => s + x.malformed + x.lost, 0) !== 0)
        throw new Error('bench: events were lost or malformed')
      runs[name].push(r.d.catchUp.seconds as number)
      console.log(`  replica ${rep + 1}: ${(r.d.catchUp.seconds as number).toFixed(2)} s`)
      if (name !== 'mooncake' || rep < reps - 1) {
        await stop(r)
        continue
      }
      // the formats in turn, so a machine whose speed drifts slows both alike
      const entries = c.reduce((s, x) => s + x.blocks, 0)
      for (let k = 0; k < snapshotReps; k++) {
        for (const format of SNAPSHOT_FORMATS) {
          const sr = snapshots[format]
          const s0 = performance.now()
          await r.d.snapshot(format)
          const last = r.d.lastSnapshot
          if (last === null || last.format !== format) throw new Error(`bench: no ${format} snapshot was taken`)
          sr.take.push((performance.now() - s0) / 1000)
          sr.dump.push(last.dumpMs / 1000)
          sr.upload.push(last.uploadMs / 1000)
          sr.megabytes = last.bytes / 1e6
          const fresh = await replica(name)
          if (fresh.d.counters.snapshotsLoaded !== 1 || (await (await js.views.os(fresh.d.bucket)).info(RADIX_STATE_OBJECT)) === null)
            throw new Error('bench: the snapshot was not loaded')
          const held = fresh.pool.counters().reduce((s, x) => s + x.blocks, 0)
          if (held !== entries) throw new Error(`bench: the ${format} snapshot loaded ${held} block entries of ${entries}`)
          sr.events = fresh.d.catchUp.snapshotEvents
          sr.load.push(fresh.startMs / 1000)
          console.log(
            `  ${format} snapshot ${k + 1}: taken in ${(sr.take.at(-1) as number).toFixed(2)} s, loaded in ${(sr.load.at(-1) as number).toFixed(2)} s`,
          )
          await stop(fresh)
        }
      }
      await stop(r)
    }
  }
} finally {
  await nc.close()
  await nats.stop()
}

const rows = (Object.keys(workloads) as Name[]).map((name) => {
  const w = workloads[name]
  const sec = median(runs[name])
  return {
    workload: name,
    events: w.messages.length,
    blocks: w.blocks,
    megabytes: w.bytes / 1e6,
    seconds: sec,
    events_per_sec: w.messages.length / sec,
    blocks_per_sec: w.blocks / sec,
    megabytes_per_sec: w.bytes / 1e6 / sec,
    runs: runs[name],
  }
})
const snapshotRows = SNAPSHOT_FORMATS.map((format) => {
  const sr = snapshots[format]
  return {
    format,
    events: sr.events,
    megabytes: sr.megabytes,
    take_seconds: median(sr.take),
    dump_seconds: median(sr.dump),
    upload_seconds: median(sr.upload),
    load_seconds: median(sr.load),
    take_runs: sr.take,
    load_runs: sr.load,
  }
})
const result = {
  command: 'npm run bench:durable',
  node: process.version,
  shards,
  reps,
  snapshot_reps: snapshotReps,
  rows,
  snapshots: snapshotRows,
}
writeFileSync(join(resultsDir(), 'durable.json'), JSON.stringify(result, null, 2) + '\n')
console.log(`durable catch-up → ${shards} shard(s), from the JetStream stream; median of ${reps}`)
for (const r of rows) {
  console.log(
    `  ${r.workload.padEnd(9)} ${String(r.events).padStart(7)} events ${r.megabytes.toFixed(1).padStart(6)} MB   ` +
      `${Math.round(r.events_per_sec).toLocaleString('en-US')} events/s   ${Math.round(r.blocks_per_sec).toLocaleString('en-US')} blocks/s   ` +
      `${r.megabytes_per_sec.toFixed(1)} MB/s   (${r.seconds.toFixed(2)} s; runs ${r.runs.map((x) => x.toFixed(2)).join(', ')})`,
  )
}
const binary = snapshotRows[0]
console.log(`snapshots of the mooncake index (${(binary?.events ?? 0).toLocaleString('en-US')} block entries), median of ${snapshotReps} takes and loads each`)
console.log('  format      MB   take s   of which dump (intake held)   encode and upload   load s   runs: take / load')
for (const r of snapshotRows) {
  console.log(
    `  ${r.format.padEnd(7)} ${r.megabytes.toFixed(1).padStart(6)}   ${r.take_seconds.toFixed(2).padStart(6)}   ${r.dump_seconds.toFixed(2).padStart(27)}` +
      `   ${r.upload_seconds.toFixed(2).padStart(17)}   ${r.load_seconds.toFixed(2).padStart(6)}   ` +
      `${r.take_runs.map((x) => x.toFixed(2)).join(', ')} / ${r.load_runs.map((x) => x.toFixed(2)).join(', ')}`,
  )
}
console.log('wrote bench/results/durable.json')
