// The RouterEvent schema, walked once for every encoding a Dynamo worker publishes it in (JSON in
// event-decoder.ts, MessagePack in dynamo-msgpack.ts): each format supplies an EventReader, a
// cursor that opens maps and arrays, reads keys, u64 values as u32 halves and skips what the
// schema does not name, and the walker fills one reused DecodedEvent from it. Unknown keys and
// trailing elements are skipped, as serde does; anything else that is not what the schema says
// is a KvrError from the reader, naming the field and byte offset.
//
//   envelope      {publisher_id, sequence, published_at, topic?, payload} | [same, by position]
//   RouterEvent   {worker_id, storage_tier?, residency_domain?, event, state_source?, session_id?} | [same, by position]
//   event         {event_id, data, dp_rank?} | [event_id, data, dp_rank?]
//   data          "cleared" | {"stored": store} | {"removed": remove}   ({"cleared": null} too)
//   store         {parent_hash, start_position?, blocks} | [parent_hash, start_position?, blocks]
//   block         {block_hash, tokens_hash, mm_extra_info?} | [block_hash, tokens_hash, …]
//   remove        {block_hashes} | [block_hashes]
//
// The positional forms are MessagePack's only (rmp_serde reads every struct so); a JSON reader
// never reports one. In them the optional fields are told apart by type: a string or nil before
// the event is the tier, then the residency domain; the first map or array is the event.
import type { ErrorCode, KvrError } from '../errors.js'
import { DecodedEvent, EventKind, StorageTier } from './decoded-event.js'

/** What a value is, as far as the schema tells values apart. */
export const ValueKind = { Int: 1, Nil: 2, Str: 3, Bin: 4, Array: 5, Map: 6, Other: 7 } as const
export type ValueKind = (typeof ValueKind)[keyof typeof ValueKind]

/** A cursor over one encoded RouterEvent, as the walker reads it. */
export interface EventReader {
  /** The last u64 read by u64(). */
  numLo: number
  numHi: number
  /** How the format names a map in messages: "an object", "a map". */
  readonly mapWord: string
  /** Checks the input's framing and puts the cursor on its first value. */
  begin(bytes: Uint8Array): void
  /** Checks that nothing follows the event. */
  finish(): void
  /** What the value at the cursor is (whitespace passed over). */
  peek(): ValueKind
  /** Whether the value at the cursor is a struct in positional form (never, for JSON). */
  isPositional(): boolean
  /** Opens a map: its entry count, or -1 when the format does not say ahead (JSON). */
  openMap(what: string): number
  /** Before entry i of a map of n entries: reads its key and returns true, or false at its end. */
  nextKey(n: number, i: number): boolean
  /** Opens an array: its length, or -1 when the format does not say ahead. */
  openArray(field: string): number
  /** Before element i of an array of n: true, or false at its end. */
  nextElement(n: number, i: number, field: string): boolean
  /** Whether the last key (or string read by string()) is these bytes. */
  keyIs(k: Uint8Array): boolean
  keyText(): string
  /** A string value, into the key slot. */
  string(field: string): void
  /** Consumes a nil (JSON null); false, nothing consumed, for anything else. */
  nil(): boolean
  /** An unsigned integer up to 2^64-1 into numLo/numHi. */
  u64(field: string): void
  skip(): void
  /**
   * Blocks i, i+1, … of a stored event's array of n (-1: the format does not say), each read whole
   * into out while it is in the layout the format's usual writer gives it, with out sized and
   * interrupt called as the walker's own block step does: the index of the first block not read,
   * the cursor before it (its separator too). One call per array keeps the per-block path free
   * of interface calls.
   */
  fastBlocks(out: DecodedEvent, i: number, n: number, interrupt: (() => void) | null): number
  /** The same for the hashes of a removed event. */
  fastHashes(out: DecodedEvent, i: number, n: number, interrupt: (() => void) | null): number
  /** The envelope's payload value, kept to be walked once the envelope's own fields are checked. */
  payload(): void
  enterPayload(): void
  /** Back to the envelope, after checking the payload held one event and nothing more. */
  leavePayload(): void
  fail(code: ErrorCode, message: string): KvrError
}

function ascii(s: string): Uint8Array {
  return new TextEncoder().encode(s)
}

/** The schema's names, as the bytes both formats spell them in. */
export const K = {
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
  published_at: ascii('published_at'),
  payload: ascii('payload'),
  device: ascii('device'),
  host_pinned: ascii('host_pinned'),
  disk: ascii('disk'),
  external: ascii('external'),
  residency_domain: ascii('residency_domain'),
  worker: ascii('worker'),
  cache_owner: ascii('cache_owner'),
} as const

export class RouterEventWalker {
  /**
   * Called every 16 blocks while a long event is decoded: a shard answers waiting queries
   * there, so a lookup never waits for a whole large message to be parsed.
   */
  interrupt: (() => void) | null = null
  private out: DecodedEvent

  constructor(
    private readonly r: EventReader,
    out: DecodedEvent,
  ) {
    this.out = out
  }

  /** The event (or envelope) at the reader's cursor, into out. */
  walk(out: DecodedEvent): void {
    out.reset()
    this.out = out
    if (this.r.isPositional()) this.topArray()
    else this.eventMap(true)
  }

  /**
   * A RouterEvent map; at the top level it may instead be the envelope, whose keys are then read
   * too (inside a payload they are unknown keys, skipped).
   */
  private eventMap(envelopeAllowed: boolean): void {
    const r = this.r
    const out = this.out
    const n = r.openMap(envelopeAllowed ? 'event' : 'payload event')
    let sawWorker = false
    let sawEvent = false
    let sawPayload = false
    let sawPublisher = false
    let sawSequence = false
    for (let i = 0; r.nextKey(n, i); i++) {
      if (r.keyIs(K.worker_id)) {
        sawWorker = this.workerId()
      } else if (r.keyIs(K.event)) {
        this.kvCacheEvent()
        sawEvent = true
      } else if (r.keyIs(K.storage_tier)) {
        this.storageTier()
      } else if (r.keyIs(K.residency_domain)) {
        this.residencyDomain()
      } else if (!envelopeAllowed) {
        r.skip()
      } else if (r.keyIs(K.publisher_id)) {
        r.u64('publisher_id')
        out.publisherLo = r.numLo
        out.publisherHi = r.numHi
        sawPublisher = true
      } else if (r.keyIs(K.sequence)) {
        r.u64('sequence')
        out.sequenceLo = r.numLo
        out.sequenceHi = r.numHi
        sawSequence = true
      } else if (r.keyIs(K.published_at)) {
        r.u64('published_at')
      } else if (r.keyIs(K.payload)) {
        r.payload()
        sawPayload = true
      } else {
        r.skip()
      }
    }
    if (sawPayload) {
      if (sawWorker || sawEvent) throw r.fail('KVR_ERR_EVENT_WRONG_TYPE', 'an envelope must not also carry worker_id or event at its top level')
      if (!sawPublisher) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'envelope field "publisher_id" is missing')
      if (!sawSequence) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'envelope field "sequence" is missing')
      this.payloadEvent()
      return
    }
    if (!sawWorker) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "worker_id" is missing')
    if (!sawEvent) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event" is missing')
  }

  /** A top-level array: a positional envelope when its second element is an integer, else a RouterEvent. */
  private topArray(): void {
    const r = this.r
    const out = this.out
    const n = r.openArray('the event')
    if (n === 0) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "worker_id" is missing')
    r.u64('worker_id')
    if (n < 2 || r.peek() !== ValueKind.Int) {
      out.workerLo = r.numLo
      out.workerHi = r.numHi
      this.eventArrayRest(n - 1)
      return
    }
    out.publisherLo = r.numLo
    out.publisherHi = r.numHi
    r.u64('sequence')
    out.sequenceLo = r.numLo
    out.sequenceHi = r.numHi
    if (n < 5) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'envelope field "payload" is missing')
    r.skip()
    r.skip()
    r.payload()
    for (let i = 5; i < n; i++) r.skip()
    this.payloadEvent()
  }

  /** The envelope's payload, which must hold exactly one RouterEvent. */
  private payloadEvent(): void {
    const r = this.r
    this.out.hasEnvelope = true
    r.enterPayload()
    if (r.isPositional()) {
      const n = r.openArray('the event')
      if (n === 0) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "worker_id" is missing')
      this.workerId()
      this.eventArrayRest(n - 1)
    } else {
      this.eventMap(false)
    }
    r.leavePayload()
  }

  /** The n elements after worker_id of a positional RouterEvent. */
  private eventArrayRest(n: number): void {
    const r = this.r
    let sawTier = false
    let sawEvent = false
    let k: ValueKind
    for (let i = 0; i < n; i++) {
      if (sawEvent) {
        r.skip()
      } else if ((k = r.peek()) === ValueKind.Str || k === ValueKind.Nil) {
        // the tier, then the residency domain (not used: every event here is a worker's own)
        if (sawTier) r.skip()
        else this.storageTier()
        sawTier = true
      } else if (k === ValueKind.Map || k === ValueKind.Array) {
        this.kvCacheEvent()
        sawEvent = true
      } else {
        throw r.fail('KVR_ERR_EVENT_WRONG_TYPE', 'a positional RouterEvent holds worker_id, storage_tier, residency_domain, then the event')
      }
    }
    if (!sawEvent) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event" is missing')
  }

  private storageTier(): void {
    const r = this.r
    if (r.nil()) return
    r.string('storage_tier')
    if (r.keyIs(K.device)) this.out.tier = StorageTier.Device
    else if (r.keyIs(K.host_pinned)) this.out.tier = StorageTier.HostPinned
    else if (r.keyIs(K.disk)) this.out.tier = StorageTier.Disk
    else if (r.keyIs(K.external)) this.out.tier = StorageTier.External
    else throw r.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', `unknown storage_tier "${r.keyText()}"`)
  }

  /**
   * Omitted (events of workers before it existed) or "worker" | "cache_owner"; an explicit nil is
   * refused, as Dynamo's reader refuses it. Every event is applied to its worker_id's blocks.
   */
  private residencyDomain(): void {
    const r = this.r
    if (r.nil()) throw r.fail('KVR_ERR_EVENT_WRONG_TYPE', 'field "residency_domain" must not be null (omit it instead)')
    r.string('residency_domain')
    if (!r.keyIs(K.worker) && !r.keyIs(K.cache_owner)) throw r.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', `unknown residency_domain "${r.keyText()}"`)
  }

  private kvCacheEvent(): void {
    const r = this.r
    if (r.isPositional()) {
      const n = r.openArray('event')
      if (n < 2) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', n === 0 ? 'field "event.event_id" is missing' : 'field "event.data" is missing')
      r.u64('event_id')
      this.out.eventIdLo = r.numLo
      this.out.eventIdHi = r.numHi
      this.eventData()
      if (n > 2) this.dpRank()
      for (let i = 3; i < n; i++) r.skip()
      return
    }
    let sawId = false
    let sawData = false
    const n = r.openMap('event')
    for (let i = 0; r.nextKey(n, i); i++) {
      if (r.keyIs(K.event_id)) {
        r.u64('event_id')
        this.out.eventIdLo = r.numLo
        this.out.eventIdHi = r.numHi
        sawId = true
      } else if (r.keyIs(K.dp_rank)) {
        this.dpRank()
      } else if (r.keyIs(K.data)) {
        this.eventData()
        sawData = true
      } else {
        r.skip()
      }
    }
    if (!sawId) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event.event_id" is missing')
    if (!sawData) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "event.data" is missing')
  }

  /** worker_id into out; true, for the caller's "seen". */
  private workerId(): boolean {
    const r = this.r
    r.u64('worker_id')
    this.out.workerLo = r.numLo
    this.out.workerHi = r.numHi
    return true
  }

  private dpRank(): void {
    const r = this.r
    if (r.nil()) {
      this.out.dpRank = 0
      return
    }
    r.u64('dp_rank')
    if (r.numHi !== 0) throw r.fail('KVR_ERR_EVENT_INVALID_NUMBER', 'dp_rank must fit in u32')
    this.out.dpRank = r.numLo
  }

  /** Externally tagged: "cleared" (a unit variant is its name) | {"stored": …} | {"removed": …}. */
  private eventData(): void {
    const r = this.r
    if (r.peek() === ValueKind.Str) {
      r.string('event.data')
      if (!r.keyIs(K.cleared)) throw r.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', `unknown event variant "${r.keyText()}"`)
      this.out.kind = EventKind.Cleared
      return
    }
    if (r.peek() !== ValueKind.Map) throw r.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "event.data" must be ${r.mapWord} or "cleared"`)
    const n = r.openMap('event.data')
    if (!r.nextKey(n, 0)) throw r.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', 'event.data names no variant')
    if (r.keyIs(K.stored)) {
      this.out.kind = EventKind.Stored
      this.storedData()
    } else if (r.keyIs(K.removed)) {
      this.out.kind = EventKind.Removed
      this.removedData()
    } else if (r.keyIs(K.cleared)) {
      this.out.kind = EventKind.Cleared
      r.skip()
    } else {
      throw r.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', `unknown event variant "${r.keyText()}"`)
    }
    if (r.nextKey(n, 1)) throw r.fail('KVR_ERR_EVENT_UNKNOWN_VARIANT', 'event.data must name exactly one variant')
  }

  private parentHash(): void {
    const r = this.r
    const out = this.out
    if (r.nil()) {
      out.hasParent = false
      return
    }
    r.u64('parent_hash')
    out.hasParent = true
    out.parentLo = r.numLo
    out.parentHi = r.numHi
  }

  private storedData(): void {
    const r = this.r
    let sawBlocks = false
    if (r.isPositional()) {
      // [parent_hash, start_position?, blocks, …]: the blocks are the first array after the parent
      const n = r.openArray('stored')
      if (n > 0) this.parentHash()
      for (let i = 1; i < n; i++) {
        if (!sawBlocks && r.peek() === ValueKind.Array) {
          this.blockList('stored.blocks', true)
          sawBlocks = true
        } else {
          r.skip()
        }
      }
    } else {
      const n = r.openMap('stored')
      for (let i = 0; r.nextKey(n, i); i++) {
        if (r.keyIs(K.parent_hash)) this.parentHash()
        else if (r.keyIs(K.blocks)) {
          this.blockList('stored.blocks', true)
          sawBlocks = true
        } else r.skip()
      }
    }
    if (!sawBlocks) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "stored.blocks" is missing')
  }

  /** Before block (or hash) i of an array of n: false at its end, else room for it in out, and the interrupt every 16. */
  private nextBlock(n: number, i: number, field: string): boolean {
    if (!this.r.nextElement(n, i, field)) return false
    this.out.ensure(i + 1)
    if ((i & 15) === 15 && this.interrupt !== null) this.interrupt()
    return true
  }

  /** A hash into slot i of lo/hi; true, for the caller's "seen". */
  private hashAt(field: string, lo: Uint32Array, hi: Uint32Array, i: number): boolean {
    const r = this.r
    r.u64(field)
    lo[i] = r.numLo
    hi[i] = r.numHi
    return true
  }

  /**
   * The blocks of a stored event or the hashes of a removed one: runs in the writer's usual layout
   * go through the reader's fast path, anything else one element at a time.
   */
  private blockList(field: string, stored: boolean): void {
    const r = this.r
    const out = this.out
    const n = r.openArray(field)
    let i = 0
    for (; ; i++) {
      i = stored ? r.fastBlocks(out, i, n, this.interrupt) : r.fastHashes(out, i, n, this.interrupt)
      if (!this.nextBlock(n, i, field)) break
      if (stored) this.storedBlock(i)
      else this.hashAt('block_hashes[]', out.blockLo, out.blockHi, i)
    }
    out.count = i
  }

  private storedBlock(i: number): void {
    const r = this.r
    const out = this.out
    let sawBlock = false
    let sawTokens = false
    if (r.isPositional()) {
      const m = r.openArray('stored block')
      if (m > 0) sawBlock = this.hashAt('block_hash', out.blockLo, out.blockHi, i)
      if (m > 1) sawTokens = this.hashAt('tokens_hash', out.tokensLo, out.tokensHi, i)
      for (let j = 2; j < m; j++) r.skip()
    } else {
      const m = r.openMap('stored block')
      for (let j = 0; r.nextKey(m, j); j++) {
        if (r.keyIs(K.block_hash)) sawBlock = this.hashAt('block_hash', out.blockLo, out.blockHi, i)
        else if (r.keyIs(K.tokens_hash)) sawTokens = this.hashAt('tokens_hash', out.tokensLo, out.tokensHi, i)
        else r.skip()
      }
    }
    if (!sawBlock) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', `field "blocks[${i}].block_hash" is missing`)
    if (!sawTokens) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', `field "blocks[${i}].tokens_hash" is missing`)
  }

  private removedData(): void {
    const r = this.r
    let saw = false
    if (r.isPositional()) {
      const n = r.openArray('removed')
      if (n > 0) {
        this.blockList('removed.block_hashes', false)
        saw = true
      }
      for (let i = 1; i < n; i++) r.skip()
    } else {
      const n = r.openMap('removed')
      for (let i = 0; r.nextKey(n, i); i++) {
        if (r.keyIs(K.block_hashes)) {
          this.blockList('removed.block_hashes', false)
          saw = true
        } else {
          r.skip()
        }
      }
    }
    if (!saw) throw r.fail('KVR_ERR_EVENT_MISSING_FIELD', 'field "removed.block_hashes" is missing')
  }
}

/**
 * A reusable decoder of one format: `decode(bytes)` fills `out` (and returns it) or throws a
 * KvrError naming the field and byte offset. Not re-entrant: one decoder per thread.
 */
export class WalkingDecoder {
  readonly out = new DecodedEvent()
  private readonly walker: RouterEventWalker

  constructor(private readonly reader: EventReader) {
    this.walker = new RouterEventWalker(reader, this.out)
  }

  /** Called every 16 blocks while a long event is decoded (a shard answers queries there). */
  get interrupt(): (() => void) | null {
    return this.walker.interrupt
  }

  set interrupt(f: (() => void) | null) {
    this.walker.interrupt = f
  }

  decode(bytes: Uint8Array, out: DecodedEvent = this.out): DecodedEvent {
    this.reader.begin(bytes)
    this.walker.walk(out)
    this.reader.finish()
    return out
  }
}
