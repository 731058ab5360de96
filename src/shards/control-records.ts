// The main thread's side of the ring records (table in src/thread/records.ts): each builder
// fills a record of one kind by its field names, ready for the ring.
import { u64Hi, u64Lo } from '../codec/u64.js'
import { EventKind } from '../codec/event-decoder.js'
import {
  ENGINE_BATCH,
  ENGINE_RESET,
  PARK,
  PREDICTED,
  RECOVERABLE,
  RECOVERY,
  REMOVE_WORKER,
  RESET_RANK,
  SNAPSHOT,
  type EngineReset,
  type RecoveryKind,
  newRecord,
  writeU32,
  writeU32s,
} from '../thread/records.js'

type RankKind = typeof RECOVERABLE | typeof PARK | typeof RECOVERY | typeof RESET_RANK | typeof ENGINE_RESET | typeof ENGINE_BATCH | typeof PREDICTED

/** A record about one worker-rank, with `payload` more bytes after its fixed part (left zero). */
function rankRecord(k: RankKind, workerId: bigint, dpRank: number, flag: number, payload = 0): Uint8Array {
  const rec = newRecord(k, payload)
  rec[k.at.flag] = flag
  writeU32(rec, k.at.workerLo, u64Lo(workerId))
  writeU32(rec, k.at.workerHi, u64Hi(workerId))
  writeU32(rec, k.at.rank, dpRank)
  return rec
}

export function removeWorkerRecord(workerId: bigint): Uint8Array {
  const rec = newRecord(REMOVE_WORKER)
  writeU32(rec, REMOVE_WORKER.at.workerLo, u64Lo(workerId))
  writeU32(rec, REMOVE_WORKER.at.workerHi, u64Hi(workerId))
  return rec
}

export function recoverableRecord(workerId: bigint, on: boolean): Uint8Array {
  return rankRecord(RECOVERABLE, workerId, 0, on ? 1 : 0)
}

export function resetRankRecord(workerId: bigint, dpRank: number): Uint8Array {
  return rankRecord(RESET_RANK, workerId, dpRank, 0)
}

export function engineResetRecord(workerId: bigint, dpRank: number, how: EngineReset): Uint8Array {
  return rankRecord(ENGINE_RESET, workerId, dpRank, how)
}

export function parkRecord(workerId: bigint, dpRank: number, ticket: number): Uint8Array {
  const rec = rankRecord(PARK, workerId, dpRank, 0)
  writeU32(rec, PARK.at.ticket, ticket)
  return rec
}

export function recoveryRecord(
  workerId: bigint,
  dpRank: number,
  ticket: number,
  kind: RecoveryKind,
  events: Uint8Array | null,
  lastId: bigint | null,
): Uint8Array {
  const rec = rankRecord(RECOVERY, workerId, dpRank, kind, events?.length ?? 0)
  writeU32(rec, RECOVERY.at.ticket, ticket)
  if (lastId !== null) {
    rec[RECOVERY.at.hasLastId] = 1
    writeU32(rec, RECOVERY.at.lastIdLo, u64Lo(lastId))
    writeU32(rec, RECOVERY.at.lastIdHi, u64Hi(lastId))
  }
  if (events !== null) rec.set(events, RECOVERY.length)
  return rec
}

export function engineBatchRecord(workerId: bigint, dpRank: number, blockSize: number, payload: Uint8Array): Uint8Array {
  const rec = rankRecord(ENGINE_BATCH, workerId, dpRank, 0, payload.length)
  writeU32(rec, ENGINE_BATCH.at.blockSize, blockSize)
  rec.set(payload, ENGINE_BATCH.length)
  return rec
}

function predictedRecord(kind: EventKind, workerId: bigint, dpRank: number, eventId: bigint, n: number, perBlock: number): Uint8Array {
  const rec = rankRecord(PREDICTED, workerId, dpRank, kind, perBlock * n)
  writeU32(rec, PREDICTED.at.count, n)
  writeU32(rec, PREDICTED.at.eventIdLo, u64Lo(eventId))
  writeU32(rec, PREDICTED.at.eventIdHi, u64Hi(eventId))
  return rec
}

/** Predicted stored blocks without a parent: block hashes `seq`, tokens hashes `local`, n of each. */
export function predictedStoredRecord(
  workerId: bigint,
  dpRank: number,
  eventId: bigint,
  localLo: Uint32Array,
  localHi: Uint32Array,
  seqLo: Uint32Array,
  seqHi: Uint32Array,
  n: number,
): Uint8Array {
  const rec = predictedRecord(EventKind.Stored, workerId, dpRank, eventId, n, 16)
  let o = PREDICTED.length
  writeU32s(rec, o, seqLo, n)
  writeU32s(rec, (o += 4 * n), seqHi, n)
  writeU32s(rec, (o += 4 * n), localLo, n)
  writeU32s(rec, o + 4 * n, localHi, n)
  return rec
}

/** Predicted removals of block hashes `seq`. */
export function predictedRemovedRecord(workerId: bigint, dpRank: number, eventId: bigint, seqLo: Uint32Array, seqHi: Uint32Array, n: number): Uint8Array {
  const rec = predictedRecord(EventKind.Removed, workerId, dpRank, eventId, n, 8)
  writeU32s(rec, PREDICTED.length, seqLo, n)
  writeU32s(rec, PREDICTED.length + 4 * n, seqHi, n)
  return rec
}

/** Applies (or, `apply` false, drops) the snapshot a shard staged under `ticket`, in order with the events. */
export function snapshotRecord(ticket: number, apply: boolean): Uint8Array {
  const rec = newRecord(SNAPSHOT)
  rec[SNAPSHOT.at.flag] = apply ? 1 : 0
  writeU32(rec, SNAPSHOT.at.ticket, ticket)
  return rec
}
