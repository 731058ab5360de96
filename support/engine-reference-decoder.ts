// The reference decoder of vLLM's and SGLang's KV-event batches: msgpackr unpacks a batch into
// JS values, then each event is converted by the rules of src/codec/engine-events.ts. The decoder
// the shards run (src/codec/engine-stream.ts) reads the bytes in place instead; the tests hold it
// to this one fixture by fixture, and `npm run bench:zmq` measures the two side by side. It is
// not shipped: building an object per event and a number per token, it does not reach the rate
// one shard applies at.
import { Unpackr } from 'msgpackr'
import {
  arrayField,
  type EngineBatchDecoder,
  EngineDecoderBase,
  EngineSkip,
  hashHalves,
  optString,
  PREFIX_KINDS,
  rankOf,
  tierOf,
  tokenError,
  wrongType,
} from '../src/codec/engine-events.js'
import { type DecodedEvent, EventKind } from '../src/codec/event-decoder.js'
import { KvrError } from '../src/errors.js'

/** A decoded batch, before its events are converted. */
export interface EngineBatch {
  readonly ts: number
  readonly events: readonly unknown[]
  /** The batch's data-parallel rank, null when it names none. */
  readonly dpRank: number | null
}

/** The fields of a BlockStored, whichever form it came in. */
interface StoredFields {
  hashes: unknown
  parent: unknown
  tokens: unknown
  blockSize: unknown
  medium: unknown
  loraName: string | null
  cacheSalt: string | null
  extraKeys: unknown
  kind: unknown
}

/** The decoder on msgpackr: the batch unpacked into JS values, then each event converted. */
export class EngineEventDecoder extends EngineDecoderBase implements EngineBatchDecoder {
  private readonly unpackr = new Unpackr({ int64AsType: 'bigint', mapsAsObjects: true, useRecords: false })
  private readonly h = new Uint32Array(2)
  private batch: EngineBatch | null = null
  private at = 0

  begin(payload: Uint8Array): number {
    this.batch = this.decodeBatch(payload)
    this.at = 0
    return this.batch.events.length
  }

  get batchRank(): number | null {
    return this.batch?.dpRank ?? null
  }

  next(workerLo: number, workerHi: number, dpRank: number, out: DecodedEvent): EngineSkip | null {
    return this.convert(this.batch?.events[this.at++], workerLo, workerHi, dpRank, out)
  }

  /** Decodes a batch's MessagePack; throws KvrError (MALFORMED_MSGPACK, WRONG_TYPE). */
  decodeBatch(payload: Uint8Array): EngineBatch {
    let v: unknown
    try {
      v = this.unpackr.unpack(payload)
    } catch (err) {
      throw new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', `the batch does not decode: ${(err as Error).message}`)
    }
    let ts: unknown
    let events: unknown
    let rank: unknown
    if (Array.isArray(v)) [ts, events, rank] = v
    else if (v !== null && typeof v === 'object' && !(v instanceof Uint8Array)) {
      const m = v as Record<string, unknown>
      ts = m.ts
      events = m.events
      rank = m.data_parallel_rank ?? m.attn_dp_rank
    } else throw wrongType('the batch', 'an array [ts, events, data_parallel_rank]', v)
    if (typeof ts !== 'number' && typeof ts !== 'bigint') throw wrongType('the batch timestamp', 'a number', ts)
    const list = arrayField(events, 'the batch events')
    let dpRank: number | null = null
    if (rank !== null && rank !== undefined) dpRank = rankOf(typeof rank === 'bigint' ? Number(rank) : rank)
    return { ts: Number(ts), events: list, dpRank }
  }

  /**
   * Converts one event of a batch into `out` for worker (lo, hi) and `dpRank`. Returns null when
   * there is something to apply, else why not (the caller counts it); throws KvrError when the
   * event is malformed.
   */
  convert(ev: unknown, workerLo: number, workerHi: number, dpRank: number, out: DecodedEvent): EngineSkip | null {
    out.reset()
    out.workerLo = workerLo
    out.workerHi = workerHi
    out.dpRank = dpRank
    let tag: unknown
    let m: Record<string, unknown> | null = null
    let a: readonly unknown[] | null = null
    if (Array.isArray(ev)) {
      a = ev
      tag = ev[0]
    } else if (ev !== null && typeof ev === 'object' && !(ev instanceof Uint8Array)) {
      m = ev as Record<string, unknown>
      tag = m.type
    } else throw wrongType('an event', 'an array or a map', ev)
    if (tag === 'BlockStored') {
      const f: StoredFields =
        a !== null
          ? {
              hashes: a[1],
              parent: a[2],
              tokens: a[3],
              blockSize: a[4],
              medium: a[6],
              // vLLM's 8th element is lora_name; SGLang's is a {cache_salt} map
              loraName: typeof a[7] === 'string' || a[7] === null || a[7] === undefined ? optString(a[7], 'lora_name') : null,
              cacheSalt:
                a[7] !== null && typeof a[7] === 'object' && !Array.isArray(a[7]) && !(a[7] instanceof Uint8Array)
                  ? optString((a[7] as Record<string, unknown>).cache_salt, 'cache_salt')
                  : null,
              extraKeys: a[8],
              kind: a[10],
            }
          : {
              hashes: (m as Record<string, unknown>).block_hashes,
              parent: (m as Record<string, unknown>).parent_block_hash,
              tokens: (m as Record<string, unknown>).token_ids,
              blockSize: (m as Record<string, unknown>).block_size,
              medium: (m as Record<string, unknown>).medium,
              loraName: optString((m as Record<string, unknown>).lora_name, 'lora_name'),
              cacheSalt: optString((m as Record<string, unknown>).cache_salt, 'cache_salt'),
              extraKeys: (m as Record<string, unknown>).extra_keys,
              kind: (m as Record<string, unknown>).kv_cache_spec_kind,
            }
      return this.stored(f, out)
    }
    if (tag === 'BlockRemoved') {
      const hashes = arrayField(a !== null ? a[1] : (m as Record<string, unknown>).block_hashes, 'block_hashes')
      out.kind = EventKind.Removed
      out.tier = tierOf(a !== null ? a[2] : (m as Record<string, unknown>).medium)
      out.ensure(hashes.length)
      for (let i = 0; i < hashes.length; i++) {
        hashHalves(hashes[i], 'block_hashes', this.h)
        out.blockLo[i] = this.h[0] as number
        out.blockHi[i] = this.h[1] as number
        if (this.saltedCount > 0) this.forgetSalted(workerLo, workerHi, dpRank, this.h[0] as number, this.h[1] as number)
      }
      out.count = hashes.length
      return hashes.length === 0 ? EngineSkip.Empty : null
    }
    if (tag === 'AllBlocksCleared') {
      out.kind = EventKind.Cleared
      this.forgetWorker(workerLo, workerHi)
      return null
    }
    if (typeof tag !== 'string') throw wrongType('the event tag', 'a string', tag)
    return EngineSkip.UnknownEvent
  }

  private stored(f: StoredFields, out: DecodedEvent): EngineSkip | null {
    const hashes = arrayField(f.hashes, 'block_hashes')
    const tokens = arrayField(f.tokens, 'token_ids')
    const bs = typeof f.blockSize === 'bigint' ? Number(f.blockSize) : f.blockSize
    if (typeof bs !== 'number' || !Number.isInteger(bs) || bs < 1)
      throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `block_size must be a positive integer, got ${String(f.blockSize)}`)
    out.kind = EventKind.Stored
    out.tier = tierOf(f.medium)
    if (f.kind !== null && f.kind !== undefined && !(typeof f.kind === 'string' && PREFIX_KINDS.has(f.kind))) return EngineSkip.AttentionKind
    if (bs !== this.blockSize) return this.mismatch(bs)
    if (f.parent !== null && f.parent !== undefined) {
      hashHalves(f.parent, 'parent_block_hash', this.h)
      out.hasParent = true
      out.parentLo = this.h[0] as number
      out.parentHi = this.h[1] as number
    }
    // blocks whose tokens all came with the event (a short token list ends the run)
    const n = Math.min(hashes.length, Math.floor(tokens.length / bs))
    if (n === 0) return EngineSkip.Empty
    out.ensure(n)
    for (let i = 0; i < n; i++) {
      hashHalves(hashes[i], 'block_hashes', this.h)
      out.blockLo[i] = this.h[0] as number
      out.blockHi[i] = this.h[1] as number
    }
    const extra = f.extraKeys === null || f.extraKeys === undefined ? null : arrayField(f.extraKeys, 'extra_keys')
    const words = n * bs
    const tw = this.words(words)
    for (let i = 0; i < words; i++) {
      const t = tokens[i]
      if (typeof t !== 'number' || t >>> 0 !== t) throw tokenError(i, t)
      tw[i] = t
    }
    this.hashBlocks(out, n, f.loraName, f.cacheSalt, extra)
    return null
  }
}
