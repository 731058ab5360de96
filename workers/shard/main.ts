// Indexer shard thread. It owns one KvIndex for the worker-ranks hashed to it, applies their
// events in ring order, answers overlap queries from the query board, and publishes its counters
// into shared memory. The hot loop never posts a message: the main thread reads everything it
// needs from the SharedArrayBuffers. Control operations (dump, remove worker, shutdown) arrive
// over comlink and are ordered after the events enqueued before them by a message-count barrier.
//
// Scheduling: work first (queries, then a batch of events, then queries again, so a query never
// waits behind more than one batch); when idle, spin briefly on the rings (a futex wake costs
// tens of µs here), then sleep on the doorbell with a timeout so the heartbeat keeps moving.
// The loop gives the event loop a turn as soon as a control call is posted (the pool counts
// them in shared memory), and at least every YIELD_MAX_MS of continuous work.
import { parentPort, workerData } from 'node:worker_threads'
import * as Comlink from 'comlink'
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs'
import { KvIndex, REJECT_REASON_COUNT, type OverlapScore } from '../../src/index/kv-index.js'
import { EventDecoder } from '../../src/codec/event-decoder.js'
import { KvrError } from '../../src/errors.js'
import type { RouterEvent } from '../../src/codec/events.js'
import { RingConsumer } from '../../src/thread/ring.js'
import {
  BoardLayout,
  C_APPLIED,
  C_BLOCKS,
  C_CLEARED,
  C_GAPS,
  C_MALFORMED,
  C_MISPLACED,
  C_NODES,
  C_PROCESSED,
  C_QUERIES,
  C_RECEIVED,
  C_REJECTED,
  C_REMOVED,
  B_ANSWERS,
  B_MAIN_WAITING,
  CONTROL_POSTED,
  C_STORED,
  C_WORKERS,
  DOORBELL,
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
  CONTROL_BYTES,
  CONTROL_PARK,
  CONTROL_RANK_BYTES,
  CONTROL_RECOVERABLE,
  CONTROL_RECOVERY,
  CONTROL_RECOVERY_BYTES,
  CONTROL_REMOVE_WORKER,
  RING_WRITE,
  RecoveryKind,
  SHARD_TICKET_BIT,
  SLEEPING,
  STATE,
  ShardState,
  shardOf,
  type ShardInit,
} from '../../src/thread/protocol.js'
import type { ShardApi, ShardStats } from '../../src/thread/protocol.js'
import { splitEvents } from '../../src/codec/event-array.js'

const init = workerData as ShardInit
const me = init.index
const ctrl = new Int32Array(init.ctrl)
const board = new Int32Array(init.board)
const layout = new BoardLayout(init.geometry)
const index = new KvIndex({ maxBlocks: init.maxBlocks, maxWorkerRanks: init.geometry.maxResults })
const decoder = new EventDecoder()
const ring = new RingConsumer(ctrl, { write: RING_WRITE, read: RING_READ }, init.ring)
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

function interrupt(): void {
  // long work still beats: the watchdog must not take a busy shard for a stalled one
  Atomics.add(ctrl, HEARTBEAT, 1)
  if (queriesWaiting()) serveQueries()
}
index.interrupt = interrupt
decoder.interrupt = interrupt

const loViews: Uint32Array[] = []
const hiViews: Uint32Array[] = []
for (let s = 0; s < init.geometry.slots; s++) {
  loViews.push(new Uint32Array(init.board, layout.lo(s) * 4, init.geometry.maxBlocks))
  hiViews.push(new Uint32Array(init.board, layout.hi(s) * 4, init.geometry.maxBlocks))
}

let received = 0
let applied = 0
let malformed = 0
let misplaced = 0
let gaps = 0
let processed = 0
let queries = 0
/** QRING_READ as this thread last stored it: only this thread moves it while it runs. */
let qRead = Atomics.load(ctrl, QRING_READ) >>> 0
let stopping = false
const waiters: { seq: number; resolve: () => void }[] = []

// ---- gap recovery ----
// A worker-rank whose next event id skips ahead has lost events (a NATS outage, a router that
// was down). For a worker that answers worker queries (the main thread says which), its events
// are held from the gap on ("parked") while the main thread fetches the missing range or a dump,
// then the recovery is applied and the held events after it, in order: what Dynamo does
// synchronously per worker, without holding up the other workers of this shard. A held message
// counts as processed when it is held: barriers (registrations, GET /v1/workers, flush) do not
// wait for a worker's recovery, which can take seconds. Other workers' gaps are counted and the
// event applied, a hole accepted, as Dynamo does.
//
// Every hold has a ticket, and only the recovery record with that ticket ends it: a late answer
// to a hold that something else ended (a removal, the size bound, a shutdown) cannot end a newer
// one with stale events. Tickets of holds this thread opens at a gap have the
// high bit set; the main thread numbers the holds it opens (PARK records) below it.

/** Worker ids ("lo:hi") whose gaps are recovered. */
const recoverable = new Set<string>()
interface Park {
  ticket: number
  msgs: Uint8Array[]
  bytes: number
}
/** Held events per worker-rank ("lo:hi:rank"), in arrival order. */
const parks = new Map<string, Park>()
/** Held bytes per worker-rank past which the hold is given up (applied, the hole accepted). */
const PARK_MAX_BYTES = 64 * 1024 * 1024
let nextTicket = 0
/** Set by shutdown: no hold is opened after it, as nobody would end it. */
let shuttingDown = false
const lastId = { lo: 0, hi: 0 }
const rankKey = (lo: number, hi: number, rank: number): string => `${lo}:${hi}:${rank}`

/** True when event `ev` skips ids after the worker-rank's last one (lastId then holds the last). */
function isGap(lo: number, hi: number, rank: number, idLo: number, idHi: number): boolean {
  if (!index.lastEventId(lo, hi, rank, lastId)) return false
  // after 2^64 - 1 nothing can follow without wrapping: no gap
  if (lastId.lo === 0xffffffff && lastId.hi === 0xffffffff) return false
  // next = last + 1, as u32 halves
  const nLo = (lastId.lo + 1) >>> 0
  const nHi = nLo === 0 ? (lastId.hi + 1) >>> 0 : lastId.hi
  return idHi > nHi || (idHi === nHi && idLo > nLo)
}

/** Applies a worker-rank's held events in order and lets its events through again. */
function unpark(key: string): void {
  const p = parks.get(key)
  if (p === undefined) return
  parks.delete(key)
  for (const m of p.msgs) applyMessage(m, Released)
}

/** Lets every hold go (shutdown, and nobody left to end them). */
function unparkAll(): void {
  for (const key of [...parks.keys()]) unpark(key)
}

/** A control record in the ring (first byte 0, which no JSON message has): ordered with events. */
function onControl(bytes: Uint8Array): void {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const op = bytes[1]
  if (bytes.length >= CONTROL_BYTES && op === CONTROL_REMOVE_WORKER) {
    const lo = v.getUint32(4, true)
    const hi = v.getUint32(8, true)
    // its held events came before the removal: applied, then removed with everything else
    if (parks.size !== 0) for (const key of [...parks.keys()]) if (key.startsWith(`${lo}:${hi}:`)) unpark(key)
    recoverable.delete(`${lo}:${hi}`)
    index.removeWorker(lo, hi)
  } else if (bytes.length >= CONTROL_RANK_BYTES) {
    const lo = v.getUint32(4, true)
    const hi = v.getUint32(8, true)
    const rank = v.getUint32(12, true)
    const key = rankKey(lo, hi, rank)
    if (op === CONTROL_RECOVERABLE) {
      if (bytes[2] === 1 && !shuttingDown) recoverable.add(`${lo}:${hi}`)
      else recoverable.delete(`${lo}:${hi}`)
    } else if (op === CONTROL_PARK && bytes.length >= CONTROL_RECOVERY_BYTES) {
      // a newer hold replaces an older one, whose events go first
      unpark(key)
      if (!shuttingDown) parks.set(key, { ticket: v.getUint32(16, true), msgs: [], bytes: 0 })
    } else if (op === CONTROL_RECOVERY && bytes.length >= CONTROL_RECOVERY_BYTES) {
      const p = parks.get(key)
      // a recovery for a hold that ended meanwhile comes too late to apply in order: dropped
      if (p !== undefined && p.ticket === v.getUint32(16, true)) recover(lo, hi, rank, key, bytes, v)
    }
  }
  processed++
}

/** Applies a recovery record to its hold, then the held events, and ends the hold. */
function recover(lo: number, hi: number, rank: number, key: string, bytes: Uint8Array, v: DataView): void {
  const kind = bytes[2]
  // an Events answer holds the missing ids: ids at or below the last applied are already here
  const known = kind === RecoveryKind.Events && index.lastEventId(lo, hi, rank, lastId)
  const floorLo = known ? lastId.lo : 0
  const floorHi = known ? lastId.hi : 0
  if (kind === RecoveryKind.TreeDump) index.resetWorkerRank(lo, hi, rank)
  if (kind === RecoveryKind.Events || kind === RecoveryKind.TreeDump) {
    let parts: Uint8Array[] = []
    try {
      parts = splitEvents(bytes.subarray(CONTROL_RECOVERY_BYTES))
    } catch (err) {
      // the main thread checked the answer's shape; a worker's bad events are dropped here
      if (!(err instanceof KvrError)) throw err
    }
    const floor = known ? 1 : 0
    for (let i = 0; i < parts.length; i++) {
      // a dump of a million events must not hold lookups up, nor look like a stalled thread
      if ((i & 255) === 255) interrupt()
      recoverOne(parts[i] as Uint8Array, lo, hi, rank, floor, floorLo, floorHi)
    }
  }
  // a dump's ids are synthetic: the worker's own go on from the id the main thread names (the
  // newest it reported before the dump), or, unnamed, from whatever comes next
  if (kind === RecoveryKind.TreeDump) {
    if (bytes[3] === 1) index.setEventId(lo, hi, rank, v.getUint32(24, true), v.getUint32(28, true))
    else index.forgetEventId(lo, hi, rank)
  }
  unpark(key)
}

/**
 * One event of a recovery: applied only when it is the recovered worker-rank's (a worker's answer
 * naming another would plant blocks there and move its event ids) and, for a
 * range, newer than what is applied.
 */
function recoverOne(bytes: Uint8Array, lo: number, hi: number, rank: number, floor: number, floorLo: number, floorHi: number): void {
  let ev: ReturnType<typeof decoder.decode>
  try {
    ev = decoder.decode(bytes)
  } catch (err) {
    if (!(err instanceof KvrError)) throw err
    return
  }
  if (ev.workerLo !== lo || ev.workerHi !== hi || ev.dpRank !== rank) return
  if (floor === 1 && (ev.eventIdHi < floorHi || (ev.eventIdHi === floorHi && ev.eventIdLo <= floorLo))) return
  if (index.apply(ev) === 0) applied++
}

function onMessage(bytes: Uint8Array): void {
  // a query never waits behind a whole batch of small events: two atomic loads per message
  if (queriesWaiting()) serveQueries()
  if (bytes[0] === 0) {
    onControl(bytes)
    return
  }
  received++
  Atomics.add(ctrl, HEARTBEAT, 1)
  applyMessage(bytes, Live)
  if (queriesWaiting()) serveQueries()
}

/** How applyMessage takes a message: as it arrives, or let go after a hold. */
const Live = 0
const Released = 1
type Mode = typeof Live | typeof Released

/**
 * Decodes and applies one event message. A released one was held, and counted then: it is
 * applied now whatever its id (a recovery that could not fill the gap leaves a hole, accepted).
 */
function applyMessage(bytes: Uint8Array, mode: Mode): void {
  let ev: ReturnType<typeof decoder.decode>
  try {
    ev = decoder.decode(bytes)
  } catch (err) {
    // bad input is counted and dropped; anything else is a bug that must restart this shard
    if (!(err instanceof KvrError)) throw err
    if (mode === Live) {
      malformed++
      processed++
    }
    return
  }
  if (shardOf(ev.workerLo, ev.workerHi, init.shards) !== me) {
    // The main thread's scan read another worker id than the decoder did (an unknown key holding
    // a worker_id before the real one, an escaped key, an envelope whose publisher is not the
    // event's worker). Applied here, the blocks would sit where that worker's cleared and
    // removals never reach: sent back to go to the owning shard.
    misplaced++
    if (mode === Live) processed++
    const copy = bytes.slice()
    parentPort?.postMessage({ misplacedEvent: copy, lo: ev.workerLo, hi: ev.workerHi }, [copy.buffer])
    return
  }
  if (mode === Live) {
    if (parks.size !== 0) {
      const key = rankKey(ev.workerLo, ev.workerHi, ev.dpRank)
      const held = parks.get(key)
      if (held !== undefined) {
        // behind a recovery in flight; past the hold's bound, everything held goes now, this
        // one last (the decoder's event object is reused, so this one is applied from its bytes)
        processed++
        held.msgs.push(bytes.slice())
        held.bytes += bytes.length
        if (held.bytes > PARK_MAX_BYTES) unpark(key)
        return
      }
    }
    if (isGap(ev.workerLo, ev.workerHi, ev.dpRank, ev.eventIdLo, ev.eventIdHi)) {
      gaps++
      if (!shuttingDown && recoverable.size !== 0 && recoverable.has(`${ev.workerLo}:${ev.workerHi}`)) {
        const fromLo = (lastId.lo + 1) >>> 0
        const fromHi = fromLo === 0 ? (lastId.hi + 1) >>> 0 : lastId.hi
        const ticket = (SHARD_TICKET_BIT | (nextTicket++ & 0x7fffffff)) >>> 0
        processed++
        parks.set(rankKey(ev.workerLo, ev.workerHi, ev.dpRank), { ticket, msgs: [bytes.slice()], bytes: bytes.length })
        parentPort?.postMessage({ gap: { lo: ev.workerLo, hi: ev.workerHi, rank: ev.dpRank, fromLo, fromHi, toLo: ev.eventIdLo, toHi: ev.eventIdHi, ticket } })
        return
      }
    }
  }
  if (index.apply(ev) === 0) applied++
  // after the apply, not before: a long apply serves queries from inside (interrupt), and one
  // whose barrier this message passes must see all of it
  if (mode === Live) processed++
}

function publishCounters(): void {
  Atomics.store(ctrl, C_RECEIVED, received | 0)
  Atomics.store(ctrl, C_APPLIED, applied | 0)
  Atomics.store(ctrl, C_MALFORMED, malformed | 0)
  Atomics.store(ctrl, C_MISPLACED, misplaced | 0)
  Atomics.store(ctrl, C_GAPS, gaps | 0)
  Atomics.store(ctrl, C_BLOCKS, index.liveEntries)
  Atomics.store(ctrl, C_NODES, index.liveNodes)
  Atomics.store(ctrl, C_WORKERS, index.liveWorkers)
  Atomics.store(ctrl, C_QUERIES, queries | 0)
  Atomics.store(ctrl, C_STORED, (index.appliedByKind[1] as number) | 0)
  Atomics.store(ctrl, C_REMOVED, (index.appliedByKind[2] as number) | 0)
  Atomics.store(ctrl, C_CLEARED, (index.appliedByKind[3] as number) | 0)
  for (let i = 0; i < 3 * REJECT_REASON_COUNT; i++) Atomics.store(ctrl, C_REJECTED + i, (index.rejectedByKindReason[REJECT_REASON_COUNT + i] as number) | 0)
  // last: a reader that sees this count sees every counter above as of that message
  Atomics.store(ctrl, C_PROCESSED, processed | 0)
}

function answer(slot: number): void {
  const base = layout.slot(slot)
  const n = board[base + Q_N] as number
  const early = ((board[base + Q_FLAGS] as number) & QF_EARLY_EXIT) !== 0
  const m = index.findMatches(loViews[slot] as Uint32Array, hiViews[slot] as Uint32Array, n, early)
  let o = layout.results(slot, me)
  board[o++] = m
  const ws = index.matchWorkers
  for (let i = 0; i < m; i++, o += RESULT_WORDS) {
    const w = ws[i] as number
    board[o] = index.workerIdLo(w)
    board[o + 1] = index.workerIdHi(w)
    board[o + 2] = index.workerRank(w)
    board[o + 3] = index.depth(w)
    board[o + 4] = index.treeSize(w)
  }
  queries++
  const bit = 1 << me
  const before = Atomics.and(board, base + Q_PENDING, ~bit)
  if ((before & bit) !== 0 && (before & ~bit) === 0) {
    Atomics.add(board, B_ANSWERS, 1)
    if (Atomics.load(board, B_MAIN_WAITING) !== 0) Atomics.notify(board, B_ANSWERS)
  }
}

/** Answers waiting queries in order; stops at one whose read-your-writes barrier is not met. */
function serveQueries(): number {
  let qr = qRead
  const qw = Atomics.load(ctrl, QRING_WRITE) >>> 0
  const start = qr
  while (qr !== qw) {
    const slot = ctrl[QRING_BASE + (qr & (QRING_SIZE - 1))] as number
    const barrier = board[layout.barrier(slot, me)] as number
    if (barrier !== -1 && ((processed - barrier) | 0) < 0) break
    answer(slot)
    qr = (qr + 1) >>> 0
  }
  if (qr !== start) {
    qRead = qr
    Atomics.store(ctrl, QRING_READ, qr | 0)
  }
  return (qr - start) >>> 0
}

/** CONTROL_POSTED as of the last turn of the event loop: calls posted before it were taken in. */
let controlSeen = 0
function controlWaiting(): boolean {
  return Atomics.load(ctrl, CONTROL_POSTED) !== controlSeen
}

function queriesWaiting(): boolean {
  return Atomics.load(ctrl, QRING_WRITE) >>> 0 !== qRead
}

/** Resolves the barriers now passed; true when there was one (its reply is then due). */
function releaseWaiters(): boolean {
  let any = false
  for (let i = waiters.length - 1; i >= 0; i--) {
    const wt = waiters[i] as { seq: number; resolve: () => void }
    if (((processed - wt.seq) | 0) >= 0) {
      waiters.splice(i, 1)
      wt.resolve()
      any = true
    }
  }
  return any
}

/** Resolves once every message up to `seq` (count since start, mod 2^32) has been processed. */
function barrier(seq: number): Promise<void> {
  if (((processed - seq) | 0) >= 0) return Promise.resolve()
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
    if (read !== readBefore && Atomics.load(ctrl, PRODUCER_WAIT) === 1 && (Atomics.load(ctrl, RING_WRITE) - read) >>> 0 <= ringHalf) Atomics.notify(ctrl, RING_READ)
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
    return processed
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
  async stats(): Promise<ShardStats> {
    return { received, applied, malformed, processed, blocks: index.liveEntries, nodes: index.liveNodes, workerRanks: index.liveWorkers, bytes: index.bytes }
  },
  async block(ms: number): Promise<void> {
    const until = Date.now() + ms
    while (Date.now() < until) {
      // busy on purpose
    }
  },
  async shutdown(seq: number): Promise<ShardStats> {
    // nobody will end a hold from here on: what is held goes now, and no new one is opened
    shuttingDown = true
    recoverable.clear()
    unparkAll()
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
  // an internal bug: let the main thread see the exit and restart this shard
  console.error('shard loop failed', err)
  process.exit(1)
})
