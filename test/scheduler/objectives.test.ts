// Latency objectives (TTFT, TPOT) in the scheduler: kv mode under the latency cost sends a request
// to the cheapest candidate predicted to meet them; when none is, a sheddable one (priority < 0)
// is refused and any other goes to the least predicted TTFT. Pinned requests, other modes and
// Dynamo's cost only count them.
import t from 'tap'
import { isKvrError } from '../../src/errors.js'
import { RetryableError } from '../../src/scheduler/rejection.js'
import type { Scheduler, ScheduleRequest } from '../../src/scheduler/scheduler.js'
import type { SchedulerOptionsInput } from '../../src/scheduler/options.js'
import { blocks, chain, makeScheduler, overlaps } from './fixtures.js'

const BS = 16
const KV = 1000

/**
 * Three worker-ranks of 1,000 KV blocks; slot 0 holds 900 blocks of a request past its prefill
 * (decode steps near full usage) and caches the whole prompt of the request the tests route.
 */
function fleet(options: SchedulerOptionsInput = {}, deps = {}): { s: Scheduler; req: (extra: Partial<ScheduleRequest>) => ScheduleRequest } {
  const { s } = makeScheduler({ blockSize: BS, queueThreshold: null, cost: 'latency', mode: 'kv', ...options }, 3, { totalKvBlocks: KV }, deps)
  const h = chain(blocks(5000, 900))
  s.tryRoute({ id: 'load', isl: 900 * BS, workerId: 1n, dpRank: 0, seqLo: h.lo, seqHi: h.hi })
  s.markPrefillComplete('load')
  let n = 0
  const req = (extra: Partial<ScheduleRequest>): ScheduleRequest => ({ id: `r${n++}`, isl: 100 * BS, overlapBlocks: overlaps({ 0: 100 }), ...extra })
  return { s, req }
}

t.test('without objectives the cached, busy worker-rank wins; a TPOT objective it is predicted to miss moves the request', async (t) => {
  const { s, req } = fleet()
  const plain = s.tryRoute(req({ updateStates: false, explain: true }))
  t.equal(plain?.slot, 0, 'the whole prompt is cached on slot 0')
  t.equal(plain?.candidates?.[0]?.tpotSecs, undefined, 'no predictions shown without objectives')

  const d = s.tryRoute(req({ tpotObjectiveMs: 20, updateStates: false, explain: true }))
  t.not(d?.slot, 0, 'slot 0 decodes near full KV usage: predicted TPOT over 20 ms')
  const rows = d?.candidates ?? []
  t.equal(rows.length, 3)
  const row0 = rows.find((r) => r.slot === 0)
  t.ok((row0?.tpotSecs ?? 0) > 0.02, `slot 0's predicted TPOT ${row0?.tpotSecs} s is over the objective`)
  t.equal(row0?.meetsObjectives, false)
  for (const r of rows.filter((r) => r.slot !== 0)) {
    t.ok((r.tpotSecs ?? 1) < 0.02, `slot ${r.slot} predicted TPOT ${r.tpotSecs} s`)
    t.equal(r.meetsObjectives, true)
  }
  // among those that meet them, the least cost
  const met = rows.filter((r) => r.meetsObjectives === true)
  const least = Math.min(...met.map((r) => r.logit))
  t.ok((rows.find((r) => r.slot === d?.slot)?.logit ?? Infinity) <= least * 1.01, 'the cheapest of those predicted to meet them (near-tie rule)')

  // a TTFT objective the cached worker-rank meets keeps it
  const ttft = s.tryRoute(req({ ttftObjectiveMs: 10_000, updateStates: false }))
  t.equal(ttft?.slot, 0)
  t.match(s.stats().objectives, { predictedMet: 2, nonePredicted: 0, shed: 0, notPredicted: 0 })
})

t.test('none predicted to meet them: a sheddable request is refused with a retry-after, others go to the least predicted TTFT', async (t) => {
  const { s, req } = fleet({ retryAfterSecs: 3 })
  // no engine decodes a step in 2 ms (the default model's least step is 5.74 ms)
  let err: unknown
  try {
    s.tryRoute(req({ tpotObjectiveMs: 2, priority: -1 }))
  } catch (e) {
    err = e
  }
  t.ok(isKvrError(err, 'KVR_ERR_OBJECTIVE_UNMET'), String(err))
  t.ok(err instanceof RetryableError && err.retryAfterSecs === 3 && err.statusCode === 503)
  t.match((err as Error).message, /TPOT 2 ms/)
  t.equal(s.stats().bookedRequests, 1, 'nothing booked for it')

  // the default priority: routed, to the least predicted TTFT even though slot 0 misses the TPOT
  const d = s.tryRoute(req({ tpotObjectiveMs: 2, explain: true }))
  const rows = d?.candidates ?? []
  t.ok(rows.every((r) => r.meetsObjectives === false))
  const best = rows.reduce((a, b) => ((b.ttftSecs ?? Infinity) < (a.ttftSecs ?? Infinity) ? b : a))
  t.equal(d?.slot, best.slot, 'the least predicted TTFT')
  t.equal(d?.slot, 0, 'the cached one')
  t.equal(d?.booked, true)

  // a TTFT objective nobody meets, priority 0: least TTFT, not least cost
  const e = s.tryRoute(req({ ttftObjectiveMs: 0.001, priority: 0, updateStates: false, overlapBlocks: overlaps({}) }))
  t.ok(e !== null)
  t.match(s.stats().objectives, { predictedMet: 0, nonePredicted: 2, shed: 1 })
})

t.test('pinned requests, other modes and the dynamo cost only count objectives', async (t) => {
  const pinned = fleet()
  const d = pinned.s.tryRoute(pinned.req({ workerId: 1n, dpRank: 0, tpotObjectiveMs: 2, priority: -1 }))
  t.equal(d?.slot, 0, 'pinned: goes where it is pinned, not shed')
  t.equal(pinned.s.stats().objectives.notPredicted, 1)
  t.equal(pinned.s.stats().objectives.shed, 0)

  for (const options of [{ cost: 'dynamo' as const }, { mode: 'round-robin' as const }, { mode: 'least-loaded' as const }]) {
    const a = fleet(options)
    const b = fleet(options)
    for (let i = 0; i < 4; i++) {
      const x = a.s.tryRoute(a.req({ tpotObjectiveMs: 2, ttftObjectiveMs: 0.001, priority: -1 }))
      const y = b.s.tryRoute(b.req({}))
      t.equal(x?.slot, y?.slot, `${JSON.stringify(options)}: the same choice as without objectives`)
    }
    t.match(a.s.stats().objectives, { notPredicted: 4, shed: 0, predictedMet: 0, nonePredicted: 0 })
    t.equal(b.s.stats().objectives.notPredicted, 0)
  }
})

t.test('a request with objectives is scored in full, not by the pruned selection', async (t) => {
  const { s, req } = fleet()
  s.tryRoute(req({ updateStates: false }))
  t.equal(s.stats().prunedTotal, 1, 'the pruned selection takes a plain request')
  s.tryRoute(req({ updateStates: false, ttftObjectiveMs: 5000 }))
  s.tryRoute(req({ updateStates: false, tpotObjectiveMs: 50 }))
  t.equal(s.stats().prunedTotal, 1, 'not those with objectives')
  t.equal(s.stats().decisionsTotal, 4, 'the pinned load, then three')
})

t.test('objectives outside (0, 10^7] ms are refused', async (t) => {
  const { s, req } = fleet()
  for (const v of [0, -5, Number.NaN, Infinity, 1e7 + 1]) {
    t.throws(() => s.tryRoute(req({ ttftObjectiveMs: v })), { code: 'KVR_ERR_INVALID_OPTION' }, `ttft ${v}`)
    t.throws(() => s.tryRoute(req({ tpotObjectiveMs: v })), { code: 'KVR_ERR_INVALID_OPTION' }, `tpot ${v}`)
  }
  t.ok(s.tryRoute(req({ ttftObjectiveMs: 1e7, tpotObjectiveMs: 0.5, updateStates: false })) !== null, 'the bounds themselves are fine')
})

t.test('a queued request meets the objective check when it leaves the queue', async (t) => {
  const { s } = makeScheduler({ blockSize: BS, cost: 'latency', mode: 'kv', queueThreshold: 0.5 }, 1, { totalKvBlocks: KV, maxNumBatchedTokens: 1000 })
  const h = chain(blocks(7000, 600))
  await s.schedule({ id: 'big', isl: 600 * BS, seqLo: h.lo, seqHi: h.hi })
  const waiting = s.schedule({ id: 'shed-me', isl: 64, tpotObjectiveMs: 2, priority: -1 })
  t.ok(s.isWaiting('shed-me'), 'every worker-rank is busy: it waits')
  s.free('big')
  await t.rejects(waiting, { code: 'KVR_ERR_OBJECTIVE_UNMET' })
  t.equal(s.stats().objectives.shed, 1)
})
