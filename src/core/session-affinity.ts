// Session affinity (`X-Dynamo-Session-ID`, --router-session-affinity-ttl-secs): a session's
// requests go to the worker-rank its last one went to, while that binding is younger than the
// TTL and the worker-rank can take it (registered, not suspended, not busy, not already tried);
// otherwise the request is routed as any other and the session bound to where it went. A
// conversation's turns then meet their own KV cache even where the index has not seen it yet.

/** Bindings kept at most: past it the least recently used go first. */
export const MAX_SESSIONS = 1 << 20
/** Longest session id taken (ids are the client's, and each is held in memory). */
export const MAX_SESSION_ID = 256

interface Binding {
  workerId: bigint
  dpRank: number
  expiresAt: number
}

export interface SessionCounters {
  /** Requests sent where their session was bound. */
  hits: number
  /** Requests of a session with no live binding (new, or expired): bound where they went. */
  bound: number
  /** Requests whose session's worker-rank could not take them (gone, suspended, busy, tried). */
  broken: number
  /** Bindings dropped to stay within MAX_SESSIONS. */
  evicted: number
}

export class SessionAffinity {
  /** In use order, least recently used first (a refresh re-inserts). */
  private readonly bindings = new Map<string, Binding>()
  readonly counters: SessionCounters = { hits: 0, bound: 0, broken: 0, evicted: 0 }

  constructor(
    private readonly ttlMs: number,
    private readonly maxSessions = MAX_SESSIONS,
  ) {}

  get size(): number {
    return this.bindings.size
  }

  /** The session's live binding, or undefined (an expired one is dropped). */
  get(session: string, now: number): Binding | undefined {
    const b = this.bindings.get(session)
    if (b === undefined) return undefined
    if (b.expiresAt <= now) {
      this.bindings.delete(session)
      return undefined
    }
    return b
  }

  /**
   * Binds (or re-binds) the session to the worker-rank its request went to, for the TTL from now
   * (or for `ttlMs`, at most the TTL: a binding a peer's catch-up brings has only its time left).
   */
  bind(session: string, workerId: bigint, dpRank: number, now: number, ttlMs = this.ttlMs): void {
    this.bindings.delete(session)
    this.bindings.set(session, { workerId, dpRank, expiresAt: now + Math.min(ttlMs, this.ttlMs) })
    if (this.bindings.size > this.maxSessions) {
      const oldest = this.bindings.keys().next()
      if (oldest.done !== true) {
        this.bindings.delete(oldest.value)
        this.counters.evicted++
      }
    }
  }

  /** The live bindings and the time each has left (ms), for a peer replica's catch-up. */
  *live(now: number): Generator<{ session: string; workerId: bigint; dpRank: number; ttlMs: number }> {
    for (const [session, b] of this.bindings) if (b.expiresAt > now) yield { session, workerId: b.workerId, dpRank: b.dpRank, ttlMs: b.expiresAt - now }
  }

  /** Drops every binding to the worker (it left). */
  forgetWorker(workerId: bigint): void {
    for (const [s, b] of this.bindings) if (b.workerId === workerId) this.bindings.delete(s)
  }

  /** Drops expired bindings (use order is expiry order: one TTL for all). */
  expire(now: number): number {
    let n = 0
    for (const [s, b] of this.bindings) {
      if (b.expiresAt > now) break
      this.bindings.delete(s)
      n++
    }
    return n
  }
}
