// The allocation-free histogram against prom-client's own, which is the exposition it replaces.
import t from 'tap'
import { Histogram, Registry } from 'prom-client'
import { BoundHistogram } from '../../src/metrics/histogram.js'

t.test('the same exposition as a labelled prom-client Histogram', async (t) => {
  const bounds = [0.01, 0.1, 1, 10]
  const labels = { dynamo_namespace: 'ns', dynamo_component: 'backend' }
  const a = new Registry()
  const b = new Registry()
  const mine = new BoundHistogram('x_seconds', 'help text', labels, bounds, a)
  const theirs = new Histogram({ name: 'x_seconds', help: 'help text', labelNames: Object.keys(labels), buckets: bounds, registers: [b] }).labels(labels)
  t.match(await a.metrics(), 'x_seconds_bucket{le="+Inf",dynamo_namespace="ns",dynamo_component="backend"} 0', 'zero series before the first observation')
  let x = 12345
  for (let i = 0; i < 2000; i++) {
    x = (x * 1103515245 + 12345) % 2147483648
    // values on and around the bounds, below the first and above the last
    const v = i % 10 === 0 ? (bounds[i % 4] as number) : (x / 2147483648) * 20 - 0.5
    mine.observe(v)
    theirs.observe(v)
  }
  t.equal(await a.metrics(), await b.metrics(), 'after 2000 observations')
  mine.reset()
  t.match(await a.metrics(), 'x_seconds_count{dynamo_namespace="ns",dynamo_component="backend"} 0')
})

t.test('NaN is counted in +Inf and leaves the sum alone; bounds must increase', async (t) => {
  const r = new Registry()
  const h = new BoundHistogram('y', 'h', {}, [1, 2], r)
  h.observe(1.5)
  h.observe(Number.NaN)
  const text = await r.metrics()
  t.match(text, 'y_bucket{le="2"} 1')
  t.match(text, 'y_bucket{le="+Inf"} 2')
  t.match(text, 'y_sum 1.5')
  t.throws(() => new BoundHistogram('z', 'h', {}, [2, 1], r), /bounds must increase/)
})
