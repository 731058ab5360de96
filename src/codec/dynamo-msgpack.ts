// Dynamo's own KV events as MessagePack, the encoding of Dynamo's event plane on NATS (and ZMQ):
// an envelope `{publisher_id, sequence, published_at, topic, payload: bin}` whose payload is a
// `RouterEvent`, both written by rmp_serde as maps keyed by field name
// (lib/runtime/src/transports/event_plane/codec.rs, dynamo-runtime 0.9.0 to 1.4.0). A bare
// RouterEvent is taken too. Dynamo's reader (rmp_serde::from_slice) also takes every struct as a
// positional array, a form Dynamo's own comments call legacy; this decoder does the same:
//
//   RouterEvent   {worker_id, storage_tier?, residency_domain?, event, state_source?}
//                 | [worker_id, storage_tier?, residency_domain?, event, state_source?]
//   event         {event_id, data, dp_rank?} | [event_id, data, dp_rank?]
//   data          "cleared" | {"stored": store} | {"removed": remove}   ({"cleared": nil} too)
//   store         {parent_hash, start_position?, blocks} | [parent_hash, start_position?, blocks]
//   block         {block_hash, tokens_hash, mm_extra_info?} | [block_hash, tokens_hash, …]
//   remove        {block_hashes} | [block_hashes]
//   envelope      as a map, or [publisher_id, sequence, published_at, topic, payload, …]
//
// In the positional form the optional fields are told apart by type (a string or nil before the
// event is the tier, then the residency domain; the first map or array is the event). Unknown
// keys and trailing elements are skipped, as serde does. It runs in the indexer shards on every
// event, so it reads the bytes in place into one reusable DecodedEvent, u64 values as u32 halves,
// with no allocation per block.
import { KvrError, type ErrorCode } from '../errors.js'
import { DecodedEvent, EventDecoder, EventKind, StorageTier } from './event-decoder.js'

/**
 * Whether a message's first byte starts MessagePack rather than JSON: every JSON text starts
 * with an ASCII byte, and every MessagePack map, array or string marker is at 0x80 or above.
 */
export function isMsgpackLead(first: number): boolean {
  return first >= 0x80
}

function ascii(s: string): Uint8Array {
  return new TextEncoder().encode(s)
}

const K = {
  worker_id: ascii('worker_id'),
  event: ascii('event'),
  storage_tier: ascii('storage_tier'),
  event_id: ascii('event_id'),
  data: ascii('data'),
  dp_rank: ascii('dp_rank'),
  stored: ascii('stored'),
  removed: ascii('removed'),
  cleared: ascii('cleared'),
  parent_hash: ascii('parent_hash'),
  blocks: ascii('blocks'),
  block_hash: ascii('block_hash'),
  tokens_hash: ascii('tokens_hash'),
  block_hashes: ascii('block_hashes'),
  publisher_id: ascii('publisher_id'),
  sequence: ascii('sequence'),
  payload: ascii('payload'),
  device: ascii('device'),
  host_pinned: ascii('host_pinned'),
  disk: ascii('disk'),
  external: ascii('external'),
} as const

/** What a value is, from its first byte. */
const T_INT = 1
const T_NIL = 2
const T_STR = 3
const T_BIN = 4
const T_ARRAY = 5
const T_MAP = 6
const T_OTHER = 7

function kindOf(m: number): number {
  if (m <= 0x7f || m >= 0xe0) return T_INT
  if (m <= 0x8f) return T_MAP
  if (m <= 0x9f) return T_ARRAY
  if (m <= 0xbf) return T_STR
  if (m === 0xc0) return T_NIL
  if (m >= 0xc4 && m <= 0xc6) return T_BIN
  if (m >= 0xcc && m <= 0xd3) return T_INT
  if (m >= 0xd9 && m <= 0xdb) return T_STR
  if (m === 0xdc || m === 0xdd) return T_ARRAY
  if (m === 0xde || m === 0xdf) return T_MAP
  return T_OTHER
}

const MAX_DEPTH = 64

/**
 * Reusable decoder. `decode(bytes)` fills `out` (and returns it) or throws a KvrError naming the
 * field and byte offset. Not re-entrant: one decoder per thread.
 */
export class DynamoMsgpackDecoder {
  readonly out = new DecodedEvent()
  /** Called every 16 blocks of a long event, as EventDecoder does (a shard answers queries there). */
  interrupt: (() => void) | null = null
  private o: DecodedEvent = this.out
  private buf: Uint8Array = new Uint8Array(0)
  private pos = 0
  private end = 0
  private keyStart = 0
  private keyLen = 0
  private numLo = 0
  private numHi = 0
  private inPayload = false

  decode(bytes: Uint8Array, out: DecodedEvent = this.out): DecodedEvent {
    out.reset()
    this.o = out
    this.buf = bytes
    this.pos = 0
    this.end = bytes.length
    this.inPayload = false
    if (this.end === 0) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'empty input')
    const k = kindOf(bytes[0] as number)
    if (k === T_MAP) this.eventMap(true)
    else if (k === T_ARRAY) this.topArray()
    else throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'the event must be a MessagePack map or array')
    if (this.pos !== this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'unexpected data after the event')
    return out
  }

  // --- structure ---------------------------------------------------------------------------

  /**
   * A RouterEvent map; at the top level it may instead be the envelope, whose keys are then read
   * too (inside a payload they are unknown keys, skipped).
   */
  private eventMap(envelopeAllowed: boolean): void {
    const out = this.o
    const n = this.mapHeader('the event')
    let sawWorker = false
    let sawEvent = false
    let sawPublisher = false
    let sawSequence = false
    let payloadAt = -1
    let payloadEnd = -1
    for (let i = 0; i < n; i++) {
      if (!this.key()) {
        this.skip(0)
      } else if (this.keyIs(K.worker_id)) {
        this.u64('worker_id')
        out.workerLo = this.numLo
        out.workerHi = this.numHi
        sawWorker = true
      } else if (this.keyIs(K.event)) {
        this.kvCacheEvent()
        sawEvent = true
      } else if (this.keyIs(K.storage_tier)) {
        this.storageTier()
      } else if (!envelopeAllowed) {
        this.skip(0)
      } else if (this.keyIs(K.publisher_id)) {
        this.u64('publisher_id')
        out.publisherLo = this.numLo
        out.publisherHi = this.numHi
        sawPublisher = true
      } else if (this.keyIs(K.sequence)) {
        this.u64('sequence')
        out.sequenceLo = this.numLo
        out.sequenceHi = this.numHi
        sawSequence = true
      } else if (this.keyIs(K.payload)) {
        const len = this.binHeader('payload')
        payloadAt = this.pos
        this.advance(len)
        payloadEnd = this.pos
      } else {
        this.skip(0)
      }
    }
    if (payloadAt >= 0) {
      if (sawWorker || sawEvent) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'an envelope must not also carry worker_id or event at its top level')
      if (!sawPublisher) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'envelope field "publisher_id" is missing')
      if (!sawSequence) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'envelope field "sequence" is missing')
      this.payload(payloadAt, payloadEnd)
      return
    }
    if (!sawWorker) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "worker_id" is missing')
    if (!sawEvent) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event" is missing')
  }

  /** A top-level array: a positional envelope when its second element is an integer, else a RouterEvent. */
  private topArray(): void {
    const out = this.o
    const n = this.arrayHeader('the event')
    if (n === 0) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "worker_id" is missing')
    this.u64('worker_id')
    if (n < 2 || this.peekKind() !== T_INT) {
      out.workerLo = this.numLo
      out.workerHi = this.numHi
      this.eventArrayRest(n - 1)
      return
    }
    out.publisherLo = this.numLo
    out.publisherHi = this.numHi
    this.u64('sequence')
    out.sequenceLo = this.numLo
    out.sequenceHi = this.numHi
    if (n < 5) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'envelope field "payload" is missing')
    this.skip(0)
    this.skip(0)
    const len = this.binHeader('payload')
    const at = this.pos
    this.advance(len)
    for (let i = 5; i < n; i++) this.skip(0)
    this.payload(at, at + len)
  }

  /** The envelope's payload bytes [at, end), which must hold exactly one RouterEvent. */
  private payload(at: number, end: number): void {
    this.o.hasEnvelope = true
    const savePos = this.pos
    const saveEnd = this.end
    this.pos = at
    this.end = end
    this.inPayload = true
    try {
      const k = at < end ? kindOf(this.buf[at] as number) : T_OTHER
      if (k === T_MAP) this.eventMap(false)
      else if (k === T_ARRAY) this.eventArray()
      else throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'the payload must be a MessagePack map or array')
      if (this.pos !== this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'unexpected data after the payload event')
    } finally {
      this.inPayload = false
      this.pos = savePos
      this.end = saveEnd
    }
  }

  private eventArray(): void {
    const n = this.arrayHeader('the event')
    if (n === 0) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "worker_id" is missing')
    this.u64('worker_id')
    this.o.workerLo = this.numLo
    this.o.workerHi = this.numHi
    this.eventArrayRest(n - 1)
  }

  /** The n elements after worker_id of a positional RouterEvent. */
  private eventArrayRest(n: number): void {
    let sawTier = false
    let sawEvent = false
    for (let i = 0; i < n; i++) {
      if (sawEvent) {
        this.skip(0)
        continue
      }
      const k = this.peekKind()
      if (k === T_STR || k === T_NIL) {
        // the tier, then the residency domain (not used: every event here is a worker's own)
        if (sawTier) this.skip(0)
        else this.storageTier()
        sawTier = true
      } else if (k === T_MAP || k === T_ARRAY) {
        this.kvCacheEvent()
        sawEvent = true
      } else {
        throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'a positional RouterEvent holds worker_id, storage_tier, residency_domain, then the event')
      }
    }
    if (!sawEvent) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event" is missing')
  }

  private storageTier(): void {
    if (this.nil()) return
    if (this.peekKind() !== T_STR) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'field "storage_tier" must be a string')
    this.key()
    if (this.keyIs(K.device)) this.o.tier = StorageTier.Device
    else if (this.keyIs(K.host_pinned)) this.o.tier = StorageTier.HostPinned
    else if (this.keyIs(K.disk)) this.o.tier = StorageTier.Disk
    else if (this.keyIs(K.external)) this.o.tier = StorageTier.External
    else throw this.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', `unknown storage_tier "${this.keyText()}"`)
  }

  private kvCacheEvent(): void {
    const out = this.o
    let sawId = false
    let sawData = false
    if (this.peekKind() === T_ARRAY) {
      const n = this.arrayHeader('event')
      if (n < 2) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', n === 0 ? 'field "event.event_id" is missing' : 'field "event.data" is missing')
      this.u64('event_id')
      out.eventIdLo = this.numLo
      out.eventIdHi = this.numHi
      this.eventData()
      if (n > 2) this.dpRank()
      for (let i = 3; i < n; i++) this.skip(0)
      return
    }
    const n = this.mapHeader('event')
    for (let i = 0; i < n; i++) {
      if (!this.key()) {
        this.skip(0)
      } else if (this.keyIs(K.event_id)) {
        this.u64('event_id')
        out.eventIdLo = this.numLo
        out.eventIdHi = this.numHi
        sawId = true
      } else if (this.keyIs(K.data)) {
        this.eventData()
        sawData = true
      } else if (this.keyIs(K.dp_rank)) {
        this.dpRank()
      } else {
        this.skip(0)
      }
    }
    if (!sawId) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event.event_id" is missing')
    if (!sawData) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event.data" is missing')
  }

  private dpRank(): void {
    if (this.nil()) {
      this.o.dpRank = 0
      return
    }
    this.u64('dp_rank')
    if (this.numHi !== 0) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', 'dp_rank must fit in u32')
    this.o.dpRank = this.numLo
  }

  /** Externally tagged: "cleared" (a unit variant is its name) | {"stored": …} | {"removed": …}. */
  private eventData(): void {
    const k = this.peekKind()
    if (k === T_STR) {
      this.key()
      if (!this.keyIs(K.cleared)) throw this.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', `unknown event variant "${this.keyText()}"`)
      this.o.kind = EventKind.Cleared
      return
    }
    if (k !== T_MAP) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'field "event.data" must be a map or "cleared"')
    const n = this.mapHeader('event.data')
    if (n !== 1) throw this.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', 'event.data must name exactly one variant')
    if (!this.key()) throw this.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', 'event.data names no variant')
    if (this.keyIs(K.stored)) {
      this.o.kind = EventKind.Stored
      this.storedData()
    } else if (this.keyIs(K.removed)) {
      this.o.kind = EventKind.Removed
      this.removedData()
    } else if (this.keyIs(K.cleared)) {
      this.o.kind = EventKind.Cleared
      this.skip(0)
    } else {
      throw this.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', `unknown event variant "${this.keyText()}"`)
    }
  }

  private parentHash(): void {
    const out = this.o
    if (this.nil()) {
      out.hasParent = false
      return
    }
    this.u64('parent_hash')
    out.hasParent = true
    out.parentLo = this.numLo
    out.parentHi = this.numHi
  }

  private storedData(): void {
    let sawBlocks = false
    if (this.peekKind() === T_ARRAY) {
      // [parent_hash, start_position?, blocks, …]: the blocks are the first array after the parent
      const n = this.arrayHeader('stored')
      if (n > 0) this.parentHash()
      for (let i = 1; i < n; i++) {
        if (!sawBlocks && this.peekKind() === T_ARRAY) {
          this.storedBlocks()
          sawBlocks = true
        } else {
          this.skip(0)
        }
      }
    } else {
      const n = this.mapHeader('stored')
      for (let i = 0; i < n; i++) {
        if (!this.key()) this.skip(0)
        else if (this.keyIs(K.parent_hash)) this.parentHash()
        else if (this.keyIs(K.blocks)) {
          this.storedBlocks()
          sawBlocks = true
        } else this.skip(0)
      }
    }
    if (!sawBlocks) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "stored.blocks" is missing')
  }

  private storedBlocks(): void {
    const out = this.o
    const n = this.arrayHeader('stored.blocks')
    out.ensure(n)
    for (let i = 0; i < n; i++) {
      if ((i & 15) === 15 && this.interrupt !== null) this.interrupt()
      let sawBlock = false
      let sawTokens = false
      if (this.peekKind() === T_ARRAY) {
        const m = this.arrayHeader('stored block')
        if (m > 0) {
          this.u64('block_hash')
          out.blockLo[i] = this.numLo
          out.blockHi[i] = this.numHi
          sawBlock = true
        }
        if (m > 1) {
          this.u64('tokens_hash')
          out.tokensLo[i] = this.numLo
          out.tokensHi[i] = this.numHi
          sawTokens = true
        }
        for (let j = 2; j < m; j++) this.skip(0)
      } else {
        const m = this.mapHeader('stored block')
        for (let j = 0; j < m; j++) {
          if (!this.key()) {
            this.skip(0)
          } else if (this.keyIs(K.block_hash)) {
            this.u64('block_hash')
            out.blockLo[i] = this.numLo
            out.blockHi[i] = this.numHi
            sawBlock = true
          } else if (this.keyIs(K.tokens_hash)) {
            this.u64('tokens_hash')
            out.tokensLo[i] = this.numLo
            out.tokensHi[i] = this.numHi
            sawTokens = true
          } else {
            this.skip(0)
          }
        }
      }
      if (!sawBlock) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', `field "blocks[${i}].block_hash" is missing`)
      if (!sawTokens) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', `field "blocks[${i}].tokens_hash" is missing`)
    }
    out.count = n
  }

  private removedData(): void {
    let saw = false
    if (this.peekKind() === T_ARRAY) {
      const n = this.arrayHeader('removed')
      if (n > 0) {
        this.blockHashes()
        saw = true
      }
      for (let i = 1; i < n; i++) this.skip(0)
    } else {
      const n = this.mapHeader('removed')
      for (let i = 0; i < n; i++) {
        if (this.key() && this.keyIs(K.block_hashes)) {
          this.blockHashes()
          saw = true
        } else {
          this.skip(0)
        }
      }
    }
    if (!saw) throw this.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "removed.block_hashes" is missing')
  }

  private blockHashes(): void {
    const out = this.o
    const n = this.arrayHeader('removed.block_hashes')
    out.ensure(n)
    for (let i = 0; i < n; i++) {
      if ((i & 15) === 15 && this.interrupt !== null) this.interrupt()
      this.u64('block_hashes[]')
      out.blockLo[i] = this.numLo
      out.blockHi[i] = this.numHi
    }
    out.count = n
  }

  // --- values ------------------------------------------------------------------------------

  private peekKind(): number {
    if (this.pos >= this.end) throw this.truncated()
    return kindOf(this.buf[this.pos] as number)
  }

  /** Consumes a nil; false (nothing consumed) for anything else. */
  private nil(): boolean {
    if (this.pos >= this.end) throw this.truncated()
    if (this.buf[this.pos] !== 0xc0) return false
    this.pos++
    return true
  }

  private advance(n: number): void {
    if (n > this.end - this.pos) throw this.truncated()
    this.pos += n
  }

  private u8(): number {
    if (this.pos >= this.end) throw this.truncated()
    return this.buf[this.pos++] as number
  }

  private u16(): number {
    if (this.end - this.pos < 2) throw this.truncated()
    const b = this.buf
    const p = this.pos
    this.pos = p + 2
    return ((b[p] as number) << 8) | (b[p + 1] as number)
  }

  private u32(): number {
    if (this.end - this.pos < 4) throw this.truncated()
    const b = this.buf
    const p = this.pos
    this.pos = p + 4
    return (((b[p] as number) << 24) | ((b[p + 1] as number) << 16) | ((b[p + 2] as number) << 8) | (b[p + 3] as number)) >>> 0
  }

  /**
   * An array's length; each element takes at least a byte, so a length the rest of the input
   * cannot hold is refused before anything is sized by it.
   */
  private arrayHeader(field: string): number {
    if (this.pos >= this.end) throw this.truncated()
    const m = this.buf[this.pos] as number
    let n: number
    if (m >= 0x90 && m <= 0x9f) {
      this.pos++
      n = m & 0x0f
    } else if (m === 0xdc) {
      this.pos++
      n = this.u16()
    } else if (m === 0xdd) {
      this.pos++
      n = this.u32()
    } else {
      throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be an array`)
    }
    if (n > this.end - this.pos) throw this.truncated()
    return n
  }

  private mapHeader(field: string): number {
    if (this.pos >= this.end) throw this.truncated()
    const m = this.buf[this.pos] as number
    let n: number
    if (m >= 0x80 && m <= 0x8f) {
      this.pos++
      n = m & 0x0f
    } else if (m === 0xde) {
      this.pos++
      n = this.u16()
    } else if (m === 0xdf) {
      this.pos++
      n = this.u32()
    } else {
      throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `${field} must be a map or an array`)
    }
    if (n > (this.end - this.pos) / 2) throw this.truncated()
    return n
  }

  private binHeader(field: string): number {
    if (this.pos >= this.end) throw this.truncated()
    const m = this.buf[this.pos] as number
    this.pos++
    if (m === 0xc4) return this.u8()
    if (m === 0xc5) return this.u16()
    if (m === 0xc6) return this.u32()
    this.pos--
    throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be bytes (MessagePack bin)`)
  }

  /** A string into keyStart/keyLen (its bytes, in place); false and skipped for any other value. */
  private key(): boolean {
    if (this.pos >= this.end) throw this.truncated()
    const m = this.buf[this.pos] as number
    let n: number
    if (m >= 0xa0 && m <= 0xbf) {
      this.pos++
      n = m & 0x1f
    } else if (m === 0xd9) {
      this.pos++
      n = this.u8()
    } else if (m === 0xda) {
      this.pos++
      n = this.u16()
    } else if (m === 0xdb) {
      this.pos++
      n = this.u32()
    } else {
      this.skip(0)
      return false
    }
    this.keyStart = this.pos
    this.keyLen = n
    this.advance(n)
    return true
  }

  private keyIs(k: Uint8Array): boolean {
    const len = this.keyLen
    if (len !== k.length) return false
    const b = this.buf
    const at = this.keyStart
    for (let i = 0; i < len; i++) if (b[at + i] !== k[i]) return false
    return true
  }

  private keyText(): string {
    return new TextDecoder().decode(this.buf.subarray(this.keyStart, this.keyStart + this.keyLen))
  }

  /**
   * An unsigned integer up to 2^64-1 into numLo/numHi: any unsigned width, or a signed one
   * holding a value of at least 0 (serde reads those as u64 too).
   */
  private u64(field: string): void {
    if (this.pos >= this.end) throw this.truncated()
    const m = this.buf[this.pos] as number
    if (m <= 0x7f) {
      this.pos++
      this.numLo = m
      this.numHi = 0
      return
    }
    const b = this.buf
    let negative = false
    switch (m) {
      case 0xcc:
      case 0xd0:
        this.pos++
        this.numLo = this.u8()
        this.numHi = 0
        negative = m === 0xd0 && this.numLo >= 0x80
        break
      case 0xcd:
      case 0xd1:
        this.pos++
        this.numLo = this.u16()
        this.numHi = 0
        negative = m === 0xd1 && this.numLo >= 0x8000
        break
      case 0xce:
      case 0xd2:
        this.pos++
        this.numLo = this.u32()
        this.numHi = 0
        negative = m === 0xd2 && this.numLo >= 0x80000000
        break
      case 0xcf:
      case 0xd3:
        this.pos++
        negative = m === 0xd3 && this.pos < this.end && (b[this.pos] as number) >= 0x80
        this.numHi = this.u32()
        this.numLo = this.u32()
        break
      default:
        if (m >= 0xe0) negative = true
        else if (m === 0xc1) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'byte 0xc1 is never used in MessagePack')
        else throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be an unsigned integer`)
    }
    if (negative) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must not be negative`)
  }

  /** Skips (and checks the framing of) any value. */
  private skip(depth: number): void {
    if (depth > MAX_DEPTH) throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'nesting too deep')
    const m = this.u8()
    if (m <= 0x7f || m >= 0xe0) return
    if (m <= 0x8f) return this.skipN(2 * (m & 0x0f), depth)
    if (m <= 0x9f) return this.skipN(m & 0x0f, depth)
    if (m <= 0xbf) return this.advance(m & 0x1f)
    switch (m) {
      case 0xc0:
      case 0xc2:
      case 0xc3:
        return
      case 0xc4:
      case 0xd9:
        return this.advance(this.u8())
      case 0xc5:
      case 0xda:
        return this.advance(this.u16())
      case 0xc6:
      case 0xdb:
        return this.advance(this.u32())
      case 0xc7:
        return this.advance(this.u8() + 1)
      case 0xc8:
        return this.advance(this.u16() + 1)
      case 0xc9:
        return this.advance(this.u32() + 1)
      case 0xcc:
      case 0xd0:
        return this.advance(1)
      case 0xcd:
      case 0xd1:
        return this.advance(2)
      case 0xca:
      case 0xce:
      case 0xd2:
        return this.advance(4)
      case 0xcb:
      case 0xcf:
      case 0xd3:
        return this.advance(8)
      case 0xd4:
        return this.advance(2)
      case 0xd5:
        return this.advance(3)
      case 0xd6:
        return this.advance(5)
      case 0xd7:
        return this.advance(9)
      case 0xd8:
        return this.advance(17)
      case 0xdc:
        return this.skipN(this.u16(), depth)
      case 0xdd:
        return this.skipN(this.u32(), depth)
      case 0xde:
        return this.skipN(2 * this.u16(), depth)
      case 0xdf:
        return this.skipN(2 * this.u32(), depth)
      default:
        this.pos--
        throw this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'byte 0xc1 is never used in MessagePack')
    }
  }

  private skipN(n: number, depth: number): void {
    if (n > this.end - this.pos) throw this.truncated()
    for (let i = 0; i < n; i++) this.skip(depth + 1)
  }

  private truncated(): KvrError {
    return this.fail('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'truncated input')
  }

  private fail(code: ErrorCode, message: string): KvrError {
    return new KvrError(code, `${this.inPayload ? 'in envelope payload: ' : ''}${message} (at byte ${this.pos})`)
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
