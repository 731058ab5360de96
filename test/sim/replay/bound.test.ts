// The infinite-cache hit-rate bound on a hand-made trace: block size 64 makes each 512-token
// trace block 8 router blocks, and hashes chain, so a block only matches after the same prefix.
import t from 'tap'
import { cacheBound } from '../../../src/sim/replay/bound.js'

const trace = [
  { input_length: 1024, hash_ids: [1, 2] }, // 16 blocks, all new
  { input_length: 1024, hash_ids: [1, 3] }, // the 8 blocks of id 1 hit (512 tokens), 8 new
  { input_length: 600, hash_ids: [1, 2] }, // 9 complete blocks, all seen with this prefix: 576
  { input_length: 512, hash_ids: [2] }, // id 2 without id 1 before it: other blocks, 0 hits, 8 new
  { input_length: 1000, hash_ids: [1, 3] }, // 15 complete blocks, all seen: 960
]

t.test('hit rate of one cache that keeps every block, in trace order', async (t) => {
  const b = cacheBound(trace, 64)
  t.equal(b.requests, 5)
  t.equal(b.promptTokens, 1024 + 1024 + 600 + 512 + 1000)
  t.equal(b.cachedTokens, 0 + 512 + 576 + 0 + 960)
  t.equal(b.hitRate, 2048 / 4160)
  t.equal(b.uniqueBlocks, 16 + 8 + 0 + 8 + 0)
  t.equal(b.blockSize, 64)
})

t.test('a larger block size counts only complete blocks', async (t) => {
  // 256-token blocks: 4, 4 (2 hit), 2 (2 hit), 2 (0 hit), 3 (3 hit)
  const b = cacheBound(trace, 256)
  t.equal(b.cachedTokens, 512 + 512 + 768)
  t.equal(b.uniqueBlocks, 4 + 2 + 0 + 2 + 0)
})

t.test('a hit stops at the first miss, even if later blocks were seen', async (t) => {
  // the second request shares block 0 and differs at block 1 of the trace: its 3rd trace block
  // (id 9) follows a different prefix, so nothing after the miss can match
  const b = cacheBound(
    [
      { input_length: 1536, hash_ids: [1, 2, 9] },
      { input_length: 1536, hash_ids: [1, 4, 9] },
    ],
    512,
  )
  t.equal(b.cachedTokens, 512)
  t.equal(b.uniqueBlocks, 5)
})

t.test('prompts longer than the initial buffers, and an empty trace', async (t) => {
  const ids = Array.from({ length: 40 }, (_, i) => i)
  const b = cacheBound(
    [
      { input_length: 40 * 512, hash_ids: ids },
      { input_length: 40 * 512, hash_ids: ids },
    ],
    64,
  )
  t.equal(b.cachedTokens, 40 * 512)
  t.equal(b.hitRate, 0.5)
  t.same(cacheBound([], 64), { blockSize: 64, requests: 0, promptTokens: 0, cachedTokens: 0, hitRate: 0, uniqueBlocks: 0 })
})
