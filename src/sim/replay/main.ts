// `kv-router replay`: replays a Mooncake-format trace against a router (or any OpenAI-compatible
// completions server) and prints latency, hit-rate and load-spread statistics.
//
// Exit status: 0 when every request succeeded, 1 when any failed (the summary says how many
// and why; the JSONL records name each), 2 for invalid flags or an unreadable trace. Failing on
// a single failed request is deliberate: a replay is a measurement, and figures computed over
// the survivors of a partly failing run look better than the run was.
import { createWriteStream } from 'node:fs'
import type { WriteStream } from 'node:fs'
import { readTrace, TraceFormatError } from './trace.js'
import type { TraceRequest } from './trace.js'
import { die, isHttpUrl, parseIntArg, parseNumArg } from '../../cli/flags.js'
import { startReplay } from './client.js'
import { MAX_TIMER_MS } from '../../runtime/timers.js'
import type { ReplayProgress } from './client.js'
import { formatSummary, summarize } from './summary.js'

export const replayHelp = `usage: kv-router replay --trace FILE --url URL [options]

Sends each request of a Mooncake-format trace (JSONL: timestamp ms, input_length, output_length,
hash_ids) to URL/v1/completions at timestamp / speedup after the start, without waiting for
earlier responses: the prompt is the request's deterministic token ids, max_tokens its
output_length, streamed with usage. Prints TTFT, TPOT, ITL, throughput, the prefix-cache hit rate
(cached / prompt tokens, as the engines report them) and how requests spread over workers.

  --trace FILE          Mooncake trace (required)
  --url URL             router base URL, e.g. http://127.0.0.1:8000 (required)
  --speedup X           replay X times faster than the trace (default 1)
  --limit N             only the first N requests
  --duration-min M      only requests with timestamp < M minutes
  --max-in-flight N     safety cap on outstanding requests; later ones wait (default 2048)
  --timeout-s S         per-request deadline (default 600; at most 2147483.647, Node's timer range)
  --model NAME          model field (default: the first of URL/v1/models, else kv-router-model)
  --api-key KEY         sent as Authorization: Bearer KEY
  --output FILE.jsonl   one record per request, in completion order
  --time-scale K        multiply reported durations by K, e.g. the mocker's --speedup-ratio to
                        report simulated time (default 1; JSONL records stay in wall ms)
  --quiet               no progress line
  -h, --help            this help

exit status: 0 all requests succeeded, 1 some failed, 2 invalid flags or trace
`

export class ReplayUsageError extends Error {
  override name = 'ReplayUsageError'
}

export interface ReplayArgs {
  trace: string
  url: string
  speedup: number
  limit: number | null
  durationMin: number | null
  maxInFlight: number
  timeoutS: number
  model: string | null
  apiKey: string | null
  output: string | null
  timeScale: number
  quiet: boolean
}

/** Seconds of the longest timer Node keeps: a longer --timeout-s would fire after 1 ms. */
const MAX_TIMEOUT_S = MAX_TIMER_MS / 1000

export const VALUE_FLAGS = [
  '--trace',
  '--url',
  '--speedup',
  '--limit',
  '--duration-min',
  '--max-in-flight',
  '--timeout-s',
  '--model',
  '--api-key',
  '--output',
  '--time-scale',
] as const
export const BOOL_FLAGS = ['--quiet'] as const

/** Parses replay flags; throws ReplayUsageError naming the flag. Returns 'help' for --help. */
export function parseReplayArgs(argv: readonly string[]): ReplayArgs | 'help' {
  const v = new Map<string, string>()
  const bools = new Set<string>()
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (a === '-h' || a === '--help') return 'help'
    const eq = a.indexOf('=')
    const name = a.startsWith('--') && eq > 0 ? a.slice(0, eq) : a
    if ((BOOL_FLAGS as readonly string[]).includes(name)) {
      if (eq > 0) throw new ReplayUsageError(`${name} takes no value`)
      bools.add(name)
    } else if ((VALUE_FLAGS as readonly string[]).includes(name)) {
      const value = eq > 0 && name !== a ? a.slice(eq + 1) : argv[++i]
      if (value === undefined || (name === a && value.startsWith('--'))) throw new ReplayUsageError(`${name} needs a value`)
      v.set(name, value)
    } else {
      throw new ReplayUsageError(`unknown option ${JSON.stringify(a)} (kv-router replay --help lists them)`)
    }
  }
  const positive = (name: string, dflt: number, max = Infinity, why = ''): number => {
    const s = v.get(name)
    if (s === undefined) return dflt
    const n = parseNumArg(s, 0, max)
    if (n === undefined || n === 0)
      throw new ReplayUsageError(`${name} must be a positive number${max < Infinity ? ` at most ${max}${why}` : ''}, got ${JSON.stringify(s)}`)
    return n
  }
  const count = (name: string): number | null => {
    const s = v.get(name)
    if (s === undefined) return null
    const n = parseIntArg(s, 1, Number.MAX_SAFE_INTEGER)
    if (n === undefined) throw new ReplayUsageError(`${name} must be a positive integer, got ${JSON.stringify(s)}`)
    return n
  }
  const trace = v.get('--trace')
  if (trace === undefined || trace === '') throw new ReplayUsageError('--trace FILE is required')
  const url = v.get('--url')
  if (url === undefined) throw new ReplayUsageError('--url URL is required')
  if (!isHttpUrl(url)) throw new ReplayUsageError(`--url must be an http(s) URL, got ${JSON.stringify(url)}`)
  const durationMin = v.has('--duration-min') ? positive('--duration-min', 0) : null
  return {
    trace,
    url,
    speedup: positive('--speedup', 1),
    limit: count('--limit'),
    durationMin,
    maxInFlight: count('--max-in-flight') ?? 2048,
    timeoutS: positive('--timeout-s', 600, MAX_TIMEOUT_S, ' (about 24.8 days, the longest timer Node keeps)'),
    model: v.get('--model') ?? null,
    apiKey: v.get('--api-key') ?? null,
    output: v.get('--output') ?? null,
    timeScale: positive('--time-scale', 1),
    quiet: bools.has('--quiet'),
  }
}

/** The requests a replay sends: timestamps below the duration, then at most `limit`. */
export function selectRequests(all: readonly TraceRequest[], limit: number | null, durationMin: number | null): TraceRequest[] {
  let out = durationMin === null ? [...all] : all.filter((r) => r.timestamp < durationMin * 60_000)
  if (limit !== null) out = out.slice(0, limit)
  return out
}

async function defaultModel(url: string, apiKey: string | null): Promise<string> {
  try {
    const res = await fetch(`${url.replace(/\/+$/, '')}/v1/models`, {
      headers: apiKey === null ? {} : { authorization: `Bearer ${apiKey}` },
      signal: AbortSignal.timeout(5000),
    })
    const body = (await res.json()) as { data?: { id?: unknown }[] }
    const id = body.data?.[0]?.id
    if (typeof id === 'string' && id !== '') return id
  } catch {
    // a server without /v1/models still takes completions
  }
  return 'kv-router-model'
}

export function progressLine(p: ReplayProgress): string {
  const pct = p.total === 0 ? 100 : Math.floor((p.done / p.total) * 100)
  return `replay ${String(pct).padStart(3)}%  sent ${p.sent}/${p.total}  in flight ${p.inFlight}  done ${p.done}  failed ${p.failed}  ${p.elapsedS.toFixed(0)}/${p.scheduleS.toFixed(0)} s`
}

export interface ReplayIo {
  stdout: NodeJS.WritableStream
  stderr: NodeJS.WritableStream & { isTTY?: boolean }
  /** Handle SIGINT (stop sending, report what finished). Default true. */
  signals?: boolean
  /** Plain progress lines this often when stderr is not a TTY (default 10,000 ms). */
  progressEveryMs?: number
}

/** Runs a replay and returns the exit status; throws ReplayUsageError for bad flags. */
export async function runReplay(argv: readonly string[], io: ReplayIo = { stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  const args = parseReplayArgs(argv)
  if (args === 'help') {
    io.stdout.write(replayHelp)
    return 0
  }
  let all: TraceRequest[]
  try {
    all = readTrace(args.trace, args.limit !== null && args.durationMin === null ? { limit: args.limit } : {})
  } catch (err) {
    if (err instanceof TraceFormatError) throw new ReplayUsageError(`--trace: ${err.message}`)
    throw new ReplayUsageError(`--trace: cannot read ${args.trace}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`)
  }
  const requests = selectRequests(all, args.limit, args.durationMin)
  let out: WriteStream | null = null
  if (args.output !== null) {
    out = createWriteStream(args.output)
    await new Promise<void>((resolve, reject) => {
      out?.once('open', () => resolve())
      out?.once('error', (e) => reject(new ReplayUsageError(`--output: cannot write ${args.output}: ${(e as NodeJS.ErrnoException).code ?? e.message}`)))
    })
  }
  const model = args.model ?? (await defaultModel(args.url, args.apiKey))
  const ac = new AbortController()
  const run = startReplay({
    url: args.url,
    requests,
    speedup: args.speedup,
    maxInFlight: args.maxInFlight,
    timeoutMs: args.timeoutS * 1000,
    model,
    ...(args.apiKey === null ? {} : { apiKey: args.apiKey }),
    signal: ac.signal,
    ...(out === null ? {} : { onRecord: (r) => out.write(`${JSON.stringify(r)}\n`) }),
  })
  const onSigint = (): void => {
    io.stderr.write('\nkv-router replay: SIGINT: stopping; requests in flight are aborted\n')
    ac.abort()
  }
  if (io.signals !== false) process.once('SIGINT', onSigint)
  const tty = io.stderr.isTTY === true
  let ticker: NodeJS.Timeout | null = null
  if (!args.quiet) {
    io.stderr.write(`kv-router replay: ${requests.length} request(s) to ${args.url} at ${args.speedup}× (model ${model})\n`)
    ticker = setInterval(
      () => io.stderr.write(tty ? `\r${progressLine(run.progress())}\u001b[K` : `${progressLine(run.progress())}\n`),
      tty ? 250 : (io.progressEveryMs ?? 10_000),
    )
  }
  let result: Awaited<typeof run.done>
  try {
    result = await run.done
  } finally {
    if (ticker !== null) clearInterval(ticker)
    if (io.signals !== false) process.removeListener('SIGINT', onSigint)
  }
  if (!args.quiet && tty) io.stderr.write(`\r${progressLine(run.progress())}\u001b[K\n`)
  if (out !== null) {
    const o = out
    await new Promise<void>((resolve) => o.end(resolve))
  }
  const summary = summarize(result.records, { gaps: result.itlGaps, timeScale: args.timeScale })
  io.stdout.write(formatSummary(summary))
  return summary.errors > 0 ? 1 : 0
}

export async function replayMain(argv: string[]): Promise<void> {
  try {
    process.exitCode = await runReplay(argv)
  } catch (err) {
    if (err instanceof ReplayUsageError) die(`replay: ${err.message}`)
    throw err
  }
}
