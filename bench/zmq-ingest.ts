// Engines' own KV events into one shard: a real zeromq PUB socket publishing vLLM batches
// (bench/lib/engine-workload.ts: 16-token blocks, prefix-cache chains, leaf-first evictions) →
// the router's ZmqListener and EngineIntake → the shard, which decodes the MessagePack, hashes
// each block's tokens and applies the events. Beside it, in the same run, the same events as
// RouterEvent JSON posted to a router's POST /v1/kv-events over HTTP in batches of the same size
// (a sender in this process, as the ZMQ publisher is: the like-for-like row), the same JSON
// pushed straight into the pool (no transport, no validation), and the decoders alone
// on the main thread (the hand-written reader the shards run and the msgpackr one). Run:
// `npm run bench:zmq [-- --ops N --reps R]`.
//
//   block_ops_per_sec   (stored + removed blocks) / wall time, from the first publish (or push)
//                       until the shard has applied the last event
//   decode only         block ops / the time to decode every batch into a DecodedEvent, tokens
//                       hashed (XXH3) as the shard does, nothing applied
//
// Every path runs once cold (a fresh shard's code is not optimised yet), then `reps` times,
// alternating, on one pool; the worker is removed between passes. Medians of the warm passes.
// Results: bench/results/zmq-ingest.json and a printed table.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { Publisher } from 'zeromq'
import type { EngineBatchDecoder } from '../src/codec/engine-events.js'
import { EngineEventDecoder } from '../support/engine-reference-decoder.js'
import { EngineStreamDecoder } from '../src/codec/engine-stream.js'
import { DecodedEvent } from '../src/codec/event-decoder.js'
import { ShardPool } from '../src/shards/pool.js'
import { EngineIntake } from '../src/transport/engine-intake.js'
import { request, Agent } from 'undici'
import { parseServeConfig } from '../src/config.js'
import type { ServeConfig } from '../src/config.js'
import { Router } from '../src/core/router.js'
import { buildApp } from '../src/http/server.js'
import { buildEngineWorkload } from './lib/engine-workload.js'
import { median, resultsDir } from './lib/common.js'

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(`--${name}`)
  if (i < 0) return dflt
  const v = Number(process.argv[i + 1])
  if (!Number.isInteger(v) || v <= 0) throw new Error(`--${name} needs a positive integer`)
  return v
}
const reps = arg('reps', 3)
const ops = arg('ops', 1_000_000)
const BS = 16
const ZMQ_WORKER = 1n
const JSON_WORKER = 2n

const w = buildEngineWorkload({ blockOps: ops, blockSize: BS, workerId: JSON_WORKER })
const bytesOf = (xs: Uint8Array[]): number => xs.reduce((s, x) => s + x.length, 0)

const pool = await ShardPool.start({ shards: 1 })
// the HTTP row's router: one shard too
const httpRouter = await Router.start(
  parseServeConfig(['--router-event-threads', '1', '--no-router-event-recovery', '--router-block-size', String(BS)], {}) as ServeConfig,
)
const httpApp = await buildApp({ router: httpRouter, tokenizer: null })
await httpApp.fastify.listen({ host: '127.0.0.1', port: 0 })
const httpAddr = httpApp.fastify.server.address()
const httpUrl = `http://127.0.0.1:${typeof httpAddr === 'object' && httpAddr !== null ? httpAddr.port : 0}/v1/kv-events`
const agent = new Agent({ connections: 1 })
// the JSON events grouped as the ZMQ batches group them
const perBatch = Math.max(1, Math.round(w.events / w.mapBatches.length))
const httpBodies: Buffer[] = []
for (let i = 0; i < w.json.length; i += perBatch) {
  const part = w.json.slice(i, i + perBatch)
  const body = Buffer.allocUnsafe(part.reduce((n, x) => n + x.length + 1, 1))
  let at = 0
  body[at++] = 0x5b
  for (let k = 0; k < part.length; k++) {
    if (k > 0) body[at++] = 0x2c
    body.set(part[k] as Uint8Array, at)
    at += (part[k] as Uint8Array).length
  }
  body[at++] = 0x5d
  httpBodies.push(body.subarray(0, at))
}
const intake = new EngineIntake(BS, pool)
const pub = new Publisher({ linger: 0, sendHighWaterMark: 0 })
let port = 0
for (;;) {
  port = 20000 + Math.floor(Math.random() * 30000)
  try {
    await pub.bind(`tcp://127.0.0.1:${port}`)
    break
  } catch {}
}
let seq = 0n
const be8 = (n: bigint): Buffer => {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(n)
  return b
}
const applied = (): number => pool.counters()[0]?.applied ?? 0
const nextTick = (): Promise<void> => new Promise((r) => setImmediate(r))

/** Waits until the shard's applied count reaches `target`; a pass that stops short (a batch lost) fails after a minute. */
async function appliedReaches(target: number, what: string): Promise<void> {
  const deadline = performance.now() + 60_000
  while (applied() < target) {
    if (performance.now() > deadline) {
      const c = pool.counters()[0]
      throw new Error(
        `bench: ${what} stopped at ${applied()} of ${target} events applied (rejected ${JSON.stringify(c?.rejected)}, engine ` +
          `${JSON.stringify(c?.engine)}, listener ${JSON.stringify(intake.counters())})`,
      )
    }
    await new Promise((r) => setTimeout(r, 1))
  }
}

/** One pass of the engine path: listeners start, every batch is published, until all is applied. */
async function zmqPass(batches: Uint8Array[]): Promise<number> {
  await intake.start(ZMQ_WORKER, 1, { endpoint: `tcp://127.0.0.1:${port}`, replay: null, topic: '' })
  // subscribed once an empty batch gets through (the PUB socket drops what it sends before)
  const empty = new Uint8Array([0x93, 0x00, 0x90, 0x00])
  const taken0 = intake.counters().batches
  const subscribeBy = performance.now() + 30_000
  while (intake.counters().batches === taken0) {
    if (performance.now() > subscribeBy) throw new Error('bench: the listener did not subscribe within 30 s')
    await pub.send(['', be8(seq++), empty])
    await new Promise((r) => setTimeout(r, 5))
  }
  await pool.flush()
  const base = applied()
  const gaps0 = intake.counters().gaps
  const t0 = performance.now()
  let sent = intake.counters().batches
  const start = sent
  for (let i = 0; i < batches.length; i++) {
    await pub.send(['', be8(seq++), batches[i] as Uint8Array])
    sent++
    // a SUB socket drops past its high-water mark: keep the listener within reach
    if ((i & 63) === 63) {
      const by = performance.now() + 30_000
      while (sent - intake.counters().batches > 512) {
        if (performance.now() > by) throw new Error(`bench: the listener stopped taking batches (${JSON.stringify(intake.counters())}, ${sent} sent)`)
        await nextTick()
      }
    }
  }
  await appliedReaches(base + w.events, 'the ZMQ pass')
  const seconds = (performance.now() - t0) / 1000
  if (intake.counters().gaps !== gaps0 || intake.counters().batches - start !== batches.length) throw new Error('bench: batches were lost on the way')
  await intake.stop(ZMQ_WORKER)
  await pool.removeWorker(ZMQ_WORKER)
  return seconds
}

/** One pass of the JSON path: every event pushed (waiting on 'drain' when the ring is full), until all is applied. */
async function jsonPass(): Promise<number> {
  await pool.flush()
  const base = applied()
  const t0 = performance.now()
  for (const msg of w.json) {
    // push() may have drained its queue (and emitted 'drain') before it returns false
    if (!pool.push(msg, JSON_WORKER) && pool.pendingMessages > 0) await new Promise((r) => pool.once('drain', r))
  }
  await appliedReaches(base + w.events, 'the JSON pass')
  const seconds = (performance.now() - t0) / 1000
  await pool.removeWorker(JSON_WORKER)
  return seconds
}

/** One pass of JSON over HTTP: every batch POSTed to /v1/kv-events in order, until all is applied. */
async function httpPass(): Promise<number> {
  await httpRouter.pool.flush()
  const done = (): number => httpRouter.pool.counters()[0]?.applied ?? 0
  const base = done()
  const t0 = performance.now()
  let next = 0
  const sender = async (): Promise<void> => {
    while (next < httpBodies.length) {
      const body = httpBodies[next++] as Buffer
      const r = await request(httpUrl, { method: 'POST', body, headers: { 'content-type': 'application/json' }, dispatcher: agent })
      if (r.statusCode !== 202) throw new Error(`bench: POST /v1/kv-events answered ${r.statusCode}: ${await r.body.text()}`)
      await r.body.dump()
    }
  }
  // one at a time: a worker's events must arrive in order
  await sender()
  const deadline = performance.now() + 60_000
  while (done() < base + w.events) {
    if (performance.now() > deadline) throw new Error(`bench: the HTTP pass stopped at ${done() - base} of ${w.events}`)
    await new Promise((r) => setTimeout(r, 1))
  }
  const seconds = (performance.now() - t0) / 1000
  await httpRouter.pool.removeWorker(JSON_WORKER)
  return seconds
}

/** Decodes every batch once with `dec` (tokens hashed, nothing applied). */
function decodePass(dec: EngineBatchDecoder, batches: Uint8Array[]): number {
  const out = new DecodedEvent()
  let events = 0
  const t0 = performance.now()
  for (const b of batches) {
    const n = dec.begin(b)
    for (let i = 0; i < n; i++) {
      if (dec.next(1, 0, 0, out) !== null) throw new Error('bench: an event was skipped')
      events++
    }
  }
  const seconds = (performance.now() - t0) / 1000
  if (events !== w.events) throw new Error('bench: events missing')
  return seconds
}

type Path = { name: string; run: () => Promise<number> | number; bytes: number }
const only = process.argv.includes('--trace') ? console.error : (..._: unknown[]) => {}
const paths: Path[] = [
  { name: 'ZMQ, vLLM map form → shard', run: () => zmqPass(w.mapBatches), bytes: bytesOf(w.mapBatches) },
  { name: 'ZMQ, vLLM array form → shard', run: () => zmqPass(w.arrayBatches), bytes: bytesOf(w.arrayBatches) },
  { name: 'RouterEvent JSON, POST /v1/kv-events → shard', run: httpPass, bytes: bytesOf(httpBodies) },
  { name: 'RouterEvent JSON pushed into the pool → shard', run: jsonPass, bytes: bytesOf(w.json) },
  { name: 'decode only, hand-written, map form', run: () => decodePass(new EngineStreamDecoder(BS), w.mapBatches), bytes: bytesOf(w.mapBatches) },
  { name: 'decode only, msgpackr, map form', run: () => decodePass(new EngineEventDecoder(BS), w.mapBatches), bytes: bytesOf(w.mapBatches) },
  { name: 'decode only, hand-written, array form', run: () => decodePass(new EngineStreamDecoder(BS), w.arrayBatches), bytes: bytesOf(w.arrayBatches) },
  { name: 'decode only, msgpackr, array form', run: () => decodePass(new EngineEventDecoder(BS), w.arrayBatches), bytes: bytesOf(w.arrayBatches) },
]
const times = new Map<string, { cold: number; warm: number[] }>()
try {
  for (const p of paths) {
    times.set(p.name, { cold: await p.run(), warm: [] })
    only('cold', p.name, times.get(p.name)?.cold)
  }
  for (let r = 0; r < reps; r++) for (const p of paths) times.get(p.name)?.warm.push(await p.run())
  const c = pool.counters()[0]
  const e = intake.engineCounters()
  const bad =
    (c?.malformed ?? 0) +
    Object.values(c?.rejected ?? {}).reduce((s, x) => s + x, 0) +
    Object.values(e.malformed).reduce((s, x) => s + x, 0) +
    Object.values(e.skipped).reduce((s, x) => s + x, 0)
  if (bad !== 0 || (c?.gaps ?? 0) !== 0) throw new Error(`bench: events were refused (${bad}) or gaps counted (${c?.gaps})`)
} finally {
  pub.close()
  await intake.close()
  await pool.close()
  await httpApp.shutdown(1000)
  await httpRouter.close()
  await agent.close()
}

const rows = paths.map((p) => {
  const t = times.get(p.name) as { cold: number; warm: number[] }
  const sec = median(t.warm)
  return {
    path: p.name,
    seconds: sec,
    block_ops_per_sec: w.blockOps / sec,
    events_per_sec: w.events / sec,
    megabytes_per_sec: p.bytes / 1e6 / sec,
    cold_block_ops_per_sec: w.blockOps / t.cold,
  }
})
const rate = (name: string): number => rows.find((r) => r.path.startsWith(name))?.block_ops_per_sec ?? 0
const result = {
  command: 'npm run bench:zmq',
  node: process.version,
  shards: 1,
  reps,
  block_size: BS,
  events: w.events,
  block_ops: w.blockOps,
  stored_blocks: w.storedBlocks,
  removed_blocks: w.removedBlocks,
  batches: w.mapBatches.length,
  rows,
  zmq_map_over_json_posted: rate('ZMQ, vLLM map') / rate('RouterEvent JSON, POST'),
  zmq_map_over_json_pushed: rate('ZMQ, vLLM map') / rate('RouterEvent JSON pushed'),
  hand_written_over_msgpackr_map: rate('decode only, hand-written, map') / rate('decode only, msgpackr, map'),
  hand_written_over_msgpackr_array: rate('decode only, hand-written, array') / rate('decode only, msgpackr, array'),
}
writeFileSync(join(resultsDir(), 'zmq-ingest.json'), JSON.stringify(result, null, 2) + '\n')
const fmt = (n: number): string => Math.round(n).toLocaleString('en-US')
console.log(
  `engines' KV events → 1 shard: ${fmt(w.events)} events, ${fmt(w.blockOps)} block ops (${fmt(w.storedBlocks)} stored, ${fmt(w.removedBlocks)} ` +
    `removed), ${BS}-token blocks, ${w.mapBatches.length} batches; median of ${reps} warm passes`,
)
console.log(`| path | block ops/s | events/s | MB/s | cold pass, block ops/s |`)
console.log(`|---|---:|---:|---:|---:|`)
for (const r of rows)
  console.log(`| ${r.path} | ${fmt(r.block_ops_per_sec)} | ${fmt(r.events_per_sec)} | ${r.megabytes_per_sec.toFixed(1)} | ${fmt(r.cold_block_ops_per_sec)} |`)
console.log(
  `ZMQ (map) / JSON posted ${result.zmq_map_over_json_posted.toFixed(2)}×, / JSON pushed ${result.zmq_map_over_json_pushed.toFixed(2)}×; ` +
    `hand-written / msgpackr decode ${result.hand_written_over_msgpackr_map.toFixed(2)}× (map), ` +
    `${result.hand_written_over_msgpackr_array.toFixed(2)}× (array)`,
)
console.log('wrote bench/results/zmq-ingest.json')
