// The mocker's vLLM-style ZMQ publisher on real sockets, read by the router's own ZMQ listener
// and vLLM decoder: the batches, applied into a KvIndex, rebuild exactly the engines' cached
// blocks with the tokens_hash their pools computed (decode blocks included, map and array
// form); numbering starts at 0 without gaps; a late listener catches up through the replay
// socket; the raw frames are vLLM's; the CLI flags are checked like the others.
import t from 'tap'
import type { Test } from 'tap'
import { unpack } from 'msgpackr'
import { Dealer, Subscriber } from 'zeromq'
import { EngineEventDecoder } from '../../../support/engine-reference-decoder.js'
import { EngineStreamDecoder } from '../../../src/codec/engine-stream.js'
import { DecodedEvent } from '../../../src/codec/event-decoder.js'
import { isKvrError } from '../../../src/errors.js'
import { APPLY_OK, KvIndex } from '../../../src/index/kv-index.js'
import { OUTPUT_TOKEN_BASE } from '../../../src/sim/mocker/engine.js'
import { MockerFleet } from '../../../src/sim/mocker/fleet.js'
import type { MockerWorker } from '../../../src/sim/mocker/fleet.js'
import { MockerArgError, parseMockerArgs } from '../../../src/sim/mocker/main.js'
import { ZmqEventPublisher, engineEndpoint, parseTcpEndpoint } from '../../../src/sim/mocker/zmq-publisher.js'
import type { VllmEventForm } from '../../../src/sim/mocker/zmq-publisher.js'
import { ZmqListener } from '../../../src/transport/zmq.js'
import type { ZmqSink, ZmqSource } from '../../../src/transport/zmq.js'
import { waitUntil } from '../../helpers/wait.js'
import { Rng } from '../../helpers/rng.js'
import { drive, sortedByKey, zmqFleet } from '../../helpers/zmq-fleet.js'

const BS = 4
const TOPIC = 'kv-events'

/** The router's side: a ZmqListener per engine, batches decoded by the shards' decoder at the same block size and applied. */
class RouterSide implements ZmqSink {
  readonly index = new KvIndex()
  /** For looking at the events' values; the shards' decoder applies them. */
  readonly decoder = new EngineEventDecoder(BS)
  readonly stream = new EngineStreamDecoder(BS)
  readonly seqs = new Map<bigint, bigint[]>()
  readonly listeners: ZmqListener[] = []
  rejected = 0
  restarts = 0
  /** Token ids of every stored block seen, and hashes of every block hash seen. */
  sawOutputTokens = false
  sawHighHash = false
  private readonly out = new DecodedEvent()

  listen(t: Test, workerId: bigint, endpoint: string, replay: string | null): ZmqListener {
    const l = ZmqListener.start({ workerId, dpRank: 0, endpoint, replay, topic: TOPIC }, this, { replayTimeoutMs: 5000 })
    this.listeners.push(l)
    this.seqs.set(workerId, [])
    t.teardown(() => l.close())
    return l
  }

  batch(source: ZmqSource, seq: bigint, payload: Uint8Array): void {
    ;(this.seqs.get(source.workerId) as bigint[]).push(seq)
    const b = this.decoder.decodeBatch(payload)
    this.stream.begin(payload)
    const lo = Number(source.workerId & 0xffffffffn)
    const hi = Number(source.workerId >> 32n)
    for (const ev of b.events) {
      const fields = Array.isArray(ev)
        ? { hashes: ev[1], tokens: ev[0] === 'BlockStored' ? ev[3] : undefined }
        : { hashes: (ev as Record<string, unknown>).block_hashes, tokens: (ev as Record<string, unknown>).token_ids }
      if (Array.isArray(fields.tokens) && fields.tokens.some((x) => typeof x === 'number' && x >= OUTPUT_TOKEN_BASE)) this.sawOutputTokens = true
      if (Array.isArray(fields.hashes) && fields.hashes.some((h) => typeof h === 'bigint' && BigInt.asUintN(64, h) >= 1n << 63n)) this.sawHighHash = true
      const skip = this.stream.next(lo, hi, this.stream.batchRank ?? source.dpRank, this.out)
      if (skip !== null) {
        this.rejected++
        continue
      }
      if (this.index.apply(this.out) !== APPLY_OK) this.rejected++
    }
  }
  restarted(): void {
    this.restarts++
  }
  state(): void {}

  /** block_hash → tokens_hash of what the index holds for a worker (its dump replayed; bridges cancel out). */
  held(worker: bigint): Map<bigint, bigint> {
    const m = new Map<bigint, bigint>()
    for (const ev of this.index.dump()) {
      if (ev.worker_id !== worker || typeof ev.event.data !== 'object') continue
      if ('stored' in ev.event.data) for (const b of ev.event.data.stored.blocks) m.set(b.block_hash, b.tokens_hash)
      else for (const h of ev.event.data.removed.block_hashes) m.delete(h)
    }
    return m
  }
}

function publisherOf(fleet: MockerFleet, i: number): ZmqEventPublisher {
  return fleet.workers[i]?.publishers.find((p) => p instanceof ZmqEventPublisher) as ZmqEventPublisher
}

/** A pool's cached blocks (block_hash → tokens_hash), in a fixed order for the comparison. */
function cachedOf(fleet: MockerFleet, i: number): Map<bigint, bigint> {
  return sortedByKey((fleet.workers[i] as MockerWorker).engine.pool.cachedTokensHashes())
}

const range = (n: bigint): bigint[] => Array.from({ length: Number(n) }, (_, i) => BigInt(i))

for (const form of ['map', 'array'] as VllmEventForm[]) {
  t.test(`${form} form: the index built from the ZMQ batches holds exactly each pool's cached blocks`, async (t) => {
    const { fleet, pub, replay } = await zmqFleet(t, {
      numWorkers: 2,
      numGpuBlocks: 24,
      maxNumSeqs: 4,
      maxNumBatchedTokens: 64,
      kvEventsForm: form,
      blockSize: BS,
    })
    const side = new RouterSide()
    for (let i = 0; i < 2; i++) {
      const w = fleet.workers[i]
      side.listen(t, w?.workerId as bigint, engineEndpoint(pub, i), replay === null ? null : engineEndpoint(replay, i))
    }
    await drive(fleet, new Rng(form === 'map' ? 7 : 8), 60)
    for (let i = 0; i < 2; i++) {
      const w = fleet.workers[i]
      const p = publisherOf(fleet, i)
      const worker = w?.workerId as bigint
      await waitUntil(`engine ${i}'s batches`, () => (side.seqs.get(worker) as bigint[]).length >= Number(p.seq))
      t.ok(p.seq > 0n, `engine ${i} published ${p.seq} batches`)
      t.same(side.seqs.get(worker), range(p.seq), `engine ${i}: seq from 0, none missing, none twice`)
      t.same(sortedByKey(side.held(worker)), cachedOf(fleet, i), `engine ${i}: the same blocks with the same tokens_hash`)
      t.ok((w?.engine.pool.evictions ?? 0) > 0, `engine ${i} evicted blocks (Removed events)`)
      t.equal(side.listeners[i]?.state, 'exact')
    }
    t.equal(side.rejected, 0, 'every event decoded and applied')
    t.equal(side.restarts, 0)
    t.ok(side.sawOutputTokens, 'decode blocks carried the generated token ids')
    t.ok(side.sawHighHash, 'hashes ≥ 2^63 went over the wire')
  })
}

t.test('a listener started late catches up through the replay socket, then follows live', async (t) => {
  const { fleet, pub, replay } = await zmqFleet(t, { numGpuBlocks: 32, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS })
  const rng = new Rng(21)
  await drive(fleet, rng, 30)
  const p = publisherOf(fleet, 0)
  const before = p.seq
  t.ok(before > 0n)
  const side = new RouterSide()
  const w = fleet.workers[0]
  const worker = w?.workerId as bigint
  const l = side.listen(t, worker, pub, replay)
  await waitUntil('the replay', () => (side.seqs.get(worker) as bigint[]).length >= Number(before))
  t.same(side.seqs.get(worker), range(before), 'every buffered batch, in order')
  t.equal(l.counters.replayedBatches, Number(before), 'all of them through the replay socket')
  t.same(sortedByKey(side.held(worker)), cachedOf(fleet, 0), "the pool's cached blocks")
  // the SUB joins the PUB asynchronously: publish until a batch arrives live
  await waitUntil(
    'a live batch',
    async () => {
      await drive(fleet, rng, 3)
      return l.counters.batches > l.counters.replayedBatches
    },
    10_000,
    50,
  )
  await waitUntil('the live batches', () => (side.seqs.get(worker) as bigint[]).length >= Number(p.seq))
  t.same(side.seqs.get(worker), range(p.seq), 'replayed then live: no gap, nothing twice')
  t.same(sortedByKey(side.held(worker)), cachedOf(fleet, 0), 'still exactly the cached blocks')
  t.equal(side.rejected, 0)
  t.equal(l.state, 'exact')
})

t.test("the frames are vLLM's: [topic, seq, [ts, events, rank]], replies with the topic, the −1 end", async (t) => {
  const { fleet, pub, replay } = await zmqFleet(t, { kvEventsTopic: 'kv@7', kvEventsForm: 'array', blockSize: BS })
  const sub = new Subscriber({ linger: 0 })
  sub.connect(pub)
  sub.subscribe('')
  t.teardown(() => sub.close())
  const e = fleet.workers[0]?.engine
  // until the subscription has joined, batches go to no one
  let next = 1
  // one receive in flight at a time (zeromq's rule), raced against a round of fresh prompts
  const received = sub.receive()
  let frames: Buffer[] | null = null
  received.then((f) => (frames = f)).catch(() => undefined)
  while (frames === null) {
    // fresh prompts, so every round stores blocks and publishes a batch; until the subscription
    // has joined, the batches go to no one
    e?.submit(
      Array.from({ length: 9 }, () => next++),
      4,
    )
    await fleet.flushEvents()
    await new Promise((r) => setTimeout(r, 50))
  }
  frames = frames as Buffer[]
  t.equal(frames.length, 3)
  t.equal(frames[0]?.toString(), 'kv@7', 'the topic frame')
  t.equal(frames[1]?.length, 8, 'seq: 8 bytes')
  const batch = unpack(frames[2] as Buffer) as [number, unknown[], number]
  t.equal(batch.length, 3)
  t.type(batch[0], 'number')
  t.ok(Math.abs(batch[0] - Date.now() / 1000) < 60, 'ts in seconds')
  t.equal(batch[2], 0, 'data_parallel_rank')
  const stored = batch[1].find((x) => Array.isArray(x) && x[0] === 'BlockStored') as unknown[] | undefined
  t.ok(stored !== undefined, 'a BlockStored in the first batch')
  if (stored !== undefined) {
    t.equal(stored.length, 7, "['BlockStored', hashes, parent, token_ids, block_size, lora_id, medium]")
    t.equal(stored[4], BS)
    t.same(stored.slice(5), [null, 'GPU'])
    t.equal((stored[3] as number[]).length, (stored[1] as unknown[]).length * BS, 'block_size token ids per block')
  }
  // the replay from 1: batches 1… with the topic, then the end marker
  await fleet.flushEvents()
  const last = publisherOf(fleet, 0).seq - 1n
  const d = new Dealer({ linger: 0, receiveTimeout: 3000 })
  d.connect(replay as string)
  t.teardown(() => d.close())
  const start = Buffer.alloc(8)
  start.writeBigUInt64BE(1n)
  await d.send([Buffer.alloc(0), start])
  const seqs: bigint[] = []
  for (;;) {
    const r = await d.receive()
    t.equal(r[0]?.length, 0, 'the empty delimiter')
    if ((r[2] as Buffer).equals(Buffer.alloc(8, 0xff))) {
      t.same(
        r.map((f) => f.length),
        [0, 0, 8, 0],
        "the end: ['', '', −1, '']",
      )
      break
    }
    t.equal(r.length, 4)
    t.equal(r[1]?.toString(), 'kv@7')
    seqs.push((r[2] as Buffer).readBigUInt64BE(0))
  }
  t.same(seqs, range(last + 1n).slice(1), 'every batch from 1 on')
})

t.test('engine i binds port + i; a taken port is an error naming it', async (t) => {
  t.equal(engineEndpoint('tcp://127.0.0.1:5557', 3), 'tcp://127.0.0.1:5560')
  t.equal(engineEndpoint('tcp://*:5557', 1), 'tcp://*:5558')
  t.same(parseTcpEndpoint('tcp://[::1]:9'), { host: '[::1]', port: 9 })
  for (const bad of ['tcp://127.0.0.1', 'tcp://127.0.0.1:0', 'tcp://h:70000', 'ipc:///tmp/x', 'http://h:1']) t.equal(parseTcpEndpoint(bad), null, bad)
  const { pub } = await zmqFleet(t, { blockSize: BS }, { replay: false })
  const again = await MockerFleet.start({ kvEventsZmq: pub, speedupRatio: 0 }).catch((e: unknown) => e)
  t.ok(isKvrError(again) && again.message.includes(`cannot bind a ZMQ socket to ${pub}`), String(again))
})

t.test('CLI: the ZMQ flags are validated like the others', async (t) => {
  const ok = parseMockerArgs([
    '--num-workers',
    '2',
    '--kv-events-zmq',
    'tcp://127.0.0.1:5557',
    '--kv-events-replay-zmq',
    'tcp://127.0.0.1:5560',
    '--kv-events-form',
    'array',
    '--kv-events-topic',
    'x',
  ])
  if (ok === 'help') throw new Error('help')
  t.match(ok.fleet, { kvEventsZmq: 'tcp://127.0.0.1:5557', kvEventsReplayZmq: 'tcp://127.0.0.1:5560', kvEventsForm: 'array', kvEventsTopic: 'x' })
  const cases: [string[], RegExp][] = [
    [['--kv-events-zmq', 'tcp://127.0.0.1'], /^--kv-events-zmq must be tcp:\/\/HOST:PORT/],
    [['--kv-events-zmq', 'tcp://127.0.0.1:5557', '--kv-events-replay-zmq', 'ipc:///x'], /^--kv-events-replay-zmq must be tcp:\/\/HOST:PORT/],
    [['--kv-events-zmq', 'tcp://127.0.0.1:5557', '--kv-events-form', 'tuple'], /^--kv-events-form must be one of map\|array, got "tuple"$/],
    [['--kv-events-form', 'map'], /^--kv-events-form is only used with --kv-events-zmq$/],
    [['--kv-events-replay-zmq', 'tcp://127.0.0.1:5558'], /^--kv-events-replay-zmq is only used with --kv-events-zmq$/],
    [['--kv-events-topic', 't'], /^--kv-events-topic is only used with --kv-events-zmq$/],
    [
      ['--num-workers', '2', '--kv-events-zmq', 'tcp://127.0.0.1:5557', '--kv-events-replay-zmq', 'tcp://127.0.0.1:5558'],
      /^--kv-events-zmq and --kv-events-replay-zmq overlap/,
    ],
    [['--num-workers', '3', '--kv-events-zmq', 'tcp://127.0.0.1:65534'], /^--kv-events-zmq port 65534 leaves no room for 3 engines/],
  ]
  for (const [args, re] of cases) {
    const err = (() => {
      try {
        parseMockerArgs(args)
        return null
      } catch (e) {
        return e
      }
    })()
    t.ok(err instanceof MockerArgError, args.join(' '))
    t.match((err as Error).message, re)
  }
  t.ok(
    parseMockerArgs(['--num-workers', '2', '--kv-events-zmq', 'tcp://127.0.0.1:5557', '--kv-events-replay-zmq', 'tcp://127.0.0.2:5558']),
    'other hosts do not overlap',
  )
})
