// The messages a Dynamo worker puts on its event plane, as named MessagePack (rmp-serde
// `to_vec_named`, fields in declaration order):
//
//   RouterEvent  {worker_id, storage_tier, event: {event_id, data, dp_rank}}
//                data: {"stored": {parent_hash, start_position, blocks: [{block_hash, tokens_hash,
//                mm_extra_info}]}} | {"removed": {block_hashes}} | "cleared"
//                (lib/kv-router/src/protocols.rs, stored copy 66907637791). `residency_domain`
//                is left out, the legacy worker-only form every reader accepts, so a clear is the
//                all-domain clear the mocker means; `start_position` is written as nil.
//   ActiveLoad   {worker_id, dp_rank, active_decode_blocks, active_prefill_tokens, kv_used_blocks}
//                on topic kv_metrics; a worker fills kv_used_blocks only (same file).
//   envelope     {publisher_id, sequence, published_at (ms), topic, payload: bin}
//   frame 3      [u8 version 1][u32 BE payload length][envelope]
import type { RouterEvent } from '../../../codec/events.js'
import type { EngineLoad } from '../engine.js'
import type { MsgpackWriter } from './msgpack-writer.js'

export const KV_EVENTS_TOPIC = 'kv-events'
export const KV_METRICS_TOPIC = 'kv_metrics'
/** The event-plane frame header: version byte and payload length. */
export const FRAME_VERSION = 1
export const FRAME_HEADER_SIZE = 5

/** Writes a RouterEvent into `w` (after its reset). */
export function writeRouterEvent(w: MsgpackWriter, ev: RouterEvent): void {
  const e = ev.event
  w.map(3)
  w.str('worker_id').uint(ev.worker_id)
  w.str('storage_tier').str(ev.storage_tier ?? 'device')
  w.str('event').map(3)
  w.str('event_id').uint(e.event_id)
  w.str('data')
  const d = e.data
  if (d === 'cleared') w.str('cleared')
  else if ('stored' in d) {
    const s = d.stored
    w.map(1).str('stored').map(3)
    w.str('parent_hash')
    if (s.parent_hash === null) w.nil()
    else w.uint(s.parent_hash)
    w.str('start_position').nil()
    w.str('blocks').array(s.blocks.length)
    for (const b of s.blocks) {
      w.map(3)
      w.str('block_hash').uint(b.block_hash)
      w.str('tokens_hash').uint(b.tokens_hash)
      w.str('mm_extra_info').nil()
    }
  } else {
    const hashes = d.removed.block_hashes
    w.map(1).str('removed').map(1).str('block_hashes').array(hashes.length)
    for (const h of hashes) w.uint(h)
  }
  w.str('dp_rank').uint(e.dp_rank)
}

/** Writes a worker's ActiveLoad into `w` (after its reset). */
export function writeActiveLoad(w: MsgpackWriter, l: EngineLoad, dpRank = 0): void {
  w.map(5)
  w.str('worker_id').uint(l.workerId)
  w.str('dp_rank').uint(dpRank)
  w.str('active_decode_blocks').nil()
  w.str('active_prefill_tokens').nil()
  w.str('kv_used_blocks').uint(l.activeBlocks)
}

export interface EnvelopeHead {
  publisherId: bigint
  sequence: bigint
  /** Milliseconds since the epoch. */
  publishedAt: number
  topic: string
}

/**
 * Frame 3 of a message: the 5-byte header and the envelope around `payload`, written into `w`
 * (after its reset) and returned as a copy.
 */
export function eventFrame(w: MsgpackWriter, head: EnvelopeHead, payload: Uint8Array): Buffer {
  w.reset()
  // room for the header, filled in once the envelope's length is known
  w.uint(0).uint(0).uint(0).uint(0).uint(0)
  w.map(5)
  w.str('publisher_id').uint(head.publisherId)
  w.str('sequence').uint(head.sequence)
  w.str('published_at').uint(head.publishedAt)
  w.str('topic').str(head.topic)
  w.str('payload').bin(payload)
  const out = w.bytes()
  out[0] = FRAME_VERSION
  out.writeUInt32BE(out.length - FRAME_HEADER_SIZE, 1)
  return out
}
