// The decision benchmark (bench/lib/decisions.ts) on a small fleet: it checks every decision of the
// pruned selection against the full scan's (and reports none differed), measures another build's
// scheduler beside this one, and its two overlap models give the matched counts they describe.
import t from 'tap'
import { Scheduler } from '../../src/scheduler/scheduler.js'
import type { DecisionResult, SchedulerClass } from '../lib/decisions.js'
import { benchDecisions, benchDecisionSet, decisionTable, sizeRatios } from '../lib/decisions.js'

const SMALL = { reps: 2, ops: 300, warmup: 400, templates: 64 }

t.test('the pruned selection is checked against the full scan, and the other build measured beside it', async (t) => {
  const r = await benchDecisions({ ranks: 16, ranksPerWorker: 2, model: 'share' }, SMALL, Scheduler as unknown as SchedulerClass)
  t.equal(r.differed, 0, `${r.compared} decisions, none different`)
  // the booked decisions of the warm-up and the repetitions (each after 500 untimed ones), and the
  // unbooked ones of the timed operations
  t.equal(r.compared, 400 + 2 * (500 + 300) + 2 * 300)
  t.equal(r.pruned.reps.length, 2)
  t.equal(r.base?.reps.length, 2)
  t.equal(r.ratiosP50.length, 2)
  t.ok(r.pruned.p50Us > 0 && r.pruned.p99Us >= r.pruned.p50Us && r.pruned.selectP50Us > 0, 'figures measured')
  t.ok(r.population === 64 && r.matchedPerRequest > 0.5 && r.matchedPerRequest < 6, `about one in seven of 16 holds a prefix: ${r.matchedPerRequest}`)
  const lines = decisionTable([r], 2)
  t.match(lines[2] ?? '', /16 \(8×2\), share .* 2600\/2600$/)
})

t.test('the tenants model: nine worker-ranks hold each prompt at any size', async (t) => {
  const r = await benchDecisions({ ranks: 256, ranksPerWorker: 1, model: 'tenants' }, SMALL, null)
  t.equal(r.matchedPerRequest, 9)
  t.equal(r.differed, 0)
  t.equal(r.base, null)
  t.equal(r.ratioP50, null)
})

t.test('fleets past 64 worker-ranks over the 64-rank one, for this build and the other', async (t) => {
  const side = (p50Us: number, p99Us: number) => ({
    p50Us,
    p99Us,
    meanUs: p50Us,
    upkeepUs: 1,
    selectP50Us: p50Us / 2,
    selectP99Us: p99Us / 2,
    heapMB: 1,
    reps: [],
  })
  const result = (ranks: number, ranksPerWorker: number, p99: number, baseP99: number | null): DecisionResult => ({
    ranks,
    ranksPerWorker,
    model: 'tenants',
    ops: 1,
    population: 4 * ranks,
    matchedPerRequest: 9,
    pruned: side(p99 / 4, p99),
    fullScan: side(p99, p99),
    base: baseP99 === null ? null : side(baseP99 / 4, baseP99),
    ratiosP50: [],
    ratiosP99: [],
    ratioP50: null,
    ratioP99: null,
    compared: 1,
    differed: 0,
  })
  const r = sizeRatios([result(8, 1, 5, 5), result(64, 1, 10, 10), result(7000, 8, 18, 300)])
  t.equal(r.length, 1)
  t.match(r[0], { ranks: 7000, ranksPerWorker: 8, p99: 1.8, p50: 1.8, selectP99: 1.8, baseP99: 30, baseP50: 30 })
  t.same(sizeRatios([result(7000, 1, 18, null)]), [], 'nothing without the 64-rank fleet')
  t.match(decisionTable([result(64, 1, 10, null), result(7000, 8, 18, null)], 1).at(-1), /^7000 \(875×8\), tenants ÷ 64: p99 1\.80 \(bar ≤ 2\)/)
})

t.test('interleaved fleets: repetition by repetition, each checked against its full scan', async (t) => {
  const set = { reps: 3, ops: 200, warmup: 300, templates: 32 }
  const r = await benchDecisionSet(
    [
      { c: { ranks: 64, ranksPerWorker: 1, model: 'share' }, set },
      { c: { ranks: 128, ranksPerWorker: 4, model: 'tenants' }, set },
    ],
    null,
  )
  t.same(
    r.map((x) => [x.ranks, x.pruned.reps.length, x.differed]),
    [
      [64, 3, 0],
      [128, 3, 0],
    ],
  )
  const ratios = sizeRatios(r)
  t.equal(ratios.length, 1)
  const per = (r[1] as DecisionResult).pruned.reps.map((x, i) => x.p99Us / ((r[0] as DecisionResult).pruned.reps[i] as { p99Us: number }).p99Us)
  t.equal(ratios[0]?.p99, per.sort((a, b) => a - b)[1], 'the median of the repetitions’ ratios')
  await t.rejects(
    benchDecisionSet(
      [
        { c: { ranks: 8, ranksPerWorker: 1, model: 'share' }, set },
        { c: { ranks: 16, ranksPerWorker: 1, model: 'share' }, set: { ...set, reps: 2 } },
      ],
      null,
    ),
  )
})
