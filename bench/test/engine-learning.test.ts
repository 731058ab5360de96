// bench:learning: the fleets it builds for a number of workers, the load each gets, its options,
// and the targets judged on synthetic fleet-sim results.
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { join } from 'node:path'
import { repoRoot } from '../lib/common.js'
import { barResult, evaluateBars, fleetSpec, parseLearningArgs, relativeCapacity } from '../lib/engine-learning.js'
import type { FleetName, FleetRun, ModeFigures } from '../lib/engine-learning.js'
import { parseProfileList, timingsFor } from '../../src/sim/mocker/profiles.js'

t.test('fleets: the specs for 8 workers, and counts that add up for any size', async (t) => {
  t.equal(fleetSpec('large', 8), 'large')
  t.equal(fleetSpec('default', 8), 'default')
  t.equal(fleetSpec('mixed', 8), 'large:4,large@0.5:4')
  t.equal(fleetSpec('three-way', 8), 'large:3,large@0.5:3,long-context@0.75:2')
  t.equal(fleetSpec('mixed', 5), 'large:3,large@0.5:2')
  for (let n = 3; n <= 20; n++)
    for (const f of ['large', 'mixed', 'three-way', 'default'] as FleetName[]) {
      const ts = timingsFor(parseProfileList(fleetSpec(f, n)), n)
      t.equal(ts.length, n, `${f} ${n}`)
      if (f === 'three-way') t.equal(new Set(ts.map((x) => `${x.profile}@${x.speed}`)).size, 3, `three-way ${n}: three classes`)
    }
  t.throws(() => fleetSpec('three-way', 2), /--workers ≥ 3/)
  t.throws(() => fleetSpec('mixed', 1), /--workers ≥ 2/)
})

t.test('relative capacity: default 1, speed scales it, large is slower', async (t) => {
  t.equal(relativeCapacity('default', 8), 1)
  const large = relativeCapacity('large', 8)
  t.ok(large > 0.35 && large < 0.5, `large ${large}`)
  t.ok(Math.abs(relativeCapacity('large@0.5', 8) - large / 2) < 1e-12)
  t.ok(Math.abs(relativeCapacity(fleetSpec('mixed', 8), 8) - 0.75 * large) < 1e-12)
  const lc = relativeCapacity('long-context', 4)
  t.ok(lc < 1 && lc > large, `long-context ${lc}: slower than default (attention), faster than large`)
})

t.test('options: defaults, values, and what is refused', async (t) => {
  const d = parseLearningArgs([], 2)
  t.same(d.fleets, ['large', 'mixed', 'three-way', 'default'])
  t.same(d.modes, ['kv', 'kv-static', 'kv-dynamo', 'round-robin', 'least-loaded'])
  t.same([d.workers, d.minutes, d.offsets, d.load, d.jobs, d.out, d.svg, d.replot], [8, 20, [0, 20], 8, 2, null, null, false])
  t.equal(parseLearningArgs([], 1).jobs, 1, 'no more jobs than cores')
  const a = parseLearningArgs(['--workers', '4', '--fleets', 'mixed,default', '--modes', 'kv,kv-static', '--offsets', '10', '--minutes', '5', '--replot'], 8)
  t.same([a.workers, a.fleets, a.modes, a.offsets, a.minutes, a.replot], [4, ['mixed', 'default'], ['kv', 'kv-static'], [10], 5, true])
  for (const [argv, want] of [
    [['--fleets', 'mixed,huge'], /--fleets: unknown fleet "huge"/],
    [['--modes', 'kv,kv-statik'], /--modes: unknown mode "kv-statik"/],
    [['--fleets', 'mixed,mixed'], /--fleets: "mixed,mixed" names an entry twice/],
    [['--workers', '2'], /three-way fleet needs --workers ≥ 3/],
    [['--workers', '2.5'], /--workers must be an integer ≥ 1/],
    [['--offsets', '0,-5'], /--offsets must be a number ≥ 0/],
    [['--jobs', '0'], /--jobs must be an integer ≥ 1/],
    [['--modes', ''], /--modes needs at least one entry/],
    [['--load'], /--load needs a value/],
    [['--minute', '5'], /unknown option "--minute"/],
  ] as const)
    t.throws(() => parseLearningArgs(argv, 2), want, argv.join(' '))
})

t.test('the script exits 2 with the reason on a bad option', async (t) => {
  const r = spawnSync(process.execPath, [join(repoRoot(), 'dist', 'bench', 'engine-learning.js'), '--fleets', 'huge'], { encoding: 'utf8', timeout: 30_000 })
  t.equal(r.status, 2)
  t.match(r.stderr, /^bench:learning: --fleets: unknown fleet "huge" \(one of large, mixed, three-way, default\)\n$/)
})

const fig = (hitOverBound: number, p90: number, errors = 0): ModeFigures => ({
  hit_rate: hitOverBound * 0.3,
  hit_rate_over_bound: hitOverBound,
  ttft_ms: { p90 },
  errors,
})

/** Runs on the first slice that meet every bar, with `edit` applied. */
function runs(edit: (mixed: Record<string, ModeFigures>, def: Record<string, ModeFigures>) => void): FleetRun[] {
  const mixed = { kv: fig(0.95, 1000), 'kv-static': fig(0.95, 1200), 'kv-dynamo': fig(0.7, 1300), 'round-robin': fig(0.4, 20000) }
  const def = { kv: fig(0.97, 700), 'kv-static': fig(0.97, 700), 'round-robin': fig(0.35, 3000) }
  edit(mixed, def)
  return [
    { fleet: 'mixed', offset: 0, hit_rate_bound: 0.3, modes: mixed },
    { fleet: 'default', offset: 0, hit_rate_bound: 0.3, modes: def },
    // another slice where everything fails: must not leak into slice 0's bars
    { fleet: 'mixed', offset: 20, hit_rate_bound: 0.3, modes: { kv: fig(0.5, 9000, 3), 'kv-static': fig(0.5, 100), 'kv-dynamo': fig(0.5, 100) } },
  ]
}

const results = (rs: FleetRun[], offset = 0): string[] => evaluateBars(rs, offset).map(barResult)

t.test('bars: each can pass and each can fail', async (t) => {
  t.same(results(runs(() => {})), ['PASS', 'PASS', 'PASS', 'PASS', 'PASS', 'PASS'])
  t.same(
    results(
      runs(() => {}),
      20,
    ),
    ['FAIL', 'FAIL', 'FAIL', 'FAIL', 'n/a', 'n/a'],
    'slice 20: its own runs, no default fleet',
  )
  const one = (edit: Parameters<typeof runs>[0]): string[] => results(runs(edit))
  t.same(
    one((m) => (m.kv = fig(0.89, 1000))),
    ['FAIL', 'PASS', 'PASS', 'PASS', 'PASS', 'PASS'],
    'mixed hit rate below 0.90 × bound',
  )
  t.same(
    one((m) => (m['kv-static'] = fig(0.95, 1100))),
    ['PASS', 'FAIL', 'PASS', 'PASS', 'PASS', 'PASS'],
    'kv 0.91 × kv-static',
  )
  t.same(
    one((m) => (m['kv-static'] = fig(0.95, 1000 / 0.849))),
    ['PASS', 'PASS', 'PASS', 'PASS', 'PASS', 'PASS'],
    'kv 0.849 × kv-static',
  )
  t.same(
    one((m) => (m['kv-dynamo'] = fig(0.7, 1200))),
    ['PASS', 'PASS', 'FAIL', 'PASS', 'PASS', 'PASS'],
    'kv 0.83 × kv-dynamo',
  )
  t.same(
    one((m) => (m['round-robin'] = fig(0.4, 20000, 1))),
    ['PASS', 'PASS', 'PASS', 'FAIL', 'PASS', 'PASS'],
    'an error in any mode',
  )
  t.same(
    one((_, d) => (d.kv = fig(0.85, 700))),
    ['PASS', 'PASS', 'PASS', 'PASS', 'FAIL', 'PASS'],
    'default hit rate',
  )
  t.same(
    one((_, d) => (d.kv = fig(0.97, 800))),
    ['PASS', 'PASS', 'PASS', 'PASS', 'PASS', 'FAIL'],
    'default kv 0.27 × round-robin',
  )
})

t.test('bars: a figure not measured is n/a, not a pass', async (t) => {
  t.same(
    results(
      runs((m, d) => {
        delete m['kv-static']
        delete d['round-robin']
      }),
    ),
    ['PASS', 'n/a', 'PASS', 'PASS', 'PASS', 'n/a'],
  )
  t.same(results([]), ['n/a', 'n/a', 'n/a', 'n/a', 'n/a', 'n/a'])
  const bars = evaluateBars(
    runs(() => {}),
    0,
  )
  t.match(bars[1]?.value, /^1000 vs 1200 ms \(0\.833\)$/)
})
