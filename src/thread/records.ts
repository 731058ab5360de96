// The ring's own records: every record the main thread writes into a shard's event ring beside
// the raw event messages, each kind with its opcode, its fixed length and its named fields. Both
// sides (src/shards/ writing, workers/shard/ reading) use only these names;
// test/thread/protocol.test.ts fails on a duplicate opcode, an overlapping or out-of-bounds
// field, and an offset written as a number anywhere else.
//
// Every record starts with byte 0 = 0 (no event message starts so: JSON starts with `{` or
// whitespace, MessagePack with a map or array tag) and byte 1 = its opcode. Integers are little
// endian; a u64 is two u32 fields, low half first.
import { type DecodedEvent, EventKind } from '../codec/event-decoder.js'

/** A field's position in its record: byte offset and width in bytes. */
export interface Field {
  readonly at: number
  readonly size: 1 | 4
}

const u8 = (at: number): Field => ({ at, size: 1 })
const u32 = (at: number): Field => ({ at, size: 4 })

/** Fields every record has. */
const HEAD = { marker: u8(0), op: u8(1) }
/** Fields of the records about one worker-rank. */
const RANK = { ...HEAD, flag: u8(2), workerLo: u32(4), workerHi: u32(8), rank: u32(12) }

export interface RecordKind<F extends Record<string, Field>> {
  readonly name: string
  readonly op: number
  /** Fixed part, in bytes; a record with a payload carries it from here on. */
  readonly length: number
  /** True when a variable-length payload follows the fixed part. */
  readonly payload: boolean
  readonly fields: F
  /** The fields' byte offsets, by name: what the code that reads and writes records uses. */
  readonly at: { readonly [K in keyof F]: number }
}

function kind<F extends Record<string, Field>>(name: string, op: number, length: number, fields: F, payload = false): RecordKind<F> {
  const at = {} as { [K in keyof F]: number }
  for (const k of Object.keys(fields) as (keyof F)[]) at[k] = (fields[k] as Field).at
  return Object.freeze({ name, op, length, payload, fields, at: Object.freeze(at) })
}

/** Drops every block of every rank of a worker. */
export const REMOVE_WORKER = kind('removeWorker', 1, 12, { ...HEAD, workerLo: u32(4), workerHi: u32(8) })
/** Whether a worker's gaps are held for recovery: flag 1 when it answers worker queries, 0 when not (rank unused). */
export const RECOVERABLE = kind('recoverable', 2, 16, RANK)
/** Holds the worker-rank's events from here until the RECOVERY record with the same ticket. */
export const PARK = kind('park', 3, 20, { ...RANK, ticket: u32(16) })
/**
 * Ends a hold: flag is a RecoveryKind; hasLastId 1 when lastIdLo/Hi are the worker-rank's last
 * event id after a tree dump (else it is not known); the payload (Events, TreeDump) is the
 * events as a JSON array.
 */
export const RECOVERY = kind('recovery', 4, 32, { ...RANK, hasLastId: u8(3), ticket: u32(16), lastIdLo: u32(24), lastIdHi: u32(28) }, true)
/** Drops the worker-rank's blocks and forgets its last event id (what came before was not its events). */
export const RESET_RANK = kind('resetRank', 5, 16, RANK)
/**
 * Resets what a shard holds of an engine: flag is an EngineReset. Rank: the rank's blocks and its
 * decoding state (an engine rank restarted); Worker: every rank's (the listeners start, and replay
 * what the engine holds); State: the decoding state alone (the listeners stop).
 */
export const ENGINE_RESET = kind('engineReset', 6, 16, RANK)
/**
 * An engine's own KV-event batch (src/transport/engine-intake.ts), decoded by the shard
 * (workers/shard/engine.ts): rank is the listener's, blockSize the router's; the payload is the
 * batch's MessagePack as the engine sent it. The listener has put the batches in order, so their
 * events bypass the event-id gap detection.
 */
export const ENGINE_BATCH = kind('engineBatch', 7, 20, { ...RANK, blockSize: u32(16) }, true)
/**
 * Blocks the router predicts a worker-rank holds (approximate mode, workers without events),
 * applied as an event with this id: flag is the EventKind (Stored or Removed), hasParent 1 when
 * parentLo/Hi name the parent block. The payload is `count` u32 block hashes' low halves, then
 * their high halves; for Stored, then as many tokens hashes' low and high halves.
 */
export const PREDICTED = kind(
  'predicted',
  8,
  40,
  { ...RANK, hasParent: u8(3), count: u32(16), eventIdLo: u32(20), eventIdHi: u32(24), parentLo: u32(28), parentHi: u32(32) },
  true,
)

/**
 * Applies (flag 1) or drops (flag 0) the snapshot the shard staged under `ticket`
 * (ShardApi.stageSnapshot): the snapshot takes its place among the events here.
 */
export const SNAPSHOT = kind('snapshot', 9, 8, { ...HEAD, flag: u8(2), ticket: u32(4) })

/** Every record kind, by name (the test walks it). */
export const RECORD_KINDS = { REMOVE_WORKER, RECOVERABLE, PARK, RECOVERY, RESET_RANK, ENGINE_RESET, ENGINE_BATCH, PREDICTED, SNAPSHOT } as const

/** Offsets every record shares. */
export const RECORD_MARKER_AT = HEAD.marker.at
export const RECORD_OP_AT = HEAD.op.at

/** The record's opcode, or 0 when `bytes` is an event message (or too short to be a record). */
export function recordOp(bytes: Uint8Array): number {
  return bytes.length > RECORD_OP_AT && bytes[RECORD_MARKER_AT] === 0 ? (bytes[RECORD_OP_AT] as number) : 0
}

/** A zeroed record of `k` with `payload` more bytes, its marker and opcode set. */
export function newRecord(k: RecordKind<Record<string, Field>>, payload = 0): Uint8Array {
  const rec = new Uint8Array(k.length + payload)
  rec[RECORD_OP_AT] = k.op
  return rec
}

export function readU32(b: Uint8Array, at: number): number {
  return ((b[at] as number) | ((b[at + 1] as number) << 8) | ((b[at + 2] as number) << 16) | ((b[at + 3] as number) << 24)) >>> 0
}

export function writeU32(b: Uint8Array, at: number, v: number): void {
  b[at] = v
  b[at + 1] = v >>> 8
  b[at + 2] = v >>> 16
  b[at + 3] = v >>> 24
}

/** Copies n u32 values into the record from `at` on. */
export function writeU32s(b: Uint8Array, at: number, src: Uint32Array, n: number): void {
  for (let i = 0, o = at; i < n; i++, o += 4) writeU32(b, o, src[i] as number)
}

/** Reads n u32 values of the record from `at` on into `dst`. */
export function readU32s(b: Uint8Array, at: number, dst: Uint32Array, n: number): void {
  for (let i = 0, o = at; i < n; i++, o += 4) dst[i] = readU32(b, o)
}

/** Tickets of the holds a shard opens at a gap have this bit; the main thread's, not. */
export const SHARD_TICKET_BIT = 0x80000000
export const RecoveryKind = { Events: 0, TreeDump: 1, Failed: 2 } as const
export type RecoveryKind = (typeof RecoveryKind)[keyof typeof RecoveryKind]
export const EngineReset = { Rank: 0, Worker: 1, State: 2 } as const
export type EngineReset = (typeof EngineReset)[keyof typeof EngineReset]

/**
 * Reads a PREDICTED record into `ev` (reset first) and returns it: the router's own blocks,
 * written from its typed arrays, taken as an event without any text decoding.
 */
export function readPredicted(bytes: Uint8Array, ev: DecodedEvent): DecodedEvent {
  const at = PREDICTED.at
  const n = bytes.length >= PREDICTED.length ? readU32(bytes, at.count) : 0
  const kind = bytes[at.flag] === EventKind.Removed ? EventKind.Removed : EventKind.Stored
  // only the pool writes these: a short one is a bug (in a shard, it restarts the thread)
  if (bytes.length < PREDICTED.length + (kind === EventKind.Stored ? 16 : 8) * n) throw new Error(`predicted-blocks record of ${bytes.length} bytes is short`)
  ev.reset()
  ev.workerLo = readU32(bytes, at.workerLo)
  ev.workerHi = readU32(bytes, at.workerHi)
  ev.dpRank = readU32(bytes, at.rank)
  ev.eventIdLo = readU32(bytes, at.eventIdLo)
  ev.eventIdHi = readU32(bytes, at.eventIdHi)
  ev.kind = kind
  ev.hasParent = bytes[at.hasParent] === 1
  ev.parentLo = readU32(bytes, at.parentLo)
  ev.parentHi = readU32(bytes, at.parentHi)
  ev.ensure(n)
  ev.count = n
  let o = PREDICTED.length
  readU32s(bytes, o, ev.blockLo, n)
  readU32s(bytes, (o += 4 * n), ev.blockHi, n)
  if (kind === EventKind.Stored) {
    readU32s(bytes, (o += 4 * n), ev.tokensLo, n)
    readU32s(bytes, o + 4 * n, ev.tokensHi, n)
  }
  return ev
}
