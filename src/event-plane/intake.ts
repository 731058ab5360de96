// KV events from Dynamo's ZMQ event plane (Dynamo's default since v1.3): the publishers etcd lists
// for the router's namespace and component and the topic `kv-events` (src/event-plane/discovery.ts,
// both record generations, any endpoint of the component), one SUB per publisher endpoint, opened
// when its record appears and closed when it goes; and every ZMQ broker registered under component
// `zmq_broker`, one SUB per XPUB endpoint, its messages de-duplicated on (publisher_id, sequence)
// since each broker forwards them all. Each checked envelope goes to its worker's shard as it came
// (the shard decodes the RouterEvent, as it does NATS messages): O(1) main-thread work per event.
//
// Sequence numbers are followed per publisher (src/event-plane/sequences.ts). A gap hands the
// publisher's worker-rank to the router's recovery of missed events; a restart (sequence 0 again,
// or a new publisher on the same endpoint) resets that worker-rank in the index first, in order
// with its events. The worker-rank comes from the publisher's EventSource record when etcd has
// one, else from the message itself (decoded on the main thread on this rare path only).
import type { ShardPool } from '../shards/pool.js'
import { DynamoMsgpackDecoder } from '../codec/dynamo-msgpack.js'
import { limited } from '../runtime/log.js'
import { isBrokerChannel, isWorkerChannel } from './channels.js'
import type { ChannelDiscovery } from './discovery.js'
import { brokerTopic, directTopic, DROP_REASONS, KV_EVENTS_TOPIC } from './frame.js'
import type { DropReason, EventPlaneMessage, TopicMatch } from './frame.js'
import { SeenPairs } from './dedup.js'
import { PublisherSequences, Seq } from './sequences.js'
import { PlaneSubscriber } from './subscriber.js'
import type { SubscriberSink } from './subscriber.js'

/** What the intake tells the router of a worker-rank whose events were missed or restarted. */
export interface EventPlaneHooks {
  /** Events of the worker-rank never arrived: recover them (src/shards/recovery.ts). */
  gap(workerId: bigint, dpRank: number): void
  /** Its publisher started over: what the index holds of it is stale; reset it, in order with its events. */
  restart(workerId: bigint, dpRank: number): void
}

export interface EventPlaneOptions {
  discovery: ChannelDiscovery
  namespace: string
  component: string
  pool: ShardPool
  hooks: EventPlaneHooks
  topic?: string
  /** De-duplication entries kept for broker mode (Dynamo: 100,000). */
  dedupCapacity?: number
}

export interface EventPlaneCounters {
  /** Messages that passed the checks, and their envelopes' bytes. */
  messages: number
  bytes: number
  /** Messages handed to the shards. */
  applied: number
  /** Broker copies of a (publisher_id, sequence) already applied. */
  duplicates: number
  gaps: number
  restarts: number
  /** Messages at or below their publisher's last sequence (not 0): late or repeated, dropped. */
  stale: number
  /** A gap or restart whose worker-rank could not be told (no EventSource, a payload that does not decode). */
  unattributed: number
  /** Endpoints in publishers' records that ZMQ could not connect to (each counted once). */
  badEndpoints: number
}

export class EventPlaneIntake implements SubscriberSink {
  readonly counters: EventPlaneCounters = { messages: 0, bytes: 0, applied: 0, duplicates: 0, gaps: 0, restarts: 0, stale: 0, unattributed: 0, badEndpoints: 0 }
  readonly drops: Record<DropReason, number> = Object.fromEntries(DROP_REASONS.map((r) => [r, 0])) as Record<DropReason, number>
  private readonly direct = new Map<string, PlaneSubscriber>()
  private readonly brokers = new Map<string, PlaneSubscriber>()
  /** Endpoints ZMQ refused to connect to. */
  private readonly refused = new Set<string>()
  private readonly sequences = new PublisherSequences()
  private readonly seen: SeenPairs
  private readonly topic: string
  private readonly directMatch: TopicMatch
  private readonly brokerMatch: TopicMatch
  /** Decodes the one message after a gap or restart, to name its worker-rank. */
  private readonly decoder = new DynamoMsgpackDecoder()
  private closed = false

  private constructor(private readonly opts: EventPlaneOptions) {
    this.topic = opts.topic ?? KV_EVENTS_TOPIC
    this.directMatch = directTopic(this.topic)
    this.brokerMatch = brokerTopic(opts.namespace, opts.component, this.topic)
    this.seen = new SeenPairs(opts.dedupCapacity ?? 100_000)
  }

  static start(opts: EventPlaneOptions): EventPlaneIntake {
    const intake = new EventPlaneIntake(opts)
    opts.discovery.on('change', () => void intake.reconcile())
    void intake.reconcile()
    return intake
  }

  /** Endpoints with an open SUB: workers' PUBs and brokers' XPUBs. */
  get endpoints(): { direct: string[]; brokers: string[] } {
    return { direct: [...this.direct.keys()], brokers: [...this.brokers.keys()] }
  }

  /** Opens a SUB for every endpoint the records name and closes those no record names any more. */
  private async reconcile(): Promise<void> {
    if (this.closed) return
    const { discovery, namespace, component } = this.opts
    const direct = new Set<string>()
    const brokers = new Set<string>()
    for (const c of discovery.channels.values()) {
      if (c.transport.kind === 'zmq' && isWorkerChannel(c, namespace, component, this.topic)) direct.add(c.transport.endpoint)
      else if (c.transport.kind === 'broker' && isBrokerChannel(c)) for (const e of c.transport.xpub) brokers.add(e)
    }
    const closing: Promise<void>[] = []
    for (const [want, open, broker] of [
      [direct, this.direct, false],
      [brokers, this.brokers, true],
    ] as const) {
      for (const [endpoint, sub] of open) {
        if (want.has(endpoint)) continue
        open.delete(endpoint)
        closing.push(sub.close())
        limited.info('event_plane_unsubscribed', { endpoint, broker }, 'an event-plane publisher left: its SUB is closed')
      }
      for (const endpoint of want) {
        if (open.has(endpoint) || this.refused.has(endpoint)) continue
        try {
          open.set(endpoint, new PlaneSubscriber(endpoint, broker, broker ? this.brokerMatch : this.directMatch, this))
          limited.info('event_plane_subscribed', { endpoint, broker }, "KV events are read from an event-plane publisher's endpoint")
        } catch (err) {
          // an endpoint ZMQ cannot connect to (a malformed address): once per endpoint
          this.refused.add(endpoint)
          this.counters.badEndpoints++
          limited.warn(
            'event_plane_bad_endpoint',
            { endpoint, error: (err as Error).message },
            'an event-plane publisher names an endpoint ZMQ cannot connect to: skipped',
          )
        }
      }
    }
    await Promise.all(closing)
  }

  // ---- SubscriberSink ----

  dropped(from: PlaneSubscriber, why: DropReason): void {
    this.drops[why]++
    limited.warn('event_plane_dropped', { endpoint: from.endpoint, reason: why }, 'an event-plane message is not a valid KV-event message: dropped')
  }

  message(from: PlaneSubscriber, m: EventPlaneMessage): Promise<void> | null {
    const c = this.counters
    c.messages++
    c.bytes += m.envelope.length
    if (from.broker && this.seen.seen(m.publisherHi, m.publisherLo, m.sequenceHi, m.sequenceLo)) {
      c.duplicates++
      return null
    }
    // a new publisher on a worker's endpoint: the process behind it started over
    const replaced = !from.broker && from.lastPublisherHi >= 0 && (from.lastPublisherHi !== m.publisherHi || from.lastPublisherLo !== m.publisherLo)
    from.lastPublisherHi = m.publisherHi
    from.lastPublisherLo = m.publisherLo
    let v = this.sequences.see(m.publisherHi, m.publisherLo, m.sequenceHi, m.sequenceLo)
    if (v === Seq.Stale) {
      c.stale++
      return null
    }
    if (replaced && v === Seq.Next) v = m.sequenceHi === 0 && m.sequenceLo === 0 ? Seq.Restart : Seq.Gap
    if (replaced && v === Seq.Gap) {
      // the new publisher's earlier messages never came, and what its predecessor left is stale
      this.noteRestart(m)
    }
    if (v === Seq.Restart) this.noteRestart(m)
    const gapOf = v === Seq.Gap ? this.rankOf(m) : null
    const pushed = this.opts.pool.push(m.envelope)
    c.applied++
    if (v === Seq.Gap) {
      c.gaps++
      limited.info(
        'event_plane_gap',
        { publisher_id: m.publisherId.toString(), sequence: m.sequence.toString(), missing: this.sequences.missing },
        "messages of an event-plane publisher never arrived: its worker-rank's events are recovered",
      )
      if (gapOf === null) c.unattributed++
      else this.opts.hooks.gap(gapOf.workerId, gapOf.dpRank)
    }
    return pushed ? null : new Promise<void>((resolve) => this.opts.pool.once('drain', () => resolve()))
  }

  private noteRestart(m: EventPlaneMessage): void {
    this.counters.restarts++
    const r = this.rankOf(m)
    limited.info(
      'event_plane_restart',
      { publisher_id: m.publisherId.toString(), sequence: m.sequence.toString() },
      "an event-plane publisher started over: its worker-rank's blocks in the index are reset",
    )
    if (r === null) this.counters.unattributed++
    else this.opts.hooks.restart(r.workerId, r.dpRank)
  }

  /** The worker-rank of a publisher: its EventSource record, else the message's own RouterEvent. */
  private rankOf(m: EventPlaneMessage): { workerId: bigint; dpRank: number } | null {
    const id = m.publisherId
    for (const s of this.opts.discovery.sources.values()) {
      if (s.publisherId === id && s.workerId !== null) return { workerId: s.workerId, dpRank: s.dpRank ?? 0 }
    }
    try {
      const ev = this.decoder.decode(m.envelope)
      return { workerId: (BigInt(ev.workerHi) << 32n) | BigInt(ev.workerLo), dpRank: ev.dpRank }
    } catch {
      return null
    }
  }

  async close(): Promise<void> {
    this.closed = true
    const subs = [...this.direct.values(), ...this.brokers.values()]
    this.direct.clear()
    this.brokers.clear()
    await Promise.all(subs.map((s) => s.close()))
  }
}
