// Decoding event messages and applying them to the KvIndex, and publishing the counters the main
// thread reads. A live event passes through parking.ts between its decoding and its apply (its
// worker-rank may be held for a recovery); a released one, let go after a hold, does not.
import { REJECT_REASON_COUNT, REJECT_REASON_NAMES } from '../../src/index/kv-index.js'
import { DecodedEvent } from '../../src/codec/event-decoder.js'
import { KvrError } from '../../src/errors.js'
import { C, shardOf } from '../../src/thread/protocol.js'
import { PREDICTED, readPredicted, recordOp } from '../../src/thread/records.js'
import { counters, ctrl, decoder, index, init, me } from './state.js'
import { SAMPLE_MALFORMED, SAMPLE_REJECTED, sample } from './log.js'
import { post } from './post.js'

/**
 * How a message is taken: as it arrives, or let go after a hold. A released one was counted
 * when it was held, and is applied whatever its id (a recovery that could not fill the gap
 * leaves a hole, accepted).
 */
export const Live = 0
export const Released = 1
export type Mode = typeof Live | typeof Released

/** The event of the last PREDICTED record read (reused). */
const predicted = new DecodedEvent()

/**
 * Decodes one event message (or PREDICTED record) into a reused event; null when the message is
 * malformed (counted and dropped) or belongs to another shard (sent back).
 */
export function decodeOwned(bytes: Uint8Array, mode: Mode): DecodedEvent | null {
  let ev: DecodedEvent
  try {
    ev = recordOp(bytes) === PREDICTED.op ? readPredicted(bytes, predicted) : decoder.decode(bytes)
  } catch (err) {
    // bad input is counted and dropped; anything else is a bug that must restart this shard
    if (!(err instanceof KvrError)) throw err
    if (mode === Live) {
      counters.malformed++
      counters.processed++
    }
    sample(SAMPLE_MALFORMED, { code: err.code, error: err.message, bytes: bytes.length })
    return null
  }
  if (shardOf(ev.workerLo, ev.workerHi, init.shards) !== me) {
    // The main thread's scan read another worker id than the decoder did (an unknown key holding
    // a worker_id before the real one, an escaped key, an envelope whose publisher is not the
    // event's worker). Applied here, the blocks would sit where that worker's cleared and
    // removals never reach: sent back to go to the owning shard.
    counters.misplaced++
    if (mode === Live) counters.processed++
    const copy = bytes.slice()
    post({ kind: 'misplacedEvent', bytes: copy, lo: ev.workerLo, hi: ev.workerHi }, [copy.buffer])
    return null
  }
  return ev
}

/** Applies a decoded event of this shard's to the index. */
export function applyEvent(ev: DecodedEvent, mode: Mode): void {
  const r = index.apply(ev)
  if (r === 0) counters.applied++
  else rejected(ev, r)
  // after the apply, not before: a long apply serves queries from inside (interrupt), and one
  // whose barrier this message passes must see all of it
  if (mode === Live) counters.processed++
}

/** A sample of an event the index refused (r: 1 + the reason). */
export function rejected(ev: DecodedEvent, r: number): void {
  sample(SAMPLE_REJECTED, { reason: REJECT_REASON_NAMES[r - 1], lo: ev.workerLo, hi: ev.workerHi, dp_rank: ev.dpRank, idLo: ev.eventIdLo, idHi: ev.eventIdHi })
}

/** Decodes and applies a message let go after a hold. */
export function applyReleased(bytes: Uint8Array): void {
  const ev = decodeOwned(bytes, Released)
  if (ev !== null) applyEvent(ev, Released)
}

export function publishCounters(): void {
  Atomics.store(ctrl, C.received, counters.received | 0)
  Atomics.store(ctrl, C.applied, counters.applied | 0)
  Atomics.store(ctrl, C.malformed, counters.malformed | 0)
  Atomics.store(ctrl, C.misplaced, counters.misplaced | 0)
  Atomics.store(ctrl, C.gaps, counters.gaps | 0)
  Atomics.store(ctrl, C.blocks, index.liveEntries)
  Atomics.store(ctrl, C.lowerBlocks, index.lowerEntries)
  Atomics.store(ctrl, C.nodes, index.liveNodes)
  Atomics.store(ctrl, C.workers, index.liveWorkers)
  Atomics.store(ctrl, C.queries, counters.queries | 0)
  Atomics.store(ctrl, C.stored, (index.appliedByKind[1] as number) | 0)
  Atomics.store(ctrl, C.removed, (index.appliedByKind[2] as number) | 0)
  Atomics.store(ctrl, C.cleared, (index.appliedByKind[3] as number) | 0)
  for (let i = 0; i < 3 * REJECT_REASON_COUNT; i++) Atomics.store(ctrl, C.rejected + i, (index.rejectedByKindReason[REJECT_REASON_COUNT + i] as number) | 0)
  // last: a reader that sees this count sees every counter above as of that message
  Atomics.store(ctrl, C.processed, counters.processed | 0)
}
