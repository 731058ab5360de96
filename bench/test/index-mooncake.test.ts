// bench:index --mooncake at a tiny size: the workload's counts add up, and the result carries
// every figure in both units, with values that follow from each other.
import t from 'tap'
import { expandTrace } from '../lib/mooncake-workload.js'
import { formatMooncakeTables, runMooncakeBench, sweepDurations, unitTotals, type Rates } from '../lib/index-mooncake.js'

t.test('expandTrace: length factor and duplication as Dynamo defines them; every id a full block', async (t) => {
  const trace = [
    { timestamp: 0, input_length: 1000, output_length: 10, hash_ids: [0, 1] },
    { timestamp: 5, input_length: 1500, output_length: 10, hash_ids: [0, 2, 3] },
  ]
  // ids 0..7 after stretching, so the copy is offset by 8
  const x = expandTrace(trace, 2, 2)
  t.same(
    x.map((r) => r.hash_ids),
    [
      [0, 1, 2, 3],
      [8, 9, 10, 11],
      [0, 1, 4, 5, 6, 7],
      [8, 9, 12, 13, 14, 15],
    ],
  )
  t.same(
    x.map((r) => r.input_length),
    [2048, 2048, 3072, 3072],
  )
})

t.test('sweepDurations: log-spaced from max down to min', async (t) => {
  t.same(sweepDurations(10, 1000, 3), [1000, 100, 10])
  t.same(sweepDurations(10, 1000, 0), [])
})

t.test('a tiny run: fields, units and sane values', async (t) => {
  // 128 blocks per engine make the engines evict, so removed events are in the workload too
  const r = await runMooncakeBench({ limit: 120, workers: 4, gpuBlocks: 128, reps: 1, sweepSteps: 2, shards: [1] })
  const c = r.workload.counts
  t.equal(c.requests, 120)
  t.equal(c.lookups, 120, 'one lookup per request')
  t.ok(c.storedEvents > 0 && c.removedEvents > 0, `${c.storedEvents} stored and ${c.removedEvents} removed events`)
  t.equal(c.events, c.storedEvents + c.removedEvents + c.clearedEvents)
  t.ok(c.storedBlocks >= c.removedBlocks)
  t.same(r.workload.totals, unitTotals(c))
  t.equal(r.workload.totals.dynamoOps, c.lookups + c.events)
  t.equal(r.workload.totals.dynamoBlockOps, c.lookupBlocks + c.storedBlocks)
  t.equal(r.workload.totals.kvrBlockOps, c.storedBlocks + c.removedBlocks)
  t.same(Object.keys(r.configurations), ['single-thread', 'single-thread, index only', '1-shard'])
  const finite = (x: Rates): boolean => Object.values(x).every((v) => Number.isFinite(v) && v > 0)
  for (const [name, x] of Object.entries(r.configurations)) {
    t.ok(x.seconds > 0 && finite(x.rates) && finite(x.per_thread), `${name}: positive rates`)
    t.equal(x.threads, 1)
    t.ok(Math.abs(x.rates.dynamo_ops_per_sec * x.seconds - r.workload.totals.dynamoOps) < 1e-6 * r.workload.totals.dynamoOps, `${name}: ops/s × s = ops`)
    t.ok(x.rates.dynamo_block_ops_per_sec > x.rates.dynamo_ops_per_sec, `${name}: more blocks than operations`)
    t.ok(x.lookup_us.p50 > 0 && x.lookup_us.p50 <= x.lookup_us.p99, `${name}: 0 < p50 ≤ p99`)
    t.ok(x.bytes_per_entry > 8 && x.bytes_per_entry < 4096, `${name}: ${x.bytes_per_entry} bytes per entry`)
    // what the index holds after a pass is what the engines hold: stored minus removed
    t.equal(x.entries, c.storedBlocks - c.removedBlocks, `${name}: entries after the pass`)
    t.ok(finite(x.cold.rates))
  }
  t.equal(r.sweep.durations_ms.length, 2)
  t.ok((r.sweep.durations_ms[0] as number) > (r.sweep.durations_ms[1] as number), 'offered load rises along the sweep')
  for (const [name, steps] of Object.entries(r.sweep.steps)) {
    t.equal(steps.length, 2, name)
    for (const s of steps) {
      t.ok(Math.abs(s.offered.dynamo_ops_per_sec - r.workload.totals.dynamoOps / (s.duration_ms / 1000)) < 1e-6 * s.offered.dynamo_ops_per_sec)
      // nothing finishes before the timeline is issued
      t.ok(s.achieved.dynamo_ops_per_sec <= s.offered.dynamo_ops_per_sec * 1.01, `${name} ${s.duration_ms} ms: achieved ≤ offered`)
      t.equal(s.kept_up, s.achieved.dynamo_ops_per_sec >= 0.95 * s.offered.dynamo_ops_per_sec)
    }
    const th = r.sweep.threshold[name]
    const kept = steps.filter((s) => s.kept_up)
    if (kept.length === 0) t.equal(th, null)
    else t.equal(th?.achieved.dynamo_ops_per_sec, Math.max(...kept.map((s) => s.achieved.dynamo_ops_per_sec)))
  }
  const text = formatMooncakeTables(r)
  for (const row of ['single-thread ', 'single-thread, index only', '1-shard', 'achieved vs offered', 'threshold']) t.match(text, row)
})
