// Dynamo's own KV events as MessagePack, the encoding of Dynamo's event plane on NATS (and ZMQ):
// an envelope `{publisher_id, sequence, published_at, topic, payload: bin}` whose payload is a
// `RouterEvent`, both written by rmp_serde as maps keyed by field name
// (lib/runtime/src/transports/event_plane/codec.rs, dynamo-runtime 0.9.0 to 1.4.0). A bare
// RouterEvent is taken too. Dynamo's reader (rmp_serde::from_slice) also takes every struct as a
// positional array, a form Dynamo's own comments call legacy; this decoder does the same. The
// schema is walked by router-event-walker.ts, as the JSON is; this module is its MessagePack
// reader, over the shared cursor of msgpack-reader.ts. It runs in the indexer shards on every
// event, so it reads the bytes in place, u64 values as u32 halves, with no allocation per block.
import { KvrError, type ErrorCode } from '../errors.js'
import type { DecodedEvent } from './decoded-event.js'
import { EventDecoder } from './event-decoder.js'
import { MpKind, MsgpackCursor, mpKindOf } from './msgpack-reader.js'
import { type EventReader, K, type ValueKind, WalkingDecoder } from './router-event-walker.js'

/**
 * Whether a message's first byte starts MessagePack rather than JSON: every JSON text starts
 * with an ASCII byte, and every MessagePack map, array or string marker is at 0x80 or above.
 */
export function isMsgpackLead(first: number): boolean {
  return first >= 0x80
}

const MAX_DEPTH = 64
/** The block keys as fixstr (type byte, then the name). */
const FIX_BLOCK_HASH = Uint8Array.of(0xa0 | K.block_hash.length, ...K.block_hash)
const FIX_TOKENS_HASH = Uint8Array.of(0xa0 | K.tokens_hash.length, ...K.tokens_hash)
const textDecoder = new TextDecoder()

class MsgpackEventReader extends MsgpackCursor implements EventReader {
  numLo = 0
  numHi = 0
  readonly mapWord = 'a map'
  private keyStart = 0
  private keyLen = 0
  private payloadAt = 0
  private payloadEnd = 0
  private savePos = 0
  private saveEnd = 0
  private inPayload = false

  constructor() {
    super(MAX_DEPTH)
  }

  begin(bytes: Uint8Array): void {
    this.reset(bytes)
    this.inPayload = false
    if (this.end === 0) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'empty input')
    const k = mpKindOf(bytes[0] as number)
    if (k !== MpKind.Map && k !== MpKind.Array) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'the event must be a MessagePack map or array')
  }

  finish(): void {
    if (this.pos !== this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'unexpected data after the event')
  }

  private peekKind(): number {
    if (this.pos >= this.end) throw this.truncated()
    return mpKindOf(this.buf[this.pos] as number)
  }

  isPositional(): boolean {
    return this.peekKind() === MpKind.Array
  }

  peek(): ValueKind {
    return this.peekKind() as ValueKind
  }

  /** A map's entry count; each entry takes at least two bytes, so a count the rest cannot hold is refused before it is used. */
  openMap(what: string): number {
    if (this.pos >= this.end) throw this.truncated()
    if (!this.mapHeader()) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `${what} must be a map or an array`)
    if (this.len > (this.end - this.pos) / 2) throw this.truncated()
    return this.len
  }

  /** Reads key i when there is one; a key that is no string is passed over and matches no name. */
  nextKey(n: number, i: number): boolean {
    if (i >= n) return false
    if (this.pos >= this.end) throw this.truncated()
    if (this.strHeader()) {
      this.keyStart = this.pos
      this.keyLen = this.len
      this.advance(this.len)
    } else {
      this.skip()
      this.keyLen = -1
    }
    return true
  }

  /** An array's length; each element takes at least a byte, likewise. */
  openArray(field: string): number {
    if (this.pos >= this.end) throw this.truncated()
    if (!this.arrayHeader()) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be an array`)
    if (this.len > this.end - this.pos) throw this.truncated()
    return this.len
  }

  nextElement(n: number, i: number): boolean {
    return i < n
  }

  keyIs(k: Uint8Array): boolean {
    return this.keyLen === k.length && this.bytesAre(this.keyStart, k)
  }

  keyText(): string {
    return this.keyLen < 0 ? '' : textDecoder.decode(this.buf.subarray(this.keyStart, this.keyStart + this.keyLen))
  }

  string(field: string): void {
    if (this.pos >= this.end) throw this.truncated()
    if (!this.strHeader()) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be a string`)
    this.keyStart = this.pos
    this.keyLen = this.len
    this.advance(this.len)
  }

  nil(): boolean {
    if (this.pos >= this.end) throw this.truncated()
    if (this.buf[this.pos] !== 0xc0) return false
    this.pos++
    return true
  }

  /**
   * A block as rmp_serde writes it, [block_hash, tokens_hash, …] or {block_hash, tokens_hash,
   * mm_extra_info?} with the keys in that order: read without the general walk's per-key calls
   * (a block is most of an event's bytes). Anything else, pos unchanged, goes the general way.
   */
  fastBlocks(out: DecodedEvent, i: number, n: number, interrupt: (() => void) | null): number {
    for (; i < n; i++) {
      out.ensure(i + 1)
      if (!this.fastBlock(out, i)) return i
      if ((i & 15) === 15 && interrupt !== null) interrupt()
    }
    return i
  }

  fastHashes(out: DecodedEvent, i: number, n: number, interrupt: (() => void) | null): number {
    for (; i < n; i++) {
      out.ensure(i + 1)
      this.u64('block_hashes[]')
      out.blockLo[i] = this.numLo
      out.blockHi[i] = this.numHi
      if ((i & 15) === 15 && interrupt !== null) interrupt()
    }
    return i
  }

  private fastBlock(out: DecodedEvent, i: number): boolean {
    const start = this.pos
    const b = this.buf[start] as number
    if (b >= 0x92 && b <= 0x9f) {
      this.pos = start + 1
      this.u64('block_hash')
      out.blockLo[i] = this.numLo
      out.blockHi[i] = this.numHi
      this.u64('tokens_hash')
      out.tokensLo[i] = this.numLo
      out.tokensHi[i] = this.numHi
      for (let j = 2, m = b & 0x0f; j < m; j++) this.skip()
      return true
    }
    if ((b !== 0x82 && b !== 0x83) || !this.bytesAre(start + 1, FIX_BLOCK_HASH)) return false
    this.pos = start + 1 + FIX_BLOCK_HASH.length
    this.u64('block_hash')
    const lo = this.numLo
    const hi = this.numHi
    if (!this.bytesAre(this.pos, FIX_TOKENS_HASH)) {
      this.pos = start
      return false
    }
    this.pos += FIX_TOKENS_HASH.length
    this.u64('tokens_hash')
    out.blockLo[i] = lo
    out.blockHi[i] = hi
    out.tokensLo[i] = this.numLo
    out.tokensHi[i] = this.numHi
    if (b === 0x83) {
      // a third key: mm_extra_info or any other, passed over as the general walk would
      this.skip()
      this.skip()
    }
    return true
  }

  payload(): void {
    if (this.pos >= this.end) throw this.truncated()
    if (!this.binHeader()) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'field "payload" must be bytes (MessagePack bin)')
    this.payloadAt = this.pos
    this.advance(this.len)
    this.payloadEnd = this.pos
  }

  enterPayload(): void {
    this.savePos = this.pos
    this.saveEnd = this.end
    this.pos = this.payloadAt
    this.end = this.payloadEnd
    this.inPayload = true
    const k = this.pos < this.end ? mpKindOf(this.buf[this.pos] as number) : MpKind.Other
    if (k !== MpKind.Map && k !== MpKind.Array) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'the payload must be a MessagePack map or array')
  }

  leavePayload(): void {
    if (this.pos !== this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'unexpected data after the payload event')
    this.inPayload = false
    this.pos = this.savePos
    this.end = this.saveEnd
  }

  private advance(n: number): void {
    if (n > this.end - this.pos) throw this.truncated()
    this.pos += n
  }

  /** A big-endian unsigned integer of `bytes` bytes (1, 2 or 4) at pos. */
  private uint(bytes: number): number {
    if (this.end - this.pos < bytes) throw this.truncated()
    const p = this.pos
    this.pos = p + bytes
    if (bytes === 1) return this.buf[p] as number
    if (bytes === 2) return this.u16At(p)
    return this.u32At(p)
  }

  /**
   * An unsigned integer up to 2^64-1 into numLo/numHi: any unsigned width, or a signed one
   * holding a value of at least 0 (serde reads those as u64 too).
   */
  u64(field: string): void {
    if (this.pos >= this.end) throw this.truncated()
    const m = this.buf[this.pos] as number
    if (m <= 0x7f) {
      this.pos++
      this.numLo = m
      this.numHi = 0
      return
    }
    let negative = false
    if ((m >= 0xcc && m <= 0xce) || (m >= 0xd0 && m <= 0xd2)) {
      // 8, 16 or 32 bits, unsigned (0xcc…) or signed (0xd0…)
      const bytes = 1 << (m & 3)
      this.pos++
      this.numLo = this.uint(bytes)
      this.numHi = 0
      negative = m >= 0xd0 && this.numLo >= 2 ** (8 * bytes - 1)
    } else if (m === 0xcf || m === 0xd3) {
      // 64 bits: most hashes
      const p = this.pos + 1
      if (this.end - p < 8) {
        this.pos = p
        throw this.truncated()
      }
      this.numHi = this.u32At(p)
      this.numLo = this.u32At(p + 4)
      this.pos = p + 8
      negative = m === 0xd3 && this.numHi >= 0x80000000
    } else if (m >= 0xe0) negative = true
    else if (m === 0xc1) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'byte 0xc1 is never used in MessagePack')
    else throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be an unsigned integer`)
    if (negative) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must not be negative`)
  }

  truncated(): KvrError {
    return this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'truncated input')
  }

  malformed(what: string): KvrError {
    return this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', what)
  }

  fail(code: ErrorCode, message: string): KvrError {
    return new KvrError(code, `${this.inPayload ? 'in envelope payload: ' : ''}${message} (at byte ${this.pos})`)
  }
}

/** Dynamo's MessagePack RouterEvents and envelopes, walked into a DecodedEvent. */
export class DynamoMsgpackDecoder extends WalkingDecoder {
  constructor() {
    super(new MsgpackEventReader())
  }
}

/**
 * The shards' decoder for event messages in either encoding Dynamo workers publish: JSON
 * (EventDecoder) or MessagePack (DynamoMsgpackDecoder), told apart by the first byte.
 */
export class RouterEventDecoder {
  readonly json = new EventDecoder()
  readonly msgpack = new DynamoMsgpackDecoder()

  get interrupt(): (() => void) | null {
    return this.json.interrupt
  }

  /** Called every 16 blocks of a long event, whatever its encoding. */
  set interrupt(f: (() => void) | null) {
    this.json.interrupt = f
    this.msgpack.interrupt = f
  }

  decode(bytes: Uint8Array): DecodedEvent {
    return bytes.length > 0 && isMsgpackLead(bytes[0] as number) ? this.msgpack.decode(bytes) : this.json.decode(bytes)
  }
}
