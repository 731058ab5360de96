// Dynamo's replica-sync message, `ActiveSequenceEvent` (lib/kv-router protocols), as JSON:
//
//   { "request_id": "…", "worker": {"worker_id": u64, "dp_rank": u32}, "router_id": u64,
//     "lora_name": null,
//     "data": {"AddRequest": {"token_sequence": [u64…] | null, "isl": n, "overlap": blocks,
//                             "expected_output_tokens": null,
//                             "track_prefill_tokens": bool, "prefill_load_hint": {…} | null}}
//           | "MarkPrefillCompleted" | "Free" }
//
// AddRequest carries both generations of Dynamo's fields: `isl` and `overlap` (from which a
// receiver computes the prefill tokens), and `track_prefill_tokens` with `prefill_load_hint`
// (the prefill tokens themselves); serde ignores the fields it does not know. kv-router adds
// `published_at` (ms since the Unix epoch, fractional) for the sync-lag estimate and the race count.
// token_sequence holds the request's chained block (sequence) hashes.
//
// Read: that JSON (raw or in the event-plane envelope, payload as bytes or object), the MessagePack
// encoding of the same (a bare map or Dynamo's MessagePack envelope), the older top-level
// `worker_id`, and router ids that are not numbers (earlier Dynamo used UUIDs). u64 values are
// exact: the hashes are scanned from the text straight into u32 halves, since JSON.parse would
// round them, and the rest goes through parseJsonExact.
import { Unpackr } from 'msgpackr'
import { KvrError } from '../errors.js'
import { jsonTextStringEnd } from './json-scan.js'
import { parseJsonExact, readU64 } from './json.js'
import { u64ToString } from './u64.js'

export type ActiveSequenceKind = 'add' | 'prefill_completed' | 'free'

/** One decoded event. Hash arrays are the decoder's scratch: valid until its next decode(). */
export interface ActiveSequenceEvent {
  kind: ActiveSequenceKind
  requestId: string
  workerId: bigint
  dpRank: number
  /** The sender's router id: decimal text of a u64, or the text Dynamo sent (a UUID in early versions). */
  routerId: string
  loraName: string | null
  /** AddRequest: token_sequence as u64 halves (n of them), or null when it was null. */
  lo: Uint32Array | null
  hi: Uint32Array | null
  n: number
  isl: number | null
  overlap: number | null
  expectedOutputTokens: number | null
  /** Newer Dynamo: whether the prefill counts, and how many tokens it is. */
  trackPrefillTokens: boolean | null
  prefillHint: number | null
  /** Optional `stride` of newer Dynamo (1 = every block hash). */
  stride: number | null
  /** When the sender published it, ms since the epoch (ours, or the envelope's), or null. */
  publishedAt: number | null
}

const TWO32 = 4294967296
const MAX_ID_LENGTH = 4096

/** What an AddRequest tells of a booking (the scheduler's Booking is one). */
export interface AddRequestBooking {
  /** n block hashes as u64 halves; undefined: token_sequence null. */
  lo: ArrayLike<number> | undefined
  hi: ArrayLike<number> | undefined
  n: number
  isl: number
  overlapBlocks: number
  trackPrefill: boolean
  prefillTokens: number
}

/**
 * JSON of an AddRequest event. The prefill tokens go in prefill_load_hint, isl and overlap for
 * receivers that compute them.
 */
export function encodeAddRequest(
  requestId: string,
  workerId: bigint,
  dpRank: number,
  routerId: string,
  b: Readonly<AddRequestBooking>,
  publishedAt: number,
): string {
  const lo = b.lo
  const hi = b.hi
  let seq = 'null'
  if (lo !== undefined && hi !== undefined) {
    seq = '['
    for (let i = 0; i < b.n; i++) seq += (i === 0 ? '' : ',') + u64ToString(lo[i] as number, hi[i] as number)
    seq += ']'
  }
  const prefillTokens = b.prefillTokens
  const hint = prefillTokens > 0 ? `{"initial_effective_prefill_tokens":${Math.round(prefillTokens)},"expected_prefill_duration":null}` : 'null'
  return (
    `{"request_id":${JSON.stringify(requestId)},"worker":{"worker_id":${workerId},"dp_rank":${dpRank}},` +
    `"data":{"AddRequest":{"token_sequence":${seq},"isl":${Math.round(b.isl)},"overlap":${Math.round(b.overlapBlocks)},"expected_output_tokens":null,` +
    `"track_prefill_tokens":${b.trackPrefill},"prefill_load_hint":${hint}}},` +
    `"router_id":${routerId},"lora_name":null,"published_at":${publishedAt}}`
  )
}

/** JSON of a MarkPrefillCompleted or Free event. */
export function encodeLifecycle(
  kind: 'prefill_completed' | 'free',
  requestId: string,
  workerId: bigint,
  dpRank: number,
  routerId: string,
  publishedAt: number,
): string {
  const data = kind === 'free' ? '"Free"' : '"MarkPrefillCompleted"'
  return (
    `{"request_id":${JSON.stringify(requestId)},"worker":{"worker_id":${workerId},"dp_rank":${dpRank}},"data":${data},"router_id":${routerId},` +
    `"lora_name":null,"published_at":${publishedAt}}`
  )
}

const KEY = '"token_sequence"'
const dec = new TextDecoder('utf-8', { fatal: true })

function wrongType(what: string): KvrError {
  return new KvrError('KVR_ERR_EVENT_WRONG_TYPE', what)
}

function missing(what: string): KvrError {
  return new KvrError('KVR_ERR_EVENT_MISSING_FIELD', what)
}

function smallInt(v: unknown, field: string): number {
  const n = typeof v === 'bigint' && v <= 0xffffffffn && v >= 0n ? Number(v) : v
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 0xffffffff)
    throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} must be an integer in [0, 2^32), got ${String(v)}`)
  return n
}

function optionalInt(v: unknown, field: string): number | null {
  return v === undefined || v === null ? null : smallInt(v, field)
}

function u64(v: unknown, field: string): bigint {
  try {
    return readU64(v, field)
  } catch (err) {
    throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', (err as Error).message)
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Uint8Array)
}

export class ActiveSequenceDecoder {
  private lo = new Uint32Array(256)
  private hi = new Uint32Array(256)
  private n = 0
  /** Whether the last text scan found and took the token_sequence array. */
  private scanned = false
  private readonly unpackr = new Unpackr({ int64AsType: 'bigint', mapsAsObjects: true, useRecords: false })

  /** Decodes one message; throws KvrError (KVR_ERR_EVENT_*) when it is not an ActiveSequenceEvent. */
  decode(bytes: Uint8Array): ActiveSequenceEvent {
    if (bytes[0] === undefined) throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', 'the message is empty')
    return this.fromBytes(bytes, true)
  }

  /** A message, or an envelope's payload (then no envelope again): a MessagePack map, else JSON text. */
  private fromBytes(bytes: Uint8Array, envelopeAllowed: boolean): ActiveSequenceEvent {
    const first = bytes[0]
    if (first !== undefined && ((first >= 0x80 && first <= 0x8f) || first === 0xde || first === 0xdf)) return this.fromMsgpack(bytes)
    let text: string
    try {
      text = dec.decode(bytes)
    } catch {
      throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', envelopeAllowed ? 'the message is not UTF-8' : 'the envelope payload is not UTF-8')
    }
    return this.fromText(text, envelopeAllowed)
  }

  private fromText(text: string, envelopeAllowed: boolean): ActiveSequenceEvent {
    const stripped = this.scanTokenSequence(text)
    let v: unknown
    try {
      v = parseJsonExact(stripped)
    } catch (err) {
      throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', `the message is not JSON: ${(err as Error).message}`)
    }
    if (!isObject(v)) throw wrongType('the message must be a JSON object')
    if (envelopeAllowed && v['request_id'] === undefined && v['payload'] !== undefined) {
      const at = typeof v['published_at'] === 'number' ? v['published_at'] : null
      const p = v['payload']
      let ev: ActiveSequenceEvent
      if (Array.isArray(p)) {
        const raw = new Uint8Array(p.length)
        for (let i = 0; i < p.length; i++) raw[i] = smallInt(p[i], 'payload byte') & 0xff
        ev = this.fromBytes(raw, false)
      } else if (isObject(p)) {
        ev = this.fromObject(p)
      } else throw wrongType('envelope "payload" must be an array of bytes or an object')
      if (ev.publishedAt === null) ev.publishedAt = at
      return ev
    }
    return this.fromObject(v)
  }

  private fromMsgpack(bytes: Uint8Array): ActiveSequenceEvent {
    let v: unknown
    try {
      v = this.unpackr.unpack(bytes)
    } catch (err) {
      throw new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', `the message does not decode: ${(err as Error).message}`)
    }
    if (!isObject(v)) throw wrongType('the message must be a map')
    this.scanned = false
    const payload = v['payload']
    if (v['request_id'] === undefined && payload instanceof Uint8Array) {
      const at = v['published_at']
      const ev = this.fromBytes(payload, false)
      if (ev.publishedAt === null && (typeof at === 'number' || typeof at === 'bigint')) ev.publishedAt = Number(at)
      return ev
    }
    return this.fromObject(v)
  }

  /**
   * Finds the "token_sequence" member outside strings, reads its array of u64s into the scratch
   * halves and returns the text with `null` in its place; the text unchanged when there is none.
   */
  private scanTokenSequence(text: string): string {
    this.scanned = false
    this.n = 0
    const len = text.length
    let i = 0
    while (i < len) {
      const c = text.charCodeAt(i)
      if (c !== 34) {
        i++
        continue
      }
      if (text.startsWith(KEY, i)) {
        let j = i + KEY.length
        while (j < len && isSpace(text.charCodeAt(j))) j++
        if (text.charCodeAt(j) === 58) {
          j++
          while (j < len && isSpace(text.charCodeAt(j))) j++
          if (text.charCodeAt(j) === 91) {
            const end = this.readArray(text, j)
            this.scanned = true
            return text.slice(0, j) + 'null' + text.slice(end)
          }
        }
      }
      const e = jsonTextStringEnd(text, i)
      if (e < 0) break
      i = e + 1
    }
    return text
  }

  /** Reads `[u64, …]` starting at text[at] === '['; returns the index after ']'. */
  private readArray(text: string, at: number): number {
    let i = at + 1
    const len = text.length
    let n = 0
    for (;;) {
      while (i < len && isSpace(text.charCodeAt(i))) i++
      if (text.charCodeAt(i) === 93 && n === 0) return i + 1
      const quoted = text.charCodeAt(i) === 34
      if (quoted) i++
      let lo = 0
      let hi = 0
      let digits = 0
      while (i < len) {
        const d = text.charCodeAt(i) - 48
        if (d < 0 || d > 9) break
        if (digits === 1 && lo === 0 && hi === 0) throw invalidHash()
        const l = lo * 10 + d
        const carry = Math.floor(l / TWO32)
        lo = l - carry * TWO32
        hi = hi * 10 + carry
        if (hi > 0xffffffff) throw invalidHash()
        digits++
        i++
      }
      if (digits === 0) throw invalidHash()
      if (quoted) {
        if (text.charCodeAt(i) !== 34) throw invalidHash()
        i++
      }
      if (n === this.lo.length) this.growScratch()
      this.lo[n] = lo
      this.hi[n] = hi
      n++
      while (i < len && isSpace(text.charCodeAt(i))) i++
      const c = text.charCodeAt(i)
      i++
      if (c === 93) break
      if (c !== 44) throw invalidHash()
    }
    this.n = n
    return i
  }

  private growScratch(): void {
    const lo = new Uint32Array(this.lo.length * 2)
    const hi = new Uint32Array(this.hi.length * 2)
    lo.set(this.lo)
    hi.set(this.hi)
    this.lo = lo
    this.hi = hi
  }

  /** token_sequence given as values (MessagePack, or JSON the scan did not see), into the scratch. */
  private takeValues(seq: unknown[]): void {
    this.n = 0
    for (const v of seq) {
      let x: bigint
      if (typeof v === 'bigint' && v >= 0n && v <= 0xffffffffffffffffn) x = v
      else x = u64(v, 'token_sequence element')
      if (this.n === this.lo.length) this.growScratch()
      this.lo[this.n] = Number(x & 0xffffffffn)
      this.hi[this.n] = Number(x >> 32n)
      this.n++
    }
  }

  private fromObject(o: Record<string, unknown>): ActiveSequenceEvent {
    const requestId = o['request_id']
    if (requestId === undefined) throw missing('request_id is missing')
    if (typeof requestId !== 'string' || requestId.length === 0 || requestId.length > MAX_ID_LENGTH)
      throw wrongType(`request_id must be a string of 1 to ${MAX_ID_LENGTH} characters`)
    let workerId: bigint
    let dpRank = 0
    const w = o['worker']
    if (isObject(w)) {
      if (w['worker_id'] === undefined) throw missing('worker.worker_id is missing')
      workerId = u64(w['worker_id'], 'worker.worker_id')
      dpRank = optionalInt(w['dp_rank'], 'worker.dp_rank') ?? 0
    } else if (w === undefined && o['worker_id'] !== undefined) {
      workerId = u64(o['worker_id'], 'worker_id')
    } else if (w === undefined) throw missing('worker is missing')
    else throw wrongType('worker must be an object {worker_id, dp_rank}')
    const rid = o['router_id']
    let routerId: string
    if (rid === undefined || rid === null) throw missing('router_id is missing')
    if (typeof rid === 'string' && !/^[0-9]+$/.test(rid)) {
      if (rid.length === 0 || rid.length > 64) throw wrongType('router_id must be a u64 or a short string')
      routerId = rid
    } else routerId = u64(rid, 'router_id').toString()
    const lora = o['lora_name']
    if (lora !== undefined && lora !== null && typeof lora !== 'string') throw wrongType('lora_name must be a string or null')
    const stride = optionalInt(o['stride'], 'stride')
    const at = o['published_at']
    const publishedAt = typeof at === 'number' && Number.isFinite(at) ? at : typeof at === 'bigint' ? Number(at) : null
    const ev: ActiveSequenceEvent = {
      kind: 'free',
      requestId,
      workerId,
      dpRank,
      routerId,
      loraName: typeof lora === 'string' ? lora : null,
      lo: null,
      hi: null,
      n: 0,
      isl: null,
      overlap: null,
      expectedOutputTokens: null,
      trackPrefillTokens: null,
      prefillHint: null,
      stride,
      publishedAt,
    }
    const data = o['data']
    if (data === undefined) throw missing('data is missing')
    let variant: string
    let body: unknown = null
    if (typeof data === 'string') variant = data
    else if (isObject(data)) {
      const keys = Object.keys(data)
      if (keys.length !== 1) throw wrongType('data must name exactly one variant')
      variant = keys[0] as string
      body = data[variant]
    } else throw wrongType('data must be a variant name or an object naming one')
    if (variant === 'Free') ev.kind = 'free'
    else if (variant === 'MarkPrefillCompleted') ev.kind = 'prefill_completed'
    else if (variant === 'AddRequest') {
      ev.kind = 'add'
      this.addRequest(body, ev)
    } else throw new KvrError('KVR_ERR_EVENT_UNKNOWN_VARIANT', `data names an unknown variant ${JSON.stringify(variant)}`)
    if (ev.kind !== 'add' && body !== null && body !== undefined && !(isObject(body) && Object.keys(body).length === 0))
      throw wrongType(`${variant} carries no fields`)
    return ev
  }

  private addRequest(body: unknown, ev: ActiveSequenceEvent): void {
    if (!isObject(body)) throw wrongType('AddRequest must be an object')
    const seq = body['token_sequence']
    if (seq === undefined) throw missing('AddRequest.token_sequence is missing')
    if (Array.isArray(seq)) this.takeValues(seq)
    else if (seq !== null) throw wrongType('token_sequence must be an array of u64 or null')
    else if (!this.scanned) this.n = 0
    if (Array.isArray(seq) || this.scanned) {
      ev.lo = this.lo
      ev.hi = this.hi
      ev.n = this.n
    }
    ev.isl = optionalInt(body['isl'], 'AddRequest.isl')
    ev.overlap = optionalInt(body['overlap'], 'AddRequest.overlap')
    ev.expectedOutputTokens = optionalInt(body['expected_output_tokens'], 'AddRequest.expected_output_tokens')
    const track = body['track_prefill_tokens']
    if (track !== undefined && track !== null && typeof track !== 'boolean') throw wrongType('track_prefill_tokens must be a boolean')
    ev.trackPrefillTokens = typeof track === 'boolean' ? track : null
    const hint = body['prefill_load_hint']
    if (hint !== undefined && hint !== null) {
      if (!isObject(hint)) throw wrongType('prefill_load_hint must be an object or null')
      ev.prefillHint = smallInt(hint['initial_effective_prefill_tokens'], 'prefill_load_hint.initial_effective_prefill_tokens')
    }
  }
}

function isSpace(c: number): boolean {
  return c === 32 || c === 10 || c === 13 || c === 9
}

function invalidHash(): KvrError {
  return new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', 'token_sequence must hold unsigned 64-bit integers')
}

/**
 * The prefill tokens an AddRequest books on the receiver: the newer fields when the sender gave
 * them, else the earlier isl − overlap × block size (never below 0).
 */
export function prefillTokensOf(ev: ActiveSequenceEvent, blockSize: number): number {
  if (ev.trackPrefillTokens !== null) return ev.trackPrefillTokens ? (ev.prefillHint ?? 0) : 0
  if (ev.prefillHint !== null) return ev.prefillHint
  const isl = ev.isl ?? 0
  return Math.max(0, isl - (ev.overlap ?? 0) * blockSize)
}
