// `kv-router indexer`'s Prometheus series (docs/metrics.md, "kv-router indexer"): requests
// refused by route and code, query latency, registrations, and the engines' streams as read.
import { Counter, Histogram, Registry } from 'prom-client'
import { counter, gauge } from '../metrics/registry.js'
import type { IndexerRegistry } from './registry.js'

const MS_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000]

export class IndexerMetrics {
  readonly registry = new Registry()
  registrations = 0
  private readonly refused: Counter<'route' | 'code'>
  private readonly latency: Histogram<'route'>

  constructor(reg: IndexerRegistry) {
    const r = this.registry
    this.refused = new Counter({
      name: 'kvrouter_indexer_requests_rejected_total',
      help: 'Requests the indexer refused, by route and KVR_ERR_* code',
      labelNames: ['route', 'code'],
      registers: [r],
    })
    this.latency = new Histogram({
      name: 'kvrouter_indexer_query_duration_ms',
      help: 'Time to answer /query and /query_by_hash (hashing, the overlap query and the answer), in ms',
      labelNames: ['route'],
      buckets: MS_BUCKETS,
      registers: [r],
    })
    counter(r, 'kvrouter_indexer_registrations_total', 'Registrations the indexer accepted', () => this.registrations)
    gauge(r, 'kvrouter_indexer_workers', 'Registered worker-ranks (instance, dp rank, model, routing group)', () => reg.workerCount)
    gauge(r, 'kvrouter_indexer_groups', 'Indexes: (model_name, routing_group) pairs with a registration', () => reg.groupCount)
    const zmq = (name: string, help: string, key: keyof ReturnType<IndexerRegistry['zmqCounters']>): void =>
      counter(r, name, help, () => reg.zmqCounters()[key])
    zmq('kvrouter_indexer_zmq_batches_total', "Engine KV-event batches read from the engines' ZMQ streams", 'batches')
    zmq('kvrouter_indexer_zmq_gaps_total', 'Gaps in an engine stream (missing sequence numbers)', 'gaps')
    zmq('kvrouter_indexer_zmq_replays_total', "Replays asked of an engine's replay socket", 'replays')
    zmq('kvrouter_indexer_zmq_restarts_total', 'Engine restarts seen (a stream that counts from 0 again)', 'restarts')
    counter(r, 'kvrouter_indexer_zmq_dropped_total', 'Frames dropped as malformed, and batches the index refused as malformed', () => {
      const c = reg.zmqCounters()
      return c.badFrames + c.sinkErrors
    })
  }

  rejected(route: string, code: string): void {
    this.refused.inc({ route, code })
  }

  query(route: string, ms: number): void {
    this.latency.observe({ route }, ms)
  }
}
