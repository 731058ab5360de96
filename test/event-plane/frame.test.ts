// Dynamo's ZMQ event-plane messages: golden 4-frame messages transcribed by hand from Dynamo's
// struct definitions are read as Dynamo writes them, and every way a message can be wrong is
// refused with its own reason, never thrown.
import t from 'tap'
import { Unpackr } from 'msgpackr'
import { DynamoMsgpackDecoder } from '../../src/codec/dynamo-msgpack.js'
import { EventKind, StorageTier } from '../../src/codec/decoded-event.js'
import { brokerTopic, decodeEventSegment, directTopic, encodeEventSegment, EventPlaneMessage, FrameReader } from '../../src/event-plane/frame.js'

/** Hex bytes, with `'text'` spans written as their ASCII (for the map keys and strings). */
function hex(parts: string): Buffer {
  const out = parts.replace(/'([^']*)'/g, (_, s: string) => Buffer.from(s).toString('hex')).replace(/\s+/g, '')
  return Buffer.from(out, 'hex')
}

// A RouterEvent as rmp_serde::to_vec_named writes it, keys in declaration order: RouterEvent
// {worker_id, event}, KvCacheEvent {event_id, data, dp_rank}, KvCacheEventData snake_case and
// externally tagged {"stored": {parent_hash, blocks}}, KvCacheStoredBlockData {block_hash,
// tokens_hash, mm_extra_info} (lib/kv-router/src/protocols.rs@cfa22544); newer RouterEvents add
// storage_tier after worker_id (its place here is this test's choice: the reader takes any order).
const PAYLOAD = hex(`
  83
    a9 'worker_id' cf 0123456789abcdef
    ac 'storage_tier' ab 'host_pinned'
    a5 'event' 83
      a8 'event_id' 2a
      a4 'data' 81 a6 'stored' 82
        ab 'parent_hash' c0
        a6 'blocks' 92
          83 aa 'block_hash' cf fedcba9876543210  ab 'tokens_hash' 0b  ad 'mm_extra_info' c0
          83 aa 'block_hash' cd 0100  ab 'tokens_hash' ce 00010000  ad 'mm_extra_info' c0
      a7 'dp_rank' 03
`)

// EventEnvelope in declaration order {topic, publisher_id, sequence, published_at, payload}, payload
// serialised with serialize_bytes → bin 8 (lib/runtime/src/transports/event_plane/traits.rs@331ac67b),
// written named (codec.rs@bf0be57c MsgpackCodec::encode_envelope → rmp_serde::to_vec_named).
const ENVELOPE_A = hex(`
  85
    a5 'topic' a9 'kv-events'
    ac 'publisher_id' cd 3039
    a8 'sequence' 2a
    ac 'published_at' cf 0000018bcfe56800
    a7 'payload' c4 ${PAYLOAD.length.toString(16).padStart(2, '0')} ${PAYLOAD.toString('hex')}
`)

// The field order of the newer codec (publisher_id, sequence, published_at, topic, payload) with
// its published_at_ns after them (codec.rs@bf0be57c test_msgpack_codec_envelope_roundtrip's fields).
const ENVELOPE_B = hex(`
  86
    ac 'publisher_id' cf 8000000000000001
    a8 'sequence' ce 00010000
    ac 'published_at' cf 0000018bcfe56800
    a5 'topic' a9 'kv-events'
    a7 'payload' c4 ${PAYLOAD.length.toString(16).padStart(2, '0')} ${PAYLOAD.toString('hex')}
    af 'published_at_ns' cf 17979cfe362a0000
`)

/** Frame 3: u8 version 1, u32 BE length, envelope (frame.rs FrameHeader::encode, stored copy 2797643627: put_u8, put_u32). */
const frame3 = (env: Buffer, version = 1, len = env.length): Buffer =>
  Buffer.concat([hex(`${version.toString(16).padStart(2, '0')} ${len.toString(16).padStart(8, '0')}`), env])

// [topic, publisher_id u64 BE, sequence u64 BE, frame] (zmq_transport.rs@0a8ea9dd ZmqPubTransport::publish)
const GOLDEN_A = [Buffer.from('kv-events'), hex('0000000000003039'), hex('000000000000002a'), frame3(ENVELOPE_A)]
const GOLDEN_B = [Buffer.from('kv-events'), hex('8000000000000001'), hex('0000000000010000'), frame3(ENVELOPE_B)]

t.test('the golden messages read as Dynamo wrote them, and their envelope decodes to the RouterEvent', async (t) => {
  // the transcription is MessagePack at all (a check of the hand-written bytes, by another reader)
  const un = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' })
  t.match(un.unpack(ENVELOPE_A), { topic: 'kv-events', publisher_id: 12345, sequence: 42, published_at: 1700000000000n })
  t.match(un.unpack(PAYLOAD), { worker_id: 0x0123456789abcdefn, storage_tier: 'host_pinned', event: { event_id: 42, dp_rank: 3 } })

  const reader = new FrameReader(directTopic())
  const m = new EventPlaneMessage()
  const dec = new DynamoMsgpackDecoder()
  for (const [name, frames, pub, seq] of [
    ['declaration order', GOLDEN_A, 12345n, 42n],
    ['newer order, published_at_ns', GOLDEN_B, 2n ** 63n + 1n, 65536n],
  ] as const) {
    t.equal(reader.read(frames, m), null, `${name}: accepted`)
    t.equal(m.publisherId, pub, `${name}: publisher_id`)
    t.equal(m.sequence, seq, `${name}: sequence`)
    t.equal(m.envelope.length, (frames[3] as Buffer).length - 5, `${name}: the envelope is frame 3 past its header`)
    const ev = dec.decode(m.envelope)
    t.ok(ev.hasEnvelope)
    t.same(
      [ev.workerHi, ev.workerLo, ev.eventIdLo, ev.dpRank, ev.kind, ev.tier, ev.hasParent, ev.count],
      [0x01234567, 0x89abcdef, 42, 3, EventKind.Stored, StorageTier.HostPinned, false, 2],
      `${name}: the RouterEvent`,
    )
    t.same([ev.blockHi[0], ev.blockLo[0], ev.tokensLo[0], ev.blockLo[1], ev.tokensLo[1]], [0xfedcba98, 0x76543210, 11, 256, 65536], `${name}: its blocks`)
  }
})

t.test('every malformed message is refused with its reason', async (t) => {
  const reader = new FrameReader(directTopic())
  const m = new EventPlaneMessage()
  const [f0, f1, f2, f3] = GOLDEN_A as [Buffer, Buffer, Buffer, Buffer]
  const withEnv = (env: Buffer): Buffer[] => [f0, f1, f2, frame3(env)]
  const cases: [string, Buffer[], string][] = [
    ['three frames', [f0, f1, f3], 'frame_count'],
    ['five frames', [f0, f1, f2, f3, f3], 'frame_count'],
    ['a topic the prefix subscription also lets through', [Buffer.from('kv-events-prefix-collision'), f1, f2, f3], 'topic'],
    ['the older kv_events topic', [Buffer.from('kv_events'), f1, f2, f3], 'topic'],
    ['a 7-byte publisher frame', [f0, f1.subarray(1), f2, f3], 'id_frame'],
    ['a 9-byte sequence frame', [f0, f1, Buffer.concat([f2, hex('00')]), f3], 'id_frame'],
    ['a 4-byte frame 3', [f0, f1, f2, f3.subarray(0, 4)], 'frame_header'],
    ['frame version 2', [f0, f1, f2, frame3(ENVELOPE_A, 2)], 'frame_version'],
    ['a length past the frame', [f0, f1, f2, frame3(ENVELOPE_A, 1, ENVELOPE_A.length + 1)], 'frame_length'],
    ['a truncated envelope', [f0, f1, f2, frame3(ENVELOPE_A.subarray(0, 40))], 'envelope'],
    ['an envelope that is an array', withEnv(hex('93 01 02 03')), 'envelope'],
    ['JSON instead of MessagePack', withEnv(Buffer.from('{"publisher_id":12345}')), 'envelope'],
    ['an envelope without payload', withEnv(hex(`83 a5 'topic' a9 'kv-events' ac 'publisher_id' cd 3039 a8 'sequence' 2a`)), 'envelope'],
    ['a payload that is a string', withEnv(hex(`84 a5 'topic' a9 'kv-events' ac 'publisher_id' cd 3039 a8 'sequence' 2a a7 'payload' a1 'x'`)), 'envelope'],
    ['a negative sequence', withEnv(hex(`84 a5 'topic' a9 'kv-events' ac 'publisher_id' cd 3039 a8 'sequence' ff a7 'payload' c4 00`)), 'envelope'],
    ['another envelope topic', withEnv(hex(`84 a5 'topic' aa 'kv_metrics' ac 'publisher_id' cd 3039 a8 'sequence' 2a a7 'payload' c4 00`)), 'envelope_topic'],
    ['frame 1 not the envelope publisher', [f0, hex('0000000000003038'), f2, f3], 'id_mismatch'],
    ['frame 2 not the envelope sequence', [f0, f1, hex('000000000000002b'), f3], 'id_mismatch'],
  ]
  for (const [name, frames, why] of cases) t.equal(reader.read(frames, m), why, name)
  // trailing bytes after the declared length are ignored, as Frame::decode does
  t.equal(reader.read([f0, f1, f2, Buffer.concat([f3, hex('ffff')])], m), null, 'bytes after the declared length')
})

t.test('broker topics: the component subject, its endpoints, the bare topic; nothing else', async (t) => {
  const b = brokerTopic('dyn', 'backend')
  t.same(b.prefixes, ['namespace.dyn.component.backend.', 'kv-events'])
  const yes = [
    'namespace.dyn.component.backend.kv-events',
    'namespace.dyn.component.backend.endpoint.generate.kv-events',
    'namespace.dyn.component.backend.endpoint.a%2Eb.kv-events',
    'kv-events',
  ]
  const no = [
    'namespace.dyn.component.backend.kv-events-x',
    'namespace.dyn.component.backend.endpoint.a.b.kv-events',
    'namespace.dyn.component.backend.endpoint..kv-events',
    'namespace.dyn.component.backend.endpoint.kv-events',
    'namespace.dyn.component.backend.kv_metrics',
    'namespace.dyn.component.prefill.kv-events',
    'namespace.dyn.component.backend.',
    'kv-events2',
  ]
  for (const s of yes) t.ok(b.matches(Buffer.from(s)), s)
  for (const s of no) t.notOk(b.matches(Buffer.from(s)), s)
  const d = directTopic()
  t.ok(d.matches(Buffer.from('kv-events')))
  t.notOk(d.matches(Buffer.from('kv-event')))
})

t.test("segments are percent-encoded as Dynamo's encode_event_segment does, and decoded back", async (t) => {
  // discovery/mod.rs@020f5c17: every byte but [A-Za-z0-9_-] as %XX, upper-case hex
  t.equal(encodeEventSegment('my.ns/x y'), 'my%2Ens%2Fx%20y')
  t.equal(encodeEventSegment('backend_1-a'), 'backend_1-a')
  t.equal(encodeEventSegment('é'), '%C3%A9')
  t.equal(decodeEventSegment('my%2Ens%2Fx%20y'), 'my.ns/x y')
  t.equal(decodeEventSegment('%c3%a9'), 'é')
  t.equal(decodeEventSegment('%2'), null)
  t.equal(decodeEventSegment('%ZZ'), null)
  t.equal(decodeEventSegment('%FF'), null, 'not UTF-8')
})
