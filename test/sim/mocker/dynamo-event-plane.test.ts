// The Dynamo mode's event plane on real ZMQ sockets: a plain zeromq SUB, subscribed to the topic,
// receives 4-frame messages whose bytes are compared, frame by frame, with goldens written by
// hand from Dynamo's source (cited next to each). Only published_at (the send time) is read back
// from the received frame, and checked to lie within the test's clock readings.
import t from 'tap'
import { unpack } from 'msgpackr'
import { Subscriber } from 'zeromq'
import type { RouterEvent } from '../../../src/codec/events.js'
import type { EngineLoad } from '../../../src/sim/mocker/engine.js'
import { EventChannel, randomPublisherId } from '../../../src/sim/mocker/dynamo/event-channel.js'
import { DynamoKvEventPublisher, DynamoLoadPublisher } from '../../../src/sim/mocker/dynamo/event-publishers.js'

const hex = (h: string): Buffer => Buffer.from(h.replace(/\s+/g, ''), 'hex')
/** A MessagePack fixstr (< 32 bytes): 0xa0 | length, then the ASCII bytes. */
const fix = (s: string): Buffer => Buffer.concat([Buffer.from([0xa0 | s.length]), Buffer.from(s, 'ascii')])
const cat = (...parts: (Buffer | string)[]): Buffer => Buffer.concat(parts.map((p) => (typeof p === 'string' ? hex(p) : p)))

const PUBLISHER_ID = 0x1_0000_0001n

/** Receives messages into a list; stops with the socket. */
function collect(sub: Subscriber): Buffer[][] {
  const got: Buffer[][] = []
  void (async () => {
    try {
      for await (const frames of sub) got.push(frames)
    } catch {
      // closed
    }
  })()
  return got
}

async function until(what: string, cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

t.test('kv-events: 4 frames, envelope and RouterEvent bytes as a Dynamo worker sends them', async (t) => {
  const ch = await EventChannel.bind({ topic: 'kv-events', publisherId: PUBLISHER_ID })
  const pub = new DynamoKvEventPublisher(ch)
  t.teardown(() => pub.close())
  t.match(ch.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/, 'advertised as tcp://HOST:PORT of the ephemeral port')
  t.equal(ch.sequence, 0n, 'the first message gets sequence 0')
  const sub = new Subscriber({ linger: 0 })
  t.teardown(() => sub.close())
  sub.connect(ch.endpoint)
  sub.subscribe('kv-events')
  const got = collect(sub)

  // a subscription takes effect some time after connect (ZMQ's slow joiner): probes, each a
  // clear whose event id is the sequence it is sent with, until one arrives
  const cleared = (id: bigint): RouterEvent => ({ worker_id: 7n, event: { event_id: id, data: 'cleared', dp_rank: 0 } })
  await until('a probe', () => {
    if (got.length === 0) pub.publish(cleared(ch.sequence))
    return got.length > 0
  })
  await pub.flush()
  await new Promise((r) => setTimeout(r, 50))
  for (const m of got) {
    // frame 2 (sequence) = the event id written into that probe = publishes before it
    const seq = (m[2] as Buffer).readBigUInt64BE(0)
    t.equal(m.length, 4)
    const env = unpack((m[3] as Buffer).subarray(5)) as { sequence: number; payload: Uint8Array }
    const ev = unpack(env.payload) as { event: { event_id: number } }
    t.equal(BigInt(ev.event.event_id), seq, 'the probe sent with sequence n carries event id n')
    t.equal(BigInt(env.sequence), seq, 'the envelope repeats frame 2')
  }
  const base = ch.sequence
  got.length = 0

  const stored: RouterEvent = {
    worker_id: 7n,
    event: {
      event_id: 1n,
      data: { stored: { parent_hash: null, blocks: [{ block_hash: 0x1122334455667788n, tokens_hash: 300n }] } },
      dp_rank: 0,
    },
  }
  const removed: RouterEvent = {
    worker_id: 7n,
    storage_tier: 'host_pinned',
    event: { event_id: 2n, data: { removed: { block_hashes: [255n, 256n] } }, dp_rank: 0 },
  }
  const before = Date.now()
  pub.publish(stored)
  pub.publish(removed)
  pub.publish(cleared(3n))
  await pub.flush()
  await until('3 messages', () => got.length >= 3)
  const after = Date.now()

  // RouterEvent, named MessagePack, fields in declaration order: worker_id, storage_tier
  // (serde default, always written), event {event_id, data, dp_rank}; residency_domain left out;
  // KvCacheEventData externally tagged snake_case, unit variant `cleared` as its name;
  // KvCacheStoreData {parent_hash, start_position, blocks}; KvCacheStoredBlockData {block_hash,
  // tokens_hash, mm_extra_info}; hashes plain u64 (lib/kv-router/src/protocols.rs, stored copy
  // 66907637791). rmp-serde writes a struct as a map when named, a unit variant as its name, a
  // newtype variant as a one-entry map, u64 with write_uint (most compact form), bytes as bin
  // (3Hren/msgpack-rust rmp-serde/src/encode.rs@21b206ce).
  const payloads = [
    cat(
      '83',
      fix('worker_id'),
      '07',
      fix('storage_tier'),
      fix('device'),
      fix('event'),
      '83',
      fix('event_id'),
      '01',
      fix('data'),
      '81',
      fix('stored'),
      '83',
      fix('parent_hash'),
      'c0',
      fix('start_position'),
      'c0',
      fix('blocks'),
      '91 83',
      fix('block_hash'),
      'cf 11 22 33 44 55 66 77 88',
      fix('tokens_hash'),
      'cd 01 2c',
      fix('mm_extra_info'),
      'c0',
      fix('dp_rank'),
      '00',
    ),
    cat(
      '83',
      fix('worker_id'),
      '07',
      fix('storage_tier'),
      fix('host_pinned'),
      fix('event'),
      '83',
      fix('event_id'),
      '02',
      fix('data'),
      '81',
      fix('removed'),
      '81',
      fix('block_hashes'),
      '92 cc ff cd 01 00',
      fix('dp_rank'),
      '00',
    ),
    cat(
      '83',
      fix('worker_id'),
      '07',
      fix('storage_tier'),
      fix('device'),
      fix('event'),
      '83',
      fix('event_id'),
      '03',
      fix('data'),
      fix('cleared'),
      fix('dp_rank'),
      '00',
    ),
  ]
  for (let i = 0; i < 3; i++) {
    const [topic, id, seq, frame] = got[i] as [Buffer, Buffer, Buffer, Buffer]
    const s = base + BigInt(i)
    // frames 0-2: topic, publisher_id u64 BE, sequence u64 BE
    // (lib/runtime/src/transports/event_plane/zmq_transport.rs@0a8ea9dd, decode_multipart)
    t.same(topic, Buffer.from('kv-events'), 'frame 0: the topic')
    t.same(id, hex('00 00 00 01 00 00 00 01'), 'frame 1: publisher_id big-endian')
    t.same(seq, hex(`00000000000000${s.toString(16).padStart(2, '0')}`), 'frame 2: the sequence big-endian')
    // frame 3: [u8 version 1][u32 BE length][EventEnvelope], the envelope a named map
    // {publisher_id, sequence, published_at (ms), topic, payload: bin}
    // (event_plane frame.rs, stored copy 2797643627; codec.rs, stored copy 55256958408)
    const payload = payloads[i] as Buffer
    const head = cat('85', fix('publisher_id'), 'cf 00 00 00 01 00 00 00 01', fix('sequence'), s.toString(16).padStart(2, '0'), fix('published_at'), 'cf')
    const at = frame.subarray(5 + head.length, 5 + head.length + 8)
    const publishedAt = Number(at.readBigUInt64BE(0))
    t.ok(publishedAt >= before && publishedAt <= after, `published_at ${publishedAt} is the send time in ms`)
    const envelope = cat(head, at, fix('topic'), fix('kv-events'), fix('payload'), 'c4', Buffer.from([payload.length]), payload)
    const golden = cat('01', Buffer.from(Uint32Array.of(0).buffer), envelope)
    golden.writeUInt32BE(envelope.length, 1)
    t.same(frame, golden, `frame 3 of message ${i}, byte for byte`)
  }
})

t.test('kv_metrics: ActiveLoad in the same envelope on its own publisher', async (t) => {
  const ch = await EventChannel.bind({ topic: 'kv_metrics', publisherId: 9n })
  const sub = new Subscriber({ linger: 0 })
  t.teardown(() => sub.close())
  sub.connect(ch.endpoint)
  sub.subscribe('kv_metrics')
  const got = collect(sub)
  let blocks = 300
  const load = (): EngineLoad => ({ workerId: 7n, activeBlocks: blocks, totalBlocks: 1000, waiting: 0, running: 1, maxNumSeqs: 8, prefixHitRate: 0 })
  const lp = new DynamoLoadPublisher(ch, load, { intervalMs: 30, minGapMs: 0 })
  t.teardown(() => lp.close())
  await until('a load report', () => got.length > 0)
  blocks = 5
  lp.update()
  await until('the changed load', () => got.some((m) => (m[3] as Buffer).at(-1) === 0x05))
  const m = got.find((x) => (x[3] as Buffer).at(-1) === 0x05) as Buffer[]
  t.same(m[0], Buffer.from('kv_metrics'))
  t.same(m[1], hex('00 00 00 00 00 00 00 09'))
  // ActiveLoad {worker_id, dp_rank, active_decode_blocks, active_prefill_tokens, kv_used_blocks}:
  // a worker fills kv_used_blocks only (lib/kv-router/src/protocols.rs, stored copy 66907637791)
  const payload = cat(
    '85',
    fix('worker_id'),
    '07',
    fix('dp_rank'),
    '00',
    fix('active_decode_blocks'),
    'c0',
    fix('active_prefill_tokens'),
    'c0',
    fix('kv_used_blocks'),
    '05',
  )
  const frame = m[3] as Buffer
  t.same(frame.subarray(frame.length - payload.length), payload, 'the payload ends the frame')
  t.same(frame.subarray(frame.length - payload.length - 2, frame.length - payload.length), Buffer.from([0xc4, payload.length]), 'as bin8')
  t.equal(frame.readUInt32BE(1), frame.length - 5, 'the header holds the envelope length')
})

t.test('publisher ids stay within 2^53 - 1 and differ', async (t) => {
  const ids = new Set<bigint>()
  for (let i = 0; i < 200; i++) {
    const id = randomPublisherId()
    t.ok(id >= 1n && id <= BigInt(Number.MAX_SAFE_INTEGER))
    ids.add(id)
  }
  t.equal(ids.size, 200)
})

t.test('the drop fault: messages FROM to FROM+COUNT-1 are not sent, their sequence numbers spent', async (t) => {
  const ch = await EventChannel.bind({ topic: 'kv-events', publisherId: 5n, drop: { from: 1000n, count: 3 } })
  const pub = new DynamoKvEventPublisher(ch)
  t.teardown(() => pub.close())
  const sub = new Subscriber({ linger: 0 })
  t.teardown(() => sub.close())
  sub.connect(ch.endpoint)
  sub.subscribe('kv-events')
  const got = collect(sub)
  const cleared = (id: bigint): RouterEvent => ({ worker_id: 7n, event: { event_id: id, data: 'cleared', dp_rank: 0 } })
  // past the slow joiner first, well before the fault
  await until('a probe', () => {
    if (got.length === 0) pub.publish(cleared(ch.sequence))
    return got.length > 0
  })
  await pub.flush()
  const first = ch.sequence
  t.ok(first < 1000n, 'the fault is ahead')
  got.length = 0
  while (ch.sequence < 1005n) pub.publish(cleared(ch.sequence))
  await pub.flush()
  await until('the last message', () => got.some((m) => (m[2] as Buffer).readBigUInt64BE(0) === 1004n))
  const seqs = got.map((m) => (m[2] as Buffer).readBigUInt64BE(0))
  t.same(
    seqs.filter((s) => s >= 998n),
    [998n, 999n, 1003n, 1004n],
    'the next message after the fault shows the gap',
  )
  t.equal(seqs.length, Number(1005n - first) - 3, 'every other message sent')
  t.match(ch.counters, { dropped: 3, sent: Number(1005n - first) - 3 + Number(first) })
})
