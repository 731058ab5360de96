// The main thread's side of the indexer shards (docs/architecture.md): it starts N shard threads, routes
// each raw event message to shard hash(worker_id) mod N through that shard's ring, fans overlap
// queries out over the query board and merges the disjoint answers, reads the shards' counters
// from shared memory, and restarts a shard that dies or stalls. Layout and state diagrams are
// in src/thread/protocol.ts, the ring records in src/thread/records.ts, the ring in
// src/thread/ring.ts.
//
// This class puts the parts together: lifecycle.ts (start, watchdog, restart, shutdown),
// writer.ts (the rings and the backlog behind them), query-board.ts (queries and their answers),
// control.ts and control-records.ts (control calls, and the records that travel with events),
// counters.ts. What the shards post on their own arrives here as one ShardMessage union.
//
// Per event message the main thread does a substring search for the worker id, one copy into
// the ring and a few atomic loads: no decoding and no per-block work. A full ring never drops a
// message: it is queued, counted, and written as the shard frees space (push() returns false
// meanwhile, as a stream's write() does, so an intake can pause).
import { EventEmitter } from 'node:events'
import { shardOf, type ShardStats } from '../thread/protocol.js'
import { RECORD_MARKER_AT, RecoveryKind, SHARD_TICKET_BIT, type EngineReset } from '../thread/records.js'
import { isShardMessage } from '../thread/messages.js'
import type { OverlapScore } from '../index/kv-index.js'
import type { ApproxSink } from '../scheduler/approximate.js'
import type { RouterEvent } from '../codec/events.js'
import { u64FromParts, u64Hi, u64Lo } from '../codec/u64.js'
import { KvrError } from '../errors.js'
import { assembleSnapshot, partWorkerIds, readSnapshot } from '../index/snapshot-format.js'
import { WorkerIdScan } from './partition.js'
import { ShardLogWatch } from './log-watch.js'
import { type PoolOptions, type ShardPoolOptions, resolveOptions } from './options.js'
import type { Shard, ShardHealth } from './shard.js'
import { EventWriter } from './writer.js'
import { type OverlapResult, QueryBoard, type QueryOptions } from './query-board.js'
import { ShardControl } from './control.js'
import * as records from './control-records.js'
import { type ShardCounters, readCounters } from './counters.js'
import { ShardThreads } from './lifecycle.js'

export type { ShardPoolOptions } from './options.js'
export type { OverlapResult, QueryOptions } from './query-board.js'
export type { EngineCounters, ShardCounters } from './counters.js'
export type { ShardHealth } from './shard.js'

/** Event ids a worker-rank skipped: [from, to], both inclusive (the next event it sent is to + 1). */
export interface EventGap {
  workerId: bigint
  dpRank: number
  from: bigint
  to: bigint
  /** The hold's ticket, for deliverRecovery. */
  ticket: number
}

/** A shard's note that a worker-rank's engine publishes another block size (warned of once). */
export interface EngineNote {
  workerId: bigint
  dpRank: number
  eventBlockSize: number
  routerBlockSize: number
}

export class ShardPool extends EventEmitter {
  readonly size: number
  private readonly opts: PoolOptions
  private readonly shards: Shard[] = []
  private readonly writer: EventWriter
  private readonly board: QueryBoard
  private readonly control: ShardControl
  private readonly threads: ShardThreads
  private readonly scan = new WorkerIdScan()
  /** The shards' drops in the log (src/shards/log-watch.ts). */
  readonly logWatch: ShardLogWatch
  /** Messages refused before routing: empty, or starting with a NUL byte (malformed events). */
  rejectedAtIntake = 0
  /** Messages a shard sent back because they belong to another shard's worker, pushed there. */
  rerouted = 0
  /** Messages offer() dropped because the backlog held maxPendingBytes. */
  dropped = 0
  /** Binary snapshots loadSnapshot() refused (truncated, corrupt, another version): none of them was applied. */
  snapshotsRefused = 0
  private nextTicket = 0
  private nextSnapshot = 0
  /**
   * Workers whose next event message is announced ('firstEvent', synchronously, before it is
   * queued), keyed by id as a number where it is one exactly (else as a bigint).
   */
  private readonly watched = new Map<number | bigint, bigint>()

  private constructor(options: ShardPoolOptions) {
    super()
    this.opts = resolveOptions(options)
    this.size = this.opts.shards
    this.writer = new EventWriter(this.shards, (shard) => this.emit('drain', shard))
    this.board = new QueryBoard(this.opts, this.shards)
    this.control = new ShardControl(this.shards, (id) => this.owner(id))
    this.threads = new ShardThreads(this.opts, this.shards, this.board, this.writer, this, (m) => this.onShardMessage(m))
    this.logWatch = new ShardLogWatch(this)
  }

  /**
   * Starts the shard threads and resolves once every one of them runs. A thread starts in about
   * 0.1 s; the bound is for a machine under heavy load (and the tests' TypeScript loader, which
   * compiles each thread's modules again), not for a healthy start.
   */
  static async start(options: ShardPoolOptions = {}): Promise<ShardPool> {
    const pool = new ShardPool(options)
    try {
      await pool.threads.whenRunning(30_000)
    } catch (err) {
      // threads left running would keep the process alive
      await pool.threads.stop()
      pool.logWatch.close()
      throw err
    }
    return pool
  }

  /** Shard that owns a worker id. */
  shardOf(workerId: bigint): number {
    return shardOf(u64Lo(workerId), u64Hi(workerId), this.size)
  }

  private owner(workerId: bigint): Shard {
    return this.shards[this.shardOf(workerId)] as Shard
  }

  private open(): void {
    if (this.threads.closing) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the shard pool is closing')
  }

  // ---- events ----

  /**
   * Hands one raw event message (a RouterEvent, raw or enveloped, JSON or MessagePack) to its
   * shard. The bytes are copied before this returns. False means the message is queued behind a
   * full ring: nothing is lost, but the caller should slow down until 'drain'.
   */
  push(msg: Uint8Array, workerId?: bigint): boolean {
    this.open()
    // Empty, or starting with byte 0 (which marks the pool's own records in a ring): not an
    // event anyone may send. Counted and dropped here.
    if (msg.length === 0 || msg[RECORD_MARKER_AT] === 0) {
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
    return this.writer.write(this.shards[k] as Shard, msg)
  }

  /**
   * Where the scheduler's predicted blocks go (approximate mode): each call is a PREDICTED record,
   * a stored or removed event numbered by `eventId`, in its worker's shard ring; it announces nothing.
   */
  predictedSink(eventId: (workerId: bigint, dpRank: number) => bigint): ApproxSink {
    return {
      stored: (workerId, dpRank, localLo, localHi, seqLo, seqHi, n) =>
        this.pushPredicted(workerId, records.predictedStoredRecord(workerId, dpRank, eventId(workerId, dpRank), localLo, localHi, seqLo, seqHi, n)),
      removed: (workerId, dpRank, seqLo, seqHi, n) =>
        this.pushPredicted(workerId, records.predictedRemovedRecord(workerId, dpRank, eventId(workerId, dpRank), seqLo, seqHi, n)),
    }
  }

  private pushPredicted(workerId: bigint, rec: Uint8Array): void {
    this.open()
    this.writer.write(this.owner(workerId), rec)
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
   * push() for a source that cannot be slowed down (core NATS): while the backlog behind full
   * rings holds maxPendingBytes the message is dropped and counted, so a flood costs events, not
   * the router's memory. False when dropped or queued.
   */
  offer(msg: Uint8Array): boolean {
    if (this.writer.queuedBytes >= this.opts.maxPendingBytes) {
      this.dropped++
      return false
    }
    return this.push(msg)
  }

  /** True when the backlog behind full rings holds maxPendingBytes (the HTTP ingest refuses then). */
  get backlogFull(): boolean {
    return this.writer.queuedBytes >= this.opts.maxPendingBytes
  }

  /** Bytes of event messages queued behind full rings, all shards. */
  get pendingBytes(): number {
    return this.writer.queuedBytes
  }

  /** Messages queued behind full rings, all shards. */
  get pendingMessages(): number {
    return this.writer.pendingMessages
  }

  /**
   * What a shard posts besides comlink's replies: an event it decoded for a worker it does not
   * own (to its owner), a gap in a recoverable worker's event ids (src/shards/recovery.ts), an
   * engine's block-size mismatch, a sample for the log.
   */
  private onShardMessage(m: unknown): void {
    if (!isShardMessage(m)) return
    switch (m.kind) {
      case 'logSample':
        this.logWatch.sample({ ...m.fields, what: m.what })
        return
      case 'engineNote': {
        const note: EngineNote = { workerId: u64FromParts(m.lo, m.hi), dpRank: m.rank, eventBlockSize: m.eventBlockSize, routerBlockSize: m.routerBlockSize }
        this.emit('engineNote', note)
        return
      }
      case 'gap': {
        const gap: EventGap = {
          workerId: u64FromParts(m.lo, m.hi),
          dpRank: m.rank,
          from: u64FromParts(m.fromLo, m.fromHi),
          to: u64FromParts(m.toLo, m.toHi) - 1n,
          ticket: m.ticket,
        }
        this.emit('gap', gap)
        return
      }
      case 'misplacedEvent':
        if (this.threads.closing) return
        this.rerouted++
        this.writer.write(this.shards[shardOf(m.lo, m.hi, this.size)] as Shard, m.bytes)
        return
    }
  }

  // ---- records that travel in order with the worker's events ----

  /**
   * Drops every block of every rank of a worker: exactly the events pushed before this call,
   * not those pushed after it (the removal travels in the ring with them). Resolves once applied.
   */
  async removeWorker(workerId: bigint): Promise<void> {
    const sh = this.owner(workerId)
    this.writer.write(sh, records.removeWorkerRecord(workerId))
    await this.control.barrier(sh)
  }

  /**
   * Drops a worker-rank's blocks and forgets its last event id, in order with its events: what
   * the index held of it was not its events (predictions), and its next event is taken whatever
   * its id.
   */
  resetWorkerRank(workerId: bigint, dpRank: number): void {
    this.writer.write(this.owner(workerId), records.resetRankRecord(workerId, dpRank))
  }

  /** Whether a worker's gaps are held for recovery (it answers worker queries) or accepted. */
  setRecoverable(workerId: bigint, on: boolean): void {
    this.writer.write(this.owner(workerId), records.recoverableRecord(workerId, on))
  }

  /**
   * Holds a worker-rank's events from here until deliverRecovery with the ticket returned (before
   * asking for a dump); a hold still open for it is let go first.
   */
  park(workerId: bigint, dpRank: number): number {
    const ticket = this.nextTicket
    this.nextTicket = (this.nextTicket + 1) & ~SHARD_TICKET_BIT
    this.writer.write(this.owner(workerId), records.parkRecord(workerId, dpRank, ticket))
    return ticket
  }

  /**
   * Ends a hold: `events` (a JSON array of RouterEvents, the worker query's answer) are applied,
   * after clearing the worker-rank for a tree dump, then the events held meanwhile; with Failed,
   * the held events alone (the gap stays a hole). A dump's ids are synthetic: `lastId` is the
   * worker-rank's last event id it stands for, when known (else its next event is taken
   * whatever its id).
   */
  deliverRecovery(workerId: bigint, dpRank: number, ticket: number, kind: RecoveryKind, events: Uint8Array | null, lastId: bigint | null = null): void {
    const rec = records.recoveryRecord(workerId, dpRank, ticket, kind, kind === RecoveryKind.Failed ? null : events, lastId)
    this.writer.write(this.owner(workerId), rec)
  }

  /**
   * Hands one engine batch (its MessagePack as the engine sent it) to the worker's shard, which
   * decodes it at `blockSize` for the listener's `dpRank`. False when queued behind a full ring.
   */
  pushEngineBatch(workerId: bigint, dpRank: number, blockSize: number, payload: Uint8Array): boolean {
    this.open()
    const rec = records.engineBatchRecord(workerId, dpRank, blockSize, payload)
    // a batch is the engine's events: the worker's first one is announced as any event is
    if (this.watched.size !== 0) this.noteEvent(u64Lo(workerId), u64Hi(workerId))
    return this.writer.write(this.owner(workerId), rec)
  }

  /** Resets what the worker's shard holds of its engine (EngineReset), in order with its batches. */
  resetEngine(workerId: bigint, dpRank: number, how: EngineReset): void {
    this.open()
    this.writer.write(this.owner(workerId), records.engineResetRecord(workerId, dpRank, how))
  }

  // ---- queries ----

  /** Overlap of a prompt's local block hashes with every worker-rank, merged over the shards. */
  query(lo: Uint32Array, hi: Uint32Array, n: number, options: QueryOptions = {}): Promise<OverlapResult> {
    this.open()
    return this.board.query(lo, hi, n, options)
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

  // ---- control calls ----

  /** Resolves once every message pushed before the call has been applied (or rejected). */
  flush(): Promise<void> {
    return this.control.flush()
  }

  /**
   * Resolves once the shard of `workerId` has taken every message pushed before the call: any gap
   * those messages showed it has been told (its posts travel on the port ahead of the answer).
   */
  async settled(workerId: bigint): Promise<void> {
    await this.control.barrier(this.owner(workerId))
  }

  /** Registers a worker-rank so it reports a tree size of 0 before its first event. */
  ensureWorker(workerId: bigint, dpRank = 0): Promise<boolean> {
    return this.control.ensureWorker(workerId, dpRank)
  }

  /** How many ranks of a worker the index holds, whether it registered or only sent events. */
  async indexedRanks(workerId: bigint): Promise<number> {
    let n = 0
    for (const s of await this.control.shardTreeSizes(workerId)) if (s.worker_id === workerId) n++
    return n
  }

  /** Tree sizes of the worker-ranks held by the shard that owns `workerId`. */
  shardTreeSizes(workerId: bigint): Promise<OverlapScore[]> {
    return this.control.shardTreeSizes(workerId)
  }

  get maxWorkerRanksPerShard(): number {
    return this.opts.maxWorkerRanksPerShard
  }

  /** Blocks held by every registered worker-rank, over all shards (`overlap_blocks` is 0). */
  treeSizes(): Promise<OverlapScore[]> {
    return this.control.treeSizes()
  }

  /**
   * The same as treeSizes(), as the shards hold them now: events still queued to a shard are not
   * waited for (a scrape must not wait out a backlog).
   */
  treeSizesNow(): Promise<OverlapScore[]> {
    return this.control.treeSizesNow()
  }

  /** All shards' indexes as one event list (a dump), event ids renumbered from 0. */
  dump(): Promise<RouterEvent[]> {
    return this.control.dump()
  }

  /**
   * The index as one binary snapshot (src/index/snapshot-format.ts), as of every event pushed
   * before the call: each shard writes its part from its arrays, in parallel, and hands it over
   * without a copy; here they are only put one after the other behind a header.
   */
  async snapshot(): Promise<Uint8Array> {
    this.open()
    return assembleSnapshot(await this.control.snapshotParts())
  }

  /**
   * Loads a binary snapshot into the shards, whole or not at all: its header is read here, its
   * parts go, in shared memory, to the shards that own their workers (whatever the shard count
   * that wrote it), and each shard checks its parts through before any is applied. Once all
   * are sound, a record in each ring applies them: for each worker-rank of the snapshot, what the
   * index held of it is replaced (as a tree dump replaces it), in order with the events: those
   * pushed before that record come before the snapshot. Resolves once applied; rejects, nothing
   * applied and the refusal counted, with KVR_ERR_SNAPSHOT_INVALID.
   */
  async loadSnapshot(bytes: Uint8Array): Promise<{ parts: number; workerRanks: number; entries: number }> {
    this.open()
    let parts: ReturnType<typeof readSnapshot>
    try {
      parts = readSnapshot(bytes)
    } catch (err) {
      this.snapshotsRefused++
      throw err
    }
    const buf = new SharedArrayBuffer(bytes.length)
    new Uint8Array(buf).set(bytes)
    const asked: number[][] = this.shards.map(() => [])
    for (const p of parts) {
      const owners = new Set<number>()
      partWorkerIds(bytes, p, (lo, hi) => owners.add(shardOf(lo, hi, this.size)))
      // a part that names no worker is checked all the same
      if (owners.size === 0) owners.add(0)
      for (const k of owners) asked[k]?.push(p.offset, p.length)
    }
    const ticket = this.nextSnapshot++
    const ks = asked.flatMap((a, k) => (a.length > 0 ? [k] : []))
    const answers = await Promise.allSettled(ks.map((k) => this.control.stageSnapshot(this.shards[k] as Shard, buf, asked[k] as number[], ticket)))
    let refusal: unknown = null
    for (const a of answers) {
      if (a.status === 'rejected') refusal ??= a.reason
      else if (a.value !== null) refusal ??= new KvrError('KVR_ERR_SNAPSHOT_INVALID', a.value)
    }
    // to the shards as they are now: one restarted meanwhile has nothing staged, and drops its record
    for (const k of ks) this.writer.write(this.shards[k] as Shard, records.snapshotRecord(ticket, refusal === null))
    if (refusal !== null) {
      if (refusal instanceof KvrError && refusal.code === 'KVR_ERR_SNAPSHOT_INVALID') this.snapshotsRefused++
      throw refusal
    }
    await Promise.all(ks.map((k) => this.control.barrier(this.shards[k] as Shard)))
    return { parts: parts.length, workerRanks: parts.reduce((n, p) => n + p.workers, 0), entries: parts.reduce((n, p) => n + p.entries, 0) }
  }

  stats(): Promise<ShardStats[]> {
    return this.control.stats()
  }

  // ---- health, counters, failure ----

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
    return this.shards.map(readCounters)
  }

  /** Kills a shard thread, as a crash would; it is restarted and answers as recovering. */
  async terminateShard(index: number): Promise<void> {
    await this.threads.terminate(this.shard(index))
  }

  /** Fault injection: stalls a shard thread for `ms` without killing it. */
  blockShard(index: number, ms: number): void {
    this.control.block(this.shard(index), ms)
  }

  private shard(index: number): Shard {
    const sh = this.shards[index]
    if (sh === undefined) throw new KvrError('KVR_ERR_INVALID_OPTION', `no shard ${index}`)
    return sh
  }

  /**
   * Stops accepting events, waits until every pushed message is written and applied, stops the
   * threads, and reports per shard what was enqueued and what became of it.
   */
  async close(): Promise<ShardCounters[]> {
    if (this.threads.closed) return this.counters()
    this.threads.closing = true
    this.logWatch.close()
    return this.threads.close(this.control, () => this.counters())
  }
}

/** A worker id as a Map key: the number hi·2^32 + lo while that is exact, else the bigint. */
function watchKey(lo: number, hi: number): number | bigint {
  return hi < 0x200000 ? hi * 4294967296 + lo : u64FromParts(lo, hi)
}
