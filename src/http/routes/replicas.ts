// GET /v1/replicas: this router replica and the peers it shares bookings with (replica sync).
import type { FastifyInstance } from 'fastify'
import { serializeJson } from '../../codec/json.js'
import type { HttpContext } from '../context.js'

/** A router id as an exact JSON integer when it is a u64 (a Dynamo peer's may be a UUID). */
function idValue(id: string): bigint | string {
  return /^[0-9]{1,20}$/.test(id) ? BigInt(id) : id
}

const ago = (at: number | null, now: number): number | null => (at === null ? null : Math.max(0, Math.round(now - at)))

export function replicaRoutes(fastify: FastifyInstance, ctx: HttpContext): void {
  const { router } = ctx
  fastify.get('/v1/replicas', async (_req, reply) => {
    const sync = router.replicas
    reply.header('content-type', 'application/json')
    if (sync === null) return reply.send(serializeJson({ replica_sync: false, self: null, replicas: [] }))
    const now = performance.timeOrigin + performance.now()
    const reg = router.replicaRegistry
    const self = {
      router_id: sync.routerId,
      url: sync.url,
      host: sync.host,
      in_step: sync.inStep,
      connected: sync.connected,
      registered: reg !== null,
      bookings: router.scheduler.sequences.size,
      remote_bookings: router.scheduler.sequences.remoteSize,
      last_catch_up: sync.lastCatchUp,
    }
    const replicas = sync
      .peerInfo()
      .sort((a, b) => Number(b.alive) - Number(a.alive) || a.routerId.localeCompare(b.routerId))
      .map((p) => ({
        router_id: idValue(p.routerId),
        kind: p.kind,
        url: p.url,
        host: p.host,
        alive: p.alive,
        registered: p.registered,
        last_seen_ms_ago: ago(p.lastSeenAt, now),
        last_event_ms_ago: ago(p.lastEventAt, now),
        sync_lag_ms: p.syncLagMs === null ? null : Math.round(p.syncLagMs * 100) / 100,
        events_received: p.eventsReceived,
        bookings_held: p.bookingsHeld,
        bookings_reported: p.reportedBookings,
      }))
    return reply.send(serializeJson({ replica_sync: true, self, replicas }))
  })
}
