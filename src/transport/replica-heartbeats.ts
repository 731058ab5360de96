// Subject kvrouter_replicas (kv-router's own): a heartbeat per period (router id, URL, bookings),
// so a kv-router peer that stops or goes silent has its bookings dropped, and a goodbye on close
// so they go at once. A Dynamo router sends no heartbeats: its bookings end by its Free or the
// stale-booking expiry.
import { parseJsonExact, readU64 } from '../codec/json.js'
import type { ReplicaLink } from './replica-link.js'
import { utf8, wallNow } from './replica-link.js'
import type { ReplicaPeers } from './replica-peers.js'

export class ReplicaHeartbeats {
  constructor(
    private readonly link: ReplicaLink,
    private readonly peers: ReplicaPeers,
    /** Whether this replica is in step, as its heartbeats say. */
    private readonly inStep: () => boolean,
  ) {}

  send(): void {
    const link = this.link
    if (link.closed || !link.connected) return
    const body =
      `{"router_id":${link.id},"url":${JSON.stringify(link.url)},"host":${JSON.stringify(link.host)},"started_at":${link.startedAt},` +
      `"sent_at":${wallNow()},"bookings":${link.sched.sequences.size},"in_step":${this.inStep()}}`
    try {
      link.nc.publish(link.subjects.heartbeats, body)
    } catch {
      // the next one will do
    }
  }

  /** Tells the peers to drop this router's bookings now. */
  bye(): void {
    const link = this.link
    try {
      link.nc.publish(link.subjects.heartbeats, `{"router_id":${link.id},"bye":true,"sent_at":${wallNow()}}`)
    } catch {
      // closing anyway
    }
  }

  onHeartbeat(bytes: Uint8Array): void {
    const link = this.link
    let hb: Record<string, unknown>
    let id: string
    try {
      const v = parseJsonExact(utf8.decode(bytes))
      if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('not an object')
      hb = v as Record<string, unknown>
      id = readU64(hb['router_id'], 'router_id').toString()
    } catch (err) {
      link.malformed('a heartbeat', err)
      return
    }
    if (id === link.id) return
    const now = wallNow()
    const known = this.peers.get(id)
    if (hb['bye'] === true) {
      if (known !== undefined) this.peers.gone(known)
      return
    }
    const peer = known ?? this.peers.add(id, true)
    // a kv-router peer first heard of now may hold bookings made before: ask it for them
    const fresh = known === undefined || !peer.kvRouter
    peer.kvRouter = true
    peer.lastSeenAt = now
    peer.lastHeartbeatAt = now
    if (typeof hb['url'] === 'string') peer.url = hb['url']
    if (typeof hb['host'] === 'string') peer.host = hb['host']
    if (typeof hb['bookings'] === 'number') peer.reportedBookings = hb['bookings']
    if (typeof hb['sent_at'] === 'number') this.peers.sampleLag(peer, now - hb['sent_at'])
    if (!peer.alive || fresh) this.peers.revive(peer)
  }
}
