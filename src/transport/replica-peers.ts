// The other router replicas this one has heard of: what is known of each, when one is gone (its
// bookings dropped here), and the replica spread's rank among those routing now.
import { limited } from '../runtime/log.js'
import type { ReplicaLink } from './replica-link.js'
import { wallNow } from './replica-link.js'

/** What this router knows of another replica. */
export interface PeerInfo {
  routerId: string
  /** 'kv-router' once it sent a heartbeat or a catch-up answer; 'dynamo' while it only sent events. */
  kind: 'kv-router' | 'dynamo'
  url: string | null
  host: string | null
  alive: boolean
  /** Listed in the etcd replica registry. */
  registered: boolean
  /** Wall-clock ms of the last message of any kind, of the last booking event. */
  lastSeenAt: number
  lastEventAt: number | null
  /** Moving average of receive time minus publish time, ms (includes the hosts' clock offset). */
  syncLagMs: number | null
  eventsReceived: number
  /** Its own bookings, as its last heartbeat said. */
  reportedBookings: number | null
  /** Its bookings held here. */
  bookingsHeld: number
}

export interface Peer {
  id: string
  owner: number
  kvRouter: boolean
  url: string | null
  host: string | null
  alive: boolean
  registered: boolean
  lastSeenAt: number
  lastHeartbeatAt: number
  lastEventAt: number | null
  lag: number | null
  events: number
  reportedBookings: number | null
  /** Wall ms of its last booking seen here (0: none): a peer routing now counts in the spread. */
  lastBookingAt: number
}

const LAG_ALPHA = 0.1
/** A peer that booked within this long counts as routing now, for the spread. */
export const ROUTING_MS = 1000

export class ReplicaPeers {
  /** This replica's rank and the replicas routing now, as the spread uses them. */
  spreadRankOf = { rank: 0, of: 1 }

  private readonly byId = new Map<string, Peer>()
  private readonly owners: Peer[] = []
  private spreadKey = ''
  /** Peers ranked before this replica in the spread, by id: their index there. */
  private predecessors = new Map<string, number>()

  /** `revived`: a kv-router peer heard from again, whose bookings are to be fetched afresh. */
  constructor(
    private readonly link: ReplicaLink,
    private readonly revived: (peer: Peer) => void,
  ) {}

  get(id: string): Peer | undefined {
    return this.byId.get(id)
  }

  values(): IterableIterator<Peer> {
    return this.byId.values()
  }

  add(id: string, kvRouter: boolean): Peer {
    const now = wallNow()
    const peer: Peer = {
      id,
      owner: this.owners.length + 1,
      kvRouter,
      url: null,
      host: null,
      alive: true,
      registered: false,
      lastSeenAt: now,
      lastHeartbeatAt: now,
      lastEventAt: null,
      lag: null,
      events: 0,
      reportedBookings: null,
      lastBookingAt: 0,
    }
    this.owners.push(peer)
    this.byId.set(id, peer)
    this.updateSpread()
    return peer
  }

  /** A kv-router peer that spoke on one of kv-router's own subjects (a catch-up request or answer), seen now. */
  kvRouterHeard(id: string): Peer {
    const peer = this.byId.get(id) ?? this.add(id, true)
    if (!peer.kvRouter) {
      peer.kvRouter = true
      this.updateSpread()
    }
    peer.lastSeenAt = wallNow()
    return peer
  }

  sampleLag(peer: Peer, sample: number): void {
    peer.lag = peer.lag === null ? sample : peer.lag + LAG_ALPHA * (sample - peer.lag)
  }

  /** Its index in the spread when the peer ranks before this replica, else undefined. */
  predecessorIndex(id: string): number | undefined {
    return this.predecessors.get(id)
  }

  /** A peer heard from again after it was taken for gone: its bookings are fetched afresh. */
  revive(peer: Peer): void {
    peer.alive = true
    peer.lastHeartbeatAt = wallNow()
    this.updateSpread()
    if (peer.kvRouter && !this.link.closed) this.revived(peer)
  }

  /** A peer stopped (bye), went silent or left the registry: everything it held here goes. */
  gone(peer: Peer): void {
    if (!peer.alive) return
    peer.alive = false
    const dropped = this.link.sched.dropRemoteOwner(peer.owner)
    this.link.counters.remoteDropped.peer_gone += dropped
    limited.info(
      'replica_peer_gone',
      { router_id: peer.id, bookings_dropped: dropped },
      'a peer replica is gone (it said goodbye, went silent or left the registry): its bookings are dropped',
    )
    this.updateSpread()
  }

  /** Periodic: kv-router peers silent past the limit are gone; peers that stopped routing leave the spread. */
  sweep(silenceMs: number): void {
    const now = wallNow()
    for (const p of this.byId.values()) if (p.alive && p.kvRouter && now - p.lastHeartbeatAt > silenceMs) this.gone(p)
    this.updateSpread()
  }

  /**
   * The spread's rank: among this replica and the live kv-router peers that booked within the
   * last second (those that may be routing at this moment), sorted by router id.
   */
  updateSpread(): void {
    const now = wallNow()
    const self = this.link.routerId
    const ids = [self]
    for (const p of this.byId.values()) if (p.alive && p.kvRouter && now - p.lastBookingAt <= ROUTING_MS) ids.push(BigInt(p.id))
    ids.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
    const rank = ids.indexOf(self)
    const key = ids.join(',')
    if (key === this.spreadKey) return
    this.spreadKey = key
    this.spreadRankOf = { rank, of: ids.length }
    this.predecessors = new Map(ids.slice(0, rank).map((id, k) => [id.toString(), k]))
    this.link.sched.setSpread(rank, ids.length, this.link.opts.spread)
  }

  // ---- registry (etcd) ----

  /** A replica listed in the etcd registry. */
  registered(id: string, url: string | null, host: string | null): void {
    if (id === this.link.id) return
    const peer = this.byId.get(id) ?? this.add(id, true)
    peer.kvRouter = true
    peer.registered = true
    if (url !== null) peer.url = url
    if (host !== null) peer.host = host
  }

  /** A replica's registry key went away (it stopped, or its lease expired). */
  deregistered(id: string): void {
    const peer = this.byId.get(id)
    if (peer === undefined) return
    peer.registered = false
    this.gone(peer)
  }

  // ---- inspection ----

  /** Every peer heard of, with what is held for it. */
  info(): PeerInfo[] {
    const held = this.link.sched.sequences.countByOwner()
    return [...this.byId.values()].map((p) => ({
      routerId: p.id,
      kind: p.kvRouter ? 'kv-router' : 'dynamo',
      url: p.url,
      host: p.host,
      alive: p.alive,
      registered: p.registered,
      lastSeenAt: p.lastSeenAt,
      lastEventAt: p.lastEventAt,
      syncLagMs: p.lag,
      eventsReceived: p.events,
      reportedBookings: p.reportedBookings,
      bookingsHeld: held[p.owner] ?? 0,
    }))
  }

  /** Live peers (kv-router ones by their heartbeats; Dynamo ones until they are dropped). */
  get live(): number {
    let n = 0
    for (const p of this.byId.values()) if (p.alive) n++
    return n
  }
}
