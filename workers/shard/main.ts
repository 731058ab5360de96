// Indexer shard thread. It owns one KvIndex for the worker-ranks hashed to it, applies their
// events in ring order, answers overlap queries from the query board, and publishes its counters
// into shared memory. The hot loop never posts a message: the main thread reads everything it
// needs from the SharedArrayBuffers. Control operations (dump, remove worker, shutdown) arrive
// over comlink and are ordered after the events enqueued before them by a message-count barrier.
//
// This module is the entry: the run loop, its sleep on the doorbell, the comlink API, start and
// stop. The rest of the thread: state.ts (what the modules share), apply.ts (event messages into
// the index, the published counters), engine.ts (engines' own MessagePack batches), parking.ts
// (events held while a worker-rank is recovered, control records), queries.ts (the query board),
// post.ts (the typed messages to the main thread).
//
// Scheduling: work first (queries, then a batch of events, then queries again, so a query never
// waits behind more than one batch); when idle, spin briefly on the rings (a futex wake costs
// tens of µs here), then sleep on the doorbell with a timeout so the heartbeat keeps moving.
// The loop gives the event loop a turn as soon as a control call is posted (the pool counts
// them in shared memory), and at least every YIELD_MAX_MS of continuous work.
import { parentPort } from 'node:worker_threads'
import * as Comlink from 'comlink'
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs'
import type { OverlapScore } from '../../src/index/kv-index.js'
import type { RouterEvent } from '../../src/codec/events.js'
import { CONTROL_POSTED, DOORBELL, HEARTBEAT, PRODUCER_WAIT, RING_READ, RING_WRITE, SLEEPING, STATE, ShardState } from '../../src/thread/protocol.js'
import type { ShardApi, ShardStats } from '../../src/thread/protocol.js'
import { ENGINE_BATCH, ENGINE_RESET, PREDICTED, SNAPSHOT, recordOp } from '../../src/thread/records.js'
import { Live, applyEvent, decodeOwned, publishCounters } from './apply.js'
import { onEngineBatch, onEngineReset } from './engine.js'
import { held, onControl, stopHolding, unparkAll } from './parking.js'
import { interrupt, queriesWaiting, serveQueries } from './queries.js'
import { onSnapshotRecord, stage } from './snapshot.js'
import { counters, ctrl, decoder, index, init, ring } from './state.js'

const ringHalf = init.ring.byteLength / 2
const BATCH = 64
/**
 * Longest stretch of continuous work between two turns of the event loop (default 50 ms). A
 * turn is taken at once when a control call has been posted or a barrier released (its reply is
 * posted from a continuation), so this bound is only a safety net. A turn costs tens of µs, and
 * a lookup that arrives during one waits it out: taken every 4 ms, the turns would be about 1%
 * of a saturated shard's time, the share that sets a lookup p99.
 */
const YIELD_MAX_MS = init.yieldMaxMs

index.interrupt = interrupt
decoder.interrupt = interrupt

let stopping = false
const waiters: { seq: number; resolve: () => void }[] = []

function onMessage(bytes: Uint8Array): void {
  // a query never waits behind a whole batch of small events: two atomic loads per message
  if (queriesWaiting()) serveQueries()
  const op = recordOp(bytes)
  if (op !== 0 && op !== PREDICTED.op) {
    if (op === ENGINE_BATCH.op) onEngineBatch(bytes)
    else if (op === ENGINE_RESET.op) onEngineReset(bytes)
    else if (op === SNAPSHOT.op) onSnapshotRecord(bytes)
    else onControl(op, bytes)
    return
  }
  // an event message, or the router's predicted blocks: both are events of a worker-rank
  counters.received++
  Atomics.add(ctrl, HEARTBEAT, 1)
  const ev = decodeOwned(bytes, Live)
  // not applied now when its worker-rank is held for a recovery
  if (ev !== null && !held(ev, bytes)) applyEvent(ev, Live)
  if (queriesWaiting()) serveQueries()
}

/** CONTROL_POSTED as of the last turn of the event loop: calls posted before it were taken in. */
let controlSeen = 0
function controlWaiting(): boolean {
  return Atomics.load(ctrl, CONTROL_POSTED) !== controlSeen
}

/** Resolves the barriers now passed; true when there was one (its reply is then due). */
function releaseWaiters(): boolean {
  let any = false
  for (let i = waiters.length - 1; i >= 0; i--) {
    const wt = waiters[i] as { seq: number; resolve: () => void }
    if (((counters.processed - wt.seq) | 0) >= 0) {
      waiters.splice(i, 1)
      wt.resolve()
      any = true
    }
  }
  return any
}

/** Resolves once every message up to `seq` (count since start, mod 2^32) has been processed. */
function barrier(seq: number): Promise<void> {
  if (((counters.processed - seq) | 0) >= 0) return Promise.resolve()
  return new Promise((resolve) => waiters.push({ seq, resolve }))
}

const yieldToLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve))

async function run(): Promise<void> {
  Atomics.store(ctrl, STATE, ShardState.Running)
  let lastYield = performance.now()
  let replies = false
  while (!stopping) {
    Atomics.add(ctrl, HEARTBEAT, 1)
    let work = serveQueries()
    const readBefore = Atomics.load(ctrl, RING_READ)
    const n = ring.read(BATCH, onMessage)
    // A waiting producer is woken once half the ring is free, not at every freed byte: each wake
    // is a futex call on this thread and a turn of the main thread's loop, and at saturation
    // the ring fills again at once, so waking per batch cost thousands of them per second. Half
    // a ring always holds the next fragment (fragments are at most a quarter).
    const read = Atomics.load(ctrl, RING_READ)
    if (read !== readBefore && Atomics.load(ctrl, PRODUCER_WAIT) === 1 && (Atomics.load(ctrl, RING_WRITE) - read) >>> 0 <= ringHalf)
      Atomics.notify(ctrl, RING_READ)
    if (n > 0) {
      work += n
      publishCounters()
      work += serveQueries()
      if (waiters.length > 0 && releaseWaiters()) replies = true
    }
    if (work > 0) {
      // A whole turn, not a microtask: comlink posts a reply from a continuation queued behind
      // this loop's own, so a released barrier is answered only once the loop lets go.
      if (replies || controlWaiting() || performance.now() - lastYield > YIELD_MAX_MS) {
        replies = false
        controlSeen = Atomics.load(ctrl, CONTROL_POSTED)
        await yieldToLoop()
        lastYield = performance.now()
      }
      continue
    }
    // idle: spin a little, then sleep until the doorbell rings or the heartbeat is due
    const until = performance.now() + init.spinUs / 1000
    let woke = false
    while (performance.now() < until) {
      if (!ring.empty() || queriesWaiting()) {
        woke = true
        break
      }
    }
    if (woke) continue
    // Control calls arrive through the event loop, which the synchronous wait below keeps shut:
    // let them in first. The pool rings the doorbell after posting one, so none waits out a sleep.
    controlSeen = Atomics.load(ctrl, CONTROL_POSTED)
    await yieldToLoop()
    lastYield = performance.now()
    Atomics.store(ctrl, SLEEPING, 1)
    const bell = Atomics.load(ctrl, DOORBELL)
    // Atomics.waitAsync wakes through this thread's event loop, a longer path that every query
    // to a sleeping shard would pay; a futex wait is woken directly, and a query to an idle shard
    // is answered several times sooner at p99.
    if (ring.empty() && !queriesWaiting() && !stopping && !controlWaiting()) Atomics.wait(ctrl, DOORBELL, bell, init.heartbeatMs)
    Atomics.store(ctrl, SLEEPING, 0)
  }
  publishCounters()
  Atomics.store(ctrl, STATE, ShardState.Stopped)
}

const api: ShardApi = {
  async barrier(seq: number): Promise<number> {
    await barrier(seq)
    return counters.processed
  },
  async ensureWorker(idLo: number, idHi: number, rank: number, seq: number): Promise<boolean> {
    await barrier(seq)
    const ok = index.ensureWorker(idLo, idHi, rank) !== -1
    publishCounters()
    return ok
  },
  async treeSizes(seq: number): Promise<OverlapScore[]> {
    await barrier(seq)
    return index.treeSizes()
  },
  async dump(seq: number): Promise<RouterEvent[]> {
    await barrier(seq)
    return index.dump()
  },
  async snapshot(seq: number): Promise<Uint8Array> {
    await barrier(seq)
    const part = index.writeSnapshotPart()
    return Comlink.transfer(part, [part.buffer])
  },
  async stageSnapshot(buf: SharedArrayBuffer, parts: readonly number[], ticket: number): Promise<string | null> {
    return stage(buf, parts, ticket)
  },
  async stats(): Promise<ShardStats> {
    const { received, applied, malformed, processed } = counters
    return { received, applied, malformed, processed, blocks: index.liveEntries, nodes: index.liveNodes, workerRanks: index.liveWorkers, bytes: index.bytes }
  },
  async block(ms: number): Promise<void> {
    const until = Date.now() + ms
    while (Date.now() < until) {
      // busy on purpose
    }
  },
  async shutdown(seq: number): Promise<ShardStats> {
    stopHolding()
    await barrier(seq)
    unparkAll()
    stopping = true
    Atomics.add(ctrl, DOORBELL, 1)
    Atomics.notify(ctrl, DOORBELL)
    Atomics.store(ctrl, STATE, ShardState.Stopping)
    return api.stats()
  },
}

Comlink.expose(api, nodeEndpoint(parentPort as NonNullable<typeof parentPort>))
// On a normal stop the main thread terminates this thread after shutdown() answered.
void run().catch((err: unknown) => {
  // an internal bug: let the main thread see the exit and restart this shard (in a worker thread,
  // process.exit ends the thread, not the process)
  console.error('shard loop failed', err)
  process.exit(1)
})
