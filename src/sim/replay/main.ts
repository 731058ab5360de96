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
import { isHttpUrl } from '../../core/endpoints.js'
import { ConfigError, opt, optionsHelp, parseOptions } from '../../config/table.js'
import type { CommandTable, ConfigOf } from '../../config/table.js'
import { FatalError } from '../../runtime/fatal.js'
import { startReplay } from './client.js'
import { MAX_TIMER_MS } from '../../runtime/timers.js'
import type { ReplayProgress } from './client.js'
import { formatSummary, summarize } from './summary.js'

export class ReplayUsageError extends Error {
  override name = 'ReplayUsageError'
}

/** Seconds of the longest timer Node keeps: a longer --timeout-s would fire after 1 ms. */
const MAX_TIMEOUT_S = MAX_TIMER_MS / 1000
const POSITIVE = 'a positive number'
const COUNT = 'a positive integer'

const REPLAY_ROWS = [
  opt({
    flag: '--trace',
    key: 'trace',
    kind: 'str',
    read: (t: string) => t,
    metavar: 'FILE',
    dflt: null,
    docDefault: 'required',
    help: 'Mooncake trace file (required)',
    doc: 'Mooncake trace file.',
  }),
  opt({
    flag: '--url',
    key: 'url',
    kind: 'str',
    read: (t: string) => (isHttpUrl(t) ? t : undefined),
    accepts: 'an http(s) URL',
    metavar: 'URL',
    dflt: null,
    docDefault: 'required',
    help: 'router base URL, e.g. http://127.0.0.1:8000 (required)',
    doc: 'Router base URL, e.g. `http://127.0.0.1:8000`.',
  }),
  opt({
    flag: '--speedup',
    key: 'speedup',
    kind: 'num',
    min: 0,
    openMin: true,
    accepts: POSITIVE,
    dflt: 1,
    help: 'replay X times faster than the trace',
    doc: 'Replay X times faster than the trace (> 0).',
  }),
  opt({
    flag: '--limit',
    key: 'limit',
    kind: 'int',
    min: 1,
    max: Number.MAX_SAFE_INTEGER,
    accepts: COUNT,
    dflt: null,
    docDefault: 'all',
    help: 'only the first N requests',
    doc: 'Only the first N requests.',
  }),
  opt({
    flag: '--duration-min',
    key: 'durationMin',
    kind: 'num',
    min: 0,
    openMin: true,
    accepts: POSITIVE,
    metavar: 'M',
    dflt: null,
    docDefault: 'all',
    help: 'only requests with a timestamp below M minutes',
    doc: 'Only requests with a timestamp below M minutes.',
  }),
  opt({
    flag: '--max-in-flight',
    key: 'maxInFlight',
    kind: 'int',
    min: 1,
    max: Number.MAX_SAFE_INTEGER,
    accepts: COUNT,
    dflt: 2048,
    help: 'safety cap on outstanding requests; later ones wait, and the lateness shows as send lag',
    doc: 'Safety cap on outstanding requests; later ones wait, and the lateness shows as send lag.',
  }),
  opt({
    flag: '--timeout-s',
    key: 'timeoutS',
    kind: 'num',
    min: 0,
    openMin: true,
    max: MAX_TIMEOUT_S,
    accepts: `${POSITIVE} at most ${MAX_TIMEOUT_S} (about 24.8 days, the longest timer Node keeps)`,
    metavar: 'S',
    dflt: 600,
    help: 'per-request deadline in seconds',
    doc: "Per-request deadline in seconds (at most 2,147,483.647, Node's longest timer).",
  }),
  opt({
    flag: '--model',
    key: 'model',
    kind: 'str',
    metavar: 'NAME',
    dflt: null,
    docDefault: 'first of `/v1/models`',
    help: 'model field of every request (default: the first of URL/v1/models, else kv-router-model)',
    doc: '`model` field of every request (falls back to `kv-router-model`).',
  }),
  opt({
    flag: '--api-key',
    key: 'apiKey',
    kind: 'str',
    metavar: 'KEY',
    dflt: null,
    help: 'sent as Authorization: Bearer KEY',
    doc: 'Sent as `Authorization: Bearer KEY`.',
  }),
  opt({
    flag: '--output',
    key: 'output',
    kind: 'str',
    metavar: 'FILE.jsonl',
    dflt: null,
    help: 'one JSON record per request, in completion order (wall-clock ms)',
    doc: 'Write one JSON record per request, in completion order (wall-clock ms).',
  }),
  opt({
    flag: '--time-scale',
    key: 'timeScale',
    kind: 'num',
    min: 0,
    openMin: true,
    accepts: POSITIVE,
    metavar: 'K',
    dflt: 1,
    help: "multiply reported durations, e.g. by the mocker's --speedup-ratio to report simulated time (records stay in wall ms)",
    doc: "Multiply reported durations, e.g. by the mocker's `--speedup-ratio` to report simulated time (records stay in wall ms).",
  }),
  opt({
    flag: '--quiet',
    key: 'quiet',
    kind: 'bool',
    flagOnly: true,
    dflt: false,
    docDefault: 'off',
    help: 'no progress line (a \\r line on a TTY, else a line every 10 s)',
    doc: 'No progress line (a `\\r` line on a TTY, else a line every 10 s).',
  }),
] as const

/** `kv-router replay`'s options: the parser, --help and docs/configuration.md come from it. */
export const REPLAY_TABLE: CommandTable = {
  command: 'replay',
  options: REPLAY_ROWS,
  unknown: (arg) => `unknown option ${JSON.stringify(arg)} (kv-router replay --help lists them)`,
}

export const replayHelp = `usage: kv-router replay --trace FILE --url URL [options]

Sends each request of a Mooncake-format trace (JSONL: timestamp ms, input_length, output_length,
hash_ids) to URL/v1/completions at timestamp / speedup after the start, without waiting for
earlier responses: the prompt is the request's deterministic token ids, max_tokens its
output_length, streamed with usage. Prints TTFT, TPOT, ITL, throughput, the prefix-cache hit rate
(cached / prompt tokens, as the engines report them) and how requests spread over workers.

${optionsHelp(REPLAY_TABLE)}
exit status: 0 all requests succeeded, 1 some failed, 2 invalid flags or trace
`

export type ReplayArgs = Omit<ConfigOf<typeof REPLAY_ROWS>, 'trace' | 'url'> & { readonly trace: string; readonly url: string }

/** Parses replay flags; throws ReplayUsageError naming the flag. Returns 'help' for --help. */
export function parseReplayArgs(argv: readonly string[]): ReplayArgs | 'help' {
  let parsed: ReturnType<typeof parseOptions<ConfigOf<typeof REPLAY_ROWS>>>
  try {
    parsed = parseOptions<ConfigOf<typeof REPLAY_ROWS>>(REPLAY_TABLE, argv)
  } catch (err) {
    if (err instanceof ConfigError) throw new ReplayUsageError(err.message)
    throw err
  }
  if (parsed === 'help') return 'help'
  const { trace, url } = parsed.config
  if (trace === null || trace === '') throw new ReplayUsageError('--trace FILE is required')
  if (url === null) throw new ReplayUsageError('--url URL is required')
  return { ...parsed.config, trace, url }
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
  return (
    `replay ${String(pct).padStart(3)}%  sent ${p.sent}/${p.total}  in flight ${p.inFlight}  done ${p.done}  failed ${p.failed}  ` +
    `${p.elapsedS.toFixed(0)}/${p.scheduleS.toFixed(0)} s`
  )
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

/** Runs a replay; resolves with its exit status. Throws FatalError for bad flags or an unreadable trace. */
export async function replayMain(argv: string[]): Promise<number> {
  try {
    return await runReplay(argv)
  } catch (err) {
    if (err instanceof ReplayUsageError) throw new FatalError(`replay: ${err.message}`)
    throw err
  }
}
