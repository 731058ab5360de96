// The worker registry's series in the router's registry, read at scrape time.
import { Counter, Gauge } from 'prom-client'
import type { Registry } from 'prom-client'
import type { EventSources } from './event-sources.js'
import type { SessionAffinity } from './session-affinity.js'
import type { Suspension } from './suspension.js'
import type { WorkerRegistry } from './worker-registry.js'

export function registerWorkerMetrics(r: Registry, workers: WorkerRegistry, suspension: Suspension, sources: EventSources, sessions: SessionAffinity | null, modelName: string): void {
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
    help: 'Requests with a session id by outcome: hit (sent to its bound worker-rank), bound (no live binding: bound where it went), broken (its worker-rank could not take it), evicted (bindings dropped past the bound)',
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
