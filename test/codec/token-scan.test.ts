// The WebAssembly token-id scanner (src/codec/token-scan.wat) on its own and through the
// /v1/route body scanner, against JSON.parse: every id length, every offset within its 64-byte
// blocks and across its 64 KB windows, the separators clients write, and errors anywhere.
import t from 'tap'
import { Rng } from '../helpers/rng.js'
import { RouteBodyScanner } from '../../src/codec/route-body.js'
import type { RouteBody } from '../../src/codec/route-body.js'
import { scanTokenIds, tokenScanAccelerated } from '../../src/codec/token-scan.js'
import type { TokenSink } from '../../src/codec/token-scan.js'

// every body goes through both the SIMD scanner and the byte loop alone (a runtime without SIMD)
const simd = new RouteBodyScanner()
const plain = new RouteBodyScanner({ simd: false })
const outcome = (sc: RouteBodyScanner, body: Buffer): { ok: true; r: RouteBody } | { ok: false; err: Error } => {
  try {
    return { ok: true, r: sc.scan(body) }
  } catch (err) {
    return { ok: false, err: err as Error }
  }
}
const scanner = {
  scan(body: Buffer): RouteBody {
    const p = outcome(plain, body)
    const plainTokens = p.ok ? [...(p.r.tokens ?? [])] : null
    const q = outcome(simd, body)
    if (p.ok !== q.ok) throw new Error(`the scanner ${q.ok ? 'took' : 'refused'} a body the byte loop alone ${p.ok ? 'took' : 'refused'}`)
    if (!q.ok) {
      if (!p.ok && p.err.message !== q.err.message) throw new Error(`different errors: ${p.err.message} / ${q.err.message}`)
      throw q.err
    }
    if (JSON.stringify([...(q.r.tokens ?? [])]) !== JSON.stringify(plainTokens)) throw new Error('the scanner and the byte loop alone read different ids')
    return q.r
  },
}
const tokensOf = (text: string): number[] => [...(scanner.scan(Buffer.from(text)).tokens as Uint32Array)]

const rng = new Rng(0x2545f491)
/** A seeded u32. */
const next = (): number => rng.int(4294967296)
/** An id of 1–10 digits (at most 2^32 - 1), the short ones often, as in real vocabularies. */
const anyId = (): number => {
  const digits = 1 + (next() % 10)
  return Math.min(4294967295, Math.floor((next() / 4294967296) * 10 ** digits))
}

t.test('the scanner runs here, and takes what it should', async (t) => {
  // Node ≥ 20 on x86-64 and arm64 has the SIMD it needs; a silent fallback would hide a 2× loss
  t.equal(tokenScanAccelerated, true)
  const sink: TokenSink = { tok: new Uint32Array(2), n: 0 }
  const body = Buffer.from('[1,22,333,4444,0,7654321,9]')
  const stop = scanTokenIds(body, 1, sink)
  t.same([...sink.tok.subarray(0, sink.n)], [1, 22, 333, 4444, 0, 7654321], 'each id before a comma, the sink grown')
  t.equal(body.toString('latin1', stop), '9]', 'the last id is left to the byte loop')
  const cases: [string, string][] = [
    ['[1, 2, 3]', ' 3]'],
    ['[12345678,1]', '12345678,1]'],
    ['[1,007,2]', '007,2]'],
    ['[1,2 ,3]', '2 ,3]'],
    ['[1,  2,3]', '  2,3]'],
    ['[1,\n2]', '\n2]'],
    ['[1,,2]', ',2]'],
    ['[1,-2,3]', '-2,3]'],
    ['[5,6],"a":"7,8,9"', '6],"a":"7,8,9"'],
  ]
  for (const [text, rest] of cases) {
    const b = Buffer.from(text)
    t.equal(b.toString('latin1', scanTokenIds(b, 1, sink)), rest, text)
  }
})

t.test('long bodies against JSON.parse: every id length and offset, across windows', async (t) => {
  const separators = [',', ', ', ',', ',', ', ', ',\n  ']
  for (let round = 0; round < 60; round++) {
    // up to ~250 KB, so ids fall on every offset of the blocks and are cut by window ends
    const count = round < 6 ? 40_000 + round * 3 : 1 + (next() % 6000)
    const ids = Array.from({ length: count }, anyId)
    const sep = separators[round % separators.length] as string
    const text = `{"token_ids":[${ids.join(sep)}]}`
    t.same(tokensOf(text), ids, `round ${round}: ${count} ids, separator ${JSON.stringify(sep)}`)
  }
})

t.test('separators mixed within a body, valid or not, against JSON.parse', async (t) => {
  // Each body mixes ",", ", " and now and then whitespace JSON allows elsewhere or a piece it
  // refuses, so ids cross the scanner's 64-byte blocks after every kind of byte: an id that
  // begins after a space in one block and ends in a block without spaces must not be read with
  // the space as a digit.
  const pieces = [', ', ' ,', ',  ', ',\n', ' 1 2,', ',00,', ',-1,']
  let valid = 0
  for (let round = 0; round < 400; round++) {
    const n = 20 + (next() % 400)
    let text = '{"token_ids":['
    const ids: number[] = []
    for (let i = 0; i < n; i++) {
      const id = next() % 4 === 0 ? next() % 10 : next() % 200_000
      ids.push(id)
      text += String(id)
      if (i === n - 1) break
      const r = next() % 100
      text += r < 80 ? ',' : r < 95 ? ', ' : (pieces[next() % (round % 3 === 0 ? pieces.length : 4)] as string)
    }
    text += ']}'
    let expected: number[] | null = null
    try {
      const v = JSON.parse(text) as { token_ids: unknown[] }
      if (v.token_ids.every((x) => Number.isInteger(x) && (x as number) >= 0 && (x as number) < 2 ** 32)) expected = v.token_ids as number[]
    } catch {
      expected = null
    }
    if (expected === null) {
      t.throws(() => scanner.scan(Buffer.from(text)), `round ${round}: refused, as JSON.parse refuses it`)
    } else {
      valid++
      t.same(tokensOf(text), expected, `round ${round}`)
    }
  }
  t.ok(valid > 100 && valid < 400, `both kinds of body were made (${valid} valid of 400)`)
  const pre = '{"token_ids":['
  t.same(tokensOf(`${pre}${'1,'.repeat(30)}11, 12,5]}`).slice(-3), [11, 12, 5], 'an id after a space, cut by a block boundary')
  t.throws(() => scanner.scan(Buffer.from(`${pre}${'1,'.repeat(31)}1 2,5]}`)), /expected "," or "\]"/)
})

t.test('a bad id anywhere in a long body is named at its index', async (t) => {
  const bads = ['00', '0123', '4294967296', '99999999999', '1.5', '2e3', '-1', '"3"', 'null', '', ' 1 2', '1x']
  for (let round = 0; round < 80; round++) {
    const ids = Array.from({ length: 2000 + (next() % 20_000) }, anyId)
    const at = next() % ids.length
    const bad = bads[round % bads.length] as string
    const parts: string[] = ids.map(String)
    parts[at] = bad
    const text = `{"token_ids":[${parts.join(',')}]}`
    t.throws(() => scanner.scan(Buffer.from(text)), { message: new RegExp(`token_ids\\[${at}\\]|expected "," or "\\]"`) }, `${JSON.stringify(bad)} at ${at}`)
  }
  // and the scanner is not left in a state that spoils the next body
  const ids = Array.from({ length: 70_000 }, anyId)
  t.same(tokensOf(JSON.stringify({ token_ids: ids })), ids)
})

t.test('the array ends where the JSON says, not at the next comma', async (t) => {
  const ids = Array.from({ length: 300 }, anyId)
  const r = scanner.scan(Buffer.from(`{"token_ids":[${ids.join(',')}],"request_id":"1,2,3","update_states":true}`))
  t.same([...(r.tokens as Uint32Array)], ids)
  t.same(r.rest, { request_id: '1,2,3', update_states: true })
})
