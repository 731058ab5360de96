// The main thread's logger (pino): JSON lines on stderr, one object per line, or a short
// human-readable line when stderr is a terminal. Every module logs through `log`; `serve`
// configures it once from --log-level and --log-format, and fastify is given the same instance.
// `limited` keeps a class of failure to one line per period, with a count of the lines it held
// back, so a flood of bad events or a dead worker cannot flood the log.
//
// Secrets: known ones (the --api-key) and the credentials in URLs and Bearer headers are replaced
// in every message and top-level string field before a line is written, and in serialized errors.
import { hostname } from 'node:os'
import pino from 'pino'
import type { DestinationStream, Logger } from 'pino'
import { REDACTED, redactSecrets } from './redact.js'
import { beforeFatalLine } from './fatal.js'
import { StderrWriter } from './stderr-writer.js'

export type { Logger } from 'pino'
export { addSecret, redactSecrets } from './redact.js'

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const
export type LogLevel = (typeof LOG_LEVELS)[number]
export const LOG_FORMATS = ['auto', 'json', 'pretty'] as const
export type LogFormat = (typeof LOG_FORMATS)[number]

const LEVEL_NAMES: Readonly<Record<string, LogLevel>> = {
  fatal: 'fatal',
  error: 'error',
  warn: 'warn',
  info: 'info',
  debug: 'debug',
  trace: 'trace',
  silent: 'silent',
  // Rust's tracing (Dynamo's DYN_LOG) says off
  off: 'silent',
}

/**
 * A --log-level or DYN_LOG value, or null when it is none. DYN_LOG is an env-filter of Dynamo's
 * Rust processes: comma-separated directives, a bare level for everything and `target=level` for
 * one module. The bare level is taken; target directives name Rust modules this process does not
 * have and are skipped; with only target directives the level is info, Dynamo's default.
 */
export function parseLogLevel(text: string): LogLevel | null {
  let level: LogLevel | null = null
  let directives = 0
  for (const raw of text.split(',')) {
    const part = raw.trim()
    if (part === '') continue
    if (part.includes('=')) {
      directives++
      continue
    }
    const l = LEVEL_NAMES[part.toLowerCase()]
    // a second bare level would leave which one counts to guesswork
    if (l === undefined || level !== null) return null
    level = l
  }
  return level ?? (directives > 0 ? 'info' : null)
}

// ---- secrets ----

function redactDeep(v: unknown, depth: number): unknown {
  if (typeof v === 'string') return redactSecrets(v)
  if (v === null || typeof v !== 'object' || depth > 4) return v
  if (Array.isArray(v)) return v.map((x) => redactDeep(x, depth + 1))
  const out: Record<string, unknown> = {}
  for (const [k, x] of Object.entries(v)) out[k] = redactDeep(x, depth + 1)
  return out
}

/** A copy of a log call's fields with secrets replaced in their top-level strings; the object itself when none has one. */
function redactFields(o: Record<string, unknown>): Record<string, unknown> {
  let copy: Record<string, unknown> | null = null
  for (const k in o) {
    const v = o[k]
    if (typeof v !== 'string') continue
    const r = redactSecrets(v)
    if (r === v) continue
    copy ??= { ...o }
    copy[k] = r
  }
  return copy ?? o
}

const errSerializer = (e: Error): unknown => redactDeep(pino.stdSerializers.err(e), 0)

// ---- formats ----

type Sink = { write(line: string): unknown }

const LEVEL_COLOR: Readonly<Record<string, string>> = { trace: '90', debug: '36', info: '32', warn: '33', error: '31', fatal: '35' }
/** Fields a pretty line shows in its head, not as key=value. */
const HEAD = new Set(['level', 'time', 'msg', 'pid', 'hostname'])

function prettyValue(v: unknown): string {
  if (typeof v === 'string') return v === '' || /[\s"=]/.test(v) ? JSON.stringify(v) : v
  return JSON.stringify(v) ?? String(v)
}

/** One JSON log line as `HH:MM:SS.mmm LEVEL message key=value …`, an error's stack indented under it. */
export function prettyLine(json: string, color: boolean): string {
  let o: Record<string, unknown>
  try {
    o = JSON.parse(json) as Record<string, unknown>
  } catch {
    return json
  }
  const level = String(o.level ?? '')
  const time = typeof o.time === 'string' ? o.time.slice(11, 23) : ''
  const tag = level.toUpperCase().padEnd(5)
  let line = `${time} ${color ? `\x1b[${LEVEL_COLOR[level] ?? '0'}m${tag}\x1b[0m` : tag} ${String(o.msg ?? '')}`
  let stack = ''
  for (const [k, v] of Object.entries(o)) {
    if (HEAD.has(k)) continue
    if (k === 'err' && v !== null && typeof v === 'object') {
      const e = v as { message?: unknown; stack?: unknown }
      line += ` err=${prettyValue(e.message)}`
      if (typeof e.stack === 'string') stack = `\n    ${e.stack.split('\n').join('\n    ')}`
      continue
    }
    line += ` ${k}=${prettyValue(v)}`
  }
  return `${line}${stack}\n`
}

function prettySink(out: Sink, color: boolean): Sink {
  return { write: (line: string) => out.write(prettyLine(line, color)) }
}

/**
 * The lines of one turn of the event loop, handed on together at its end: under load a turn
 * answers many requests, and a write(2) per line (to a pipe, a reader woken each time) cost more
 * than the line itself. What a turn holds is written too at exit and before a fatal line (src/runtime/fatal.ts).
 */
class TurnBatch implements Sink {
  private held = ''
  private due = false
  constructor(private readonly out: Sink) {}

  write(line: string): boolean {
    this.held += line
    if (!this.due) {
      this.due = true
      setImmediate(this.flush)
    }
    return true
  }

  readonly flush = (): void => {
    this.due = false
    if (this.held === '') return
    const text = this.held
    this.held = ''
    this.out.write(text)
  }
}

let stderrBatch: TurnBatch | null = null

/** Bytes of log lines held for a reader that falls behind; past them, lines are dropped and counted. */
export const LOG_BUFFER_BYTES = 16 * 1024 * 1024
/** How long the lines still held may take to go out when the process exits. */
const EXIT_FLUSH_MS = 2000

let stderrWriter: StderrWriter | null = null

/** Log lines dropped because the reader of stderr fell LOG_BUFFER_BYTES behind. */
export function logLinesDropped(): number {
  return stderrWriter?.droppedLines ?? 0
}

/** stderr, never waited for (see StderrWriter): a slow reader costs memory, then lines, counted. */
function stderrSink(): Sink {
  if (stderrBatch === null) {
    const writer = new StderrWriter(2, LOG_BUFFER_BYTES)
    stderrWriter = writer
    const batch = new TurnBatch(writer)
    stderrBatch = batch
    const flushAll = (): void => {
      batch.flush()
      writer.flushSync(Date.now() + EXIT_FLUSH_MS)
    }
    process.on('exit', flushAll)
    beforeFatalLine(flushAll)
  }
  return stderrBatch
}

export interface LogOptions {
  level?: LogLevel
  format?: LogFormat
  /** Where lines go; stderr by default. `isTTY` on it decides `auto`. */
  destination?: Sink & { isTTY?: boolean }
}

function sinkOf(o: LogOptions): Sink {
  const dest = o.destination ?? stderrSink()
  const tty = o.destination === undefined ? process.stderr.isTTY === true : o.destination.isTTY === true
  const pretty = o.format === 'pretty' || ((o.format ?? 'auto') === 'auto' && tty)
  return pretty ? prettySink(dest, tty && process.env.NO_COLOR === undefined) : dest
}

let isoSecond = -1
let isoPrefix = ''

/**
 * `,"time":"…Z"`, the ISO time of now. Date#toISOString per line was a third of a request line's
 * cost; the text up to the second is made once a second.
 */
function isoTime(): string {
  const now = Date.now()
  const sec = Math.floor(now / 1000)
  if (sec !== isoSecond) {
    isoSecond = sec
    isoPrefix = new Date(sec * 1000).toISOString().slice(0, 20)
  }
  const ms = now - sec * 1000
  return `,"time":"${isoPrefix}${ms < 10 ? '00' : ms < 100 ? '0' : ''}${ms}Z"`
}

function build(level: LogLevel, sink: Sink): Logger {
  return pino(
    {
      level,
      // the level's name: what log collectors read without a mapping
      formatters: { level: (label) => ({ level: label }) },
      timestamp: isoTime,
      serializers: { err: errSerializer },
      redact: { paths: ['apiKey', 'api_key', 'authorization', 'headers.authorization', 'req.headers.authorization', 'config.apiKey'], censor: REDACTED },
      hooks: {
        logMethod(args, method) {
          // only lines that are written come here (a level that is off is a no-op)
          // an error alone has its message for the line's: that message, redacted
          if (args.length === 1 && args[0] instanceof Error) (args as unknown[]).push(args[0].message)
          for (let i = 0; i < args.length; i++) {
            const a = args[i] as unknown
            if (typeof a === 'string') (args as unknown[])[i] = redactSecrets(a)
            else if (a !== null && typeof a === 'object' && !(a instanceof Error)) (args as unknown[])[i] = redactFields(a as Record<string, unknown>)
          }
          method.apply(this, args)
        },
      },
    },
    sink as DestinationStream,
  )
}

const PID_HOST = `,"pid":${process.pid},"hostname":${JSON.stringify(hostname())}`

/**
 * Writes one line of fields already in JSON (`,"name":value…`, nothing in them to redact) at
 * `level`, in the shape pino writes, straight to the logger's destination: a request line built
 * as one string costs a fraction of an object through pino's serialiser and hooks. The caller
 * checks the level.
 */
export function writeJsonLine(logger: Logger, level: 'info' | 'debug', fields: string, msg: string): void {
  const stream = (logger as unknown as Record<symbol, Sink>)[pino.symbols.streamSym] as Sink
  stream.write(`{"level":"${level}"${isoTime()}${PID_HOST}${fields},"msg":${JSON.stringify(msg)}}\n`)
}

/** A logger of its own (fastify apps of a benchmark, tests): JSON or pretty lines into `destination`. */
export function createLogger(o: LogOptions = {}): Logger {
  return build(o.level ?? 'info', sinkOf(o))
}

// ---- the process's logger ----

/** Forwards to the destination configureLog chose; stderr, made when first written, until then. */
class Switch implements Sink {
  private target: Sink | null = null
  write(line: string): unknown {
    this.target ??= sinkOf({})
    return this.target.write(line)
  }
  set(s: Sink | null): void {
    this.target = s
  }
}

const sw = new Switch()

/**
 * The main thread's logger. Before `configureLog` it writes warnings and errors only, so a
 * program that embeds the router without configuring it hears what it heard as process warnings.
 */
export const log: Logger = build('warn', sw)

/** Sets the process's level and format (and, for tests, where lines go). */
export function configureLog(o: LogOptions & { periodMs?: number }): void {
  sw.set(sinkOf(o))
  log.level = o.level ?? 'info'
  limited.reset(o.periodMs)
}

// ---- rate limiting ----

type LimitedLevel = 'error' | 'warn' | 'info' | 'debug'

interface ClassState {
  /** When the next line of the class may go out at once (performance.now ms). */
  next: number
  /** Occurrences held back since the class's last line. */
  suppressed: number
  /** The latest held back, written when the period ends. */
  pending: { level: LimitedLevel; fields: Record<string, unknown>; msg: string; n: number } | null
  timer: NodeJS.Timeout | null
}

export const LIMIT_PERIOD_MS = 10_000

/**
 * At most one line per class per period. The first occurrence is logged at once; the ones in
 * the next `periodMs` are counted, and when it ends the latest of them is logged with
 * `suppressed`: how many occurrences since the class's previous line were not logged. Every line
 * carries `class` and `suppressed`, so the occurrences of a class add up to the lines plus their
 * `suppressed` (a line standing for `count` occurrences says so).
 */
export class LogLimiter {
  private readonly classes = new Map<string, ClassState>()

  constructor(
    private readonly logger: Logger,
    public periodMs = LIMIT_PERIOD_MS,
  ) {}

  error(cls: string, fields: Record<string, unknown>, msg: string, n = 1): void {
    this.log('error', cls, fields, msg, n)
  }

  warn(cls: string, fields: Record<string, unknown>, msg: string, n = 1): void {
    this.log('warn', cls, fields, msg, n)
  }

  info(cls: string, fields: Record<string, unknown>, msg: string, n = 1): void {
    this.log('info', cls, fields, msg, n)
  }

  /** `n` occurrences of the class (a line may stand for several: then its fields say `count`). */
  log(level: LimitedLevel, cls: string, fields: Record<string, unknown>, msg: string, n = 1): void {
    if (!this.logger.isLevelEnabled(level)) return
    let s = this.classes.get(cls)
    if (s === undefined) this.classes.set(cls, (s = { next: 0, suppressed: 0, pending: null, timer: null }))
    const now = performance.now()
    if (now >= s.next && s.pending === null) {
      this.write(cls, s, level, fields, msg, now)
      return
    }
    s.suppressed += n
    s.pending = { level, fields, msg, n }
    if (s.timer === null) {
      s.timer = setTimeout(() => this.due(cls), Math.max(0, s.next - now))
      s.timer.unref()
    }
  }

  private due(cls: string): void {
    const s = this.classes.get(cls)
    if (s === undefined) return
    s.timer = null
    const p = s.pending
    if (p === null) return
    s.pending = null
    s.suppressed -= p.n
    this.write(cls, s, p.level, p.fields, p.msg, performance.now())
  }

  private write(cls: string, s: ClassState, level: LimitedLevel, fields: Record<string, unknown>, msg: string, now: number): void {
    this.logger[level]({ class: cls, ...fields, suppressed: s.suppressed }, msg)
    s.suppressed = 0
    s.next = now + this.periodMs
  }

  /** Writes every held-back line now (before the process stops). */
  flush(): void {
    for (const [cls, s] of this.classes) {
      if (s.timer !== null) clearTimeout(s.timer)
      this.due(cls)
    }
  }

  /** Forgets every class (and sets the period). */
  reset(periodMs?: number): void {
    for (const s of this.classes.values()) if (s.timer !== null) clearTimeout(s.timer)
    this.classes.clear()
    if (periodMs !== undefined) this.periodMs = periodMs
  }
}

/** The process's limiter, over `log`. */
export const limited = new LogLimiter(log)
