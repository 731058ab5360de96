// NATS intake, engines' own ZMQ events and etcd discovery in the router's registry, read at
// scrape time (absent series while not configured).
import { Counter, Gauge } from 'prom-client'
import type { Registry } from 'prom-client'
import type { EngineIntake } from './engine-intake.js'
import type { EtcdDiscovery } from './etcd.js'
import type { NatsIntake } from './nats.js'

export interface Transports {
  readonly nats: NatsIntake | null
  readonly discovery: EtcdDiscovery | null
  readonly engines: EngineIntake
  readonly connected: { nats: boolean | null; etcd: boolean | null }
}

export function registerTransportMetrics(r: Registry, t: Transports): void {
  new Counter({
    name: 'kvrouter_nats_total',
    help: 'NATS intake: messages, bytes, disconnects, reconnects, slow-consumer episodes, errors',
    labelNames: ['what'],
    registers: [r],
    collect() {
      this.reset()
      const n = t.nats
      if (n === null) return
      const c = n.counters
      for (const [what, v] of [
        ['messages', c.messages],
        ['bytes', c.bytes],
        ['metrics_messages', c.metricsMessages],
        ['metrics_malformed', c.metricsMalformed],
        ['disconnects', c.disconnects],
        ['reconnects', c.reconnects],
        ['slow_consumer', c.slowConsumer],
        ['errors', c.errors],
      ] as const)
        this.inc({ what }, v)
    },
  })
  new Counter({
    name: 'kvrouter_zmq_total',
    help: "Engines' own KV events over ZMQ: batches, bytes, bad frames, sequence gaps, replays (and those that fell short), engine restarts, batches refused as malformed",
    labelNames: ['what'],
    registers: [r],
    collect() {
      this.reset()
      const e = t.engines
      if (!e.used) return
      const c = e.counters()
      for (const [what, v] of [
        ['batches', c.batches],
        ['bytes', c.bytes],
        ['bad_frames', c.badFrames],
        ['gaps', c.gaps],
        ['replays', c.replays],
        ['replays_incomplete', c.replaysIncomplete],
        ['restarts', c.restarts],
        ['sink_errors', c.sinkErrors],
      ] as const)
        this.inc({ what }, v)
    },
  })
  new Counter({
    name: 'kvrouter_engine_events_skipped_total',
    help: "Engines' own KV events not applied, by reason",
    labelNames: ['reason'],
    registers: [r],
    collect() {
      this.reset()
      const e = t.engines
      if (!e.used) return
      for (const [reason, v] of Object.entries(e.skipped)) this.inc({ reason }, v)
    },
  })
  new Counter({
    name: 'kvrouter_engine_events_deduplicated_total',
    help: "Engines' own KV events de-duplicated per worker-rank: blocks stored again while held, block removals held back while the hash is stored more often",
    labelNames: ['what'],
    registers: [r],
    collect() {
      this.reset()
      const e = t.engines
      if (!e.used) return
      const c = e.engineCounters()
      this.inc({ what: 'duplicate_stores' }, c.duplicateStores)
      this.inc({ what: 'suppressed_removals' }, c.suppressedRemovals)
    },
  })
  new Counter({
    name: 'kvrouter_engine_batches_malformed_total',
    help: "Engines' own KV-event batches refused by the shards, by reason",
    labelNames: ['reason'],
    registers: [r],
    collect() {
      this.reset()
      const e = t.engines
      if (!e.used) return
      for (const [reason, v] of Object.entries(e.engineCounters().malformed)) this.inc({ reason }, v)
    },
  })
  new Gauge({
    name: 'kvrouter_connected',
    help: '1 while the configured NATS / etcd connection is up, 0 while it is down',
    labelNames: ['service'],
    registers: [r],
    collect() {
      this.reset()
      const conn = t.connected
      if (conn.nats !== null) this.set({ service: 'nats' }, conn.nats ? 1 : 0)
      if (conn.etcd !== null) this.set({ service: 'etcd' }, conn.etcd ? 1 : 0)
    },
  })
  new Counter({
    name: 'kvrouter_etcd_total',
    help: 'etcd discovery: puts, deletes, re-lists, disconnects, malformed records',
    labelNames: ['what'],
    registers: [r],
    collect() {
      this.reset()
      const d = t.discovery
      if (d === null) return
      for (const [what, v] of Object.entries(d.counters)) this.inc({ what }, v)
    },
  })
}
