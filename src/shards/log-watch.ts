// The drops the indexer shards count in shared memory, in the log. Every second the main thread
// compares the counters with its last look; a class that grew is one line through the limiter,
// `count` saying how many since the last look, with the latest sample the shard posted of that
// class (workers/shard/log.ts): what was wrong, and with which worker. Nothing is added to the
// event path: the counters exist already, and a sample is posted at most once a second.
import { u64FromParts } from '../codec/u64.js'
import { limited } from '../runtime/log.js'

/** What the watch reads of the shard pool (its counters are monotonic but for a restarted shard's). */
export interface ShardCountersSource {
  counters(): readonly {
    readonly shard: number
    readonly malformed: number
    readonly gaps: number
    readonly rejected: Readonly<Record<string, number>>
    readonly engine: { readonly malformed: Readonly<Record<string, number>>; readonly skipped: Readonly<Record<string, number>> }
  }[]
  /** NATS messages dropped while the backlog was full. */
  readonly dropped: number
  /** Messages refused before any shard saw them (empty, or a NUL first byte): malformed. */
  readonly rejectedAtIntake: number
}

export const WATCH_MS = 1000

/** A shard sample as posted: u64s in halves, turned into decimal text here. */
function sampleFields(s: Record<string, unknown> | undefined): Record<string, unknown> {
  if (s === undefined) return {}
  const { what: _what, lo, hi, idLo, idHi, ...rest } = s
  const out: Record<string, unknown> = { ...rest }
  if (typeof lo === 'number' && typeof hi === 'number') out.worker_id = u64FromParts(lo, hi).toString()
  if (typeof idLo === 'number' && typeof idHi === 'number') out.event_id = u64FromParts(idLo, idHi).toString()
  return { last: out }
}

export class ShardLogWatch {
  private readonly seen = new Map<string, number>()
  private readonly samples = new Map<string, Record<string, unknown>>()
  private readonly timer: NodeJS.Timeout

  constructor(
    private readonly src: ShardCountersSource,
    everyMs = WATCH_MS,
  ) {
    // the counters as they stand are not news
    this.poll(false)
    this.timer = setInterval(() => this.poll(), everyMs)
    this.timer.unref()
  }

  /** A sample a shard posted ({what, …}). */
  sample(s: Record<string, unknown>): void {
    if (typeof s.what === 'string') this.samples.set(s.what, s)
  }

  /** How much `key` grew since the last look (a counter that went down was restarted from 0). */
  private delta(key: string, v: number): number {
    const was = this.seen.get(key) ?? 0
    this.seen.set(key, v)
    return v >= was ? v - was : v
  }

  /** Compares the counters with the last look and logs what grew. */
  poll(log = true): void {
    let malformed = this.delta('intake', this.src.rejectedAtIntake)
    let gaps = 0
    const rejected: Record<string, number> = {}
    const engineMalformed: Record<string, number> = {}
    const skipped: Record<string, number> = {}
    const add = (into: Record<string, number>, reason: string, n: number): void => {
      if (n > 0) into[reason] = (into[reason] ?? 0) + n
    }
    for (const c of this.src.counters()) {
      const k = c.shard
      malformed += this.delta(`${k}:malformed`, c.malformed)
      gaps += this.delta(`${k}:gaps`, c.gaps)
      for (const [reason, v] of Object.entries(c.rejected)) add(rejected, reason, this.delta(`${k}:rejected:${reason}`, v))
      for (const [reason, v] of Object.entries(c.engine.malformed)) add(engineMalformed, reason, this.delta(`${k}:engine-malformed:${reason}`, v))
      for (const [reason, v] of Object.entries(c.engine.skipped)) add(skipped, reason, this.delta(`${k}:engine-skipped:${reason}`, v))
    }
    const dropped = this.delta('dropped', this.src.dropped)
    if (!log) return
    const total = (r: Record<string, number>): number => Object.values(r).reduce((a, b) => a + b, 0)
    const take = (what: string): Record<string, unknown> => {
      const s = sampleFields(this.samples.get(what))
      this.samples.delete(what)
      return s
    }
    if (malformed > 0)
      limited.warn('events_malformed', { count: malformed, ...take('events_malformed') }, 'KV event messages did not decode: dropped', malformed)
    // a class counted by reason: one line with the total, the reasons and the latest sample
    const byReason = (level: 'warn' | 'info', what: string, reasons: Record<string, number>, msg: string): void => {
      const n = total(reasons)
      if (n > 0) limited.log(level, what, { count: n, reasons, ...take(what) }, msg, n)
    }
    byReason('warn', 'events_rejected', rejected, 'the index refused KV events (or parts of them)')
    if (gaps > 0) limited.warn('event_gaps', { count: gaps }, "gaps in workers' KV event ids: events they published never arrived", gaps)
    if (dropped > 0)
      limited.warn('events_dropped', { count: dropped }, 'NATS KV event messages dropped: 256 MiB of events already waited for the indexer shards', dropped)
    byReason('warn', 'engine_batches_malformed', engineMalformed, "engines' KV-event batches did not decode: refused whole")
    byReason('info', 'engine_events_skipped', skipped, "engines' KV events not applied (another block size, sliding-window groups, unknown kinds, empty)")
  }

  close(): void {
    clearInterval(this.timer)
  }
}
