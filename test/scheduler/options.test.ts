import t from 'tap'
import { KvrError } from '../../src/errors.js'
import { DEFAULT_MAX_BATCHED_TOKENS, resolveSchedulerOptions } from '../../src/scheduler/options.js'

t.test('the documented defaults, and the result is frozen', async (t) => {
  const o = resolveSchedulerOptions()
  t.equal(o.mode, 'kv')
  t.equal(o.cost, 'latency')
  t.equal(o.overlapScoreWeight, 1)
  t.equal(o.temperature, 0)
  t.equal(o.queueThreshold, 4)
  t.equal(o.queuePolicy, 'fcfs')
  t.equal(o.trackActiveBlocks, true)
  t.equal(o.trackPrefillTokens, true)
  t.equal(o.assumeKvReuse, true)
  t.equal(o.cudaToCpuRatio, 8)
  t.equal(o.approximate.ttlSecs, 120)
  t.equal(o.approximate.maxTreeSize, 1 << 20)
  t.equal(o.approximate.pruneTargetRatio, 0.8)
  t.equal(o.activeDecodeBlocksThreshold, null)
  t.equal(DEFAULT_MAX_BATCHED_TOKENS, 10_000_000)
  t.ok(Object.isFrozen(o))
  t.ok(Object.isFrozen(o.approximate))
  t.throws(() => {
    ;(o as { temperature: number }).temperature = 1
  })
})

t.test('values are kept and a resolved object resolves to itself', async (t) => {
  const o = resolveSchedulerOptions({ mode: 'power-of-two', queueThreshold: null, queuePolicy: 'wspt', seed: 3, approximate: { enabled: true, ttlSecs: 5 } })
  t.equal(o.mode, 'power-of-two')
  t.equal(o.queueThreshold, null)
  t.equal(o.queuePolicy, 'wspt')
  t.equal(o.seed, 3)
  t.equal(o.approximate.enabled, true)
  t.equal(o.approximate.ttlSecs, 5)
  t.same(resolveSchedulerOptions(o), o)
})

t.test('every invalid value is refused with a message naming the option and range', async (t) => {
  const cases: [Record<string, unknown>, RegExp][] = [
    [{ mode: 'fastest' }, /options\.mode must be one of kv\|round-robin\|random\|least-loaded\|power-of-two\|direct\|device-aware-weighted, got "fastest"/],
    [{ cost: 'cheapest' }, /options\.cost must be one of latency\|dynamo, got "cheapest"/],
    [{ blockSize: 0 }, /options\.blockSize must be an integer in \[1, 65536\], got 0/],
    [{ blockSize: 1.5 }, /options\.blockSize must be an integer/],
    [{ overlapScoreWeight: -1 }, /options\.overlapScoreWeight must be a number in \[0, ∞\), got -1/],
    [{ temperature: Number.NaN }, /options\.temperature must be a number/],
    [{ queueThreshold: -0.5 }, /options\.queueThreshold must be a number in \[0/],
    [{ queuePolicy: 'sjf' }, /options\.queuePolicy must be one of fcfs\|wspt\|lcfs/],
    [{ queueMaxPending: -1 }, /options\.queueMaxPending must be an integer/],
    [{ trackActiveBlocks: 'yes' }, /options\.trackActiveBlocks must be a boolean, got "yes"/],
    [{ staleRequestSecs: 0 }, /options\.staleRequestSecs must be a number in \(0, ∞\), got 0/],
    [{ activeDecodeBlocksThreshold: 1.5 }, /options\.activeDecodeBlocksThreshold must be a number in \[0, 1\]/],
    [{ cudaToCpuRatio: 0 }, /options\.cudaToCpuRatio must be a number in \(0/],
    [{ seed: -1 }, /options\.seed must be an integer/],
    [{ approximate: { ttlSecs: 0 } }, /options\.approximate\.ttlSecs must be a number in \(0/],
    [{ approximate: { pruneTargetRatio: 2 } }, /options\.approximate\.pruneTargetRatio must be a number in \[0, 1\]/],
    [{ approximate: { bogus: 1 } }, /options\.approximate\.bogus is not a scheduler option/],
    [{ approximate: null }, /options\.approximate must be an object/],
    [{ queueTreshold: 1 }, /options\.queueTreshold is not a scheduler option/],
    [{ seed: 2n }, /got 2n/],
  ]
  for (const [input, re] of cases) {
    try {
      resolveSchedulerOptions(input as never)
      t.fail(`accepted ${JSON.stringify(Object.keys(input))}`)
    } catch (err) {
      t.ok(err instanceof KvrError, 'a KvrError')
      t.equal((err as KvrError).code, 'KVR_ERR_INVALID_OPTION')
      t.match((err as Error).message, re)
    }
  }
  t.throws(() => resolveSchedulerOptions(null as never), { code: 'KVR_ERR_INVALID_OPTION' })
})
