// ActiveSequenceEvent (replica sync) on the wire: what kv-router writes has the shape serde
// derives for Dynamo's struct, u64 values exact; what Dynamo routers write (both generations of
// AddRequest, unit variants, the envelope, MessagePack) is read; anything else is refused.
import t from 'tap'
import type { Test } from 'tap'
import { Packr } from 'msgpackr'
import { ActiveSequenceDecoder, encodeAddRequest, encodeLifecycle, prefillTokensOf } from '../../src/codec/active-sequence.js'

const halves = (v: bigint): [number, number] => [Number(v & 0xffffffffn), Number(v >> 32n)]
const enc = new TextEncoder()

t.test('an AddRequest round-trips with exact hashes, worker and router ids above 2^53', async (t) => {
  const hashes = [2n ** 64n - 1n, 2n ** 53n + 1n, 0n, 12345n]
  const lo = hashes.map((h) => halves(h)[0])
  const hi = hashes.map((h) => halves(h)[1])
  const router = (2n ** 64n - 2n).toString()
  const text = encodeAddRequest(
    'req "1"',
    2n ** 63n + 9n,
    3,
    router,
    { lo, hi, n: 4, isl: 200, overlapBlocks: 2, trackPrefill: true, prefillTokens: 72 },
    1712345678901.25,
  )
  const ev = new ActiveSequenceDecoder().decode(enc.encode(text))
  t.equal(ev.kind, 'add')
  t.equal(ev.requestId, 'req "1"')
  t.equal(ev.workerId, 2n ** 63n + 9n)
  t.equal(ev.dpRank, 3)
  t.equal(ev.routerId, router)
  t.equal(ev.n, 4)
  const got = Array.from({ length: ev.n }, (_, i) => (BigInt(ev.hi?.[i] ?? 0) << 32n) | BigInt(ev.lo?.[i] ?? 0))
  t.same(got, hashes)
  t.same(
    [ev.isl, ev.overlap, ev.trackPrefillTokens, ev.prefillHint, ev.expectedOutputTokens, ev.loraName, ev.publishedAt],
    [200, 2, true, 72, null, null, 1712345678901.25],
  )
  t.equal(prefillTokensOf(ev, 16), 72)
  const none = new ActiveSequenceDecoder().decode(
    enc.encode(encodeAddRequest('r', 1n, 0, '5', { lo: undefined, hi: undefined, n: 0, isl: 10, overlapBlocks: 0, trackPrefill: false, prefillTokens: 0 }, 1)),
  )
  t.equal(none.lo, null, 'token_sequence null stays null')
  t.equal(prefillTokensOf(none, 16), 0, 'track_prefill_tokens false books no prefill')
  for (const kind of ['free', 'prefill_completed'] as const) {
    const l = new ActiveSequenceDecoder().decode(enc.encode(encodeLifecycle(kind, 'x', 7n, 1, router, 5)))
    t.same([l.kind, l.requestId, l.workerId, l.dpRank, l.routerId, l.publishedAt], [kind, 'x', 7n, 1, router, 5])
  }
})

/** The shape serde's derive gives Dynamo's ActiveSequenceEvent, checked on the raw text. */
function dynamoShaped(t: Test, text: string): void {
  // u64 fields must be JSON integers (serde's u64 refuses strings), at their exact value
  t.match(text, /"worker":\{"worker_id":\d+,"dp_rank":\d+\}/, 'worker is WorkerWithDpRank with integers')
  t.match(text, /"router_id":\d+[,}]/, 'router_id is an integer')
  const v = JSON.parse(text) as Record<string, unknown>
  t.type(v['request_id'], 'string')
  t.ok(v['lora_name'] === null || typeof v['lora_name'] === 'string')
  const data = v['data']
  if (typeof data === 'string') {
    t.ok(['Free', 'MarkPrefillCompleted'].includes(data), 'unit variants as their names')
    return
  }
  const keys = Object.keys(data as object)
  t.same(keys, ['AddRequest'], 'externally tagged')
  const add = (data as Record<string, Record<string, unknown>>)['AddRequest'] as Record<string, unknown>
  // Era B's required fields and Era C's, with the types serde expects
  t.ok(add['token_sequence'] === null || Array.isArray(add['token_sequence']))
  t.ok(Number.isInteger(add['isl']) && Number.isInteger(add['overlap']))
  t.ok(add['expected_output_tokens'] === null)
  t.type(add['track_prefill_tokens'], 'boolean')
  const hint = add['prefill_load_hint'] as Record<string, unknown> | null
  t.ok(hint === null || (Number.isInteger(hint['initial_effective_prefill_tokens']) && (hint['initial_effective_prefill_tokens'] as number) > 0))
  if (Array.isArray(add['token_sequence'])) t.match(text, /"token_sequence":\[(\d+(,\d+)*)?\]/, 'hashes are bare integers')
}

t.test("what kv-router writes has the shape of Dynamo's ActiveSequenceEvent", async (t) => {
  dynamoShaped(
    t,
    encodeAddRequest(
      'a',
      2n ** 64n - 1n,
      0,
      (2n ** 63n).toString(),
      { lo: [1, 0], hi: [0, 0xffffffff], n: 2, isl: 64, overlapBlocks: 1, trackPrefill: true, prefillTokens: 48 },
      1,
    ),
  )
  dynamoShaped(t, encodeAddRequest('a', 1n, 0, '1', { lo: undefined, hi: undefined, n: 0, isl: 64, overlapBlocks: 0, trackPrefill: true, prefillTokens: 0 }, 1))
  dynamoShaped(t, encodeLifecycle('free', 'a', 1n, 0, '1', 1))
  dynamoShaped(t, encodeLifecycle('prefill_completed', 'a', 1n, 0, '1', 1))
})

t.test('what Dynamo routers write is read', async (t) => {
  const d = new ActiveSequenceDecoder()
  // Era B: isl and overlap, the router computes the prefill
  const eraB = d.decode(
    enc.encode(
      '{"request_id":"b1","worker":{"worker_id":18446744073709551615,"dp_rank":1},"data":{"AddRequest":{"token_sequence":[9007199254740993, ' +
        '18446744073709551614],"isl":100,"overlap":2,"expected_output_tokens":7}},"router_id":9223372036854775809,"lora_name":null}',
    ),
  )
  t.same(
    [eraB.kind, eraB.workerId, eraB.dpRank, eraB.routerId, eraB.n, eraB.expectedOutputTokens, eraB.publishedAt],
    ['add', 2n ** 64n - 1n, 1, '9223372036854775809', 2, 7, null],
  )
  t.same([eraB.lo?.[0], eraB.hi?.[0], eraB.lo?.[1], eraB.hi?.[1]], [1, 0x200000, 0xfffffffe, 0xffffffff])
  t.equal(prefillTokensOf(eraB, 16), 100 - 32)
  // Era C: the prefill hint, no isl; unknown fields ignored as serde does
  const eraC = d.decode(
    enc.encode(
      '{"request_id":"c1","worker":{"worker_id":5,"dp_rank":0},"data":{"AddRequest":{"token_sequence":null,"track_prefill_tokens":true,' +
        '"expected_output_tokens":null,"prefill_load_hint":{"initial_effective_prefill_tokens":300,"expected_prefill_duration":{"secs":1,' +
        '"nanos":0}},"future":1}},"router_id":42,"stride":1}',
    ),
  )
  t.same([eraC.kind, eraC.lo, eraC.isl, prefillTokensOf(eraC, 16), eraC.stride], ['add', null, null, 300, 1])
  // unit variants, also as {"Free": null}; older top-level worker_id; a UUID router id
  t.equal(d.decode(enc.encode('{"request_id":"x","worker":{"worker_id":5},"data":"MarkPrefillCompleted","router_id":1}')).kind, 'prefill_completed')
  t.equal(d.decode(enc.encode('{"request_id":"x","worker":{"worker_id":5,"dp_rank":0},"data":{"Free":null},"router_id":1}')).kind, 'free')
  const old = d.decode(enc.encode('{"request_id":"x","worker_id":77,"data":"Free","router_id":"5b0c1a8e-8a57-4bb5-9d0e-3e9f6f1f6a11"}'))
  t.same([old.workerId, old.dpRank, old.routerId], [77n, 0, '5b0c1a8e-8a57-4bb5-9d0e-3e9f6f1f6a11'])
  // the event-plane envelope, payload as JSON bytes
  const inner = enc.encode(
    '{"request_id":"e","worker":{"worker_id":3,"dp_rank":0},"data":{"AddRequest":{"token_sequence":[1,2,3],"isl":48,"overlap":0,' +
      '"expected_output_tokens":null}},"router_id":8}',
  )
  const env = d.decode(enc.encode(`{"publisher_id":8,"sequence":0,"published_at":1700000000000,"payload":[${Array.from(inner).join(',')}]}`))
  t.same([env.requestId, env.n, env.publishedAt], ['e', 3, 1700000000000])
  // MessagePack: a bare map and Dynamo's MessagePack envelope, u64s as bigints
  const packr = new Packr({ useRecords: false, int64AsType: 'bigint' })
  const mp = {
    request_id: 'm',
    worker: { worker_id: 2n ** 64n - 5n, dp_rank: 2 },
    data: { AddRequest: { token_sequence: [2n ** 63n, 7], isl: 64, overlap: 1, expected_output_tokens: null } },
    router_id: 2n ** 62n,
    lora_name: null,
  }
  const bare = d.decode(packr.pack(mp))
  t.same([bare.workerId, bare.dpRank, bare.routerId, bare.n, bare.hi?.[0], bare.lo?.[1]], [2n ** 64n - 5n, 2, (2n ** 62n).toString(), 2, 0x80000000, 7])
  const wrapped = d.decode(
    packr.pack({ publisher_id: 1n, sequence: 2n, published_at: 1700000000001n, topic: 'active_sequences_events', payload: packr.pack(mp) }),
  )
  t.same([wrapped.requestId, wrapped.publishedAt, wrapped.n], ['m', 1700000000001, 2])
})

t.test('a request id or other string that contains the key does not confuse the hash scan', async (t) => {
  const ev = new ActiveSequenceDecoder().decode(
    enc.encode(
      '{"request_id":"\\"token_sequence\\":[1]","lora_name":"token_sequence","worker":{"worker_id":1,"dp_rank":0},' +
        '"data":{"AddRequest":{"token_sequence" : [ 5 , "6" ],"isl":1,"overlap":0}},"router_id":2}',
    ),
  )
  t.equal(ev.requestId, '"token_sequence":[1]')
  t.equal(ev.loraName, 'token_sequence')
  t.same([ev.n, ev.lo?.[0], ev.lo?.[1]], [2, 5, 6], 'decimal strings are u64s too')
})

t.test('anything else is refused with the catalogue code', async (t) => {
  const d = new ActiveSequenceDecoder()
  const bad: [string, string][] = [
    ['', 'KVR_ERR_EVENT_MALFORMED_JSON'],
    ['{"request_id":', 'KVR_ERR_EVENT_MALFORMED_JSON'],
    ['[1]', 'KVR_ERR_EVENT_WRONG_TYPE'],
    ['{"worker":{"worker_id":1},"data":"Free","router_id":1}', 'KVR_ERR_EVENT_MISSING_FIELD'],
    ['{"request_id":"a","data":"Free","router_id":1}', 'KVR_ERR_EVENT_MISSING_FIELD'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":"Free"}', 'KVR_ERR_EVENT_MISSING_FIELD'],
    ['{"request_id":"a","worker":{"worker_id":1},"router_id":1}', 'KVR_ERR_EVENT_MISSING_FIELD'],
    ['{"request_id":7,"worker":{"worker_id":1},"data":"Free","router_id":1}', 'KVR_ERR_EVENT_WRONG_TYPE'],
    ['{"request_id":"a","worker":{"worker_id":-1},"data":"Free","router_id":1}', 'KVR_ERR_EVENT_INVALID_NUMBER'],
    ['{"request_id":"a","worker":{"worker_id":1,"dp_rank":1.5},"data":"Free","router_id":1}', 'KVR_ERR_EVENT_INVALID_NUMBER'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":"Cancel","router_id":1}', 'KVR_ERR_EVENT_UNKNOWN_VARIANT'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":{"Free":null,"AddRequest":{}},"router_id":1}', 'KVR_ERR_EVENT_WRONG_TYPE'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"isl":1}},"router_id":1}', 'KVR_ERR_EVENT_MISSING_FIELD'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":[-1]}},"router_id":1}', 'KVR_ERR_EVENT_INVALID_NUMBER'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":[1.5]}},"router_id":1}', 'KVR_ERR_EVENT_INVALID_NUMBER'],
    [
      '{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":[18446744073709551616]}},"router_id":1}',
      'KVR_ERR_EVENT_INVALID_NUMBER',
    ],
    ['{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":[1,]}},"router_id":1}', 'KVR_ERR_EVENT_INVALID_NUMBER'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":[01]}},"router_id":1}', 'KVR_ERR_EVENT_INVALID_NUMBER'],
    ['{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":"x"}},"router_id":1}', 'KVR_ERR_EVENT_WRONG_TYPE'],
    [
      '{"request_id":"a","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":null,"track_prefill_tokens":1}},"router_id":1}',
      'KVR_ERR_EVENT_WRONG_TYPE',
    ],
    ['{"publisher_id":1,"sequence":0,"payload":"x"}', 'KVR_ERR_EVENT_WRONG_TYPE'],
    [`{"request_id":"${'x'.repeat(5000)}","worker":{"worker_id":1},"data":"Free","router_id":1}`, 'KVR_ERR_EVENT_WRONG_TYPE'],
  ]
  for (const [text, code] of bad) t.throws(() => d.decode(enc.encode(text)), { code }, text.slice(0, 80))
  t.throws(() => d.decode(new Uint8Array([0x81, 0xc1])), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' })
  t.throws(() => d.decode(new Uint8Array([0xff, 0xfe])), { code: 'KVR_ERR_EVENT_MALFORMED_JSON' }, 'not UTF-8')
  // the decoder is still good after refusals
  t.equal(
    d.decode(enc.encode('{"request_id":"ok","worker":{"worker_id":1},"data":{"AddRequest":{"token_sequence":[1],"isl":1,"overlap":0}},"router_id":1}')).n,
    1,
  )
})

t.test('long token sequences grow the scratch', async (t) => {
  const n = 5000
  const lo = Array.from({ length: n }, (_, i) => i)
  const hi = Array.from({ length: n }, (_, i) => 0xffff0000 + (i % 7))
  const ev = new ActiveSequenceDecoder().decode(
    enc.encode(encodeAddRequest('big', 1n, 0, '1', { lo, hi, n, isl: n * 16, overlapBlocks: 0, trackPrefill: true, prefillTokens: n * 16 }, 0)),
  )
  t.equal(ev.n, n)
  t.equal(ev.lo?.[n - 1], n - 1)
  t.equal(ev.hi?.[n - 1], 0xffff0000 + ((n - 1) % 7))
})
