// The decision benchmark (bench/lib/decisions.ts) on a small fleet: it checks every decision of the
// pruned selection against the full scan's (and reports none differed), measures another build's
// scheduler beside this one, and its two overlap models give the matched counts they describe.
import t from 'tap'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import type { SchedulerClass } from '../lib/decisions.js'
import { benchDecisions, decisionTable } from '../lib/decisions.js'

const SMALL = { reps: 2, ops: 300, warmup: 400, templates: 64 }

t.test('the pruned selection is checked against the full scan, and the other build measured beside it', async (t) => {
  const r = await benchDecisions({ ranks: 16, ranksPerWorker: 2, model: 'share' }, SMALL, Scheduler as unknown as SchedulerClass)
  t.equal(r.differed, 0, `${r.compared} decisions, none different`)
  // the booked decisions of the warm-up and the repetitions, and the unbooked ones of the repetitions
  t.equal(r.compared, 400 + 2 * 300 * 2)
  t.equal(r.pruned.reps.length, 2)
  t.equal(r.base?.reps.length, 2)
  t.equal(r.ratiosP50.length, 2)
  t.ok(r.pruned.p50Us > 0 && r.pruned.p99Us >= r.pruned.p50Us && r.pruned.selectP50Us > 0, 'figures measured')
  t.ok(r.population === 64 && r.matchedPerRequest > 0.5 && r.matchedPerRequest < 6, `about one in seven of 16 holds a prefix: ${r.matchedPerRequest}`)
  const lines = decisionTable([r], 2)
  t.match(lines[2] ?? '', /16 \(8×2\), share .* 1600\/1600$/)
})

t.test('the tenants model: nine worker-ranks hold each prompt at any size', async (t) => {
  const r = await benchDecisions({ ranks: 256, ranksPerWorker: 1, model: 'tenants' }, SMALL, null)
  t.equal(r.matchedPerRequest, 9)
  t.equal(r.differed, 0)
  t.equal(r.base, null)
  t.equal(r.ratioP50, null)
})
