// bench:indexer's command line (no process needed, so it is tested on its own).

export interface IndexerArgs {
  /** Seconds per query phase. */
  seconds: number
  /** Mocker engines publishing over ZMQ. */
  workers: number
  /** KV blocks per engine: small enough that pools evict, so removals are part of the load. */
  gpuBlocks: number
  /** Engine requests per second offered during the loaded phase (each stores its prompt's blocks). */
  rate: number
  /** Closed-loop /query clients of the throughput phase (the latency phases use one). */
  concurrency: number
  /** Tokens per /query prompt. */
  queryTokens: number
  /** The indexer's shard threads. */
  threads: number
}

export const INDEXER_DEFAULTS: IndexerArgs = { seconds: 20, workers: 8, gpuBlocks: 4096, rate: 40, concurrency: 4, queryTokens: 4096, threads: 1 }

/** A bad command line: the message is the one line to print. */
export class ArgError extends Error {}

const OPTIONS: Record<string, keyof IndexerArgs> = {
  '--seconds': 'seconds',
  '--workers': 'workers',
  '--gpu-blocks': 'gpuBlocks',
  '--rate': 'rate',
  '--concurrency': 'concurrency',
  '--query-tokens': 'queryTokens',
  '--threads': 'threads',
}
const INTEGERS = new Set<keyof IndexerArgs>(['workers', 'gpuBlocks', 'concurrency', 'queryTokens', 'threads'])

export function parseIndexerArgs(argv: readonly string[]): IndexerArgs {
  const out: IndexerArgs = { ...INDEXER_DEFAULTS }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string
    const eq = arg.indexOf('=')
    const name = eq > 0 ? arg.slice(0, eq) : arg
    const key = OPTIONS[name]
    if (key === undefined) throw new ArgError(`unknown option ${JSON.stringify(arg)} (known: ${Object.keys(OPTIONS).join(' ')})`)
    const s = eq > 0 ? arg.slice(eq + 1) : argv[++i]
    if (s === undefined) throw new ArgError(`${name} needs a value`)
    const n = Number(s)
    if (s.trim() === '' || !Number.isFinite(n) || n <= 0 || (INTEGERS.has(key) && !Number.isInteger(n)))
      throw new ArgError(`${name} must be a positive ${INTEGERS.has(key) ? 'integer' : 'number'}, got ${JSON.stringify(s)}`)
    out[key] = n
  }
  return out
}

/** Cumulative bucket counts of a Prometheus histogram (summed over label sets that include `labels`), by upper bound. */
export function histogramBuckets(text: string, name: string, labels = ''): Map<number, number> {
  const out = new Map<number, number>()
  const prefix = `${name}_bucket{`
  for (const line of text.split('\n')) {
    if (!line.startsWith(prefix) || !line.includes(labels)) continue
    const m = /[{,]le="([^"]+)"/.exec(line)
    if (m === null) continue
    const le = m[1] === '+Inf' ? Number.POSITIVE_INFINITY : Number(m[1])
    out.set(le, (out.get(le) ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1)))
  }
  return out
}

/**
 * The q-quantile of what a histogram took between two scrapes, as the upper bound of the bucket it
 * falls in (a histogram knows no finer); null when nothing was observed.
 */
export function bucketQuantile(before: Map<number, number>, after: Map<number, number>, q: number): number | null {
  const bounds = [...after.keys()].sort((x, y) => x - y)
  const total = (after.get(Number.POSITIVE_INFINITY) ?? 0) - (before.get(Number.POSITIVE_INFINITY) ?? 0)
  if (total <= 0) return null
  for (const le of bounds) if ((after.get(le) ?? 0) - (before.get(le) ?? 0) >= q * total) return le
  return Number.POSITIVE_INFINITY
}
