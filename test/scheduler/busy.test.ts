// Load shedding: three thresholds, busy workers excluded in every mode, all busy → 503.
import t from 'tap'
import { isKvrError } from '../../src/errors.js'
import { ALL_WORKERS_BUSY_MESSAGE, RetryableError } from '../../src/scheduler/rejection.js'
import { ROUTER_MODES } from '../../src/scheduler/options.js'
import { blocks, chain, makeScheduler } from './fixtures.js'

t.test('absolute prefill-token threshold', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null, activePrefillTokensThreshold: 100 }, 2)
  s.tryRoute({ id: 'big', isl: 150, workerId: 1n })
  for (let i = 0; i < 5; i++) t.equal(s.tryRoute({ isl: 1, updateStates: false })?.workerId, 2n)
  s.tryRoute({ id: 'big2', isl: 150, workerId: 2n })
  let err: unknown
  try {
    s.tryRoute({ id: 'x', isl: 1 })
  } catch (e) {
    err = e
  }
  t.ok(err instanceof RetryableError)
  t.ok(isKvrError(err, 'KVR_ERR_ALL_WORKERS_BUSY'))
  t.equal((err as RetryableError).message, 'Service temporarily unavailable: All workers are busy, please retry later')
  t.equal((err as RetryableError).message, ALL_WORKERS_BUSY_MESSAGE)
  t.equal((err as RetryableError).statusCode, 503)
  t.equal((err as RetryableError).retryAfterSecs, 1)
  t.equal(s.stats().allBusyTotal, 1)
  await t.rejects(s.schedule({ id: 'y', isl: 1 }), { code: 'KVR_ERR_ALL_WORKERS_BUSY' })
  s.markPrefillComplete('big')
  t.equal(s.tryRoute({ id: 'z', isl: 1 })?.workerId, 1n, 'prefill done → not busy any more')
})

t.test('fractional prefill threshold uses max_num_batched_tokens', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null, activePrefillTokensThresholdFrac: 0.5 }, 2, (i) => ({ maxNumBatchedTokens: i === 0 ? 100 : 1000 }))
  s.tryRoute({ id: 'a', isl: 60, workerId: 1n }) // 60 > 50 → busy
  s.tryRoute({ id: 'b', isl: 60, workerId: 2n }) // 60 ≤ 500
  t.equal(s.tryRoute({ isl: 1, updateStates: false, overrides: { overlapScoreWeight: 0 } })?.workerId, 2n)
})

t.test('decode-blocks threshold needs the worker capacity', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null, activeDecodeBlocksThreshold: 0.5 }, 3, (i) => ({ totalKvBlocks: i === 2 ? 0 : 10 }))
  const h = chain(blocks(0, 6))
  s.tryRoute({ id: 'a', isl: 0, workerId: 1n, seqLo: h.lo, seqHi: h.hi }) // 6/10 > 0.5
  s.tryRoute({ id: 'b', isl: 0, workerId: 3n, seqLo: h.lo, seqHi: h.hi }) // unknown capacity: never busy
  const d = s.tryRoute({ isl: 1, updateStates: false, explain: true })
  t.same(
    d?.candidates?.map((c) => c.workerId),
    [2n, 3n],
    'worker 1 is out of the candidates',
  )
})

t.test('a worker is busy only when all of its ranks are', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null, activePrefillTokensThreshold: 10 }, 0)
  s.addWorkerRank(1n, 0)
  s.addWorkerRank(1n, 1)
  s.tryRoute({ id: 'a', isl: 50, workerId: 1n, dpRank: 0 })
  const d = s.tryRoute({ isl: 1, updateStates: false, explain: true })
  t.equal(d?.candidates?.length, 2, 'one busy rank does not make the worker busy')
  s.tryRoute({ id: 'b', isl: 50, workerId: 1n, dpRank: 1 })
  t.throws(() => s.tryRoute({ isl: 1, updateStates: false }), { code: 'KVR_ERR_ALL_WORKERS_BUSY' })
})

t.test('busy workers are excluded in every router mode', async (t) => {
  for (const mode of ROUTER_MODES) {
    const { s } = makeScheduler({ mode, queueThreshold: null, activePrefillTokensThreshold: 10, seed: 1 }, 3, (i) => ({ device: i === 0 ? 'cpu' : 'gpu' }))
    s.tryRoute({ id: 'hot', isl: 50, workerId: 2n })
    if (mode === 'direct') {
      t.throws(() => s.tryRoute({ id: 'x', isl: 1, workerId: 2n }), { code: 'KVR_ERR_ALL_WORKERS_BUSY' }, 'direct: the named worker is busy')
      t.equal(s.tryRoute({ id: 'y', isl: 1, workerId: 3n })?.workerId, 3n)
      continue
    }
    const seen = new Set<bigint>()
    for (let i = 0; i < 60; i++) seen.add(s.tryRoute({ isl: 1, updateStates: false })?.workerId ?? 0n)
    t.notOk(seen.has(2n), `${mode} never picks the busy worker`)
    t.ok(seen.size >= 1)
  }
})

t.test('load shedding comes before queueing: all shed → 503 at once, not a wait', async (t) => {
  const { s } = makeScheduler({ queueThreshold: 1, activePrefillTokensThreshold: 1000 }, 1, { maxNumBatchedTokens: 10 })
  s.tryRoute({ id: 'a', isl: 50 })
  const p = s.schedule({ id: 'b', isl: 5000 })
  t.ok(s.isWaiting('b'))
  s.free('a')
  t.equal((await p).workerId, 1n)
  // now worker 1 holds 5000 prefill tokens: shed; a waiter stays queued through rechecks
  const q = s.schedule({ id: 'c', isl: 5 }).catch((e: unknown) => e)
  t.notOk(s.isWaiting('c'), 'all shed → 503 at once rather than queueing')
  t.ok(isKvrError(await q, 'KVR_ERR_ALL_WORKERS_BUSY'))
})

t.test('thresholds are live-editable and validated', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null, activePrefillTokensThreshold: 100 }, 1)
  t.same(s.busyThresholds(), { activeDecodeBlocksThreshold: null, activePrefillTokensThreshold: 100, activePrefillTokensThresholdFrac: null })
  s.tryRoute({ id: 'a', isl: 150 })
  t.throws(() => s.tryRoute({ id: 'b', isl: 1 }), { code: 'KVR_ERR_ALL_WORKERS_BUSY' })
  t.same(s.setBusyThresholds({ activePrefillTokensThreshold: 200, activeDecodeBlocksThreshold: 0.9 }), {
    activeDecodeBlocksThreshold: 0.9,
    activePrefillTokensThreshold: 200,
    activePrefillTokensThresholdFrac: null,
  })
  t.equal(s.tryRoute({ id: 'b', isl: 1 })?.workerId, 1n)
  t.throws(
    () => s.setBusyThresholds({ activeDecodeBlocksThreshold: 2, activePrefillTokensThreshold: 1 }),
    /activeDecodeBlocksThreshold must be a number in \[0, 1\] or null, got 2/,
  )
  t.equal(s.busyThresholds().activePrefillTokensThreshold, 200, 'a refused edit changes nothing')
  t.throws(() => s.setBusyThresholds({ activePrefillTokensThresholdFrac: -1 }), /activePrefillTokensThresholdFrac must be a number in \[0, ∞\) or null/)
  s.setBusyThresholds({ activePrefillTokensThreshold: null, activeDecodeBlocksThreshold: null })
  t.same(s.busyThresholds(), { activeDecodeBlocksThreshold: null, activePrefillTokensThreshold: null, activePrefillTokensThresholdFrac: null })
  s.tryRoute({ id: 'c', isl: 100_000 })
  t.equal(s.tryRoute({ id: 'd', isl: 1 })?.workerId, 1n, 'no thresholds: never shed')
})

t.test('a request pinned to one rank of a busy worker is refused', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null, activePrefillTokensThreshold: 10 }, 0)
  s.addWorkerRank(1n, 0)
  s.addWorkerRank(1n, 1)
  s.addWorkerRank(2n, 0)
  s.tryRoute({ id: 'a', isl: 50, workerId: 1n, dpRank: 0 })
  t.equal(s.tryRoute({ id: 'ok', isl: 1, workerId: 1n, dpRank: 0 })?.dpRank, 0, 'rank 1 is not busy, so worker 1 is not')
  s.tryRoute({ id: 'b', isl: 50, workerId: 1n, dpRank: 1 })
  t.throws(() => s.tryRoute({ id: 'x', isl: 1, workerId: 1n, dpRank: 0 }), { code: 'KVR_ERR_ALL_WORKERS_BUSY' }, 'both ranks busy → worker 1 busy')
  t.throws(() => s.tryRoute({ id: 'y', isl: 1, workerId: 1n }), { code: 'KVR_ERR_ALL_WORKERS_BUSY' })
  t.equal(s.tryRoute({ id: 'z', isl: 1 })?.workerId, 2n)
})

t.test("a worker's own load report (kv_metrics) counts for the decode-blocks threshold", async (t) => {
  const { s } = makeScheduler({ queueThreshold: null, activeDecodeBlocksThreshold: 0.5 }, 3, (i) => ({ totalKvBlocks: i === 2 ? 0 : 10 }))
  const candidates = (): bigint[] | undefined => s.tryRoute({ isl: 1, updateStates: false, explain: true })?.candidates?.map((c) => c.workerId)
  t.same(candidates(), [1n, 2n, 3n])
  t.equal(s.reportLoad(1n, 0, 8, null), true, 'worker 1 reports 8 of 10 blocks active (load from elsewhere)')
  t.same(candidates(), [2n, 3n], 'busy by its own report although this router booked nothing there')
  t.equal(s.reportLoad(3n, 0, 90, 100), true, 'worker 3 reports its capacity along with its load')
  t.same(candidates(), [2n])
  t.equal(s.reportLoad(1n, 0, 2, null), true)
  t.same(candidates(), [1n, 2n], 'a lower report clears it again')
  t.equal(s.reportLoad(9n, 0, 1, 1), false, 'unknown worker')
})
