// Active health probes of the registered workers: GET {url}/health every interval, over
// keep-alive connections of their own (a probe never waits behind a stream for a socket, and the
// proxy's pool is not disturbed). vLLM and SGLang serve /health; a worker that answers it 404 is
// asked GET {url}/v1/models from then on. Each worker has one probe at a time, and at most
// `concurrency` run at once, so a fleet of hung workers costs a bounded number of sockets.
import { Agent, request } from 'undici'
import type { Dispatcher } from 'undici'
import type { ProbeOutcome, ProbeResult } from './health.js'

/** Probes in flight at most, over the whole fleet. */
export const PROBE_CONCURRENCY = 64

export interface HealthProbesOptions {
  intervalMs: number
  timeoutMs: number
  concurrency?: number
  /** Each probe's result; true asks for the next probe of that worker half an interval later. */
  result: (id: bigint, url: string, r: ProbeResult) => boolean
  dispatcher?: Dispatcher
}

interface Target {
  readonly id: bigint
  readonly url: string
  path: string
  timer: NodeJS.Timeout | null
  running: boolean
  queued: boolean
  gone: boolean
}

export class HealthProbes {
  /** Probes ended, by outcome. */
  readonly counters: Record<ProbeOutcome, number> = { ok: 0, failed: 0, timeout: 0 }
  private readonly targets = new Map<bigint, Target>()
  private readonly waiting: Target[] = []
  private running = 0
  private closed = false
  private readonly dispatcher: Dispatcher
  private readonly ownDispatcher: boolean
  private readonly concurrency: number

  constructor(private readonly opts: HealthProbesOptions) {
    this.concurrency = opts.concurrency ?? PROBE_CONCURRENCY
    this.ownDispatcher = opts.dispatcher === undefined
    // idle connections outlive an interval, so each probe reuses the last one's
    this.dispatcher = opts.dispatcher ?? new Agent({ keepAliveTimeout: Math.max(10_000, 3 * opts.intervalMs), connect: { timeout: opts.timeoutMs } })
  }

  /**
   * Probes the worker from now on, starting at once: a registration, new or again, is checked
   * without waiting out an interval. A new URL starts over on /health.
   */
  watch(id: bigint, url: string): void {
    if (this.closed) return
    let t = this.targets.get(id)
    if (t !== undefined && t.url !== url) {
      this.drop(t)
      t = undefined
    }
    if (t === undefined) {
      t = { id, url, path: '/health', timer: null, running: false, queued: false, gone: false }
      this.targets.set(id, t)
    }
    this.schedule(t, 0)
  }

  /** The worker left: no more probes, and the one in flight is not reported. */
  unwatch(id: bigint): void {
    const t = this.targets.get(id)
    if (t !== undefined) this.drop(t)
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    for (const t of this.targets.values()) this.drop(t)
    this.waiting.length = 0
    if (this.ownDispatcher) await this.dispatcher.destroy().catch(() => undefined)
  }

  private drop(t: Target): void {
    t.gone = true
    if (t.timer !== null) clearTimeout(t.timer)
    t.timer = null
    if (this.targets.get(t.id) === t) this.targets.delete(t.id)
  }

  /** The next probe of `t` in `ms`; a probe running or waiting for a slot is not doubled. */
  private schedule(t: Target, ms: number): void {
    if (t.gone || this.closed || t.running || t.queued) return
    if (t.timer !== null) clearTimeout(t.timer)
    t.timer = setTimeout(() => this.start(t), ms)
    t.timer.unref()
  }

  private start(t: Target): void {
    t.timer = null
    if (t.gone || this.closed) return
    if (this.running >= this.concurrency) {
      t.queued = true
      this.waiting.push(t)
      return
    }
    this.running++
    t.running = true
    const started = performance.now()
    void this.probe(t).then((r) => this.ended(t, r, started))
  }

  private ended(t: Target, r: ProbeResult, started: number): void {
    this.running--
    t.running = false
    if (!this.closed && !t.gone) {
      this.counters[r.outcome]++
      const sooner = this.opts.result(t.id, t.url, r)
      const period = sooner ? this.opts.intervalMs / 2 : this.opts.intervalMs
      this.schedule(t, Math.max(0, period - (performance.now() - started)))
    }
    while (this.running < this.concurrency && this.waiting.length > 0) {
      const next = this.waiting.shift() as Target
      next.queued = false
      this.start(next)
    }
  }

  /** One probe: /health, or /v1/models where /health is 404, within one timeout for both. */
  private async probe(t: Target): Promise<ProbeResult> {
    const ac = new AbortController()
    const timer = setTimeout(() => ac.abort(), this.opts.timeoutMs)
    timer.unref()
    try {
      let status = await this.get(t.url + t.path, ac.signal)
      if (status === 404 && t.path === '/health') {
        t.path = '/v1/models'
        status = await this.get(t.url + t.path, ac.signal)
      }
      // any answer but a server error says the worker is up: 401 or 403 from a worker that wants
      // a key the router does not hold included
      if (status < 500) return { outcome: 'ok', detail: null, path: t.path }
      return { outcome: 'failed', detail: `GET ${t.path} answered ${status}`, path: t.path }
    } catch (err) {
      if (ac.signal.aborted) return { outcome: 'timeout', detail: `GET ${t.path}: no answer in ${this.opts.timeoutMs / 1000} s`, path: t.path }
      return { outcome: 'failed', detail: `GET ${t.path}: ${errorText(err)}`, path: t.path }
    } finally {
      clearTimeout(timer)
    }
  }

  private async get(url: string, signal: AbortSignal): Promise<number> {
    const res = await request(url, { method: 'GET', dispatcher: this.dispatcher, signal, headers: { accept: 'application/json' } })
    // read to its end, so the connection is kept for the next probe
    await res.body.dump({ limit: 65_536, signal })
    return res.statusCode
  }
}

function errorText(err: unknown): string {
  const e = err as { message?: unknown; code?: unknown; cause?: { message?: unknown } } | null
  const msg = typeof e?.message === 'string' && e.message !== '' ? e.message : String(err)
  const cause = typeof e?.cause?.message === 'string' && e.cause.message !== msg ? ` (${e.cause.message})` : ''
  return msg + cause
}
