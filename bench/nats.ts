// NATS intake throughput: the Mooncake workload's KV events (bench/lib/index-workload.ts)
// published through a real nats-server on the worker component's subject, consumed by
// NatsIntake into the shard pool, in two encodings: RouterEvent JSON, and the MessagePack
// event-plane envelope around a named MessagePack RouterEvent, as current Dynamo workers publish
// them. The runs alternate between the two, so both see the same machine. The clock runs from
// the first publish until the shards have processed the last event.
// Run: `npm run bench:nats [-- --reps R --shards S]`.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { connect } from 'nats'
import { buildIndexWorkload } from './lib/index-workload.js'
import { median, resultsDir } from './lib/common.js'
import { encodeEnvelopeMsgpack, encodeRouterEventMsgpack } from '../support/dynamo-msgpack.js'
import { startNats } from '../src/deploy/services.js'
import { parseRouterEvent } from '../src/codec/events.js'
import { ShardPool } from '../src/shards/pool.js'
import { kvEventSubjects } from '../src/transport/dynamo-names.js'
import { NatsIntake } from '../src/transport/nats.js'

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`)
  return i < 0 ? dflt : Number(process.argv[i + 1])
}
const reps = arg('reps', 3)
const shards = arg('shards', 1)

const workload = buildIndexWorkload({})
const events = workload.ops.filter((o) => o.kind === 'event') as { workerId: bigint; bytes: Uint8Array; blocks: number }[]
const blocks = events.reduce((s, e) => s + e.blocks, 0)

// A publisher id per worker that is not its worker id, as Dynamo's event plane draws them.
const publishers = new Map<bigint, { id: bigint; seq: number }>()
const encodings = {
  json: events.map((e) => e.bytes),
  msgpack: events.map((e) => {
    let p = publishers.get(e.workerId)
    if (p === undefined) publishers.set(e.workerId, (p = { id: 0x1f_0000_0000_0000n + BigInt(publishers.size) * 7919n, seq: 0 }))
    return encodeEnvelopeMsgpack({
      publisher_id: p.id,
      sequence: p.seq++,
      published_at: 1_760_000_000_000 + p.seq,
      payload: encodeRouterEventMsgpack(parseRouterEvent(e.bytes)),
    })
  }),
}
type Encoding = keyof typeof encodings

const nats = await startNats({ jetstream: false })
const subject = kvEventSubjects('dynamo', 'backend')[0] as string

async function run(messages: Uint8Array[]): Promise<{ seconds: number; slow: number }> {
  const pool = await ShardPool.start({ shards })
  const intake = await NatsIntake.start({ url: nats.url, namespace: 'dynamo', component: 'backend', pool })
  const pub = await connect({ servers: nats.url })
  const t0 = performance.now()
  for (let i = 0; i < messages.length; i++) {
    pub.publish(subject, messages[i] as Uint8Array)
    // let the client's socket drain now and then instead of buffering the whole workload
    if ((i & 255) === 255) await pub.flush()
  }
  await pub.flush()
  for (;;) {
    const done = pool.counters().reduce((s, c) => s + c.processed, 0)
    if (done >= messages.length) break
    await new Promise((res) => setTimeout(res, 1))
  }
  const seconds = (performance.now() - t0) / 1000
  const c = pool.counters()
  if (c.reduce((s, x) => s + x.malformed + x.lost, 0) !== 0 || intake.counters.messages !== messages.length)
    throw new Error('bench: events were lost or malformed')
  const slow = intake.counters.slowConsumer
  await pub.close()
  await intake.close()
  await pool.close()
  return { seconds, slow }
}

const runs: Record<Encoding, { seconds: number; slow: number }[]> = { json: [], msgpack: [] }
try {
  for (let r = 0; r < reps; r++) {
    // alternate which goes first, so neither always follows the other's garbage
    const order: Encoding[] = r % 2 === 0 ? ['json', 'msgpack'] : ['msgpack', 'json']
    for (const enc of order) runs[enc].push(await run(encodings[enc]))
  }
} finally {
  await nats.stop()
}

const rows = (Object.keys(encodings) as Encoding[]).map((encoding) => {
  const sec = median(runs[encoding].map((x) => x.seconds))
  const bytes = encodings[encoding].reduce((s, b) => s + b.length, 0)
  return {
    encoding,
    megabytes: bytes / 1e6,
    seconds: sec,
    events_per_sec: events.length / sec,
    blocks_per_sec: blocks / sec,
    megabytes_per_sec: bytes / 1e6 / sec,
    slow_consumer_episodes: runs[encoding].map((x) => x.slow),
  }
})
const result = { command: 'npm run bench:nats', node: process.version, shards, reps, events: events.length, blocks, rows }
writeFileSync(join(resultsDir(), 'nats.json'), JSON.stringify(result, null, 2) + '\n')
console.log(
  `NATS intake → ${shards} shard(s): ${events.length} events, ${blocks.toLocaleString('en-US')} blocks through nats-server; ` +
    `median of ${reps}, runs alternated`,
)
for (const r of rows) {
  console.log(
    `  ${r.encoding.padEnd(8)} ${r.megabytes.toFixed(1).padStart(6)} MB   ${Math.round(r.events_per_sec).toLocaleString('en-US')} events/s   ` +
      `${Math.round(r.blocks_per_sec).toLocaleString('en-US')} blocks/s   ${r.megabytes_per_sec.toFixed(1)} MB/s   (${r.seconds.toFixed(2)} s; ` +
      `slow-consumer episodes ${r.slow_consumer_episodes.join(', ')})`,
  )
}
const [json, msgpack] = rows as [(typeof rows)[0], (typeof rows)[0]]
console.log(`  msgpack/json events/s: ${(msgpack.events_per_sec / json.events_per_sec).toFixed(2)}`)
console.log('wrote bench/results/nats.json')
