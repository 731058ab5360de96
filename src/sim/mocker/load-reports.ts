// When an engine reports its load: at once when what the report says has changed (at most one
// per minGapMs: Dynamo debounces by 1 ms, and with steps every few ms and many engines that
// would be a message per step per engine for the router to parse), and every intervalMs
// regardless, so a router that starts late learns the load within a period. The transports
// (NATS kv_metrics, the Dynamo event plane's kv_metrics topic) give only the sending.
import type { EngineLoad } from './engine.js'

export interface LoadReportOptions {
  /** Unconditional report period (ms, default 1000). */
  intervalMs?: number
  /** Reports on change are at least this far apart (ms, default 100). */
  minGapMs?: number
}

export class LoadReports {
  private last: string | number | null = null
  private lastAt = -Infinity
  private pending: NodeJS.Timeout | null = null
  private readonly heartbeat: NodeJS.Timeout
  private readonly minGap: number
  private closed = false
  /** Reports sent. */
  reports = 0

  /**
   * `key`: what of the load the report carries (a change of it is worth a report); `send`: sends
   * one, false when it could not (its transport is closed).
   */
  constructor(
    private readonly load: () => EngineLoad,
    private readonly key: (l: EngineLoad) => string | number,
    private readonly sendReport: (l: EngineLoad) => boolean,
    o: LoadReportOptions = {},
  ) {
    this.minGap = o.minGapMs ?? 100
    this.heartbeat = setInterval(() => this.send(), o.intervalMs ?? 1000)
    this.heartbeat.unref()
    this.send()
  }

  /** The engine's state may have changed (called after every step). */
  update(): void {
    if (this.closed || this.pending !== null) return
    if (this.key(this.load()) === this.last) return
    const wait = this.lastAt + this.minGap - performance.now()
    if (wait <= 0) this.send()
    else {
      this.pending = setTimeout(() => {
        this.pending = null
        this.send()
      }, wait)
      this.pending.unref()
    }
  }

  private send(): void {
    if (this.closed) return
    const l = this.load()
    if (!this.sendReport(l)) return
    this.last = this.key(l)
    this.lastAt = performance.now()
    this.reports++
  }

  close(): void {
    this.closed = true
    clearInterval(this.heartbeat)
    if (this.pending !== null) clearTimeout(this.pending)
  }
}
