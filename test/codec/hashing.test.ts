import t from 'tap'
import { computeBlockHashes, computeSequenceHashes, xxh3_64, blockHashesInto, sequenceHashesInto, completeBlocks } from '../../src/codec/hashing.js'
import { isKvrError } from '../../src/errors.js'

const range = (a: number, b: number): number[] => Array.from({ length: b - a + 1 }, (_, i) => a + i)

t.test('xxh3-64 with seed 1337 matches the reference vector', async (t) => {
  t.equal(xxh3_64(Buffer.from('test data', 'ascii'), 1337n), 13226331709069118873n)
  t.equal(xxh3_64(Buffer.from('test data', 'ascii')), 13226331709069118873n, 'seed 1337 is the default')
  t.not(xxh3_64(Buffer.from('test data', 'ascii'), 0n), 13226331709069118873n, 'the seed matters')
})

t.test('tokens 1..10, block size 4: two complete blocks, partial block ignored', async (t) => {
  const local = computeBlockHashes(range(1, 10), 4)
  t.same([...local], [14643705804678351452n, 16777012769546811212n])
  t.same([...computeSequenceHashes(local)], [14643705804678351452n, 4945711292740353085n])
})

t.test('tokens 0..31, block size 16', async (t) => {
  const local = computeBlockHashes(range(0, 31), 16)
  t.same([...local], [15310707395893867146n, 15292316782987903195n])
  t.same([...computeSequenceHashes(local)], [15310707395893867146n, 13769157705258532664n])
})

t.test('only complete blocks are hashed', async (t) => {
  for (const bs of [11, 32, 64]) {
    t.equal(computeBlockHashes(range(1, bs), bs).length, 1, `${bs} tokens → 1 block`)
    t.equal(computeBlockHashes(range(1, bs + 1), bs).length, 1, `${bs + 1} tokens → 1 block`)
    t.equal(computeBlockHashes(range(1, 2 * bs + 1), bs).length, 2, `${2 * bs + 1} tokens → 2 blocks`)
    t.equal(computeBlockHashes(range(1, bs - 1), bs).length, 0, 'a short prompt has no block')
  }
  t.equal(completeBlocks(129, 64), 2)
  // the partial block does not change the complete ones
  t.same([...computeBlockHashes(range(1, 8), 4)], [...computeBlockHashes(range(1, 10), 4)])
})

t.test('a block hash depends only on its own tokens; the sequence hash on the whole prefix', async (t) => {
  const a = computeBlockHashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
  const b = computeBlockHashes([9, 9, 9, 9, 5, 6, 7, 8], 4)
  t.equal(a[1], b[1])
  t.not(a[0], b[0])
  const sa = computeSequenceHashes(a)
  const sb = computeSequenceHashes(b)
  t.not(sa[1], sb[1])
})

t.test('halves API agrees with the bigint API', async (t) => {
  const tokens = Uint32Array.from({ length: 1000 }, (_, i) => (i * 2654435761) >>> 0)
  const lo = new Uint32Array(20)
  const hi = new Uint32Array(20)
  const n = blockHashesInto(tokens, 64, lo, hi)
  t.equal(n, 15)
  const big = computeBlockHashes(tokens, 64)
  for (let i = 0; i < n; i++) t.equal((BigInt(hi[i] as number) << 32n) | BigInt(lo[i] as number), big[i])
  const slo = new Uint32Array(n)
  const shi = new Uint32Array(n)
  sequenceHashesInto(lo, hi, n, slo, shi)
  const seq = computeSequenceHashes(big)
  for (let i = 0; i < n; i++) t.equal((BigInt(shi[i] as number) << 32n) | BigInt(slo[i] as number), seq[i])
})

t.test('token ids outside u32 are rejected with a clear error', async (t) => {
  const bad: [number, string][] = [
    [-1, 'negative'],
    [4294967296, '2^32'],
    [1.5, 'fraction'],
    [NaN, 'NaN'],
    [Infinity, 'infinity'],
  ]
  for (const [v, what] of bad) {
    t.throws(() => computeBlockHashes([1, 2, v, 4], 4), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE', message: /index 2/ }, what)
  }
  // in the ignored partial block as well: a bad prompt is refused whole
  t.throws(() => computeBlockHashes([1, 2, 3, 4, -5], 4), { code: 'KVR_ERR_TOKEN_OUT_OF_RANGE', message: /index 4/ })
  t.equal(computeBlockHashes([0, 4294967295, 7, 8], 4).length, 1, 'both ends of the u32 range are fine')
})

t.test('block size is validated', async (t) => {
  for (const bs of [0, -1, 1.5, 70000]) {
    let err: unknown
    try {
      computeBlockHashes([1, 2, 3], bs)
    } catch (e) {
      err = e
    }
    t.ok(isKvrError(err, 'KVR_ERR_INVALID_BLOCK_SIZE'), `block size ${bs}`)
  }
})
