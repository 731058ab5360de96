// Subject kvrouter_sessions (kv-router's own): each session-affinity binding made, so a
// conversation whose turns reach different replicas stays on one worker. A catch-up answer lists
// the live bindings in the same form.
import { parseJsonExact, readU64 } from '../codec/json.js'
import type { ReplicaLink } from './replica-link.js'
import { utf8 } from './replica-link.js'

/** Longest session id shared (the session-affinity limit). */
const MAX_SESSION_ID = 256

interface SessionBinding {
  id: string
  session: string
  workerId: bigint
  dpRank: number
  ttlMs: number
}

export class ReplicaSessions {
  constructor(private readonly link: ReplicaLink) {}

  /**
   * Tells the peers this router bound a session to a worker-rank for ttlMs. Best effort, outside
   * Dynamo's subject (Dynamo routers do not share sessions): a lost one costs the next turn its
   * binding on another replica, which then routes it by the cost and binds it there.
   */
  share(session: string, workerId: bigint, dpRank: number, ttlMs: number): void {
    const link = this.link
    if (link.closed || !link.up) {
      link.counters.dropped.publish_error++
      return
    }
    try {
      link.nc.publish(link.subjects.sessions, this.line(session, workerId, dpRank, ttlMs))
      link.counters.published.session_binding++
    } catch {
      link.counters.dropped.publish_error++
    }
  }

  /** A peer's binding, as published. */
  onBinding(bytes: Uint8Array): void {
    const link = this.link
    const b = this.parse(utf8.decode(bytes))
    if (b === null) return
    if (b.id === link.id) return link.count('session_binding', 'own')
    if (link.sched.slotOf(b.workerId, b.dpRank) < 0) return link.count('session_binding', 'unknown_worker')
    link.opts.onSessionBinding?.(b.session, b.workerId, b.dpRank, b.ttlMs, false)
    link.count('session_binding', 'applied')
  }

  /** A binding a catch-up answer lists: taken where this router holds none for it. */
  onCaughtUp(line: string): void {
    const link = this.link
    const b = this.parse(line)
    if (b === null || b.id === link.id || link.opts.onSessionBinding === undefined) return
    if (link.sched.slotOf(b.workerId, b.dpRank) < 0 || link.opts.isBound?.(b.session) === true) return
    link.opts.onSessionBinding(b.session, b.workerId, b.dpRank, b.ttlMs, true)
    link.counters.catchUpSessions++
  }

  /** A binding as published (and as a catch-up answer lists it). */
  line(session: string, workerId: bigint, dpRank: number, ttlMs: number): string {
    return `{"router_id":${this.link.id},"session_id":${JSON.stringify(session)},"worker_id":${workerId},"dp_rank":${dpRank},"ttl_ms":${ttlMs}}`
  }

  /** Whether a line of a catch-up answer is a session binding (else a booking). */
  static isBindingLine(line: string): boolean {
    return line.includes('"session_id":')
  }

  /** A binding as published; null, counted, when malformed. */
  private parse(text: string): SessionBinding | null {
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
      this.link.counters.malformed++
      return null
    }
  }
}
