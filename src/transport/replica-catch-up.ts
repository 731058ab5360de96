// Subject kvrouter_bookings (kv-router's own, request/reply): a replica that starts or reconnects
// asks every peer for its live bookings (and session bindings) and is `in step` (ready) once all
// known peers answered, nobody answers, or the catch-up timeout passes. A peer heard from again
// after it was taken for gone is asked alone.
import type { Msg, Subscription } from 'nats'
import type { ActiveSequenceEvent } from '../codec/active-sequence.js'
import { ActiveSequenceDecoder, prefillTokensOf } from '../codec/active-sequence.js'
import { parseJsonExact, readU64 } from '../codec/json.js'
import { limited } from '../runtime/log.js'
import type { CatchUpState } from './replica-bookings.js'
import { addRemoteBooking, addRequestText } from './replica-bookings.js'
import type { ReplicaLink } from './replica-link.js'
import { utf8, wallNow } from './replica-link.js'
import type { ReplicaPeers } from './replica-peers.js'
import { ReplicaSessions } from './replica-sessions.js'

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

export class ReplicaCatchUps implements CatchUpState {
  /** When the last catch-up ended (wall ms), and how long it took. */
  last: { at: number; ms: number; outcome: string; peers: number; bookings: number } | null = null
  readonly tombstones = new Set<string>()

  private readonly decoder = new ActiveSequenceDecoder()
  private readonly graceMs: number
  private readonly active = new Set<CatchUp>()
  /** The initial (or post-reconnect) catch-ups still running; in step when 0. */
  private gating = 0

  constructor(
    private readonly link: ReplicaLink,
    private readonly peers: ReplicaPeers,
    private readonly sessions: ReplicaSessions,
  ) {
    this.graceMs = link.opts.catchUpGraceMs ?? 50
  }

  get running(): boolean {
    return this.active.size > 0
  }

  /** False from the start or a reconnection until the catch-up that follows has ended. */
  get inStep(): boolean {
    return this.gating === 0
  }

  /** Ends every catch-up still running (as timed out), on close. */
  finishAll(): void {
    for (const c of [...this.active]) c.finish('timeout')
  }

  /** Answers a catch-up request with this router's live bookings, in chunks NATS can carry. */
  onRequest(msg: Msg): void {
    if (msg.reply === undefined || msg.reply === '') return
    const link = this.link
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
      link.malformed('a catch-up request', err)
      return
    }
    if (requester === link.id || (target !== null && target !== link.id)) return
    this.peers.kvRouterHeard(requester)
    const now = wallNow()
    const lines: string[] = []
    for (const b of link.sched.sequences.localBookings()) lines.push(addRequestText(link, b.id, b, now))
    if (withSessions && link.opts.sessionBindings !== undefined)
      for (const b of link.opts.sessionBindings()) lines.push(this.sessions.line(b.session, b.workerId, b.dpRank, Math.max(1, Math.round(b.ttlMs))))
    const peers: string[] = []
    for (const p of this.peers.values()) if (p.alive && p.kvRouter && p.id !== requester) peers.push(p.id)
    const limit = Math.min(512 * 1024, Math.floor(link.maxPayload / 2))
    const header = (part: number, last: boolean, count: number): string =>
      `{"router_id":${link.id},"url":${JSON.stringify(link.url)},"host":${JSON.stringify(link.host)},"peers":[${peers.join(',')}],"part":${part},` +
      `"last":${last},"count":${count},"sent_at":${wallNow()}}`
    let part = 0
    let chunk: string[] = []
    let size = 0
    const send = (last: boolean): void => {
      try {
        link.nc.publish(msg.reply as string, [header(part++, last, chunk.length), ...chunk].join('\n'))
      } catch (err) {
        link.dropped('publish_error', { error: (err as Error).message })
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
  run(target: string | null, gate: boolean): Promise<void> {
    const link = this.link
    if (link.closed || link.nc.isClosed()) return Promise.resolve()
    const started = performance.now()
    if (gate) this.gating++
    let resolveDone: () => void = () => undefined
    const done = new Promise<void>((r) => (resolveDone = r))
    let bookings = 0
    const expected = new Set<string>()
    if (target !== null) expected.add(target)
    else for (const p of this.peers.values()) if (p.kvRouter && (p.alive || p.registered)) expected.add(p.id)
    const inbox = `_INBOX.kvrouter.${link.id}.${Math.random().toString(36).slice(2)}`
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
        if (!link.closed) link.counters.catchUps[outcome]++
        if (outcome === 'timeout' && !link.closed)
          limited.warn(
            'replica_catch_up_timeout',
            { answered: c.answered.size, expected: c.expected.size, bookings },
            'the catch-up with the peers timed out: peers that did not answer count only their bookings made from now on',
          )
        this.last = { at: Date.now(), ms: performance.now() - started, outcome, peers: c.answered.size, bookings }
        if (gate) this.gating--
        resolveDone()
      },
    }
    let timeout: NodeJS.Timeout | undefined
    const end = (): void => {
      clearTimeout(timeout)
      c.sub.unsubscribe()
      this.active.delete(c)
      if (this.active.size === 0) this.tombstones.clear()
    }
    timeout = setTimeout(() => {
      c.finish('timeout')
      end()
    }, link.opts.catchUpTimeoutMs)
    timeout.unref()
    c.sub = link.nc.subscribe(inbox, {
      callback: (err, msg) => {
        if (err !== null || link.closed) return
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
    this.active.add(c)
    try {
      link.nc.publish(
        link.subjects.catchUp,
        `{"router_id":${link.id},"target":${target ?? 'null'}${link.opts.onSessionBinding !== undefined ? ',"sessions":true' : ''}}`,
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
    const link = this.link
    const text = utf8.decode(data)
    const lines = text.split('\n')
    let head: Record<string, unknown>
    let id: string
    try {
      head = parseJsonExact(lines[0] ?? '') as Record<string, unknown>
      id = readU64(head['router_id'], 'router_id').toString()
    } catch (err) {
      link.malformed("a catch-up answer's header", err)
      return 0
    }
    if (id === link.id) return 0
    const peer = this.peers.kvRouterHeard(id)
    peer.lastHeartbeatAt = peer.lastSeenAt
    if (!peer.alive) {
      peer.alive = true
      this.peers.updateSpread()
    }
    if (typeof head['url'] === 'string') peer.url = head['url']
    if (typeof head['host'] === 'string') peer.host = head['host']
    if (typeof head['sent_at'] === 'number') this.peers.sampleLag(peer, peer.lastSeenAt - head['sent_at'])
    if (c.target === null && Array.isArray(head['peers'])) {
      for (const p of head['peers']) {
        try {
          const pid = readU64(p, 'peer').toString()
          if (pid !== link.id) c.expected.add(pid)
        } catch {
          // a peer list we cannot read only makes the wait shorter
        }
      }
    }
    let listed = c.listed.get(id)
    if (listed === undefined) c.listed.set(id, (listed = new Set()))
    const sched = link.sched
    let added = 0
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i] as string
      if (ReplicaSessions.isBindingLine(line)) {
        this.sessions.onCaughtUp(line)
        continue
      }
      let ev: ActiveSequenceEvent
      try {
        ev = this.decoder.decode(Buffer.from(line))
      } catch (err) {
        link.malformed('a booking in a catch-up answer', err)
        continue
      }
      if (ev.kind !== 'add') continue
      const key = `${peer.owner}:${ev.requestId}`
      listed.add(key)
      if (this.tombstones.has(key)) continue
      const prefill = prefillTokensOf(ev, link.opts.blockSize)
      const outcome = addRemoteBooking(sched, key, peer.owner, ev, prefill)
      if (outcome === 'applied') added++
      // held already from its event: the answer says whether its prefill is still to come
      else if (outcome === 'duplicate' && prefill === 0) sched.markRemotePrefillComplete(key)
    }
    link.counters.catchUpBookings += added
    if (head['last'] === true) {
      c.answered.add(id)
      // what it held before this catch-up began and no longer lists has ended there
      const cutoff = c.started
      for (const { key, addedAt } of sched.sequences.remoteKeysOf(peer.owner)) {
        if (addedAt < cutoff && !listed.has(key) && sched.freeRemote(key)) link.counters.remoteDropped.catch_up++
      }
    }
    return added
  }
}
