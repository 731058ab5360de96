// The engine's vLLM-like scheduler, driven step by step (autoStep: false): token budget,
// chunked prefill, max-num-seqs, preemption under memory pressure (lifo and fifo), prefix hits,
// decode blocks, aborts, the modelled step duration, and no block left behind.
import t, { type Test } from 'tap'
import {
  MockEngine,
  OUTPUT_TOKEN_BASE,
  outputToken,
  type EngineOptions,
  type EngineRequest,
  type RequestListener,
  type StepReport,
} from '../../../src/sim/mocker/engine.js'
import { stepMs } from '../../../src/sim/mocker/timing.js'
import type { RouterEvent } from '../../../src/codec/events.js'
import { computeBlockHashes, computeSequenceHashes } from '../../../src/codec/hashing.js'
import { isKvrError } from '../../../src/errors.js'

let seed = 1
/** A prompt of n distinct tokens (never shared with another prompt unless asked). */
function prompt(n: number, prefix: number[] = []): number[] {
  const out = [...prefix]
  while (out.length < n) out.push(seed++)
  return out.slice(0, n)
}

function engine(o: Partial<EngineOptions> = {}): { e: MockEngine; events: RouterEvent[] } {
  const events: RouterEvent[] = []
  const e = new MockEngine({ workerId: 7n, autoStep: false, blockSize: 16, numGpuBlocks: 1024, onEvent: (ev) => events.push(ev), ...o })
  return { e, events }
}

/** Records what every request went through. */
function recorder(): RequestListener & { tokens: Map<number, number>; finished: EngineRequest[] } {
  const tokens = new Map<number, number>()
  const finished: EngineRequest[] = []
  return {
    tokens,
    finished,
    onToken: (r) => tokens.set(r.id, (tokens.get(r.id) ?? 0) + 1),
    onFinish: (r) => {
      tokens.set(r.id, (tokens.get(r.id) ?? 0) + 1)
      finished.push(r)
    },
  }
}

function noLeaks(t: Test, e: MockEngine): void {
  t.equal(e.pool.activeBlocks, 0, 'no active blocks left')
  t.equal(e.partialBlockCount, 0, 'no partial blocks left')
  t.equal(e.pool.runningRequests, 0, 'the pool holds no request')
  t.equal(e.runningCount + e.waitingCount, 0, 'no request left in the queues')
}

t.test('the token budget of a step is never exceeded, running requests go first', async (t) => {
  const { e } = engine({ maxNumBatchedTokens: 256 })
  const rec = recorder()
  for (let i = 0; i < 12; i++) e.submit(prompt(100 + 37 * i), 5 + i, rec)
  const reports = e.runUntilIdle()
  let over = 0
  let mismatch = 0
  for (const r of reports) {
    if (r.budgetUsed > 256) over++
    const spent = r.scheduled.reduce((s, x) => s + Math.max(1, x.tokens), 0)
    if (spent !== r.budgetUsed) mismatch++
    // every decode of the step is listed before any prefill that was admitted in it
    const firstPrefill = r.scheduled.findIndex((x) => !x.decode)
    if (firstPrefill >= 0 && r.scheduled.slice(firstPrefill).some((x) => x.decode)) mismatch++
  }
  t.equal(over, 0, 'budget respected in every step')
  t.equal(mismatch, 0, 'budget accounting matches the scheduled entries')
  t.ok(
    reports.some((r) => r.budgetUsed === 256),
    'some steps use the whole budget',
  )
  t.equal(rec.finished.length, 12)
  for (const r of rec.finished) t.equal(r.outputTokens, r.maxTokens)
  noLeaks(t, e)
})

t.test('chunked prefill splits a long prompt over steps; without it the prompt goes whole', async (t) => {
  const { e } = engine({ maxNumBatchedTokens: 1024 })
  const rec = recorder()
  const r = e.submit(prompt(3000), 3, rec)
  const s1 = e.step() as StepReport
  const s2 = e.step() as StepReport
  const s3 = e.step() as StepReport
  t.same([s1.prefillTokens, s2.prefillTokens, s3.prefillTokens], [1024, 1024, 952], 'three chunks')
  t.equal(r.firstTokenAt >= 0, true, 'first token after the last chunk')
  t.equal(rec.tokens.get(r.id), 1)
  t.equal(
    s1.durationMs,
    stepMs({ prefillTokens: 1024, prefillPairs: s1.prefillPairs, decodes: 0, kvUsage: s1.kvUsage }, e.config),
    'each chunk priced as a prefill of its size',
  )
  e.runUntilIdle()
  t.equal(r.outputTokens, 3)

  const { e: whole } = engine({ maxNumBatchedTokens: 1024, enableChunkedPrefill: false })
  t.throws(() => whole.submit(prompt(1020), 10), /exceed max_num_batched_tokens \(1024\) and chunked prefill is off/)
  const a = whole.submit(prompt(600), 2)
  const b = whole.submit(prompt(600), 2)
  const w1 = whole.step() as StepReport
  t.same(
    w1.scheduled.map((x) => [x.id, x.tokens]),
    [[a.id, 600]],
    'the second prompt does not fit the rest of the budget and waits',
  )
  const w2 = whole.step() as StepReport
  t.same(
    w2.scheduled.map((x) => [x.id, x.tokens, x.decode]),
    [
      [a.id, 1, true],
      [b.id, 600, false],
    ],
    'next step: the decode first, then the whole prompt',
  )
  whole.runUntilIdle()
  noLeaks(t, e)
  noLeaks(t, whole)
})

t.test('max-num-seqs caps the running requests', async (t) => {
  const { e } = engine({ maxNumSeqs: 3 })
  const rec = recorder()
  for (let i = 0; i < 10; i++) e.submit(prompt(40), 6, rec)
  const reports = e.runUntilIdle()
  t.equal(Math.max(...reports.map((r) => r.running)), 3, 'never more than 3 running')
  t.equal(reports[0]?.waiting, 7, 'the rest waits')
  t.equal(rec.finished.length, 10)
  noLeaks(t, e)
})

t.test('a repeated prompt hits the prefix cache; the step computes only the rest', async (t) => {
  const { e } = engine()
  const p = prompt(200)
  const a = e.submit(p, 4)
  e.runUntilIdle()
  t.equal(a.cachedTokens, 0)
  const b = e.submit(p, 4)
  const s = e.step() as StepReport
  t.equal(b.cachedTokens, 192, '12 full blocks of 16 cached')
  t.equal(s.prefillTokens, 8, 'only the partial tail is computed')
  // a prompt that is all cached costs no prefill at all
  const exact = prompt(64)
  e.submit(exact, 1)
  e.runUntilIdle()
  const c = e.submit(exact, 2)
  const s2 = e.step() as StepReport
  t.equal(c.cachedTokens, 64)
  t.same([s2.prefillTokens, s2.budgetUsed, s2.durationMs], [0, 1, 0], 'fully cached: 1 budget token to sample, and no prefill cost')
  t.equal(c.outputTokens, 1, 'its first token came out of that step')
  e.runUntilIdle()
  t.equal(e.stats.cachedTokens, 192 + 64)
  noLeaks(t, e)
})

t.test("decoded tokens that complete a block are stored, with the router's hashes", async (t) => {
  const { e, events } = engine()
  const p = prompt(20)
  const r = e.submit(p, 45)
  e.runUntilIdle()
  // KV of 20 + 44 tokens is computed (the last token is never fed back): 4 full blocks
  const stored = events.flatMap((ev) => (typeof ev.event.data === 'object' && 'stored' in ev.event.data ? ev.event.data.stored.blocks : []))
  t.equal(stored.length, 4, 'one prompt block and three decode blocks')
  t.equal(events.length, 4, 'one Stored event per block as each one completes')
  const all = [...p, ...Array.from({ length: 45 }, (_, k) => outputToken(k))]
  t.same([...r.tokens], all, 'the request keeps its prompt and generated tokens')
  t.equal(all[20], OUTPUT_TOKEN_BASE)
  const local = computeBlockHashes(all.slice(0, 64), 16)
  const seq = computeSequenceHashes(local)
  t.same(
    stored.map((b) => b.tokens_hash),
    [...local],
    "tokens_hash is the router's local block hash",
  )
  t.same(
    stored.map((b) => b.block_hash),
    [...seq],
    'block_hash is the chained sequence hash',
  )
  t.same(
    events.map((ev) => ev.event.event_id),
    [1n, 2n, 3n, 4n],
    'consecutive ids from 1',
  )
  noLeaks(t, e)
})

for (const mode of ['lifo', 'fifo'] as const) {
  t.test(`${mode} preemption under memory pressure; the preempted request still completes`, async (t) => {
    // 12 blocks of 16 tokens; three requests of 2 blocks each that grow by 3 blocks of decode
    const { e } = engine({ numGpuBlocks: 12, preemptionMode: mode })
    const rec = recorder()
    const reqs = [0, 1, 2].map(() => e.submit(prompt(32), 60, rec))
    let first: StepReport | undefined
    let maxUsed = 0
    for (;;) {
      const s = e.step()
      if (s === null) break
      maxUsed = Math.max(maxUsed, e.activeBlocks)
      if (e.pool.used > 12) t.fail('pool above capacity')
      if (first === undefined && s.preempted.length > 0) first = s
    }
    t.ok(first !== undefined, 'preemption happened')
    const victim = first?.preempted[0]
    t.equal(
      victim,
      mode === 'lifo' ? (reqs[2] as EngineRequest).id : (reqs[1] as EngineRequest).id,
      mode === 'lifo' ? 'the most recently admitted gave way' : 'the oldest request after the one that needed room gave way',
    )
    t.ok(maxUsed <= 12, `active + partial blocks never above capacity (max ${maxUsed})`)
    t.ok(e.stats.preemptions > 0)
    t.equal(rec.finished.length, 3, 'every request completed')
    for (const r of reqs) {
      t.equal(r.outputTokens, 60)
      t.equal(rec.tokens.get(r.id), 60, 'each token delivered exactly once across preemption')
    }
    t.ok(reqs.some((r) => r.preemptions > 0))
    noLeaks(t, e)
  })
}

t.test('an abort frees the blocks at once, waiting or running', async (t) => {
  const { e } = engine()
  const rec = recorder()
  const a = e.submit(prompt(100), 50, rec)
  const b = e.submit(prompt(100), 50, rec)
  e.step()
  e.step()
  t.ok(e.pool.activeBlocks > 0)
  t.equal(e.abort(a), true)
  t.equal(e.abort(a), false, 'only once')
  t.equal(a.state, 'aborted')
  const c = e.submit(prompt(50), 5, rec)
  t.equal(e.abort(c), true, 'a waiting request too')
  e.runUntilIdle()
  t.equal(b.outputTokens, 50)
  t.same(
    rec.finished.map((r) => r.id),
    [b.id],
    'aborted requests never finish',
  )
  t.equal(e.stats.aborted, 2)
  noLeaks(t, e)
})

t.test('requests that could never run are refused', async (t) => {
  const { e } = engine({ numGpuBlocks: 4 })
  const refused = (f: () => unknown, code: string): boolean => {
    try {
      f()
      return false
    } catch (err) {
      return isKvrError(err) && err.code === code
    }
  }
  t.ok(refused(() => e.submit([], 1), 'KVR_ERR_EMPTY_PROMPT'))
  t.ok(
    refused(() => e.submit(prompt(60), 5), 'KVR_ERR_INVALID_REQUEST'),
    '65 tokens need 5 blocks of 16, the engine has 4',
  )
  t.ok(refused(() => e.submit(prompt(10), 0), 'KVR_ERR_INVALID_REQUEST'))
  t.ok(refused(() => e.submit([1, -2, 3], 1), 'KVR_ERR_TOKEN_OUT_OF_RANGE'))
  t.ok(refused(() => e.submit([1, 2 ** 32], 1), 'KVR_ERR_TOKEN_OUT_OF_RANGE'))
  t.ok(refused(() => new MockEngine({ workerId: 1n, preemptionMode: 'random' as 'lifo' }), 'KVR_ERR_INVALID_OPTION'))
  t.ok(refused(() => new MockEngine({ workerId: 1n, speedupRatio: -1 }), 'KVR_ERR_INVALID_OPTION'))
  t.ok(refused(() => new MockEngine({ workerId: 1n, blockSize: 0 }), 'KVR_ERR_INVALID_OPTION'))
  t.throws(() => new MockEngine({ workerId: 1n }).step(), /autoStep: false/)
  e.close()
  t.ok(refused(() => e.submit([1], 1), 'KVR_ERR_SHUTTING_DOWN'))
})

t.test("step durations follow the timing model with the step's own T, decodes and KV usage", async (t) => {
  const { e } = engine({ speedupRatio: 2, decodeSpeedupRatio: 3, numGpuBlocks: 100 })
  e.submit(prompt(500), 4)
  e.submit(prompt(300), 4)
  const reports = e.runUntilIdle()
  t.equal(reports[0]?.prefillTokens, 800, 'both prompts in one batch: T = 2 × (400 − 0)')
  for (const r of reports)
    t.equal(
      r.durationMs,
      stepMs(
        { prefillTokens: r.prefillTokens, prefillPairs: r.prefillPairs, decodes: r.decodes, kvUsage: r.kvUsage },
        { speedupRatio: 2, decodeSpeedupRatio: 3 },
      ),
    )
  // after the prefill, both decode: usage is their blocks (partials included) over 100
  t.equal(reports[1]?.kvUsage, (Math.ceil(501 / 16) + Math.ceil(301 / 16)) / 100)
  t.equal(
    e.stats.busyMs,
    reports.reduce((s, r) => s + r.durationMs, 0),
  )
})
