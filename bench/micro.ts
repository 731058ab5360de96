// Micro benchmarks of the single-threaded building blocks: block hashing, index apply,
// find_matches, reading /v1/route's token ids, and parsing a completions body with exact u64s.
// Run with `npm run bench:micro` (BENCH_REPS sets the repetitions, 7 by default); writes
// bench/results/micro.json and prints a table.
// Every figure is the median over several repetitions in this one process: the machines are
// shared and noisy, so single runs mean little.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { blockHashesInto, sequenceHashesInto } from '../src/codec/hashing.js'
import { KvIndex } from '../src/index/kv-index.js'
import { DecodedEvent, EventDecoder, EventKind } from '../src/codec/event-decoder.js'
import { encodeRouterEvent, toDecoded } from '../src/codec/events.js'
import { RouteBodyScanner } from '../src/codec/route-body.js'
import { parseJsonExact } from '../src/codec/json.js'
import { median, resultsDir } from './lib/common.js'
import { quantileOf } from './lib/stats.js'
import { benchHeap } from './lib/heap.js'
import { RouterEventDecoder } from '../src/codec/dynamo-msgpack.js'
import { u64FromParts } from '../src/codec/u64.js'
import { predictedStoredRecord } from '../src/shards/control-records.js'
import { readPredicted } from '../src/thread/records.js'

const REPS = Number(process.env.BENCH_REPS ?? 7)

const now = (): number => Number(process.hrtime.bigint()) / 1e3 // µs

// --- deterministic inputs -------------------------------------------------------------------
let seed = 12345
function rand(): number {
  seed = (seed + 0x6d2b79f5) >>> 0
  let t = seed
  t = Math.imul(t ^ (t >>> 15), t | 1)
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}
function tokens(n: number): Uint32Array {
  const a = new Uint32Array(n)
  for (let i = 0; i < n; i++) a[i] = Math.floor(rand() * 150000)
  return a
}

// --- hashing --------------------------------------------------------------------------------
function benchHashing(blockSize: number): Record<string, { blocks: number; local_us: number; local_and_seq_us: number; ns_per_block: number }> {
  const out: Record<string, { blocks: number; local_us: number; local_and_seq_us: number; ns_per_block: number }> = {}
  for (const n of [4096, 32768, 131072]) {
    const toks = tokens(n)
    const nb = Math.floor(n / blockSize)
    const lo = new Uint32Array(nb)
    const hi = new Uint32Array(nb)
    const slo = new Uint32Array(nb)
    const shi = new Uint32Array(nb)
    const inner = Math.max(3, Math.round(200000 / n))
    const locals: number[] = []
    const both: number[] = []
    for (let r = 0; r < REPS; r++) {
      let t0 = now()
      for (let i = 0; i < inner; i++) blockHashesInto(toks, blockSize, lo, hi)
      locals.push((now() - t0) / inner)
      t0 = now()
      for (let i = 0; i < inner; i++) {
        blockHashesInto(toks, blockSize, lo, hi)
        sequenceHashesInto(lo, hi, nb, slo, shi)
      }
      both.push((now() - t0) / inner)
    }
    const local = median(locals)
    out[`${n / 1024}k`] = { blocks: nb, local_us: local, local_and_seq_us: median(both), ns_per_block: (local * 1000) / nb }
  }
  return out
}

// --- index apply ----------------------------------------------------------------------------
// 64 worker-ranks serve 24-block requests that share a 4-block system prompt; each request
// stores its new blocks under the last cached one, as an engine publishes them.
const WORKERS = 64
const BLOCKS = 24
const SHARED = 4

function makeStoreEvents(requests: number, tag = 0xdef): { events: DecodedEvent[]; blocks: number; removes: DecodedEvent[] } {
  const events: DecodedEvent[] = []
  const removes: DecodedEvent[] = []
  let blocks = 0
  const hasPrefix = new Uint8Array(WORKERS)
  let uniq = 1
  for (let r = 0; r < requests; r++) {
    const w = Math.floor(rand() * WORKERS)
    const ev = new DecodedEvent()
    ev.kind = EventKind.Stored
    ev.workerLo = 1000 + w
    ev.workerHi = 0x12345
    const start = hasPrefix[w] === 1 ? SHARED : 0
    if (start > 0) {
      ev.hasParent = true
      ev.parentLo = SHARED - 1 + 1
      ev.parentHi = 0xabc
    }
    const n = BLOCKS - start
    ev.ensure(n)
    for (let i = 0; i < n; i++) {
      const depth = start + i
      if (depth < SHARED) {
        ev.blockLo[i] = depth + 1
        ev.blockHi[i] = 0xabc
        ev.tokensLo[i] = depth + 1
        ev.tokensHi[i] = 0x777
      } else {
        ev.blockLo[i] = uniq
        ev.blockHi[i] = tag
        ev.tokensLo[i] = uniq
        ev.tokensHi[i] = tag ^ 0x999
        uniq++
      }
    }
    ev.count = n
    blocks += n
    hasPrefix[w] = 1
    events.push(ev)
    const rm = new DecodedEvent()
    rm.kind = EventKind.Removed
    rm.workerLo = ev.workerLo
    rm.workerHi = ev.workerHi
    const u = n - (start === 0 ? SHARED : 0)
    rm.ensure(u)
    for (let i = 0; i < u; i++) {
      rm.blockLo[i] = ev.blockLo[n - u + i] as number
      rm.blockHi[i] = tag
    }
    rm.count = u
    removes.push(rm)
  }
  return { events, blocks, removes }
}

function benchApply(): {
  churn_stored_blocks_per_sec: number
  churn_removed_blocks_per_sec: number
  stored_blocks_per_sec: number
  stored_blocks_per_sec_cold: number
  removed_blocks_per_sec: number
  decode_and_apply_blocks_per_sec: number
  bytes_per_block: number
  entries: number
} {
  const { events, blocks, removes } = makeStoreEvents(40000)
  const removedBlocks = removes.reduce((s, e) => s + e.count, 0)
  const storeRates: number[] = []
  const coldRates: number[] = []
  const removeRates: number[] = []
  let bytesPerBlock = 0
  let entries = 0
  // Steady state: one index that already grew to this size once (as a long-running shard has),
  // filled and drained every repetition. Cold: a fresh index that grows as it fills.
  const warm = new KvIndex()
  for (const ev of events) warm.apply(ev)
  for (const ev of removes) warm.apply(ev)
  for (let r = 0; r < REPS; r++) {
    const cold = new KvIndex()
    let t0 = now()
    for (const ev of events) cold.apply(ev)
    coldRates.push(blocks / ((now() - t0) / 1e6))
    const base = warm.liveEntries
    t0 = now()
    for (const ev of events) warm.apply(ev)
    storeRates.push(blocks / ((now() - t0) / 1e6))
    entries = cold.liveEntries
    bytesPerBlock = cold.bytes / cold.liveEntries
    t0 = now()
    for (const ev of removes) warm.apply(ev)
    removeRates.push(removedBlocks / ((now() - t0) / 1e6))
    if (warm.liveEntries !== base) throw new Error('bench: removal did not remove what it should')
  }
  // Steady churn, the shape an engine-fed index lives in: the index holds 40,000 requests, and
  // each step evicts the oldest request's blocks (Removed) and stores a new request (Stored),
  // as a block pool publishes them. Stored and removed events are timed separately.
  const second = makeStoreEvents(40000, 0xdee)
  const sets = [
    { events, removes },
    { events: second.events, removes: second.removes },
  ]
  const churnStore: number[] = []
  const churnRemove: number[] = []
  const ix = new KvIndex()
  for (const ev of events) ix.apply(ev)
  for (let r = 0; r < REPS; r++) {
    const from = sets[r % 2] as (typeof sets)[number]
    const to = sets[(r + 1) % 2] as (typeof sets)[number]
    let tStore = 0
    let tRemove = 0
    let nStore = 0
    let nRemove = 0
    for (let i = 0; i < from.events.length; i++) {
      const rm = from.removes[i] as DecodedEvent
      const ev = to.events[i] as DecodedEvent
      let t0 = now()
      ix.apply(rm)
      const t1 = now()
      ix.apply(ev)
      const t2 = now()
      tRemove += t1 - t0
      tStore += t2 - t1
      nRemove += rm.count
      nStore += ev.count
      t0 = t2
    }
    churnStore.push(nStore / (tStore / 1e6))
    churnRemove.push(nRemove / (tRemove / 1e6))
  }
  // The same stores from JSON bytes through the shard's decoder, to show the full per-event cost.
  const jsons = events.slice(0, 10000).map((ev) => Buffer.from(encodeRouterEvent({ ...toRouterEventLike(ev) })))
  const jsonBlocks = events.slice(0, 10000).reduce((s, e) => s + e.count, 0)
  const decodeRates: number[] = []
  for (let r = 0; r < REPS; r++) {
    const ix = new KvIndex()
    const dec = new EventDecoder()
    const t0 = now()
    for (const b of jsons) ix.apply(dec.decode(b))
    decodeRates.push(jsonBlocks / ((now() - t0) / 1e6))
  }
  return {
    churn_stored_blocks_per_sec: median(churnStore),
    churn_removed_blocks_per_sec: median(churnRemove),
    stored_blocks_per_sec: median(storeRates),
    stored_blocks_per_sec_cold: median(coldRates),
    removed_blocks_per_sec: median(removeRates),
    decode_and_apply_blocks_per_sec: median(decodeRates),
    bytes_per_block: bytesPerBlock,
    entries,
  }
}

function toRouterEventLike(ev: DecodedEvent): Parameters<typeof encodeRouterEvent>[0] {
  const big = (lo: number, hi: number): bigint => (BigInt(hi) << 32n) | BigInt(lo)
  const blocks = []
  for (let i = 0; i < ev.count; i++)
    blocks.push({ block_hash: big(ev.blockLo[i] as number, ev.blockHi[i] as number), tokens_hash: big(ev.tokensLo[i] as number, ev.tokensHi[i] as number) })
  return {
    worker_id: big(ev.workerLo, ev.workerHi),
    event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: ev.hasParent ? big(ev.parentLo, ev.parentHi) : null, blocks } } },
  }
}

// --- find_matches ---------------------------------------------------------------------------
function benchFind(kind: 'all-hold-all' | 'staggered'): { p50_us: number; p99_us: number; mean_us: number } {
  const toks = tokens(BLOCKS * 64)
  const lo = new Uint32Array(BLOCKS)
  const hi = new Uint32Array(BLOCKS)
  const slo = new Uint32Array(BLOCKS)
  const shi = new Uint32Array(BLOCKS)
  blockHashesInto(toks, 64, lo, hi)
  sequenceHashesInto(lo, hi, BLOCKS, slo, shi)
  const ix = new KvIndex()
  for (let w = 0; w < WORKERS; w++) {
    const depth = kind === 'all-hold-all' ? BLOCKS : 1 + (w % BLOCKS)
    const blocks = []
    for (let i = 0; i < depth; i++)
      blocks.push({
        block_hash: (BigInt(shi[i] as number) << 32n) | BigInt(slo[i] as number),
        tokens_hash: (BigInt(hi[i] as number) << 32n) | BigInt(lo[i] as number),
      })
    ix.apply(toDecoded({ worker_id: BigInt(w + 1), event: { event_id: 0n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } }))
    // plus unrelated load so the tables are not tiny
    const noise = []
    for (let i = 0; i < 200; i++) noise.push({ block_hash: BigInt(w * 1000 + i + 1) << 20n, tokens_hash: BigInt(w * 1000 + i + 7) << 21n })
    ix.apply(toDecoded({ worker_id: BigInt(w + 1), event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: noise } } } }))
  }
  const expect = ix.findMatches(lo, hi, BLOCKS)
  if (expect !== WORKERS) throw new Error(`bench: expected ${WORKERS} matches, got ${expect}`)
  const N = 20000
  const samples = new Float64Array(N)
  const means: number[] = []
  let sink = 0
  for (let r = 0; r < REPS; r++) {
    const t0 = now()
    for (let i = 0; i < N; i++) sink += ix.findMatches(lo, hi, BLOCKS)
    means.push((now() - t0) / N)
  }
  // individually timed queries for the tail (the timer itself adds ~0.05 µs)
  for (let i = 0; i < N; i++) {
    const t0 = process.hrtime.bigint()
    sink += ix.findMatches(lo, hi, BLOCKS)
    samples[i] = Number(process.hrtime.bigint() - t0) / 1e3
  }
  if (sink === 0) throw new Error('unreachable')
  return { p50_us: quantileOf(samples, 0.5), p99_us: quantileOf(samples, 0.99), mean_us: median(means) }
}

// --- run ------------------------------------------------------------------------------------
const hashing64 = benchHashing(64)
const hashing16 = benchHashing(16)
const apply = benchApply()
const findAll = benchFind('all-hold-all')
const findStaggered = benchFind('staggered')

// --- /v1/route body -------------------------------------------------------------------------
/**
 * The JSON of 4,096-token prompts (ids < 150,000, as bench:route sends) read by the body
 * scanner, with the WebAssembly SIMD scanner and with the byte loop alone (what a runtime
 * without SIMD runs), alternated rep by rep.
 */
function benchRouteBody(): {
  bytes_per_body: number
  simd_us: number
  byte_loop_us: number
  simd_mb_per_s: number
  simd_reps: number[]
  byte_loop_reps: number[]
} {
  const bodies = Array.from({ length: 64 }, () => Buffer.from(JSON.stringify({ token_ids: Array.from(tokens(4096)) })))
  const scanners = { simd: new RouteBodyScanner(), byteLoop: new RouteBodyScanner({ simd: false }) }
  const N = 2000
  const reps = { simd: [] as number[], byteLoop: [] as number[] }
  for (let r = 0; r < REPS + 1; r++) {
    for (const k of ['simd', 'byteLoop'] as const) {
      const sc = scanners[k]
      let ids = 0
      const t0 = now()
      for (let i = 0; i < N; i++) ids += (sc.scan(bodies[i & 63] as Buffer).tokens as Uint32Array).length
      const us = (now() - t0) / N
      if (ids !== N * 4096) throw new Error('the scanner lost ids')
      if (r > 0) reps[k].push(us) // the first rep warms both up
    }
  }
  const bytes = bodies.reduce((a, b) => a + b.length, 0) / bodies.length
  const simdUs = median(reps.simd)
  return {
    bytes_per_body: Math.round(bytes),
    simd_us: simdUs,
    byte_loop_us: median(reps.byteLoop),
    simd_mb_per_s: bytes / simdUs,
    simd_reps: reps.simd,
    byte_loop_reps: reps.byteLoop,
  }
}
const routeBody = benchRouteBody()
const heap = benchHeap(REPS)

/**
 * A /v1/completions body as the proxy parses it (parseJsonExact: JSON.parse plus the check that
 * keeps u64s exact) against JSON.parse alone, alternated rep by rep: what exactness costs.
 */
function benchCompletionsBody(): Record<string, { bytes: number; exact_us: number; json_parse_us: number; ratio: number }> {
  const out: Record<string, { bytes: number; exact_us: number; json_parse_us: number; ratio: number }> = {}
  const text = 'a router that knows where each prefix is cached sends the request there '.repeat(220)
  const shapes: [string, () => string][] = [
    ['64 token ids', () => JSON.stringify({ model: 'm', prompt: Array.from(tokens(64)), max_tokens: 16, stream: true })],
    ['4096 token ids', () => JSON.stringify({ model: 'm', prompt: Array.from(tokens(4096)), max_tokens: 16, stream: true })],
    ['16 KB text', () => JSON.stringify({ model: 'm', prompt: `${Math.floor(rand() * 1e6)} ${text}`, max_tokens: 16, stream: true })],
  ]
  for (const [name, make] of shapes) {
    const bodies = Array.from({ length: 64 }, make)
    const bytes = bodies.reduce((a, b) => a + b.length, 0) / bodies.length
    const n = Math.max(500, Math.round(2e7 / bytes))
    const reps = { exact: [] as number[], parse: [] as number[] }
    for (let r = 0; r < REPS + 1; r++) {
      for (const [k, fn] of [
        ['exact', parseJsonExact],
        ['parse', JSON.parse],
      ] as const) {
        let keys = 0
        const t0 = now()
        for (let i = 0; i < n; i++) keys += Object.keys(fn(bodies[i & 63] as string) as object).length
        const us = (now() - t0) / n
        if (keys !== n * 4) throw new Error('a body parsed wrong')
        if (r > 0) reps[k].push(us)
      }
    }
    const exact = median(reps.exact)
    const parse = median(reps.parse)
    out[name] = { bytes: Math.round(bytes), exact_us: exact, json_parse_us: parse, ratio: exact / parse }
  }
  return out
}
const completionsBody = benchCompletionsBody()

// --- predicted blocks: what approximate mode hands a shard per routing decision -------------
/** One 24-block prediction written and read back: as a PREDICTED ring record, and as a RouterEvent's JSON. */
function benchPredicted(): { blocks: number; record_us: number; json_us: number } {
  const n = 24
  const [localLo, localHi, seqLo, seqHi] = [0, 1, 2, 3].map(() => Uint32Array.from({ length: n }, () => (rand() * 4294967296) >>> 0)) as [
    Uint32Array,
    Uint32Array,
    Uint32Array,
    Uint32Array,
  ]
  const ev = new DecodedEvent()
  const decoder = new RouterEventDecoder()
  const inner = 20000
  const rec: number[] = []
  const json: number[] = []
  let sink = 0
  for (let r = 0; r < REPS; r++) {
    let t0 = now()
    for (let i = 0; i < inner; i++) sink += readPredicted(predictedStoredRecord(7n, 0, BigInt(i + 1), localLo, localHi, seqLo, seqHi, n), ev).count
    rec.push((now() - t0) / inner)
    t0 = now()
    for (let i = 0; i < inner; i++) {
      const blocks = []
      for (let k = 0; k < n; k++)
        blocks.push({ block_hash: u64FromParts(seqLo[k] as number, seqHi[k] as number), tokens_hash: u64FromParts(localLo[k] as number, localHi[k] as number) })
      const bytes = Buffer.from(
        encodeRouterEvent({ worker_id: 7n, event: { event_id: BigInt(i + 1), dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } }),
      )
      sink += decoder.decode(bytes).count
    }
    json.push((now() - t0) / inner)
  }
  if (sink === 0) throw new Error('nothing decoded')
  return { blocks: n, record_us: median(rec), json_us: median(json) }
}
const predicted = benchPredicted()

const result = {
  command: 'npm run bench:micro',
  node: process.version,
  reps: REPS,
  hashing_block_size_64: hashing64,
  hashing_block_size_16: hashing16,
  index_apply: apply,
  find_matches_24_blocks_64_worker_ranks: { all_hold_all: findAll, staggered_depths: findStaggered },
  route_body_4096_tokens: routeBody,
  completions_body_exact_parse: completionsBody,
  scheduler_heap: heap,
  predicted_blocks_24: predicted,
}
writeFileSync(join(resultsDir(), 'micro.json'), JSON.stringify(result, null, 2) + '\n')

const f = (x: number, d = 2): string => x.toFixed(d)
console.log(`kv-router micro benchmarks (median of ${REPS} reps, node ${process.version})\n`)
console.log('hashing (local hashes / local + sequence hashes)')
for (const [bs, h] of [
  ['64', hashing64],
  ['16', hashing16],
] as const) {
  for (const [k, v] of Object.entries(h))
    console.log(
      `  ${k.padStart(5)} tokens, block ${bs.padStart(2)}: ${String(v.blocks).padStart(5)} blocks  ${f(v.local_us, 1).padStart(8)} µs  ` +
        `${f(v.local_and_seq_us, 1).padStart(8)} µs  (${f(v.ns_per_block, 0)} ns/block)`,
    )
}
console.log('\nindex apply (single thread, 64 worker-ranks, 24-block requests)')
console.log(
  `  stored blocks/s, churn    ${Math.round(apply.churn_stored_blocks_per_sec).toLocaleString('en-US').padStart(12)}   (full index; each request's ` +
    `Removed then a new request's Stored)`,
)
console.log(`  removed blocks/s, churn   ${Math.round(apply.churn_removed_blocks_per_sec).toLocaleString('en-US').padStart(12)}`)
console.log(`  stored blocks/s, refill   ${Math.round(apply.stored_blocks_per_sec).toLocaleString('en-US').padStart(12)}   (a drained index refilled in bulk)`)
console.log(
  `  stored blocks/s, cold     ${Math.round(apply.stored_blocks_per_sec_cold).toLocaleString('en-US').padStart(12)}   (fresh index growing as it fills)`,
)
console.log(`  removed blocks/s          ${Math.round(apply.removed_blocks_per_sec).toLocaleString('en-US').padStart(12)}`)
console.log(`  JSON decode + apply blk/s ${Math.round(apply.decode_and_apply_blocks_per_sec).toLocaleString('en-US').padStart(12)}`)
console.log(`  bytes per (block, worker) ${f(apply.bytes_per_block, 1).padStart(12)}   (${apply.entries.toLocaleString('en-US')} entries)`)
console.log('\nfind_matches, 24-block prompt, 64 worker-ranks      p50 µs   p99 µs   mean µs')
console.log(
  `  all 64 hold all 24 blocks                       ${f(findAll.p50_us).padStart(7)}  ${f(findAll.p99_us).padStart(7)}  ${f(findAll.mean_us, 3).padStart(8)}`,
)
console.log(
  `  staggered depths (a drop at every block)        ${f(findStaggered.p50_us).padStart(7)}  ${f(findStaggered.p99_us).padStart(7)}  ` +
    `${f(findStaggered.mean_us, 3).padStart(8)}`,
)
console.log(`\n/v1/route body, 4,096 token ids (${routeBody.bytes_per_body.toLocaleString('en-US')} bytes of JSON), µs per body`)
console.log(`  WebAssembly SIMD scanner ${f(routeBody.simd_us, 1).padStart(8)}   (${f(routeBody.simd_mb_per_s, 0)} MB/s)`)
console.log(
  `  byte loop alone          ${f(routeBody.byte_loop_us, 1).padStart(8)}   (a runtime without SIMD; ratio ` +
    `${f(routeBody.simd_us / routeBody.byte_loop_us, 2)})`,
)
console.log('\n/v1/completions body with exact u64s (parseJsonExact) vs JSON.parse alone, µs per body')
for (const [k, v] of Object.entries(completionsBody))
  console.log(`  ${k.padEnd(15)} ${String(v.bytes).padStart(7)} bytes  ${f(v.exact_us).padStart(8)}  ${f(v.json_parse_us).padStart(8)}   (ratio ${f(v.ratio)})`)
console.log(`\nscheduler heap (src/scheduler/binary-heap.ts)                 per wall s   per CPU s`)
console.log(
  `  approximate mode: record + expire, ${heap.blocks.toLocaleString('en-US')} blocks, ${heap.workers} ranks  ` +
    `${(heap.approx_blocks_per_sec / 1e6).toFixed(2).padStart(6)} M     ${(heap.approx_blocks_per_cpu_sec / 1e6).toFixed(2).padStart(6)} M blocks`,
)
console.log(
  `  waiting room: churn at depth ${heap.queue_depth.toLocaleString('en-US')}                         ` +
    `${(heap.queue_ops_per_sec / 1e6).toFixed(2).padStart(6)} M     ${(heap.queue_ops_per_cpu_sec / 1e6).toFixed(2).padStart(6)} M ops`,
)
console.log(`\npredicted blocks, ${predicted.blocks} per event, written and read back, µs per event`)
console.log(`  PREDICTED ring record    ${f(predicted.record_us).padStart(8)}`)
console.log(`  RouterEvent JSON         ${f(predicted.json_us).padStart(8)}`)
console.log(`\nwrote ${join('bench', 'results', 'micro.json')}`)
