// Durable KV events (`--router-durable-kv-events`), with Dynamo's names and layout: workers
// publish their events into a JetStream stream, each router replica reads it through a durable
// consumer named by its instance id, and replicas keep a snapshot of the index in the object store
// so the stream can be cut short. See docs/operations.md, "Durable mode".
//
// Exactness rests on one number, the stream sequence of the last message handed to the shards
// (`lastSeq`): messages are handed over in stream order, each once, and a snapshot records the
// sequence its dump stands for. A replica that starts loads the snapshot and has its consumer
// deliver from the message after it; a delivery that never arrived (the consumer's delivery
// sequence skips, as after a server restart with messages in flight) or a consumer that is gone
// puts the consumer back at lastSeq + 1. A message at or below lastSeq is a redelivery, already
// applied: acknowledged, not applied again.
//
// Acknowledgements are cumulative (AckAll) and sent for a batch once the shards have applied it
// (a flush barrier over the pool), so what the stream may drop on a purge is what every replica
// has applied.
//
// Snapshots are binary by default, written and loaded by the shards themselves
// (src/index/snapshot-format.ts), or a JSON array of RouterEvents (--router-snapshot-format);
// both are read. The object is written and read with a native digest (object-store.ts).
import { once } from 'node:events'
import type { ConsumerMessages, JetStreamClient, JetStreamManager, JsMsg, NatsConnection } from 'nats'
import type { ShardPool } from '../shards/pool.js'
import { RecoveryKind } from '../thread/protocol.js'
import { encodeRouterEvent } from '../codec/events.js'
import { EventDecoder } from '../codec/event-decoder.js'
import { u64FromParts } from '../codec/u64.js'
import type { RouterEvent } from '../codec/events.js'
import { splitEvents } from '../codec/event-array.js'
import { KvrError, Warn } from '../errors.js'
import { isBinarySnapshot, readSnapshot as snapshotParts } from '../index/snapshot-format.js'
import { limited, log } from '../runtime/log.js'
import { RADIX_STATE_OBJECT, radixBucket } from './dynamo-names.js'
import { JS_CONSUMER_NOT_FOUND, ensureKvEventsStream, jsErrorCode } from './jetstream.js'
import { readObject, writeObject } from './object-store.js'

type Nats = typeof import('nats')

export interface DurableKvEventsOptions {
  nc: NatsConnection
  namespace: string
  component: string
  pool: ShardPool
  /** This replica's instance id: the name of its consumer. */
  instanceId: bigint
  /** A replica snapshots the index when the stream holds more messages than this. */
  snapshotThreshold: number
  /** Delete the snapshot and purge the stream at start, unless another replica reads it now. */
  resetStates: boolean
  /** How snapshots are written (both are read): binary (the default) or a JSON array of RouterEvents. */
  snapshotFormat?: SnapshotFormat
  /** The workers discovery knows now, or null when nothing discovers workers (none is dropped then). */
  discovered?: () => ReadonlySet<bigint> | null
  /** Drops a worker the index holds that discovery no longer knows (before a snapshot). */
  removeWorker?: (id: bigint) => Promise<unknown>
  /** The server deletes a consumer nothing has read through for this long, ms; default 1 h, as Dynamo. */
  consumerInactiveMs?: number
  /** Period of the snapshot check, ms (default 1000), with ±10 % drawn once per replica. */
  checkMs?: number
  warn?: (message: string) => void
}

export interface DurableCounters {
  /** Messages handed to the shards, and their bytes. */
  messages: number
  bytes: number
  /** Messages acknowledged after the shards applied them. */
  acked: number
  /** Deliveries of messages already applied (the server redelivered them): acknowledged, not applied again. */
  redelivered: number
  /** Times the consumer was put back after the message last applied (a lost delivery, a consumer gone, a stall). */
  repositioned: number
  /** Times deliveries stopped while the stream held unread messages (the client's pull lost, as after a server crash): the consumer is made again. */
  stalled: number
  /** Failed requests to the server (retried). */
  errors: number
  snapshotsUploaded: number
  snapshotUploadsFailed: number
  snapshotsLoaded: number
  /** Snapshots found but not usable (truncated, corrupt, not kv-router's, or of a stream since recreated): none of them applied. */
  snapshotLoadsFailed: number
  /** Messages purged from the stream by this replica after its snapshots. */
  purged: number
  /** Workers dropped from the index before a snapshot because discovery no longer knew them. */
  workersDropped: number
}

/** What a start replayed: the stream up to its last message at start, once applied. */
export interface CatchUp {
  /** Events loaded from the snapshot: a binary one's block entries (a JSON one holds a stored event for each). */
  snapshotEvents: number
  /** Messages replayed from the stream. */
  events: number
  /** Seconds from the consumer's creation until those were applied; null until then. */
  seconds: number | null
}

/** Object metadata key holding the stream sequence a snapshot stands for. */
export const SNAPSHOT_SEQ_KEY = 'kvr_stream_seq'
/** Object metadata key naming the snapshot's format; a snapshot without it is told by its first bytes. */
export const SNAPSHOT_FORMAT_KEY = 'kvr_snapshot_format'
/** Binary: the index as the shards hold it (src/index/snapshot-format.ts); json: a JSON array of RouterEvents, as kv-router wrote before. */
export const SNAPSHOT_FORMATS = ['binary', 'json'] as const
export type SnapshotFormat = (typeof SNAPSHOT_FORMATS)[number]
/** Acknowledge after this many messages, or after ACK_MS, whichever first. */
const ACK_EVERY = 1000
const ACK_MS = 20
const ACK_WAIT_MS = 30_000
const MAX_ACK_PENDING = 20_000
/** Messages the client buffers per pull. */
const PULL_BATCH = 1000
/** Snapshot reads until two agree, and the pause between them (Dynamo's 10 and 100 ms). */
const STABLE_READS = 10
const STABLE_PAUSE_MS = 100
/** A consumer that delivered or was acknowledged this recently belongs to a live replica. */
const LIVE_MS = 60_000

/** Checks in a row that saw no delivery while the stream held unread messages: the pull is lost. */
const STALL_CHECKS = 3

/** Longest wait of one shutdown step. */
const CLOSE_STEP_MS = 2000

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms).unref())

/** Waits for p at most ms, whatever it settles to. */
function bounded(p: Promise<unknown>, ms: number): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms)
    p.then(
      () => {
        clearTimeout(timer)
        resolve()
      },
      () => {
        clearTimeout(timer)
        resolve()
      },
    )
  })
}

export class DurableKvEvents {
  readonly counters: DurableCounters = {
    messages: 0,
    bytes: 0,
    acked: 0,
    redelivered: 0,
    repositioned: 0,
    stalled: 0,
    errors: 0,
    snapshotsUploaded: 0,
    snapshotUploadsFailed: 0,
    snapshotsLoaded: 0,
    snapshotLoadsFailed: 0,
    purged: 0,
    workersDropped: 0,
  }
  readonly catchUp: CatchUp = { snapshotEvents: 0, events: 0, seconds: null }
  readonly stream: string
  readonly bucket: string
  /** The consumer's name: the instance id in decimal, as Dynamo names it. */
  readonly consumer: string
  /** Messages in the stream at the last check. */
  streamMessages = 0
  /** Messages the consumer had yet to deliver, as of the last delivery. */
  pending = 0
  /**
   * The last snapshot this replica took: its format, its events (a binary one's block entries) and
   * bytes, and the ms its dump (the intake held) and its encoding and upload took.
   */
  lastSnapshot: { seq: number; format: SnapshotFormat; events: number; bytes: number; dumpMs: number; uploadMs: number } | null = null
  private readonly js: JetStreamClient
  private lastSeq = 0
  private ackedSeq = 0
  private lastDseq = 0
  /** The sequence the last snapshot (loaded or uploaded) stands for. */
  private snapshotSeq = 0
  private toAck: JsMsg | null = null
  private unacked = 0
  private acking: Promise<void> | null = null
  private ackTimer: NodeJS.Timeout | null = null
  private checkTimer: NodeJS.Timeout | null = null
  private checking: Promise<void> | null = null
  private messages: ConsumerMessages | null = null
  /** Set while a snapshot is taken: the intake hands nothing over meanwhile. */
  private gate: Promise<void> | null = null
  private backlogged = false
  private repositionNeeded = false
  private running: Promise<void> | null = null
  private closed = false
  /** Deliveries seen at the last check, and checks in a row since without one while messages were waiting. */
  private deliveriesAtCheck = -1
  private stalledChecks = 0
  private catchUpTarget = 0
  private catchUpAt = 0
  private readonly checkMs: number
  private readonly warn: (message: string) => void

  private constructor(
    private readonly o: DurableKvEventsOptions,
    private readonly nats: Nats,
    private readonly jsm: JetStreamManager,
    stream: string,
  ) {
    this.js = o.nc.jetstream()
    this.stream = stream
    this.bucket = radixBucket(o.namespace, o.component)
    this.consumer = o.instanceId.toString()
    this.checkMs = (o.checkMs ?? 1000) * (0.9 + 0.2 * Math.random())
    this.warn = o.warn ?? ((m) => log.warn({ code: Warn.KVR_DURABLE }, m))
  }

  /** Sets the stream up, loads the snapshot (or resets), and starts consuming. */
  static async start(o: DurableKvEventsOptions): Promise<DurableKvEvents> {
    const nats = await import('nats')
    let jsm: JetStreamManager
    let stream: string
    try {
      jsm = await o.nc.jetstreamManager()
      stream = await ensureKvEventsStream(jsm, o.namespace, o.component)
    } catch (err) {
      // a server without JetStream answers its API with "503" (no responders)
      throw new KvrError(
        'KVR_ERR_INVALID_OPTION',
        `--router-durable-kv-events needs JetStream on the NATS server (nats-server --jetstream): ${(err as Error).message}`,
        { cause: err },
      )
    }
    const d = new DurableKvEvents(o, nats, jsm, stream)
    const seq = o.resetStates && (await d.reset()) ? 0 : await d.load()
    d.lastSeq = seq
    d.ackedSeq = seq
    d.snapshotSeq = seq
    await d.position(seq + 1)
    const last = (await jsm.streams.info(stream)).state.last_seq
    d.catchUpTarget = last
    d.catchUpAt = performance.now()
    if (last <= seq) d.catchUp.seconds = 0
    d.running = d.run()
    d.schedule()
    return d
  }

  // ---- start ----

  /** --router-reset-states: true when done; skipped (false) while another replica reads the stream. */
  private async reset(): Promise<boolean> {
    const live = await this.liveConsumers()
    if (live.length > 0) {
      this.warn(`--router-reset-states ignored: replica(s) ${live.join(', ')} read the stream ${this.stream} now; only the first replica resets`)
      return false
    }
    const os = await this.js.views.os(this.bucket)
    await os.destroy()
    await this.jsm.streams.purge(this.stream)
    return true
  }

  /** Other consumers of the stream that delivered, were acknowledged or waited for messages lately. */
  private async liveConsumers(): Promise<string[]> {
    const out: string[] = []
    const now = Date.now()
    for await (const ci of this.jsm.consumers.list(this.stream)) {
      if (ci.name === this.consumer) continue
      const seen = Math.max(when(ci.delivered.last_active), when(ci.ack_floor.last_active), when(ci.created))
      if (ci.num_waiting > 0 || now - seen < LIVE_MS) out.push(ci.name)
    }
    return out
  }

  /**
   * Applies the snapshot and returns the stream sequence it stands for (0 without one). A
   * snapshot older than the stream's first message leaves a hole: a newer one is being uploaded
   * (its replica purges after uploading), so it is read again for a while before the hole is
   * accepted and said.
   */
  private async load(): Promise<number> {
    for (let attempt = 1; ; attempt++) {
      const snap = await this.readSnapshot()
      const state = (await this.jsm.streams.info(this.stream)).state
      let seq = snap?.seq ?? 0
      if (snap !== null && seq > state.last_seq) {
        this.counters.snapshotLoadsFailed++
        this.warn(`the snapshot in ${this.bucket} stands for message ${seq} of a stream that now ends at ${state.last_seq} (recreated since): ignored`)
        seq = 0
      }
      const first = Math.max(1, state.first_seq)
      if (first > seq + 1 && attempt < STABLE_READS) {
        await sleep(200)
        continue
      }
      if (first > seq + 1)
        this.warn(`messages ${seq + 1} to ${first - 1} of ${this.stream} are gone and no snapshot covers them: the index misses what they held`)
      if (snap !== null && seq > 0) {
        const n = await this.applySnapshot(snap.bytes, snap.format)
        if (n >= 0) {
          await this.applied()
          this.counters.snapshotsLoaded++
          this.catchUp.snapshotEvents = n
          return seq
        }
      }
      return 0
    }
  }

  /**
   * The snapshot, read until two reads agree (up to 10, 100 ms apart): an object's nuid changes
   * with every upload, so one read of the data and a later read of the same nuid are the data of
   * one upload. Null when there is none (or it cannot be read).
   */
  private async readSnapshot(): Promise<{ seq: number; format: string | null; bytes: Uint8Array } | null> {
    try {
      const os = await this.js.views.os(this.bucket)
      let info = await os.info(RADIX_STATE_OBJECT)
      for (let i = 1; ; i++) {
        if (info === null || info.deleted) return null
        const seq = Number(info.metadata?.[SNAPSHOT_SEQ_KEY] ?? Number.NaN)
        if (!Number.isSafeInteger(seq) || seq < 0) {
          this.counters.snapshotLoadsFailed++
          this.warn(`the snapshot in ${this.bucket} does not say which message it stands for (not written by kv-router): ignored`)
          return null
        }
        const got = { seq, format: info.metadata?.[SNAPSHOT_FORMAT_KEY] ?? null, bytes: await readObject(this.nats, this.js, info) }
        if (i === STABLE_READS) return got
        await sleep(STABLE_PAUSE_MS)
        const nuid = info.nuid
        info = await os.info(RADIX_STATE_OBJECT)
        if (info !== null && !info.deleted && info.nuid === nuid) return got
      }
    } catch (err) {
      this.counters.snapshotLoadsFailed++
      this.warn(`cannot read the snapshot in ${this.bucket}: ${(err as Error).message}; starting from the stream alone`)
      return null
    }
  }

  /**
   * Hands a snapshot to the shards; returns its events (a binary one's block entries), or -1 when
   * it cannot be used, nothing of it applied (counted and said). Its format is the one its
   * metadata names, else told by its first bytes (kv-router wrote JSON without naming it).
   */
  private async applySnapshot(bytes: Uint8Array, format: string | null): Promise<number> {
    const binary = format === null ? isBinarySnapshot(bytes) : format === 'binary'
    if (format !== null && !(SNAPSHOT_FORMATS as readonly string[]).includes(format)) {
      this.counters.snapshotLoadsFailed++
      this.warn(`the snapshot in ${this.bucket} is in format "${format}", which this router does not read: ignored`)
      return -1
    }
    if (!binary) return this.applyJsonSnapshot(bytes)
    try {
      return (await this.o.pool.loadSnapshot(bytes)).entries
    } catch (err) {
      this.counters.snapshotLoadsFailed++
      this.warn(`the snapshot in ${this.bucket} cannot be loaded (${(err as Error).message}): nothing of it applied, starting from the stream alone`)
      return -1
    }
  }

  /**
   * A JSON snapshot: each worker-rank's events as one tree dump (the worker-rank is cleared, its
   * events applied, and its next event taken whatever its id: a dump's ids are not the
   * worker's). Returns the number of events, or -1 when the snapshot is not an array of events.
   */
  private applyJsonSnapshot(bytes: Uint8Array): number {
    const groups = new Map<string, { workerId: bigint; rank: number; parts: Uint8Array[] }>()
    const decoder = new EventDecoder()
    let n = 0
    try {
      for (const part of splitEvents(bytes)) {
        // decoded whole (a bad event refuses the snapshot), into one reused event
        const ev = decoder.decode(part)
        const key = `${ev.workerLo}:${ev.workerHi}:${ev.dpRank}`
        let g = groups.get(key)
        if (g === undefined) groups.set(key, (g = { workerId: u64FromParts(ev.workerLo, ev.workerHi), rank: ev.dpRank, parts: [] }))
        g.parts.push(part)
        n++
      }
    } catch (err) {
      this.counters.snapshotLoadsFailed++
      this.warn(`the snapshot in ${this.bucket} is not an array of KV events (${(err as Error).message}): ignored`)
      return -1
    }
    for (const g of groups.values()) {
      const ticket = this.o.pool.park(g.workerId, g.rank)
      this.o.pool.deliverRecovery(g.workerId, g.rank, ticket, RecoveryKind.TreeDump, joinArray(g.parts), null)
    }
    return n
  }

  /** Has the consumer deliver from `startSeq` on: made afresh, as a durable consumer keeps its place. */
  private async position(startSeq: number): Promise<void> {
    const { AckPolicy, DeliverPolicy, nanos } = this.nats
    await this.jsm.consumers.delete(this.stream, this.consumer).catch((err: unknown) => {
      if (jsErrorCode(err) !== JS_CONSUMER_NOT_FOUND) throw err
    })
    await this.jsm.consumers.add(this.stream, {
      durable_name: this.consumer,
      ack_policy: AckPolicy.All,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: Math.max(1, startSeq),
      ack_wait: nanos(ACK_WAIT_MS),
      max_ack_pending: MAX_ACK_PENDING,
      inactive_threshold: nanos(this.o.consumerInactiveMs ?? 3_600_000),
    })
    // what was waiting for an ack went with the old consumer: the new one starts past it
    this.lastDseq = 0
    this.toAck = null
    this.unacked = 0
  }

  // ---- intake ----

  private async run(): Promise<void> {
    while (!this.closed) {
      const began = performance.now()
      try {
        if (this.repositionNeeded) {
          this.repositionNeeded = false
          this.counters.repositioned++
          limited.info(
            'durable_repositioned',
            { consumer: this.consumer, from_seq: this.lastSeq + 1 },
            'the durable consumer is made again after the last message applied (a delivery was lost, or the consumer was gone)',
          )
          await this.position(this.lastSeq + 1).catch((err: unknown) => {
            // tried again, whatever state the old consumer was left in
            this.repositionNeeded = true
            throw err
          })
          // a consumer gone for longer than the stream keeps messages (or purged past by others)
          const first = (await this.jsm.streams.info(this.stream)).state.first_seq
          if (first > this.lastSeq + 1)
            this.warn(
              `messages ${this.lastSeq + 1} to ${first - 1} of ${this.stream} were gone when the consumer was made again: the index misses what they held`,
            )
        }
        const consumer = await this.js.consumers.get(this.stream, this.consumer)
        const messages = await consumer.consume({ max_messages: PULL_BATCH })
        this.messages = messages
        // a close while the consumer was being fetched found nothing to stop
        if (this.closed) messages.stop()
        void this.watch(messages)
        for await (const m of messages) {
          if (this.gate !== null) await this.gate
          if (this.closed) break
          if (!this.take(m)) {
            this.repositionNeeded = true
            break
          }
          if (this.backlogged) await this.drained()
        }
        await bounded(messages.close(), CLOSE_STEP_MS)
      } catch (err) {
        if (this.closed) break
        this.failed('consume', err, 'reading the durable stream failed: tried again')
        if (jsErrorCode(err) === JS_CONSUMER_NOT_FOUND) this.repositionNeeded = true
      }
      // a loop that ends at once (server away) waits before the next try
      if (!this.closed && performance.now() - began < 250) await sleep(250)
    }
  }

  /** A consumer deleted or missing ends the iteration, to be made again after the last message applied. */
  private async watch(messages: ConsumerMessages): Promise<void> {
    const { ConsumerEvents } = this.nats
    try {
      for await (const s of await messages.status()) {
        if (s.type === ConsumerEvents.ConsumerDeleted || s.type === ConsumerEvents.ConsumerNotFound) {
          this.repositionNeeded = true
          messages.stop()
          return
        }
      }
    } catch {
      // the iteration ended
    }
  }

  /** One delivery; false when deliveries were lost before it (the consumer is to be put back). */
  private take(m: JsMsg): boolean {
    const info = m.info
    if (this.lastDseq !== 0 && info.deliverySequence > this.lastDseq + 1) return false
    this.lastDseq = info.deliverySequence
    this.pending = info.pending
    if (m.seq <= this.lastSeq) {
      this.counters.redelivered++
      limited.info('durable_redelivered', { seq: m.seq }, 'a stream message applied already was delivered again: acknowledged, not applied twice')
      // applied and acknowledged already; otherwise the ack of a later one covers it
      if (m.seq <= this.ackedSeq) m.ack()
      return true
    }
    this.lastSeq = m.seq
    this.counters.messages++
    this.counters.bytes += m.data.length
    this.backlogged = !this.o.pool.push(m.data)
    this.toAck = m
    this.unacked++
    if (this.unacked >= ACK_EVERY) void this.ackApplied()
    else this.ackTimer ??= setTimeout(() => void this.ackApplied(), ACK_MS)
    return true
  }

  /** Waits while the shards' rings are full: the stream waits for the router, not the reverse. */
  private async drained(): Promise<void> {
    const pool = this.o.pool
    while (pool.pendingMessages > 0 && !this.closed) await once(pool, 'drain')
    this.backlogged = false
  }

  /** Every message handed over so far applied: a barrier over the shards, again while any was forwarded to another shard meanwhile. */
  private async applied(): Promise<void> {
    const pool = this.o.pool
    for (;;) {
      const moved = pool.rerouted
      await pool.flush()
      if (pool.rerouted === moved) return
    }
  }

  /** Acknowledges, once applied, the messages handed over so far (one cumulative ack). */
  private ackApplied(): Promise<void> {
    if (this.ackTimer !== null) {
      clearTimeout(this.ackTimer)
      this.ackTimer = null
    }
    if (this.acking !== null) return this.acking
    const m = this.toAck
    if (m === null) return Promise.resolve()
    const n = this.unacked
    this.toAck = null
    this.unacked = 0
    this.acking = (async () => {
      try {
        await this.applied()
        m.ack()
        this.ackedSeq = Math.max(this.ackedSeq, m.seq)
        this.counters.acked += n
        if (this.catchUp.seconds === null && m.seq >= this.catchUpTarget) {
          this.catchUp.events = this.counters.messages
          this.catchUp.seconds = (performance.now() - this.catchUpAt) / 1000
        }
      } catch (err) {
        // a shard restarted during the barrier: acknowledged with the next batch
        this.failed('ack', err, 'acknowledging applied stream messages failed: they are acknowledged with the next batch')
        this.toAck ??= m
        this.unacked += n
      } finally {
        this.acking = null
        if (this.toAck !== null && !this.closed) this.ackTimer ??= setTimeout(() => void this.ackApplied(), ACK_MS)
      }
    })()
    return this.acking
  }

  /** A failed request to the stream: counted, and one line through the limiter. */
  private failed(what: 'consume' | 'ack' | 'snapshot', err: unknown, msg: string): void {
    this.counters.errors++
    limited.warn('durable_error', { what, error: (err as Error).message }, msg)
  }

  // ---- snapshots ----

  private schedule(): void {
    if (this.closed) return
    this.checkTimer = setTimeout(() => {
      this.checking = this.check().finally(() => {
        this.checking = null
        this.schedule()
      })
    }, this.checkMs)
    this.checkTimer.unref()
  }

  /**
   * Every second or so: a stream holding more than the threshold is snapshotted and cut short,
   * unless this replica's last snapshot is less than a threshold of messages old (the purge is
   * held back by a replica behind, and a snapshot a second would not help).
   */
  async check(): Promise<void> {
    try {
      const state = (await this.jsm.streams.info(this.stream)).state
      this.streamMessages = state.messages
      this.watchStall(state.last_seq)
      if (state.messages > this.o.snapshotThreshold && this.lastSeq - this.snapshotSeq > this.o.snapshotThreshold) await this.snapshot()
    } catch (err) {
      this.failed('snapshot', err, 'checking the durable stream, or snapshotting it, failed: tried again at the next check')
    }
  }

  /**
   * A pull the server lost (it crashed with the pull outstanding, or came back before its
   * JetStream) leaves the client waiting for heartbeats that take tens of seconds to be missed,
   * while the stream holds messages this replica has not read. A few checks in a row without a
   * delivery, with nothing holding the intake back, end the iteration: the consumer is made again
   * after the last message applied, which is exact whatever the server kept.
   */
  private watchStall(lastStreamSeq: number): void {
    const seen = this.counters.messages + this.counters.redelivered
    const waiting = lastStreamSeq > this.lastSeq && this.gate === null && !this.backlogged && this.messages !== null
    if (waiting && seen === this.deliveriesAtCheck) {
      if (++this.stalledChecks >= STALL_CHECKS) {
        this.stalledChecks = 0
        this.counters.stalled++
        limited.info(
          'durable_stalled',
          { consumer: this.consumer, last_applied: this.lastSeq, stream_last: lastStreamSeq },
          'no delivery for a few seconds while the stream held unread messages: the consumer is made again',
        )
        this.repositionNeeded = true
        this.messages?.stop()
      }
    } else this.stalledChecks = 0
    this.deliveriesAtCheck = seen
  }

  /**
   * Drops the workers discovery no longer knows, dumps the index as it stands after message
   * `lastSeq`, uploads it, then purges what every consumer has acknowledged (at most up to the
   * snapshot: the upload goes first, so a failed one purges nothing). In the replica's format
   * unless told another.
   */
  async snapshot(format: SnapshotFormat = this.o.snapshotFormat ?? 'binary'): Promise<void> {
    const pool = this.o.pool
    const known = this.o.discovered?.() ?? null
    if (known !== null && this.o.removeWorker !== undefined) {
      const indexed = new Set((await pool.treeSizes()).map((t) => t.worker_id))
      for (const id of indexed) {
        if (known.has(id)) continue
        await this.o.removeWorker(id)
        this.counters.workersDropped++
        limited.info('durable_worker_dropped', { worker_id: id.toString() }, 'a worker etcd no longer lists was dropped before a snapshot')
      }
    }
    let release = (): void => undefined
    this.gate = new Promise<void>((r) => (release = r))
    const t0 = performance.now()
    let seq: number
    let events: RouterEvent[] = []
    let body: Uint8Array | null = null
    try {
      await this.applied()
      seq = this.lastSeq
      // binary: the shards write it themselves; json: their events, encoded once the intake goes on
      if (format === 'binary') body = await pool.snapshot()
      else events = await pool.dump()
    } finally {
      this.gate = null
      release()
    }
    const t1 = performance.now()
    body ??= encodeSnapshot(events)
    try {
      const os = await this.js.views.os(this.bucket)
      const target = { nats: this.nats, nc: this.o.nc, js: this.js, jsm: this.jsm, os, bucket: this.bucket, name: RADIX_STATE_OBJECT }
      await writeObject(target, body, { [SNAPSHOT_SEQ_KEY]: String(seq), [SNAPSHOT_FORMAT_KEY]: format })
    } catch (err) {
      this.counters.snapshotUploadsFailed++
      limited.warn(
        'durable_snapshot_upload_failed',
        { bucket: this.bucket, error: (err as Error).message },
        'uploading a snapshot of the index failed: nothing is purged until one succeeds',
      )
      throw err
    }
    this.counters.snapshotsUploaded++
    this.snapshotSeq = seq
    const n = format === 'binary' ? snapshotEntries(body) : events.length
    this.lastSnapshot = { seq, format, events: n, bytes: body.length, dumpMs: t1 - t0, uploadMs: performance.now() - t1 }
    let upTo = seq
    for await (const ci of this.jsm.consumers.list(this.stream)) {
      // a consumer that has acknowledged nothing yet is at the message before its first
      const floor = ci.ack_floor.stream_seq > 0 ? ci.ack_floor.stream_seq : Math.max(0, (ci.config.opt_start_seq ?? 1) - 1)
      upTo = Math.min(upTo, floor)
    }
    if (upTo > 0) this.counters.purged += (await this.jsm.streams.purge(this.stream, { seq: upTo + 1 })).purged
  }

  /**
   * Stops reading, acknowledges what was applied and deletes this replica's consumer; each step
   * bounded, as a shutdown must not wait on a server that is gone (the consumer is then removed
   * by the server once inactive).
   */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    if (this.checkTimer !== null) clearTimeout(this.checkTimer)
    this.messages?.stop()
    await bounded(this.running ?? Promise.resolve(), CLOSE_STEP_MS)
    await bounded(this.checking ?? Promise.resolve(), CLOSE_STEP_MS)
    await bounded(this.ackApplied(), CLOSE_STEP_MS)
    await bounded(this.jsm.consumers.delete(this.stream, this.consumer), CLOSE_STEP_MS)
  }
}

/** The index dumped as events: a JSON array of RouterEvents, as Dynamo's snapshot holds them. */
export function encodeSnapshot(events: readonly RouterEvent[]): Uint8Array {
  return Buffer.from(`[${events.map(encodeRouterEvent).join(',')}]`, 'utf8')
}

/** A time the server reports (an RFC 3339 string, though typed as nanoseconds) in ms; 0 when absent. */
function when(v: unknown): number {
  return typeof v === 'string' ? Date.parse(v) || 0 : 0
}

function joinArray(parts: readonly Uint8Array[]): Uint8Array {
  const chunks: Uint8Array[] = [Buffer.from('[')]
  parts.forEach((p, i) => {
    if (i > 0) chunks.push(Buffer.from(','))
    chunks.push(p)
  })
  chunks.push(Buffer.from(']'))
  return Buffer.concat(chunks)
}

/** Block entries of a binary snapshot this replica wrote, from its part heads. */
function snapshotEntries(body: Uint8Array): number {
  return snapshotParts(body).reduce((n, p) => n + p.entries, 0)
}
