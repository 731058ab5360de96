// The main thread's side of the indexer shards (docs/architecture.md): it starts N shard threads, routes
// each raw event message to shard hash(worker_id) mod N through that shard's ring, fans overlap
// queries out over the query board and merges the disjoint answers, reads the shards' counters
// from shared memory, and restarts a shard that dies or stalls. Layout and state diagrams are
// in src/thread/protocol.ts; the ring in src/thread/ring.ts.
//
// Per event message the main thread does a substring search for the worker id, one copy into
// the ring and a few atomic loads: no decoding and no per-block work. A full ring never drops a
// message: it is queued here, counted, and written as the shard frees space (push() returns
// false meanwhile, as a stream's write() does, so an intake can pause).
import { cpuBudget } from '../runtime/cpu-budget.js'
import { Worker } from 'node:worker_threads'
import { EventEmitter } from 'node:events'
import * as Comlink from 'comlink'
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs'
import { RingProducer, checkRingCapacity } from '../thread/ring.js'
import {
  BoardLayout,
  C_APPLIED,
  C_BLOCKS,
  C_CLEARED,
  C_END,
  C_GAPS,
  C_MALFORMED,
  C_MISPLACED,
  CONTROL_PARK,
  CONTROL_RANK_BYTES,
  CONTROL_RECOVERABLE,
  CONTROL_RECOVERY,
  CONTROL_RECOVERY_BYTES,
  CONTROL_RESET_RANK,
  RecoveryKind,
  SHARD_TICKET_BIT,
  C_NODES,
  C_PROCESSED,
  C_QUERIES,
  C_RECEIVED,
  C_REJECTED,
  C_REMOVED,
  C_STORED,
  C_WORKERS,
  CTRL_WORDS,
  DOORBELL,
  B_ANSWERS,
  B_MAIN_WAITING,
  CONTROL_POSTED,
  HEARTBEAT,
  PRODUCER_WAIT,
  Q_FLAGS,
  Q_N,
  Q_PENDING,
  QF_EARLY_EXIT,
  QRING_BASE,
  QRING_READ,
  QRING_SIZE,
  QRING_WRITE,
  RESULT_WORDS,
  RING_READ,
  RING_WRITE,
  SLEEPING,
  STATE,
  MAX_SHARDS,
  CONTROL_BYTES,
  CONTROL_REMOVE_WORKER,
  ShardState,
  shardOf,
  type ShardInit,
  CONTROL_ENGINE_BATCH,
  CONTROL_ENGINE_RESET,
  ENGINE_BATCH_BYTES,
  ENGINE_MALFORMED_NAMES,
  ENGINE_SKIP_NAMES,
  E_BASE,
  E_BATCHES,
  E_DUPLICATE_STORES,
  E_END,
  E_EVENTS,
  E_MALFORMED,
  E_SKIPPED,
  E_SUPPRESSED_REMOVALS,
  type EngineReset,
} from '../thread/protocol.js'
import { SHARD_ENTRY } from '../thread/protocol.js'
import type { ShardApi, ShardStats } from '../thread/protocol.js'
import { REJECT_REASON_COUNT, REJECT_REASON_NAMES, type OverlapScore } from '../index/kv-index.js'
import type { RouterEvent } from '../codec/events.js'
import { u64FromParts, u64Hi, u64Lo } from '../codec/u64.js'
import { WorkerIdScan } from './partition.js'
import { KvrError } from '../errors.js'
import { limited } from '../runtime/log.js'
import { ShardLogWatch } from './log-watch.js'

export interface ShardPoolOptions {
  /** Number of shard threads, at most 31; default max(1, cores − 1), cores as cpuBudget() counts them. */
  shards?: number
  /** Bytes of each shard's event ring (power of two); default 4 MiB. */
  ringBytes?: number
  /** Queries in flight at once; more wait for a free slot. Default 64. */
  querySlots?: number
  /** Longest query in blocks; longer prompts are matched on their first this-many blocks. */
  maxQueryBlocks?: number
  /** Worker-ranks one shard may hold (also the size of its result area). Default 2048. */
  maxWorkerRanksPerShard?: number
  /** Cap on (block, worker-rank) entries per shard. */
  maxBlocksPerShard?: number
  /** Shard heartbeat period when idle; default 100 ms. */
  heartbeatMs?: number
  /** A shard whose heartbeat has not moved for this long is restarted; default 5000 ms. */
  stallMs?: number
  /** How long an idle shard spins before it sleeps; default 200 µs when a core is spare beyond the event loop and the shards, else 0. */
  shardSpinUs?: number
  /**
   * Longest continuous work a shard does between turns of its event loop when no control call
   * is waiting; default 50 ms. Tests raise it to show control calls do not wait for it.
   */
  shardYieldMaxMs?: number
  /** How long a query spins on the event loop for its answer before it awaits; default 60 µs when a core is spare for every shard beside the event loop, else 0. */
  querySpinUs?: number
  /**
   * Bytes of event messages queued behind full rings, all shards, above which offer() drops
   * (counted) and the HTTP ingest refuses with 503; default 256 MiB. push() always queues.
   */
  maxPendingBytes?: number
}

/** Event ids a worker-rank skipped: [from, to], both inclusive (the next event it sent is to + 1). */
export interface EventGap {
  workerId: bigint
  dpRank: number
  from: bigint
  to: bigint
  /** The hold's ticket, for deliverRecovery. */
  ticket: number
}

/** The merged answer of one overlap query. */
export interface OverlapResult {
  count: number
  workerIdLo: Uint32Array
  workerIdHi: Uint32Array
  dpRank: Uint32Array
  /** Matched leading blocks. */
  overlap: Uint32Array
  /** Blocks the worker-rank holds. */
  treeSize: Uint32Array
  /** Shards whose answer is not exact (restarted and not rebuilt, or died during the query). */
  recoveringShards: number[]
}

export interface QueryOptions {
  /** Wait until every event pushed before this query is applied. */
  readYourWrites?: boolean
  earlyExit?: boolean
}

interface Asked {
  /** Board word of the slot's PENDING bits. */
  at: number
  resolve: () => void
}

export type ShardHealth = 'exact' | 'recovering'

/** What a shard made of engines' own KV-event batches (src/transport/engine-intake.ts). */
export interface EngineCounters {
  batches: number
  /** Events decoded to be applied (before de-duplication). */
  events: number
  /** Events not applied, by ENGINE_SKIP_NAMES reason. */
  skipped: Record<string, number>
  /** Blocks stored again while the worker-rank held them. */
  duplicateStores: number
  /** Block removals held back because the hash was stored more often than removed. */
  suppressedRemovals: number
  /** Batches refused whole (one event did not decode), by ENGINE_MALFORMED_NAMES reason. */
  malformed: Record<string, number>
}

/** A shard's note that a worker-rank's engine publishes another block size (warned of once). */
export interface EngineNote {
  workerId: bigint
  dpRank: number
  eventBlockSize: number
  routerBlockSize: number
}

export interface ShardCounters {
  shard: number
  health: ShardHealth
  restarts: number
  enqueued: number
  received: number
  processed: number
  applied: number
  malformed: number
  rejected: Record<string, number>
  /** Events applied whole, by kind. */
  appliedByType: { stored: number; removed: number; cleared: number }
  /** Rejections by event kind, then reason. */
  rejectedByType: { stored: Record<string, number>; removed: Record<string, number>; cleared: Record<string, number> }
  blocks: number
  nodes: number
  workerRanks: number
  queries: number
  /** Events whose decoded worker id belongs to another shard (an envelope whose publisher_id is not its worker_id). */
  misplaced: number
  /** Gaps in worker-ranks' event ids, recovered or not. */
  gaps: number
  ringFull: number
  /** Times the producer slept until the shard had freed half the ring. */
  ringWaits: number
  pendingMessages: number
  lost: number
  /** Engines' batches, over every thread this shard has had. */
  engine: EngineCounters
}

interface Pending {
  bytes: Uint8Array
  offset: number
}

interface Shard {
  index: number
  worker: Worker
  api: Comlink.Remote<ShardApi>
  ctrl: Int32Array
  ringSab: SharedArrayBuffer
  producer: RingProducer
  /** Messages pushed since this thread started (mod 2^32), the barrier the shard counts toward. */
  enqueued: number
  pending: Pending[]
  pendingHead: number
  waitingForSpace: boolean
  health: ShardHealth
  restarts: number
  ringFull: number
  ringWaits: number
  lost: number
  lastBeat: number
  lastBeatAt: number
  exiting: boolean
  /** Exited while the pool was closing (not restarted). */
  dead: boolean
  /** Settles when this thread has exited; control calls race it so none waits on a dead thread. */
  exited: Promise<number>
  /** The engine counters of the threads before this one (they start at 0 in each). */
  engineRetired: Float64Array
}

interface Slot {
  index: number
  recovering: Set<number> | null
}

const STARTUP_MS = 30_000
const WRITTEN: Pending = { bytes: new Uint8Array(0), offset: 0 }
// Buffer#slice shares memory (and small Buffers share a pool), so a queued message must be
// copied with Uint8Array's slice, whatever the caller passed.
const u8slice = Uint8Array.prototype.slice
function copyBytes(msg: Uint8Array, from: number): Uint8Array {
  return u8slice.call(msg, from)
}

function positive(name: string, v: number | undefined, dflt: number, max = Number.MAX_SAFE_INTEGER): number {
  const x = v ?? dflt
  if (!Number.isInteger(x) || x < 1 || x > max) throw new KvrError('KVR_ERR_INVALID_OPTION', `${name} must be an integer in [1, ${max}], got ${String(v)}`)
  return x
}

export class ShardPool extends EventEmitter {
  readonly size: number
  /** PENDING value of a fresh query: one bit per shard. */
  private readonly allShards: number
  private readonly shards: Shard[] = []
  private readonly board: SharedArrayBuffer
  private readonly b: Int32Array
  private readonly layout: BoardLayout
  private readonly freeSlots: number[] = []
  /** Queries handed to the shards whose answers have not been collected yet. */
  private readonly asked: Asked[] = []
  private askScheduled = false
  private awaitingAnswers = false
  private readonly slotWaiters: (() => void)[] = []
  private readonly slots: Slot[] = []
  private readonly scan = new WorkerIdScan()
  private readonly opts: Required<ShardPoolOptions>
  private readonly watchdog: NodeJS.Timeout
  /** The shards' drops in the log (src/shards/log-watch.ts). */
  readonly logWatch: ShardLogWatch
  private closing = false
  private closed = false
  /** Messages refused before routing: empty, or starting with a NUL byte (malformed events). */
  rejectedAtIntake = 0
  /** Messages a shard sent back because they belong to another shard's worker, pushed there. */
  rerouted = 0
  /** Messages offer() dropped because the backlog held maxPendingBytes. */
  dropped = 0
  /** Bytes of the messages queued behind full rings, all shards. */
  private queuedBytes = 0
  /**
   * Workers whose next event message is announced ('firstEvent', synchronously, before it is
   * queued), keyed by id as a number where it is one exactly (else as a bigint).
   */
  private readonly watched = new Map<number | bigint, bigint>()

  private constructor(options: ShardPoolOptions) {
    super()
    const cores = cpuBudget()
    const shards = positive('shards', options.shards, Math.min(MAX_SHARDS, Math.max(1, cores - 1)), MAX_SHARDS)
    const o: Required<ShardPoolOptions> = {
      shards,
      ringBytes: options.ringBytes ?? 4 * 1024 * 1024,
      querySlots: positive('querySlots', options.querySlots, 64, QRING_SIZE),
      maxQueryBlocks: positive('maxQueryBlocks', options.maxQueryBlocks, 16384, 1 << 20),
      maxWorkerRanksPerShard: positive('maxWorkerRanksPerShard', options.maxWorkerRanksPerShard, 2048, 0xfffe),
      maxBlocksPerShard: positive('maxBlocksPerShard', options.maxBlocksPerShard, 60_000_000, 67_000_000),
      heartbeatMs: positive('heartbeatMs', options.heartbeatMs, 100, 60_000),
      stallMs: positive('stallMs', options.stallMs, 5000, 3_600_000),
      shardYieldMaxMs: positive('shardYieldMaxMs', options.shardYieldMaxMs, 50, 3_600_000),
      // Spinning only pays with a core to spare beyond the event loop and the shards; without
      // one, a spinning shard takes the CPU the event loop needs to feed it.
      shardSpinUs: options.shardSpinUs ?? (cores > shards + 1 ? 200 : 0),
      // The same for the event loop's wait for an answer: with no core to spare for every
      // shard, its spin takes the CPU a shard needs to answer. 60 µs rather than 30: a busy
      // shard often answers between the two, and an answer that misses the spin costs a wake
      // through Atomics.waitAsync (20-60 µs). In alternated runs of `npm run bench:index`, 60 took
      // the saturated lookup p99 from about 53 to 42 µs; /v1/route throughput did not change.
      querySpinUs: options.querySpinUs ?? (cores > shards ? 60 : 0),
      maxPendingBytes: positive('maxPendingBytes', options.maxPendingBytes, 256 * 1024 * 1024, Number.MAX_SAFE_INTEGER),
    }
    try {
      checkRingCapacity(o.ringBytes)
    } catch (err) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `ringBytes: ${(err as Error).message}`)
    }
    this.opts = Object.freeze(o)
    this.size = o.shards
    this.allShards = o.shards === 31 ? 0x7fffffff : (1 << o.shards) - 1
    this.layout = new BoardLayout({ shards: o.shards, slots: o.querySlots, maxBlocks: o.maxQueryBlocks, maxResults: o.maxWorkerRanksPerShard })
    this.board = new SharedArrayBuffer(this.layout.totalWords * 4)
    this.b = new Int32Array(this.board)
    for (let s = 0; s < o.querySlots; s++) {
      this.freeSlots.push(s)
      this.slots.push({ index: s, recovering: null })
    }
    for (let i = 0; i < o.shards; i++) this.shards.push(this.spawn(i, new SharedArrayBuffer(CTRL_WORDS * 4), new SharedArrayBuffer(o.ringBytes)))
    this.watchdog = setInterval(() => this.checkHeartbeats(), Math.max(20, Math.min(o.heartbeatMs, o.stallMs / 4)))
    this.watchdog.unref()
    this.logWatch = new ShardLogWatch(this)
  }

  /**
   * Starts the shard threads and resolves once every one of them runs. A thread starts in about
   * 0.1 s; the bound is for a machine under heavy load (and the tests' TypeScript loader, which
   * compiles each thread's modules again), not for a healthy start.
   */
  static async start(options: ShardPoolOptions = {}): Promise<ShardPool> {
    const pool = new ShardPool(options)
    await pool.whenRunning(30_000)
    return pool
  }

  private spawn(index: number, ctrlSab: SharedArrayBuffer, ringSab: SharedArrayBuffer): Shard {
    const ctrl = new Int32Array(ctrlSab)
    const init: ShardInit = {
      index,
      shards: this.opts.shards,
      ctrl: ctrlSab,
      ring: ringSab,
      board: this.board,
      geometry: this.layout.g,
      maxBlocks: this.opts.maxBlocksPerShard,
      heartbeatMs: this.opts.heartbeatMs,
      spinUs: this.opts.shardSpinUs,
      yieldMaxMs: this.opts.shardYieldMaxMs,
    }
    const worker = new Worker(SHARD_ENTRY, { workerData: init, name: `kv-router shard ${index}` })
    const shard: Shard = {
      index,
      worker,
      api: Comlink.wrap<ShardApi>(nodeEndpoint(worker)),
      ctrl,
      ringSab,
      producer: new RingProducer(ctrl, { write: RING_WRITE, read: RING_READ }, ringSab),
      enqueued: 0,
      pending: [],
      pendingHead: 0,
      waitingForSpace: false,
      health: 'exact',
      restarts: 0,
      ringFull: 0,
      ringWaits: 0,
      lost: 0,
      lastBeat: -1,
      lastBeatAt: performance.now(),
      exiting: false,
      dead: false,
      exited: new Promise<number>((resolve) => worker.once('exit', resolve)),
      engineRetired: new Float64Array(E_END - E_BASE),
    }
    worker.on('message', (m: unknown) => this.onShardMessage(m))
    worker.on('error', (err) => {
      limited.error('shard_error', { shard: index, err }, 'an indexer shard thread failed')
      this.emit('shardError', index, err)
    })
    worker.on('exit', (code) => this.onExit(shard, code))
    return shard
  }

  private async whenRunning(timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs
    for (;;) {
      if (this.shards.every((s) => Atomics.load(s.ctrl, STATE) === ShardState.Running)) return
      if (performance.now() > deadline) throw new Error(`shard threads did not start within ${timeoutMs} ms`)
      await new Promise((r) => setTimeout(r, 2))
    }
  }

  // ------------------------------------------------------------------------------------------
  // events

  /** Shard that owns a worker id. */
  shardOf(workerId: bigint): number {
    return shardOf(u64Lo(workerId), u64Hi(workerId), this.size)
  }

  /**
   * Hands one raw event message (a RouterEvent, raw or enveloped, JSON or MessagePack) to its
   * shard. The bytes are copied before this returns. False means the message is queued behind a
   * full ring: nothing is lost, but the caller should slow down until 'drain'.
   */
  push(msg: Uint8Array, workerId?: bigint): boolean {
    if (this.closing) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the shard pool is closing')
    // Empty, or starting with byte 0 (which marks the pool's own control records in a ring):
    // not an event anyone may send. Counted and dropped here.
    if (msg.length === 0 || msg[0] === 0) {
      this.rejectedAtIntake++
      return true
    }
    let k = 0
    if (workerId !== undefined) {
      const lo = u64Lo(workerId)
      const hi = u64Hi(workerId)
      k = shardOf(lo, hi, this.size)
      if (this.watched.size !== 0) this.noteEvent(lo, hi)
    } else if (this.scan.scan(msg)) {
      k = shardOf(this.scan.lo, this.scan.hi, this.size)
      if (this.watched.size !== 0) this.noteEvent(this.scan.lo, this.scan.hi)
    }
    return this.pushTo(this.shards[k] as Shard, msg)
  }

  /** push() of an event the router made up itself (a prediction): it announces nothing. */
  pushPredicted(msg: Uint8Array, workerId: bigint): boolean {
    if (this.closing) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the shard pool is closing')
    return this.pushTo(this.shards[this.shardOf(workerId)] as Shard, msg)
  }

  /** Announces the worker's next event message once ('firstEvent' with its id), before it is queued. */
  watchFirstEvent(workerId: bigint): void {
    this.watched.set(watchKey(u64Lo(workerId), u64Hi(workerId)), workerId)
  }

  unwatch(workerId: bigint): void {
    this.watched.delete(watchKey(u64Lo(workerId), u64Hi(workerId)))
  }

  private noteEvent(lo: number, hi: number): void {
    const key = watchKey(lo, hi)
    const id = this.watched.get(key)
    if (id === undefined) return
    this.watched.delete(key)
    // listeners run now, so what they queue for the worker goes before this event
    this.emit('firstEvent', id)
  }

  /**
   * Drops a worker-rank's blocks and forgets its last event id, in order with its events: what
   * the index held of it was not its events (predictions), and its next event is taken whatever
   * its id.
   */
  resetWorkerRank(workerId: bigint, dpRank: number): void {
    this.pushTo(this.shards[this.shardOf(workerId)] as Shard, this.rankRecord(CONTROL_RESET_RANK, workerId, dpRank, 0))
  }

  /**
   * What a shard posts besides comlink's replies: an event it decoded for a worker it does not
   * own (to its owner), or a gap in a recoverable worker's event ids ('gap', see
   * src/shards/recovery.ts).
   */
  private onShardMessage(m: unknown): void {
    if (m === null || typeof m !== 'object') return
    const e = m as {
      misplacedEvent?: unknown
      lo?: unknown
      hi?: unknown
      gap?: { lo: number; hi: number; rank: number; fromLo: number; fromHi: number; toLo: number; toHi: number; ticket: number }
      engineNote?: { lo: number; hi: number; rank: number; eventBlockSize: number; routerBlockSize: number }
      logSample?: Record<string, unknown>
    }
    if (e.logSample !== undefined) return this.logWatch.sample(e.logSample)
    if (e.engineNote !== undefined) {
      const n = e.engineNote
      const note: EngineNote = { workerId: u64FromParts(n.lo, n.hi), dpRank: n.rank, eventBlockSize: n.eventBlockSize, routerBlockSize: n.routerBlockSize }
      this.emit('engineNote', note)
      return
    }
    if (e.gap !== undefined) {
      const g = e.gap
      const gap: EventGap = {
        workerId: u64FromParts(g.lo, g.hi),
        dpRank: g.rank,
        from: u64FromParts(g.fromLo, g.fromHi),
        to: u64FromParts(g.toLo, g.toHi) - 1n,
        ticket: g.ticket,
      }
      this.emit('gap', gap)
      return
    }
    if (!(e.misplacedEvent instanceof Uint8Array) || typeof e.lo !== 'number' || typeof e.hi !== 'number') return
    if (this.closing) return
    this.rerouted++
    this.pushTo(this.shards[shardOf(e.lo, e.hi, this.size)] as Shard, e.misplacedEvent)
  }

  // ---- gap recovery: records that travel in order with the worker's events ----

  private rankRecord(op: number, workerId: bigint, dpRank: number, flag: number, header = CONTROL_RANK_BYTES, payload: Uint8Array | null = null): Uint8Array {
    const rec = new Uint8Array(header + (payload?.length ?? 0))
    const v = new DataView(rec.buffer)
    rec[1] = op
    rec[2] = flag
    v.setUint32(4, u64Lo(workerId), true)
    v.setUint32(8, u64Hi(workerId), true)
    v.setUint32(12, dpRank, true)
    if (payload !== null) rec.set(payload, header)
    return rec
  }

  /** Whether a worker's gaps are held for recovery (it answers worker queries) or accepted. */
  setRecoverable(workerId: bigint, on: boolean): void {
    this.pushTo(this.shards[this.shardOf(workerId)] as Shard, this.rankRecord(CONTROL_RECOVERABLE, workerId, 0, on ? 1 : 0))
  }

  /**
   * Holds a worker-rank's events from here until deliverRecovery with the ticket returned (before
   * asking for a dump); a hold still open for it is let go first.
   */
  park(workerId: bigint, dpRank: number): number {
    const ticket = this.nextTicket
    this.nextTicket = (this.nextTicket + 1) & ~SHARD_TICKET_BIT
    const rec = this.rankRecord(CONTROL_PARK, workerId, dpRank, 0, CONTROL_RECOVERY_BYTES)
    new DataView(rec.buffer).setUint32(16, ticket, true)
    this.pushTo(this.shards[this.shardOf(workerId)] as Shard, rec)
    return ticket
  }

  private nextTicket = 0

  /**
   * Ends a hold: `events` (a JSON array of RouterEvents, the worker query's answer) are applied,
   * after clearing the worker-rank for a tree dump, then the events held meanwhile; with Failed,
   * the held events alone (the gap stays a hole). A dump's ids are synthetic: `lastId` is the
   * worker-rank's last event id it stands for, when known (else its next event is taken
   * whatever its id).
   */
  deliverRecovery(workerId: bigint, dpRank: number, ticket: number, kind: RecoveryKind, events: Uint8Array | null, lastId: bigint | null = null): void {
    const rec = this.rankRecord(CONTROL_RECOVERY, workerId, dpRank, kind, CONTROL_RECOVERY_BYTES, kind === RecoveryKind.Failed ? null : events)
    const v = new DataView(rec.buffer)
    v.setUint32(16, ticket, true)
    if (lastId !== null) {
      rec[3] = 1
      v.setBigUint64(24, lastId, true)
    }
    this.pushTo(this.shards[this.shardOf(workerId)] as Shard, rec)
  }

  // ---- engines' own KV events: batches decoded in the shard, in order with the worker's other records ----

  /**
   * Hands one engine batch (its MessagePack as the engine sent it) to the worker's shard, which
   * decodes it at `blockSize` for the listener's `dpRank`. False when queued behind a full ring.
   */
  pushEngineBatch(workerId: bigint, dpRank: number, blockSize: number, payload: Uint8Array): boolean {
    if (this.closing) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the shard pool is closing')
    const rec = new Uint8Array(ENGINE_BATCH_BYTES + payload.length)
    const v = new DataView(rec.buffer)
    rec[1] = CONTROL_ENGINE_BATCH
    v.setUint32(4, u64Lo(workerId), true)
    v.setUint32(8, u64Hi(workerId), true)
    v.setUint32(12, dpRank, true)
    v.setUint32(16, blockSize, true)
    rec.set(payload, ENGINE_BATCH_BYTES)
    // a batch is the engine's events: the worker's first one is announced as any event is
    if (this.watched.size !== 0) this.noteEvent(u64Lo(workerId), u64Hi(workerId))
    return this.pushTo(this.shards[this.shardOf(workerId)] as Shard, rec)
  }

  /** Resets what the worker's shard holds of its engine (EngineReset), in order with its batches. */
  resetEngine(workerId: bigint, dpRank: number, how: EngineReset): void {
    if (this.closing) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the shard pool is closing')
    this.pushTo(this.shards[this.shardOf(workerId)] as Shard, this.rankRecord(CONTROL_ENGINE_RESET, workerId, dpRank, how))
  }

  /**
   * push() for a source that cannot be slowed down (core NATS): while the backlog behind full
   * rings holds maxPendingBytes the message is dropped and counted, so a flood costs events, not
   * the router's memory. False when dropped or queued.
   */
  offer(msg: Uint8Array): boolean {
    if (this.queuedBytes >= this.opts.maxPendingBytes) {
      this.dropped++
      return false
    }
    return this.push(msg)
  }

  /** True when the backlog behind full rings holds maxPendingBytes (the HTTP ingest refuses then). */
  get backlogFull(): boolean {
    return this.queuedBytes >= this.opts.maxPendingBytes
  }

  /** Bytes of event messages queued behind full rings, all shards. */
  get pendingBytes(): number {
    return this.queuedBytes
  }

  private pushTo(sh: Shard, msg: Uint8Array): boolean {
    sh.enqueued = (sh.enqueued + 1) | 0
    if (sh.pendingHead === sh.pending.length) {
      const off = sh.producer.write(msg, 0)
      if (off > 0) this.ring(sh)
      if (off === msg.length) return true
      // the whole message, so a restart can write it again from its start
      sh.pending.push({ bytes: copyBytes(msg, 0), offset: off })
    } else {
      sh.pending.push({ bytes: copyBytes(msg, 0), offset: 0 })
    }
    this.queuedBytes += msg.length
    sh.ringFull++
    this.waitForSpace(sh)
    return false
  }

  private ring(sh: Shard): void {
    if (Atomics.load(sh.ctrl, SLEEPING) === 1) {
      Atomics.add(sh.ctrl, DOORBELL, 1)
      Atomics.notify(sh.ctrl, DOORBELL)
    }
  }

  /** Writes queued messages as the shard frees ring space; emits 'drain' when none are left. */
  private waitForSpace(sh: Shard): void {
    if (sh.waitingForSpace) return
    sh.waitingForSpace = true
    const loop = async (): Promise<void> => {
      while (sh.pendingHead < sh.pending.length) {
        // a restarted shard's replacement takes the queue over with a loop of its own
        if (this.shards[sh.index] !== sh) return
        const p = sh.pending[sh.pendingHead] as Pending
        p.offset = sh.producer.write(p.bytes, p.offset)
        this.ring(sh)
        if (p.offset === p.bytes.length) {
          this.queuedBytes -= p.bytes.length
          sh.pending[sh.pendingHead++] = WRITTEN
          if (sh.pendingHead > 1024 && sh.pendingHead * 2 > sh.pending.length) {
            sh.pending.splice(0, sh.pendingHead)
            sh.pendingHead = 0
          }
          continue
        }
        // wait until half the ring is free (the shard wakes us then, see workers/shard/main.ts), so
        // that one wake refills half a ring; the check after announcing the wait catches a
        // shard that got there in between
        Atomics.store(sh.ctrl, PRODUCER_WAIT, 1)
        const read = Atomics.load(sh.ctrl, RING_READ)
        if (sh.producer.used > sh.producer.capacity / 2) {
          const r = Atomics.waitAsync(sh.ctrl, RING_READ, read, 50)
          if (r.async) {
            sh.ringWaits++
            await r.value
          }
          if (this.shards[sh.index] !== sh) return
        }
        Atomics.store(sh.ctrl, PRODUCER_WAIT, 0)
      }
      sh.pending.length = 0
      sh.pendingHead = 0
      sh.waitingForSpace = false
      this.emit('drain', sh.index)
    }
    void loop()
  }

  /** Messages queued behind full rings, all shards. */
  get pendingMessages(): number {
    let n = 0
    for (const sh of this.shards) n += sh.pending.length - sh.pendingHead
    return n
  }

  /** Runs a control call on a shard; rejects, instead of waiting forever, if the thread exits. */
  private control<T>(sh: Shard, call: (api: Comlink.Remote<ShardApi>) => Promise<T>): Promise<T> {
    const reply = call(sh.api)
    // the call is posted (comlink posts synchronously); a shard asleep in its futex wait must
    // wake to take it in
    Atomics.add(sh.ctrl, CONTROL_POSTED, 1)
    Atomics.add(sh.ctrl, DOORBELL, 1)
    Atomics.notify(sh.ctrl, DOORBELL)
    return Promise.race([
      reply,
      sh.exited.then((code) => {
        throw new KvrError('KVR_ERR_SHARD_RESTARTED', `shard ${sh.index} exited (code ${code}) during the operation`)
      }),
    ])
  }

  /** Resolves once every message pushed before the call has been applied (or rejected). */
  async flush(): Promise<void> {
    await Promise.all(this.shards.map((sh) => this.control(sh, (api) => api.barrier(sh.enqueued))))
  }

  // ------------------------------------------------------------------------------------------
  // queries

  /** Overlap of a prompt's local block hashes with every worker-rank, merged over the shards. */
  async query(lo: Uint32Array, hi: Uint32Array, n: number, options: QueryOptions = {}): Promise<OverlapResult> {
    if (this.closing) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the shard pool is closing')
    const blocks = Math.min(n, this.opts.maxQueryBlocks)
    const slot = this.freeSlots.pop() ?? (await this.waitForSlot())
    const L = this.layout
    const b = this.b
    const base = L.slot(slot)
    try {
      new Uint32Array(this.board, L.lo(slot) * 4, blocks).set(lo.subarray(0, blocks))
      new Uint32Array(this.board, L.hi(slot) * 4, blocks).set(hi.subarray(0, blocks))
      b[base + Q_N] = blocks
      b[base + Q_FLAGS] = options.earlyExit === true ? QF_EARLY_EXIT : 0
      const rec = this.slots[slot] as Slot
      rec.recovering = null
      for (const sh of this.shards) {
        b[L.barrier(slot, sh.index)] = options.readYourWrites === true ? sh.enqueued : -1
        if (sh.health === 'recovering') (rec.recovering ??= new Set()).add(sh.index)
      }
      Atomics.store(b, base + Q_PENDING, this.allShards)
      for (const sh of this.shards) {
        const qw = Atomics.load(sh.ctrl, QRING_WRITE) >>> 0
        sh.ctrl[QRING_BASE + (qw & (QRING_SIZE - 1))] = slot
        Atomics.store(sh.ctrl, QRING_WRITE, (qw + 1) | 0)
      }
      await new Promise<void>((resolve) => {
        this.asked.push({ at: base + Q_PENDING, resolve })
        if (!this.askScheduled) {
          this.askScheduled = true
          setImmediate(this.ask)
        }
      })
      return this.merge(slot, rec)
    } finally {
      this.releaseSlot(slot)
    }
  }

  // Queries asked during one event-loop turn share a doorbell and a wake-up: under load a turn
  // carries many requests, and a futex round trip per query costs more than the query itself.
  private readonly ask = (): void => {
    this.askScheduled = false
    for (const sh of this.shards) this.ring(sh)
    // an answer usually takes a few µs; a wake-up through the event loop tens
    const until = performance.now() + this.opts.querySpinUs / 1000
    do {
      if (this.settle() === 0) return
    } while (performance.now() < until)
    if (!this.awaitingAnswers) void this.awaitAnswers()
  }

  /** Resolves every answered query; returns how many are still owed. */
  private settle(): number {
    const b = this.b
    const q = this.asked
    let j = 0
    for (let i = 0; i < q.length; i++) {
      const a = q[i] as Asked
      if (Atomics.load(b, a.at) === 0) a.resolve()
      else q[j++] = a
    }
    q.length = j
    return j
  }

  private async awaitAnswers(): Promise<void> {
    const b = this.b
    this.awaitingAnswers = true
    Atomics.store(b, B_MAIN_WAITING, 1)
    try {
      for (;;) {
        // read the count before checking, so an answer landing in between changes it and the
        // wait returns at once instead of sleeping past it
        const seen = Atomics.load(b, B_ANSWERS)
        if (this.settle() === 0) return
        const r = Atomics.waitAsync(b, B_ANSWERS, seen, 1000)
        if (r.async) await r.value
      }
    } finally {
      Atomics.store(b, B_MAIN_WAITING, 0)
      this.awaitingAnswers = false
    }
  }

  private merge(slot: number, rec: Slot): OverlapResult {
    const L = this.layout
    const b = this.b
    let total = 0
    for (let k = 0; k < this.size; k++) total += b[L.results(slot, k)] as number
    const out: OverlapResult = {
      count: total,
      workerIdLo: new Uint32Array(total),
      workerIdHi: new Uint32Array(total),
      dpRank: new Uint32Array(total),
      overlap: new Uint32Array(total),
      treeSize: new Uint32Array(total),
      recoveringShards: rec.recovering === null ? [] : [...rec.recovering].sort((x, y) => x - y),
    }
    let j = 0
    for (let k = 0; k < this.size; k++) {
      let o = L.results(slot, k)
      const m = b[o++] as number
      for (let i = 0; i < m; i++, o += RESULT_WORDS, j++) {
        out.workerIdLo[j] = b[o] as number
        out.workerIdHi[j] = b[o + 1] as number
        out.dpRank[j] = b[o + 2] as number
        out.overlap[j] = b[o + 3] as number
        out.treeSize[j] = b[o + 4] as number
      }
    }
    return out
  }

  private waitForSlot(): Promise<number> {
    return new Promise((resolve) => {
      this.slotWaiters.push(() => resolve(this.freeSlots.pop() as number))
    })
  }

  private releaseSlot(slot: number): void {
    this.freeSlots.push(slot)
    const next = this.slotWaiters.shift()
    if (next !== undefined) next()
  }

  /** The same query from u64 local hashes, as objects: for tests, tools and the HTTP edge. */
  async overlapScores(local: BigUint64Array | readonly bigint[], options: QueryOptions = {}): Promise<OverlapScore[] & { recoveringShards: number[] }> {
    const n = local.length
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    for (let i = 0; i < n; i++) {
      lo[i] = u64Lo(local[i] as bigint)
      hi[i] = u64Hi(local[i] as bigint)
    }
    const r = await this.query(lo, hi, n, options)
    const out: OverlapScore[] = []
    for (let i = 0; i < r.count; i++) {
      out.push({
        worker_id: u64FromParts(r.workerIdLo[i] as number, r.workerIdHi[i] as number),
        dp_rank: r.dpRank[i] as number,
        overlap_blocks: r.overlap[i] as number,
        tree_size: r.treeSize[i] as number,
      })
    }
    return Object.assign(out, { recoveringShards: r.recoveringShards })
  }

  // ------------------------------------------------------------------------------------------
  // control

  /** Registers a worker-rank so it reports a tree size of 0 before its first event. */
  async ensureWorker(workerId: bigint, dpRank = 0): Promise<boolean> {
    const sh = this.shards[this.shardOf(workerId)] as Shard
    return this.control(sh, (api) => api.ensureWorker(u64Lo(workerId), u64Hi(workerId), dpRank, sh.enqueued))
  }

  /**
   * Drops every block of every rank of a worker: exactly the events pushed before this call,
   * not those pushed after it (the removal travels in the ring with them). Resolves once applied.
   */
  async removeWorker(workerId: bigint): Promise<void> {
    const rec = new Uint8Array(CONTROL_BYTES)
    const v = new DataView(rec.buffer)
    rec[1] = CONTROL_REMOVE_WORKER
    v.setUint32(4, u64Lo(workerId), true)
    v.setUint32(8, u64Hi(workerId), true)
    const sh = this.shards[this.shardOf(workerId)] as Shard
    this.pushTo(sh, rec)
    await this.control(sh, (api) => api.barrier(sh.enqueued))
  }

  /** How many ranks of a worker the index holds, whether it registered or only sent events. */
  async indexedRanks(workerId: bigint): Promise<number> {
    const sh = this.shards[this.shardOf(workerId)] as Shard
    const sizes = await this.control(sh, (api) => api.treeSizes(sh.enqueued))
    let n = 0
    for (const s of sizes) if (s.worker_id === workerId) n++
    return n
  }

  /** Tree sizes of the worker-ranks held by the shard that owns `workerId`. */
  async shardTreeSizes(workerId: bigint): Promise<OverlapScore[]> {
    const sh = this.shards[this.shardOf(workerId)] as Shard
    return this.control(sh, (api) => api.treeSizes(sh.enqueued))
  }

  get maxWorkerRanksPerShard(): number {
    return this.opts.maxWorkerRanksPerShard
  }

  /** Blocks held by every registered worker-rank, over all shards (`overlap_blocks` is 0). */
  async treeSizes(): Promise<OverlapScore[]> {
    const parts = await Promise.all(this.shards.map((sh) => this.control(sh, (api) => api.treeSizes(sh.enqueued))))
    return parts.flat()
  }

  /**
   * The same as treeSizes(), as the shards hold them now: events still queued to a shard are not
   * waited for (a scrape must not wait out a backlog).
   */
  async treeSizesNow(): Promise<OverlapScore[]> {
    const parts = await Promise.all(this.shards.map((sh) => this.control(sh, (api) => api.treeSizes(Atomics.load(sh.ctrl, C_PROCESSED)))))
    return parts.flat()
  }

  /** All shards' indexes as one event list (a dump), event ids renumbered from 0. */
  async dump(): Promise<RouterEvent[]> {
    const parts = await Promise.all(this.shards.map((sh) => this.control(sh, (api) => api.dump(sh.enqueued))))
    const all = parts.flat()
    all.forEach((ev, i) => (ev.event.event_id = BigInt(i)))
    return all
  }

  /** Declares a restarted shard rebuilt: its answers are exact again. */
  markRebuilt(shard: number): void {
    const sh = this.shards[shard]
    if (sh !== undefined) sh.health = 'exact'
  }

  health(): ShardHealth[] {
    return this.shards.map((s) => s.health)
  }

  /** Counters of every shard, read from shared memory without messages. */
  counters(): ShardCounters[] {
    return this.shards.map((sh) => {
      const c = sh.ctrl
      const rejected: Record<string, number> = {}
      const rejectedByType: ShardCounters['rejectedByType'] = { stored: {}, removed: {}, cleared: {} }
      const kinds = [rejectedByType.stored, rejectedByType.removed, rejectedByType.cleared]
      for (let k = 0; k < 3; k++) {
        for (let i = 0; i < REJECT_REASON_COUNT; i++) {
          const name = REJECT_REASON_NAMES[i] as string
          const v = Atomics.load(c, C_REJECTED + k * REJECT_REASON_COUNT + i) >>> 0
          ;(kinds[k] as Record<string, number>)[name] = v
          rejected[name] = (rejected[name] ?? 0) + v
        }
      }
      // processed is published last by the shard: read it first, the rest are at least as new
      const processed = Atomics.load(c, C_PROCESSED) >>> 0
      return {
        shard: sh.index,
        health: sh.health,
        restarts: sh.restarts,
        enqueued: sh.enqueued >>> 0,
        received: Atomics.load(c, C_RECEIVED) >>> 0,
        processed,
        applied: Atomics.load(c, C_APPLIED) >>> 0,
        malformed: Atomics.load(c, C_MALFORMED) >>> 0,
        rejected,
        appliedByType: { stored: Atomics.load(c, C_STORED) >>> 0, removed: Atomics.load(c, C_REMOVED) >>> 0, cleared: Atomics.load(c, C_CLEARED) >>> 0 },
        rejectedByType,
        blocks: Atomics.load(c, C_BLOCKS) >>> 0,
        nodes: Atomics.load(c, C_NODES) >>> 0,
        workerRanks: Atomics.load(c, C_WORKERS) >>> 0,
        queries: Atomics.load(c, C_QUERIES) >>> 0,
        misplaced: Atomics.load(c, C_MISPLACED) >>> 0,
        gaps: Atomics.load(c, C_GAPS) >>> 0,
        ringFull: sh.ringFull,
        ringWaits: sh.ringWaits,
        pendingMessages: sh.pending.length - sh.pendingHead,
        lost: sh.lost,
        engine: this.engineCounters(sh),
      }
    })
  }

  private engineCounters(sh: Shard): EngineCounters {
    const word = (i: number): number => (sh.engineRetired[i - E_BASE] as number) + (Atomics.load(sh.ctrl, i) >>> 0)
    const skipped: Record<string, number> = {}
    ENGINE_SKIP_NAMES.forEach((name, k) => (skipped[name] = word(E_SKIPPED + k)))
    const malformed: Record<string, number> = {}
    ENGINE_MALFORMED_NAMES.forEach((name, k) => (malformed[name] = word(E_MALFORMED + k)))
    return {
      batches: word(E_BATCHES),
      events: word(E_EVENTS),
      skipped,
      duplicateStores: word(E_DUPLICATE_STORES),
      suppressedRemovals: word(E_SUPPRESSED_REMOVALS),
      malformed,
    }
  }

  async stats(): Promise<ShardStats[]> {
    return Promise.all(this.shards.map((sh) => this.control(sh, (api) => api.stats())))
  }

  // ------------------------------------------------------------------------------------------
  // failure

  /** Kills a shard thread, as a crash would; it is restarted and answers as recovering. */
  async terminateShard(index: number): Promise<void> {
    const sh = this.shards[index]
    if (sh === undefined) throw new KvrError('KVR_ERR_INVALID_OPTION', `no shard ${index}`)
    sh.exiting = true
    await sh.worker.terminate()
  }

  /** Fault injection: stalls a shard thread for `ms` without killing it. */
  blockShard(index: number, ms: number): void {
    const sh = this.shards[index]
    if (sh === undefined) throw new KvrError('KVR_ERR_INVALID_OPTION', `no shard ${index}`)
    void this.control(sh, (api) => api.block(ms)).catch(() => undefined)
  }

  private checkHeartbeats(): void {
    const now = performance.now()
    for (const sh of this.shards) {
      const beat = Atomics.load(sh.ctrl, HEARTBEAT)
      // a thread still loading its code has no heartbeat yet; give it time before judging
      if (Atomics.load(sh.ctrl, STATE) === ShardState.Starting && now - sh.lastBeatAt < STARTUP_MS) continue
      if (beat !== sh.lastBeat) {
        sh.lastBeat = beat
        sh.lastBeatAt = now
      } else if (!sh.exiting && now - sh.lastBeatAt > this.opts.stallMs) {
        sh.exiting = true
        limited.error(
          'shard_stalled',
          { shard: sh.index, stalled_ms: Math.round(now - sh.lastBeatAt) },
          "an indexer shard's heartbeat stopped: its thread is restarted",
        )
        this.emit('shardStalled', sh.index)
        void sh.worker.terminate()
      }
    }
  }

  private onExit(sh: Shard, code: number): void {
    if (this.closed || this.closing) {
      sh.dead = true
      this.emit('shardGone', sh.index, code)
      return
    }
    this.restart(sh, code)
  }

  /**
   * Completes, on behalf of a shard that is gone, every query still waiting for it: its part
   * of the answer is empty and the answer says the shard is not exact.
   */
  private finishOwedQueries(shard: number): void {
    const L = this.layout
    const bit = 1 << shard
    for (const rec of this.slots) {
      if (this.freeSlots.includes(rec.index)) continue
      const at = L.slot(rec.index) + Q_PENDING
      const before = Atomics.and(this.b, at, ~bit)
      if ((before & bit) === 0) continue
      this.b[L.results(rec.index, shard)] = 0
      ;(rec.recovering ??= new Set()).add(shard)
      if ((before & ~bit) === 0) Atomics.add(this.b, B_ANSWERS, 1)
    }
    Atomics.notify(this.b, B_ANSWERS)
    this.settle()
  }

  /** Replaces a dead shard thread. Its index is gone, so it answers as recovering until rebuilt. */
  private restart(old: Shard, code: number): void {
    const c = old.ctrl
    this.finishOwedQueries(old.index)
    // Messages in the ring that the dead thread never processed are lost with its index.
    const processed = Atomics.load(c, C_PROCESSED)
    const queued = old.pending.length - old.pendingHead
    old.lost += Math.max(0, ((old.enqueued - processed) | 0) - queued)
    Atomics.store(c, RING_READ, Atomics.load(c, RING_WRITE))
    Atomics.store(c, QRING_READ, Atomics.load(c, QRING_WRITE))
    for (const i of [DOORBELL, SLEEPING, PRODUCER_WAIT, HEARTBEAT, CONTROL_POSTED]) Atomics.store(c, i, 0)
    for (let i = C_RECEIVED; i < C_END; i++) Atomics.store(c, i, 0)
    const retired = old.engineRetired
    for (let i = E_BASE; i < E_END; i++) {
      retired[i - E_BASE] = (retired[i - E_BASE] as number) + (Atomics.load(c, i) >>> 0)
      Atomics.store(c, i, 0)
    }
    Atomics.store(c, STATE, ShardState.Starting)
    for (let i = old.pendingHead; i < old.pending.length; i++) (old.pending[i] as Pending).offset = 0
    const fresh = this.spawn(old.index, c.buffer as SharedArrayBuffer, old.ringSab)
    fresh.enqueued = queued
    fresh.pending = old.pending
    fresh.pendingHead = old.pendingHead
    fresh.health = 'recovering'
    fresh.restarts = old.restarts + 1
    fresh.ringFull = old.ringFull
    fresh.ringWaits = old.ringWaits
    fresh.lost = old.lost
    fresh.engineRetired = retired
    this.shards[old.index] = fresh
    if (fresh.pendingHead < fresh.pending.length) this.waitForSpace(fresh)
    limited.error(
      'shard_restarted',
      { shard: old.index, exit_code: code, restarts: fresh.restarts, events_lost: fresh.lost },
      'an indexer shard thread exited and was started again, empty: its workers are rebuilt, and its answers are not exact until then',
    )
    this.emit('shardRestarted', old.index, code)
  }

  // ------------------------------------------------------------------------------------------
  // shutdown

  /**
   * Stops accepting events, waits until every pushed message is written and applied, stops the
   * threads, and reports per shard what was enqueued and what became of it.
   */
  async close(): Promise<ShardCounters[]> {
    if (this.closed) return this.counters()
    this.closing = true
    this.logWatch.close()
    const queued = (): boolean => this.shards.some((sh) => !sh.dead && sh.pending.length > sh.pendingHead)
    while (queued()) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          this.off('drain', done).off('shardGone', done)
          resolve()
        }
        this.on('drain', done).on('shardGone', done)
      })
    }
    // a shard that dies or stalls now is not restarted: its shutdown settles with its exit
    const stallGuard = setInterval(() => this.checkHeartbeats(), Math.max(20, this.opts.stallMs / 4))
    clearInterval(this.watchdog)
    await Promise.all(this.shards.map((sh) => this.control(sh, (api) => api.shutdown(sh.enqueued)).catch(() => undefined)))
    clearInterval(stallGuard)
    for (const sh of this.shards) {
      if (!sh.dead) continue
      // what a shard that died during close never applied is reported, not silently dropped
      sh.lost += Math.max(0, (sh.enqueued - Atomics.load(sh.ctrl, C_PROCESSED)) | 0)
      for (let i = sh.pendingHead; i < sh.pending.length; i++) this.queuedBytes -= (sh.pending[i] as Pending).bytes.length
      sh.pending.length = 0
      sh.pendingHead = 0
    }
    const report = this.counters()
    this.closed = true
    for (const sh of this.shards) this.finishOwedQueries(sh.index)
    await Promise.all(this.shards.map((sh) => sh.worker.terminate()))
    return report
  }
}

/** A worker id as a Map key: the number hi·2^32 + lo while that is exact, else the bigint. */
function watchKey(lo: number, hi: number): number | bigint {
  return hi < 0x200000 ? hi * 4294967296 + lo : u64FromParts(lo, hi)
}
