// The /v1/route body scanner and the exact-u64 JSON helpers, on their own.
import t from 'tap'
import { RouteBodyScanner } from '../../src/codec/route-body.js'
import { parseJsonExact, readU64, serializeJson } from '../../src/codec/json.js'
import { splitEvents } from '../../src/codec/event-array.js'

const s = new RouteBodyScanner()
const scan = (text: string) => s.scan(Buffer.from(text))

t.test('token ids into a Uint32Array, other members JSON-parsed', async (t) => {
  const r = scan(
    ' { "token_ids" : [ 0 , 1,4294967295 ,\n7 ] , "update_states": true, "router_config_override": {"overlap_score_weight": 2, "x": [1, {"y": ' +
      '"a\\"]}"}]}, "request_id": "q" } ',
  )
  t.same([...(r.tokens as Uint32Array)], [0, 1, 4294967295, 7])
  t.same(r.rest, { update_states: true, router_config_override: { overlap_score_weight: 2, x: [1, { y: 'a"]}' }] }, request_id: 'q' })
  t.same([...(scan('{"token_ids":[]}').tokens as Uint32Array)], [])
  t.same(scan('{}').rest, {})
  const long = Array.from({ length: 20000 }, (_, i) => i)
  t.same([...(scan(JSON.stringify({ token_ids: long })).tokens as Uint32Array)], long, 'the scratch grows')
  const again = scan('{"token_ids":[9]}')
  t.same([...(again.tokens as Uint32Array)], [9], 'each result is its own copy')
})

t.test('token ids of every digit count, against JSON.parse (seeded)', async (t) => {
  let x = 0x9e3779b9
  const next = (): number => {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    return x >>> 0
  }
  for (let round = 0; round < 200; round++) {
    // spread over 1..10 digits: a random power of ten times a random fraction, plus the edges
    const ids = Array.from({ length: 1 + (next() % 300) }, () => {
      const r = next() % 12
      if (r === 10) return 0
      if (r === 11) return 4294967295
      return Math.min(4294967295, Math.floor((next() / 4294967296) * 10 ** (r + 1)))
    })
    const spaced = round % 4 === 0 ? JSON.stringify({ token_ids: ids }, null, 1) : JSON.stringify({ token_ids: ids })
    t.same([...(scan(spaced).tokens as Uint32Array)], JSON.parse(spaced).token_ids as number[])
  }
  for (const bad of ['00', '007', '4294967296', '99999999999', '12345678901234567890', '1.0', '1e3', '12E1', '-0', '"1"', 'null', 'true', '+1', '0x10']) {
    t.throws(() => scan(`{"token_ids":[5,${bad},6]}`), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE', message: /token_ids\[1\]/ }, bad)
  }
  t.throws(() => scan('{"token_ids":[5,]}'), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE', message: /token_ids\[1\]/ })
  t.throws(() => scan('{"token_ids":[123'), /token_ids|end/, 'the body ends inside a number')
  t.throws(() => scan('{"token_ids":[1,2}'), { code: 'KVR_ERR_INVALID_REQUEST', message: /expected "," or "\]"/ }, 'a missing "]" blames no token')
})

t.test('a bad id amid many good ones is found at its index, whatever its offset', async (t) => {
  // Long bodies run through the word-at-a-time loop; it must hand each of these to the byte
  // loop, which names the id. Prefixes of 1–4 one-digit ids shift the bad one through every
  // offset within a 32-bit word.
  const after = Array.from({ length: 40 }, (_, i) => 100000 + i).join(',')
  for (const bad of ['00', '007', '0123456', '4294967296', '99999999999', '12345678', '1.0', '1e3', '-0', '"1"', 'null', '+1', '0x10', '']) {
    for (let pre = 1; pre <= 4; pre++) {
      const before = Array.from({ length: 30 + pre }, (_, i) => (i < pre ? 7 : 123456)).join(',')
      const body = `{"token_ids":[${before},${bad},${after}]}`
      const index = 30 + pre
      if (bad === '12345678') {
        // eight digits are valid: the byte loop takes them
        t.equal((scan(body).tokens as Uint32Array)[index], 12345678, `8 digits at offset ${pre}`)
        continue
      }
      t.throws(() => scan(body), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE', message: new RegExp(`token_ids\\[${index}\\]`) }, `${bad || 'empty'} at offset ${pre}`)
    }
  }
  const spaced = `{"token_ids":[${Array.from({ length: 50 }, (_, i) => i * 997).join(', ')}]}`
  t.same([...(scan(spaced).tokens as Uint32Array)], JSON.parse(spaced).token_ids as number[], 'spaces after commas leave the fast loop and come back')
  const big = Array.from({ length: 9000 }, (_, i) => (i * 7919) % 150000)
  t.same([...(scan(JSON.stringify({ token_ids: big })).tokens as Uint32Array)], big, 'the fast loop stops when the scratch is full; the byte loop grows it')
})

t.test('block hashes: exact u64 from integers and strings', async (t) => {
  const r = scan('{"block_hashes":[0, "18446744073709551615", 9007199254740993, "42"]}')
  const lo = r.blockLo as Uint32Array
  const hi = r.blockHi as Uint32Array
  const v = (i: number) => (BigInt(hi[i] as number) << 32n) | BigInt(lo[i] as number)
  t.same([0, 1, 2, 3].map(v), [0n, 18446744073709551615n, 9007199254740993n, 42n])
  const many = Array.from({ length: 3000 }, (_, i) => i)
  t.equal(scan(JSON.stringify({ block_hashes: many })).blockLo?.length, 3000)
  t.same([...(scan('{"block_hashes":[]}').blockLo as Uint32Array)], [])
})

t.test('errors name the field and the byte offset', async (t) => {
  const bad: [string, RegExp][] = [
    ['', /JSON object at byte 0/],
    ['{"token_ids":[1,2', /token_ids|end/],
    ['{"token_ids":[1 2]}', /expected "," or "\]"/],
    ['{"token_ids":{}}', /token_ids must be an array/],
    ['{"block_hashes":{}}', /block_hashes must be an array/],
    ['{"block_hashes":[01]}', /block_hashes\[0\]/],
    ['{"block_hashes":["12]}', /block_hashes\[0\]/],
    ['{"block_hashes":[1 2]}', /expected "," or "\]"/],
    ['{"block_hashes":[99999999999999999999]}', /larger than 2\^64/],
    ['{token_ids:[1]}', /member name/],
    ['{"a" 1}', /expected ":"/],
    ['{"a":1 "b":2}', /expected "," or "}"/],
    ['{"a":tru}', /not valid JSON/],
    ['{"a":"x', /unterminated string/],
    ['{"a":[1,2}', /unterminated value|not valid JSON/],
    ['{"a":}', /expected a value/],
    ['{"a":1', /unexpected end/],
  ]
  for (const [text, re] of bad) t.throws(() => scan(text), re, JSON.stringify(text))
  t.throws(() => scan('{"token_ids":[1,-2]}'), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE', message: /token_ids\[1\] is not an integer in \[0, 2\^32\): -2/ })
  t.throws(() => scan('{"token_ids":[12345678901]}'), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE' })
})

t.test('exact JSON helpers', async (t) => {
  const v = parseJsonExact('{"id": 18446744073709551615, "s": "1234567890123456789", "n": [1.5, -2, 1e3], "e": "\\"9999999999999999999\\""}') as Record<
    string,
    unknown
  >
  t.equal(v.id, '18446744073709551615', 'long integers stay exact as strings')
  t.equal(v.s, '1234567890123456789')
  t.same(v.n, [1.5, -2, 1000])
  t.equal(v.e, '"9999999999999999999"', 'digits inside strings are untouched')
  t.same(parseJsonExact('[1,2]'), [1, 2])
  t.equal(readU64(7, 'x'), 7n)
  t.equal(readU64('18446744073709551615', 'x'), 18446744073709551615n)
  t.equal(readU64(5n, 'x'), 5n)
  for (const bad of [-1, 1.5, '18446744073709551616', '01', 'x', null, 2 ** 60])
    t.throws(() => readU64(bad, 'worker_id'), { code: 'KVR_ERR_INVALID_REQUEST', message: /worker_id/ })
  t.equal(serializeJson({ a: 18446744073709551615n, b: [1n], c: 'x' }), '{"a":18446744073709551615,"b":[1],"c":"x"}')
  t.equal(serializeJson({ a: 1 }), '{"a":1}')
})

t.test('event batches split into raw events', async (t) => {
  const one = Buffer.from('{"worker_id":1}')
  t.same(
    splitEvents(one).map((b) => Buffer.from(b).toString()),
    ['{"worker_id":1}'],
  )
  t.same(
    splitEvents(Buffer.from(' [ {"a":"]}"} , {"b":[1,{}]} ] ')).map((b) => Buffer.from(b).toString()),
    ['{"a":"]}"}', '{"b":[1,{}]}'],
  )
  t.same(splitEvents(Buffer.from('[]')), [])
  t.throws(() => splitEvents(Buffer.from('["x"]')), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
})
