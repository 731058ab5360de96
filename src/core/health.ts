// Whether each registered worker can take requests. Three sources: its registration (a block size
// other than the router's, in kv mode), the health probes of its HTTP endpoint
// (src/core/health-probes.ts), and the proxy's request failures (src/core/suspension.ts). This is
// the state machine alone, without timers or I/O, so every transition can be tested directly.

/** A worker's health as GET /v1/workers shows it; the first that applies, in this order from the end. */
export type HealthState = 'healthy' | 'suspended' | 'unreachable' | 'misconfigured'
export const HEALTH_STATES: readonly HealthState[] = ['healthy', 'suspended', 'unreachable', 'misconfigured']

/** How one probe went: answered (below 500), failed (no connection, reset, 5xx), or no answer in time. */
export type ProbeOutcome = 'ok' | 'failed' | 'timeout'

export interface ProbeResult {
  outcome: ProbeOutcome
  /** What failed, for GET /v1/workers; null when it answered. */
  detail: string | null
  /** The path asked: /health, or /v1/models for a worker whose /health is 404. */
  path: string
}

/** A worker's probe record as GET /v1/workers shows it. */
export interface ProbeView {
  path: string
  consecutive_failures: number
  last_ok_ms_ago: number | null
  last_probe_ms_ago: number | null
  last_error: string | null
}

interface Entry {
  url: string
  path: string
  /** Failed probes in a row. */
  failures: number
  unreachable: boolean
  /** When the last probe answered, or started; -1: never. */
  lastOkAt: number
  lastProbeAt: number
  lastError: string | null
  /** Why the registration keeps the worker out of kv routing, or null. */
  misconfigured: string | null
  /** Per dp rank, the other block size its engine's KV events carry (kv mode). */
  engineMismatch: Map<number, number>
}

export interface WorkerHealthOptions {
  /** The router's --router-block-size. */
  blockSize: number
  /** kv mode, where a worker of another block size cannot be routed by its cache. */
  kvMode: boolean
  /** Failed probes in a row that make a worker unreachable. */
  failuresToUnreachable: number
  now?: () => number
  /** The worker entered (true) or left the set held out of routing. */
  onHeld?: (id: bigint, held: boolean) => void
}

/** A probe's effect: the transition it caused, and whether the next probe should come sooner. */
export interface ProbeEffect {
  changed: 'unreachable' | 'recovered' | null
  /** It failed without reaching the threshold yet: confirm soon rather than a whole interval later. */
  confirm: boolean
}

export class WorkerHealth {
  /** Workers out of routing: unreachable, or misconfigured in kv mode. */
  readonly held = new Set<bigint>()
  private readonly entries = new Map<bigint, Entry>()
  private readonly now: () => number

  constructor(private readonly opts: WorkerHealthOptions) {
    this.now = opts.now ?? (() => performance.now())
  }

  /**
   * The worker registered, or registered again. A new URL starts a new probe record; the same URL
   * keeps it (a worker found unreachable stays so until a probe answers). Its block size is
   * checked each time, so registering again with the router's size ends a mismatch. A worker that
   * is not probed (registered for decisions only) is never unreachable.
   */
  registered(id: bigint, url: string, blockSize: number, probed = true): void {
    let e = this.entries.get(id)
    if (e === undefined || e.url !== url) {
      // what its engine publishes is not the address's: kept
      e = {
        url,
        path: '/health',
        failures: 0,
        unreachable: false,
        lastOkAt: -1,
        lastProbeAt: -1,
        lastError: null,
        misconfigured: null,
        engineMismatch: e?.engineMismatch ?? new Map(),
      }
      this.entries.set(id, e)
    }
    if (!probed) {
      e.failures = 0
      e.unreachable = false
      e.lastError = null
    }
    const bs = this.opts.blockSize
    e.misconfigured =
      this.opts.kvMode && blockSize !== bs
        ? `block size ${blockSize}, the router's is ${bs}: its KV blocks can never match; register it again with block size ${bs}`
        : null
    this.update(id, e)
  }

  removed(id: bigint): void {
    this.entries.delete(id)
    if (this.held.delete(id)) this.opts.onHeld?.(id, false)
  }

  /** A probe of the worker at `url` ended; a probe of an address it has since left says nothing. */
  probed(id: bigint, url: string, r: ProbeResult): ProbeEffect {
    const e = this.entries.get(id)
    if (e === undefined || e.url !== url) return { changed: null, confirm: false }
    const now = this.now()
    e.lastProbeAt = now
    e.path = r.path
    if (r.outcome === 'ok') {
      const was = e.unreachable
      e.failures = 0
      e.unreachable = false
      e.lastOkAt = now
      e.lastError = null
      this.update(id, e)
      return { changed: was ? 'recovered' : null, confirm: false }
    }
    e.failures++
    e.lastError = r.detail
    if (!e.unreachable && e.failures >= this.opts.failuresToUnreachable) {
      e.unreachable = true
      this.update(id, e)
      return { changed: 'unreachable', confirm: false }
    }
    return { changed: null, confirm: !e.unreachable }
  }

  /** The worker's engine publishes KV events of another block size (read over ZMQ). */
  engineBlockSize(id: bigint, dpRank: number, eventBlockSize: number): void {
    const e = this.entries.get(id)
    if (e === undefined || !this.opts.kvMode) return
    e.engineMismatch.set(dpRank, eventBlockSize)
    this.update(id, e)
  }

  /**
   * The worker's engine (one rank, or all) restarted or is read afresh: its next events say its
   * block size again.
   */
  engineReset(id: bigint, dpRank?: number): void {
    const e = this.entries.get(id)
    if (e === undefined || e.engineMismatch.size === 0) return
    if (dpRank === undefined) e.engineMismatch.clear()
    else e.engineMismatch.delete(dpRank)
    this.update(id, e)
  }

  isHeld(id: bigint): boolean {
    return this.held.has(id)
  }

  /** The worker's state; `suspended` is the proxy's verdict (Suspension.isSuspended). */
  state(id: bigint, suspended: boolean): HealthState {
    const e = this.entries.get(id)
    if (e !== undefined) {
      if (e.misconfigured !== null || e.engineMismatch.size > 0) return 'misconfigured'
      if (e.unreachable) return 'unreachable'
    }
    return suspended ? 'suspended' : 'healthy'
  }

  /** Why the worker is misconfigured or unreachable; null otherwise. */
  reason(id: bigint): string | null {
    const e = this.entries.get(id)
    if (e === undefined) return null
    if (e.misconfigured !== null) return e.misconfigured
    for (const [rank, size] of e.engineMismatch) {
      const bs = this.opts.blockSize
      return `rank ${rank} publishes KV events of block size ${size}, the router's is ${bs}: they are not applied; restart the engine with block size ${bs}`
    }
    if (e.unreachable) return `${e.failures} health probe(s) in a row failed, the last: ${e.lastError ?? 'no detail'}`
    return null
  }

  /** The worker's probe record; null before its first probe ends. */
  probe(id: bigint): ProbeView | null {
    const e = this.entries.get(id)
    if (e === undefined || e.lastProbeAt < 0) return null
    const now = this.now()
    return {
      path: e.path,
      consecutive_failures: e.failures,
      last_ok_ms_ago: e.lastOkAt < 0 ? null : Math.round(now - e.lastOkAt),
      last_probe_ms_ago: Math.round(now - e.lastProbeAt),
      last_error: e.lastError,
    }
  }

  private update(id: bigint, e: Entry): void {
    const out = e.misconfigured !== null || e.engineMismatch.size > 0 || e.unreachable
    if (out === this.held.has(id)) return
    if (out) this.held.add(id)
    else this.held.delete(id)
    this.opts.onHeld?.(id, out)
  }
}
