// Holding a worker-rank's events during a recovery ("parking" them).
//
// A worker-rank whose next event id skips ahead has lost events (a NATS outage, a router that
// was down). For a worker that answers worker queries (the main thread says which), its events
// are held from the gap on while the main thread fetches the missing range or a dump, then the
// recovery is applied and the held events after it, in order: what Dynamo does synchronously
// per worker, without holding up the other workers of this shard. A held message counts as
// processed when it is held: barriers (registrations, GET /v1/workers, flush) do not wait for a
// worker's recovery, which can take seconds. Other workers' gaps are counted and the event
// applied, a hole accepted, as Dynamo does.
//
// Every hold has a ticket, and only the recovery record with that ticket ends it: a late answer
// to a hold that something else ended (a removal, the size bound, a shutdown) cannot end a newer
// one with stale events. Tickets of holds this thread opens at a gap have the high bit set; the
// main thread numbers the holds it opens (PARK records) below it.
import type { DecodedEvent } from '../../src/codec/event-decoder.js'
import { splitEvents } from '../../src/codec/event-array.js'
import { KvrError } from '../../src/errors.js'
import { PARK, RECOVERABLE, RECOVERY, REMOVE_WORKER, RESET_RANK, RecoveryKind, SHARD_TICKET_BIT, readU32 } from '../../src/thread/records.js'
import { applyReleased, rejected } from './apply.js'
import { post } from './post.js'
import { interrupt } from './queries.js'
import { counters, decoder, index } from './state.js'

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

/**
 * Takes a live event (decoded from `bytes`) into its worker-rank's hold, or opens a hold when
 * the event is past a gap of a recoverable worker. True when it was held (and counted as
 * processed): it is not applied now. A gap not recovered is counted here too.
 */
export function held(ev: DecodedEvent, bytes: Uint8Array): boolean {
  if (parks.size !== 0) {
    const key = rankKey(ev.workerLo, ev.workerHi, ev.dpRank)
    const p = parks.get(key)
    if (p !== undefined) {
      // behind a recovery in flight; past the hold's bound, everything held goes now, this
      // one last (the decoder's event object is reused, so this one is applied from its bytes)
      counters.processed++
      p.msgs.push(bytes.slice())
      p.bytes += bytes.length
      if (p.bytes > PARK_MAX_BYTES) unpark(key)
      return true
    }
  }
  if (isGap(ev.workerLo, ev.workerHi, ev.dpRank, ev.eventIdLo, ev.eventIdHi)) {
    counters.gaps++
    if (!shuttingDown && recoverable.size !== 0 && recoverable.has(`${ev.workerLo}:${ev.workerHi}`)) {
      const fromLo = (lastId.lo + 1) >>> 0
      const fromHi = fromLo === 0 ? (lastId.hi + 1) >>> 0 : lastId.hi
      const ticket = (SHARD_TICKET_BIT | (nextTicket++ & 0x7fffffff)) >>> 0
      counters.processed++
      parks.set(rankKey(ev.workerLo, ev.workerHi, ev.dpRank), { ticket, msgs: [bytes.slice()], bytes: bytes.length })
      post({ kind: 'gap', lo: ev.workerLo, hi: ev.workerHi, rank: ev.dpRank, fromLo, fromHi, toLo: ev.eventIdLo, toHi: ev.eventIdHi, ticket })
      return true
    }
  }
  return false
}

/** Applies a worker-rank's held events in order and lets its events through again. */
function unpark(key: string): void {
  const p = parks.get(key)
  if (p === undefined) return
  parks.delete(key)
  for (const m of p.msgs) applyReleased(m)
}

/** Lets a worker-rank's hold go, its events applied (a snapshot replaces the worker-rank after them). */
export function letGo(lo: number, hi: number, rank: number): void {
  if (parks.size !== 0) unpark(rankKey(lo, hi, rank))
}

/** Lets every hold go (shutdown, and nobody left to end them). */
export function unparkAll(): void {
  for (const key of [...parks.keys()]) unpark(key)
}

/** Shutdown begins: nobody will end a hold from here on, so what is held goes now and no new one is opened. */
export function stopHolding(): void {
  shuttingDown = true
  recoverable.clear()
  unparkAll()
}

/**
 * A control record of the worker-rank holds (REMOVE_WORKER, RECOVERABLE, PARK, RECOVERY,
 * RESET_RANK), ordered with events. One too short, or of a kind no one takes, is counted as
 * processed and dropped.
 */
export function onControl(op: number, bytes: Uint8Array): void {
  if (op === REMOVE_WORKER.op) {
    if (bytes.length >= REMOVE_WORKER.length) removeWorker(readU32(bytes, REMOVE_WORKER.at.workerLo), readU32(bytes, REMOVE_WORKER.at.workerHi))
  } else if (op === RECOVERABLE.op) {
    const at = RECOVERABLE.at
    if (bytes.length >= RECOVERABLE.length) {
      const worker = `${readU32(bytes, at.workerLo)}:${readU32(bytes, at.workerHi)}`
      if (bytes[at.flag] === 1 && !shuttingDown) recoverable.add(worker)
      else recoverable.delete(worker)
    }
  } else if (op === PARK.op) {
    const at = PARK.at
    if (bytes.length >= PARK.length) {
      const key = rankKey(readU32(bytes, at.workerLo), readU32(bytes, at.workerHi), readU32(bytes, at.rank))
      // a newer hold replaces an older one, whose events go first
      unpark(key)
      if (!shuttingDown) parks.set(key, { ticket: readU32(bytes, at.ticket), msgs: [], bytes: 0 })
    }
  } else if (op === RESET_RANK.op) {
    const at = RESET_RANK.at
    if (bytes.length >= RESET_RANK.length) {
      const lo = readU32(bytes, at.workerLo)
      const hi = readU32(bytes, at.workerHi)
      const rank = readU32(bytes, at.rank)
      // events held before the reset came before it
      unpark(rankKey(lo, hi, rank))
      index.resetWorkerRank(lo, hi, rank)
    }
  } else if (op === RECOVERY.op && bytes.length >= RECOVERY.length) {
    const at = RECOVERY.at
    const lo = readU32(bytes, at.workerLo)
    const hi = readU32(bytes, at.workerHi)
    const rank = readU32(bytes, at.rank)
    const key = rankKey(lo, hi, rank)
    const p = parks.get(key)
    // a recovery for a hold that ended meanwhile comes too late to apply in order: dropped
    if (p !== undefined && p.ticket === readU32(bytes, at.ticket)) recover(lo, hi, rank, key, bytes)
  }
  counters.processed++
}

function removeWorker(lo: number, hi: number): void {
  // its held events came before the removal: applied, then removed with everything else
  if (parks.size !== 0) for (const key of [...parks.keys()]) if (key.startsWith(`${lo}:${hi}:`)) unpark(key)
  recoverable.delete(`${lo}:${hi}`)
  index.removeWorker(lo, hi)
}

/** Applies a recovery record to its hold, then the held events, and ends the hold. */
function recover(lo: number, hi: number, rank: number, key: string, bytes: Uint8Array): void {
  const at = RECOVERY.at
  const kind = bytes[at.flag]
  // an Events answer holds the missing ids: ids at or below the last applied are already here
  const known = kind === RecoveryKind.Events && index.lastEventId(lo, hi, rank, lastId)
  const floorLo = known ? lastId.lo : 0
  const floorHi = known ? lastId.hi : 0
  if (kind === RecoveryKind.TreeDump) index.resetWorkerRank(lo, hi, rank)
  if (kind === RecoveryKind.Events || kind === RecoveryKind.TreeDump) {
    let parts: Uint8Array[] = []
    try {
      parts = splitEvents(bytes.subarray(RECOVERY.length))
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
    if (bytes[at.hasLastId] === 1) index.setEventId(lo, hi, rank, readU32(bytes, at.lastIdLo), readU32(bytes, at.lastIdHi))
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
  let ev: DecodedEvent
  try {
    ev = decoder.decode(bytes)
  } catch (err) {
    if (!(err instanceof KvrError)) throw err
    return
  }
  if (ev.workerLo !== lo || ev.workerHi !== hi || ev.dpRank !== rank) return
  if (floor === 1 && (ev.eventIdHi < floorHi || (ev.eventIdHi === floorHi && ev.eventIdLo <= floorLo))) return
  const r = index.apply(ev)
  if (r === 0) counters.applied++
  else rejected(ev, r)
}
