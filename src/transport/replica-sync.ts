// Replica sync (--router-replica-sync): router replicas share their bookings over NATS so each
// one's cost and busy checks count the load every replica put on a worker, not its own share.
//
//   active_sequences_events  Dynamo's subject, on the workers' component: every booking this
//                            router makes, marks prefill-complete or frees, as Dynamo's
//                            ActiveSequenceEvent (src/codec/active-sequence.ts); peers' events
//                            are applied to the scheduler as bookings owned by that peer.
//   kvrouter_replicas        ours: a heartbeat per second (router id, URL, bookings), so a
//                            kv-router peer that stops or goes silent has its bookings dropped.
//   kvrouter_bookings        ours, request/reply: a replica that starts or reconnects asks
//                            every peer for its live bookings (and session bindings) and is `in
//                            step` (ready) once all known peers answered, nobody answers, or the
//                            catch-up timeout passes.
//   kvrouter_sessions        ours: each session-affinity binding made, so a conversation whose
//                            turns reach different replicas stays on one worker.
//
// Outbound events go through a bounded queue flushed on the next turn of the event loop (and held
// while NATS is down); a full queue drops the newest event and counts it. Inbound events that do
// not decode are counted and skipped. A Dynamo router sends no heartbeats: its bookings end by
// its Free or the stale-booking expiry.
import { randomFillSync } from 'node:crypto'
import { hostname } from 'node:os'
import type { Events, Msg, NatsConnection, Subscription } from 'nats'
import { ActiveSequenceDecoder, encodeAddRequest, encodeLifecycle, prefillTokensOf } from '../codec/active-sequence.js'
import type { ActiveSequenceEvent } from '../codec/active-sequence.js'
import { parseJsonExact, readU64 } from '../codec/json.js'
import { urlList } from '../core/endpoints.js'
import { KvrError } from '../errors.js'
import { limited } from '../runtime/log.js'
import { TRACK_SHARED, TRACK_UNIQUE } from '../scheduler/active-sequences.js'
import type { TrackMode } from '../scheduler/active-sequences.js'
import type { BookingObserver, Scheduler } from '../scheduler/scheduler.js'
import { activeSequencesSubject } from './dynamo-names.js'

/** kv-router's own subjects beside Dynamo's, on the same component. */
export function replicaSubjects(namespace: string, component: string): { events: string; heartbeats: string; catchUp: string; sessions: string } {
  const prefix = `namespace.${namespace}.component.${component}`
  return {
    events: activeSequencesSubject(namespace, component),
    heartbeats: `${prefix}.kvrouter_replicas`,
    catchUp: `${prefix}.kvrouter_bookings`,
    sessions: `${prefix}.kvrouter_sessions`,
  }
}

export interface ReplicaSyncOptions {
  natsUrl: string
  namespace: string
  component: string
  routerId: bigint
  scheduler: Scheduler
  blockSize: number
  /** How long a catch-up waits for peers' answers at most. */
  catchUpTimeoutMs: number
  /** Replica spread (Selector) while peers are routing. */
  spread: boolean
  /** Heartbeat period (default 1000 ms). */
  heartbeatMs?: number
  /** A kv-router peer silent this long is gone (default 5000 ms). */
  silenceMs?: number
  /** Outbound events held at most (default 10,000). */
  queueCapacity?: number
  /** After every known peer answered a catch-up, how long later answers are still awaited (default 50 ms). */
  catchUpGraceMs?: number
  connectTimeoutMs?: number
  /** Replicas the etcd registry lists at start, awaited by the first catch-up. */
  knownPeers?: readonly { id: string; url: string | null; host: string | null }[]
  /**
   * A peer bound a session (session affinity) to a worker-rank this router knows, for ttlMs from
   * now: the next request of that session reaching this replica goes there too. `caughtUp`: the
   * binding came in a catch-up answer, and ttlMs is the time it has left there.
   */
  onSessionBinding?: (session: string, workerId: bigint, dpRank: number, ttlMs: number, caughtUp: boolean) => void
  /**
   * This router's live session bindings, for a peer's catch-up. A binding a catch-up brings goes
   * to onSessionBinding only when `isBound` says this router holds none for the session: what
   * it bound or heard since is newer.
   */
  sessionBindings?: () => Iterable<{ session: string; workerId: bigint; dpRank: number; ttlMs: number }>
  isBound?: (session: string) => boolean
}

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

interface Peer {
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

interface CatchUp {
  started: number
  target: string | null
  expected: Set<string>
  answered: Set<string>
  /** Per peer, the keys its answer has listed so far. */
  listed: Map<string, Set<string>>
  sub: Subscription
  finish: (outcome: 'complete' | 'timeout' | 'alone') => void
  grace: NodeJS.Timeout | undefined
  done: boolean
}

const KIND_ADD = 0
const KIND_PREFILL = 1
const KIND_FREE = 2
const KIND_NAMES = ['add', 'prefill_completed', 'free'] as const
/** Longest session id shared (the session-affinity limit). */
const MAX_SESSION_ID = 256
const LAG_ALPHA = 0.1
/** A peer that booked within this long counts as routing now, for the spread. */
const ROUTING_MS = 1000
/** Cap of the sync delay a peer's booking is taken as its current request for (a skewed lag estimate can be large). */
const MAX_SEEN_MS = 20

export type ReceivedOutcome = 'applied' | 'own' | 'unknown_worker' | 'duplicate' | 'unknown_request' | 'incompatible'

export interface ReplicaCounters {
  published: Record<(typeof KIND_NAMES)[number] | 'session_binding', number>
  dropped: { queue_full: number; too_large: number; publish_error: number }
  /** Inbound booking events by `${type}:${outcome}`. */
  received: Map<string, number>
  malformed: number
  /** Peers' bookings dropped here: the peer went away, or its catch-up answer no longer had them. */
  remoteDropped: { peer_gone: number; catch_up: number }
  catchUps: { complete: number; timeout: number; alone: number }
  catchUpBookings: number
  /** Peers' session bindings taken from catch-up answers (sessions this router had none for). */
  catchUpSessions: number
  /** Peers' bookings on a worker-rank this router booked while neither could have seen the other's. */
  races: number
  disconnects: number
  reconnects: number
}

const utf8 = new TextDecoder()

/** Wall clock in fractional ms: publish times are compared across processes. */
const wallNow = (): number => performance.timeOrigin + performance.now()

export class ReplicaSync implements BookingObserver {
  readonly routerId: bigint
  readonly counters: ReplicaCounters = {
    published: { add: 0, prefill_completed: 0, free: 0, session_binding: 0 },
    dropped: { queue_full: 0, too_large: 0, publish_error: 0 },
    received: new Map(),
    malformed: 0,
    remoteDropped: { peer_gone: 0, catch_up: 0 },
    catchUps: { complete: 0, timeout: 0, alone: 0 },
    catchUpBookings: 0,
    catchUpSessions: 0,
    races: 0,
    disconnects: 0,
    reconnects: 0,
  }
  /** The HTTP URL this replica is reached at, once it listens. */
  url: string | null = null
  readonly host = hostname()
  readonly startedAt = Date.now()
  /** When the last catch-up ended (wall ms), and how long it took. */
  lastCatchUp: { at: number; ms: number; outcome: string; peers: number; bookings: number } | null = null

  private readonly id: string
  private readonly subjects: { events: string; heartbeats: string; catchUp: string; sessions: string }
  private readonly sched: Scheduler
  private readonly decoder = new ActiveSequenceDecoder()
  private readonly peers = new Map<string, Peer>()
  private readonly owners: Peer[] = []
  private readonly subs: Subscription[] = []
  private readonly timers: NodeJS.Timeout[] = []
  private readonly heartbeatMs: number
  private readonly silenceMs: number
  private readonly capacity: number
  private readonly graceMs: number
  private qText: string[] = []
  private qKind: number[] = []
  private qHead = 0
  private flushScheduled = false
  private maxPayload = 1024 * 1024
  private up = true
  private closed = false
  private catchUps = new Set<CatchUp>()
  /** Frees of unknown bookings while a catch-up runs: its answers must not bring them back. */
  private readonly tombstones = new Set<string>()
  /** The initial (or post-reconnect) catch-ups still running; in step when 0. */
  private gating = 0
  /** Wall ms of this router's last booking per slot (race count). */
  private lastLocal = new Float64Array(64)
  private spreadKey = ''
  /** Peers ranked before this replica in the spread, by id: their index there. */
  private predecessors = new Map<string, number>()

  private constructor(
    private readonly nc: NatsConnection,
    private readonly opts: ReplicaSyncOptions,
    private readonly events: typeof Events,
  ) {
    this.routerId = opts.routerId
    this.id = opts.routerId.toString()
    this.subjects = replicaSubjects(opts.namespace, opts.component)
    this.sched = opts.scheduler
    this.heartbeatMs = opts.heartbeatMs ?? 1000
    this.silenceMs = opts.silenceMs ?? 5000
    this.capacity = opts.queueCapacity ?? 10_000
    this.graceMs = opts.catchUpGraceMs ?? 50
    this.maxPayload = nc.info?.max_payload ?? this.maxPayload
  }

  /** Connects, subscribes, announces itself and starts the first catch-up (see inStep). */
  static async start(opts: ReplicaSyncOptions): Promise<ReplicaSync> {
    const { connect, Events } = await import('nats')
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
    const r = new ReplicaSync(nc, opts, Events)
    r.subscribe()
    void r.watchStatus()
    r.heartbeat()
    const hb = setInterval(() => {
      r.heartbeat()
      r.sweep()
    }, r.heartbeatMs)
    hb.unref()
    r.timers.push(hb)
    opts.scheduler.observer = r
    for (const p of opts.knownPeers ?? []) r.registered(p.id, p.url, p.host)
    void r.catchUp(null, true)
    return r
  }

  /** False from the start or a reconnection until the catch-up that follows has ended. */
  get inStep(): boolean {
    return this.gating === 0
  }

  get connected(): boolean {
    return this.up && !this.nc.isClosed()
  }

  /** Outbound events waiting to be published. */
  get queued(): number {
    return this.qText.length - this.qHead
  }

  // ---- this router's bookings, out (BookingObserver) ----

  booked(
    id: string,
    slot: number,
    isl: number,
    overlap: number,
    prefill: number,
    trackPrefill: boolean,
    track: TrackMode,
    lo: ArrayLike<number> | undefined,
    hi: ArrayLike<number> | undefined,
    n: number,
  ): void {
    const now = wallNow()
    if (slot >= this.lastLocal.length) this.growLastLocal(slot + 1)
    this.lastLocal[slot] = now
    if (this.closed) return
    const w = this.sched.workers
    let text: string
    if (track === TRACK_SHARED && lo !== undefined && hi !== undefined)
      text = encodeAddRequest(id, w.workerIdOf(slot), w.dpRankOf(slot), this.id, lo, hi, n, isl, overlap, trackPrefill, prefill, now)
    else if (track === TRACK_UNIQUE && n > 0) text = this.encodeUnique(id, slot, isl, overlap, trackPrefill, prefill, n, now)
    else text = encodeAddRequest(id, w.workerIdOf(slot), w.dpRankOf(slot), this.id, null, null, 0, isl, overlap, trackPrefill, prefill, now)
    this.enqueue(KIND_ADD, text)
  }

  prefillCompleted(id: string, slot: number): void {
    if (this.closed) return
    const w = this.sched.workers
    this.enqueue(KIND_PREFILL, encodeLifecycle('prefill_completed', id, w.workerIdOf(slot), w.dpRankOf(slot), this.id, wallNow()))
  }

  freed(id: string, slot: number): void {
    if (this.closed) return
    const w = this.sched.workers
    this.enqueue(KIND_FREE, encodeLifecycle('free', id, w.workerIdOf(slot), w.dpRankOf(slot), this.id, wallNow()))
  }

  /** Blocks counted without hashes go out as fresh random hashes, as Dynamo's never-shared blocks do. */
  private encodeUnique(id: string, slot: number, isl: number, overlap: number, trackPrefill: boolean, prefill: number, n: number, now: number): string {
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    randomFillSync(lo)
    randomFillSync(hi)
    const w = this.sched.workers
    return encodeAddRequest(id, w.workerIdOf(slot), w.dpRankOf(slot), this.id, lo, hi, n, isl, overlap, trackPrefill, prefill, now)
  }

  private growLastLocal(n: number): void {
    const next = new Float64Array(Math.max(n, this.lastLocal.length * 2))
    next.set(this.lastLocal)
    this.lastLocal = next
  }

  private enqueue(kind: number, text: string): void {
    if (this.queued >= this.capacity) {
      // the newest is dropped, as Dynamo's bounded channel does: what is queued stays in order
      this.dropped('queue_full', { queued: this.queued })
      return
    }
    this.qText.push(text)
    this.qKind.push(kind)
    if (!this.flushScheduled) {
      this.flushScheduled = true
      setImmediate(() => this.flush())
    }
  }

  /** Publishes everything queued, unless NATS is down (then on reconnection). */
  private flush(): void {
    this.flushScheduled = false
    if (!this.connected) return
    const subject = this.subjects.events
    const max = this.maxPayload
    while (this.qHead < this.qText.length) {
      const i = this.qHead++
      const text = this.qText[i] as string
      const kind = this.qKind[i] as number
      if (text.length * 3 > max && Buffer.byteLength(text) > max) {
        this.dropped('too_large', { bytes: Buffer.byteLength(text), max_payload: max })
        continue
      }
      try {
        this.nc.publish(subject, text)
        this.counters.published[KIND_NAMES[kind] as (typeof KIND_NAMES)[number]]++
      } catch (err) {
        this.dropped('publish_error', { error: (err as Error).message })
      }
    }
    this.qText = []
    this.qKind = []
    this.qHead = 0
  }

  // ---- peers' bookings, in ----

  private subscribe(): void {
    const s = this.subjects
    this.subs.push(
      this.nc.subscribe(s.events, { callback: (err, msg) => (err === null ? this.onEvent(msg.data) : undefined) }),
      this.nc.subscribe(s.heartbeats, { callback: (err, msg) => (err === null ? this.onHeartbeat(msg.data) : undefined) }),
      this.nc.subscribe(s.catchUp, { callback: (err, msg) => (err === null ? this.onCatchUpRequest(msg) : undefined) }),
    )
    if (this.opts.onSessionBinding !== undefined) {
      this.subs.push(this.nc.subscribe(s.sessions, { callback: (err, msg) => (err === null ? this.onSessionBinding(msg.data) : undefined) }))
    }
  }

  /**
   * Tells the peers this router bound a session to a worker-rank for ttlMs. Best effort, outside
   * Dynamo's subject (Dynamo routers do not share sessions): a lost one costs the next turn its
   * binding on another replica, which then routes it by the cost and binds it there.
   */
  shareSessionBinding(session: string, workerId: bigint, dpRank: number, ttlMs: number): void {
    if (this.closed || !this.up) {
      this.counters.dropped.publish_error++
      return
    }
    try {
      this.nc.publish(this.subjects.sessions, this.sessionLine(session, workerId, dpRank, ttlMs))
      this.counters.published.session_binding++
    } catch {
      this.counters.dropped.publish_error++
    }
  }

  private onSessionBinding(bytes: Uint8Array): void {
    const b = this.parseSessionBinding(utf8.decode(bytes))
    if (b === null) return
    if (b.id === this.id) return this.count('session_binding', 'own')
    if (this.sched.slotOf(b.workerId, b.dpRank) < 0) return this.count('session_binding', 'unknown_worker')
    this.opts.onSessionBinding?.(b.session, b.workerId, b.dpRank, b.ttlMs, false)
    this.count('session_binding', 'applied')
  }

  /** A session binding as published (and as a catch-up answer lists it); null, counted, when malformed. */
  private parseSessionBinding(text: string): { id: string; session: string; workerId: bigint; dpRank: number; ttlMs: number } | null {
    try {
      const v = parseJsonExact(text)
      if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('not an object')
      const m = v as Record<string, unknown>
      const id = readU64(m['router_id'], 'router_id').toString()
      const sid = m['session_id']
      if (typeof sid !== 'string' || sid.length === 0 || sid.length > MAX_SESSION_ID) throw new Error('session_id')
      const workerId = readU64(m['worker_id'], 'worker_id')
      const r = m['dp_rank']
      const t = m['ttl_ms']
      if (typeof r !== 'number' || !Number.isInteger(r) || r < 0) throw new Error('dp_rank')
      if (typeof t !== 'number' || !(t > 0)) throw new Error('ttl_ms')
      return { id, session: sid, workerId, dpRank: r, ttlMs: t }
    } catch {
      this.counters.malformed++
      return null
    }
  }

  private sessionLine(session: string, workerId: bigint, dpRank: number, ttlMs: number): string {
    return `{"router_id":${this.id},"session_id":${JSON.stringify(session)},"worker_id":${workerId},"dp_rank":${dpRank},"ttl_ms":${ttlMs}}`
  }

  private count(type: string, outcome: ReceivedOutcome): void {
    const k = `${type}:${outcome}`
    this.counters.received.set(k, (this.counters.received.get(k) ?? 0) + 1)
  }

  private malformed(what: string, err: unknown): void {
    this.counters.malformed++
    limited.warn('replica_malformed', { what, error: err instanceof Error ? err.message : String(err) }, `${what} from a peer did not decode: skipped`)
  }

  private dropped(reason: 'queue_full' | 'too_large' | 'publish_error', fields: Record<string, unknown>): void {
    this.counters.dropped[reason]++
    limited.warn('replica_events_dropped', { reason, ...fields }, 'a booking event was not published to the peers')
  }

  /** One peer's booking event. */
  private onEvent(bytes: Uint8Array): void {
    let ev: ActiveSequenceEvent
    try {
      ev = this.decoder.decode(bytes)
    } catch (err) {
      this.malformed('a booking event', err)
      return
    }
    const type = ev.kind
    if (ev.routerId === this.id) return this.count(type, 'own')
    // a newer Dynamo's sparser token sequences would read as other blocks
    if (ev.stride !== null && ev.stride !== 1) {
      limited.warn(
        'replica_incompatible',
        { router_id: ev.routerId, stride: ev.stride },
        "a peer's booking event has a token stride other than 1 (a newer Dynamo): skipped",
      )
      return this.count(type, 'incompatible')
    }
    const now = wallNow()
    let peer = this.peers.get(ev.routerId)
    if (peer === undefined) {
      // lifecycle events of unknown senders are not peers (Dynamo workers mark prefill complete
      // under their own id): only the worker-origin mark is understood
      if (type === 'prefill_completed') return this.workerOriginMark(ev)
      if (type === 'free') return this.count(type, 'unknown_request')
      peer = this.addPeer(ev.routerId, false)
    }
    peer.lastSeenAt = now
    peer.lastEventAt = now
    peer.events++
    if (ev.publishedAt !== null) this.sampleLag(peer, now - ev.publishedAt)
    if (!peer.alive) this.revive(peer)
    const key = `${peer.owner}:${ev.requestId}`
    if (type === 'add') {
      if (this.catchUps.size > 0 && this.tombstones.has(key)) return this.count(type, 'duplicate')
      const outcome = this.sched.addRemote(
        key,
        peer.owner,
        ev.workerId,
        ev.dpRank,
        prefillTokensOf(ev, this.opts.blockSize),
        ev.lo ?? undefined,
        ev.hi ?? undefined,
        ev.lo === null ? 0 : ev.n,
        ev.isl ?? 0,
        ev.overlap ?? 0,
      )
      this.count(type, outcome)
      if (outcome === 'unknown_worker')
        limited.warn(
          'replica_unknown_worker',
          { router_id: ev.routerId, worker_id: ev.workerId.toString(), dp_rank: ev.dpRank },
          'a peer booked a worker-rank this replica does not know: its booking is not counted here (give every replica the same workers)',
        )
      if (outcome === 'applied') {
        this.checkRace(ev, peer, now)
        const idle = now - peer.lastBookingAt > ROUTING_MS
        peer.lastBookingAt = now
        if (idle) this.updateSpread()
        // what the peer routes at this moment is this booking, for about one sync delay
        const k = this.predecessors.get(peer.id)
        if (k !== undefined) this.sched.spreadSeen(k, Math.min(MAX_SEEN_MS, Math.max(1, peer.lag ?? 1)))
      }
    } else if (type === 'prefill_completed') {
      if (this.sched.markRemotePrefillComplete(key)) this.count(type, 'applied')
      else this.workerOriginMark(ev)
    } else if (this.sched.freeRemote(key)) this.count(type, 'applied')
    else {
      if (this.catchUps.size > 0) this.tombstones.add(key)
      this.count(type, 'unknown_request')
    }
  }

  /** Newer Dynamo workers mark prefill complete themselves: applied to this router's own booking of that request on that worker-rank. */
  private workerOriginMark(ev: ActiveSequenceEvent): void {
    const slot = this.sched.slotOf(ev.workerId, ev.dpRank)
    if (slot >= 0 && this.sched.sequences.slotOfRequest(ev.requestId) === slot && this.sched.markPrefillComplete(ev.requestId))
      this.count('prefill_completed', 'applied')
    else this.count('prefill_completed', 'unknown_request')
  }

  /**
   * A race: this router booked the same worker-rank after the peer's booking was made, or
   * before it by less than the time the peer's event took to arrive (then ours could not have
   * reached the peer either). The publish time and the transit are the peer's clock against ours.
   */
  private checkRace(ev: ActiveSequenceEvent, peer: Peer, now: number): void {
    const slot = this.sched.slotOf(ev.workerId, ev.dpRank)
    if (slot < 0 || slot >= this.lastLocal.length) return
    const mine = this.lastLocal[slot] as number
    if (mine === 0) return
    const published = ev.publishedAt ?? now - Math.max(0, peer.lag ?? 0)
    const transit = Math.max(0, now - published)
    if (mine > published - transit) this.counters.races++
  }

  private sampleLag(peer: Peer, sample: number): void {
    peer.lag = peer.lag === null ? sample : peer.lag + LAG_ALPHA * (sample - peer.lag)
  }

  private addPeer(id: string, kvRouter: boolean): Peer {
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
    this.peers.set(id, peer)
    this.updateSpread()
    return peer
  }

  private onHeartbeat(bytes: Uint8Array): void {
    let hb: Record<string, unknown>
    let id: string
    try {
      const v = parseJsonExact(utf8.decode(bytes))
      if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('not an object')
      hb = v as Record<string, unknown>
      id = readU64(hb['router_id'], 'router_id').toString()
    } catch (err) {
      this.malformed('a heartbeat', err)
      return
    }
    if (id === this.id) return
    const now = wallNow()
    const known = this.peers.get(id)
    if (hb['bye'] === true) {
      if (known !== undefined) this.gone(known)
      return
    }
    const peer = known ?? this.addPeer(id, true)
    // a kv-router peer first heard of now may hold bookings made before: ask it for them
    const fresh = known === undefined || !peer.kvRouter
    peer.kvRouter = true
    peer.lastSeenAt = now
    peer.lastHeartbeatAt = now
    if (typeof hb['url'] === 'string') peer.url = hb['url']
    if (typeof hb['host'] === 'string') peer.host = hb['host']
    if (typeof hb['bookings'] === 'number') peer.reportedBookings = hb['bookings']
    if (typeof hb['sent_at'] === 'number') this.sampleLag(peer, now - hb['sent_at'])
    if (!peer.alive || fresh) this.revive(peer)
  }

  /** A peer heard from again after it was taken for gone: its bookings are fetched afresh. */
  private revive(peer: Peer): void {
    peer.alive = true
    peer.lastHeartbeatAt = wallNow()
    this.updateSpread()
    if (peer.kvRouter && !this.closed) void this.catchUp(peer.id, false)
  }

  /** A peer stopped (bye), went silent or left the registry: everything it held here goes. */
  private gone(peer: Peer): void {
    if (!peer.alive) return
    peer.alive = false
    const dropped = this.sched.dropRemoteOwner(peer.owner)
    this.counters.remoteDropped.peer_gone += dropped
    limited.info(
      'replica_peer_gone',
      { router_id: peer.id, bookings_dropped: dropped },
      'a peer replica is gone (it said goodbye, went silent or left the registry): its bookings are dropped',
    )
    this.updateSpread()
  }

  /** Periodic: kv-router peers silent past the limit are gone; peers that stopped routing leave the spread. */
  private sweep(): void {
    const now = wallNow()
    for (const p of this.peers.values()) if (p.alive && p.kvRouter && now - p.lastHeartbeatAt > this.silenceMs) this.gone(p)
    this.updateSpread()
  }

  private heartbeat(): void {
    if (this.closed || !this.connected) return
    const body = `{"router_id":${this.id},"url":${JSON.stringify(this.url)},"host":${JSON.stringify(this.host)},"started_at":${this.startedAt},"sent_at":${wallNow()},"bookings":${this.sched.sequences.size},"in_step":${this.inStep}}`
    try {
      this.nc.publish(this.subjects.heartbeats, body)
    } catch {
      // the next one will do
    }
  }

  /**
   * The spread's rank: among this replica and the live kv-router peers that booked within the
   * last second (those that may be routing at this moment), sorted by router id.
   */
  private updateSpread(): void {
    const now = wallNow()
    const ids = [this.routerId]
    for (const p of this.peers.values()) if (p.alive && p.kvRouter && now - p.lastBookingAt <= ROUTING_MS) ids.push(BigInt(p.id))
    ids.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
    const rank = ids.indexOf(this.routerId)
    const key = ids.join(',')
    if (key === this.spreadKey) return
    this.spreadKey = key
    this.spreadRankOf = { rank, of: ids.length }
    this.predecessors = new Map(ids.slice(0, rank).map((id, k) => [id.toString(), k]))
    this.sched.setSpread(rank, ids.length, this.opts.spread)
  }

  /** This replica's rank and the replicas routing now, as the spread uses them. */
  spreadRankOf = { rank: 0, of: 1 }

  // ---- registry (etcd) ----

  /** A replica listed in the etcd registry. */
  registered(id: string, url: string | null, host: string | null): void {
    if (id === this.id) return
    const peer = this.peers.get(id) ?? this.addPeer(id, true)
    peer.kvRouter = true
    peer.registered = true
    if (url !== null) peer.url = url
    if (host !== null) peer.host = host
  }

  /** A replica's registry key went away (it stopped, or its lease expired). */
  deregistered(id: string): void {
    const peer = this.peers.get(id)
    if (peer === undefined) return
    peer.registered = false
    this.gone(peer)
  }

  // ---- catch-up ----

  /** Answers a catch-up request with this router's live bookings, in chunks NATS can carry. */
  private onCatchUpRequest(msg: Msg): void {
    if (msg.reply === undefined || msg.reply === '') return
    let requester: string
    let target: string | null
    let withSessions: boolean
    try {
      const v = parseJsonExact(utf8.decode(msg.data)) as Record<string, unknown>
      requester = readU64(v['router_id'], 'router_id').toString()
      target = v['target'] === null || v['target'] === undefined ? null : readU64(v['target'], 'target').toString()
      // asked for by replicas that take them: an older one would read the lines as bookings
      withSessions = v['sessions'] === true
    } catch (err) {
      this.malformed('a catch-up request', err)
      return
    }
    if (requester === this.id || (target !== null && target !== this.id)) return
    const peer = this.peers.get(requester) ?? this.addPeer(requester, true)
    if (!peer.kvRouter) {
      peer.kvRouter = true
      this.updateSpread()
    }
    peer.lastSeenAt = wallNow()
    const w = this.sched.workers
    const now = wallNow()
    const lines: string[] = []
    for (const b of this.sched.sequences.localBookings()) {
      const wid = w.workerIdOf(b.slot)
      const rank = w.dpRankOf(b.slot)
      if (b.lo !== null && b.hi !== null)
        lines.push(encodeAddRequest(b.id, wid, rank, this.id, b.lo, b.hi, b.lo.length, b.isl, b.overlapBlocks, true, b.prefillTokens, now))
      else if (b.uniqueBlocks > 0) {
        const lo = new Uint32Array(b.uniqueBlocks)
        const hi = new Uint32Array(b.uniqueBlocks)
        randomFillSync(lo)
        randomFillSync(hi)
        lines.push(encodeAddRequest(b.id, wid, rank, this.id, lo, hi, b.uniqueBlocks, b.isl, b.overlapBlocks, true, b.prefillTokens, now))
      } else lines.push(encodeAddRequest(b.id, wid, rank, this.id, null, null, 0, b.isl, b.overlapBlocks, true, b.prefillTokens, now))
    }
    if (withSessions && this.opts.sessionBindings !== undefined)
      for (const b of this.opts.sessionBindings()) lines.push(this.sessionLine(b.session, b.workerId, b.dpRank, Math.max(1, Math.round(b.ttlMs))))
    const peers: string[] = []
    for (const p of this.peers.values()) if (p.alive && p.kvRouter && p.id !== requester) peers.push(p.id)
    const limit = Math.min(512 * 1024, Math.floor(this.maxPayload / 2))
    const header = (part: number, last: boolean, count: number): string =>
      `{"router_id":${this.id},"url":${JSON.stringify(this.url)},"host":${JSON.stringify(this.host)},"peers":[${peers.join(',')}],"part":${part},"last":${last},"count":${count},"sent_at":${wallNow()}}`
    let part = 0
    let chunk: string[] = []
    let size = 0
    const send = (last: boolean): void => {
      try {
        this.nc.publish(msg.reply as string, [header(part++, last, chunk.length), ...chunk].join('\n'))
      } catch (err) {
        this.dropped('publish_error', { error: (err as Error).message })
      }
      chunk = []
      size = 0
    }
    for (const line of lines) {
      if (size > 0 && size + line.length > limit) send(false)
      chunk.push(line)
      size += line.length + 1
    }
    send(true)
  }

  /**
   * Asks peers (all, or one) for their live bookings and applies the answers. The first one, and
   * the one after a reconnection, gate readiness (`gate`); it ends when every peer known (live
   * kv-router peers, the registry, the peers the answers name) has answered and a short grace
   * has passed, when no peer listens, or at the timeout. Answers arriving later, until the
   * timeout, are still applied.
   */
  catchUp(target: string | null, gate: boolean): Promise<void> {
    if (this.closed || this.nc.isClosed()) return Promise.resolve()
    const started = performance.now()
    if (gate) this.gating++
    let resolveDone: () => void = () => undefined
    const done = new Promise<void>((r) => (resolveDone = r))
    let bookings = 0
    const expected = new Set<string>()
    if (target !== null) expected.add(target)
    else for (const p of this.peers.values()) if (p.kvRouter && (p.alive || p.registered)) expected.add(p.id)
    const inbox = `_INBOX.kvrouter.${this.id}.${Math.random().toString(36).slice(2)}`
    const c: CatchUp = {
      started,
      target,
      expected,
      answered: new Set(),
      listed: new Map(),
      sub: undefined as unknown as Subscription,
      grace: undefined,
      done: false,
      finish: (outcome) => {
        if (c.done) return
        c.done = true
        if (c.grace !== undefined) clearTimeout(c.grace)
        if (!this.closed) this.counters.catchUps[outcome]++
        if (outcome === 'timeout' && !this.closed)
          limited.warn(
            'replica_catch_up_timeout',
            { answered: c.answered.size, expected: c.expected.size, bookings },
            'the catch-up with the peers timed out: peers that did not answer count only their bookings made from now on',
          )
        this.lastCatchUp = { at: Date.now(), ms: performance.now() - started, outcome, peers: c.answered.size, bookings }
        if (gate) this.gating--
        resolveDone()
      },
    }
    let timeout: NodeJS.Timeout | undefined
    const end = (): void => {
      clearTimeout(timeout)
      c.sub.unsubscribe()
      this.catchUps.delete(c)
      if (this.catchUps.size === 0) this.tombstones.clear()
    }
    timeout = setTimeout(() => {
      c.finish('timeout')
      end()
    }, this.opts.catchUpTimeoutMs)
    timeout.unref()
    c.sub = this.nc.subscribe(inbox, {
      callback: (err, msg) => {
        if (err !== null || this.closed) return
        if (msg.headers?.code === 503) {
          // nobody listens on the subject: no peer to wait for
          if (c.answered.size === 0) {
            c.finish('alone')
            end()
          }
          return
        }
        bookings += this.applyAnswer(c, msg.data)
        if (!c.done && [...c.expected].every((id) => c.answered.has(id)) && c.answered.size > 0) {
          if (c.grace !== undefined) clearTimeout(c.grace)
          c.grace = setTimeout(() => {
            if ([...c.expected].every((id) => c.answered.has(id))) c.finish('complete')
          }, this.graceMs)
          c.grace.unref()
        }
      },
    })
    this.catchUps.add(c)
    try {
      this.nc.publish(
        this.subjects.catchUp,
        `{"router_id":${this.id},"target":${target ?? 'null'}${this.opts.onSessionBinding !== undefined ? ',"sessions":true' : ''}}`,
        { reply: inbox },
      )
    } catch {
      c.finish('timeout')
      end()
    }
    return done
  }

  /** Applies one chunk of a peer's answer; returns the bookings it added. */
  private applyAnswer(c: CatchUp, data: Uint8Array): number {
    const text = utf8.decode(data)
    const lines = text.split('\n')
    let head: Record<string, unknown>
    let id: string
    try {
      head = parseJsonExact(lines[0] ?? '') as Record<string, unknown>
      id = readU64(head['router_id'], 'router_id').toString()
    } catch (err) {
      this.malformed("a catch-up answer's header", err)
      return 0
    }
    if (id === this.id) return 0
    const peer = this.peers.get(id) ?? this.addPeer(id, true)
    if (!peer.kvRouter) {
      peer.kvRouter = true
      this.updateSpread()
    }
    peer.lastSeenAt = wallNow()
    peer.lastHeartbeatAt = peer.lastSeenAt
    if (!peer.alive) {
      peer.alive = true
      this.updateSpread()
    }
    if (typeof head['url'] === 'string') peer.url = head['url']
    if (typeof head['host'] === 'string') peer.host = head['host']
    if (typeof head['sent_at'] === 'number') this.sampleLag(peer, peer.lastSeenAt - head['sent_at'])
    if (c.target === null && Array.isArray(head['peers'])) {
      for (const p of head['peers']) {
        try {
          const pid = readU64(p, 'peer').toString()
          if (pid !== this.id) c.expected.add(pid)
        } catch {
          // a peer list we cannot read only makes the wait shorter
        }
      }
    }
    let listed = c.listed.get(id)
    if (listed === undefined) c.listed.set(id, (listed = new Set()))
    let added = 0
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i] as string
      if (line.includes('"session_id":')) {
        this.catchUpSession(line)
        continue
      }
      let ev: ActiveSequenceEvent
      try {
        ev = this.decoder.decode(Buffer.from(line))
      } catch (err) {
        this.malformed('a booking in a catch-up answer', err)
        continue
      }
      if (ev.kind !== 'add') continue
      const key = `${peer.owner}:${ev.requestId}`
      listed.add(key)
      if (this.tombstones.has(key)) continue
      const prefill = prefillTokensOf(ev, this.opts.blockSize)
      const outcome = this.sched.addRemote(
        key,
        peer.owner,
        ev.workerId,
        ev.dpRank,
        prefill,
        ev.lo ?? undefined,
        ev.hi ?? undefined,
        ev.lo === null ? 0 : ev.n,
        ev.isl ?? 0,
        ev.overlap ?? 0,
      )
      if (outcome === 'applied') added++
      // held already from its event: the answer says whether its prefill is still to come
      else if (outcome === 'duplicate' && prefill === 0) this.sched.markRemotePrefillComplete(key)
    }
    this.counters.catchUpBookings += added
    if (head['last'] === true) {
      c.answered.add(id)
      // what it held before this catch-up began and no longer lists has ended there
      const cutoff = c.started
      for (const { key, addedAt } of this.sched.sequences.remoteKeysOf(peer.owner)) {
        if (addedAt < cutoff && !listed.has(key) && this.sched.freeRemote(key)) this.counters.remoteDropped.catch_up++
      }
    }
    return added
  }

  /** A session binding a catch-up answer lists: taken where this router holds none for it. */
  private catchUpSession(line: string): void {
    const b = this.parseSessionBinding(line)
    if (b === null || b.id === this.id || this.opts.onSessionBinding === undefined) return
    if (this.sched.slotOf(b.workerId, b.dpRank) < 0 || this.opts.isBound?.(b.session) === true) return
    this.opts.onSessionBinding(b.session, b.workerId, b.dpRank, b.ttlMs, true)
    this.counters.catchUpSessions++
  }

  // ---- status, inspection, shutdown ----

  private async watchStatus(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (s.type === this.events.Disconnect) {
        this.counters.disconnects++
        this.up = false
        limited.warn(
          'replica_nats_disconnected',
          { server: String(s.data) },
          "replica sync lost its NATS connection: this replica's bookings are held until it is back",
        )
      } else if (s.type === this.events.Reconnect) {
        this.counters.reconnects++
        this.up = true
        limited.info('replica_nats_reconnected', { server: String(s.data) }, 'replica sync is connected to NATS again')
        this.maxPayload = this.nc.info?.max_payload ?? this.maxPayload
        this.flush()
        this.heartbeat()
        // events published while this router was away never reached it
        if (!this.closed) void this.catchUp(null, true)
      }
    }
  }

  /** Sets the URL peers and /v1/replicas show for this replica. */
  setUrl(url: string): void {
    this.url = url
    this.heartbeat()
  }

  /** Every peer heard of, with what is held for it. */
  peerInfo(): PeerInfo[] {
    const held = this.sched.sequences.countByOwner()
    return [...this.peers.values()].map((p) => ({
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
  get livePeers(): number {
    let n = 0
    for (const p of this.peers.values()) if (p.alive) n++
    return n
  }

  /** Says goodbye (peers drop this router's bookings at once), publishes what is queued, closes. */
  async close(): Promise<void> {
    if (this.closed) return
    for (const t of this.timers) clearInterval(t)
    this.flush()
    this.closed = true
    if (this.sched.observer === this) this.sched.observer = null
    for (const c of [...this.catchUps]) c.finish('timeout')
    if (this.connected) {
      try {
        this.nc.publish(this.subjects.heartbeats, `{"router_id":${this.id},"bye":true,"sent_at":${wallNow()}}`)
      } catch {
        // closing anyway
      }
    }
    for (const s of this.subs) s.unsubscribe()
    if (!this.nc.isClosed()) await this.nc.drain().catch(() => undefined)
    if (!this.nc.isClosed()) await this.nc.close().catch(() => undefined)
  }
}
