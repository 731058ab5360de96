// What the replica-sync subjects share: the NATS connection, this router's identity, the
// scheduler, the counters and the warnings every subject logs alike.
import { hostname } from 'node:os'
import type { NatsConnection } from 'nats'
import { limited } from '../runtime/log.js'
import type { Scheduler } from '../scheduler/scheduler.js'
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

export type ReceivedOutcome = 'applied' | 'own' | 'unknown_worker' | 'duplicate' | 'unknown_request' | 'incompatible'

export interface ReplicaCounters {
  published: Record<'add' | 'prefill_completed' | 'free' | 'session_binding', number>
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

export const utf8 = new TextDecoder()

/** Wall clock in fractional ms: publish times are compared across processes. */
export const wallNow = (): number => performance.timeOrigin + performance.now()

export class ReplicaLink {
  readonly routerId: bigint
  /** The router id in decimal, as messages carry it. */
  readonly id: string
  readonly subjects: { events: string; heartbeats: string; catchUp: string; sessions: string }
  readonly sched: Scheduler
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
  /** Largest message the server takes (refreshed on reconnection). */
  maxPayload = 1024 * 1024
  up = true
  closed = false

  constructor(
    readonly nc: NatsConnection,
    readonly opts: ReplicaSyncOptions,
  ) {
    this.routerId = opts.routerId
    this.id = opts.routerId.toString()
    this.subjects = replicaSubjects(opts.namespace, opts.component)
    this.sched = opts.scheduler
    this.maxPayload = nc.info?.max_payload ?? this.maxPayload
  }

  get connected(): boolean {
    return this.up && !this.nc.isClosed()
  }

  /** One inbound message of `type`, by what became of it. */
  count(type: string, outcome: ReceivedOutcome): void {
    const k = `${type}:${outcome}`
    this.counters.received.set(k, (this.counters.received.get(k) ?? 0) + 1)
  }

  malformed(what: string, err: unknown): void {
    this.counters.malformed++
    limited.warn('replica_malformed', { what, error: err instanceof Error ? err.message : String(err) }, `${what} from a peer did not decode: skipped`)
  }

  dropped(reason: 'queue_full' | 'too_large' | 'publish_error', fields: Record<string, unknown>): void {
    this.counters.dropped[reason]++
    limited.warn('replica_events_dropped', { reason, ...fields }, 'a booking event was not published to the peers')
  }
}
