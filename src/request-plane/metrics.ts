// The request plane's counters as one labelled series, read at scrape time (docs/metrics.md).
import type { Registry } from 'prom-client'
import { collectedGauge, labelledCounter } from '../metrics/collected.js'
import type { RequestPlaneClient } from './client.js'

export function registerRequestPlaneMetrics(r: Registry, client: RequestPlaneClient): void {
  labelledCounter(
    r,
    'kvrouter_request_plane_total',
    "Dynamo's TCP request plane: requests sent, accepted, refused as overloaded or otherwise, unacknowledged in time, " +
      'connection errors, malformed frames, response streams, stream errors, stops and kills sent',
    'what',
    () => {
      const c = client.counters
      return [
        ['requests', c.requests],
        ['accepted', c.accepted],
        ['overloaded', c.overloaded],
        ['rejected', c.rejected],
        ['ack_timeouts', c.ackTimeouts],
        ['connection_errors', c.connectionErrors],
        ['malformed', c.malformed],
        ['streams', c.streams],
        ['stream_errors', c.streamErrors],
        ['stops', c.stops],
        ['kills', c.kills],
      ]
    },
  )
  collectedGauge(r, 'kvrouter_request_plane_connections', 'Open request-plane connections to workers', [], (g) => g.set(client.connections))
}
