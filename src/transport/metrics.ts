// NATS intake, durable (JetStream) intake, engines' own ZMQ events and etcd discovery in the
// router's registry, read at scrape time (absent series while not configured).
import { Counter, Gauge } from 'prom-client'
import type { Registry } from 'prom-client'
import type { EngineIntake } from './engine-intake.js'
import type { EtcdDiscovery } from './etcd.js'
import type { NatsIntake } from './nats.js'
import type { DurableKvEvents } from './durable.js'

export interface Transports {
  readonly nats: NatsIntake | null
  readonly durable: DurableKvEvents | null
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
    name: 'kvrouter_durable_events_total',
    help: 'Durable intake (JetStream): messages applied and their bytes, acked, redelivered (already applied), consumer repositionings, failed requests',
    labelNames: ['what'],
    registers: [r],
    collect() {
      this.reset()
      const d = t.durable
      if (d === null) return
      const c = d.counters
      for (const [what, v] of [
        ['messages', c.messages],
        ['bytes', c.bytes],
        ['acked', c.acked],
        ['redelivered', c.redelivered],
        ['repositioned', c.repositioned],
        ['errors', c.errors],
      ] as const)
        this.inc({ what }, v)
    },
  })
  new Counter({
    name: 'kvrouter_durable_snapshots_total',
    help: 'Durable intake: snapshots uploaded, uploads failed, loaded, not usable; messages purged after them; workers dropped before them',
    labelNames: ['what'],
    registers: [r],
    collect() {
      this.reset()
      const d = t.durable
      if (d === null) return
      const c = d.counters
      for (const [what, v] of [
        ['uploaded', c.snapshotsUploaded],
        ['upload_failed', c.snapshotUploadsFailed],
        ['loaded', c.snapshotsLoaded],
        ['load_failed', c.snapshotLoadsFailed],
        ['purged_messages', c.purged],
        ['workers_dropped', c.workersDropped],
      ] as const)
        this.inc({ what }, v)
    },
  })
  new Gauge({
    name: 'kvrouter_durable_stream_messages',
    help: 'Messages in the durable stream at the last check (about every second)',
    registers: [r],
    collect() {
      this.reset()
      if (t.durable !== null) this.set(t.durable.streamMessages)
    },
  })
  new Gauge({
    name: 'kvrouter_durable_pending_messages',
    help: "Messages the replica's consumer had yet to deliver, as of its last delivery",
    registers: [r],
    collect() {
      this.reset()
      if (t.durable !== null) this.set(t.durable.pending)
    },
  })
  new Gauge({
    name: 'kvrouter_durable_catchup_events',
    help: 'Events a start replayed: what the snapshot held (source="snapshot") and the stream messages after it (source="stream")',
    labelNames: ['source'],
    registers: [r],
    collect() {
      this.reset()
      const d = t.durable
      if (d === null) return
      this.set({ source: 'snapshot' }, d.catchUp.snapshotEvents)
      if (d.catchUp.seconds !== null) this.set({ source: 'stream' }, d.catchUp.events)
    },
  })
  new Gauge({
    name: 'kvrouter_durable_catchup_seconds',
    help: 'Seconds from the consumer start until the stream as it stood at start was applied (absent until then)',
    registers: [r],
    collect() {
      this.reset()
      const s = t.durable?.catchUp.seconds
      if (s !== null && s !== undefined) this.set(s)
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
        ['duplicates', c.duplicates],
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
