// Subject active_sequences_events (Dynamo's, on the workers' component): every booking this
// router makes, marks prefill-complete or frees goes out as Dynamo's ActiveSequenceEvent
// (src/codec/active-sequence.ts); peers' events are applied to the scheduler as bookings owned by
// that peer.
//
// Outbound events go through a bounded queue flushed on the next turn of the event loop (and held
// while NATS is down); a full queue drops the newest event and counts it. Inbound events that do
// not decode are counted and skipped.
import { randomFillSync } from 'node:crypto'
import { ActiveSequenceDecoder, encodeAddRequest, encodeLifecycle, prefillTokensOf } from '../codec/active-sequence.js'
import type { ActiveSequenceEvent, AddRequestBooking } from '../codec/active-sequence.js'
import { limited } from '../runtime/log.js'
import { booking, TRACK_SHARED, TRACK_UNIQUE } from '../scheduler/active-sequences.js'
import type { Booking } from '../scheduler/active-sequences.js'
import type { BookingObserver, RemoteOutcome, Scheduler } from '../scheduler/scheduler.js'
import type { ReplicaLink } from './replica-link.js'
import { wallNow } from './replica-link.js'
import type { Peer, ReplicaPeers } from './replica-peers.js'
import { ROUTING_MS } from './replica-peers.js'

const KIND_ADD = 0
const KIND_PREFILL = 1
const KIND_FREE = 2
const KIND_NAMES = ['add', 'prefill_completed', 'free'] as const
/** Cap of the sync delay a peer's booking is taken as its current request for (a skewed lag estimate can be large). */
const MAX_SEEN_MS = 20

/** Fresh random hashes for blocks counted without hashes: Dynamo's never-shared blocks go out so. */
export function randomHashes(n: number): Uint32Array {
  const out = new Uint32Array(n)
  randomFillSync(out)
  return out
}

/** Scratch of addRemoteBooking, read by the scheduler during the call. */
const remote: Booking = booking()

/** A peer's AddRequest handed to the scheduler as a booking owned by that peer. */
export function addRemoteBooking(sched: Scheduler, key: string, owner: number, ev: ActiveSequenceEvent, prefill: number): RemoteOutcome {
  const b = remote
  b.isl = ev.isl ?? 0
  b.overlapBlocks = ev.overlap ?? 0
  b.prefillTokens = prefill
  b.lo = ev.lo ?? undefined
  b.hi = ev.hi ?? undefined
  b.n = ev.lo === null ? 0 : ev.n
  return sched.addRemote(key, owner, ev.workerId, ev.dpRank, b)
}

/** Scratch of addRequestText for a booking whose blocks go out other than as its own hashes. */
const unshared: AddRequestBooking = { lo: undefined, hi: undefined, n: 0, isl: 0, overlapBlocks: 0, trackPrefill: true, prefillTokens: 0 }

/**
 * The AddRequest of one of this router's bookings (its event, or a line of a catch-up answer).
 * Blocks counted without hashes go out as fresh random hashes, as Dynamo's never-shared blocks do.
 */
export function addRequestText(link: ReplicaLink, id: string, b: Readonly<Booking>, now: number): string {
  let sent: Readonly<AddRequestBooking> = b
  if (b.track !== TRACK_SHARED) {
    const k = b.track === TRACK_UNIQUE ? b.n : 0
    const u = unshared
    u.lo = k > 0 ? randomHashes(k) : undefined
    u.hi = k > 0 ? randomHashes(k) : undefined
    u.n = k
    u.isl = b.isl
    u.overlapBlocks = b.overlapBlocks
    u.trackPrefill = b.trackPrefill
    u.prefillTokens = b.prefillTokens
    sent = u
  }
  const w = link.sched.workers
  return encodeAddRequest(id, w.workerIdOf(b.slot), w.dpRankOf(b.slot), link.id, sent, now)
}

/** The catch-ups running, as far as inbound events must know of them. */
export interface CatchUpState {
  /** Whether a catch-up is running. */
  readonly running: boolean
  /** Frees of unknown bookings while a catch-up runs: its answers must not bring them back. */
  readonly tombstones: Set<string>
}

export class ReplicaBookings implements BookingObserver {
  private readonly decoder = new ActiveSequenceDecoder()
  private readonly capacity: number
  private qText: string[] = []
  private qKind: number[] = []
  private qHead = 0
  private flushScheduled = false
  /** Wall ms of this router's last booking per slot (race count). */
  private lastLocal = new Float64Array(64)

  constructor(
    private readonly link: ReplicaLink,
    private readonly peers: ReplicaPeers,
    private readonly catchUps: CatchUpState,
  ) {
    this.capacity = link.opts.queueCapacity ?? 10_000
  }

  /** Outbound events waiting to be published. */
  get queued(): number {
    return this.qText.length - this.qHead
  }

  // ---- this router's bookings, out (BookingObserver) ----

  booked(id: string, b: Readonly<Booking>): void {
    const now = wallNow()
    if (b.slot >= this.lastLocal.length) this.growLastLocal(b.slot + 1)
    this.lastLocal[b.slot] = now
    if (this.link.closed) return
    this.enqueue(KIND_ADD, addRequestText(this.link, id, b, now))
  }

  prefillCompleted(id: string, slot: number): void {
    if (this.link.closed) return
    const w = this.link.sched.workers
    this.enqueue(KIND_PREFILL, encodeLifecycle('prefill_completed', id, w.workerIdOf(slot), w.dpRankOf(slot), this.link.id, wallNow()))
  }

  freed(id: string, slot: number): void {
    if (this.link.closed) return
    const w = this.link.sched.workers
    this.enqueue(KIND_FREE, encodeLifecycle('free', id, w.workerIdOf(slot), w.dpRankOf(slot), this.link.id, wallNow()))
  }

  private growLastLocal(n: number): void {
    const next = new Float64Array(Math.max(n, this.lastLocal.length * 2))
    next.set(this.lastLocal)
    this.lastLocal = next
  }

  private enqueue(kind: number, text: string): void {
    if (this.queued >= this.capacity) {
      // the newest is dropped, as Dynamo's bounded channel does: what is queued stays in order
      this.link.dropped('queue_full', { queued: this.queued })
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
  flush(): void {
    this.flushScheduled = false
    const link = this.link
    if (!link.connected) return
    const subject = link.subjects.events
    const max = link.maxPayload
    while (this.qHead < this.qText.length) {
      const i = this.qHead++
      const text = this.qText[i] as string
      const kind = this.qKind[i] as number
      if (text.length * 3 > max && Buffer.byteLength(text) > max) {
        link.dropped('too_large', { bytes: Buffer.byteLength(text), max_payload: max })
        continue
      }
      try {
        link.nc.publish(subject, text)
        link.counters.published[KIND_NAMES[kind] as (typeof KIND_NAMES)[number]]++
      } catch (err) {
        link.dropped('publish_error', { error: (err as Error).message })
      }
    }
    this.qText = []
    this.qKind = []
    this.qHead = 0
  }

  // ---- peers' bookings, in ----

  /** One peer's booking event. */
  onEvent(bytes: Uint8Array): void {
    const link = this.link
    let ev: ActiveSequenceEvent
    try {
      ev = this.decoder.decode(bytes)
    } catch (err) {
      link.malformed('a booking event', err)
      return
    }
    const type = ev.kind
    if (ev.routerId === link.id) return link.count(type, 'own')
    // a newer Dynamo's sparser token sequences would read as other blocks
    if (ev.stride !== null && ev.stride !== 1) {
      limited.warn(
        'replica_incompatible',
        { router_id: ev.routerId, stride: ev.stride },
        "a peer's booking event has a token stride other than 1 (a newer Dynamo): skipped",
      )
      return link.count(type, 'incompatible')
    }
    const now = wallNow()
    let peer = this.peers.get(ev.routerId)
    if (peer === undefined) {
      // lifecycle events of unknown senders are not peers (Dynamo workers mark prefill complete
      // under their own id): only the worker-origin mark is understood
      if (type === 'prefill_completed') return this.workerOriginMark(ev)
      if (type === 'free') return link.count(type, 'unknown_request')
      peer = this.peers.add(ev.routerId, false)
    }
    peer.lastSeenAt = now
    peer.lastEventAt = now
    peer.events++
    if (ev.publishedAt !== null) this.peers.sampleLag(peer, now - ev.publishedAt)
    if (!peer.alive) this.peers.revive(peer)
    const key = `${peer.owner}:${ev.requestId}`
    const sched = link.sched
    if (type === 'add') {
      if (this.catchUps.running && this.catchUps.tombstones.has(key)) return link.count(type, 'duplicate')
      const outcome = addRemoteBooking(sched, key, peer.owner, ev, prefillTokensOf(ev, link.opts.blockSize))
      link.count(type, outcome)
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
        if (idle) this.peers.updateSpread()
        // what the peer routes at this moment is this booking, for about one sync delay
        const k = this.peers.predecessorIndex(peer.id)
        if (k !== undefined) sched.spreadSeen(k, Math.min(MAX_SEEN_MS, Math.max(1, peer.lag ?? 1)))
      }
    } else if (type === 'prefill_completed') {
      if (sched.markRemotePrefillComplete(key)) link.count(type, 'applied')
      else this.workerOriginMark(ev)
    } else if (sched.freeRemote(key)) link.count(type, 'applied')
    else {
      if (this.catchUps.running) this.catchUps.tombstones.add(key)
      link.count(type, 'unknown_request')
    }
  }

  /** Newer Dynamo workers mark prefill complete themselves: applied to this router's own booking of that request on that worker-rank. */
  private workerOriginMark(ev: ActiveSequenceEvent): void {
    const sched = this.link.sched
    const slot = sched.slotOf(ev.workerId, ev.dpRank)
    if (slot >= 0 && sched.sequences.slotOfRequest(ev.requestId) === slot && sched.markPrefillComplete(ev.requestId))
      this.link.count('prefill_completed', 'applied')
    else this.link.count('prefill_completed', 'unknown_request')
  }

  /**
   * A race: this router booked the same worker-rank after the peer's booking was made, or
   * before it by less than the time the peer's event took to arrive (then ours could not have
   * reached the peer either). The publish time and the transit are the peer's clock against ours.
   */
  private checkRace(ev: ActiveSequenceEvent, peer: Peer, now: number): void {
    const slot = this.link.sched.slotOf(ev.workerId, ev.dpRank)
    if (slot < 0 || slot >= this.lastLocal.length) return
    const mine = this.lastLocal[slot] as number
    if (mine === 0) return
    const published = ev.publishedAt ?? now - Math.max(0, peer.lag ?? 0)
    const transit = Math.max(0, now - published)
    if (mine > published - transit) this.link.counters.races++
  }
}
