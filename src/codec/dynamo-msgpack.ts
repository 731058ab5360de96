// Dynamo's own KV events as current Dynamo workers publish them: a `RouterEvent` encoded as a
// MessagePack map (rmp_serde::to_vec_named), inside an event-plane envelope encoded the same way,
// `{publisher_id, sequence, published_at, topic, payload: bin}`
// (lib/runtime/src/transports/event_plane/codec.rs and lib/kv-router/src/protocols.rs,
// dynamo-runtime and dynamo-kv-router 0.9.0 to 1.4.0). Fields are read by name; unknown ones are
// ignored as serde does. A bare RouterEvent map (no envelope) is taken too.
//
//   RouterEvent  {worker_id, storage_tier?, residency_domain?, event: {event_id, data, dp_rank}, state_source?}
//   data         {"stored": {parent_hash, start_position?, blocks: [{block_hash, tokens_hash, mm_extra_info?}]}}
//                | {"removed": {block_hashes}} | "cleared" (a unit variant: its name; {"cleared": nil} is taken too)
import { Unpackr } from 'msgpackr'
import { KvrError } from '../errors.js'
import { hashHalves } from './engine-events.js'
import { DecodedEvent, EventKind, StorageTier } from './event-decoder.js'

/** Whether a message's first byte starts a MessagePack map (the JSON encodings start with `{` or space). */
export function isMsgpackMap(first: number): boolean {
  return (first >= 0x80 && first <= 0x8f) || first === 0xde || first === 0xdf
}

const TIERS: Readonly<Record<string, number>> = { device: StorageTier.Device, host_pinned: StorageTier.HostPinned, disk: StorageTier.Disk, external: StorageTier.External }

function map(v: unknown, field: string): Record<string, unknown> {
  if (v === null || typeof v !== 'object' || Array.isArray(v) || v instanceof Uint8Array) {
    throw new KvrError('KVR_ERR_EVENT_WRONG_TYPE', `${field} must be a map`)
  }
  return v as Record<string, unknown>
}

function required(m: Record<string, unknown>, key: string, where: string): unknown {
  const v = m[key]
  if (v === undefined) throw new KvrError('KVR_ERR_EVENT_MISSING_FIELD', `${where} has no ${key}`)
  return v
}

function smallInt(v: unknown, field: string): number {
  const n = typeof v === 'bigint' ? Number(v) : v
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} must be an integer in [0, 2^32)`)
  return n
}

export class DynamoMsgpackDecoder {
  private readonly unpackr = new Unpackr({ int64AsType: 'bigint', mapsAsObjects: true, useRecords: false })
  private readonly h = new Uint32Array(2)

  /** Decodes one message (an envelope or a bare RouterEvent) into `out`; throws KvrError. */
  decode(bytes: Uint8Array, out: DecodedEvent = new DecodedEvent()): DecodedEvent {
    let v: unknown
    try {
      v = this.unpackr.unpack(bytes)
    } catch (err) {
      throw new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', `the event does not decode: ${(err as Error).message}`)
    }
    out.reset()
    let ev = map(v, 'the message')
    if (ev.payload instanceof Uint8Array) {
      out.hasEnvelope = true
      this.u64(required(ev, 'publisher_id', 'the envelope'), 'publisher_id')
      out.publisherLo = this.h[0] as number
      out.publisherHi = this.h[1] as number
      this.u64(required(ev, 'sequence', 'the envelope'), 'sequence')
      out.sequenceLo = this.h[0] as number
      out.sequenceHi = this.h[1] as number
      try {
        ev = map(this.unpackr.unpack(ev.payload), 'the payload')
      } catch (err) {
        if (err instanceof KvrError) throw err
        throw new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', `the payload does not decode: ${(err as Error).message}`)
      }
    }
    this.u64(required(ev, 'worker_id', 'the event'), 'worker_id')
    out.workerLo = this.h[0] as number
    out.workerHi = this.h[1] as number
    const tier = ev.storage_tier
    if (tier !== undefined && tier !== null) {
      const t = typeof tier === 'string' ? TIERS[tier] : undefined
      if (t === undefined) throw new KvrError('KVR_ERR_EVENT_UNKNOWN_VARIANT', `storage_tier ${JSON.stringify(String(tier))} is not one of device, host_pinned, disk, external`)
      out.tier = t
    }
    const inner = map(required(ev, 'event', 'the event'), 'event')
    this.u64(required(inner, 'event_id', 'event'), 'event_id')
    out.eventIdLo = this.h[0] as number
    out.eventIdHi = this.h[1] as number
    out.dpRank = inner.dp_rank === undefined || inner.dp_rank === null ? 0 : smallInt(inner.dp_rank, 'dp_rank')
    this.data(required(inner, 'data', 'event'), out)
    return out
  }

  private u64(v: unknown, field: string): void {
    if (typeof v === 'number' && v < 0) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} must be an unsigned integer`)
    if (typeof v === 'bigint' && v < 0n) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} must be an unsigned integer`)
    if (v instanceof Uint8Array) throw new KvrError('KVR_ERR_EVENT_WRONG_TYPE', `${field} must be an integer`)
    hashHalves(v, field, this.h)
  }

  private data(d: unknown, out: DecodedEvent): void {
    if (d === 'cleared') {
      out.kind = EventKind.Cleared
      return
    }
    const m = map(d, 'data')
    if ('cleared' in m) {
      out.kind = EventKind.Cleared
      return
    }
    if (m.stored !== undefined) {
      const s = map(m.stored, 'stored')
      out.kind = EventKind.Stored
      if (s.parent_hash !== undefined && s.parent_hash !== null) {
        this.u64(s.parent_hash, 'parent_hash')
        out.hasParent = true
        out.parentLo = this.h[0] as number
        out.parentHi = this.h[1] as number
      }
      const blocks = required(s, 'blocks', 'stored')
      if (!Array.isArray(blocks)) throw new KvrError('KVR_ERR_EVENT_WRONG_TYPE', 'blocks must be an array')
      out.ensure(blocks.length)
      for (let i = 0; i < blocks.length; i++) {
        const b = map(blocks[i], `blocks[${i}]`)
        this.u64(required(b, 'block_hash', `blocks[${i}]`), 'block_hash')
        out.blockLo[i] = this.h[0] as number
        out.blockHi[i] = this.h[1] as number
        this.u64(required(b, 'tokens_hash', `blocks[${i}]`), 'tokens_hash')
        out.tokensLo[i] = this.h[0] as number
        out.tokensHi[i] = this.h[1] as number
      }
      out.count = blocks.length
      return
    }
    if (m.removed !== undefined) {
      const hashes = required(map(m.removed, 'removed'), 'block_hashes', 'removed')
      if (!Array.isArray(hashes)) throw new KvrError('KVR_ERR_EVENT_WRONG_TYPE', 'block_hashes must be an array')
      out.kind = EventKind.Removed
      out.ensure(hashes.length)
      for (let i = 0; i < hashes.length; i++) {
        this.u64(hashes[i], 'block_hashes')
        out.blockLo[i] = this.h[0] as number
        out.blockHi[i] = this.h[1] as number
      }
      out.count = hashes.length
      return
    }
    throw new KvrError('KVR_ERR_EVENT_UNKNOWN_VARIANT', `data names none of stored, removed, cleared (${Object.keys(m).join(', ')})`)
  }
}
