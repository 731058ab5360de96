// vLLM's and SGLang's KV-event batches read straight from their MessagePack bytes into the
// index's DecodedEvent: the decoder a shard runs (workers/shard/engine.ts). Same layouts and
// rules as engine-events.ts (the tests hold it to support/engine-reference-decoder.ts, on
// msgpackr), but no JS value is built for a hash or a token id: hashes go into the event's typed
// arrays as u32 halves, token ids into one reused Uint32Array, keys are compared as bytes. Only
// rare fields (extra keys that name media or a salt, SGLang's salt map, unusual strings) are
// unpacked with msgpackr. `npm run bench:zmq` measures both decoders: this one is there because
// the msgpackr one, building an object per event and a number per token, does not reach the
// rate one shard applies at.
//
// begin() walks the whole batch once without decoding it (the rank comes after the events, and a
// truncated or ill-formed batch is refused before any of its events is applied); next() then
// reads one event per call.
import { Unpackr } from 'msgpackr'
import { KvrError } from '../errors.js'
import {
  arrayField,
  type EngineBatchDecoder,
  EngineDecoderBase,
  EngineSkip,
  optString,
  PREFIX_KINDS,
  rankOf,
  tierOf,
  tokenError,
  wrongType,
} from './engine-events.js'
import { type DecodedEvent, EventKind, StorageTier } from './event-decoder.js'
import { INT_BYTES, MsgpackCursor } from './msgpack-reader.js'

// field slots of a stored or removed event, wherever the form puts them
const F_TAG = 0
const F_HASHES = 1
const F_PARENT = 2
const F_TOKENS = 3
const F_BLOCK_SIZE = 4
const F_MEDIUM = 5
/** lora_name; in the array form, SGLang's {cache_salt} map may stand there instead. */
const F_LORA = 6
const F_SALT = 7
const F_EXTRA = 8
const F_KIND = 9
const F_COUNT = 10

/** Array-form element index → field slot (-1: not read), for BlockStored. */
const STORED_ELEMENTS = [F_TAG, F_HASHES, F_PARENT, F_TOKENS, F_BLOCK_SIZE, -1, F_MEDIUM, F_LORA, F_EXTRA, -1, F_KIND]
/** The same for BlockRemoved: [tag, block_hashes, medium, …]. */
const REMOVED_ELEMENTS = [F_TAG, F_HASHES, F_MEDIUM]

const utf8 = new TextEncoder()
const text = new TextDecoder('utf-8')
const bytesOf = (s: string): Uint8Array => utf8.encode(s)

/** Map keys of an event, by field slot. */
const EVENT_KEYS: [Uint8Array, number][] = [
  [bytesOf('type'), F_TAG],
  [bytesOf('block_hashes'), F_HASHES],
  [bytesOf('parent_block_hash'), F_PARENT],
  [bytesOf('token_ids'), F_TOKENS],
  [bytesOf('block_size'), F_BLOCK_SIZE],
  [bytesOf('medium'), F_MEDIUM],
  [bytesOf('lora_name'), F_LORA],
  [bytesOf('cache_salt'), F_SALT],
  [bytesOf('extra_keys'), F_EXTRA],
  [bytesOf('kv_cache_spec_kind'), F_KIND],
]
/** EVENT_KEYS by key length, so a key is compared with the few of its length only. */
const KEYS_BY_LENGTH: [Uint8Array, number][][] = []
for (const k of EVENT_KEYS) (KEYS_BY_LENGTH[k[0].length] ??= []).push(k)

const K_TS = bytesOf('ts')
const K_EVENTS = bytesOf('events')
const K_DP_RANK = bytesOf('data_parallel_rank')
const K_ATTN_DP_RANK = bytesOf('attn_dp_rank')
const T_STORED = bytesOf('BlockStored')
const T_REMOVED = bytesOf('BlockRemoved')
const T_CLEARED = bytesOf('AllBlocksCleared')
const S_GPU = bytesOf('GPU')
const S_FULL = bytesOf('full_attention')

function truncated(): KvrError {
  return new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'the batch does not decode: it ends inside a value')
}

/** Deeper than any batch an engine writes; a value nested beyond it is refused, not followed. */
const MAX_DEPTH = 1024

class BatchCursor extends MsgpackCursor {
  constructor() {
    super(MAX_DEPTH)
  }

  truncated(): KvrError {
    return truncated()
  }

  malformed(what: string): KvrError {
    return new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', `the batch does not decode: ${what} at ${this.pos}`)
  }
}

/** What a value's first byte makes it, in the words wrongType uses for JS values. */
function kindName(b: number | undefined): unknown {
  if (b === undefined) return undefined
  if (b <= 0x7f || b >= 0xe0 || (b >= 0xca && b <= 0xd3)) return 0
  if (b <= 0x8f || b === 0xde || b === 0xdf) return {}
  if (b <= 0x9f || b === 0xdc || b === 0xdd) return []
  if (b <= 0xbf || (b >= 0xd9 && b <= 0xdb)) return ''
  if (b === 0xc0) return null
  if (b === 0xc2 || b === 0xc3) return false
  if (b >= 0xc4 && b <= 0xc6) return new Uint8Array(0)
  return Symbol()
}

export class EngineStreamDecoder extends EngineDecoderBase implements EngineBatchDecoder {
  batchRank: number | null = null
  /** The batch's bytes; values are read in place. */
  private readonly r = new BatchCursor()
  /** Where the next event starts. */
  private evPos = 0
  /** Whether the current event came as an array (tag first, fields by position). */
  private arrayForm = false
  /** Value offsets of the current event's fields (-1: absent). */
  private readonly at = new Int32Array(F_COUNT)
  /** The last u64 read, as halves. */
  private lo = 0
  private hi = 0
  /** Token ids of the current event, read into tokenWords during its field scan: how many, and the first that is no u32 (-1: none) with its value. */
  private tokenCount = -1
  private badToken = -1
  private badValue: unknown = null
  /** Raw floats, for the few values that come so. */
  private readonly f8 = new DataView(new ArrayBuffer(8))
  private readonly unpackr = new Unpackr({ int64AsType: 'bigint', mapsAsObjects: true, useRecords: false })

  begin(payload: Uint8Array): number {
    this.r.reset(payload)
    this.batchRank = null
    const b = payload[0]
    let ts = -1
    let events = -1
    let rank = -1
    let count = 0
    if (this.r.arrayHeader()) {
      const n = this.r.len
      for (let i = 0; i < n; i++) {
        if (i === 0) ts = this.r.pos
        else if (i === 1) events = this.r.pos
        else if (i === 2) rank = this.r.pos
        this.r.skip()
      }
    } else if (this.r.mapHeader()) {
      const n = this.r.len
      let attn = -1
      for (let i = 0; i < n; i++) {
        const k = this.r.pos
        this.r.skip()
        const v = this.r.pos
        this.r.skip()
        if (this.keyIs(k, K_TS)) ts = v
        else if (this.keyIs(k, K_EVENTS)) events = v
        else if (this.keyIs(k, K_DP_RANK)) rank = v
        else if (this.keyIs(k, K_ATTN_DP_RANK)) attn = v
      }
      // a null data_parallel_rank gives way to attn_dp_rank, as `??` does
      if (rank < 0 || this.r.buf[rank] === 0xc0) rank = attn
    } else {
      this.r.skip()
      if (this.r.pos !== this.r.end) throw new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'the batch does not decode: data after its end')
      throw wrongType('the batch', 'an array [ts, events, data_parallel_rank]', kindName(b))
    }
    if (this.r.pos !== this.r.end) throw new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'the batch does not decode: data after its end')
    const tsb = ts < 0 ? undefined : this.r.buf[ts]
    const tsKind = kindName(tsb)
    if (typeof tsKind !== 'number') throw wrongType('the batch timestamp', 'a number', tsKind)
    this.r.pos = events
    if (events < 0 || !this.r.arrayHeader()) throw wrongType('the batch events', 'an array', kindName(events < 0 ? undefined : this.r.buf[events]))
    count = this.r.len
    this.evPos = this.r.pos
    if (rank >= 0 && this.r.buf[rank] !== 0xc0) {
      this.r.pos = rank
      this.batchRank = rankOf(this.number('data_parallel_rank'))
    }
    return count
  }

  next(workerLo: number, workerHi: number, dpRank: number, out: DecodedEvent): EngineSkip | null {
    out.reset()
    out.workerLo = workerLo
    out.workerHi = workerHi
    out.dpRank = dpRank
    const at = this.at
    at.fill(-1)
    this.tokenCount = -1
    this.r.pos = this.evPos
    const first = this.r.buf[this.r.pos]
    this.arrayForm = false
    if (this.r.arrayHeader()) {
      this.arrayForm = true
      const n = this.r.len
      const tagAt = this.r.pos
      let map = STORED_ELEMENTS
      if (n > 0 && this.r.isStringAt(tagAt, T_REMOVED)) map = REMOVED_ELEMENTS
      for (let i = 0; i < n; i++) {
        const f = i < map.length ? (map[i] as number) : -1
        if (f >= 0) at[f] = this.r.pos
        if (f === F_TOKENS) this.scanTokens()
        else this.r.skip()
      }
    } else if (this.r.mapHeader()) {
      const n = this.r.len
      for (let i = 0; i < n; i++) {
        const k = this.r.pos
        this.r.skip()
        const f = this.eventKey(k)
        if (f >= 0) at[f] = this.r.pos
        if (f === F_TOKENS) this.scanTokens()
        else this.r.skip()
      }
    } else {
      this.r.skip()
      this.evPos = this.r.pos
      throw wrongType('an event', 'an array or a map', kindName(first))
    }
    this.evPos = this.r.pos
    const tag = at[F_TAG] as number
    if (tag >= 0 && this.r.isStringAt(tag, T_STORED)) return this.stored(out)
    if (tag >= 0 && this.r.isStringAt(tag, T_REMOVED)) return this.removed(out)
    if (tag >= 0 && this.r.isStringAt(tag, T_CLEARED)) {
      out.kind = EventKind.Cleared
      this.forgetWorker(workerLo, workerHi)
      return null
    }
    const tb = tag < 0 ? undefined : this.r.buf[tag]
    if (typeof kindName(tb) !== 'string') throw wrongType('the event tag', 'a string', kindName(tb))
    return EngineSkip.UnknownEvent
  }

  private stored(out: DecodedEvent): EngineSkip | null {
    const at = this.at
    // the strings first, as the reference decoder reads them while it gathers the fields
    let loraName: string | null = null
    let cacheSalt: string | null = null
    const lp = at[F_LORA] as number
    if (this.arrayForm) {
      // vLLM's 8th element is lora_name; SGLang's is a {cache_salt} map; anything else names neither
      if (lp >= 0 && this.isStringOrNil(lp)) loraName = optString(this.stringAt(lp), 'lora_name')
      else if (this.isMapAt(lp)) cacheSalt = optString((this.unpackAt(lp) as Record<string, unknown>).cache_salt, 'cache_salt')
    } else {
      loraName = this.optStringAt(lp, 'lora_name')
      cacheSalt = this.optStringAt(at[F_SALT] as number, 'cache_salt')
    }
    const hashesAt = at[F_HASHES] as number
    const tokensAt = at[F_TOKENS] as number
    this.r.pos = hashesAt
    if (hashesAt < 0 || !this.r.arrayHeader()) throw wrongType('block_hashes', 'an array', this.kindAt(hashesAt))
    const hashCount = this.r.len
    const firstHash = this.r.pos
    this.r.pos = tokensAt
    if (tokensAt < 0 || this.tokenCount < 0) throw wrongType('token_ids', 'an array', this.kindAt(tokensAt))
    const tokenCount = this.tokenCount
    const bsAt = at[F_BLOCK_SIZE] as number
    let bs = Number.NaN
    if (bsAt >= 0 && typeof kindName(this.r.buf[bsAt]) === 'number') {
      this.r.pos = bsAt
      bs = this.number('block_size')
    }
    if (!Number.isInteger(bs) || bs < 1)
      throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `block_size must be a positive integer, got ${bsAt < 0 ? 'undefined' : String(this.unpackAt(bsAt))}`)
    out.kind = EventKind.Stored
    out.tier = this.tierAt(at[F_MEDIUM] as number)
    const kindAt = at[F_KIND] as number
    if (kindAt >= 0 && this.r.buf[kindAt] !== 0xc0 && !this.r.isStringAt(kindAt, S_FULL)) {
      const k = this.isStringOrNil(kindAt) ? this.stringAt(kindAt) : null
      if (k === null || !PREFIX_KINDS.has(k)) return EngineSkip.AttentionKind
    }
    if (bs !== this.blockSize) return this.mismatch(bs)
    const parentAt = at[F_PARENT] as number
    if (parentAt >= 0 && this.r.buf[parentAt] !== 0xc0) {
      this.r.pos = parentAt
      this.u64('parent_block_hash')
      out.hasParent = true
      out.parentLo = this.lo
      out.parentHi = this.hi
    }
    // blocks whose tokens all came with the event (a short token list ends the run)
    const n = Math.min(hashCount, Math.floor(tokenCount / bs))
    if (n === 0) return EngineSkip.Empty
    out.ensure(n)
    this.r.pos = firstHash
    const bLo = out.blockLo
    const bHi = out.blockHi
    for (let i = 0; i < n; i++) {
      this.u64('block_hashes')
      bLo[i] = this.lo
      bHi[i] = this.hi
    }
    const extra = this.extraKeys(at[F_EXTRA] as number)
    // the ids were read in the field scan; those of the blocks kept must all be u32
    if (this.badToken >= 0 && this.badToken < n * bs) throw tokenError(this.badToken, this.badValue)
    this.hashBlocks(out, n, loraName, cacheSalt, extra)
    return null
  }

  private removed(out: DecodedEvent): EngineSkip | null {
    const hashesAt = this.at[F_HASHES] as number
    this.r.pos = hashesAt
    if (hashesAt < 0 || !this.r.arrayHeader()) throw wrongType('block_hashes', 'an array', this.kindAt(hashesAt))
    const n = this.r.len
    const first = this.r.pos
    out.kind = EventKind.Removed
    out.tier = this.tierAt(this.at[F_MEDIUM] as number)
    out.ensure(n)
    this.r.pos = first
    for (let i = 0; i < n; i++) {
      this.u64('block_hashes')
      out.blockLo[i] = this.lo
      out.blockHi[i] = this.hi
      if (this.saltedCount > 0) this.forgetSalted(out.workerLo, out.workerHi, out.dpRank, this.lo, this.hi)
    }
    out.count = n
    return n === 0 ? EngineSkip.Empty : null
  }

  // ---- values ----

  /**
   * The token ids at pos (when an array) into tokenWords, in the one pass that also moves past
   * them: a value that is no u32 is noted, not refused yet (only the blocks kept must be whole,
   * and an event of another block size is skipped whatever its ids).
   */
  private scanTokens(): void {
    if (!this.r.arrayHeader()) {
      this.r.skip()
      return
    }
    const words = this.r.len
    if (words > this.r.end - this.r.pos) throw truncated()
    const tw = this.words(words)
    const buf = this.r.buf
    let p = this.r.pos
    this.badToken = -1
    for (let i = 0; i < words; i++) {
      const b = buf[p] as number
      if (b <= 0x7f) {
        tw[i] = b
        p++
      } else if (b === 0xce) {
        tw[i] = (((buf[p + 1] as number) << 24) | ((buf[p + 2] as number) << 16) | ((buf[p + 3] as number) << 8) | (buf[p + 4] as number)) >>> 0
        p += 5
      } else if (b === 0xcd) {
        tw[i] = ((buf[p + 1] as number) << 8) | (buf[p + 2] as number)
        p += 3
      } else if (b === 0xcc) {
        tw[i] = buf[p + 1] as number
        p += 2
      } else {
        // any other spelling of an integer (signed, 64-bit, a float with no fraction)
        this.r.pos = p
        const t = this.numberOrNull()
        if ((t === null || t >>> 0 !== t) && this.badToken < 0) {
          this.badToken = i
          this.badValue = t === null ? this.unpackAt(p) : t
          this.r.pos = p
          this.r.skip()
        }
        if (t !== null) tw[i] = t >>> 0
        p = this.r.pos
      }
    }
    if (p > this.r.end) throw truncated()
    this.r.pos = p
    this.tokenCount = words
  }

  /** One block hash at pos into lo/hi: an int of any width and sign (its 64 bits), or bytes (the last 8, big-endian). */
  private u64(field: string): void {
    const buf = this.r.buf
    const p = this.r.pos
    const b = buf[p] as number
    if (b <= 0x7f) {
      this.lo = b
      this.hi = 0
      this.r.pos = p + 1
      return
    }
    if (b === 0xcf || b === 0xd3) {
      this.hi = this.r.u32At(p + 1)
      this.lo = this.r.u32At(p + 5)
      this.r.pos = p + 9
      return
    }
    if (b >= 0xe0 || (b >= 0xcc && b <= 0xce) || (b >= 0xd0 && b <= 0xd2)) {
      const v = this.numberOrNull() as number
      this.lo = v >>> 0
      this.hi = v < 0 ? 0xffffffff : 0
      return
    }
    if (b >= 0xc4 && b <= 0xc6) {
      this.r.binHeader()
      const len = this.r.len
      if (len === 0) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} is empty bytes`)
      let hi = 0
      let lo = 0
      for (let i = this.r.pos + Math.max(0, len - 8); i < this.r.pos + len; i++) {
        hi = ((hi << 8) | (lo >>> 24)) >>> 0
        lo = ((lo << 8) | (buf[i] as number)) >>> 0
      }
      this.lo = lo
      this.hi = hi
      this.r.pos += len
      return
    }
    if (b === 0xca || b === 0xcb) {
      const v = this.numberOrNull() as number
      if (!Number.isInteger(v)) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} must be an integer, got ${v}`)
      if (v >= 2 ** 64 || v < -(2 ** 63)) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} does not fit 64 bits`)
      const u = BigInt.asUintN(64, BigInt(v))
      this.lo = Number(u & 0xffffffffn)
      this.hi = Number(u >> 32n)
      return
    }
    throw wrongType(field, 'an integer or bytes', kindName(b))
  }

  /** A number at pos (ints exact up to 2^53, beyond as the nearest double), or null when it is no number; moves past it either way. */
  private numberOrNull(): number | null {
    const buf = this.r.buf
    const p = this.r.pos
    const b = buf[p] as number
    let v: number | null
    let size = 1
    if (b <= 0x7f) v = b
    else if (b >= 0xe0) v = b - 0x100
    else if (b >= 0xcc && b <= 0xd3) {
      size = INT_BYTES[b - 0xcc] as number
      if (b === 0xcc) v = buf[p + 1] as number
      else if (b === 0xcd) v = ((buf[p + 1] as number) << 8) | (buf[p + 2] as number)
      else if (b === 0xce) v = this.r.u32At(p + 1)
      else if (b === 0xcf) v = this.r.u32At(p + 1) * 4294967296 + this.r.u32At(p + 5)
      else if (b === 0xd0) v = ((buf[p + 1] as number) << 24) >> 24
      else if (b === 0xd1) v = ((((buf[p + 1] as number) << 8) | (buf[p + 2] as number)) << 16) >> 16
      else if (b === 0xd2) v = this.r.u32At(p + 1) | 0
      else v = (this.r.u32At(p + 1) | 0) * 4294967296 + this.r.u32At(p + 5)
    } else if (b === 0xca || b === 0xcb) {
      const f = this.f8
      const n = b === 0xca ? 4 : 8
      for (let i = 0; i < n; i++) f.setUint8(i, buf[p + 1 + i] as number)
      v = b === 0xca ? f.getFloat32(0) : f.getFloat64(0)
      size = n + 1
    } else {
      this.r.skip()
      return null
    }
    this.r.pos = p + size
    return v
  }

  private number(field: string): number {
    const p = this.r.pos
    const v = this.numberOrNull()
    if (v === null) throw wrongType(field, 'a number', kindName(this.r.buf[p]))
    return v
  }

  /** The extra keys at p: null when absent, null or a list of nulls (nothing to hash), else the list unpacked. */
  private extraKeys(p: number): readonly unknown[] | null {
    if (p < 0 || this.r.buf[p] === 0xc0) return null
    this.r.pos = p
    if (!this.r.arrayHeader()) throw wrongType('extra_keys', 'an array', kindName(this.r.buf[p]))
    const n = this.r.len
    for (let i = 0; i < n; i++) if (this.r.buf[this.r.pos++] !== 0xc0) return arrayField(this.unpackAt(p), 'extra_keys')
    return null
  }

  private tierAt(p: number): number {
    if (p < 0 || this.r.buf[p] === 0xc0 || this.r.isStringAt(p, S_GPU)) return StorageTier.Device
    return tierOf(this.isStringOrNil(p) ? this.stringAt(p) : this.unpackAt(p))
  }

  private optStringAt(p: number, field: string): string | null {
    if (p < 0) return null
    return optString(this.isStringOrNil(p) ? this.stringAt(p) : this.unpackAt(p), field)
  }

  /** The string (or null) at p. */
  private stringAt(p: number): string | null {
    if (this.r.buf[p] === 0xc0) return null
    this.r.pos = p
    this.r.strHeader()
    return text.decode(this.r.buf.subarray(this.r.pos, this.r.pos + this.r.len))
  }

  /** Any value at p as msgpackr makes it: for the rare fields read whole. */
  private unpackAt(p: number): unknown {
    this.r.pos = p
    this.r.skip()
    try {
      return this.unpackr.unpack(this.r.buf.subarray(p, this.r.pos))
    } catch (err) {
      throw new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', `the batch does not decode: ${(err as Error).message}`)
    }
  }

  private kindAt(p: number): unknown {
    return p < 0 ? undefined : kindName(this.r.buf[p])
  }

  // ---- headers ----

  private isStringOrNil(p: number): boolean {
    const b = this.r.buf[p] as number
    return b === 0xc0 || (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb)
  }

  private isMapAt(p: number): boolean {
    if (p < 0) return false
    const b = this.r.buf[p] as number
    return (b >= 0x80 && b <= 0x8f) || b === 0xde || b === 0xdf
  }

  private keyIs(p: number, lit: Uint8Array): boolean {
    return this.r.isStringAt(p, lit)
  }

  /** The field slot a map key at p names, -1 for keys not read. */
  private eventKey(p: number): number {
    const save = this.r.pos
    this.r.pos = p
    let f = -1
    if (this.r.strHeader()) {
      const cands = KEYS_BY_LENGTH[this.r.len]
      if (cands !== undefined) {
        for (const [lit, slot] of cands) {
          if (this.r.bytesAre(this.r.pos, lit)) {
            f = slot
            break
          }
        }
      }
    }
    this.r.pos = save
    return f
  }
}
