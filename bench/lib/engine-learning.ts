// The pure parts of bench:learning (bench/engine-learning.ts): its options, the fleets it runs,
// the load each fleet gets, and the targets evaluated on fleet-sim results, so a test
// can hold them against synthetic inputs.
import { PROFILES, parseProfileList, timingsFor } from '../../src/sim/mocker/profiles.js'
import { profilePrefillMs } from '../../src/sim/mocker/timing.js'

export const FLEETS = ['large', 'mixed', 'three-way', 'default'] as const
export type FleetName = (typeof FLEETS)[number]

export const ALL_MODES = ['kv', 'kv-static', 'kv-dynamo', 'kv-tuned', 'round-robin', 'random', 'least-loaded'] as const
export const DEFAULT_MODES = ['kv', 'kv-static', 'kv-dynamo', 'round-robin', 'least-loaded']

/** fleet-sim's step (its --chunk default): the prefill the fleets' capacities are compared on. */
const CHUNK = 8192

/**
 * The --engine-profile of a fleet of `n` workers, or an error when `n` is too small for it.
 * mixed: half `large`, half `large` at half speed (the larger half at full speed when n is odd).
 * three-way: a quarter `long-context` at 0.75 speed (at least one), the rest split between `large`
 * and `large@0.5` as in mixed: for 8 workers `large:3,large@0.5:3,long-context@0.75:2`, three
 * shapes of engine, one of them with a prefill the cost's polynomial cannot express (attention
 * against the cached context).
 */
export function fleetSpec(fleet: FleetName, n: number): string {
  switch (fleet) {
    case 'large':
      return 'large'
    case 'default':
      return 'default'
    case 'mixed':
      if (n < 2) throw new Error('the mixed fleet needs --workers ≥ 2')
      return `large:${Math.ceil(n / 2)},large@0.5:${Math.floor(n / 2)}`
    case 'three-way': {
      if (n < 3) throw new Error('the three-way fleet needs --workers ≥ 3')
      const lc = Math.max(1, Math.round(n / 4))
      const fast = Math.ceil((n - lc) / 2)
      return `large:${fast},large@0.5:${n - lc - fast},long-context@0.75:${lc}`
    }
  }
}

/**
 * The fleet's prefill capacity relative to a fleet of as many `default` engines: the mean over its
 * engines of speed × (default's time ÷ the profile's time) for one full step of prefill (CHUNK
 * tokens of a fresh prompt). A `large` engine is 0.44, at half speed 0.22.
 */
export function relativeCapacity(spec: string, n: number): number {
  const pairs = (CHUNK * (CHUNK - 1)) / 2
  const base = profilePrefillMs(PROFILES.default, CHUNK, pairs)
  const ts = timingsFor(parseProfileList(spec), n)
  return ts.reduce((sum, t) => sum + (t.speed * base) / profilePrefillMs(PROFILES[t.profile], CHUNK, pairs), 0) / ts.length
}

export interface LearningArgs {
  workers: number
  minutes: number
  /** Trace offsets (minutes) of the slices; the first is the one the bars are judged on. */
  offsets: number[]
  fleets: FleetName[]
  modes: string[]
  /** The default fleet's load multiplier; every other fleet gets it × its relative capacity. */
  load: number
  /** fleet-sim processes at once (the results do not depend on it: time is simulated). */
  jobs: number
  out: string | null
  svg: string | null
  replot: boolean
}

export const LEARNING_DEFAULTS = { workers: 8, minutes: 20, offsets: [0, 20], load: 8 }

/** Parses bench:learning's options; throws an Error whose message says what is wrong. */
export function parseLearningArgs(argv: readonly string[], maxJobs: number): LearningArgs {
  const known = ['--workers', '--minutes', '--offsets', '--fleets', '--modes', '--load', '--jobs', '--out', '--svg']
  const v = new Map<string, string>()
  let replot = false
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (a === '--replot') {
      replot = true
      continue
    }
    if (!known.includes(a)) throw new Error(`unknown option ${JSON.stringify(a)} (known: ${known.join(' ')} --replot)`)
    const value = argv[++i]
    if (value === undefined) throw new Error(`${a} needs a value`)
    v.set(a, value)
  }
  const number = (name: string, s: string, integer: boolean, min: number): number => {
    const n = Number(s)
    if (s.trim() === '' || !Number.isFinite(n) || n < min || (integer && !Number.isInteger(n)))
      throw new Error(`${name} must be ${integer ? 'an integer' : 'a number'} ≥ ${min}, got ${JSON.stringify(s)}`)
    return n
  }
  const opt = (name: string, dflt: number, integer: boolean, min: number): number => {
    const s = v.get(name)
    return s === undefined ? dflt : number(name, s, integer, min)
  }
  const list = (name: string, dflt: readonly string[]): string[] => {
    const s = v.get(name)
    if (s === undefined) return [...dflt]
    const xs = s.split(',').filter((x) => x !== '')
    if (xs.length === 0) throw new Error(`${name} needs at least one entry`)
    if (new Set(xs).size !== xs.length) throw new Error(`${name}: ${JSON.stringify(s)} names an entry twice`)
    return xs
  }
  const fleets = list('--fleets', FLEETS)
  for (const f of fleets)
    if (!(FLEETS as readonly string[]).includes(f)) throw new Error(`--fleets: unknown fleet ${JSON.stringify(f)} (one of ${FLEETS.join(', ')})`)
  const modes = list('--modes', DEFAULT_MODES)
  for (const m of modes)
    if (!(ALL_MODES as readonly string[]).includes(m)) throw new Error(`--modes: unknown mode ${JSON.stringify(m)} (one of ${ALL_MODES.join(', ')})`)
  const workers = opt('--workers', LEARNING_DEFAULTS.workers, true, 1)
  for (const f of fleets) fleetSpec(f as FleetName, workers)
  return {
    workers,
    minutes: opt('--minutes', LEARNING_DEFAULTS.minutes, false, 0.001),
    offsets: list('--offsets', LEARNING_DEFAULTS.offsets.map(String)).map((s) => number('--offsets', s, false, 0)),
    fleets: fleets as FleetName[],
    modes,
    load: opt('--load', LEARNING_DEFAULTS.load, false, 0.001),
    jobs: opt('--jobs', Math.max(1, Math.min(2, maxJobs)), true, 1),
    out: v.get('--out') ?? null,
    svg: v.get('--svg') ?? null,
    replot,
  }
}

/** The fields of a fleet-sim mode result the bars read. */
export interface ModeFigures {
  hit_rate: number
  hit_rate_over_bound: number
  ttft_ms: { p90: number | null }
  errors: number
}

/** One fleet-sim run: a fleet on a slice, its modes. */
export interface FleetRun {
  fleet: FleetName
  offset: number
  hit_rate_bound: number
  modes: Record<string, ModeFigures>
}

export interface Bar {
  bar: string
  value: string
  target: string
  /** null: a figure it needs was not measured (its fleet or mode not in the run). */
  pass: boolean | null
}

const ratio = (x: number | null | undefined, y: number | null | undefined): number | null =>
  x === null || x === undefined || y === null || y === undefined || !(y > 0) ? null : x / y

/** A bar on a ratio of two figures: pass when a ≤ limit × b. */
function ratioBar(bar: string, a: number | null | undefined, b: number | null | undefined, limit: number, names: [string, string]): Bar {
  const r = ratio(a, b)
  return {
    bar,
    value: r === null ? 'n/a' : `${(a as number).toFixed(0)} vs ${(b as number).toFixed(0)} ms (${r.toFixed(3)})`,
    target: `${names[0]} ≤ ${limit} × ${names[1]}`,
    pass: r === null ? null : r <= limit,
  }
}

function hitBar(fleet: string, kv: ModeFigures | undefined): Bar {
  return {
    bar: `${fleet}: kv hit rate ≥ 0.90 × bound`,
    value: kv === undefined ? 'n/a' : `${(kv.hit_rate * 100).toFixed(1)}% (${kv.hit_rate_over_bound.toFixed(3)} × bound)`,
    target: '≥ 0.90',
    pass: kv === undefined ? null : kv.hit_rate_over_bound >= 0.9,
  }
}

/**
 * The targets on the runs of one slice: on the mixed fleet, kv's hit rate ≥ 0.90 × the bound,
 * its p90 TTFT ≤ 0.85 × kv-static's and ≤ 0.80 × kv-dynamo's, and no errors in any mode; on the
 * default fleet, kv's hit rate ≥ 0.90 × the bound and its p90 TTFT ≤ 0.25 × round-robin's.
 */
export function evaluateBars(runs: readonly FleetRun[], offset: number): Bar[] {
  const of = (fleet: FleetName): FleetRun | undefined => runs.find((r) => r.fleet === fleet && r.offset === offset)
  const p90 = (run: FleetRun | undefined, mode: string): number | null | undefined => run?.modes[mode]?.ttft_ms.p90
  const mixed = of('mixed')
  const def = of('default')
  const errors = mixed === undefined ? [] : Object.entries(mixed.modes)
  return [
    hitBar('mixed', mixed?.modes.kv),
    ratioBar('mixed: kv p90 TTFT ≤ 0.85 × kv-static', p90(mixed, 'kv'), p90(mixed, 'kv-static'), 0.85, ['kv', 'kv-static']),
    ratioBar('mixed: kv p90 TTFT ≤ 0.80 × kv-dynamo', p90(mixed, 'kv'), p90(mixed, 'kv-dynamo'), 0.8, ['kv', 'kv-dynamo']),
    {
      bar: 'mixed: zero errors in every mode',
      value: errors.length === 0 ? 'n/a' : errors.map(([m, f]) => `${m} ${f.errors}`).join(', '),
      target: '0',
      pass: errors.length === 0 ? null : errors.every(([, f]) => f.errors === 0),
    },
    hitBar('default', def?.modes.kv),
    ratioBar('default: kv p90 TTFT ≤ 0.25 × round-robin', p90(def, 'kv'), p90(def, 'round-robin'), 0.25, ['kv', 'round-robin']),
  ]
}

export function barResult(b: Bar): string {
  return b.pass === null ? 'n/a' : b.pass ? 'PASS' : 'FAIL'
}
