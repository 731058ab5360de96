// Prometheus metrics (prom-client, one registry per router; docs/metrics.md). Names follow Dynamo's
// where the meaning is the same, so existing dashboards keep working; kvrouter_* names are this
// router's own (shards). Shard and scheduler figures are read at scrape time (shared-memory
// counters, scheduler stats): the request path only observes a few allocation-free histograms.
import { PerformanceObserver, constants as perfConstants, monitorEventLoopDelay } from 'node:perf_hooks'
import type { IntervalHistogram } from 'node:perf_hooks'
import { Counter, Gauge, Histogram, Registry } from 'prom-client'
import { BoundHistogram } from './histogram.js'
import { LOG_BUFFER_BYTES, logLinesDropped } from '../runtime/log.js'
import type { RouteDecision } from '../scheduler/scheduler.js'

const MS_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000]
const S_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
const TOKEN_BUCKETS = [16, 64, 256, 1024, 4096, 16384, 65536, 262144]
const RATIO_BUCKETS = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1]
/** Finer than prom-client's default GC buckets: a router's scavenges take 1-10 ms, and that range is what moves its latency tail. */
const GC_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1]
/** Sampling period of the event-loop delay (ms). */
const LOOP_DELAY_RESOLUTION_MS = 10
const GC_KINDS: Readonly<Record<number, string>> = {
  [perfConstants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [perfConstants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [perfConstants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental',
  [perfConstants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
}

type H = BoundHistogram

/** What the router's own series are labelled with. */
export interface MetricLabels {
  readonly namespace: string
  readonly component: string
}

/** Registers a collector (read at scrape time) in `r`: each part of the router registers its own. */
export function counter(r: Registry, name: string, help: string, read: () => number): void {
  new Counter({
    name,
    help,
    registers: [r],
    collect() {
      this.reset()
      this.inc(read())
    },
  })
}

export function gauge(r: Registry, name: string, help: string, read: () => number): void {
  new Gauge({
    name,
    help,
    registers: [r],
    collect() {
      this.set(read())
    },
  })
}

/**
 * Distinct `model` label values kept apart; later ones are counted as MODEL_OTHER. The model
 * comes from the client's body, and every distinct value would otherwise be a series for good.
 */
const MAX_MODELS = 256
const MODEL_OTHER = '(other)'

/** The map under `key`, made on first use. */
function branch<K, V>(m: Map<K, V>, key: K, make: () => V): V {
  let v = m.get(key)
  if (v === undefined) m.set(key, (v = make()))
  return v
}

export class RouterMetrics {
  readonly registry = new Registry()
  readonly routerId: string
  private readonly hashing: H
  private readonly findMatches: H
  private readonly scheduling: H
  private readonly total: H
  private readonly hitRate: H
  private readonly isl: H
  private readonly ttft: H
  private readonly itl: H
  private readonly osl: H
  // per-request counts are plain numbers in maps, read into prom-client at scrape time: its
  // labelled inc() hashes the label set into a new string on every call
  private decisions = 0
  /** Requests' objectives against what they got: ttft met, ttft missed, tpot met, tpot missed. */
  private readonly objectiveResults = [0, 0, 0, 0]
  /** model → endpoint → request type → status → count */
  private readonly frontendRequests = new Map<string, Map<string, Map<string, Map<number, number>>>>()
  /** model → requests being proxied */
  private readonly inflightByModel = new Map<string, number>()
  private readonly rejections: Counter<string>
  private readonly retries: Counter<string>
  readonly upstreamErrors: Counter<string>
  private readonly eventsHttp: Counter<string>
  private readonly eventsHttpRefused: Counter<string>
  private readonly gcObserver: PerformanceObserver
  private readonly loopDelay: IntervalHistogram

  constructor(labels: MetricLabels) {
    const r = this.registry
    const cfg = labels
    this.routerId = `${cfg.namespace}-router-${process.pid}`
    const base = { dynamo_namespace: cfg.namespace, dynamo_component: cfg.component, dynamo_endpoint: 'generate' }
    const comp = ['dynamo_namespace', 'dynamo_component', 'dynamo_endpoint']
    const ov = (name: string, help: string): H => new BoundHistogram(`dynamo_router_overhead_${name}_ms`, help, { router_id: this.routerId }, MS_BUCKETS, r)
    this.hashing = ov('block_hashing', 'Time to hash the prompt into blocks (ms)')
    this.findMatches = ov('indexer_find_matches', 'Time of the overlap query over the indexer shards (ms)')
    this.scheduling = ov('scheduling', 'Time of cost, selection and booking, including queueing (ms)')
    this.total = ov('total', 'Total routing overhead (ms)')
    const ch = (name: string, help: string, buckets: number[]): H => new BoundHistogram(`dynamo_component_router_${name}`, help, base, buckets, r)
    this.hitRate = ch('kv_hit_rate', 'Predicted KV hit rate of routed requests (overlap blocks / prompt blocks)', RATIO_BUCKETS)
    this.isl = ch('input_sequence_tokens', 'Prompt length of routed requests', TOKEN_BUCKETS)
    this.ttft = ch('time_to_first_token_seconds', 'Time to first token through the router', S_BUCKETS)
    this.itl = ch('inter_token_latency_seconds', 'Time between streamed chunks through the router', S_BUCKETS)
    this.osl = ch('output_sequence_tokens', 'Output length (streamed chunks or usage.completion_tokens)', TOKEN_BUCKETS)
    const self = this
    new Counter({
      name: 'dynamo_component_router_requests_total',
      help: 'Requests routed',
      labelNames: comp,
      registers: [r],
      collect() {
        this.reset()
        this.inc(base, self.decisions)
      },
    })
    new Counter({
      name: 'dynamo_frontend_requests_total',
      help: 'HTTP requests by endpoint and status',
      labelNames: ['model', 'endpoint', 'request_type', 'status'],
      registers: [r],
      collect() {
        this.reset()
        for (const [model, byEndpoint] of self.frontendRequests)
          for (const [endpoint, byType] of byEndpoint)
            for (const [type, byStatus] of byType)
              for (const [status, n] of byStatus) this.inc({ model, endpoint, request_type: type, status: String(status) }, n)
      },
    })
    new Counter({
      name: 'kvrouter_objective_results_total',
      help: 'Proxied requests with latency objectives by whether their actual TTFT, and for streams TPOT, met them',
      labelNames: ['objective', 'met'],
      registers: [r],
      collect() {
        this.reset()
        const n = self.objectiveResults
        this.inc({ objective: 'ttft', met: 'true' }, n[0] as number)
        this.inc({ objective: 'ttft', met: 'false' }, n[1] as number)
        this.inc({ objective: 'tpot', met: 'true' }, n[2] as number)
        this.inc({ objective: 'tpot', met: 'false' }, n[3] as number)
      },
    })
    this.rejections = new Counter({
      name: 'dynamo_frontend_model_rejection_total',
      help: 'Requests refused because every worker was busy or the queue was full',
      labelNames: ['model', 'endpoint'],
      registers: [r],
    })
    new Gauge({
      name: 'dynamo_frontend_inflight_requests',
      help: 'Requests being proxied',
      labelNames: ['model'],
      registers: [r],
      collect() {
        for (const [model, n] of self.inflightByModel) this.set({ model }, n)
      },
    })
    this.retries = new Counter({
      name: 'kvrouter_proxy_retries_total',
      help: 'Requests retried on another worker after a failure before the first token',
      registers: [r],
    })
    this.upstreamErrors = new Counter({
      name: 'kvrouter_proxy_upstream_errors_total',
      help: 'Upstream failures by phase',
      labelNames: ['phase'],
      registers: [r],
    })
    this.eventsHttp = new Counter({ name: 'kvrouter_http_events_received_total', help: 'KV events received over POST /v1/kv-events', registers: [r] })
    this.eventsHttpRefused = new Counter({
      name: 'kvrouter_http_events_refused_total',
      help: 'POST /v1/kv-events batches refused whole: an event that does not decode, or a full backlog (503)',
      registers: [r],
    })
    // every request in flight waits out a pause of the main thread: when the latency tail moves,
    // the scavenges are the first thing to look at (the name is prom-client's default metric's)
    const gc = new Histogram({
      name: 'nodejs_gc_duration_seconds',
      help: 'Garbage collection pauses of the main thread, by kind',
      labelNames: ['kind'],
      buckets: GC_BUCKETS,
      registers: [r],
    })
    for (const kind of Object.values(GC_KINDS)) gc.zero({ kind })
    this.gcObserver = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        const kind = GC_KINDS[(e as { detail?: { kind?: number } | null }).detail?.kind ?? -1]
        if (kind !== undefined) gc.observe({ kind }, e.duration / 1000)
      }
    })
    this.gcObserver.observe({ entryTypes: ['gc'] })
    // the other half of what moves the tail: the main thread busy or waiting for a core. A native
    // timer samples it (no JS runs for it). Each sample is the time between two of its ticks, so
    // the period is taken off to leave the delay (prom-client's nodejs_eventloop_lag_* keep it in,
    // which puts an idle loop's p50 at 10 ms; hence names of our own). Each scrape reports the
    // interval since the last one and starts a new one, as prom-client's do: one scraper is
    // assumed (with two, each sees only its share of the intervals), and the sample that spans a
    // scrape is lost.
    this.loopDelay = monitorEventLoopDelay({ resolution: LOOP_DELAY_RESOLUTION_MS })
    this.loopDelay.enable()
    const loop = this.loopDelay
    const loopStats = { mean: 0, p50: 0, p90: 0, p99: 0, max: 0 }
    let loopRead = 0
    const delay = (ns: number): number => Math.max(0, ns / 1e6 - LOOP_DELAY_RESOLUTION_MS) / 1000
    const readLoop = (): void => {
      // a reading starts a new interval, so the gauges of one scrape share one reading (scrapes
      // come seconds apart; one within 5 ms of the last is given the same figures)
      const now = performance.now()
      if (now - loopRead < 5) return
      loopRead = now
      const any = loop.count > 0
      loopStats.mean = any ? delay(loop.mean) : 0
      loopStats.p50 = any ? delay(loop.percentile(50)) : 0
      loopStats.p90 = any ? delay(loop.percentile(90)) : 0
      loopStats.p99 = any ? delay(loop.percentile(99)) : 0
      loopStats.max = any ? delay(loop.max) : 0
      loop.reset()
    }
    for (const k of ['mean', 'p50', 'p90', 'p99', 'max'] as const) {
      new Gauge({
        name: `kvrouter_eventloop_delay_${k}_seconds`,
        help: `Event-loop delay of the main thread since the last scrape (${k}), sampled every ${LOOP_DELAY_RESOLUTION_MS} ms`,
        registers: [r],
        collect() {
          readLoop()
          this.set(loopStats[k])
        },
      })
    }
    counter(
      r,
      'kvrouter_log_lines_dropped_total',
      `Log lines dropped because the reader of stderr fell ${LOG_BUFFER_BYTES / (1024 * 1024)} MiB behind or went away (the router never waits for it)`,
      logLinesDropped,
    )
    // each series reads its own figure: a scrape may fetch any one of them alone
    counter(r, 'process_cpu_user_seconds_total', 'User CPU time of the process, all threads (s)', () => process.cpuUsage().user / 1e6)
    counter(r, 'process_cpu_system_seconds_total', 'System CPU time of the process, all threads (s)', () => process.cpuUsage().system / 1e6)
    counter(r, 'process_cpu_seconds_total', 'User and system CPU time of the process, all threads (s)', () => {
      const c = process.cpuUsage()
      return (c.user + c.system) / 1e6
    })
    new Gauge({ name: 'process_start_time_seconds', help: 'Start of the process since the Unix epoch (s)', registers: [r] }).set(
      Math.round(Date.now() / 1000 - process.uptime()),
    )
    gauge(r, 'process_resident_memory_bytes', 'Resident memory of the process (bytes)', () => process.memoryUsage.rss())
    gauge(r, 'nodejs_heap_size_total_bytes', 'V8 heap of the main thread, reserved (bytes)', () => process.memoryUsage().heapTotal)
    gauge(r, 'nodejs_heap_size_used_bytes', 'V8 heap of the main thread, in use (bytes)', () => process.memoryUsage().heapUsed)
    gauge(
      r,
      'nodejs_external_memory_bytes',
      'Memory outside the V8 heap held by its objects, buffers in flight included (bytes)',
      () => process.memoryUsage().external,
    )
  }

  /** Stops watching GC pauses and the event loop (the router is closing). */
  close(): void {
    this.gcObserver.disconnect()
    this.loopDelay.disable()
  }

  observeOverhead(hashMs: number, findMs: number, schedMs: number, totalMs: number): void {
    this.hashing.observe(hashMs)
    this.findMatches.observe(findMs)
    this.scheduling.observe(schedMs)
    this.total.observe(totalMs)
  }

  observeDecision(d: RouteDecision, blocks: number, isl: number): void {
    this.decisions++
    this.isl.observe(isl)
    this.hitRate.observe(blocks > 0 ? d.overlapBlocks / blocks : 0)
  }

  observeTtft(sec: number): void {
    this.ttft.observe(sec)
  }

  /** A request's actual TTFT or TPOT against its objective. */
  objectiveResult(objective: 'ttft' | 'tpot', met: boolean): void {
    const i = (objective === 'ttft' ? 0 : 2) + (met ? 0 : 1)
    this.objectiveResults[i] = (this.objectiveResults[i] as number) + 1
  }

  observeItl(sec: number): void {
    this.itl.observe(sec)
  }

  observeOutput(tokens: number): void {
    this.osl.observe(tokens)
  }

  request(model: string, endpoint: string, type: 'stream' | 'unary', status: number): void {
    const m = this.frontendRequests
    const byStatus = branch(
      branch(
        branch(m, this.modelLabel(m, model), () => new Map()),
        endpoint,
        () => new Map(),
      ),
      type,
      () => new Map<number, number>(),
    )
    byStatus.set(status, (byStatus.get(status) ?? 0) + 1)
  }

  /** A request starts being proxied. */
  proxyStarted(model: string): void {
    const m = this.inflightByModel
    const key = this.modelLabel(m, model)
    m.set(key, (m.get(key) ?? 0) + 1)
  }

  /** A request stops being proxied (same model as it started with). */
  proxyEnded(model: string): void {
    const m = this.inflightByModel
    const key = this.modelLabel(m, model)
    m.set(key, (m.get(key) ?? 0) - 1)
  }

  /** `model` as a label value of a series kept in `m`: past MAX_MODELS distinct values, MODEL_OTHER. */
  private modelLabel(m: Map<string, unknown>, model: string): string {
    return m.has(model) || m.size < MAX_MODELS ? model : MODEL_OTHER
  }

  rejected(model: string, endpoint: string): void {
    this.rejections.inc({ model: this.modelLabel(this.frontendRequests, model), endpoint })
  }

  retried(): void {
    this.retries.inc()
  }

  eventsReceived(n: number): void {
    this.eventsHttp.inc(n)
  }

  eventsRefused(n: number): void {
    this.eventsHttpRefused.inc(n)
  }
}
