// The engine model against Dynamo's published formulas, value by value.
import t from 'tap'
import { decodeMs, prefillMs, prefillTokens } from '../../src/scheduler/engine-model.js'

const close = (a: number, b: number, eps = 1e-9): boolean => Math.abs(a - b) <= eps * Math.max(1, Math.abs(b))

t.test('prefill: 4.209989e-7·T² + 1.518344e-2·T + 16.50142, and 0 when fully cached', async (t) => {
  // hand-computed values of the polynomial
  const cases: [number, number][] = [
    [1, 4.209989e-7 + 1.518344e-2 + 16.50142],
    [64, 4.209989e-7 * 4096 + 1.518344e-2 * 64 + 16.50142],
    [1000, 0.4209989 + 15.18344 + 16.50142],
    [8192, 4.209989e-7 * 8192 * 8192 + 1.518344e-2 * 8192 + 16.50142],
    [32768, 4.209989e-7 * 32768 * 32768 + 1.518344e-2 * 32768 + 16.50142],
  ]
  for (const [T, want] of cases) t.ok(close(prefillMs(T), want), `T=${T}: ${prefillMs(T)} = ${want}`)
  t.ok(close(prefillMs(1000), 32.1058589), 'T=1000 is 32.106 ms')
  t.ok(close(prefillMs(8192), 169.1369184, 1e-8), 'T=8192 is 169.137 ms')
  t.equal(prefillMs(0), 0, 'nothing to compute: no prefill cost')
  t.equal(prefillMs(-5), 0)
  // T = batch_size × (mean isl − mean cached prefix)
  t.equal(prefillTokens(4, 1000, 250), 3000)
  t.equal(prefillTokens(3, 512, 512), 0, 'fully cached batch')
  t.ok(close(prefillMs(prefillTokens(2, 700, 200)), prefillMs(1000)))
})

t.test('decode: −25.74·p² + 54.01·p + 5.74, floored at 1 ms', async (t) => {
  const cases: [number, number][] = [
    [0, 5.74],
    [0.1, -25.74 * 0.01 + 5.401 + 5.74],
    [0.5, -6.435 + 27.005 + 5.74],
    [0.9, -25.74 * 0.81 + 54.01 * 0.9 + 5.74],
    [1, 34.01],
  ]
  for (const [p, want] of cases) t.ok(close(decodeMs(p), want), `p=${p}: ${decodeMs(p)} = ${want}`)
  // the polynomial goes below 1 ms only outside [0, 1]: the floor still holds there
  t.equal(decodeMs(-0.2), 1, 'p=−0.2 gives −6.09: floored')
  t.equal(decodeMs(2.5), 1, 'p=2.5 gives −20.10: floored')
  t.ok(close(decodeMs(-0.05), 2.97515), 'p=−0.05 gives 2.975: above the floor, the polynomial')
  t.equal(decodeMs(-0.09), 1, 'p=−0.09 gives 0.67: floored')
})
