import t from 'tap'
import { DEFAULT_MAX_BATCHED_TOKENS } from '../../src/scheduler/options.js'
import { grow } from '../../src/scheduler/typed-arrays.js'
import { DEVICE_CPU, DEVICE_GPU, WorkerRanks } from '../../src/scheduler/worker-ranks.js'

t.test('registration gives dense slots with their info', async (t) => {
  const w = new WorkerRanks()
  const big = 2n ** 63n + 5n
  const a = w.register(big, 0, { device: 'cpu', maxNumBatchedTokens: 8192, totalKvBlocks: 100 })
  const b = w.register(big, 1)
  const c = w.register(7n, 0, { device: 'gpu' })
  t.same([a, b, c], [0, 1, 2])
  t.equal(w.workerIdOf(a), big, 'u64 ids above 2^53 survive exactly')
  t.equal(w.dpRankOf(b), 1)
  t.equal(w.device[a], DEVICE_CPU)
  t.equal(w.deviceOf(a), 'cpu')
  t.equal(w.deviceOf(c), 'gpu')
  t.equal(w.device[b], DEVICE_GPU)
  t.equal(w.maxNumBatchedTokens[a], 8192)
  t.equal(w.maxNumBatchedTokens[b], DEFAULT_MAX_BATCHED_TOKENS, "unknown capacity uses Dynamo's default")
  t.equal(w.totalKvBlocks[a], 100)
  t.equal(w.workerIndex[a], w.workerIndex[b], 'ranks of one worker share its index')
  t.not(w.workerIndex[a], w.workerIndex[c])
  t.equal(w.rankCount[w.workerIndex[a] as number], 2)
  t.same(w.slotsOf(big), [0, 1])
  t.same(w.slotsOf(99n), [])
  t.equal(w.slotOf(big, 1), 1)
  t.equal(w.slotOf(big, 2), -1)
  t.equal(w.workerCount, 2)
  t.same(Array.from(w.liveSlots.subarray(0, w.liveCount)), [0, 1, 2])
  const v = w.version
  t.equal(w.register(big, 0, { maxNumBatchedTokens: 4096 }), a, 're-registering updates in place')
  t.equal(w.maxNumBatchedTokens[a], 4096)
  t.equal(w.device[a], DEVICE_GPU)
  t.ok(w.version > v)
})

t.test('removal frees slots for reuse and keeps the live list ordered', async (t) => {
  const w = new WorkerRanks()
  for (let i = 0; i < 20; i++) w.register(BigInt(i), 0)
  t.equal(w.remove(3n, 0), 3)
  t.equal(w.remove(3n, 0), -1, 'second removal is a no-op')
  t.equal(w.remove(3n, 9), -1)
  t.notOk(w.isLive(3))
  t.ok(w.isLive(4))
  t.notOk(w.isLive(-1))
  t.notOk(w.isLive(1000))
  t.throws(() => w.workerIdOf(3), { code: 'KVR_ERR_UNKNOWN_WORKER' })
  t.equal(w.liveCount, 19)
  t.equal(w.register(100n, 0), 3, 'the freed slot is reused')
  t.equal(w.workerIdOf(3), 100n)
  w.register(5n, 1)
  t.same(
    w.removeWorker(5n).sort((x, y) => x - y),
    [5, 20],
  )
  t.same(w.removeWorker(5n), [])
  const live = Array.from(w.liveSlots.subarray(0, w.liveCount))
  t.same(
    live,
    [...live].sort((x, y) => x - y),
  )
  t.equal(w.slotCapacity, 21)
})

t.test('invalid registrations are refused', async (t) => {
  const w = new WorkerRanks()
  t.throws(() => w.register(-1n, 0), { code: 'KVR_ERR_INVALID_OPTION' })
  t.throws(() => w.register(2n ** 64n, 0), { code: 'KVR_ERR_INVALID_OPTION' })
  t.throws(() => w.register(1 as never, 0), { code: 'KVR_ERR_INVALID_OPTION' })
  t.throws(() => w.register(1n, -1), { code: 'KVR_ERR_INVALID_OPTION' })
  t.throws(() => w.register(1n, 0.5), { code: 'KVR_ERR_INVALID_OPTION' })
  t.throws(() => w.register(1n, 0, { maxNumBatchedTokens: 0 }), /maxNumBatchedTokens must be a positive number/)
  t.throws(() => w.register(1n, 0, { totalKvBlocks: -3 }), /totalKvBlocks must be a non-negative number/)
  t.equal(w.liveCount, 0)
})

t.test('grow keeps contents', async (t) => {
  const a = new Int32Array([1, 2, 3])
  t.equal(grow(a, 2), a, 'no copy when large enough')
  const b = grow(a, 5)
  t.ok(b.length >= 6)
  t.same(Array.from(b.subarray(0, 3)), [1, 2, 3])
})
