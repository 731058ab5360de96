// JSON at the HTTP edge with exact u64s. JSON.parse turns an integer above 2^53 into a rounded
// double, so before parsing, every bare integer literal long enough to be unsafe (16+ digits) is
// turned into a decimal string; u64 fields accept integers and decimal strings alike. On the way
// out, u64 values are written as exact JSON integers (serializeJson handles bigint).
import { KvrError } from '../shared/errors.js'

const LONG_INT = /\d{16}/

/** JSON.parse with long integer literals kept exact as strings. Throws SyntaxError. */
export function parseJsonExact(text: string): unknown {
  if (!LONG_INT.test(text)) return JSON.parse(text)
  return JSON.parse(quoteLongIntegers(text))
}

function quoteLongIntegers(text: string): string {
  let out = ''
  let last = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 92) i++ // backslash: skip the escaped char
      else if (c === 34) inString = false
      continue
    }
    if (c === 34) {
      inString = true
      continue
    }
    if ((c >= 48 && c <= 57) || c === 45) {
      let j = i + 1
      while (j < text.length) {
        const d = text.charCodeAt(j)
        if ((d >= 48 && d <= 57) || d === 46 || d === 101 || d === 69 || d === 43 || d === 45) j++
        else break
      }
      const lit = text.slice(i, j)
      if (/^\d{16,}$/.test(lit)) {
        out += text.slice(last, i) + '"' + lit + '"'
        last = j
      }
      i = j - 1
    }
  }
  return out + text.slice(last)
}

const U64_TEXT = /^(0|[1-9][0-9]{0,19})$/

/** A u64 from a JSON integer or decimal string; throws INVALID_REQUEST naming the field. */
export function readU64(v: unknown, field: string): bigint {
  if (typeof v === 'number') {
    if (Number.isSafeInteger(v) && v >= 0) return BigInt(v)
  } else if (typeof v === 'string' && U64_TEXT.test(v)) {
    const b = BigInt(v)
    if (b <= 0xffffffffffffffffn) return b
  } else if (typeof v === 'bigint' && v >= 0n && v <= 0xffffffffffffffffn) {
    return v
  }
  throw new KvrError('KVR_ERR_INVALID_REQUEST', `${field} must be an unsigned 64-bit integer (a JSON integer or a decimal string), got ${JSON.stringify(v) ?? String(v)}`)
}

/** JSON text where bigint values are written as exact integers. */
export function serializeJson(value: unknown): string {
  let big = false
  const text = JSON.stringify(value, (_k, v: unknown) => {
    if (typeof v === 'bigint') {
      big = true
      return `\u0000BIG${v.toString()}\u0000`
    }
    return v
  })
  return big ? text.replace(/"\\u0000BIG(\d+)\\u0000"/g, '$1') : text
}
