// A simulated engine's step time: the engine model scaled by the speedup options.
import t from 'tap'
import { decodeMs, prefillMs } from '../../../src/scheduler/engine-model.js'
import { stepMs } from '../../../src/sim/mocker/timing.js'

const close = (a: number, b: number, eps = 1e-9): boolean => Math.abs(a - b) <= eps * Math.max(1, Math.abs(b))

t.test('a step: prefill ÷ speedup, decode ÷ (speedup × decode speedup), summed when mixed', async (t) => {
  const s1 = { speedupRatio: 1, decodeSpeedupRatio: 1 }
  t.equal(stepMs({ prefillTokens: 0, prefillPairs: 0, decodes: 0, kvUsage: 0.3 }, s1), 0, 'an empty step costs nothing')
  t.ok(close(stepMs({ prefillTokens: 1000, prefillPairs: 0, decodes: 0, kvUsage: 0.3 }, s1), prefillMs(1000)), 'prefill only')
  t.ok(close(stepMs({ prefillTokens: 0, prefillPairs: 0, decodes: 7, kvUsage: 0.3 }, s1), decodeMs(0.3)), 'decode only: one pass however many decodes')
  t.ok(close(stepMs({ prefillTokens: 1000, prefillPairs: 0, decodes: 7, kvUsage: 0.3 }, s1), prefillMs(1000) + decodeMs(0.3)), 'mixed: the sum')
  const s = { speedupRatio: 4, decodeSpeedupRatio: 2.5 }
  t.ok(close(stepMs({ prefillTokens: 2048, prefillPairs: 0, decodes: 0, kvUsage: 0.5 }, s), prefillMs(2048) / 4))
  t.ok(close(stepMs({ prefillTokens: 0, prefillPairs: 0, decodes: 1, kvUsage: 0.5 }, s), decodeMs(0.5) / 10))
  t.ok(close(stepMs({ prefillTokens: 2048, prefillPairs: 0, decodes: 3, kvUsage: 0.5 }, s), prefillMs(2048) / 4 + decodeMs(0.5) / 10))
  // the floor applies to the modelled time, before the speedup
  t.ok(close(stepMs({ prefillTokens: 0, prefillPairs: 0, decodes: 1, kvUsage: 3 }, { speedupRatio: 10, decodeSpeedupRatio: 1 }), 0.1))
  t.equal(
    stepMs({ prefillTokens: 5000, prefillPairs: 0, decodes: 5, kvUsage: 0.9 }, { speedupRatio: 0, decodeSpeedupRatio: 1 }),
    0,
    'speedup 0: no sleeping at all',
  )
})
