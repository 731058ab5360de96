import t from 'tap'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { computeBlockHashes } from '../../../src/codec/hashing.js'
import {
  expandTokens,
  fillTraceBlock,
  parseTrace,
  parseTraceLine,
  readTrace,
  streamTrace,
  TRACE_BLOCK_TOKENS,
  TRACE_VOCAB_SIZE,
  TraceBlockHasher,
  TraceFormatError,
  traceToken,
  type TracePrompt,
} from '../../../src/sim/replay/trace.js'
import { Rng } from '../../helpers/rng.js'
import { fromRoot } from '../../helpers/paths.js'

const TRACE = fromRoot('data', 'conversation_trace.jsonl')

function block(id: number): Uint32Array {
  const b = new Uint32Array(TRACE_BLOCK_TOKENS)
  fillTraceBlock(id, b)
  return b
}

t.test('a trace block expands to 512 tokens that depend on its id only', async (t) => {
  t.equal(TRACE_BLOCK_TOKENS, 512)
  const a = block(7)
  t.same(block(7), a, 'same id, same tokens')
  t.notSame(block(8), a, 'another id, other tokens')
  for (let p = 0; p < 512; p += 37) t.equal(traceToken(7, p), a[p], `traceToken agrees at ${p}`)
  t.ok(
    a.every((x) => Number.isInteger(x) && x >= 0 && x < TRACE_VOCAB_SIZE),
    'tokens lie in the vocabulary',
  )
  t.ok(new Set(a).size > 480, 'tokens within a block are varied, not one repeated value')
  // ids above 2^32 are accepted and differ from their low half
  t.notSame(block(2 ** 32 + 7), a)
  // the same id contributes the same tokens wherever it appears
  const x = expandTokens({ input_length: 1024, hash_ids: [0, 7] })
  const y = expandTokens({ input_length: 1536, hash_ids: [3, 4, 7] })
  t.same(x.subarray(512, 1024), y.subarray(1024, 1536))
  t.same(x.subarray(0, 512), block(0))
  t.throws(() => traceToken(-1, 0), RangeError)
  t.throws(() => fillTraceBlock(1.5, new Uint32Array(512)), RangeError)
})

t.test('expansion is truncated to input_length; extra ids are ignored', async (t) => {
  const req = { input_length: 1000, hash_ids: [5, 6] }
  const toks = expandTokens(req)
  t.equal(toks.length, 1000)
  t.same(toks.subarray(0, 512), block(5))
  t.same(toks.subarray(512), block(6).subarray(0, 488))
  t.equal(expandTokens({ input_length: 0, hash_ids: [] }).length, 0)
  t.same(expandTokens({ input_length: 600, hash_ids: [5, 6, 9, 10] }), expandTokens({ input_length: 600, hash_ids: [5, 6] }))
  t.same(expandTokens({ input_length: 512, hash_ids: [5] }), block(5))
  t.throws(() => expandTokens({ input_length: 513, hash_ids: [5] }), /needs 2/)
  t.throws(() => expandTokens({ input_length: -1, hash_ids: [] }), RangeError)
})

t.test('cached local hashes equal hashing the expanded tokens', async (t) => {
  const rng = new Rng(20240601)
  const prompts: TracePrompt[] = [
    { input_length: 0, hash_ids: [] },
    { input_length: 10, hash_ids: [1] },
    { input_length: 63, hash_ids: [1] },
    { input_length: 64, hash_ids: [1] },
    { input_length: 511, hash_ids: [1] },
    { input_length: 512, hash_ids: [1] },
    { input_length: 513, hash_ids: [1, 2] },
    { input_length: 1024, hash_ids: [2, 1] },
    { input_length: 1100, hash_ids: [1, 2, 3, 99] },
  ]
  // random prompts over a small id space, so ids repeat at different positions
  for (let i = 0; i < 60; i++) {
    const nb = 1 + rng.int(8)
    const ids = Array.from({ length: nb }, () => rng.int(20))
    prompts.push({ input_length: (nb - 1) * 512 + 1 + rng.int(512), hash_ids: ids })
  }
  for (const bs of [16, 64, 48, 512, 1024]) {
    const h = new TraceBlockHasher(bs)
    t.equal(h.perTraceBlock, 512 % bs === 0 ? 512 / bs : 0, `bs ${bs}: router blocks per trace block`)
    let bad = 0
    for (const p of prompts) {
      const want = computeBlockHashes(expandTokens(p), bs)
      const got = h.hashesU64(p)
      if (got.length !== want.length || got.some((v, i) => v !== want[i])) {
        bad++
        t.fail(`bs ${bs}, input ${p.input_length}, ids ${JSON.stringify(p.hash_ids)}: cached hashes differ`)
      }
      t.equal(h.blockCount(p), Math.floor(p.input_length / bs))
    }
    t.equal(bad, 0, `bs ${bs}: every prompt agrees`)
    if (h.perTraceBlock > 0) {
      // only trace blocks holding at least one complete router block get hashed, each once
      const ids = new Set<number>()
      for (const p of prompts) {
        const n = h.blockCount(p)
        for (let k = 0; k * h.perTraceBlock < n; k++) ids.add(p.hash_ids[k] as number)
      }
      t.equal(h.hashedTraceBlocks, ids.size, `bs ${bs}: each trace block hashed once`)
      t.equal(h.cachedTraceBlocks, ids.size)
      const before = h.hashedTraceBlocks
      for (const p of prompts) h.hashes(p)
      t.equal(h.hashedTraceBlocks, before, 'a second pass hashes nothing')
    }
  }
})

t.test('cached hashes survive cache growth and match on the real trace', async (t) => {
  const reqs = readTrace(TRACE, { limit: 300 })
  t.equal(reqs.length, 300)
  const h = new TraceBlockHasher(64)
  // the first 300 requests hold far more than the initial 1024 cached ids
  const got = reqs.map((r) => h.hashesU64(r))
  t.ok(h.cachedTraceBlocks > 1024, `cache grew (${h.cachedTraceBlocks} ids)`)
  let bad = 0
  reqs.forEach((r, i) => {
    const want = computeBlockHashes(expandTokens(r), 64)
    const g = got[i] as BigUint64Array
    if (g.length !== want.length || g.some((v, j) => v !== want[j])) bad++
  })
  t.equal(bad, 0)
  t.throws(() => h.hashesInto(reqs[0] as TracePrompt, new Uint32Array(1), new Uint32Array(1)), /hold 1 hashes/)
  t.throws(() => new TraceBlockHasher(0), /block size/)
})

t.test('the published trace parses whole', async (t) => {
  const reqs = readTrace(TRACE)
  t.equal(reqs.length, 12031)
  t.ok(reqs.every((r) => r.hash_ids[0] === 0 && r.hash_ids.length === Math.ceil(r.input_length / 512)))
  t.same(reqs[0], { timestamp: 0, input_length: 6758, output_length: 500, hash_ids: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13] })
})

t.test('malformed lines are refused with the line and field named', async (t) => {
  const ok = '{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}'
  t.same(parseTraceLine(ok, 1), { timestamp: 5, input_length: 600, output_length: 3, hash_ids: [1, 2] })
  t.same(parseTraceLine('{"timestamp": 1.5, "input_length": 0, "output_length": 0, "hash_ids": [], "session": "x"}', 1).timestamp, 1.5)
  const cases: [string, RegExp][] = [
    ['{"timestamp": 5, ', /not valid JSON/],
    ['[1, 2]', /expected a JSON object/],
    ['null', /expected a JSON object/],
    ['{"input_length": 1, "output_length": 1, "hash_ids": [1]}', /"timestamp" must be a non-negative number of ms, got missing/],
    ['{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}', /"timestamp"/],
    ['{"timestamp": "0", "input_length": 1, "output_length": 1, "hash_ids": [1]}', /"timestamp".*got "0"/],
    ['{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": []}', /"input_length" must be a non-negative integer, got -3/],
    ['{"timestamp": 0, "input_length": 1, "output_length": 2.5, "hash_ids": [1]}', /"output_length" must be a non-negative integer, got 2.5/],
    ['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 4}', /"hash_ids" must be an array/],
    [`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "${'x'.repeat(100)}"}`, /must be an array of non-negative integers, got "x{39}…$/],
    ['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, -2]}', /"hash_ids\[1\]" must be a non-negative integer, got -2/],
    ['{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["1"]}', /"hash_ids\[0\]"/],
    ['{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}', /has 2 block\(s\) \(1024 tokens\) but "input_length" 1025 needs 3/],
  ]
  for (const [line, re] of cases) {
    const text = `${ok}\n\n${line}\n${ok}\n`
    t.throws(() => parseTrace(text, 'my.jsonl'), re, line)
    try {
      parseTrace(text, 'my.jsonl')
    } catch (err) {
      t.type(err, TraceFormatError)
      t.equal((err as TraceFormatError).line, 3, 'blank lines still count')
      t.match((err as Error).message, /^my\.jsonl line 3: /)
    }
  }
})

t.test('parseTrace skips blank lines and honours a limit', async (t) => {
  const line = (i: number): string => `{"timestamp": ${i}, "input_length": 10, "output_length": 1, "hash_ids": [${i}]}`
  const text = `${line(0)}\n\n  \n${line(1)}\r\n${line(2)}`
  t.same(
    parseTrace(text).map((r) => r.timestamp),
    [0, 1, 2],
  )
  t.same(
    parseTrace(text, 'x', 2).map((r) => r.timestamp),
    [0, 1],
  )
  t.same(parseTrace(''), [])
})

t.test('readTrace and streamTrace read files', async (t) => {
  const dir = t.testdir({})
  const good = join(dir, 'good.jsonl')
  const bad = join(dir, 'bad.jsonl')
  const line = (i: number): string => `{"timestamp": ${i}, "input_length": 10, "output_length": 1, "hash_ids": [${i}]}`
  writeFileSync(good, `${line(0)}\n${line(1)}\n\n${line(2)}\n`)
  writeFileSync(bad, `${line(0)}\n{"timestamp": 1}\n`)
  t.same(
    readTrace(good).map((r) => r.timestamp),
    [0, 1, 2],
  )
  t.same(
    readTrace(good, { limit: 1 }).map((r) => r.timestamp),
    [0],
  )
  const streamed: number[] = []
  for await (const r of streamTrace(good)) streamed.push(r.timestamp)
  t.same(streamed, [0, 1, 2])
  const limited: number[] = []
  for await (const r of streamTrace(good, { limit: 2 })) limited.push(r.timestamp)
  t.same(limited, [0, 1])
  const none: number[] = []
  for await (const r of streamTrace(good, { limit: 0 })) none.push(r.timestamp)
  t.same(none, [])
  t.throws(() => readTrace(bad), /bad\.jsonl line 2: "input_length"/)
  await t.rejects(async () => {
    for await (const r of streamTrace(bad)) void r
  }, /bad\.jsonl line 2: /)
})
