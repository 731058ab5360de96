// bench:replicas without its processes: the command line, the counters read from /metrics, the targets.
import t from 'tap'
import { ArgError, counterSum, DEFAULTS, parseReplicasArgs, replicaBars, SETUPS, SHARED_INDEX_SETUPS, setupsOf, sharedIndexBars } from '../lib/replicas.js'

t.test('the three setups, in the order they run', async (t) => {
  t.same(
    SETUPS.map((s) => [s.key, s.replicas, s.sync]),
    [
      ['one', 1, false],
      ['two', 2, false],
      ['two-sync', 2, true],
    ],
  )
})

t.test('parseReplicasArgs: bench:e2e’s defaults, the options, and one message per mistake', async (t) => {
  const d = parseReplicasArgs([])
  t.same([d.minutes, d.workers, d.speedup, d.load, d.capacityFactor, d.maxInFlight, d.trace, d.routerArgs], [20, 8, 1.5, 8, 1.25, 2048, null, []])
  t.equal(DEFAULTS.minutes, 20)
  const a = parseReplicasArgs([
    '--minutes',
    '2',
    '--workers=4',
    '--speedup',
    '2',
    '--load',
    '3.5',
    '--trace',
    'x.jsonl',
    '--router-args',
    ' --router-temperature 0.5 ',
  ])
  t.same([a.minutes, a.workers, a.speedup, a.load, a.trace, a.routerArgs], [2, 4, 2, 3.5, 'x.jsonl', ['--router-temperature', '0.5']])
  t.equal(parseReplicasArgs(['--full']).minutes, null)
  const bad: [string[], RegExp][] = [
    [['--modes', 'kv'], /unknown option "--modes"/],
    [['--workers', '2.5'], /--workers must be a positive integer, got "2.5"/],
    [['--load', '0'], /--load must be a positive number/],
    [['--minutes'], /--minutes needs a value/],
    [['--full', '--minutes', '3'], /exclude each other/],
  ]
  for (const [argv, msg] of bad) t.throws(() => parseReplicasArgs(argv), { constructor: ArgError, message: msg }, argv.join(' '))
})

t.test('counterSum: every sample of the counter, or those with the labels; null when it is absent', async (t) => {
  const text = [
    '# HELP kvrouter_replica_races_total races',
    '# TYPE kvrouter_replica_races_total counter',
    'kvrouter_replica_races_total 7',
    'kvrouter_replica_races_total_other 100',
    'dynamo_frontend_requests_total{model="m",endpoint="completions",request_type="stream",status="200"} 12',
    'dynamo_frontend_requests_total{model="m",endpoint="completions",request_type="stream",status="503"} 3',
  ].join('\n')
  t.equal(counterSum(text, 'kvrouter_replica_races_total'), 7, 'not a metric whose name only begins alike')
  t.equal(counterSum(text, 'dynamo_frontend_requests_total'), 15)
  t.equal(counterSum(text, 'dynamo_frontend_requests_total', 'status="200"'), 12)
  t.equal(counterSum(text, 'kvrouter_replica_peers'), null)
})

t.test('replicaBars: sync against one replica, and errors anywhere', async (t) => {
  const one = { hitRate: 0.3, ttftP90: 1000, errors: 0 }
  const pass = replicaBars({ one, two: { hitRate: 0.2, ttftP90: 3000, errors: 0 }, 'two-sync': { hitRate: 0.285, ttftP90: 1150, errors: 0 } })
  t.same(
    pass.map((b) => b.pass),
    [true, true, true],
    'at the bars exactly: 0.95 × and 1.15 ×',
  )
  t.match(pass[0]?.value, /28\.5% vs 30\.0% \(0\.950\)/)
  const fail = replicaBars({ one, two: { hitRate: 0.3, ttftP90: 1000, errors: 2 }, 'two-sync': { hitRate: 0.28, ttftP90: 1200, errors: 0 } })
  t.same(
    fail.map((b) => b.pass),
    [false, false, false],
  )
  t.match(fail[2]?.value, 'two 2')
  const missing = replicaBars({ one: { hitRate: null, ttftP90: null, errors: 5 }, 'two-sync': { hitRate: 0.3, ttftP90: 900, errors: 0 } })
  t.same(
    missing.map((b) => b.pass),
    [null, null, false],
    'a figure missing is no verdict',
  )
})

t.test('shared-index setups: local and shared at 2 and 4 replicas, synced; --setups picks the list', async (t) => {
  t.same(
    SHARED_INDEX_SETUPS.map((s) => [s.key, s.replicas, s.sync, s.index]),
    [
      ['local-2', 2, true, 'zmq'],
      ['shared-2', 2, true, 'shared'],
      ['local-4', 4, true, 'zmq'],
      ['shared-4', 4, true, 'shared'],
    ],
  )
  t.equal(parseReplicasArgs([]).setups, 'sync')
  t.equal(parseReplicasArgs(['--setups', 'shared-index']).setups, 'shared-index')
  t.throws(() => parseReplicasArgs(['--setups', 'both']), /--setups must be one of sync, shared-index or setup keys/)
  t.equal(parseReplicasArgs(['--setups', 'local-4,shared-4']).setups, 'local-4,shared-4')
  t.same(
    setupsOf('local-4,shared-4').map((x) => x.key),
    ['local-4', 'shared-4'],
  )
  t.same(setupsOf('one,nope'), [])
})

t.test('sharedIndexBars: hit rate, p90 TTFT and event CPU of 4 shared against 4 local', async (t) => {
  const pass = sharedIndexBars({
    'local-4': { hitRate: 0.5, ttftP90: 1000, errors: 0, observerCpuS: 21, observerEventCpuS: 20 },
    'shared-4': { hitRate: 0.49, ttftP90: 1090, errors: 0, observerCpuS: 2, observerEventCpuS: 1.5 },
  })
  t.same(
    pass.map((b) => b.pass),
    [true, true, true, true],
  )
  const fail = sharedIndexBars({
    'local-4': { hitRate: 0.5, ttftP90: 1000, errors: 0, observerCpuS: 21, observerEventCpuS: 20 },
    'shared-4': { hitRate: 0.48, ttftP90: 1110, errors: 2, observerCpuS: 3, observerEventCpuS: 2.5 },
  })
  t.same(
    fail.map((b) => b.pass),
    [false, false, false, false],
  )
  t.same(
    sharedIndexBars({}).map((b) => b.pass),
    [null, null, null, true],
  )
  // below the tick resolution the shared figure counts as the resolution, not as zero
  const tiny = sharedIndexBars({
    'local-4': { hitRate: 0.5, ttftP90: 1000, errors: 0, observerEventCpuS: 0.15 },
    'shared-4': { hitRate: 0.5, ttftP90: 1000, errors: 0, observerEventCpuS: 0 },
  })
  t.equal(tiny[2]?.pass, false, '0.15 s is not 10 × the 0.02 s resolution')
  t.match(tiny[2]?.value, /< 0\.02/)
})
