// Engine timing profiles: `default` is exactly the router's engine model; the others differ in
// shape (the prefill/decode balance, attention against the cached context), speeds divide
// durations, and a profile list assigns engines in turn or by counts. Then engines and a fleet
// running them, and the mocker's flag.
import t from 'tap'
import { decodeMs, prefillMs } from '../../../src/scheduler/engine-model.js'
import { PROFILES, PROFILE_NAMES, parseProfileList, timingsFor } from '../../../src/sim/mocker/profiles.js'
import { profileDecodeMs, profilePrefillMs, stepMs } from '../../../src/sim/mocker/timing.js'
import { MockEngine } from '../../../src/sim/mocker/engine.js'
import type { EngineOptions, StepReport } from '../../../src/sim/mocker/engine.js'
import { MockerFleet } from '../../../src/sim/mocker/fleet.js'
import { MockerArgError, parseMockerArgs } from '../../../src/sim/mocker/main.js'
import { isKvrError } from '../../../src/errors.js'

const close = (a: number, b: number, eps = 1e-12): boolean => Math.abs(a - b) <= eps * Math.max(1, Math.abs(b))

t.test('the default profile is the engine model, value for value', async (t) => {
  const p = PROFILES.default
  for (const T of [1, 7, 64, 1000, 4096, 8192, 30_000]) t.ok(close(profilePrefillMs(p, T, T * 5000), prefillMs(T)), `prefill T=${T}`)
  t.equal(profilePrefillMs(p, 0, 0), 0, 'nothing to compute: nothing to pay')
  for (const u of [-0.2, 0, 0.1, 0.5, 0.9, 1, 2.5]) t.ok(close(profileDecodeMs(p, u), decodeMs(u)), `decode p=${u}`)
  const s = { speedupRatio: 3, decodeSpeedupRatio: 2 }
  const c = { prefillTokens: 2048, prefillPairs: 1e9, decodes: 4, kvUsage: 0.4 }
  t.ok(close(stepMs(c, s), prefillMs(2048) / 3 + decodeMs(0.4) / 6), 'a step without a profile is a default step, context or not')
})

t.test('large: prefill and decode slow down by different factors, so the balance moves', async (t) => {
  const d = PROFILES.default
  const l = PROFILES.large
  const prefillRatio = profilePrefillMs(l, 2048, 0) / profilePrefillMs(d, 2048, 0)
  const decodeLow = profileDecodeMs(l, 0.05) / profileDecodeMs(d, 0.05)
  const decodeHigh = profileDecodeMs(l, 0.9) / profileDecodeMs(d, 0.9)
  t.ok(prefillRatio > 2.2 && prefillRatio < 2.6, `prefill of 2,048 tokens ${prefillRatio.toFixed(2)}× the default's`)
  t.ok(decodeLow > 1.8, `a decode step at low KV usage ${decodeLow.toFixed(2)}× (the weights dominate)`)
  t.ok(decodeHigh < decodeLow - 0.2, `at high usage ${decodeHigh.toFixed(2)}×: the KV-dependent part grew less`)
  t.ok(Math.abs(prefillRatio - decodeHigh) > 0.5, 'no single speed factor turns the default into it')
})

t.test('long-context: the same chunk costs more after a long cached prefix, and more than linearly', async (t) => {
  const p = PROFILES['long-context']
  const chunk = 1024
  const pairs = (from: number): number => chunk * from + (chunk * (chunk - 1)) / 2
  const fresh = profilePrefillMs(p, chunk, pairs(0))
  const after30k = profilePrefillMs(p, chunk, pairs(30_000))
  t.ok(after30k - fresh > 75 && after30k - fresh < 85, `+${(after30k - fresh).toFixed(1)} ms after 30,000 cached tokens (about 80)`)
  t.ok(close(fresh, prefillMs(chunk) + 2.6e-6 * pairs(0)), 'a fresh chunk: the default polynomial plus its own attention')
  // a whole fresh prompt: the attention term grows with the square of its length
  const whole = (n: number): number => profilePrefillMs(p, n, (n * (n - 1)) / 2) - prefillMs(n)
  t.ok(whole(16_000) / whole(8_000) > 3.9, 'doubling a fresh prompt quadruples its attention term')
})

t.test('a speed divides every duration of the engine', async (t) => {
  const s = { speedupRatio: 2, decodeSpeedupRatio: 1 }
  const c = { prefillTokens: 900, prefillPairs: 100_000, decodes: 3, kvUsage: 0.3 }
  for (const name of PROFILE_NAMES) {
    const full = stepMs(c, s, PROFILES[name], 1)
    t.ok(close(stepMs(c, s, PROFILES[name], 0.5), 2 * full), `${name} at half speed takes twice as long`)
    t.ok(close(stepMs(c, s, PROFILES[name], 4), full / 4), `${name} at 4× speed a quarter`)
  }
})

t.test('profile lists: dealt out in turn, or by counts that add up', async (t) => {
  t.same(parseProfileList('large'), [{ profile: 'large', speed: 1, count: null }])
  t.same(parseProfileList('default@0.5:2, large:1'), [
    { profile: 'default', speed: 0.5, count: 2 },
    { profile: 'large', speed: 1, count: 1 },
  ])
  t.same(
    timingsFor(parseProfileList('default,default@0.5,large'), 5).map((x) => `${x.profile}@${x.speed}`),
    ['default@1', 'default@0.5', 'large@1', 'default@1', 'default@0.5'],
    'in turn',
  )
  t.same(
    timingsFor(parseProfileList('large:1,default@0.25:3'), 4).map((x) => `${x.profile}@${x.speed}`),
    ['large@1', 'default@0.25', 'default@0.25', 'default@0.25'],
    'in order, by counts',
  )
  t.same(timingsFor([], 2), [
    { profile: 'default', speed: 1 },
    { profile: 'default', speed: 1 },
  ])
  const bad: [() => unknown, RegExp][] = [
    [() => parseProfileList('huge'), /unknown profile "huge" \(default, large, long-context\)/],
    [() => parseProfileList('large@0'), /speed of "large@0" must be in \(0, 1000\]/],
    [() => parseProfileList('large@fast'), /"large@fast" is not NAME\[@SPEED\]\[:COUNT\]/],
    [() => parseProfileList('large:0'), /count of "large:0" must be an integer ≥ 1/],
    [() => parseProfileList('large:2,default'), /a count on every entry or on none/],
    [() => parseProfileList(''), /"" is not NAME/],
    [() => timingsFor(parseProfileList('large:2,default:1'), 4), /add up to 3 engine\(s\), but there are 4/],
  ]
  for (const [f, re] of bad) {
    try {
      f()
      t.fail(`accepted: ${re}`)
    } catch (err) {
      t.ok(isKvrError(err) && err.code === 'KVR_ERR_INVALID_OPTION' && re.test(err.message), (err as Error).message)
    }
  }
})

/** One prompt of n tokens on a fresh engine; the first step's report. */
function firstStep(o: Partial<EngineOptions>, prefix: number[], n: number): StepReport {
  const e = new MockEngine({ workerId: 1n, autoStep: false, blockSize: 16, numGpuBlocks: 4096, maxNumBatchedTokens: 1024, ...o })
  if (prefix.length > 0) {
    e.submit(prefix, 1)
    e.runUntilIdle()
  }
  e.submit([...prefix, ...Array.from({ length: n }, (_, i) => 900_000 + i)], 1)
  return e.step() as StepReport
}

t.test('engines price their steps with their profile and speed', async (t) => {
  const prefix = Array.from({ length: 4096 }, (_, i) => i + 1)
  const fresh = firstStep({ profile: 'long-context' }, [], 512)
  const afterPrefix = firstStep({ profile: 'long-context' }, prefix, 512)
  t.equal(afterPrefix.prefillTokens, 512, 'only the new tokens are computed after the cached prefix')
  t.equal(afterPrefix.prefillPairs, 512 * 4096 + (512 * 511) / 2, 'each new token attends to the whole context before it')
  t.ok(afterPrefix.durationMs > fresh.durationMs + 5, `${afterPrefix.durationMs.toFixed(1)} ms after the prefix, ${fresh.durationMs.toFixed(1)} ms fresh`)
  const plain = firstStep({}, prefix, 512)
  t.ok(close(plain.durationMs, prefillMs(512)), 'the default engine ignores the context')
  const slow = firstStep({ speed: 0.5 }, prefix, 512)
  t.ok(close(slow.durationMs, 2 * plain.durationMs), 'an engine at half speed takes twice as long')
  t.throws(() => new MockEngine({ workerId: 1n, profile: 'huge' as 'large' }), { code: 'KVR_ERR_INVALID_OPTION', message: /engine profile must be one of/ })
  t.throws(() => new MockEngine({ workerId: 1n, speed: 0 }), { code: 'KVR_ERR_INVALID_OPTION', message: /engine speed must be a finite number > 0/ })
})

t.test('a fleet mixes profiles; the mocker flag checks the list against --num-workers', async (t) => {
  const fleet = await MockerFleet.start({ numWorkers: 3, speedupRatio: 0, engineProfiles: parseProfileList('large:1,default@0.5:2') })
  t.teardown(() => fleet.close())
  t.same(
    fleet.workers.map((w) => `${w.engine.config.profile}@${w.engine.config.speed}`),
    ['large@1', 'default@0.5', 'default@0.5'],
  )
  const cli = parseMockerArgs(['--num-workers', '4', '--engine-profile', 'large@0.5:2,long-context:2'])
  t.not(cli, 'help')
  if (cli !== 'help') t.same(cli.fleet.engineProfiles, parseProfileList('large@0.5:2,long-context:2'))
  t.throws(() => parseMockerArgs(['--num-workers', '3', '--engine-profile', 'large:2']), {
    message: '--engine-profile: the counts add up to 2 engine(s), but there are 3',
  })
  t.throws(() => parseMockerArgs(['--engine-profile', 'tiny']), new MockerArgError('--engine-profile: unknown profile "tiny" (default, large, long-context)'))
})
