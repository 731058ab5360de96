// Replica sync in the router's registry, read at scrape time (absent series while it is off).
import type { Counter, Registry } from 'prom-client'
import { collectedCounter, labelledCounter, valueGauge } from '../metrics/collected.js'
import type { Scheduler } from '../scheduler/scheduler.js'
import type { ReplicaSync } from './replica-sync.js'

export interface ReplicaSource {
  readonly replicas: ReplicaSync | null
  readonly scheduler: Scheduler
}

export function registerReplicaMetrics(r: Registry, src: ReplicaSource): void {
  const counter = (name: string, help: string, labelNames: string[], fill: (c: Counter, s: ReplicaSync) => void): void =>
    collectedCounter(r, name, help, labelNames, (c) => {
      const s = src.replicas
      if (s !== null) fill(c, s)
    })
  const table = (name: string, help: string, label: string, rows: (s: ReplicaSync) => Record<string, number>): void =>
    labelledCounter(r, name, help, label, () => (src.replicas === null ? null : Object.entries(rows(src.replicas))))
  const gauge = (name: string, help: string, value: (s: ReplicaSync) => number): void =>
    valueGauge(r, name, help, () => (src.replicas === null ? null : value(src.replicas)))
  table('kvrouter_replica_events_published_total', "This router's booking events published to its peers, by type", 'type', (s) => s.counters.published)
  table('kvrouter_replica_events_dropped_total', 'Booking events not published, by reason', 'reason', (s) => s.counters.dropped)
  counter('kvrouter_replica_events_received_total', "Peers' booking events received, by type and outcome", ['type', 'outcome'], (c, s) => {
    for (const [k, v] of s.counters.received) {
      const [type, outcome] = k.split(':') as [string, string]
      c.inc({ type, outcome }, v)
    }
  })
  counter('kvrouter_replica_events_malformed_total', 'Replica-sync messages (events, heartbeats, catch-up answers) that did not decode', [], (c, s) =>
    c.inc(s.counters.malformed),
  )
  counter('kvrouter_replica_remote_bookings_ended_total', "Peers' bookings ended here other than by their free, by reason", ['reason'], (c, s) => {
    c.inc({ reason: 'peer_gone' }, s.counters.remoteDropped.peer_gone)
    c.inc({ reason: 'catch_up' }, s.counters.remoteDropped.catch_up)
    c.inc({ reason: 'stale' }, src.scheduler.sequences.expiredRemoteTotal)
  })
  table('kvrouter_replica_catch_up_total', 'Catch-ups with the peers, by how they ended', 'outcome', (s) => s.counters.catchUps)
  counter('kvrouter_replica_catch_up_bookings_total', "Peers' bookings taken from catch-up answers", [], (c, s) => c.inc(s.counters.catchUpBookings))
  counter('kvrouter_replica_catch_up_sessions_total', "Peers' session bindings taken from catch-up answers (sessions this router had none for)", [], (c, s) =>
    c.inc(s.counters.catchUpSessions),
  )
  counter(
    'kvrouter_replica_races_total',
    "Peers' bookings on a worker-rank this router booked within the sync delay (neither could have seen the other's)",
    [],
    (c, s) => c.inc(s.counters.races),
  )
  gauge('kvrouter_replica_remote_bookings', "Peers' bookings held, counted in cost and busy checks", () => src.scheduler.sequences.remoteSize)
  gauge('kvrouter_replica_peers', 'Peers taken for alive', (s) => s.livePeers)
  gauge('kvrouter_replica_in_step', '1 once the catch-up after start or reconnection has ended, else 0', (s) => (s.inStep ? 1 : 0))
  gauge('kvrouter_replica_queue_depth', 'Booking events waiting to be published', (s) => s.queued)
}
