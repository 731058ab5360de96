// The parts of bench:replicas that need no process: its setups, its command line, the counters
// it reads from the replicas' /metrics, and its targets.

/**
 * Where the replicas' index comes from: `nats` — each replica indexes the KV events the engines
 * publish on NATS (engines found in etcd); `zmq` — each replica subscribes to every engine's own
 * ZMQ stream; `shared` — the replicas ask one `kv-router indexer` (--indexer-url), which alone
 * subscribes to the engines' ZMQ streams.
 */
export type IndexSource = 'nats' | 'zmq' | 'shared'

/** One way of running the routers behind HAProxy; every setup gets the same fleet and load. */
export interface Setup {
  key: string
  label: string
  replicas: number
  sync: boolean
  index: IndexSource
}

/** Replica sync against one router (`--setups sync`, the default). */
export const SETUPS: readonly Setup[] = [
  { key: 'one', label: '1 replica', replicas: 1, sync: false, index: 'nats' },
  { key: 'two', label: '2 replicas, no sync', replicas: 2, sync: false, index: 'nats' },
  { key: 'two-sync', label: '2 replicas, sync', replicas: 2, sync: true, index: 'nats' },
]

/** Local indexes against one shared indexer (`--setups shared-index`), synced replicas throughout. */
export const SHARED_INDEX_SETUPS: readonly Setup[] = [
  { key: 'local-2', label: '2 replicas, local indexes', replicas: 2, sync: true, index: 'zmq' },
  { key: 'shared-2', label: '2 replicas, shared indexer', replicas: 2, sync: true, index: 'shared' },
  { key: 'local-4', label: '4 replicas, local indexes', replicas: 4, sync: true, index: 'zmq' },
  { key: 'shared-4', label: '4 replicas, shared indexer', replicas: 4, sync: true, index: 'shared' },
]

/** The setup lists `--setups` names. */
export const SETUP_LISTS: Readonly<Record<string, readonly Setup[]>> = { sync: SETUPS, 'shared-index': SHARED_INDEX_SETUPS }
const ALL_SETUPS = [...SETUPS, ...SHARED_INDEX_SETUPS]

/** The setups `--setups` names: a list's name, or setup keys separated by commas (empty when one is unknown). */
export function setupsOf(name: string): readonly Setup[] {
  const list = SETUP_LISTS[name]
  if (list !== undefined) return list
  const out = name.split(',').map((k) => ALL_SETUPS.find((x) => x.key === k.trim()))
  return out.some((x) => x === undefined) ? [] : (out as Setup[])
}

// bench:e2e's defaults: the same slice, fleet and load
export const DEFAULTS = { minutes: 20, workers: 8, speedup: 1.5, load: 8, capacityFactor: 1.25, maxInFlight: 2048 }

export interface ReplicasArgs {
  /** null: the whole trace (--full). */
  minutes: number | null
  workers: number
  speedup: number
  load: number
  capacityFactor: number
  maxInFlight: number
  /** null: data/conversation_trace.jsonl. */
  trace: string | null
  /** Extra `kv-router serve` flags for every replica, after the benchmark's own (so they win). */
  routerArgs: string[]
  /** Which comparison runs (a key of SETUP_LISTS). */
  setups: string
}

/** A bad command line: the message is the one line to print. */
export class ArgError extends Error {}

const VALUE_OPTIONS = ['--minutes', '--workers', '--speedup', '--load', '--capacity-factor', '--max-in-flight', '--trace', '--router-args', '--setups']

export function parseReplicasArgs(argv: readonly string[]): ReplicasArgs {
  const v = new Map<string, string>()
  let full = false
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (a === '--full') {
      full = true
      continue
    }
    const eq = a.indexOf('=')
    const name = eq > 0 ? a.slice(0, eq) : a
    if (!VALUE_OPTIONS.includes(name)) throw new ArgError(`unknown option ${JSON.stringify(a)} (known: --full ${VALUE_OPTIONS.join(' ')})`)
    const value = eq > 0 ? a.slice(eq + 1) : argv[++i]
    if (value === undefined) throw new ArgError(`${name} needs a value`)
    v.set(name, value)
  }
  const num = (name: string, dflt: number, integer = false): number => {
    const s = v.get(name)
    if (s === undefined) return dflt
    const n = Number(s)
    if (s.trim() === '' || !Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n)))
      throw new ArgError(`${name} must be a positive ${integer ? 'integer' : 'number'}, got ${JSON.stringify(s)}`)
    return n
  }
  if (full && v.has('--minutes')) throw new ArgError('--full and --minutes exclude each other')
  const setups = v.get('--setups') ?? 'sync'
  if (setupsOf(setups).length === 0)
    throw new ArgError(
      `--setups must be one of ${Object.keys(SETUP_LISTS).join(', ')} or setup keys ` +
        `(${ALL_SETUPS.map((x) => x.key).join(', ')}), got ${JSON.stringify(setups)}`,
    )
  return {
    minutes: full ? null : num('--minutes', DEFAULTS.minutes),
    workers: num('--workers', DEFAULTS.workers, true),
    speedup: num('--speedup', DEFAULTS.speedup),
    load: num('--load', DEFAULTS.load),
    capacityFactor: num('--capacity-factor', DEFAULTS.capacityFactor),
    maxInFlight: num('--max-in-flight', DEFAULTS.maxInFlight, true),
    trace: v.get('--trace') ?? null,
    routerArgs: (v.get('--router-args') ?? '').split(/\s+/).filter((x) => x !== ''),
    setups,
  }
}

/**
 * The sum of a counter's samples in a Prometheus text exposition, those whose labels include
 * `labels` when given; null when the metric is not there at all (a router without replica sync
 * does not register the replica metrics).
 */
export function counterSum(text: string, name: string, labels?: string): number | null {
  let sum: number | null = null
  for (const line of text.split('\n')) {
    if (!(line.startsWith(`${name} `) || line.startsWith(`${name}{`))) continue
    const close = line.lastIndexOf('}')
    if (labels !== undefined && (close < 0 || !line.slice(0, close).includes(labels))) continue
    const value = Number(line.slice(line.lastIndexOf(' ') + 1))
    if (Number.isFinite(value)) sum = (sum ?? 0) + value
  }
  return sum
}

export interface Bar {
  bar: string
  value: string
  target: string
  /** null when a figure it needs is missing. */
  pass: boolean | null
}

/** What the targets read of one setup's run. */
export interface SetupFigures {
  hitRate: number | null
  ttftP90: number | null
  errors: number
  /** CPU seconds of the observer replica (consumes what a replica consumes, routes nothing); null without one. */
  observerCpuS?: number | null
  /** Of them, those above its idle baseline: what the KV events cost it. */
  observerEventCpuS?: number | null
}

function pct(v: number): string {
  return `${(v * 100).toFixed(1)}%`
}

/**
 * Synced replicas against one router: the cache hits kept (≥ 0.95 × its hit rate), the p90 TTFT
 * kept (≤ 1.15 × its), and no errors in any setup.
 */
export function replicaBars(figures: Readonly<Record<string, SetupFigures>>): Bar[] {
  const one = figures['one']
  const sync = figures['two-sync']
  const bars: Bar[] = []
  const h1 = one?.hitRate ?? null
  const hs = sync?.hitRate ?? null
  bars.push({
    bar: 'sync hit rate ≥ 0.95 × 1 replica',
    value: h1 === null || hs === null ? 'n/a' : `${pct(hs)} vs ${pct(h1)} (${h1 > 0 ? (hs / h1).toFixed(3) : '∞'})`,
    target: '≥ 0.95',
    pass: h1 === null || hs === null ? null : hs >= 0.95 * h1,
  })
  const p1 = one?.ttftP90 ?? null
  const ps = sync?.ttftP90 ?? null
  bars.push({
    bar: 'sync p90 TTFT ≤ 1.15 × 1 replica',
    value: p1 === null || ps === null ? 'n/a' : `${ps.toFixed(0)} vs ${p1.toFixed(0)} ms (${p1 > 0 ? (ps / p1).toFixed(3) : '∞'})`,
    target: '≤ 1.15',
    pass: p1 === null || ps === null ? null : ps <= 1.15 * p1,
  })
  const entries = Object.entries(figures)
  bars.push({
    bar: 'zero errors in every setup',
    value: entries.map(([k, f]) => `${k} ${f.errors}`).join(', '),
    target: '0',
    pass: entries.every(([, f]) => f.errors === 0),
  })
  return bars
}

/**
 * Replicas on one shared indexer against replicas with local indexes, 4 of each: the hits kept
 * (≥ 0.97 ×), the p90 TTFT kept (≤ 1.1 ×), the CPU a replica spends on KV events (the observer
 * replica's above its idle baseline; it routes nothing) at least 10 × lower, and no errors in any setup.
 */
export function sharedIndexBars(figures: Readonly<Record<string, SetupFigures>>): Bar[] {
  const local = figures['local-4']
  const shared = figures['shared-4']
  const bars: Bar[] = []
  const hl = local?.hitRate ?? null
  const hs = shared?.hitRate ?? null
  bars.push({
    bar: '4 shared: hit rate ≥ 0.97 × 4 local',
    value: hl === null || hs === null ? 'n/a' : `${pct(hs)} vs ${pct(hl)} (${hl > 0 ? (hs / hl).toFixed(3) : '∞'})`,
    target: '≥ 0.97',
    pass: hl === null || hs === null ? null : hs >= 0.97 * hl,
  })
  const pl = local?.ttftP90 ?? null
  const ps = shared?.ttftP90 ?? null
  bars.push({
    bar: '4 shared: p90 TTFT ≤ 1.1 × 4 local',
    value: pl === null || ps === null ? 'n/a' : `${ps.toFixed(0)} vs ${pl.toFixed(0)} ms (${pl > 0 ? (ps / pl).toFixed(3) : '∞'})`,
    target: '≤ 1.1',
    pass: pl === null || ps === null ? null : ps <= 1.1 * pl,
  })
  const cl = local?.observerEventCpuS ?? null
  const cs = shared?.observerEventCpuS ?? null
  // ticks are 10 ms: a figure under two of them is at the resolution of the measure
  const floor = 0.02
  bars.push({
    bar: 'CPU a replica spends on KV events: local ≥ 10 × shared',
    value:
      cl === null || cs === null
        ? 'n/a'
        : `${cl.toFixed(2)} vs ${cs < floor ? `< ${floor}` : cs.toFixed(2)} CPU s above idle ` +
          `(${cs < floor ? `> ${(cl / floor).toFixed(0)}` : (cl / cs).toFixed(1)}×)`,
    target: '≥ 10×',
    pass: cl === null || cs === null ? null : cl >= 10 * Math.max(cs, floor),
  })
  const entries = Object.entries(figures)
  bars.push({
    bar: 'zero errors in every setup',
    value: entries.map(([k, f]) => `${k} ${f.errors}`).join(', '),
    target: '0',
    pass: entries.every(([, f]) => f.errors === 0),
  })
  return bars
}
