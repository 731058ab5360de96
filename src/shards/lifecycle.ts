// The shard threads' lives: start, the watchdog that restarts a stalled thread, the restart of
// a thread that died (its index is gone, so the shard answers as recovering until rebuilt), and
// the ordered shutdown.
import type { EventEmitter } from 'node:events'
import { Worker } from 'node:worker_threads'
import * as Comlink from 'comlink'
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs'
import { limited } from '../runtime/log.js'
import { RingProducer } from '../thread/ring.js'
import {
  C,
  E,
  CONTROL_POSTED,
  CTRL_WORDS,
  DOORBELL,
  E_BASE,
  HEARTBEAT,
  PRODUCER_WAIT,
  QRING_READ,
  QRING_WRITE,
  RING_READ,
  RING_WRITE,
  SHARD_ENTRY,
  SLEEPING,
  STATE,
  type ShardApi,
  type ShardInit,
  ShardState,
} from '../thread/protocol.js'
import type { ShardControl } from './control.js'
import type { PoolOptions } from './options.js'
import type { QueryBoard } from './query-board.js'
import type { Pending, Shard } from './shard.js'
import type { EventWriter } from './writer.js'
import { retireEngineCounters } from './counters.js'

const STARTUP_MS = 30_000

export class ShardThreads {
  closing = false
  closed = false
  private readonly watchdog: NodeJS.Timeout

  constructor(
    private readonly opts: PoolOptions,
    /** Filled here, one per shard; a restart replaces its element. */
    private readonly shards: Shard[],
    private readonly board: QueryBoard,
    private readonly writer: EventWriter,
    /** The pool: 'shardStalled', 'shardRestarted', 'shardGone', 'shardError' are emitted on it. */
    private readonly events: EventEmitter,
    private readonly onMessage: (m: unknown) => void,
  ) {
    for (let i = 0; i < opts.shards; i++) shards.push(this.spawn(i, new SharedArrayBuffer(CTRL_WORDS * 4), new SharedArrayBuffer(opts.ringBytes)))
    this.watchdog = setInterval(() => this.checkHeartbeats(), Math.max(20, Math.min(opts.heartbeatMs, opts.stallMs / 4)))
    this.watchdog.unref()
  }

  private spawn(index: number, ctrlSab: SharedArrayBuffer, ringSab: SharedArrayBuffer): Shard {
    const ctrl = new Int32Array(ctrlSab)
    const init: ShardInit = {
      index,
      shards: this.opts.shards,
      ctrl: ctrlSab,
      ring: ringSab,
      board: this.board.board,
      geometry: this.board.layout.g,
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
      engineRetired: new Float64Array(E.end - E_BASE),
    }
    worker.on('message', this.onMessage)
    worker.on('error', (err) => {
      limited.error('shard_error', { shard: index, err }, 'an indexer shard thread failed')
      this.events.emit('shardError', index, err)
    })
    worker.on('exit', (code) => this.onExit(shard, code))
    return shard
  }

  /** Resolves once every thread runs; rejects after `timeoutMs`. */
  async whenRunning(timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs
    for (;;) {
      if (this.shards.every((s) => Atomics.load(s.ctrl, STATE) === ShardState.Running)) return
      if (performance.now() > deadline) throw new Error(`shard threads did not start within ${timeoutMs} ms`)
      await new Promise((r) => setTimeout(r, 2))
    }
  }

  /** Stops every thread at once, nothing drained (a start that failed). */
  async stop(): Promise<void> {
    this.closing = true
    this.closed = true
    clearInterval(this.watchdog)
    await Promise.all(this.shards.map((sh) => sh.worker.terminate()))
  }

  /** Kills a shard thread, as a crash would. */
  async terminate(sh: Shard): Promise<void> {
    sh.exiting = true
    await sh.worker.terminate()
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
        this.events.emit('shardStalled', sh.index)
        void sh.worker.terminate()
      }
    }
  }

  private onExit(sh: Shard, code: number): void {
    if (this.closed || this.closing) {
      sh.dead = true
      this.events.emit('shardGone', sh.index, code)
      return
    }
    this.restart(sh, code)
  }

  /** Replaces a dead shard thread. Its index is gone, so it answers as recovering until rebuilt. */
  private restart(old: Shard, code: number): void {
    const c = old.ctrl
    this.board.finishOwedQueries(old.index)
    // Messages in the ring that the dead thread never processed are lost with its index.
    const processed = Atomics.load(c, C.processed)
    const queued = old.pending.length - old.pendingHead
    old.lost += Math.max(0, ((old.enqueued - processed) | 0) - queued)
    Atomics.store(c, RING_READ, Atomics.load(c, RING_WRITE))
    Atomics.store(c, QRING_READ, Atomics.load(c, QRING_WRITE))
    for (const i of [DOORBELL, SLEEPING, PRODUCER_WAIT, HEARTBEAT, CONTROL_POSTED]) Atomics.store(c, i, 0)
    for (let i = C.received; i < C.end; i++) Atomics.store(c, i, 0)
    const retired = retireEngineCounters(old)
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
    if (fresh.pendingHead < fresh.pending.length) this.writer.waitForSpace(fresh)
    limited.error(
      'shard_restarted',
      { shard: old.index, exit_code: code, restarts: fresh.restarts, events_lost: fresh.lost },
      'an indexer shard thread exited and was started again, empty: its workers are rebuilt, and its answers are not exact until then',
    )
    this.events.emit('shardRestarted', old.index, code)
  }

  /**
   * Waits until every queued message is written and applied, stops the threads, and returns
   * `report()` as of then (what a shard that died meanwhile never applied counted as lost).
   */
  async close<R>(control: ShardControl, report: () => R): Promise<R> {
    this.closing = true
    const queued = (): boolean => this.shards.some((sh) => !sh.dead && sh.pending.length > sh.pendingHead)
    while (queued()) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          this.events.off('drain', done).off('shardGone', done)
          resolve()
        }
        this.events.on('drain', done).on('shardGone', done)
      })
    }
    // a shard that dies or stalls now is not restarted: its shutdown settles with its exit
    const stallGuard = setInterval(() => this.checkHeartbeats(), Math.max(20, this.opts.stallMs / 4))
    clearInterval(this.watchdog)
    await control.shutdown()
    clearInterval(stallGuard)
    for (const sh of this.shards) {
      if (!sh.dead) continue
      // what a shard that died during close never applied is reported, not silently dropped
      sh.lost += Math.max(0, (sh.enqueued - Atomics.load(sh.ctrl, C.processed)) | 0)
      this.writer.discard(sh)
    }
    const r = report()
    this.closed = true
    for (const sh of this.shards) this.board.finishOwedQueries(sh.index)
    await Promise.all(this.shards.map((sh) => sh.worker.terminate()))
    return r
  }
}
