// The /v1/route body parser: the hot path of the standalone router. Instead of JSON.parse (an
// object per request and a boxed number per token) the top-level object is scanned byte by byte;
// `token_ids` go straight into a reused Uint32Array, validated as they are read (the common run
// of them by the WebAssembly scanner of token-scan.ts, the rest here), and
// `block_hashes` straight into u32 halves (u64 exact, integers or decimal strings). Every other
// member is small and is parsed on its own slice (u64-exact, json.ts). Errors are KvrErrors
// naming the field and the byte offset.
import { KvrError } from '../errors.js'
import {
  J_BACKSLASH as BACKSLASH,
  J_COLON as COLON,
  J_COMMA as COMMA,
  J_CR as CR,
  J_LBRACE as LBRACE,
  J_LBRACKET as LBRACK,
  J_LF as LF,
  J_NINE as NINE,
  J_QUOTE as QUOTE,
  J_RBRACE as RBRACE,
  J_RBRACKET as RBRACK,
  J_SPACE as SP,
  J_TAB as TAB,
  J_ZERO as ZERO,
  jsonStringEnd,
  jsonValueEnd,
  skipJsonSpace as ws,
} from './json-scan.js'
import { parseJsonExact } from './json.js'
import { scanTokenIds, tokenScanAccelerated } from './token-scan.js'
import type { TokenSink } from './token-scan.js'

export interface RouteBody {
  /**
   * Token ids, or null: a view of exactly the prompt's length into the scanner's own buffer,
   * valid until its next scan(). Callers hash them before their first await; a copy would be
   * 16 KB of garbage per 4,096-token request.
   */
  tokens: Uint32Array | null
  blockLo: Uint32Array | null
  blockHi: Uint32Array | null
  /** Other top-level members, JSON-parsed. */
  rest: Record<string, unknown>
}

const TWO32 = 4294967296

function bad(msg: string, at: number): KvrError {
  return new KvrError('KVR_ERR_INVALID_REQUEST', `${msg} at byte ${at}`)
}

export interface RouteBodyScannerOptions {
  /**
   * false reads every id with the byte loop, as on a runtime without WebAssembly SIMD: for the
   * benchmark's side-by-side figure and for testing that path on machines that have SIMD.
   */
  simd?: boolean
}

export class RouteBodyScanner {
  private readonly simd: boolean
  private readonly ids: TokenSink = { tok: new Uint32Array(8192), n: 0 }
  private bLo = new Uint32Array(1024)
  private bHi = new Uint32Array(1024)

  constructor(options: RouteBodyScannerOptions = {}) {
    this.simd = options.simd !== false && tokenScanAccelerated
  }

  scan(body: Uint8Array): RouteBody {
    // a POST without a body (or without a JSON content type) reaches here with none
    if (!(body instanceof Uint8Array)) throw bad('the body must be a JSON object', 0)
    // A Buffer's element reads are slower than a plain Uint8Array's over the same bytes (V8
    // specialises on the subclass), and this loop reads every byte of the body.
    const buf = Object.getPrototypeOf(body) === Uint8Array.prototype ? body : new Uint8Array(body.buffer, body.byteOffset, body.length)
    const len = buf.length
    let i = ws(buf, 0)
    if (buf[i] !== LBRACE) throw bad('the body must be a JSON object', i)
    i = ws(buf, i + 1)
    const out: RouteBody = { tokens: null, blockLo: null, blockHi: null, rest: {} }
    if (buf[i] === RBRACE) return this.end(buf, i + 1, out)
    for (;;) {
      if (buf[i] !== QUOTE) throw bad('expected a member name', i)
      const keyEnd = stringEnd(buf, i)
      const key = memberName(buf, i, keyEnd)
      i = ws(buf, keyEnd + 1)
      if (buf[i] !== COLON) throw bad('expected ":"', i)
      i = ws(buf, i + 1)
      if (key === 'token_ids') i = this.tokens(buf, i, out)
      else if (key === 'block_hashes') i = this.hashes(buf, i, out)
      else {
        const end = valueEnd(buf, i)
        const text = Buffer.from(buf.buffer, buf.byteOffset + i, end - i).toString('utf8')
        let value: unknown
        try {
          // exact: worker_id and backend_instance_id may be u64 integers above 2^53
          value = parseJsonExact(text)
        } catch {
          throw bad(`member "${key}" is not valid JSON`, i)
        }
        // an own property whatever the name, as JSON.parse makes it: assigning "__proto__"
        // would set the object's prototype and smuggle members in through it
        Object.defineProperty(out.rest, key, { value, enumerable: true, writable: true, configurable: true })
        i = end
      }
      i = ws(buf, i)
      if (i >= len) throw bad('unexpected end of the body', i)
      if (buf[i] === COMMA) {
        i = ws(buf, i + 1)
        continue
      }
      if (buf[i] === RBRACE) return this.end(buf, i + 1, out)
      throw bad('expected "," or "}"', i)
    }
  }

  private end(buf: Uint8Array, i: number, out: RouteBody): RouteBody {
    if (ws(buf, i) !== buf.length) throw bad('unexpected data after the object', i)
    return out
  }

  private tokens(buf: Uint8Array, i: number, out: RouteBody): number {
    if (buf[i] !== LBRACK) throw new KvrError('KVR_ERR_INVALID_REQUEST', `token_ids must be an array of token ids (byte ${i})`)
    i = ws(buf, i + 1)
    if (buf[i] === RBRACK) {
      out.tokens = new Uint32Array(0)
      return i + 1
    }
    const len = buf.length
    const ids = this.ids
    // the common layout, 64 bytes at a time, as far as it goes; the byte loop below takes over
    // at the first thing it does not take (whitespace other than one space after a comma, an
    // id it will not read whole, the array's last id), grows the array, and reports every error
    ids.n = 0
    if (this.simd) i = scanTokenIds(buf, i, ids)
    let n = ids.n
    let tok = ids.tok
    // The first digits are unrolled: token ids have 1–6 digits, and a plain digit loop timed
    // ~1.8× slower than this shape on the same bodies (one branch pattern per length instead of
    // a loop exit to predict).
    while (i < len) {
      const start = i
      // d = c - '0' as unsigned: one compare tells a digit (d < 10) from everything else; past
      // the end buf[i] is undefined, and `| 0` makes that a non-digit rather than NaN → 0
      let d = (((buf[i] as number) | 0) - ZERO) >>> 0
      if (d >= 10) {
        // whitespace after a comma (Python's json.dumps writes ", ")
        const w = buf[i]
        if (w === SP || w === LF || w === CR || w === TAB) {
          i = ws(buf, i)
          continue
        }
        throw tokenError(n, buf, start)
      }
      let v = d
      d = (((buf[++i] as number) | 0) - ZERO) >>> 0
      if (d < 10) {
        if (v === 0) throw tokenError(n, buf, start) // a leading zero
        v = v * 10 + d
        d = (((buf[++i] as number) | 0) - ZERO) >>> 0
        if (d < 10) {
          v = v * 10 + d
          d = (((buf[++i] as number) | 0) - ZERO) >>> 0
          if (d < 10) {
            v = v * 10 + d
            d = (((buf[++i] as number) | 0) - ZERO) >>> 0
            while (d < 10) {
              v = v * 10 + d
              d = (((buf[++i] as number) | 0) - ZERO) >>> 0
            }
            // 11 or more digits (no leading zero) are ≥ 10^10 > 2^32 too
            if (v >= TWO32) throw tokenError(n, buf, start)
          }
        }
      }
      const c = (d + ZERO) >>> 0
      if (n === tok.length) {
        const bigger = new Uint32Array(tok.length * 2)
        bigger.set(tok)
        ids.tok = tok = bigger
      }
      tok[n++] = v
      if (c === COMMA) {
        i++
        continue
      }
      if (c === RBRACK) {
        out.tokens = tok.subarray(0, n)
        return i + 1
      }
      if (c === SP || c === TAB || c === LF || c === CR) {
        i = ws(buf, i)
        const e = buf[i]
        if (e === COMMA) {
          i = ws(buf, i + 1)
          continue
        }
        if (e === RBRACK) {
          out.tokens = tok.subarray(0, n)
          return i + 1
        }
        break
      }
      // a fraction, an exponent, a letter: the value is not a token id; anything else is a
      // structural mistake (a missing "]", a stray brace) and gets the generic message below
      const lower = c | 32
      if (c === 46 || (lower >= 97 && lower <= 122)) throw tokenError(n - 1, buf, start)
      break
    }
    throw bad('token_ids: expected "," or "]"', i)
  }

  private hashes(buf: Uint8Array, i: number, out: RouteBody): number {
    if (buf[i] !== LBRACK) throw new KvrError('KVR_ERR_INVALID_REQUEST', `block_hashes must be an array of u64 (byte ${i})`)
    i = ws(buf, i + 1)
    let n = 0
    if (buf[i] !== RBRACK) {
      for (;;) {
        const quoted = buf[i] === QUOTE
        if (quoted) i++
        const start = i
        let hi = 0
        let lo = 0
        while ((buf[i] as number) >= ZERO && (buf[i] as number) <= NINE) {
          // (hi, lo) = (hi, lo) × 10 + d, in 32-bit halves
          const l = lo * 10 + ((buf[i] as number) - ZERO)
          lo = l % TWO32
          hi = hi * 10 + Math.floor(l / TWO32)
          if (hi >= TWO32) throw bad(`block_hashes[${n}] is larger than 2^64 - 1`, start)
          i++
        }
        if (i === start || (buf[start] === ZERO && i - start > 1)) throw bad(`block_hashes[${n}] must be an unsigned 64-bit integer`, start)
        if (quoted) {
          if (buf[i] !== QUOTE) throw bad(`block_hashes[${n}] must be an unsigned 64-bit integer`, start)
          i++
        }
        if (n === this.bLo.length) {
          const lo2 = new Uint32Array(n * 2)
          const hi2 = new Uint32Array(n * 2)
          lo2.set(this.bLo)
          hi2.set(this.bHi)
          this.bLo = lo2
          this.bHi = hi2
        }
        this.bLo[n] = lo
        this.bHi[n] = hi
        n++
        i = ws(buf, i)
        if (buf[i] === COMMA) {
          i = ws(buf, i + 1)
          continue
        }
        if (buf[i] === RBRACK) break
        throw bad('block_hashes: expected "," or "]"', i)
      }
    }
    out.blockLo = this.bLo.slice(0, n)
    out.blockHi = this.bHi.slice(0, n)
    return i + 1
  }
}
function tokenError(index: number, buf: Uint8Array, at: number): KvrError {
  const end = Math.min(buf.length, valueEndLoose(buf, at))
  const text = Buffer.from(buf.buffer, buf.byteOffset + at, Math.min(end - at, 40)).toString('utf8')
  return new KvrError('KVR_ERR_TOKEN_OUT_OF_RANGE', `token_ids[${index}] is not an integer in [0, 2^32): ${text}`)
}

function valueEndLoose(buf: Uint8Array, i: number): number {
  while (i < buf.length && buf[i] !== COMMA && buf[i] !== RBRACK) i++
  return i
}

/** The member name of the string at [i, end]: printable ASCII as is, anything else through JSON.parse. */
function memberName(buf: Uint8Array, i: number, end: number): string {
  let plain = true
  for (let j = i + 1; j < end; j++) {
    const c = buf[j] as number
    // escapes, UTF-8 and control characters (which JSON refuses raw) go the exact way
    if (c === BACKSLASH || c >= 0x80 || c < 0x20) {
      plain = false
      break
    }
  }
  if (plain) return Buffer.from(buf.buffer, buf.byteOffset + i + 1, end - i - 1).toString('latin1')
  try {
    return JSON.parse(Buffer.from(buf.buffer, buf.byteOffset + i, end - i + 1).toString('utf8')) as string
  } catch {
    throw bad('a member name is not a valid JSON string', i)
  }
}

function stringEnd(buf: Uint8Array, i: number): number {
  const e = jsonStringEnd(buf, i)
  if (e < 0) throw bad('unterminated string', i)
  return e
}

/** End (exclusive) of the JSON value starting at i; structure only, JSON.parse validates. */
function valueEnd(buf: Uint8Array, i: number): number {
  const e = jsonValueEnd(buf, i)
  if (e < 0) throw bad(buf[i] === QUOTE ? 'unterminated string' : 'unterminated value', i)
  if (e === i) throw bad('expected a value', i)
  return e
}
