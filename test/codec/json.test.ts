import t from 'tap'
import { parseJsonExact, readU64 } from '../../src/codec/json.js'

t.test('a u64 sent as a JSON number stays exact wherever it is', async (t) => {
  const v = parseJsonExact('{"a":[{"b":[1,{"c":18446744073709551615}]}],"d":9007199254740993}') as { a: [{ b: [number, { c: unknown }] }]; d: unknown }
  t.equal(v.a[0].b[1].c, '18446744073709551615')
  t.equal(v.a[0].b[0], 1)
  t.equal(v.d, '9007199254740993', 'just past 2^53')
  t.equal(readU64(v.a[0].b[1].c, 'c'), 18446744073709551615n)
})

t.test('bodies without an unsafe number parse as JSON.parse does', async (t) => {
  const text = '{"prompt":[1,2,3],"n":1234567890123456,"x":9007199254740991,"y":-9007199254740991,"s":"99999999999999999999"}'
  const v = parseJsonExact(text) as Record<string, unknown>
  t.equal(v.n, 1234567890123456, 'a 16-digit safe integer stays a number')
  t.equal(v.x, Number.MAX_SAFE_INTEGER)
  t.equal(v.y, -Number.MAX_SAFE_INTEGER)
  t.equal(v.s, '99999999999999999999', 'digits inside a string are a string already')
  t.same(parseJsonExact('{"prompt":[1,2,3],"n":1}'), JSON.parse('{"prompt":[1,2,3],"n":1}'))
})

t.test('a float that large sends the body down the slow path without changing it', async (t) => {
  const v = parseJsonExact(
    '{"f":1e300,"g":-2.5e20,"id":18446744073709551615,"small":[0.5,-3],"n":1234567890123456,"m":9007199254740991,"p":9007199254740992}',
  ) as Record<string, unknown>
  t.equal(v.f, 1e300)
  t.equal(v.n, 1234567890123456, 'a safe 16-digit integer stays a number on the slow path too')
  t.equal(v.m, Number.MAX_SAFE_INTEGER)
  t.equal(v.p, '9007199254740992', '2^53 itself is past the safe range: a string')
  t.equal(v.g, -2.5e20)
  t.equal(v.id, '18446744073709551615')
  t.same(v.small, [0.5, -3])
})

t.test('a negative integer past 2^53 is not a u64: it stays a number and readU64 refuses it', async (t) => {
  const v = parseJsonExact('{"n":-18446744073709551615}') as { n: unknown }
  t.equal(typeof v.n, 'number')
  t.throws(() => readU64(v.n, 'worker_id'), { code: 'KVR_ERR_INVALID_REQUEST' })
})

t.test('an own "__proto__" member is checked too', async (t) => {
  const v = parseJsonExact('{"__proto__":18446744073709551615}') as object
  t.equal(Object.getOwnPropertyDescriptor(v, '__proto__')?.value, '18446744073709551615')
  t.equal(Object.getPrototypeOf(v), Object.prototype, 'the prototype is not set from the body')
})

t.test('nesting deeper than the call stack allows is walked', async (t) => {
  const depth = 200_000
  const deep = `${'['.repeat(depth)}18446744073709551615${']'.repeat(depth)}`
  let v = parseJsonExact(deep) as unknown
  for (let i = 0; i < depth; i++) v = (v as unknown[])[0]
  t.equal(v, '18446744073709551615')
  const deepObj = `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`
  t.doesNotThrow(() => parseJsonExact(deepObj))
})

t.test('malformed JSON still throws SyntaxError', async (t) => {
  for (const bad of ['', '{', '{"a":18446744073709551615', '[1,]', '{"a":1}x']) t.throws(() => parseJsonExact(bad), SyntaxError, JSON.stringify(bad))
})

/** A small seeded generator (xorshift32), so a failure can be replayed. */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1
  return () => {
    s ^= s << 13
    s >>>= 0
    s ^= s >>> 17
    s ^= s << 5
    s >>>= 0
    return s / 2 ** 32
  }
}

t.test('random documents: every integer literal comes back exact (past 2^53 - 1 a string, else the number)', async (t) => {
  let withUnsafe = 0
  for (let seed = 1; seed <= 300; seed++) {
    const r = rng(seed)
    const literals: string[] = []
    const digits = (n: number): string => {
      let d = String(1 + Math.floor(r() * 9))
      while (d.length < n) d += String(Math.floor(r() * 10))
      return d
    }
    const value = (depth: number): string => {
      const k = r()
      if (depth > 3 || k < 0.5) {
        // integers of 1 to 20 digits, nearly half of them 15 to 20, so both sides of 2^53 turn up
        const lit = r() < 0.45 ? (r() < 0.2 ? String(2 ** 53 - 2 + Math.floor(r() * 4)) : digits(15 + Math.floor(r() * 6))) : digits(1 + Math.floor(r() * 12))
        literals.push(lit)
        return lit
      }
      // digits inside a string are never touched
      if (k < 0.6) return JSON.stringify(`x${digits(18)}`)
      if (k < 0.8) return `[${Array.from({ length: Math.floor(r() * 5) }, () => value(depth + 1)).join(',')}]`
      return `{${Array.from({ length: Math.floor(r() * 4) }, (_, i) => `"k${i}":${value(depth + 1)}`).join(',')}}`
    }
    const text = value(0)
    const got: unknown[] = []
    const collect = (v: unknown): void => {
      if (typeof v === 'number' || (typeof v === 'string' && /^\d+$/.test(v))) got.push(v)
      else if (Array.isArray(v)) v.forEach(collect)
      else if (typeof v === 'object' && v !== null) Object.values(v).forEach(collect)
    }
    collect(parseJsonExact(text))
    const want = literals.map((l) => (BigInt(l) > BigInt(Number.MAX_SAFE_INTEGER) ? l : Number(l)))
    if (literals.some((l) => BigInt(l) > BigInt(Number.MAX_SAFE_INTEGER))) withUnsafe++
    // strictSame: a loose comparison would take "18446744073709551615" for the rounded number
    if (!t.strictSame(got, want, `seed ${seed}: ${text.slice(0, 200)}`)) break
  }
  t.ok(withUnsafe >= 60, `documents holding an unsafe literal: ${withUnsafe} of 300`)
})
