import t from 'tap'
import { parseRouterEvent, encodeRouterEvent, encodeEnvelope, toDecoded, type RouterEvent } from '../../src/codec/events.js'
import { EventDecoder, EventKind } from '../../src/codec/event-decoder.js'
import { KvrError } from '../../src/errors.js'

const example =
  '{"worker_id":7,"event":{"event_id":12,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":2,"tokens_hash":3,"mm_extra_info":null}]}},"dp_rank":0}}'

t.test('a RouterEvent as Dynamo publishes it decodes', async (t) => {
  const ev = parseRouterEvent(example)
  t.same(ev, {
    worker_id: 7n,
    event: { event_id: 12n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 2n, tokens_hash: 3n }] } } },
  })
  t.equal(encodeRouterEvent(ev), example, 'and encodes back to the same bytes')
})

t.test('u64 values above 2^53 are exact, as integers and as decimal strings', async (t) => {
  const big = 18446744073709551615n
  const near = 9007199254740993n // 2^53 + 1: a double would round it
  const text =
    `{"worker_id":${big},"event":{"event_id":"${near}","data":{"stored":{"parent_hash":"${near}","blocks":[{"block_hash":` +
    `${near},"tokens_hash":"${big}"}]}},"dp_rank":3}}`
  const ev = parseRouterEvent(text)
  t.equal(ev.worker_id, big)
  t.equal(ev.event.event_id, near)
  t.equal(ev.event.dp_rank, 3)
  const s = ev.event.data as { stored: { parent_hash: bigint; blocks: { block_hash: bigint; tokens_hash: bigint }[] } }
  t.equal(s.stored.parent_hash, near)
  t.equal(s.stored.blocks[0]?.block_hash, near)
  t.equal(s.stored.blocks[0]?.tokens_hash, big)
  t.match(encodeRouterEvent(ev), /"worker_id":18446744073709551615,/, 'written as an exact JSON integer')
})

t.test('removed and cleared variants, dp_rank default, key order and unknown keys', async (t) => {
  const removed = parseRouterEvent(
    '{"event":{"dp_rank":1,"data":{"removed":{"block_hashes":[1,2,18446744073709551614]}},"event_id":5},"worker_id":9,"extra":{"x":[1,2,{"y":null}]}}',
  )
  t.same(removed.event.data, { removed: { block_hashes: [1n, 2n, 18446744073709551614n] } })
  t.equal(removed.event.dp_rank, 1)
  const cleared = parseRouterEvent(' {"worker_id":1,"event":{"event_id":0,"data":"cleared"}} ')
  t.equal(cleared.event.data, 'cleared')
  t.equal(cleared.event.dp_rank, 0, 'dp_rank defaults to 0')
  const cleared2 = parseRouterEvent('{"worker_id":1,"event":{"event_id":0,"data":{"cleared":null}}}')
  t.equal(cleared2.event.data, 'cleared')
  const era = parseRouterEvent(
    '{"worker_id":1,"storage_tier":"host_pinned","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":4,' +
      '"blocks":[{"block_hash":1,"tokens_hash":2,"mm_extra_info":{"mm_objects":[{"mm_hash":42,"offsets":[[0,3]]}]}}]}}}}',
  )
  t.equal(era.storage_tier, 'host_pinned', 'Era C storage tier is kept')
  const escaped = parseRouterEvent('{"worker\\u005fid":4,"event":{"event_id":1,"data":"cleared"}}')
  t.equal(escaped.worker_id, 4n, 'escaped keys are understood')
})

t.test('the event-plane envelope: payload as JSON byte values, or as an object', async (t) => {
  const inner: RouterEvent = { worker_id: 2n ** 60n + 3n, event: { event_id: 44n, dp_rank: 2, data: { removed: { block_hashes: [2n ** 63n] } } } }
  const env = encodeEnvelope({ publisher_id: 2n ** 62n, sequence: 17n, published_at: 1700000000000n, payload: inner })
  t.match(env, /"payload":\[123,34,/)
  t.same(parseRouterEvent(env), inner)
  const d = new EventDecoder().decodeString(env)
  t.ok(d.hasEnvelope)
  t.equal(d.sequenceLo, 17)
  t.equal(d.publisherHi, 2 ** 30)
  const asObject = `{"publisher_id":1,"sequence":0,"published_at":5,"payload":${encodeRouterEvent(inner)}}`
  t.same(parseRouterEvent(asObject), inner)
})

t.test('decoded events match toDecoded() of the same object', async (t) => {
  const ev: RouterEvent = {
    worker_id: 5n,
    event: {
      event_id: 1n,
      dp_rank: 0,
      data: {
        stored: {
          parent_hash: 77n,
          blocks: [
            { block_hash: 1n, tokens_hash: 2n },
            { block_hash: 3n, tokens_hash: 4n },
          ],
        },
      },
    },
  }
  const a = new EventDecoder().decodeString(encodeRouterEvent(ev))
  const b = toDecoded(ev)
  t.equal(a.kind, EventKind.Stored)
  for (const k of ['workerLo', 'workerHi', 'eventIdLo', 'dpRank', 'kind', 'hasParent', 'parentLo', 'count'] as const) t.equal(a[k], b[k], k)
  t.same([...a.blockLo.subarray(0, 2)], [...b.blockLo.subarray(0, 2)])
  t.same([...a.tokensLo.subarray(0, 2)], [...b.tokensLo.subarray(0, 2)])
})

t.test('many blocks grow the decoder buffers', async (t) => {
  const blocks = Array.from({ length: 500 }, (_, i) => ({ block_hash: BigInt(i) * 2n ** 40n, tokens_hash: BigInt(i) }))
  const ev: RouterEvent = { worker_id: 1n, event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } }
  t.same(parseRouterEvent(encodeRouterEvent(ev)), ev)
})

t.test('malformed input: each case is a typed KvrError, never an uncaught exception', async (t) => {
  const ok = (rest: string): string => `{"worker_id":1,"event":{"event_id":1,"data":${rest}}}`
  const cases: [string, string, RegExp][] = [
    ['', 'KVR_ERR_EVENT_MALFORMED_JSON', /empty/],
    [example.slice(0, 40), 'KVR_ERR_EVENT_MALFORMED_JSON', /truncated|unterminated|expected/],
    [example.slice(0, -1), 'KVR_ERR_EVENT_MALFORMED_JSON', /truncated|expected/],
    [example + 'x', 'KVR_ERR_EVENT_MALFORMED_JSON', /after the event/],
    ['[1,2]', 'KVR_ERR_EVENT_WRONG_TYPE', /object/],
    ['{"worker_id":-1,"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /negative/],
    ['{"worker_id":18446744073709551616,"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /exceeds/],
    ['{"worker_id":1.5,"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /integer/],
    ['{"worker_id":1e3,"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /integer/],
    ['{"worker_id":01,"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /leading zero/],
    ['{"worker_id":"12a","event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /decimal/],
    ['{"worker_id":"","event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /decimal/],
    ['{"worker_id":true,"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_WRONG_TYPE', /worker_id/],
    ['{"worker_id":[1],"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_WRONG_TYPE', /worker_id/],
    ['{"event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_MISSING_FIELD', /worker_id/],
    ['{"worker_id":1}', 'KVR_ERR_EVENT_MISSING_FIELD', /"event"/],
    ['{"worker_id":1,"event":{"data":"cleared"}}', 'KVR_ERR_EVENT_MISSING_FIELD', /event_id/],
    ['{"worker_id":1,"event":{"event_id":1}}', 'KVR_ERR_EVENT_MISSING_FIELD', /event.data/],
    ['{"worker_id":1,"event":5}', 'KVR_ERR_EVENT_WRONG_TYPE', /object/],
    [ok('"flushed"'), 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /flushed/],
    [ok('{"evicted":{}}'), 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /evicted/],
    [ok('{}'), 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /no variant/],
    [ok('{"removed":{"block_hashes":[1]},"cleared":null}'), 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /exactly one/],
    [ok('7'), 'KVR_ERR_EVENT_WRONG_TYPE', /event.data/],
    [ok('{"stored":{"parent_hash":null}}'), 'KVR_ERR_EVENT_MISSING_FIELD', /blocks/],
    [ok('{"stored":{"blocks":{}}}'), 'KVR_ERR_EVENT_WRONG_TYPE', /array/],
    [ok('{"stored":{"blocks":[{"block_hash":1}]}}'), 'KVR_ERR_EVENT_MISSING_FIELD', /tokens_hash/],
    [ok('{"stored":{"blocks":[{"tokens_hash":1}]}}'), 'KVR_ERR_EVENT_MISSING_FIELD', /block_hash/],
    [ok('{"stored":{"blocks":[{"block_hash":null,"tokens_hash":1}]}}'), 'KVR_ERR_EVENT_WRONG_TYPE', /block_hash/],
    [ok('{"stored":{"blocks":[{"block_hash":1,"tokens_hash":1} {"block_hash":2,"tokens_hash":2}]}}'), 'KVR_ERR_EVENT_MALFORMED_JSON', /stored.blocks/],
    [ok('{"removed":{}}'), 'KVR_ERR_EVENT_MISSING_FIELD', /block_hashes/],
    [ok('{"removed":{"block_hashes":"1"}}'), 'KVR_ERR_EVENT_WRONG_TYPE', /array/],
    [ok('{"removed":{"block_hashes":[1,-2]}}'), 'KVR_ERR_EVENT_INVALID_NUMBER', /negative/],
    ['{"worker_id":1,"event":{"event_id":1,"dp_rank":4294967296,"data":"cleared"}}', 'KVR_ERR_EVENT_INVALID_NUMBER', /dp_rank/],
    ['{"worker_id":1,"storage_tier":"tape","event":{"event_id":1,"data":"cleared"}}', 'KVR_ERR_EVENT_UNKNOWN_VARIANT', /tape/],
    ['{"publisher_id":1,"sequence":1,"payload":[123,34]}', 'KVR_ERR_EVENT_MALFORMED_JSON', /payload/],
    ['{"publisher_id":1,"sequence":1,"payload":[300]}', 'KVR_ERR_EVENT_INVALID_NUMBER', /255/],
    ['{"publisher_id":1,"sequence":1,"payload":"eyJ9"}', 'KVR_ERR_EVENT_WRONG_TYPE', /payload/],
    ['{"sequence":1,"published_at":1,"payload":{"worker_id":1,"event":{"event_id":1,"data":"cleared"}}}', 'KVR_ERR_EVENT_MISSING_FIELD', /publisher_id/],
    ['{"worker_id":1,"payload":{"worker_id":1,"event":{"event_id":1,"data":"cleared"}},"publisher_id":1,"sequence":1}', 'KVR_ERR_EVENT_WRONG_TYPE', /envelope/],
    ['{"worker_id":1,"event":{"event_id":1,"data":"cleared"},"x":"a\u0001"}', 'KVR_ERR_EVENT_MALFORMED_JSON', /control/],
    ['{"worker_id":1,"event":{"event_id":1,"data":"cleared"},"x":' + '['.repeat(100) + ']'.repeat(100) + '}', 'KVR_ERR_EVENT_MALFORMED_JSON', /deep/],
    ['{"worker_id":1 "event":{}}', 'KVR_ERR_EVENT_MALFORMED_JSON', /","/],
    ['{worker_id:1}', 'KVR_ERR_EVENT_MALFORMED_JSON', /key/],
    ['{"worker_id":1,"event":{"event_id":1,"data":"cleared"},"x":tru}', 'KVR_ERR_EVENT_MALFORMED_JSON', /unexpected/],
  ]
  for (const [input, code, msg] of cases) {
    let err: unknown
    try {
      parseRouterEvent(input)
    } catch (e) {
      err = e
    }
    t.ok(err instanceof KvrError, `KvrError for ${JSON.stringify(input.slice(0, 60))}`)
    t.equal((err as KvrError).code, code, `${code} for ${JSON.stringify(input.slice(0, 60))}`)
    t.match((err as KvrError).message, msg)
  }
})

t.test('a decoder keeps working after an error', async (t) => {
  const d = new EventDecoder()
  t.throws(() => d.decodeString('{"worker_id":'))
  t.equal(d.decodeString(example).workerLo, 7)
})

t.test('encoding refuses values that are not u64', async (t) => {
  const bad = { worker_id: -1n, event: { event_id: 1n, dp_rank: 0, data: 'cleared' } } as RouterEvent
  t.throws(() => encodeRouterEvent(bad), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  const bad2 = { worker_id: 1n, event: { event_id: 1n, dp_rank: -1, data: 'cleared' } } as RouterEvent
  t.throws(() => encodeRouterEvent(bad2), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  t.throws(() => toDecoded({ worker_id: 2n ** 64n, event: { event_id: 1n, dp_rank: 0, data: 'cleared' } }), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
})

t.test('random u64 values of every length round-trip exactly', async (t) => {
  let x = 0x9e3779b97f4a7c15n
  let bad = 0
  for (let i = 0; i < 2000; i++) {
    x = (x * 6364136223846793005n + 1442695040888963407n) & 0xffffffffffffffffn
    const v = x >> BigInt(i % 64)
    const ev: RouterEvent = { worker_id: v, event: { event_id: v, dp_rank: 0, data: { removed: { block_hashes: [v, 2n ** 64n - 1n - v] } } } }
    const back = parseRouterEvent(encodeRouterEvent(ev))
    if (back.worker_id !== v || (back.event.data as { removed: { block_hashes: bigint[] } }).removed.block_hashes[1] !== 2n ** 64n - 1n - v) bad++
    const quoted = parseRouterEvent(`{"worker_id":"${v}","event":{"event_id":0,"data":"cleared"}}`)
    if (quoted.worker_id !== v) bad++
  }
  t.equal(bad, 0)
  t.throws(() => parseRouterEvent('{"worker_id":99999999999999999999,"event":{"event_id":0,"data":"cleared"}}'), {
    code: 'KVR_ERR_EVENT_INVALID_NUMBER',
    message: /exceeds/,
  })
  t.throws(() => parseRouterEvent('{"worker_id":123456789012345678901,"event":{"event_id":0,"data":"cleared"}}'), {
    code: 'KVR_ERR_EVENT_INVALID_NUMBER',
    message: /exceeds/,
  })
})

t.test('block hashes of every length, at every alignment, decode as the general parser reads them', async (t) => {
  // The decoder reads serde's block layout four digits per load; a space after each colon sends
  // the same values through the general parser instead. Both must agree with BigInt, for every
  // digit count and every offset of the number within a 32-bit word.
  const values: bigint[] = [0n, 1n, 9n, 10n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 53n - 1n, 2n ** 53n, 2n ** 53n + 1n, 10n ** 19n - 1n, 10n ** 19n, 2n ** 64n - 1n]
  for (let digits = 1; digits <= 20; digits++) {
    const lowest = digits === 1 ? 0n : 10n ** BigInt(digits - 1)
    values.push(
      lowest,
      10n ** BigInt(digits) - 1n <= 2n ** 64n - 1n ? 10n ** BigInt(digits) - 1n : 2n ** 64n - 1n,
      lowest + (123456789n % (lowest === 0n ? 1n : lowest)),
    )
  }
  const dec = new EventDecoder()
  let checked = 0
  for (const v of values) {
    for (let pad = 0; pad < 4; pad++) {
      const blocks = `[{"block_hash":${v},"tokens_hash":${2n ** 64n - 1n - v},"mm_extra_info":null},{"block_hash":${v},"tokens_hash":${v}}]`
      const worker = `${'1'.repeat(pad + 1)}`
      const tight = `{"worker_id":${worker},"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":${blocks}}}}}`
      const spaced = tight.replaceAll('_hash":', '_hash": ')
      const removed = `{"worker_id":${worker},"event":{"event_id":1,"data":{"removed":{"block_hashes":[${v},${2n ** 64n - 1n - v}]}}}}`
      for (const text of [tight, spaced]) {
        const d = dec.decodeString(text)
        const got = [d.blockLo[0], d.blockHi[0], d.tokensLo[0], d.tokensHi[0], d.blockLo[1], d.tokensHi[1]]
        const w = 2n ** 64n - 1n - v
        const want = [Number(v & 0xffffffffn), Number(v >> 32n), Number(w & 0xffffffffn), Number(w >> 32n), Number(v & 0xffffffffn), Number(v >> 32n)]
        if (d.count !== 2 || got.some((x, i) => x !== want[i])) t.fail(`${text}: ${JSON.stringify(got)} != ${JSON.stringify(want)}`)
        else checked++
      }
      // the removed list, raw and inside an envelope whose payload is decoded from byte values
      const inner: RouterEvent = {
        worker_id: BigInt(worker),
        event: { event_id: 1n, dp_rank: 0, data: { removed: { block_hashes: [v, 2n ** 64n - 1n - v] } } },
      }
      for (const text of [removed, encodeEnvelope({ publisher_id: 1n, sequence: 1n, published_at: 1n, payload: inner })]) {
        const r = dec.decodeString(text)
        if (
          r.count !== 2 ||
          r.blockLo[0] !== Number(v & 0xffffffffn) ||
          r.blockHi[0] !== Number(v >> 32n) ||
          r.blockHi[1] !== Number((2n ** 64n - 1n - v) >> 32n)
        )
          t.fail(`removed ${v}: ${text.slice(0, 80)}`)
        else checked++
      }
    }
  }
  t.equal(checked, values.length * 16, 'every value, alignment and layout checked')
})

t.test("what the word-at-a-time reader refuses still gets the general parser's error", async (t) => {
  const stored = (h: string): string =>
    `{"worker_id":1,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":${h},"tokens_hash":1,"mm_extra_info":null}]}}}}`
  const removed = (h: string): string => `{"worker_id":1,"event":{"event_id":1,"data":{"removed":{"block_hashes":[${h}]}}}}`
  const cases: [string, RegExp][] = [
    ['18446744073709551616', /exceeds/],
    ['99999999999999999999', /exceeds/],
    ['123456789012345678901', /exceeds/],
    ['1234567890123456789012345', /exceeds/],
    ['0123', /leading zero/],
    ['00000000', /leading zero/],
    ['12345678.5', /integer/],
    ['1234e5', /integer/],
    ['-12345678', /negative/],
  ]
  for (const [h, msg] of cases) {
    for (const text of [stored(h), removed(h)]) {
      t.throws(
        () => parseRouterEvent(text),
        { code: 'KVR_ERR_EVENT_INVALID_NUMBER', message: msg },
        `${h} in ${text.includes('stored') ? 'stored' : 'removed'}`,
      )
    }
  }
  t.equal(parseRouterEvent(removed('"18446744073709551615"')).event.data !== 'cleared', true, 'a quoted hash still reads')
})
