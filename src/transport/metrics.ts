// NATS intake, durable (JetStream) intake, engines' own ZMQ events and etcd discovery in the
// router's registry, read at scrape time (absent series while not configured).
import type { Registry } from 'prom-client'
import { collectedGauge, labelledCounter, valueGauge } from '../metrics/collected.js'
import type { DurableKvEvents } from './durable.js'
import type { EngineIntake } from './engine-intake.js'
import type { EtcdDiscovery } from './etcd.js'
import type { NatsIntake } from './nats.js'

export interface Transports {
  readonly nats: NatsIntake | null
  readonly durable: DurableKvEvents | null
  readonly discovery: EtcdDiscovery | null
  readonly engines: EngineIntake
  readonly connected: { nats: boolean | null; etcd: boolean | null }
}

/** A labelledCounter's rows: the named counters of `c`, each labelled with its name in snake_case; null without `c`. */
function byField<K extends string>(c: Readonly<Record<K, number>> | undefined, keys: readonly K[]): [string, number][] | null {
  if (c === undefined) return null
  return keys.map((k) => [k.replace(/[A-Z]/g, (m) => `_${m.toLowerCase()}`), c[k]])
}

export function registerTransportMetrics(r: Registry, t: Transports): void {
  labelledCounter(r, 'kvrouter_nats_total', 'NATS intake: messages, bytes, disconnects, reconnects, slow-consumer episodes, errors', 'what', () => {
    const fields = ['messages', 'bytes', 'metricsMessages', 'metricsMalformed', 'disconnects', 'reconnects', 'slowConsumer', 'errors'] as const
    return byField(t.nats?.counters, fields)
  })
  labelledCounter(
    r,
    'kvrouter_durable_events_total',
    'Durable intake (JetStream): messages applied and their bytes, acked, redelivered (already applied), consumer repositionings, stalls, failed requests',
    'what',
    () => byField(t.durable?.counters, ['messages', 'bytes', 'acked', 'redelivered', 'repositioned', 'stalled', 'errors']),
  )
  labelledCounter(
    r,
    'kvrouter_durable_snapshots_total',
    'Durable intake: snapshots uploaded, uploads failed, loaded, not usable; messages purged after them; workers dropped before them',
    'what',
    () => {
      const c = t.durable?.counters
      if (c === undefined) return null
      return [
        ['uploaded', c.snapshotsUploaded],
        ['upload_failed', c.snapshotUploadsFailed],
        ['loaded', c.snapshotsLoaded],
        ['load_failed', c.snapshotLoadsFailed],
        ['purged_messages', c.purged],
        ['workers_dropped', c.workersDropped],
      ]
    },
  )
  valueGauge(
    r,
    'kvrouter_durable_stream_messages',
    'Messages in the durable stream at the last check (about every second)',
    () => t.durable?.streamMessages ?? null,
  )
  valueGauge(
    r,
    'kvrouter_durable_pending_messages',
    "Messages the replica's consumer had yet to deliver, as of its last delivery",
    () => t.durable?.pending ?? null,
  )
  collectedGauge(
    r,
    'kvrouter_durable_catchup_events',
    'Events a start replayed: what the snapshot held (source="snapshot") and the stream messages after it (source="stream")',
    ['source'],
    (g) => {
      const d = t.durable
      if (d === null) return
      g.set({ source: 'snapshot' }, d.catchUp.snapshotEvents)
      if (d.catchUp.seconds !== null) g.set({ source: 'stream' }, d.catchUp.events)
    },
  )
  valueGauge(
    r,
    'kvrouter_durable_catchup_seconds',
    'Seconds from the consumer start until the stream as it stood at start was applied (absent until then)',
    () => t.durable?.catchUp.seconds ?? null,
  )
  labelledCounter(
    r,
    'kvrouter_zmq_total',
    "Engines' own KV events over ZMQ: batches, bytes, bad frames, sequence gaps, replays (and those that fell short), engine restarts, batches " +
      'refused as malformed',
    'what',
    () => {
      const e = t.engines
      if (!e.used) return null
      return byField(e.counters(), ['batches', 'bytes', 'badFrames', 'gaps', 'replays', 'replaysIncomplete', 'restarts', 'duplicates', 'sinkErrors'])
    },
  )
  labelledCounter(r, 'kvrouter_engine_events_skipped_total', "Engines' own KV events not applied, by reason", 'reason', () =>
    t.engines.used ? Object.entries(t.engines.skipped) : null,
  )
  labelledCounter(
    r,
    'kvrouter_engine_events_deduplicated_total',
    "Engines' own KV events de-duplicated per worker-rank: blocks stored again while held, block removals held back while the hash is stored more often",
    'what',
    () => (t.engines.used ? byField(t.engines.engineCounters(), ['duplicateStores', 'suppressedRemovals']) : null),
  )
  labelledCounter(r, 'kvrouter_engine_batches_malformed_total', "Engines' own KV-event batches refused by the shards, by reason", 'reason', () =>
    t.engines.used ? Object.entries(t.engines.engineCounters().malformed) : null,
  )
  collectedGauge(r, 'kvrouter_connected', '1 while the configured NATS / etcd connection is up, 0 while it is down', ['service'], (g) => {
    const conn = t.connected
    if (conn.nats !== null) g.set({ service: 'nats' }, conn.nats ? 1 : 0)
    if (conn.etcd !== null) g.set({ service: 'etcd' }, conn.etcd ? 1 : 0)
  })
  labelledCounter(r, 'kvrouter_etcd_total', 'etcd discovery: puts, deletes, re-lists, disconnects, malformed records', 'what', () =>
    t.discovery === null ? null : Object.entries(t.discovery.counters),
  )
}
