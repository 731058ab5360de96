// The ZMQ event plane's series in the router's registry, read at scrape time (absent while the
// router does not read the event plane).
import type { Registry } from 'prom-client'
import { collectedGauge, labelledCounter } from '../metrics/collected.js'
import type { ChannelDiscovery } from './discovery.js'
import type { EventPlaneIntake } from './intake.js'

export interface EventPlaneParts {
  readonly eventPlane: EventPlaneIntake | null
  readonly eventChannels: ChannelDiscovery | null
}

export function registerEventPlaneMetrics(r: Registry, p: EventPlaneParts): void {
  labelledCounter(
    r,
    'kvrouter_event_plane_total',
    "KV events from Dynamo's ZMQ event plane: messages checked and their bytes, applied, broker duplicates, sequence gaps, publisher restarts, " +
      'stale messages, gaps or restarts whose worker-rank was not known, endpoints ZMQ could not connect to',
    'what',
    () =>
      p.eventPlane === null ? null : Object.entries(p.eventPlane.counters).map(([k, v]) => [k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), v] as const),
  )
  labelledCounter(r, 'kvrouter_event_plane_dropped_total', 'Event-plane messages dropped before the index, by reason', 'reason', () =>
    p.eventPlane === null ? null : Object.entries(p.eventPlane.drops),
  )
  collectedGauge(
    r,
    'kvrouter_event_plane_subscriptions',
    'Open event-plane SUB sockets: to workers\' PUBs (kind="direct"), to brokers\' XPUBs (kind="broker")',
    ['kind'],
    (g) => {
      const e = p.eventPlane?.endpoints
      if (e === undefined) return
      g.set({ kind: 'direct' }, e.direct.length)
      g.set({ kind: 'broker' }, e.brokers.length)
    },
  )
  labelledCounter(
    r,
    'kvrouter_event_plane_etcd_total',
    'etcd records of event-plane publishers: puts, deletes, re-lists, disconnects, malformed records',
    'what',
    () => (p.eventChannels === null ? null : Object.entries(p.eventChannels.counters)),
  )
}
