// The JSON side of the RouterEvent decoding: a byte-level EventReader for Dynamo `RouterEvent`
// JSON, raw or wrapped in the event-plane envelope (payload as an array of byte values or as the
// object itself), walked by router-event-walker.ts. It runs inside the indexer shards on every
// event: u64 values are read straight into u32 halves, and serde's exact block layout is matched
// a word at a time before the general parser is tried.
import { KvrError, type ErrorCode } from '../errors.js'
import type { DecodedEvent } from './decoded-event.js'
import { skipJsonSpace } from './json-scan.js'
import { type EventReader, ValueKind, WalkingDecoder } from './router-event-walker.js'

export { DecodedEvent, EventKind, StorageTier } from './decoded-event.js'

// The byte values as this module's own constants: in optimized code an imported binding is a
// load from its module cell on every use, and these are compared on every byte.
const C_QUOTE = 0x22
const C_BACKSLASH = 0x5c
const C_COMMA = 0x2c
const C_COLON = 0x3a
const C_LBRACE = 0x7b
const C_RBRACE = 0x7d
const C_LBRACKET = 0x5b
const C_RBRACKET = 0x5d
const C_MINUS = 0x2d
const C_ZERO = 0x30
const C_NINE = 0x39

/** 10^k for the lengths of the u64 parser's digit runs. */
const POW10 = [1, 10, 100, 1000, 10000, 100000, 1000000]

/**
 * The little-endian 32-bit word of `s` (ASCII) at byte `at`: literals are matched as words at 0,
 * 4, 8, … and one more ending on their last byte (overlapping the one before).
 */
function wordOf(s: string, at: number): number {
  const b = new TextEncoder().encode(s)
  return new DataView(b.buffer).getInt32(at, true)
}

// The exact block layout serde writes, matched a word at a time first (decoding is about half
// of a shard's work per block, and these literals are half of the bytes it reads), with the
// general object parser as the fallback for any other spelling, order or spacing. Unrolled
// compares of these constants: a loop over a literal's words would not be inlined into the
// block loop.
const BLOCK_HASH = '"block_hash":'
const BH0 = wordOf(BLOCK_HASH, 0)
const BH1 = wordOf(BLOCK_HASH, 4)
const BH2 = wordOf(BLOCK_HASH, 8)
const BH3 = wordOf(BLOCK_HASH, BLOCK_HASH.length - 4)
const TOKENS_HASH = ',"tokens_hash":'
const TH0 = wordOf(TOKENS_HASH, 0)
const TH1 = wordOf(TOKENS_HASH, 4)
const TH2 = wordOf(TOKENS_HASH, 8)
const TH3 = wordOf(TOKENS_HASH, TOKENS_HASH.length - 4)
const MM_NULL = ',"mm_extra_info":null}'
const MM0 = wordOf(MM_NULL, 0)
const MM1 = wordOf(MM_NULL, 4)
const MM2 = wordOf(MM_NULL, 8)
const MM3 = wordOf(MM_NULL, 12)
const MM4 = wordOf(MM_NULL, 16)
const MM5 = wordOf(MM_NULL, MM_NULL.length - 4)

const MAX_DEPTH = 64
const TWO32 = 4294967296
const textDecoder = new TextDecoder('utf-8', { fatal: false })

class JsonEventReader implements EventReader {
  numLo = 0
  numHi = 0
  readonly mapWord = 'an object'
  private buf: Uint8Array = new Uint8Array(0)
  /** A view of buf's whole backing buffer, for the word-at-a-time reads. */
  private dv: DataView<ArrayBufferLike> = new DataView(new ArrayBuffer(8))
  // Views of the last two backing buffers: messages come from one ring, and an enveloped one
  // switches to this reader's payload buffer and back (a fragmented one to the ring's assembly
  // buffer), so two views make every switch free of allocation. They hold at most two buffers.
  private dvA: DataView<ArrayBufferLike> = this.dv
  private dvB: DataView<ArrayBufferLike> = this.dv
  private dvNext = 0
  /** buf[0]'s offset in dv. */
  private base = 0
  private pos = 0
  private end = 0
  private keyStart = 0
  private keyEnd = 0
  private keyEscaped: string | null = null
  private runLen = 0
  private payloadBytes = new Uint8Array(1024)
  /** The envelope's payload: its length in payloadBytes, or -1 when it is an object at payloadAt. */
  private payloadLen = 0
  private payloadAt = 0
  private saveBuf: Uint8Array = this.buf
  private savePos = 0
  private saveEnd = 0
  private inPayload = false

  begin(bytes: Uint8Array): void {
    this.input(bytes)
    this.pos = 0
    this.end = bytes.length
    this.inPayload = false
    this.ws()
    if (this.pos >= this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'empty input')
  }

  finish(): void {
    this.ws()
    if (this.pos !== this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'unexpected data after the event')
  }

  /** Every switch of buf goes through here, so the word view always matches it. */
  private input(bytes: Uint8Array): void {
    this.buf = bytes
    const backing = bytes.buffer
    if (this.dvA.buffer === backing) this.dv = this.dvA
    else if (this.dvB.buffer === backing) this.dv = this.dvB
    else {
      this.dv = new DataView(backing)
      if (this.dvNext === 0) this.dvA = this.dv
      else this.dvB = this.dv
      this.dvNext ^= 1
    }
    this.base = bytes.byteOffset
  }

  // --- the walker's view -------------------------------------------------------------------

  isPositional(): boolean {
    return false
  }

  peek(): ValueKind {
    this.ws()
    const c = this.peekByte()
    if (c === C_QUOTE) return ValueKind.Str
    if (c === C_LBRACE) return ValueKind.Map
    if (c === C_LBRACKET) return ValueKind.Array
    if ((c >= C_ZERO && c <= C_NINE) || c === C_MINUS) return ValueKind.Int
    if (c === 0x6e) return ValueKind.Nil
    return ValueKind.Other
  }

  openMap(what: string): number {
    this.expectObjectStart(what)
    return -1
  }

  nextKey(_n: number, i: number): boolean {
    return this.nextKeyAfter(i === 0)
  }

  openArray(field: string): number {
    this.ws()
    if (this.peekByte() !== C_LBRACKET) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be an array`)
    this.pos++
    return -1
  }

  nextElement(_n: number, i: number, field: string): boolean {
    this.ws()
    if (this.peekByte() === C_RBRACKET) {
      this.pos++
      return false
    }
    if (i > 0) {
      this.expect(C_COMMA, field)
      this.ws()
    }
    return true
  }

  string(field: string): void {
    this.ws()
    this.stringToken(field)
  }

  nil(): boolean {
    this.ws()
    return this.isNull()
  }

  u64(field: string): void {
    this.ws()
    // serde writes hashes as bare integers: the word-at-a-time reader first
    const q = this.fastDigits(this.pos)
    if (q >= 0) this.pos = q
    else this.u64Text(field)
  }

  skip(): void {
    this.skipValue(0)
  }

  payload(): void {
    this.ws()
    const c = this.peekByte()
    if (c === C_LBRACE) {
      this.payloadLen = -1
      this.payloadAt = this.pos
      this.skipValue(0)
      return
    }
    if (c !== C_LBRACKET) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', 'envelope "payload" must be an array of byte values or an object')
    this.pos++
    let n = 0
    while (this.nextElement(-1, n, 'payload')) {
      this.u64Text('payload byte')
      if (this.numHi !== 0 || this.numLo > 255) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', 'payload bytes must be integers in [0, 255]')
      if (n === this.payloadBytes.length) {
        const grown = new Uint8Array(n * 2)
        grown.set(this.payloadBytes)
        this.payloadBytes = grown
      }
      this.payloadBytes[n++] = this.numLo
    }
    this.payloadLen = n
  }

  enterPayload(): void {
    this.saveBuf = this.buf
    this.savePos = this.pos
    this.saveEnd = this.end
    this.inPayload = true
    if (this.payloadLen < 0) {
      this.pos = this.payloadAt
      return
    }
    this.input(this.payloadBytes)
    this.pos = 0
    this.end = this.payloadLen
    this.ws()
  }

  leavePayload(): void {
    if (this.payloadLen >= 0) {
      this.ws()
      if (this.pos !== this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'unexpected data after the payload event')
      this.input(this.saveBuf)
    }
    this.pos = this.savePos
    this.end = this.saveEnd
    this.inPayload = false
  }

  fail(code: ErrorCode, message: string): KvrError {
    return new KvrError(code, `${this.inPayload ? 'in envelope payload: ' : ''}${message} (at byte ${this.pos})`)
  }

  // --- tokens ------------------------------------------------------------------------------

  /** Unsigned integer up to 2^64-1, as a JSON integer or a decimal string, into numLo/numHi; after ws(). */
  private u64Text(field: string): void {
    const buf = this.buf
    let quoted = false
    if (this.peekByte() === C_QUOTE) {
      quoted = true
      this.pos++
    }
    const start = this.pos
    let c = this.pos < this.end ? (buf[this.pos] as number) : -1
    if (c === C_MINUS) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must not be negative`)
    if (c < C_ZERO || c > C_NINE) {
      if (!quoted && (c === 0x6e || c === 0x74 || c === 0x66 || c === C_LBRACE || c === C_LBRACKET)) {
        throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be an unsigned integer`)
      }
      if (quoted || c === C_QUOTE) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must be a decimal integer string`)
      throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', `expected a number for "${field}"`)
    }
    // Digits are gathered in small-integer runs (9, then 6, then the rest), whose
    // multiply-add chains are integer operations; a double chain per digit timed slower. The
    // first 15 digits fit a double exactly, and the rest are folded in below with one split
    // into halves instead of a carry per digit (hashes have 19–20 digits).
    let pos = this.pos
    const a = this.digitRun(pos, 9)
    let digits = this.runLen
    pos += digits
    let head = a
    let tail = 0
    let tailScale = 1
    if (digits === 9) {
      const b = this.digitRun(pos, 6)
      const nb = this.runLen
      pos += nb
      digits += nb
      head = a * (POW10[nb] as number) + b
      if (nb === 6) {
        // up to 6 more: a 21st digit is caught below as too many
        tail = this.digitRun(pos, 6)
        const nt = this.runLen
        pos += nt
        digits += nt
        tailScale = POW10[nt] as number
      }
    }
    if (digits === 21) {
      while (pos < this.end && (buf[pos] as number) >= C_ZERO && (buf[pos] as number) <= C_NINE) pos++
    }
    this.pos = pos
    if (digits > 20) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" exceeds 2^64-1`)
    let hi = Math.floor(head / TWO32)
    let lo = head - hi * TWO32
    if (tailScale > 1) {
      const l = lo * tailScale + tail
      const carry = Math.floor(l / TWO32)
      lo = l - carry * TWO32
      hi = hi * tailScale + carry
      if (hi >= TWO32) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" exceeds 2^64-1`)
    }
    if (this.pos - start > 1 && buf[start] === C_ZERO) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" has a leading zero`)
    if (this.pos < this.end) {
      c = buf[this.pos] as number
      if (c === 0x2e || c === 0x65 || c === 0x45) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must be an integer`)
    }
    if (quoted) {
      if (this.peekByte() !== C_QUOTE) throw this.fail('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must be a decimal integer string`)
      this.pos++
    }
    this.numLo = lo
    this.numHi = hi
  }

  /** Up to `max` (≤ 9, so a small integer) digits from `pos`, stopping at `end`; count in runLen. */
  private digitRun(pos: number, max: number): number {
    const buf = this.buf
    const stop = Math.min(this.end, pos + max)
    let v = 0
    let p = pos
    while (p < stop) {
      const d = (buf[p] as number) - C_ZERO
      if (d < 0 || d > 9) break
      v = v * 10 + d
      p++
    }
    this.runLen = p - pos
    return v
  }

  /** Reads a JSON string into keyStart/keyEnd (raw bytes) or keyEscaped (decoded, when escaped). */
  private stringToken(field: string): void {
    if (this.peekByte() !== C_QUOTE) throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `field "${field}" must be a string`)
    this.pos++
    const start = this.pos
    const buf = this.buf
    let escaped = false
    while (this.pos < this.end) {
      const c = buf[this.pos] as number
      if (c === C_QUOTE) break
      if (c === C_BACKSLASH) {
        escaped = true
        this.pos += 2
        continue
      }
      if (c < 0x20) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'control character in string')
      this.pos++
    }
    if (this.pos >= this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'unterminated string')
    this.keyStart = start
    this.keyEnd = this.pos
    this.pos++
    this.keyEscaped = null
    if (escaped) {
      try {
        this.keyEscaped = JSON.parse(textDecoder.decode(buf.subarray(start - 1, this.pos))) as string
      } catch {
        throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'invalid escape in string')
      }
    }
  }

  /** Advances to the next key of an object whose `{` was consumed; false at `}`. */
  private nextKeyAfter(first: boolean): boolean {
    this.ws()
    const c = this.peekByte()
    if (c === C_RBRACE) {
      this.pos++
      return false
    }
    if (!first) {
      if (c !== C_COMMA) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'expected "," or "}" in object')
      this.pos++
      this.ws()
    }
    if (this.peekByte() !== C_QUOTE) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'expected an object key')
    this.stringToken('key')
    this.ws()
    this.expect(C_COLON, 'object')
    return true
  }

  keyIs(k: Uint8Array): boolean {
    if (this.keyEscaped !== null) return this.keyEscaped === textDecoder.decode(k)
    const len = this.keyEnd - this.keyStart
    if (len !== k.length) return false
    const buf = this.buf
    for (let i = 0; i < len; i++) if (buf[this.keyStart + i] !== k[i]) return false
    return true
  }

  keyText(): string {
    return this.keyEscaped ?? textDecoder.decode(this.buf.subarray(this.keyStart, this.keyEnd))
  }

  private expectObjectStart(what: string): void {
    this.ws()
    if (this.peekByte() !== C_LBRACE) {
      if (this.pos >= this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', `truncated input: expected ${what} object`)
      throw this.fail('KVR_ERR_EVENT_WRONG_TYPE', `${what} must be a JSON object`)
    }
    this.pos++
  }

  private isNull(): boolean {
    const b = this.buf
    const p = this.pos
    if (p + 4 <= this.end && b[p] === 0x6e && b[p + 1] === 0x75 && b[p + 2] === 0x6c && b[p + 3] === 0x6c) {
      this.pos += 4
      return true
    }
    return false
  }

  /** Skips (and checks) any JSON value. */
  private skipValue(depth: number): void {
    if (depth > MAX_DEPTH) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'nesting too deep')
    this.ws()
    const c = this.peekByte()
    const buf = this.buf
    if (c === C_LBRACE) {
      this.pos++
      let first = true
      while (this.nextKeyAfter(first)) {
        first = false
        this.skipValue(depth + 1)
      }
      return
    }
    if (c === C_LBRACKET) {
      this.pos++
      for (let i = 0; this.nextElement(-1, i, 'array'); i++) this.skipValue(depth + 1)
      return
    }
    if (c === C_QUOTE) {
      this.stringToken('value')
      return
    }
    if (c === C_MINUS || (c >= C_ZERO && c <= C_NINE)) {
      this.pos++
      while (this.pos < this.end) {
        const d = buf[this.pos] as number
        if ((d >= C_ZERO && d <= C_NINE) || d === 0x2e || d === 0x65 || d === 0x45 || d === 0x2b || d === C_MINUS) this.pos++
        else break
      }
      return
    }
    if (this.literal('true') || this.literal('false') || this.isNull()) return
    if (this.pos >= this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'truncated input')
    throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', 'unexpected character')
  }

  fastBlocks(out: DecodedEvent, i: number, _n: number, interrupt: (() => void) | null): number {
    for (; ; i++) {
      const p = this.elementStart(i)
      if (p < 0) return i
      out.ensure(i + 1)
      if (!this.fastBlock(out, i, p)) return i
      if ((i & 15) === 15 && interrupt !== null) interrupt()
    }
  }

  fastHashes(out: DecodedEvent, i: number, _n: number, interrupt: (() => void) | null): number {
    for (; ; i++) {
      const p = this.elementStart(i)
      if (p < 0) return i
      const q = this.fastDigits(p)
      if (q < 0) return i
      out.ensure(i + 1)
      out.blockLo[i] = this.numLo
      out.blockHi[i] = this.numHi
      this.pos = q
      if ((i & 15) === 15 && interrupt !== null) interrupt()
    }
  }

  /**
   * Where element i of an array starts, past its separator, or -1 at the array's end or anything
   * unexpected (left to the general path, which reports it); pos is not moved.
   */
  private elementStart(i: number): number {
    const buf = this.buf
    const end = this.end
    let p = this.pos
    // serde writes no whitespace: the scan only when there is some
    if (p < end && (buf[p] as number) <= 0x20) p = skipJsonSpace(buf, p, end)
    if (i > 0) {
      if (p >= end || buf[p] !== C_COMMA) return -1
      p++
      if (p < end && (buf[p] as number) <= 0x20) p = skipJsonSpace(buf, p, end)
    }
    return p < end && buf[p] !== C_RBRACKET ? p : -1
  }

  /**
   * One stored block in serde's exact layout at p, `{` included: fills block n, moves pos past it
   * and returns true, or returns false with pos unmoved so the general parser takes it (and
   * reports whatever is wrong with it).
   */
  private fastBlock(out: DecodedEvent, n: number, at: number): boolean {
    const dv = this.dv
    const b = this.base
    const end = this.end
    if (this.buf[at] !== C_LBRACE) return false
    let p = at + 1
    if (
      p + BLOCK_HASH.length > end ||
      dv.getInt32(b + p, true) !== BH0 ||
      dv.getInt32(b + p + 4, true) !== BH1 ||
      dv.getInt32(b + p + 8, true) !== BH2 ||
      dv.getInt32(b + p + BLOCK_HASH.length - 4, true) !== BH3
    ) {
      return false
    }
    p = this.fastDigits(p + BLOCK_HASH.length)
    if (p < 0) return false
    const lo = this.numLo
    const hi = this.numHi
    if (
      p + TOKENS_HASH.length > end ||
      dv.getInt32(b + p, true) !== TH0 ||
      dv.getInt32(b + p + 4, true) !== TH1 ||
      dv.getInt32(b + p + 8, true) !== TH2 ||
      dv.getInt32(b + p + TOKENS_HASH.length - 4, true) !== TH3
    ) {
      return false
    }
    p = this.fastDigits(p + TOKENS_HASH.length)
    if (p < 0) return false
    if (
      p + MM_NULL.length <= end &&
      dv.getInt32(b + p, true) === MM0 &&
      dv.getInt32(b + p + 4, true) === MM1 &&
      dv.getInt32(b + p + 8, true) === MM2 &&
      dv.getInt32(b + p + 12, true) === MM3 &&
      dv.getInt32(b + p + 16, true) === MM4 &&
      dv.getInt32(b + p + MM_NULL.length - 4, true) === MM5
    ) {
      p += MM_NULL.length
    } else if (p < end && this.buf[p] === C_RBRACE) {
      p++
    } else {
      return false
    }
    out.blockLo[n] = lo
    out.blockHi[n] = hi
    out.tokensLo[n] = this.numLo
    out.tokensHi[n] = this.numHi
    this.pos = p
    return true
  }

  /**
   * An unquoted JSON integer in [0, 2^64) at p into numLo/numHi, four digits per 32-bit load
   * while four are there; the position after it, or -1 for anything else (a sign, a quote, a
   * leading zero, a fraction, more than 20 digits, 2^64 or more), which the general parser then
   * reads and reports. Hashes have 19–20 digits: five loads instead of twenty byte steps. Each
   * group is folded into the two 32-bit halves exactly (lo × 10^4 stays below 2^53).
   */
  private fastDigits(p: number): number {
    const buf = this.buf
    const end = this.end
    const dv = this.dv
    const base = this.base
    const start = p
    let hi = 0
    let lo = 0
    while (p + 4 <= end) {
      const w = dv.getInt32(base + p, true)
      // each byte 0x30–0x39: high nibble 3, and adding 6 leaves it 3
      if (((w & 0xf0f0f0f0) | (((w + 0x06060606) & 0xf0f0f0f0) >>> 4)) !== 0x33333333) break
      const d = (w - 0x30303030) | 0
      // little-endian: byte 0 is the first digit; pairs, then the four-digit value
      const pairs = (Math.imul(d, 10) + (d >>> 8)) & 0x00ff00ff
      const l = lo * 10000 + Math.imul(pairs & 0xff, 100) + (pairs >>> 16)
      const carry = Math.floor(l / TWO32)
      lo = l - carry * TWO32
      hi = hi * 10000 + carry
      p += 4
      if (p - start > 20) return -1
    }
    let g = 0
    let scale = 1
    while (p < end) {
      const c = (buf[p] as number) - C_ZERO
      if (c < 0 || c > 9) break
      g = g * 10 + c
      scale *= 10
      p++
      if (p - start > 20) return -1
    }
    if (scale > 1) {
      const l = lo * scale + g
      const carry = Math.floor(l / TWO32)
      lo = l - carry * TWO32
      hi = hi * scale + carry
    }
    const digits = p - start
    if (digits === 0 || (digits > 1 && buf[start] === C_ZERO) || hi >= TWO32) return -1
    if (p < end) {
      const c = buf[p] as number
      if (c === 0x2e || c === 0x65 || c === 0x45) return -1
    }
    this.numLo = lo
    this.numHi = hi
    return p
  }

  private literal(word: string): boolean {
    if (this.pos + word.length > this.end) return false
    for (let i = 0; i < word.length; i++) if (this.buf[this.pos + i] !== word.charCodeAt(i)) return false
    this.pos += word.length
    return true
  }

  private ws(): void {
    this.pos = skipJsonSpace(this.buf, this.pos, this.end)
  }

  private peekByte(): number {
    return this.pos < this.end ? (this.buf[this.pos] as number) : -1
  }

  private expect(ch: number, where: string): void {
    if (this.peekByte() !== ch) {
      if (this.pos >= this.end) throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', `truncated input in ${where}`)
      throw this.fail('KVR_ERR_EVENT_MALFORMED_JSON', `expected "${String.fromCharCode(ch)}" in ${where}`)
    }
    this.pos++
  }
}

/** RouterEvent JSON and its envelope, walked into a DecodedEvent. */
export class EventDecoder extends WalkingDecoder {
  constructor() {
    super(new JsonEventReader())
  }

  decodeString(text: string): DecodedEvent {
    return this.decode(Buffer.from(text, 'utf8'))
  }
}
