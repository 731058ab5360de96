// Replica sync (--router-replica-sync): router replicas share their bookings over NATS so each
// one's cost and busy checks count the load every replica put on a worker, not its own share.
// One module per subject, wired here on one connection:
//
//   active_sequences_events  Dynamo's: bookings, prefill completions and frees (replica-bookings.ts)
//   kvrouter_replicas        ours: heartbeats and goodbyes (replica-heartbeats.ts)
//   kvrouter_bookings        ours, request/reply: the catch-up with the peers (replica-catch-up.ts)
//   kvrouter_sessions        ours: session-affinity bindings (replica-sessions.ts)
//
// What the subjects share is in replica-link.ts (connection, counters) and replica-peers.ts (the
// peers heard of, the spread).
import type { NatsConnection, Subscription } from 'nats'
import { watchNatsStatus } from './nats.js'
import { urlList } from '../core/endpoints.js'
import { KvrError } from '../errors.js'
import { limited } from '../runtime/log.js'
import { ReplicaBookings } from './replica-bookings.js'
import { ReplicaCatchUps } from './replica-catch-up.js'
import { ReplicaHeartbeats } from './replica-heartbeats.js'
import type { ReplicaCounters, ReplicaSyncOptions } from './replica-link.js'
import { ReplicaLink } from './replica-link.js'
import type { PeerInfo } from './replica-peers.js'
import { ReplicaPeers } from './replica-peers.js'
import { ReplicaSessions } from './replica-sessions.js'

export type { ReceivedOutcome, ReplicaCounters, ReplicaSyncOptions } from './replica-link.js'
export { replicaSubjects } from './replica-link.js'
export type { PeerInfo } from './replica-peers.js'

export class ReplicaSync {
  readonly routerId: bigint
  readonly host: string
  readonly startedAt: number

  private readonly link: ReplicaLink
  private readonly peers: ReplicaPeers
  private readonly bookings: ReplicaBookings
  private readonly sessions: ReplicaSessions
  private readonly catchUps: ReplicaCatchUps
  private readonly heartbeats: ReplicaHeartbeats
  private readonly subs: Subscription[] = []
  private readonly timers: NodeJS.Timeout[] = []
  private readonly heartbeatMs: number
  private readonly silenceMs: number

  private constructor(
    private readonly nc: NatsConnection,
    opts: ReplicaSyncOptions,
  ) {
    const link = new ReplicaLink(nc, opts)
    this.link = link
    this.routerId = link.routerId
    this.host = link.host
    this.startedAt = link.startedAt
    this.heartbeatMs = opts.heartbeatMs ?? 1000
    this.silenceMs = opts.silenceMs ?? 5000
    this.peers = new ReplicaPeers(link, (peer) => void this.catchUps.run(peer.id, false))
    this.sessions = new ReplicaSessions(link)
    this.catchUps = new ReplicaCatchUps(link, this.peers, this.sessions)
    this.bookings = new ReplicaBookings(link, this.peers, this.catchUps)
    this.heartbeats = new ReplicaHeartbeats(link, this.peers, () => this.catchUps.inStep)
  }

  /** Connects, subscribes, announces itself and starts the first catch-up (see inStep). */
  static async start(opts: ReplicaSyncOptions): Promise<ReplicaSync> {
    const { connect } = await import('nats')
    let nc: NatsConnection
    try {
      // noEcho: this router's own messages never come back to it, and a catch-up request that
      // only this router would hear gets NATS's no-responders answer at once
      nc = await connect({
        servers: urlList(opts.natsUrl),
        name: `kv-router-replica-${opts.routerId}`,
        noEcho: true,
        maxReconnectAttempts: -1,
        reconnectTimeWait: 250,
        timeout: opts.connectTimeoutMs ?? 5000,
      })
    } catch (err) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `replica sync cannot connect to NATS at ${opts.natsUrl}: ${(err as Error).message}`, { cause: err })
    }
    const r = new ReplicaSync(nc, opts)
    r.subscribe()
    void r.watchStatus()
    r.heartbeats.send()
    const hb = setInterval(() => {
      r.heartbeats.send()
      r.peers.sweep(r.silenceMs)
    }, r.heartbeatMs)
    hb.unref()
    r.timers.push(hb)
    opts.scheduler.observer = r.bookings
    for (const p of opts.knownPeers ?? []) r.registered(p.id, p.url, p.host)
    void r.catchUp(null, true)
    return r
  }

  private subscribe(): void {
    const s = this.link.subjects
    const nc = this.nc
    this.subs.push(
      nc.subscribe(s.events, { callback: (err, msg) => (err === null ? this.bookings.onEvent(msg.data) : undefined) }),
      nc.subscribe(s.heartbeats, { callback: (err, msg) => (err === null ? this.heartbeats.onHeartbeat(msg.data) : undefined) }),
      nc.subscribe(s.catchUp, { callback: (err, msg) => (err === null ? this.catchUps.onRequest(msg) : undefined) }),
    )
    if (this.link.opts.onSessionBinding !== undefined) {
      this.subs.push(nc.subscribe(s.sessions, { callback: (err, msg) => (err === null ? this.sessions.onBinding(msg.data) : undefined) }))
    }
  }

  get counters(): ReplicaCounters {
    return this.link.counters
  }

  /** The HTTP URL this replica is reached at, once it listens. */
  get url(): string | null {
    return this.link.url
  }

  /** When the last catch-up ended (wall ms), and how long it took. */
  get lastCatchUp(): { at: number; ms: number; outcome: string; peers: number; bookings: number } | null {
    return this.catchUps.last
  }

  /** False from the start or a reconnection until the catch-up that follows has ended. */
  get inStep(): boolean {
    return this.catchUps.inStep
  }

  get connected(): boolean {
    return this.link.connected
  }

  /** Outbound events waiting to be published. */
  get queued(): number {
    return this.bookings.queued
  }

  /** This replica's rank and the replicas routing now, as the spread uses them. */
  get spreadRankOf(): { rank: number; of: number } {
    return this.peers.spreadRankOf
  }

  /** Live peers (kv-router ones by their heartbeats; Dynamo ones until they are dropped). */
  get livePeers(): number {
    return this.peers.live
  }

  /** Every peer heard of, with what is held for it. */
  peerInfo(): PeerInfo[] {
    return this.peers.info()
  }

  /** A replica listed in the etcd registry. */
  registered(id: string, url: string | null, host: string | null): void {
    this.peers.registered(id, url, host)
  }

  /** A replica's registry key went away (it stopped, or its lease expired). */
  deregistered(id: string): void {
    this.peers.deregistered(id)
  }

  /** Asks peers (all, or one: `target`) for their live bookings; `gate`: inStep waits for it (see ReplicaCatchUps.run). */
  catchUp(target: string | null, gate: boolean): Promise<void> {
    return this.catchUps.run(target, gate)
  }

  /** Tells the peers this router bound a session to a worker-rank for ttlMs (best effort). */
  shareSessionBinding(session: string, workerId: bigint, dpRank: number, ttlMs: number): void {
    this.sessions.share(session, workerId, dpRank, ttlMs)
  }

  /** Sets the URL peers and /v1/replicas show for this replica. */
  setUrl(url: string): void {
    this.link.url = url
    this.heartbeats.send()
  }

  private watchStatus(): Promise<void> {
    const link = this.link
    return watchNatsStatus(this.nc, {
      disconnected: (server) => {
        link.counters.disconnects++
        link.up = false
        limited.warn('replica_nats_disconnected', { server }, "replica sync lost its NATS connection: this replica's bookings are held until it is back")
      },
      reconnected: (server) => {
        link.counters.reconnects++
        link.up = true
        limited.info('replica_nats_reconnected', { server }, 'replica sync is connected to NATS again')
        link.maxPayload = this.nc.info?.max_payload ?? link.maxPayload
        this.bookings.flush()
        this.heartbeats.send()
        // events published while this router was away never reached it
        if (!link.closed) void this.catchUp(null, true)
      },
    })
  }

  /** Says goodbye (peers drop this router's bookings at once), publishes what is queued, closes. */
  async close(): Promise<void> {
    const link = this.link
    if (link.closed) return
    for (const t of this.timers) clearInterval(t)
    this.bookings.flush()
    link.closed = true
    if (link.sched.observer === this.bookings) link.sched.observer = null
    this.catchUps.finishAll()
    if (link.connected) this.heartbeats.bye()
    for (const s of this.subs) s.unsubscribe()
    if (!this.nc.isClosed()) await this.nc.drain().catch(() => undefined)
    if (!this.nc.isClosed()) await this.nc.close().catch(() => undefined)
  }
}
