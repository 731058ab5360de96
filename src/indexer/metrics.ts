// `kv-router indexer`'s Prometheus series (docs/metrics.md, "kv-router indexer"): requests
// refused by route and code, query latency, registrations; and, under the router's names, the
// engines' streams as read and the events the shards applied.
import { Counter, Histogram, Registry } from 'prom-client'
import { counter, gauge } from '../metrics/registry.js'
import type { IndexerRegistry } from './registry.js'
import type { ShardPool } from '../shards/pool.js'

const SECONDS_BUCKETS = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]

export class IndexerMetrics {
  readonly registry = new Registry()
  registrations = 0
  private readonly refused: Counter<'route' | 'code'>
  private readonly latency: Histogram<'route'>

  constructor(reg: IndexerRegistry, pool: ShardPool) {
    const r = this.registry
    this.refused = new Counter({
      name: 'kvrouter_indexer_requests_rejected_total',
      help: 'Requests the indexer refused, by route and KVR_ERR_* code',
      labelNames: ['route', 'code'],
      registers: [r],
    })
    this.latency = new Histogram({
      name: 'kvrouter_indexer_answer_seconds',
      help: 'Time to answer /query and /query_by_hash (hashing, the overlap query and the answer), in seconds',
      labelNames: ['route'],
      buckets: SECONDS_BUCKETS,
      registers: [r],
    })
    counter(r, 'kvrouter_indexer_registrations_total', 'Registrations the indexer accepted', () => this.registrations)
    gauge(r, 'kvrouter_indexer_workers', 'Registered worker-ranks (instance, dp rank, model, routing group)', () => reg.workerCount)
    gauge(r, 'kvrouter_indexer_groups', 'Indexes: (model_name, routing_group) pairs with a registration', () => reg.groupCount)
    // the router's names for the same figures, so that dashboards and tools read both alike
    new Counter({
      name: 'kvrouter_zmq_total',
      help:
        "Engines' own KV events over ZMQ: batches, bytes, bad frames, sequence gaps, replays (and those that fell short), engine restarts, " +
        'batches refused as malformed',
      labelNames: ['what'],
      registers: [r],
      collect() {
        this.reset()
        const c = reg.zmqCounters()
        for (const [k, v] of Object.entries(c)) this.inc({ what: k.replace(/[A-Z]/g, (m) => `_${m.toLowerCase()}`) }, v)
      },
    })
    const shardCounter = (name: string, help: string, pick: (c: ReturnType<ShardPool['counters']>[number]) => number): void => {
      new Counter({
        name,
        help,
        labelNames: ['shard'],
        registers: [r],
        collect() {
          this.reset()
          for (const c of pool.counters()) this.inc({ shard: String(c.shard) }, pick(c))
        },
      })
    }
    shardCounter('kvrouter_shard_events_received_total', 'Event messages the shard took from its ring', (c) => c.received)
    shardCounter('kvrouter_shard_events_applied_total', "Events applied to the shard's index", (c) => c.applied)
    shardCounter('kvrouter_shard_events_malformed_total', 'Event messages that did not decode', (c) => c.malformed)
  }

  rejected(route: string, code: string): void {
    this.refused.inc({ route, code })
  }

  query(route: string, ms: number): void {
    this.latency.observe({ route }, ms / 1000)
  }
}
