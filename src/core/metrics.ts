// The worker registry's series in the router's registry, and each worker-rank's learned engine
// model's, read at scrape time.
import { Counter, Gauge } from 'prom-client'
import type { Registry } from 'prom-client'
import { collectedCounter, collectedGauge } from '../metrics/collected.js'
import type { LearnedEngine } from '../scheduler/engine-estimator.js'
import type { Scheduler } from '../scheduler/scheduler.js'
import type { EventSources } from './event-sources.js'
import { HEALTH_STATES } from './health.js'
import type { HealthState, WorkerHealth } from './health.js'
import type { HealthProbes } from './health-probes.js'
import type { SessionAffinity } from './session-affinity.js'
import type { Suspension } from './suspension.js'
import type { WorkerRegistry } from './worker-registry.js'

export function registerWorkerMetrics(
  r: Registry,
  workers: WorkerRegistry,
  suspension: Suspension,
  sources: EventSources,
  sessions: SessionAffinity | null,
  modelName: string,
): void {
  new Gauge({
    name: 'kvrouter_session_bindings',
    help: 'Sessions (X-Dynamo-Session-ID) bound to a worker-rank now',
    registers: [r],
    collect() {
      this.set(sessions?.size ?? 0)
    },
  })
  new Counter({
    name: 'kvrouter_session_affinity_total',
    help:
      'Requests with a session id by outcome: hit (sent to its bound worker-rank), bound (no live binding: bound where it went), broken (its ' +
      'worker-rank could not take it), evicted (bindings dropped past the bound)',
    labelNames: ['outcome'],
    registers: [r],
    collect() {
      if (sessions === null) return
      const c = sessions.counters
      this.reset()
      this.inc({ outcome: 'hit' }, c.hits)
      this.inc({ outcome: 'bound' }, c.bound)
      this.inc({ outcome: 'broken' }, c.broken)
      this.inc({ outcome: 'evicted' }, c.evicted)
    },
  })
  new Gauge({
    name: 'kvrouter_worker_ranks_no_events',
    help: 'Registered worker-ranks that have sent no KV event since they registered, routed on predictions (KV-events mode)',
    registers: [r],
    collect() {
      this.set(sources.ranks)
    },
  })
  new Gauge({
    name: 'kvrouter_workers_suspended',
    help: 'Workers left out of routing after failures in a row (1 s, doubling to 30 s; GET /v1/workers says which)',
    registers: [r],
    collect() {
      this.set(suspension.count())
    },
  })
  new Gauge({
    name: 'dynamo_frontend_model_workers',
    help: 'Registered workers',
    labelNames: ['model'],
    registers: [r],
    collect() {
      this.set({ model: modelName }, workers.size)
    },
  })
}

/** Workers by health state, and the probes' outcomes. */
export function registerHealthMetrics(r: Registry, workers: WorkerRegistry, health: WorkerHealth, suspension: Suspension, probes: HealthProbes | null): void {
  new Gauge({
    name: 'kvrouter_workers',
    help:
      'Registered workers by health state: healthy, suspended (request failures), unreachable (health probes failing), misconfigured (another ' +
      'block size, kv mode)',
    labelNames: ['state'],
    registers: [r],
    collect() {
      const n: Record<HealthState, number> = { healthy: 0, suspended: 0, unreachable: 0, misconfigured: 0 }
      for (const w of workers.all()) n[health.state(w.id, suspension.isSuspended(w))]++
      for (const s of HEALTH_STATES) this.set({ state: s }, n[s])
    },
  })
  new Counter({
    name: 'kvrouter_worker_probes_total',
    help: 'Health probes of the workers by outcome: ok (answered below 500), failed (no connection, reset, 5xx), timeout',
    labelNames: ['outcome'],
    registers: [r],
    collect() {
      this.reset()
      if (probes === null) return
      const c = probes.counters
      this.inc({ outcome: 'ok' }, c.ok)
      this.inc({ outcome: 'failed' }, c.failed)
      this.inc({ outcome: 'timeout' }, c.timeout)
    },
  })
}

/**
 * Each worker-rank's learned engine model: its speeds against the default model, the observations
 * they rest on and their spread. Read at scrape time from the live worker-ranks, so a worker-rank
 * that leaves takes its series with it; no series while learning is off.
 */
export function registerEngineMetrics(r: Registry, sched: Scheduler): void {
  const each = (fill: (labels: { worker_id: string; dp_rank: string }, e: LearnedEngine) => void): void => {
    for (const s of sched.stats().slots) {
      const e = sched.learnedEngine(s.slot)
      if (e !== null) fill({ worker_id: s.workerId.toString(), dp_rank: String(s.dpRank) }, e)
    }
  }
  const ranks = ['worker_id', 'dp_rank']
  collectedGauge(
    r,
    'kvrouter_worker_prefill_speed',
    'Learned prefill speed of the worker-rank against the default engine model (1 = the default, 0.5 = half as fast)',
    ranks,
    (g) => each((l, e) => g.set(l, e.prefillSpeed)),
  )
  collectedGauge(
    r,
    'kvrouter_worker_decode_speed',
    'Learned decode speed of the worker-rank against the default engine model (1 = the default, 0.5 = half as fast)',
    ranks,
    (g) => each((l, e) => g.set(l, e.decodeSpeed)),
  )
  collectedCounter(
    r,
    'kvrouter_worker_engine_samples_total',
    "Observations the worker-rank's engine model learned from since it registered: kind ttft (time to first token) or itl (inter-token)",
    [...ranks, 'kind'],
    (c) =>
      each((l, e) => {
        c.inc({ ...l, kind: 'ttft' }, e.ttftSamples)
        c.inc({ ...l, kind: 'itl' }, e.itlSamples)
      }),
  )
  collectedGauge(
    r,
    'kvrouter_worker_engine_spread',
    "Robust relative spread of the worker-rank's observations around its learned engine model (0.1 = ±10%), by kind ttft or itl",
    [...ranks, 'kind'],
    (g) =>
      each((l, e) => {
        g.set({ ...l, kind: 'ttft' }, e.ttftSpread)
        g.set({ ...l, kind: 'itl' }, e.itlSpread)
      }),
  )
}
