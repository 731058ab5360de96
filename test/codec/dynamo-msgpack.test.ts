// Dynamo's MessagePack RouterEvents, named and positional, enveloped and bare, decode into the
// same events as their JSON spelling does; anything malformed is a KvrError, never a crash.
import t from 'tap'
import { DynamoMsgpackDecoder, RouterEventDecoder, isMsgpackLead } from '../../src/codec/dynamo-msgpack.js'
import { type DecodedEvent, EventDecoder, EventKind, StorageTier } from '../../src/codec/event-decoder.js'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'
import { KvrError } from '../../src/errors.js'
import { cleared, removed, stored } from '../helpers/events.js'
import { EventStream } from '../helpers/random-events.js'
import { Rng } from '../helpers/rng.js'
import { type MsgpackForm, MsgpackWriter, encodeEnvelopeMsgpack, encodeRouterEventMsgpack, pack, routerEventValue } from '../../support/dynamo-msgpack.js'

const U64_MAX = 2n ** 64n - 1n
const FORMS: MsgpackForm[] = ['named', 'positional']

function fields(d: DecodedEvent): unknown {
  return {
    worker: [d.workerLo, d.workerHi],
    id: [d.eventIdLo, d.eventIdHi],
    rank: d.dpRank,
    kind: d.kind,
    tier: d.tier,
    parent: d.hasParent ? [d.parentLo, d.parentHi] : null,
    blocks: Array.from({ length: d.count }, (_, i) => [
      d.blockLo[i],
      d.blockHi[i],
      d.kind === EventKind.Stored ? d.tokensLo[i] : 0,
      d.kind === EventKind.Stored ? d.tokensHi[i] : 0,
    ]),
  }
}

const fromJson = (ev: RouterEvent): unknown => fields(new EventDecoder().decode(Buffer.from(encodeRouterEvent(ev))))

t.test('every form, bare and enveloped, decodes as the JSON does', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  // integers of every width the writer picks: fixint, u8, u16, u32, u64, and u64 above 2^53
  const widths = [0n, 127n, 128n, 255n, 256n, 65535n, 65536n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 53n + 1n, U64_MAX]
  const events: RouterEvent[] = [
    stored(7587888130471510123n, U64_MAX, [
      [2n, 3n],
      [2n ** 63n, 4n],
    ]),
    stored(
      5,
      null,
      widths.map((w, i) => [w, widths[widths.length - 1 - i] as bigint]),
      3,
    ),
    removed(U64_MAX, widths),
    cleared(2n ** 53n + 1n, 1),
    { ...stored(9, 1, [[1, 2]]), storage_tier: 'host_pinned' },
  ]
  for (const ev of events) {
    const want = fromJson(ev)
    for (const form of FORMS) {
      const bare = encodeRouterEventMsgpack(ev, form)
      t.ok(isMsgpackLead(bare[0] as number))
      t.same(fields(dec.decode(bare)), want, `bare, ${form}`)
      t.notOk(dec.out.hasEnvelope)
      for (const envForm of FORMS) {
        const env = dec.decode(encodeEnvelopeMsgpack({ publisher_id: 2n ** 63n + 1n, sequence: 9, payload: bare }, envForm))
        t.same(fields(env), want, `${form} in a ${envForm} envelope`)
        t.ok(env.hasEnvelope)
        t.same([env.publisherLo, env.publisherHi, env.sequenceLo, env.sequenceHi], [1, 0x80000000, 9, 0])
      }
    }
  }
  t.notOk(isMsgpackLead('{'.charCodeAt(0)))
  t.notOk(isMsgpackLead(' '.charCodeAt(0)))
})

t.test('random event streams in both forms match their JSON', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  const stream = new EventStream(new Rng(7), undefined, 40)
  let n = 0
  while (n < 300) {
    const { ev } = stream.next()
    if (ev === undefined) continue
    n++
    const want = fromJson(ev)
    for (const form of FORMS) if (JSON.stringify(fields(dec.decode(encodeRouterEventMsgpack(ev, form)))) !== JSON.stringify(want)) t.fail(`event ${n}, ${form}`)
  }
  t.equal(n, 300)
})

t.test('older and other layouts Dynamo reads: legacy positions, signed ints, long headers, unknown keys', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  const want = fromJson({
    worker_id: 7n,
    storage_tier: 'disk',
    event: { event_id: 4n, dp_rank: 2, data: { stored: { parent_hash: 5n, blocks: [{ block_hash: 1n, tokens_hash: 2n }] } } },
  })
  const block = [1, 2, null]
  // no residency_domain, then no storage_tier either (device), then a store without start_position
  t.same(fields(dec.decode(pack([7, 'disk', [4, { stored: [5, null, [block]] }, 2]]))), want)
  const legacy = dec.decode(pack([7, [4, { stored: [5, [block]] }]]))
  t.same([legacy.workerLo, legacy.eventIdLo, legacy.dpRank, legacy.tier, legacy.parentLo, legacy.count], [7, 4, 0, StorageTier.Device, 5, 1])
  // a state_source after the event, and anything after that, is skipped
  t.equal(dec.decode(pack([7, 'device', 'cache_owner', [1, 'cleared', 0], { pool: 'x' }, 99])).kind, EventKind.Cleared)
  // signed markers holding values of at least 0 are u64s to serde too
  const w = new MsgpackWriter()
    .arrayHeader(2)
    .byte(0xd3)
    .raw(new Uint8Array([0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]))
  w.arrayHeader(3)
    .byte(0xd0)
    .byte(5)
    .str('cleared')
    .byte(0xd2)
    .raw(new Uint8Array([0, 0, 0, 3]))
  const signed = dec.decode(w.bytes())
  t.same([signed.workerLo, signed.workerHi, signed.eventIdLo, signed.dpRank], [0xfffffffe, 0x7fffffff, 5, 3])
  // str8 keys, map16 and array16 headers, bin16 payloads, unknown keys of every type skipped
  const long = new MsgpackWriter().byte(0xde).raw(new Uint8Array([0, 4]))
  long.byte(0xd9).byte(9).raw(Buffer.from('worker_id')).uint(11)
  long.str('future').value({ a: [true, false, null, new Uint8Array(300), new Uint8Array(70000), 'x'.repeat(40), 'y'.repeat(300), [[[]]]] })
  long.str('event').value({ event_id: 1, data: { removed: { block_hashes: Array.from({ length: 20 }, (_, i) => i), extra: 1 } }, dp_rank: null })
  long.byte(0x01).uint(2)
  const r = dec.decode(long.bytes())
  t.same([r.workerLo, r.kind, r.count, r.blockLo[19], r.dpRank], [11, EventKind.Removed, 20, 19, 0])
  const many = stored(
    3,
    null,
    Array.from({ length: 40 }, (_, i) => [i, i]),
  )
  const env = encodeEnvelopeMsgpack({ publisher_id: 1, sequence: 2, payload: encodeRouterEventMsgpack(many) })
  t.equal(env[env.indexOf(0xc5)], 0xc5, 'a payload over 255 bytes is a bin16')
  t.equal(dec.decode(env).count, 40)
  t.equal(dec.decode(pack({ worker_id: 1, event: { event_id: 3, data: { cleared: null } } })).kind, EventKind.Cleared)
  t.equal(dec.decode(pack({ worker_id: 1, storage_tier: null, event: { event_id: 3, data: 'cleared' } })).tier, StorageTier.Device)
  t.equal(dec.decode(pack({ worker_id: 1, storage_tier: 'external', event: [3, 'cleared'] })).tier, StorageTier.External)
  // floats and extension types in skipped values
  const ext = new MsgpackWriter().mapHeader(3).str('worker_id').uint(1).str('x').byte(0xcb).raw(new Uint8Array(8))
  ext.str('event').mapHeader(3).str('e').byte(0xd6).raw(new Uint8Array(5)).str('event_id').uint(1).str('data').str('cleared')
  t.equal(dec.decode(ext.bytes()).workerLo, 1)
})

t.test('long events let queries in every 16 blocks', async (t) => {
  const both = new RouterEventDecoder()
  let calls = 0
  both.interrupt = () => calls++
  t.type(both.interrupt, 'function')
  const ev = stored(
    3,
    null,
    Array.from({ length: 40 }, (_, i) => [i, i]),
  )
  both.decode(encodeRouterEventMsgpack(ev, 'positional'))
  t.equal(calls, 2, 'at blocks 16 and 32')
  both.decode(Buffer.from(encodeRouterEvent(ev)))
  t.equal(calls, 4, 'the JSON decoder gets the same hook')
  both.decode(
    encodeRouterEventMsgpack(
      removed(
        3,
        Array.from({ length: 16 }, (_, i) => i),
      ),
    ),
  )
  t.equal(calls, 5)
})

t.test('the shard decoder picks JSON or MessagePack from the first byte', async (t) => {
  const both = new RouterEventDecoder()
  const ev = stored(2n ** 60n + 3n, 1, [[2, 3]], 1)
  t.same(fields(both.decode(encodeRouterEventMsgpack(ev))), fromJson(ev))
  t.same(fields(both.decode(Buffer.from(` ${encodeRouterEvent(ev)}`))), fromJson(ev))
  t.throws(() => both.decode(new Uint8Array(0)), { code: 'KVR_ERR_EVENT_MALFORMED_JSON' })
  t.throws(() => both.decode(new Uint8Array([0xc1])), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
})

t.test('malformed messages are refused with the reason', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  const ok = { worker_id: 1, event: { event_id: 1, data: 'cleared' } }
  const cases: [Uint8Array, string, RegExp?][] = [
    [new Uint8Array(0), 'KVR_ERR_EVENT_MALFORMED_MSGPACK', /empty/],
    [new Uint8Array([0x82, 0xa1]), 'KVR_ERR_EVENT_MALFORMED_MSGPACK', /truncated/],
    [new Uint8Array([...pack(ok), 0x00]), 'KVR_ERR_EVENT_MALFORMED_MSGPACK', /after the event/],
    [new Uint8Array([0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]), 'KVR_ERR_EVENT_MALFORMED_MSGPACK', /truncated/],
    [
      pack({ worker_id: 1, event: { event_id: 1, data: { stored: { blocks: [] } } }, x: null }).map((b) => (b === 0xc0 ? 0xc1 : b)),
      'KVR_ERR_EVENT_MALFORMED_MSGPACK',
      /0xc1/,
    ],
    [pack('cleared'), 'KVR_ERR_EVENT_WRONG_TYPE'],
    [pack([]), 'KVR_ERR_EVENT_MISSING_FIELD', /worker_id/],
    [pack([1]), 'KVR_ERR_EVENT_MISSING_FIELD', /event/],
    [pack([1, 2, 3]), 'KVR_ERR_EVENT_MISSING_FIELD', /payload/],
    [pack([1, true]), 'KVR_ERR_EVENT_WRONG_TYPE'],
    [pack({ event: { event_id: 1, data: 'cleared' } }), 'KVR_ERR_EVENT_MISSING_FIELD', /worker_id/],
    [pack({ worker_id: 1 }), 'KVR_ERR_EVENT_MISSING_FIELD', /event/],
    [pack({ worker_id: 'one', event: ok.event }), 'KVR_ERR_EVENT_WRONG_TYPE'],
    [new MsgpackWriter().mapHeader(2).str('worker_id').byte(0xff).str('event').value(ok.event).bytes(), 'KVR_ERR_EVENT_INVALID_NUMBER', /negative/],
    [
      new MsgpackWriter()
        .mapHeader(2)
        .str('worker_id')
        .byte(0xd1)
        .raw(new Uint8Array([0x80, 0]))
        .str('event')
        .value(ok.event)
        .bytes(),
      'KVR_ERR_EVENT_INVALID_NUMBER',
    ],
    [pack({ worker_id: 1, event: { event_id: 1, data: 'cleared', dp_rank: 2n ** 32n } }), 'KVR_ERR_EVENT_INVALID_NUMBER', /dp_rank/],
    [pack({ worker_id: 1, event: { event_id: 1 } }), 'KVR_ERR_EVENT_MISSING_FIELD', /data/],
    [pack({ worker_id: 1, event: { data: 'cleared' } }), 'KVR_ERR_EVENT_MISSING_FIELD', /event_id/],
    [pack({ worker_id: 1, event: [1] }), 'KVR_ERR_EVENT_MISSING_FIELD', /data/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { moved: {} } } }), 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /moved/],
    [pack({ worker_id: 1, event: { event_id: 1, data: 'moved' } }), 'KVR_ERR_EVENT_UNKNOWN_VARIANT'],
    [pack({ worker_id: 1, event: { event_id: 1, data: { stored: { blocks: [] }, removed: {} } } }), 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /exactly one/],
    [pack({ worker_id: 1, event: { event_id: 1, data: 5 } }), 'KVR_ERR_EVENT_WRONG_TYPE'],
    [pack({ worker_id: 1, storage_tier: 'tape', event: ok.event }), 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /tape/],
    [pack({ worker_id: 1, storage_tier: 3, event: ok.event }), 'KVR_ERR_EVENT_WRONG_TYPE'],
    [pack({ worker_id: 1, event: { event_id: 1, data: { stored: { blocks: [{ block_hash: 1 }] } } } }), 'KVR_ERR_EVENT_MISSING_FIELD', /tokens_hash/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { stored: { blocks: [[1]] } } } }), 'KVR_ERR_EVENT_MISSING_FIELD', /tokens_hash/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { stored: { blocks: [{ tokens_hash: 1 }] } } } }), 'KVR_ERR_EVENT_MISSING_FIELD', /block_hash/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { stored: { parent_hash: null } } } }), 'KVR_ERR_EVENT_MISSING_FIELD', /blocks/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { stored: [null] } } }), 'KVR_ERR_EVENT_MISSING_FIELD', /blocks/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { removed: {} } } }), 'KVR_ERR_EVENT_MISSING_FIELD', /block_hashes/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { removed: [] } } }), 'KVR_ERR_EVENT_MISSING_FIELD', /block_hashes/],
    [pack({ worker_id: 1, event: { event_id: 1, data: { removed: { block_hashes: 5 } } } }), 'KVR_ERR_EVENT_WRONG_TYPE'],
    [pack({ worker_id: 1, event: 'cleared' }), 'KVR_ERR_EVENT_WRONG_TYPE'],
    [pack({ publisher_id: 1, sequence: 1, payload: pack(ok), worker_id: 1 }), 'KVR_ERR_EVENT_WRONG_TYPE', /envelope/],
    [pack({ sequence: 1, payload: pack(ok) }), 'KVR_ERR_EVENT_MISSING_FIELD', /publisher_id/],
    [pack({ publisher_id: 1, payload: pack(ok) }), 'KVR_ERR_EVENT_MISSING_FIELD', /sequence/],
    [pack({ publisher_id: 1, sequence: 1, payload: [1, 2] }), 'KVR_ERR_EVENT_WRONG_TYPE', /bin/],
    [pack({ publisher_id: 1, sequence: 1, payload: new Uint8Array([0xc1]) }), 'KVR_ERR_EVENT_WRONG_TYPE', /in envelope payload/],
    [
      pack({ publisher_id: 1, sequence: 1, payload: new Uint8Array([...pack(ok), 0]) }),
      'KVR_ERR_EVENT_MALFORMED_MSGPACK',
      /in envelope payload: unexpected data/,
    ],
    [pack({ publisher_id: 1, sequence: 1, payload: new Uint8Array(0) }), 'KVR_ERR_EVENT_WRONG_TYPE', /in envelope payload/],
    [pack([1, 2, 3, 'kv-events', pack([5])]), 'KVR_ERR_EVENT_MISSING_FIELD', /in envelope payload.*event/],
  ]
  for (const [bytes, code, msg] of cases)
    t.throws(() => dec.decode(bytes), { code, ...(msg === undefined ? {} : { message: msg }) }, Buffer.from(bytes).toString('hex').slice(0, 60))
  // an unknown value nested deeper than any event is refused without exhausting the stack
  const deep = new MsgpackWriter().mapHeader(3).str('worker_id').uint(1).str('x')
  for (let i = 0; i < 100; i++) deep.arrayHeader(1)
  deep.uint(0).str('event').value(ok.event)
  t.throws(() => dec.decode(deep.bytes()), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK', message: /too deep/ })
  // the decoder is whole again after an error
  t.equal(dec.decode(pack(ok)).workerLo, 1)
})

t.test('every truncation and random corruption is a KvrError, never a crash', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  const ev = stored(2n ** 63n + 5n, 1n, [
    [U64_MAX, 2n ** 40n],
    [300n, 70000n],
  ])
  const samples = FORMS.flatMap((f) => [
    encodeRouterEventMsgpack(ev, f),
    encodeEnvelopeMsgpack({ publisher_id: 2n ** 50n, sequence: 3, payload: encodeRouterEventMsgpack(ev, f) }, f),
  ])
  let refused = 0
  for (const s of samples) {
    for (let n = 0; n < s.length; n++) {
      t.throws(() => dec.decode(s.subarray(0, n)), KvrError)
      refused++
    }
  }
  const rng = new Rng(11)
  let other = 0
  for (let i = 0; i < 4000; i++) {
    const s = (samples[i % samples.length] as Uint8Array).slice()
    for (let k = 0, m = 1 + rng.int(3); k < m; k++) s[rng.int(s.length)] = rng.int(256)
    try {
      dec.decode(s)
    } catch (err) {
      if (!(err instanceof KvrError)) other++
    }
  }
  t.equal(other, 0, 'no error but KvrError')
  t.ok(refused > 100)
})

t.test('the helper writes what rmp_serde writes for a current worker', async (t) => {
  // {worker_id: 7, storage_tier: "device", residency_domain: "worker", event: {event_id: 1, data: "cleared", dp_rank: 0}}
  const hex = Buffer.from(pack(routerEventValue(cleared(7)))).toString('hex')
  t.match(hex, /^84a9776f726b65725f696407ac73746f726167655f74696572a6646576696365b07265736964656e63795f646f6d61696ea6776f726b6572a56576656e7483/)
  t.equal(
    Buffer.from(pack(routerEventValue(cleared(7), 'positional')))
      .toString('hex')
      .slice(0, 4),
    '9407',
  )
})

t.test('residency_domain: omitted, "worker" or "cache_owner" are taken; an explicit nil or another name is refused', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  const json = new EventDecoder()
  const ascii = (s: string): string => (0xa0 | s.length).toString(16) + Buffer.from(s).toString('hex')
  // {worker_id: 9, residency_domain: …, event: {event_id: 1, data: "cleared"}}, keys as RouterEvent declares them
  const named = (domain: string | null): Buffer =>
    Buffer.from(
      `83${ascii('worker_id')}09${ascii('residency_domain')}${domain === null ? 'c0' : ascii(domain)}${ascii('event')}82${ascii('event_id')}01` +
        `${ascii('data')}${ascii('cleared')}`,
      'hex',
    )
  for (const d of ['worker', 'cache_owner']) {
    t.equal(dec.decode(named(d)).kind, EventKind.Cleared, `${d}, MessagePack`)
    t.equal(json.decode(Buffer.from(`{"worker_id":9,"residency_domain":"${d}","event":{"event_id":1,"data":"cleared"}}`)).kind, EventKind.Cleared, `${d}, JSON`)
  }
  t.throws(() => dec.decode(named(null)), { code: 'KVR_ERR_EVENT_WRONG_TYPE' }, 'explicit nil, MessagePack')
  t.throws(() => json.decode(Buffer.from('{"worker_id":9,"residency_domain":null,"event":{"event_id":1,"data":"cleared"}}')), {
    code: 'KVR_ERR_EVENT_WRONG_TYPE',
  })
  t.throws(() => dec.decode(named('peer')), { code: 'KVR_ERR_EVENT_UNKNOWN_VARIANT' })
  // state_source and session_id are passed over
  const extra = Buffer.from(`{"worker_id":9,"event":{"event_id":1,"data":"cleared"},"state_source":{"kind":"x"},"session_id":"s1"}`)
  t.equal(json.decode(extra).kind, EventKind.Cleared)
})
