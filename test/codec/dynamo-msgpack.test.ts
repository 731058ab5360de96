// Dynamo's MessagePack RouterEvents, enveloped and bare, decode into the same events as their
// JSON spelling does.
import t from 'tap'
import { pack } from 'msgpackr'
import { DynamoMsgpackDecoder, isMsgpackMap } from '../../src/codec/dynamo-msgpack.js'
import { type DecodedEvent, EventDecoder, EventKind, StorageTier } from '../../src/codec/event-decoder.js'

const big = 18446744073709551615n
const stored = {
  worker_id: 7587888130471510123n,
  storage_tier: 'device',
  event: {
    event_id: 5,
    dp_rank: 1,
    data: {
      stored: {
        parent_hash: big,
        start_position: null,
        blocks: [
          { block_hash: 2, tokens_hash: 3, mm_extra_info: null },
          { block_hash: 2n ** 63n, tokens_hash: 4 },
        ],
      },
    },
  },
}
const json =
  '{"worker_id":7587888130471510123,"storage_tier":"device","event":{"event_id":5,"dp_rank":1,"data":{"stored":{"parent_hash":18446744073709551615,"blocks":[{"block_hash":2,"tokens_hash":3,"mm_extra_info":null},{"block_hash":9223372036854775808,"tokens_hash":4}]}}}}'

function fields(d: DecodedEvent): unknown {
  return {
    worker: [d.workerLo, d.workerHi],
    id: [d.eventIdLo, d.eventIdHi],
    rank: d.dpRank,
    kind: d.kind,
    tier: d.tier,
    parent: d.hasParent ? [d.parentLo, d.parentHi] : null,
    blocks: Array.from({ length: d.count }, (_, i) => [d.blockLo[i], d.blockHi[i], d.kind === EventKind.Stored ? d.tokensLo[i] : 0, d.kind === EventKind.Stored ? d.tokensHi[i] : 0]),
  }
}

t.test('a bare RouterEvent and one in the envelope decode as the JSON does', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  const fromJson = fields(new EventDecoder().decode(new TextEncoder().encode(json)))
  const bare = pack(stored)
  t.ok(isMsgpackMap(bare[0] as number))
  t.notOk(isMsgpackMap('{'.charCodeAt(0)))
  t.same(fields(dec.decode(bare)), fromJson)
  const enveloped = dec.decode(pack({ publisher_id: 77, sequence: 9, published_at: 1_700_000_000_000, topic: 'kv-events', payload: pack(stored) }))
  t.same(fields(enveloped), fromJson)
  t.ok(enveloped.hasEnvelope)
  t.same([enveloped.publisherLo, enveloped.sequenceLo], [77, 9])
})

t.test('removed, cleared (both spellings), tiers and unknown fields', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  const r = dec.decode(pack({ worker_id: 1, event: { event_id: 2, data: { removed: { block_hashes: [5, big] } }, dp_rank: 0 }, residency_domain: 'worker', something_new: [1, 2] }))
  t.equal(r.kind, EventKind.Removed)
  t.equal(r.count, 2)
  t.same([r.blockLo[1], r.blockHi[1]], [0xffffffff, 0xffffffff])
  t.equal(dec.decode(pack({ worker_id: 1, event: { event_id: 3, data: 'cleared', dp_rank: 0 } })).kind, EventKind.Cleared)
  t.equal(dec.decode(pack({ worker_id: 1, event: { event_id: 3, data: { cleared: null }, dp_rank: 0 } })).kind, EventKind.Cleared)
  t.equal(dec.decode(pack({ worker_id: 1, storage_tier: 'host_pinned', event: { event_id: 3, data: 'cleared' } })).tier, StorageTier.HostPinned)
})

t.test('malformed messages are refused with the reason', async (t) => {
  const dec = new DynamoMsgpackDecoder()
  t.throws(() => dec.decode(new Uint8Array([0x82, 0xa1])), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' })
  t.throws(() => dec.decode(pack([1, 2])), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
  t.throws(() => dec.decode(pack({ event: { event_id: 1, data: 'cleared' } })), { code: 'KVR_ERR_EVENT_MISSING_FIELD' })
  t.throws(() => dec.decode(pack({ worker_id: -1, event: { event_id: 1, data: 'cleared' } })), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  t.throws(() => dec.decode(pack({ worker_id: 1, event: { event_id: 1, data: { moved: {} } } })), { code: 'KVR_ERR_EVENT_UNKNOWN_VARIANT' })
  t.throws(() => dec.decode(pack({ worker_id: 1, storage_tier: 'tape', event: { event_id: 1, data: 'cleared' } })), { code: 'KVR_ERR_EVENT_UNKNOWN_VARIANT' })
  t.throws(() => dec.decode(pack({ worker_id: 1, event: { event_id: 1, data: { stored: { blocks: [{ block_hash: 1 }] } } } })), { code: 'KVR_ERR_EVENT_MISSING_FIELD' })
  t.throws(() => dec.decode(pack({ publisher_id: 1, sequence: 1, payload: new Uint8Array([0xc1, 0x00]) })), { code: /KVR_ERR_EVENT_(MALFORMED_MSGPACK|WRONG_TYPE)/ })
})
