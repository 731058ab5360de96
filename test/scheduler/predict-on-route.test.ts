// Predict-on-route in the scheduler: a booked prompt's blocks count as cached on its worker-rank
// for predictedTtlSecs (the overlap is the larger of the index's and this), then expire.
import t from 'tap'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'

function hashes(tokens: number[], bs: number) {
  const local = computeBlockHashes(tokens, bs)
  const seq = computeSequenceHashes(local)
  const n = seq.length
  const seqLo = new Uint32Array(n)
  const seqHi = new Uint32Array(n)
  for (let i = 0; i < n; i++) {
    seqLo[i] = Number((seq[i] as bigint) & 0xffffffffn)
    seqHi[i] = Number((seq[i] as bigint) >> 32n)
  }
  return { seqLo, seqHi, localLo: seqLo, localHi: seqHi, blockCount: n }
}

const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i)

t.test('a follow-up finds its parent on the parent worker until the TTL ends', async (t) => {
  let now = 1000
  // Dynamo's cost: for prompts this short the latency cost rightly prefers the idle worker,
  // since a prefill step's fixed time outweighs 32 cached tokens
  const s = new Scheduler({ blockSize: 4, predictedTtlSecs: 2, seed: 1, cost: 'dynamo' }, { timers: false, clock: () => now })
  t.teardown(() => s.close())
  s.addWorkerRank(1n, 0)
  s.addWorkerRank(2n, 0)
  const parent = range(1, 32)
  const first = await s.schedule({ id: 'p', isl: 32, ...hashes(parent, 4) })
  // the parent stays in flight: by load alone the follow-up would go to the other worker
  const follow = [...parent, ...range(100, 8)]
  const q = await s.schedule({ id: 'q', isl: 40, updateStates: false, ...hashes(follow, 4) })
  t.equal(q.workerId, first.workerId, "the follow-up goes where its parent's prefix will be")
  t.equal(q.overlapBlocks, 8, 'the parent blocks count as cached there')
  now += 2001
  const late = await s.schedule({ id: 'r', isl: 40, updateStates: false, ...hashes(follow, 4) })
  t.equal(late.overlapBlocks, 0, 'expired')
  t.not(late.workerId, first.workerId, 'and load decides again')
})

t.test('off by default: the index alone', async (t) => {
  // Dynamo's cost, for the reason given above
  const s = new Scheduler({ blockSize: 4, seed: 1, cost: 'dynamo' }, { timers: false })
  t.teardown(() => s.close())
  s.addWorkerRank(1n, 0)
  s.addWorkerRank(2n, 0)
  const parent = range(1, 32)
  const first = await s.schedule({ id: 'p', isl: 32, ...hashes(parent, 4) })
  const q = await s.schedule({ id: 'q', isl: 40, updateStates: false, ...hashes([...parent, ...range(100, 8)], 4) })
  t.equal(q.overlapBlocks, 0)
  t.not(q.workerId, first.workerId)
})

t.test('the larger of the index overlap and the prediction, per worker-rank; a removed rank forgets its predictions', async (t) => {
  const now = 1000
  const s = new Scheduler({ blockSize: 4, predictedTtlSecs: 5, seed: 1 }, { timers: false, clock: () => now })
  t.teardown(() => s.close())
  const a = s.addWorkerRank(1n, 0)
  const b = s.addWorkerRank(2n, 0)
  const p = range(1, 16)
  await s.schedule({ id: 'p', isl: 16, workerId: 1n, ...hashes(p, 4) })
  const overlap = new Float64Array(s.workers.slotCapacity)
  overlap[a] = 1
  overlap[b] = 3
  const q = await s.schedule({ id: 'q', isl: 16, updateStates: false, overlapBlocks: overlap, explain: true, ...hashes(p, 4) })
  const byWorker = new Map(q.candidates?.map((c) => [c.workerId, c.overlapBlocks]))
  t.equal(byWorker.get(1n), 4, 'predicted 4 beats the index 1')
  t.equal(byWorker.get(2n), 3, 'the index 3 stands where nothing was predicted')
  t.equal(overlap[a], 1, "the caller's array is not written")
  s.removeWorkerRank(1n, 0)
  s.addWorkerRank(1n, 0)
  const r = await s.schedule({ id: 'r', isl: 16, updateStates: false, explain: true, ...hashes(p, 4) })
  t.equal(new Map(r.candidates?.map((c) => [c.workerId, c.overlapBlocks])).get(1n), 0, 'forgotten with the rank')
})
