// The engine KV-event intake fuzzed over real ZMQ sockets, through public behaviour only (HTTP
// and metric names): the test's own PUB and replay ROUTER publish to a router that has the
// worker registered with kv_events_endpoint (POST /v1/workers). Seeded; KVR_FUZZ_SEED replays a
// run. Well-formed batches, whose effect a model of the worker's blocks tracks, are interleaved
// with bad ones built so that their outcome is known whatever MessagePack reader takes them:
// - frames that are not [topic, 8-byte seq, payload], live and in the replay (bad_frames);
//   they take no sequence number;
// - payloads that are no batch: truncated values, random bytes that end inside a value or start
//   with a scalar, bit flips that leave a value unfinished, valid MessagePack with one field of
//   the wrong type or out of range (sink_errors: the batch is dropped whole, none of its events
//   applied);
// - events the router skips by rule (another block size, a sliding-window group, an unknown
//   type, no whole block), counted by reason;
// - batches on another topic, which the subscription filters out unseen.
// A bit flip that still decodes is kept only when it changed nothing but the timestamp (then it
// is a well-formed batch); otherwise it is drawn again, since predicting its effect would take a
// second decoder. After the last batch the router must answer, hold for the worker exactly the
// model's blocks (GET /v1/kv/dump, and POST /v1/overlap on the longest chain), and its counters
// must account for every bad frame, batch and event.
import t from 'tap'
import { Packr, Unpackr } from 'msgpackr'
import { Publisher, Router as ZmqRouter } from 'zeromq'
import { computeBlockHashes } from '../../src/codec/hashing.js'
import { Router } from '../../src/core/router.js'
import { buildApp } from '../../src/http/server.js'
import { config } from '../http/helpers.js'
import { Rng } from '../helpers/rng.js'
import { waitUntil } from '../helpers/wait.js'
import { dumpedBlocks } from '../helpers/zmq-fleet.js'

const BS = 4
const WORKER = 77
const TOPIC = 'kv-events'
const SEED = Number(process.env['KVR_FUZZ_SEED'] ?? 20260701)
/** Entries in the replay buffer before the worker registers, then live messages. */
const REPLAYED = 40
const LIVE = 450

const packr = new Packr({ useRecords: false, variableMapSize: true })
const unpackr = new Unpackr({ int64AsType: 'bigint', mapsAsObjects: true, useRecords: false })

// ---- the model: what the index must hold for the worker ----

interface Block {
  tokens: number[]
  parent: bigint | null
  children: Set<bigint>
}

class Model {
  blocks = new Map<bigint, Block>()

  clone(): Model {
    const m = new Model()
    for (const [h, b] of this.blocks) m.blocks.set(h, { tokens: b.tokens, parent: b.parent, children: new Set(b.children) })
    return m
  }

  store(parent: bigint | null, chain: { hash: bigint; tokens: number[] }[]): void {
    let p = parent
    for (const c of chain) {
      this.blocks.set(c.hash, { tokens: c.tokens, parent: p, children: new Set() })
      if (p !== null) this.blocks.get(p)?.children.add(c.hash)
      p = c.hash
    }
  }

  /** Removes a leaf (a removed inner block would cut its subtree off, which the model leaves to the index's own tests). */
  remove(h: bigint): void {
    const b = this.blocks.get(h)
    if (b === undefined || b.children.size > 0) throw new Error('the model removes leaves only')
    this.blocks.delete(h)
    if (b.parent !== null) this.blocks.get(b.parent)?.children.delete(h)
  }

  leaves(): bigint[] {
    return [...this.blocks].filter(([, b]) => b.children.size === 0).map(([h]) => h)
  }

  /** The tokens from the root to `h`. */
  path(h: bigint): number[] {
    const out: number[][] = []
    for (let x: bigint | null = h; x !== null; x = this.blocks.get(x)?.parent ?? null) out.unshift((this.blocks.get(x) as Block).tokens)
    return out.flat()
  }
}

// ---- generators ----

type Skip = 'block_size_mismatch' | 'attention_kind' | 'unknown_event' | 'empty'

/** A well-formed batch: its payload, the model after it, and the events it skips. */
interface Good {
  batch: unknown[]
  after: Model
  skips: Skip[]
}

class Gen {
  private readonly used = new Set<bigint>()
  constructor(readonly rng: Rng) {}

  u64(): bigint {
    for (;;) {
      const h = (BigInt(this.rng.int(2 ** 32)) << 32n) | BigInt(this.rng.int(2 ** 32))
      if (!this.used.has(h)) {
        this.used.add(h)
        return h
      }
    }
  }

  tokens(n: number): number[] {
    return Array.from({ length: n }, () => this.rng.int(2 ** 31))
  }

  /** A hash in one of the forms engines send: u64, the same bits as i64, a small int, or a digest whose last 8 bytes are it. */
  hashValue(h: bigint): unknown {
    const r = this.rng.int(4)
    if (r === 0) return BigInt.asIntN(64, h)
    if (r === 1 && h < 2n ** 31n) return Number(h)
    if (r === 2) {
      const b = Buffer.alloc(32)
      for (let i = 0; i < 24; i++) b[i] = this.rng.int(256)
      b.writeBigUInt64BE(h, 24)
      return b
    }
    return h
  }

  stored(hashes: bigint[], parent: bigint | null, tokens: number[], extra: { blockSize?: number; kind?: string } = {}): unknown {
    const f = {
      block_hashes: hashes.map((h) => this.hashValue(h)),
      parent_block_hash: parent === null ? null : this.hashValue(parent),
      token_ids: tokens,
      block_size: extra.blockSize ?? BS,
      medium: this.rng.pick(['GPU', null, undefined]),
      kind: extra.kind ?? this.rng.pick(['full_attention', undefined]),
    }
    if (this.rng.next() < 0.5)
      return ['BlockStored', f.block_hashes, f.parent_block_hash, f.token_ids, f.block_size, null, f.medium ?? null, null, null, 0, f.kind ?? null]
    const m: Record<string, unknown> = {
      type: 'BlockStored',
      block_hashes: f.block_hashes,
      parent_block_hash: f.parent_block_hash,
      token_ids: f.token_ids,
      block_size: f.block_size,
    }
    if (f.medium !== undefined) m.medium = f.medium
    if (f.kind !== undefined) m.kv_cache_spec_kind = f.kind
    return m
  }

  removed(hashes: bigint[]): unknown {
    const hs = hashes.map((h) => this.hashValue(h))
    return this.rng.next() < 0.5 ? ['BlockRemoved', hs, 'GPU', 0] : { type: 'BlockRemoved', block_hashes: hs }
  }

  /** One event that changes the draft model. */
  private effect(m: Model): unknown {
    const r = this.rng.next()
    if (r < 0.04) {
      m.blocks.clear()
      return this.rng.next() < 0.5 ? ['AllBlocksCleared'] : { type: 'AllBlocksCleared' }
    }
    const leaves = m.leaves()
    if (r < 0.35 && leaves.length > 0) {
      const gone: bigint[] = []
      for (let i = 1 + this.rng.int(2); i > 0; i--) {
        const l = m.leaves()
        if (l.length === 0) break
        const h = this.rng.pick(l)
        m.remove(h)
        gone.push(h)
      }
      return this.removed(gone)
    }
    const keys = [...m.blocks.keys()]
    const parent = keys.length === 0 || this.rng.next() < 0.3 ? null : this.rng.pick(keys)
    const chain = Array.from({ length: 1 + this.rng.int(3) }, () => ({ hash: this.u64(), tokens: this.tokens(BS) }))
    m.store(parent, chain)
    // a partial block after the whole ones carries no block of its own
    const tail = this.rng.next() < 0.2 ? this.tokens(1 + this.rng.int(BS - 1)) : []
    return this.stored(
      chain.map((c) => c.hash),
      parent,
      [...chain.flatMap((c) => c.tokens), ...tail],
    )
  }

  /** One event the router skips, and why. */
  private skipped(): [unknown, Skip] {
    switch (this.rng.int(5)) {
      case 0:
        return [this.stored([this.u64()], null, this.tokens(2 * BS), { blockSize: 2 * BS }), 'block_size_mismatch']
      case 1:
        return [this.stored([this.u64()], null, this.tokens(BS), { kind: 'sliding_window' }), 'attention_kind']
      case 2:
        return [this.rng.next() < 0.5 ? { type: 'BlockPinned', block_hashes: [1] } : ['KVCacheFrobnicated', 1, 2], 'unknown_event']
      case 3:
        return [this.removed([]), 'empty']
      default:
        return [this.stored([this.u64()], null, this.tokens(BS - 1)), 'empty']
    }
  }

  /** A well-formed batch of 1–4 events over the model, some of them skipped. */
  good(model: Model, skips = true): Good {
    const after = model.clone()
    const events: unknown[] = []
    const skipped: Skip[] = []
    for (let n = 1 + this.rng.int(4); n > 0; n--) {
      if (skips && this.rng.next() < 0.2) {
        const [ev, why] = this.skipped()
        events.push(ev)
        skipped.push(why)
      } else events.push(this.effect(after))
    }
    const ts = Date.now() / 1000
    const batch = this.rng.next() < 0.1 ? [ts, events] : [ts, events, this.rng.pick([0, null])]
    return { batch, after, skips: skipped }
  }

  /** A batch that stores a new root block: its effect shows that every batch before it was taken. */
  marker(model: Model): Good {
    const after = model.clone()
    const chain = [{ hash: this.u64(), tokens: this.tokens(BS) }]
    after.store(null, chain)
    return { batch: [Date.now() / 1000, [this.stored([chain[0]?.hash as bigint], null, chain[0]?.tokens as number[])], 0], after, skips: [] }
  }

  /** Valid MessagePack, but one field breaks the batch layout: refused whole. */
  wrongType(model: Model): unknown {
    const { batch } = this.good(model, false)
    const events = batch[1] as unknown[]
    const i = this.rng.int(events.length)
    const ev = events[i]
    const bad = (v: unknown): unknown => this.rng.pick(v as unknown[])
    switch (this.rng.int(8)) {
      case 0:
        return bad(['a batch', 42, null, true, { ts: 1, events: 'x' }])
      case 1:
        return ['now', events, 0]
      case 2:
        return [batch[0], bad([5, 'events', { a: 1 }, null]), 0]
      case 3:
        return [batch[0], events, bad([-1, 'x', 1.5, 2 ** 33])]
      case 4:
        events[i] = bad([42, 'BlockStored', true, null, { type: 7 }, { block_hashes: [1] }, [7, [1]]])
        return batch
      default: {
        // one field of an event that changes the model
        const isArray = Array.isArray(ev)
        const tag = isArray ? (ev as unknown[])[0] : (ev as Record<string, unknown>).type
        const set = (idx: number, key: string, v: unknown): void => {
          if (isArray) (ev as unknown[])[idx] = v
          else (ev as Record<string, unknown>)[key] = v
        }
        if (tag === 'BlockStored') {
          const tokens = (isArray ? (ev as unknown[])[3] : (ev as Record<string, unknown>).token_ids) as unknown[]
          const withToken = [...tokens]
          withToken[this.rng.int(BS)] = bad([-1, 2 ** 32, 1.5, 'a', null])
          const [idx, key, v] = bad([
            [1, 'block_hashes', bad(['abc', 7, [1.5], [true], null])],
            [2, 'parent_block_hash', bad(['x', 1.5, true, [1]])],
            [3, 'token_ids', bad(['x', 5, withToken])],
            [4, 'block_size', bad([0, '4', -4, 2.5, null])],
            [6, 'medium', bad([5, true, [1]])],
            [8, 'extra_keys', bad(['x', 5])],
          ]) as [number, string, unknown]
          set(idx, key, v)
        } else if (tag === 'BlockRemoved') {
          const [idx, key, v] = bad([
            [1, 'block_hashes', bad(['x', [1.5], [true], { a: 1 }, null])],
            [2, 'medium', bad([5, true])],
          ]) as [number, string, unknown]
          set(idx, key, v)
        } else events[i] = { type: 7 }
        return batch
      }
    }
  }

  bytes(n: number): Buffer {
    const b = Buffer.alloc(n)
    for (let i = 0; i < n; i++) b[i] = this.rng.int(256)
    return b
  }
}

// ---- what any MessagePack reader makes of a payload ----

/** Ends inside a value: no reader can decode it. */
function unfinished(b: Uint8Array): boolean {
  try {
    unpackr.unpack(b)
    return false
  } catch (err) {
    return (err as { incomplete?: boolean }).incomplete === true
  }
}

/** First bytes of scalar values (nil, bool, ints, floats, strings, bin, the unused 0xc1): never a batch. */
function scalarFirst(b: Uint8Array): boolean {
  const x = b[0]
  if (x === undefined) return true
  return x <= 0x7f || (x >= 0xa0 && x <= 0xc6) || (x >= 0xca && x <= 0xd3) || (x >= 0xd9 && x <= 0xdb) || x >= 0xe0
}

/** JSON of a decoded value (bytes as Buffer's JSON, bigints tagged), to compare two decodings. */
function canonical(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) => (typeof x === 'bigint' ? `${x}n` : x))
}

/** The flipped payload decodes to the original batch with another finite timestamp. */
function onlyTimestampChanged(flipped: Uint8Array, original: unknown[]): boolean {
  let v: unknown
  try {
    v = unpackr.unpack(flipped)
  } catch {
    return false
  }
  const o = unpackr.unpack(packr.pack(original)) as unknown[]
  return Array.isArray(v) && v.length === o.length && typeof v[0] === 'number' && Number.isFinite(v[0]) && canonical(v.slice(1)) === canonical(o.slice(1))
}

// ---- the run ----

interface Expected {
  badFrames: number
  sinkErrors: number
  skipped: Record<Skip, number>
  goodBatches: number
  batches: number
}

/** A payload for one sequence number: the next model if it is well-formed, else the model unchanged. */
function payloadFor(gen: Gen, model: Model, exp: Expected): { payload: Buffer; model: Model } {
  const rng = gen.rng
  const r = rng.next()
  const accept = (g: Good, payload: Buffer): { payload: Buffer; model: Model } => {
    exp.goodBatches++
    for (const s of g.skips) exp.skipped[s]++
    return { payload, model: g.after }
  }
  const refused = (payload: Buffer): { payload: Buffer; model: Model } => {
    exp.sinkErrors++
    return { payload, model }
  }
  if (r < 0.45) {
    const g = gen.good(model)
    return accept(g, packr.pack(g.batch))
  }
  if (r < 0.6) return refused(packr.pack(gen.wrongType(model)))
  if (r < 0.7) {
    const b = packr.pack(gen.good(model).batch)
    const cut = b.subarray(0, 1 + rng.int(b.length - 1))
    if (!unfinished(cut)) throw new Error('a truncated batch decoded')
    return refused(Buffer.from(cut))
  }
  if (r < 0.85) {
    const g = gen.good(model)
    const b = packr.pack(g.batch)
    for (let tries = 0; tries < 200; tries++) {
      const c = Buffer.from(b)
      for (let k = 1 + rng.int(3); k > 0; k--) {
        const at = rng.int(c.length)
        c[at] = (c[at] as number) ^ (1 << rng.int(8))
      }
      if (unfinished(c)) return refused(c)
      if (onlyTimestampChanged(c, g.batch)) return accept(g, c)
    }
    return refused(Buffer.from(b.subarray(0, b.length - 1)))
  }
  for (;;) {
    const c = gen.bytes(rng.int(48))
    if (rng.next() < 0.5 && c.length > 0) c[0] = rng.pick([0x05, 0xa3, 0xc0, 0xc1, 0xc3, 0xc4, 0xcb, 0xcf, 0xd3, 0xd9, 0xff])
    if (scalarFirst(c) || unfinished(c)) return refused(c)
  }
}

function be8(seq: bigint): Buffer {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(seq)
  return b
}

/** A message the listener cannot take as [topic, seq, payload]; it takes no sequence number. */
function badFrame(gen: Gen, seq: bigint, payload: Buffer): Buffer[] {
  const topic = Buffer.from(TOPIC)
  switch (gen.rng.int(6)) {
    case 0:
      return [topic]
    case 1:
      return [topic, be8(seq)]
    case 2:
      return [topic, be8(seq), payload, Buffer.from('x')]
    case 3:
      return [topic, be8(seq), payload, Buffer.alloc(0), Buffer.alloc(8)]
    default: {
      const n = gen.rng.pick([0, 1, 7, 9, 16])
      return [topic, gen.bytes(n), payload]
    }
  }
}

/** A replay reply that is not [seq, payload] or [topic, seq, payload]. */
function badReplayFrame(gen: Gen, seq: bigint, payload: Buffer): Buffer[] {
  switch (gen.rng.int(3)) {
    case 0:
      return [Buffer.alloc(0), be8(seq).subarray(1), payload]
    case 1:
      return [Buffer.alloc(0), Buffer.from(TOPIC), be8(seq), payload, Buffer.from('x')]
    default:
      return [Buffer.alloc(0), payload]
  }
}

async function bindFree(sock: Publisher | ZmqRouter): Promise<string> {
  for (let i = 0; ; i++) {
    const ep = `tcp://127.0.0.1:${30000 + Math.floor(Math.random() * 25000)}`
    try {
      await sock.bind(ep)
      return ep
    } catch (err) {
      if (i > 20) throw err
    }
  }
}

function metric(text: string, name: string, labels: string): number {
  let sum = 0
  let found = false
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) || !line.includes(labels)) continue
    found = true
    sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return found ? sum : -1
}

t.test(`the ZMQ intake under random, mutated and well-formed batches (seed ${SEED})`, async (t) => {
  const gen = new Gen(new Rng(SEED))
  // probes and markers draw from their own stream: how many the subscription takes depends on
  // timing, and must not change what the seed generates
  const aside = new Gen(new Rng(SEED ^ 0x5bd1e995))
  const exp: Expected = {
    badFrames: 0,
    sinkErrors: 0,
    skipped: { block_size_mismatch: 0, attention_kind: 0, unknown_event: 0, empty: 0 },
    goodBatches: 0,
    batches: 0,
  }
  let model = new Model()

  const pub = new Publisher({ linger: 0, sendHighWaterMark: 100_000 })
  const replay = new ZmqRouter({ linger: 0 })
  t.teardown(() => {
    pub.close()
    replay.close()
  })
  const pubEp = await bindFree(pub)
  const replayEp = await bindFree(replay)

  // the replay buffer: every batch by its sequence number
  const buffer: Buffer[] = []
  let seq = 0n
  const next = (): { seq: bigint; payload: Buffer } => {
    const p = payloadFor(gen, model, exp)
    model = p.model
    exp.batches++
    buffer.push(p.payload)
    return { seq: seq++, payload: p.payload }
  }
  for (let i = 0; i < REPLAYED; i++) next()
  // the first replay carries bad replies between the good ones
  const badInReplay = REPLAYED / 4
  let requests = 0
  let firstReplayDone = false
  void (async () => {
    for await (const [id, , start] of replay) {
      const from = start?.length === 8 ? start.readBigUInt64BE(0) : 0n
      const first = requests++ === 0
      for (let s = Number(from); s < buffer.length; s++) {
        await replay.send([id as Buffer, Buffer.alloc(0), Buffer.from(TOPIC), be8(BigInt(s)), buffer[s] as Buffer])
        if (first && s % 4 === 1) await replay.send([id as Buffer, ...badReplayFrame(aside, BigInt(s), buffer[s] as Buffer)])
      }
      await replay.send([id as Buffer, Buffer.alloc(0), Buffer.from(TOPIC), Buffer.alloc(8, 0xff), Buffer.alloc(0)])
      if (first) firstReplayDone = true
    }
  })().catch(() => undefined)
  exp.badFrames += badInReplay

  const router = await Router.start(config(['--router-block-size', String(BS)]))
  t.teardown(() => router.close())
  const app = await buildApp({ router, tokenizer: null })
  t.teardown(() => app.shutdown(1000))
  const get = async (url: string): Promise<string> => (await app.fastify.inject({ method: 'GET', url })).body
  const reg = await app.fastify.inject({
    method: 'POST',
    url: '/v1/workers',
    payload: { id: WORKER, url: 'http://127.0.0.1:9', kv_events_endpoint: pubEp, replay_endpoint: replayEp, kv_events_topic: TOPIC },
  })
  t.equal(reg.statusCode, 201, reg.body)
  const rankIndex = async (): Promise<string> =>
    (JSON.parse(await get('/v1/workers')) as { workers: { ranks: { index: string }[] }[] }).workers[0]?.ranks[0]?.index ?? ''
  const holds = async (m: Model): Promise<boolean> => {
    const d = dumpedBlocks(await get(`/v1/kv/dump?worker_id=${WORKER}`))
    return d.size === m.blocks.size && [...m.blocks.keys()].every((h) => d.has(h))
  }
  await waitUntil('the first replay applied', async () => firstReplayDone && (await rankIndex()) === 'exact' && (await holds(model)))

  // live: probes until the subscription is through (one lost before is replayed on the gap the next opens)
  const send = async (frames: Buffer[]): Promise<void> => pub.send(frames)
  const live = async (): Promise<void> => {
    const n = next()
    await send([Buffer.from(TOPIC), be8(n.seq), n.payload])
  }
  const publishGood = async (g: Good): Promise<void> => {
    model = g.after
    exp.goodBatches++
    exp.batches++
    const payload = packr.pack(g.batch)
    buffer.push(payload)
    await send([Buffer.from(TOPIC), be8(seq++), payload])
  }
  const probes: bigint[] = []
  await waitUntil(
    'the subscription through',
    async () => {
      const g = aside.marker(model)
      probes.push(...[...g.after.blocks.keys()].filter((h) => !model.blocks.has(h)))
      await publishGood(g)
      await new Promise((r) => setTimeout(r, 30))
      return (await holds(model)) && (await rankIndex()) === 'exact'
    },
    10_000,
    0,
  )
  // the probes' blocks go again, so the fuzzed part starts from what the seed alone made
  const unprobed = model.clone()
  for (const h of probes) unprobed.remove(h)
  await publishGood({ batch: [Date.now() / 1000, [aside.removed(probes)], 0], after: unprobed, skips: [] })
  await waitUntil('the probes removed', () => holds(model))
  const before = await get('/metrics')

  for (let i = 0; i < LIVE; i++) {
    const r = gen.rng.next()
    if (r < 0.12) {
      exp.badFrames++
      await send(badFrame(gen, seq, packr.pack(gen.good(model).batch)))
    } else if (r < 0.15) {
      // another topic: filtered by the subscription, never seen
      await send([Buffer.from('other-topic'), be8(seq + 1000n), packr.pack(gen.good(model).batch)])
    } else await live()
    if (i % 25 === 24) await new Promise((r) => setTimeout(r, 2))
  }
  await publishGood(aside.marker(model))
  await waitUntil('the last batch applied', () => holds(model), 15_000, 20)

  // the router answers, and its index is the model's, block by block
  t.equal((await app.fastify.inject({ method: 'GET', url: '/health' })).statusCode, 200)
  const dump = dumpedBlocks(await get(`/v1/kv/dump?worker_id=${WORKER}`))
  t.ok(model.blocks.size > 0)
  t.equal(dump.size, model.blocks.size, 'as many blocks as the well-formed batches left')
  let mismatches = 0
  for (const [h, b] of model.blocks) {
    const d = dump.get(h)
    if (d === undefined || d.parent !== b.parent || d.tokensHash !== computeBlockHashes(b.tokens, BS)[0] || d.dpRank !== 0) mismatches++
  }
  t.equal(mismatches, 0, 'every block with its parent and tokens_hash')
  const deepest = [...model.blocks.keys()].map((h) => model.path(h)).reduce((a, b) => (b.length > a.length ? b : a))
  const overlap = (await app.fastify.inject({ method: 'POST', url: '/v1/overlap', payload: { token_ids: deepest } })).json() as {
    scores: { worker_id: number; overlap_blocks: number }[]
  }
  t.same(
    overlap.scores.filter((s) => s.worker_id === WORKER).map((s) => s.overlap_blocks),
    [deepest.length / BS],
    'the longest chain overlaps whole',
  )

  // every bad frame, batch and event counted, and nothing else
  const counted = async (): Promise<Record<string, number>> => {
    const m = await get('/metrics')
    const out: Record<string, number> = {
      bad_frames: metric(m, 'kvrouter_zmq_total', 'what="bad_frames"'),
      sink_errors: metric(m, 'kvrouter_zmq_total', 'what="sink_errors"'),
    }
    for (const k of Object.keys(exp.skipped)) out[k] = metric(m, 'kvrouter_engine_events_skipped_total', `reason="${k}"`)
    return out
  }
  const want = { bad_frames: exp.badFrames, sink_errors: exp.sinkErrors, ...exp.skipped }
  await waitUntil('the counters', async () => canonical(await counted()) === canonical(want), 5000, 50).catch(() => undefined)
  t.comment(`sent: ${JSON.stringify(exp)}`)
  t.same(await counted(), want, 'bad frames, refused batches and skipped events, each counted once')
  t.ok(exp.badFrames > 20 && exp.sinkErrors > 50 && Object.values(exp.skipped).every((n) => n > 0), 'every kind of bad input was sent')
  const m = await get('/metrics')
  const batches = metric(m, 'kvrouter_zmq_total', 'what="batches"')
  t.ok(batches >= exp.goodBatches && batches <= exp.batches, `batches applied: ${batches} of ${exp.batches} numbered, ${exp.goodBatches} well-formed`)
  t.equal(metric(m, 'kvrouter_zmq_total', 'what="gaps"'), metric(before, 'kvrouter_zmq_total', 'what="gaps"'), 'no gap once subscribed')
  t.equal(metric(m, 'kvrouter_zmq_total', 'what="restarts"'), 0)
  t.equal(metric(m, 'kvrouter_zmq_total', 'what="replays_incomplete"'), 0)
  t.equal(metric(m, 'kvrouter_shard_restarts_total', 'shard='), 0, 'no shard restarted')
  t.equal(
    m
      .split('\n')
      .filter((l) => l.startsWith('dynamo_component_kv_cache_events_applied{') && !l.includes('status="ok"'))
      .reduce((s, l) => s + Number(l.slice(l.lastIndexOf(' ') + 1)), 0),
    0,
    'the index rejected none of the events the router applied',
  )
  t.equal(await rankIndex(), 'exact')
})
