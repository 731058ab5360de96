// Block hashes with a LoRA adapter, a cache salt and media, against vectors computed by hand from
// Dynamo 1.4.0's rules (1337 + XXH3(lora, 0) + XXH3(salt, 1) as the seed; media hashes sorted and
// appended as u64 LE), each checked with an independent XXH3 implementation (@node-rs/xxhash).
import t from 'tap'
import { xxh3 } from '@node-rs/xxhash'
import { XXH3_SEED, joinHalves, mmBlockHashInto, mmHashOf, promptHashesInto, saltSeed, seededBlockHashesInto } from '../../src/codec/hashing.js'

const lo = new Uint32Array(8)
const hi = new Uint32Array(8)

t.test('the seed folds in the adapter and the salt', async (t) => {
  t.equal(saltSeed(null, null), XXH3_SEED)
  t.equal(saltSeed('', ''), XXH3_SEED, 'empty names count as none')
  t.equal(saltSeed('my-lora', null), 12827409268353072861n)
  t.equal(saltSeed(null, 'tenant-a'), 1948188790972764086n)
  t.equal(saltSeed('my-lora', null), BigInt.asUintN(64, 1337n + xxh3.xxh64(Buffer.from('my-lora'), 0n)))
  t.equal(
    saltSeed('my-lora', 'tenant-a'),
    BigInt.asUintN(64, 1337n + xxh3.xxh64(Buffer.from('my-lora'), 0n) + xxh3.xxh64(Buffer.from('tenant-a'), 1n)),
    'both, wrapping at 2^64',
  )
})

t.test('salted blocks', async (t) => {
  t.equal(seededBlockHashesInto([1, 2, 3, 4, 5, 6, 7, 8], 4, saltSeed('my-lora', null), lo, hi), 2)
  t.same([...joinHalves(lo, hi, 2)], [15671544057904749233n, 7919241211032067838n])
  seededBlockHashesInto([1, 2, 3, 4], 4, saltSeed(null, 'tenant-a'), lo, hi)
  t.same([...joinHalves(lo, hi, 1)], [5738685477468498325n])
  // the unsalted seed gives the plain local hashes
  const plainLo = new Uint32Array(8)
  const plainHi = new Uint32Array(8)
  promptHashesInto([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, plainLo, plainHi)
  seededBlockHashesInto([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, 1337n, lo, hi)
  t.same([...joinHalves(lo, hi, 2)], [...joinHalves(plainLo, plainHi, 2)])
  t.same([...joinHalves(lo, hi, 1)], [14643705804678351452n])
  t.throws(() => seededBlockHashesInto([1, 2, -3, 4], 4, 7n, lo, hi), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE' })
})

t.test('blocks with media', async (t) => {
  const out = new Uint32Array(2)
  mmBlockHashInto([1, 2, 3, 4], 0, 4, [42n], 1337n, out)
  t.same([...joinHalves(out.subarray(0, 1), out.subarray(1, 2), 1)], [14000361058806882387n])
  // sorted before hashing: the order media are listed in does not matter
  const a = new Uint32Array(2)
  const b = new Uint32Array(2)
  mmBlockHashInto([9, 1, 2, 3, 4, 9], 1, 4, [7n, 2n ** 63n, 42n], 1337n, a)
  mmBlockHashInto([1, 2, 3, 4], 0, 4, [2n ** 63n, 42n, 7n], 1337n, b)
  t.same([...a], [...b])
  const bytes = Buffer.alloc(16 + 24)
  ;[1, 2, 3, 4].forEach((x, i) => bytes.writeUInt32LE(x, i * 4))
  ;[7n, 42n, 2n ** 63n].forEach((x, i) => bytes.writeBigUInt64LE(x, 16 + i * 8))
  t.same([...joinHalves(a.subarray(0, 1), a.subarray(1, 2), 1)], [xxh3.xxh64(bytes, 1337n)], 'tokens LE32 then media LE64, ascending')
})

t.test('media identifiers', async (t) => {
  const digest = 'a1b2c3d4e5f60718' + '0'.repeat(48)
  t.equal(mmHashOf(digest), 0xa1b2c3d4e5f60718n, 'a sha256 digest: its first 16 hex digits')
  t.equal(mmHashOf('image-7'), xxh3.xxh64(Buffer.from('image-7'), 0n), 'anything else: XXH3 with seed 0')
})
