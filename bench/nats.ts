// NATS intake throughput: the Mooncake workload's KV events (bench/lib/index-workload.ts)
// published through a real nats-server on the worker component's subject, consumed by
// NatsIntake into the shard pool. The clock runs from the first publish until the shards have
// applied the last event. Run: `npm run bench:nats [-- --reps R --shards S]`.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { connect } from 'nats'
import { buildIndexWorkload } from './lib/index-workload.js'
import { median, resultsDir } from './lib/common.js'
import { startNats } from '../test/helpers/services.js'
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
const events = workload.ops.filter((o) => o.kind === 'event') as { bytes: Uint8Array; blocks: number }[]
const blocks = events.reduce((s, e) => s + e.blocks, 0)
const bytes = events.reduce((s, e) => s + e.bytes.length, 0)

const nats = await startNats({ jetstream: false })
const subject = kvEventSubjects('dynamo', 'backend')[0] as string
const runs: { seconds: number; slow: number }[] = []
try {
  for (let r = 0; r < reps; r++) {
    const pool = await ShardPool.start({ shards })
    const intake = await NatsIntake.start({ url: nats.url, namespace: 'dynamo', component: 'backend', pool })
    const pub = await connect({ servers: nats.url })
    const t0 = performance.now()
    for (let i = 0; i < events.length; i++) {
      pub.publish(subject, (events[i] as { bytes: Uint8Array }).bytes)
      // let the client's socket drain now and then instead of buffering 166 MB
      if ((i & 255) === 255) await pub.flush()
    }
    await pub.flush()
    for (;;) {
      const done = pool.counters().reduce((s, c) => s + c.processed, 0)
      if (done >= events.length) break
      await new Promise((res) => setTimeout(res, 1))
    }
    const seconds = (performance.now() - t0) / 1000
    const c = pool.counters()
    if (c.reduce((s, x) => s + x.malformed + x.lost, 0) !== 0 || intake.counters.messages !== events.length) throw new Error('bench: events were lost or malformed')
    runs.push({ seconds, slow: intake.counters.slowConsumer })
    await pub.close()
    await intake.close()
    await pool.close()
  }
} finally {
  await nats.stop()
}

const sec = median(runs.map((x) => x.seconds))
const result = {
  command: 'npm run bench:nats',
  node: process.version,
  shards,
  reps,
  events: events.length,
  blocks,
  megabytes: bytes / 1e6,
  seconds: sec,
  events_per_sec: events.length / sec,
  blocks_per_sec: blocks / sec,
  megabytes_per_sec: bytes / 1e6 / sec,
  slow_consumer_episodes: runs.map((x) => x.slow),
}
writeFileSync(join(resultsDir(), 'nats.json'), JSON.stringify(result, null, 2) + '\n')
console.log(`NATS intake → ${shards} shard(s): ${events.length} events, ${blocks.toLocaleString('en-US')} blocks, ${result.megabytes.toFixed(1)} MB of JSON through nats-server; median of ${reps}`)
console.log(
  `  ${Math.round(result.events_per_sec).toLocaleString('en-US')} events/s   ${Math.round(result.blocks_per_sec).toLocaleString('en-US')} blocks/s   ${result.megabytes_per_sec.toFixed(1)} MB/s   (${sec.toFixed(2)} s; slow-consumer episodes ${result.slow_consumer_episodes.join(', ')})`,
)
console.log('wrote bench/results/nats.json')
