// Durable catch-up: how fast a replica that starts replays the JetStream stream into its shards.
// Two workloads, each published into the durable stream of a real nats-server before any replica
// exists: `mooncake`, the index benchmark's events (bench/lib/index-workload.ts: 22,119 events
// storing or removing 2.77 M blocks, RouterEvent JSON), and `small`, 200,000 events of one block
// each (chains of 50 blocks over 64 workers), where the cost per message shows. A replica
// (ShardPool + DurableKvEvents, as `serve --router-durable-kv-events` runs them) then starts with a
// fresh consumer, and the clock runs from its consumer's creation until the shards have applied
// the last message and it is acknowledged (DurableKvEvents.catchUp). Repeated --reps times per
// workload, each a new replica. After the last mooncake replay the replica takes a snapshot
// (dump with the intake held, upload, purge), and one more replica starts from that snapshot
// alone: its start time is the snapshot's load.
// Run: `npm run bench:durable [-- --reps R --shards S]`.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { connect } from 'nats'
import { buildIndexWorkload } from './lib/index-workload.js'
import { median, resultsDir } from './lib/common.js'
import { startNats } from '../src/deploy/services.js'
import { encodeRouterEvent } from '../src/codec/events.js'
import { ShardPool } from '../src/shards/pool.js'
import { DurableKvEvents } from '../src/transport/durable.js'
import { RADIX_STATE_OBJECT, kvEventsQueueSubject } from '../src/transport/dynamo-names.js'
import { ensureKvEventsStream } from '../src/transport/jetstream.js'

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`)
  return i < 0 ? dflt : Number(process.argv[i + 1])
}
const reps = arg('reps', 3)
const shards = arg('shards', 1)

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
const snapshot = { events: 0, megabytes: 0, takeSeconds: 0, dumpSeconds: 0, uploadSeconds: 0, loadSeconds: 0 }
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
      const s0 = performance.now()
      await r.d.snapshot()
      snapshot.takeSeconds = (performance.now() - s0) / 1000
      snapshot.dumpSeconds = (r.d.lastSnapshot?.dumpMs ?? 0) / 1000
      snapshot.uploadSeconds = (r.d.lastSnapshot?.uploadMs ?? 0) / 1000
      snapshot.megabytes = (r.d.lastSnapshot?.bytes ?? 0) / 1e6
      await stop(r)
      const fresh = await replica(name)
      if (fresh.d.counters.snapshotsLoaded !== 1 || (await (await js.views.os(fresh.d.bucket)).info(RADIX_STATE_OBJECT)) === null)
        throw new Error('bench: the snapshot was not loaded')
      snapshot.events = fresh.d.catchUp.snapshotEvents
      snapshot.loadSeconds = fresh.startMs / 1000
      await stop(fresh)
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
const result = {
  command: 'npm run bench:durable',
  node: process.version,
  shards,
  reps,
  rows,
  snapshot: {
    events: snapshot.events,
    megabytes: snapshot.megabytes,
    take_seconds: snapshot.takeSeconds,
    dump_seconds: snapshot.dumpSeconds,
    upload_seconds: snapshot.uploadSeconds,
    load_seconds: snapshot.loadSeconds,
  },
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
console.log(
  `  snapshot of the mooncake index: ${snapshot.events.toLocaleString('en-US')} events, ${snapshot.megabytes.toFixed(1)} MB; taken in ` +
    `${snapshot.takeSeconds.toFixed(2)} s (dump with the intake held ${snapshot.dumpSeconds.toFixed(2)} s, encode and upload ` +
    `${snapshot.uploadSeconds.toFixed(2)} s, then the purge); loaded by a new replica in ${snapshot.loadSeconds.toFixed(2)} s`,
)
console.log('wrote bench/results/durable.json')
