// bench:fleet-sim: overlaps read from a KvIndex fed with the engines' own KV events route exactly
// as overlaps read from the engines' pools (the index is exact), fleets with dp ranks and copies
// of the slice are what the config says, engine profiles reach the engines and their classes' shares
// add up, and bad options exit 2 with the reason.
import t from 'tap'
import type { Test } from 'tap'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { repoRoot } from '../lib/common.js'

const SIM = join(repoRoot(), 'dist', 'bench', 'fleet-sim.js')

interface ClassResult {
  profile: string
  speed: number
  engines: number
  requests: number
  request_share: number
  uncached_prefill_share: number
  ttft_ms: { p50: number; p90: number; p99: number }
  true_speed: { prefill: number; decode: number }
  learned: { prefill_speed: number; decode_speed: number; engines_prefill_learned: number } | null
}
interface ModeResult {
  hit_rate: number
  ttft_ms: { p50: number; p90: number; p99: number }
  ttft_percentiles_ms: number[]
  itl_ms: { p50: number; p90: number; p99: number }
  tpot_ms: { p50: number; p90: number; p99: number }
  errors: number
  classes: Record<string, ClassResult>
  spread: number | null
  wall: {
    decisions: number
    find_matches_us: { p50: number } | null
    replayed_decision_us: { p50: number; p99: number } | null
    events: number
    block_ops: number
    index_bytes: number | null
  }
}
interface Result {
  hit_rate_bound: number
  config: { worker_ranks: number; requests: number; dp_size: number; duplicate: number; overlaps_from: string; engine_profile: string }
  modes: Record<string, ModeResult>
}

function run(t: Test, args: string[]): Result {
  const dir = mkdtempSync(join(tmpdir(), 'kvr-fleet-sim-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const out = join(dir, 'out.json')
  const r = spawnSync(process.execPath, [SIM, ...args, '--out', out], { encoding: 'utf8', timeout: 120_000 })
  t.equal(r.status, 0, `${args.join(' ')}: ${r.stderr}`)
  return JSON.parse(readFileSync(out, 'utf8')) as Result
}

t.test('overlaps from the index route exactly as overlaps from the engines', async (t) => {
  const args = ['--minutes', '3', '--modes', 'kv,kv-dynamo']
  const pools = run(t, args)
  const index = run(t, [...args, '--index'])
  t.equal(pools.config.overlaps_from, 'engines')
  t.equal(index.config.overlaps_from, 'index')
  for (const mode of ['kv', 'kv-dynamo']) {
    const a = pools.modes[mode] as ModeResult
    const b = index.modes[mode] as ModeResult
    t.ok(a.hit_rate > 0, `${mode}: some prefix was reused`)
    t.equal(b.hit_rate, a.hit_rate, `${mode}: same hit rate`)
    t.same(b.ttft_ms, a.ttft_ms, `${mode}: same TTFTs`)
    t.equal(b.spread, a.spread, `${mode}: same spread`)
    t.ok(b.wall.events > 0 && b.wall.block_ops >= b.wall.events, `${mode}: the index took the engines' events`)
    t.ok(b.wall.find_matches_us !== null, `${mode}: find_matches timed`)
    t.equal(a.wall.events, 0, `${mode}: no index without --index`)
  }
})

t.test('dp ranks and copies of the slice make the fleet and workload the config names', async (t) => {
  const one = run(t, ['--minutes', '1', '--modes', 'kv'])
  const r = run(t, ['--minutes', '1', '--modes', 'kv', '--workers', '2', '--dp-size', '4', '--duplicate', '3', '--index', '--replay-decisions'])
  t.equal(r.config.worker_ranks, 8)
  t.equal(r.config.requests, 3 * one.config.requests, 'three disjoint copies of the slice')
  t.ok(Math.abs(r.hit_rate_bound - one.hit_rate_bound) < 1e-9, 'disjoint copies keep the bound')
  const kv = r.modes.kv as ModeResult
  t.ok(kv.wall.decisions >= r.config.requests, 'every request decided at least once')
  t.ok(kv.hit_rate <= r.hit_rate_bound + 1e-9, 'no more hits than the bound')
  t.ok(kv.hit_rate > 0.8 * r.hit_rate_bound, 'ranks of one worker each hold their own cache')
  // the run fails when a replayed decision differs from the simulation's, so reaching here says they agree
  t.ok(kv.wall.replayed_decision_us !== null && kv.wall.replayed_decision_us.p99 >= kv.wall.replayed_decision_us.p50, 'decisions replayed and timed')
})

t.test('the pruned selection routes the trace as the full scan does, on a fleet with dp ranks', async (t) => {
  const r = run(t, ['--minutes', '2', '--workers', '4', '--dp-size', '4', '--duplicate', '2', '--modes', 'kv,kv-full-scan', '--index', '--replay-decisions'])
  const kv = r.modes.kv as ModeResult
  const full = r.modes['kv-full-scan'] as ModeResult
  t.ok(kv.hit_rate > 0)
  t.equal(kv.hit_rate, full.hit_rate, 'same hit rate')
  t.same(kv.ttft_ms, full.ttft_ms, 'same TTFTs')
  t.equal(kv.spread, full.spread, 'same spread')
  t.equal(kv.wall.decisions, full.wall.decisions, 'as many decisions')
})

t.test('bench:fleet-scale runs each size in its own process and draws the figure', async (t) => {
  const r = spawnSync(process.execPath, [join(repoRoot(), 'dist', 'bench', 'fleet-scale.js'), '--ranks', '8,16', '--minutes', '0.5', '--ranks-per-copy', '8'], {
    encoding: 'utf8',
    timeout: 120_000,
  })
  t.equal(r.status, 0, r.stderr)
  const j = JSON.parse(readFileSync(join(repoRoot(), 'bench', 'results', 'fleet-scale.json'), 'utf8')) as {
    results: { ranks: number; copies: number; modes: Record<string, ModeResult> }[]
  }
  t.same(
    j.results.map((x) => [x.ranks, x.copies]),
    [
      [8, 1],
      [16, 2],
    ],
  )
  for (const x of j.results) t.ok((x.modes.kv as ModeResult).wall.replayed_decision_us !== null, `${x.ranks}: replayed`)
  const svg = readFileSync(join(repoRoot(), 'bench', 'results', 'fleet-scale.svg'), 'utf8')
  t.match(svg, /^<svg /)
  t.equal((svg.match(/<polyline /g) ?? []).length, 5, 'a line per cost')
  const bad = spawnSync(process.execPath, [join(repoRoot(), 'dist', 'bench', 'fleet-scale.js'), '--ranks', '12'], { encoding: 'utf8', timeout: 30_000 })
  t.equal(bad.status, 2)
  t.match(bad.stderr, /--ranks: 12 is not a multiple of --dp-size 8/)
})

t.test('a mixed fleet: each class its profile, shares that add up, and kv-static runs', async (t) => {
  const r = run(t, ['--minutes', '1', '--workers', '4', '--load', '2', '--engine-profile', 'large:2,large@0.5:2', '--modes', 'kv,kv-static,round-robin'])
  t.equal(r.config.engine_profile, 'large:2,large@0.5:2')
  t.same(Object.keys(r.modes), ['kv', 'kv-static', 'round-robin'])
  const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0)
  for (const [mode, m] of Object.entries(r.modes)) {
    t.equal(m.errors, 0, `${mode}: every request finished`)
    t.equal(m.ttft_percentiles_ms.length, 101, `${mode}: TTFT percentiles 0..100`)
    t.ok(m.itl_ms.p50 > 0 && m.itl_ms.p90 >= m.itl_ms.p50, `${mode}: ITL measured`)
    t.ok(m.tpot_ms.p90 > 0, `${mode}: TPOT measured`)
    const cs = Object.entries(m.classes)
    t.same(
      cs.map(([label, c]) => [label, c.profile, c.speed, c.engines]),
      [
        ['large@1', 'large', 1, 2],
        ['large@0.5', 'large', 0.5, 2],
      ],
      `${mode}: the two classes`,
    )
    t.equal(sum(cs.map(([, c]) => c.requests)), r.config.requests, `${mode}: every request in a class`)
    t.ok(Math.abs(sum(cs.map(([, c]) => c.request_share)) - 1) < 1e-9, `${mode}: request shares add up to 1`)
    t.ok(Math.abs(sum(cs.map(([, c]) => c.uncached_prefill_share)) - 1) < 1e-9, `${mode}: prefill shares add up to 1`)
  }
  const kv = r.modes.kv as ModeResult
  const large = kv.classes['large@1'] as ClassResult
  const half = kv.classes['large@0.5'] as ClassResult
  t.ok(large.true_speed.prefill < 0.5 && large.true_speed.decode < 1, 'large is slower than the default model')
  t.ok(Math.abs(half.true_speed.prefill - large.true_speed.prefill / 2) < 1e-12, 'half speed: half the prefill speed')
  t.ok(large.learned !== null && large.learned.prefill_speed > 0 && large.learned.engines_prefill_learned > 0, 'kv learned the engines from the observations')
  t.equal((r.modes['kv-static'] as ModeResult).classes['large@1']?.learned, null, 'kv-static learns nothing')
  // round-robin deals the requests out evenly whatever the engines: the slow class answers later
  const rr = r.modes['round-robin'] as ModeResult
  const fast = rr.classes['large@1'] as ClassResult
  const slow = rr.classes['large@0.5'] as ClassResult
  t.ok(Math.abs(fast.request_share - 0.5) < 0.05, `round-robin: half the requests to each class (${fast.request_share})`)
  t.ok(slow.ttft_ms.p50 > fast.ttft_ms.p50, 'round-robin: the half-speed class has the longer TTFT')
})

t.test("a worker's dp ranks share its profile; the profile slows the engines", async (t) => {
  const r = run(t, ['--minutes', '0.5', '--workers', '2', '--dp-size', '2', '--load', '1', '--engine-profile', 'default,large@0.5', '--modes', 'round-robin'])
  const rr = r.modes['round-robin'] as ModeResult
  t.same(
    Object.entries(rr.classes).map(([label, c]) => [label, c.engines]),
    [
      ['default@1', 2],
      ['large@0.5', 2],
    ],
  )
  const def = run(t, ['--minutes', '0.5', '--workers', '4', '--load', '1', '--modes', 'round-robin'])
  const slow = run(t, ['--minutes', '0.5', '--workers', '4', '--load', '1', '--engine-profile', 'large@0.5', '--modes', 'round-robin'])
  const a = def.modes['round-robin'] as ModeResult
  const b = slow.modes['round-robin'] as ModeResult
  t.same(Object.keys(a.classes), ['default@1'])
  t.ok(b.ttft_ms.p50 > 2 * a.ttft_ms.p50, `TTFT p50: large@0.5 ${b.ttft_ms.p50} vs default ${a.ttft_ms.p50}`)
  t.ok(b.itl_ms.p50 > 2 * a.itl_ms.p50, `ITL p50: large@0.5 ${b.itl_ms.p50} vs default ${a.itl_ms.p50}`)
})

t.test('--objectives mix: each mode with and without objectives; kv sheds, the other modes only count them', async (t) => {
  const r = run(t, [
    '--minutes',
    '1',
    '--workers',
    '4',
    '--load',
    '3',
    '--engine-profile',
    'large:2,large@0.5:2',
    '--modes',
    'kv,round-robin',
    '--objectives',
    'mix:800:8000',
  ])
  t.same((r.config as unknown as { objectives: unknown }).objectives, { spec: 'mix', tight_ms: 800, loose_ms: 8000 })
  type Run = { met_share: number; tight_met_share: number; loose_met_share: number; shed: number; ttft_p90_ms: number }
  const of = (mode: string) => (r.modes[mode] as unknown as { objectives: { with: Run; without: Run } }).objectives
  const kv = of('kv')
  const rr = of('round-robin')
  for (const x of [kv.with, kv.without, rr.with, rr.without]) {
    for (const v of [x.met_share, x.tight_met_share, x.loose_met_share]) t.ok(v >= 0 && v <= 1, `a share: ${v}`)
    // half the requests tight, half loose (the slice's count is even or one more tight)
    t.ok(Math.abs(x.met_share - (x.tight_met_share + x.loose_met_share) / 2) < 0.01, 'met = the mean of tight and loose')
    t.ok(x.tight_met_share <= x.loose_met_share, 'a tight objective is met no more often than a loose one')
  }
  t.equal(kv.without.shed, 0, 'nothing shed without objectives')
  t.ok(kv.with.shed > 0, `kv sheds sheddable requests it cannot serve in time (${kv.with.shed})`)
  t.ok(kv.with.ttft_p90_ms < kv.without.ttft_p90_ms, `kv TTFT p90 ${kv.with.ttft_p90_ms} with vs ${kv.without.ttft_p90_ms} without`)
  t.same(rr.with, rr.without, 'round-robin only counts them: the same run')
  t.equal((r.modes.kv as ModeResult).ttft_ms.p90, kv.without.ttft_p90_ms, "the mode's main figures are the run without objectives")
})

t.test('bad options exit 2 with the reason', async (t) => {
  for (const [args, want] of [
    [['--dp-size', '0'], /--dp-size must be a number ≥ 1/],
    [['--duplicate', '1.5'], /--duplicate must be an integer/],
    [['--indexx'], /unknown option "--indexx"/],
    [['--engine-profile', 'huge'], /^bench:fleet-sim: --engine-profile: unknown profile "huge" \(default, large, long-context\)\n$/],
    [['--workers', '4', '--engine-profile', 'large:3'], /^bench:fleet-sim: --engine-profile: the counts add up to 3 engine\(s\), but there are 4\n$/],
    [['--engine-profile', 'large@0'], /--engine-profile: speed of "large@0" must be in \(0, 1000\]/],
    [['--modes', 'kv,kv-statik'], /--modes: unknown mode "kv-statik" \(one of kv, kv-static, /],
    [['--objectives', 'tight'], /--objectives must be mix or mix:TIGHT_MS:LOOSE_MS, got "tight"/],
    [['--objectives', 'mix:0:100'], /--objectives must be mix or mix:TIGHT_MS:LOOSE_MS/],
  ] as const) {
    const r = spawnSync(process.execPath, [SIM, ...args], { encoding: 'utf8', timeout: 30_000 })
    t.equal(r.status, 2, args.join(' '))
    t.match(r.stderr, want)
  }
})
