// u64 values as u32 halves: their exact decimal text.
import t from 'tap'
import { u64ToString } from '../../src/codec/u64.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'

const halves = (v: bigint): [number, number] => [Number(v & 0xffffffffn), Number(v >> 32n)]

t.test('u64ToString writes every u64 exactly, without a bigint', async (t) => {
  const edge = [
    0n,
    1n,
    2n ** 32n - 1n,
    2n ** 32n,
    2n ** 53n - 1n,
    2n ** 53n,
    2n ** 53n + 1n,
    10n ** 8n * 2n ** 32n,
    10n ** 19n,
    2n ** 63n,
    2n ** 64n - 1n,
    99999999n * 2n ** 32n + 99999999n,
  ]
  for (const v of edge) t.equal(u64ToString(...halves(v)), v.toString(), v.toString())
  const rng = new Xoshiro128(3)
  let bad = 0
  for (let i = 0; i < 20000; i++) {
    const lo = rng.int(2 ** 31) * 2 + rng.int(2)
    const hi = rng.int(2 ** 31) * 2 + rng.int(2)
    if (u64ToString(lo, hi) !== ((BigInt(hi) << 32n) | BigInt(lo)).toString()) bad++
  }
  t.equal(bad, 0, '20,000 random values')
})
