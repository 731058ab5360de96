// JSON at the HTTP edge with exact u64s. JSON.parse turns an integer above 2^53 into a rounded
// double, so a body whose parse holds a number past Number.MAX_SAFE_INTEGER is parsed again with
// every bare integer literal past it turned into a decimal string; u64 fields accept integers and
// decimal strings alike. On the way out, u64 values are written as exact JSON
// integers (serializeJson handles bigint).
import { KvrError } from '../errors.js'
import { jsonTextStringEnd } from './json-scan.js'

/**
 * JSON.parse with long integer literals kept exact as strings (negative ones too with `signed`).
 * Throws SyntaxError.
 *
 * The check runs on the parsed value, not the text: a regular-expression scan of the text for 16
 * digits in a row cost twice the parse itself on a 4,096-token prompt (`npm run bench:micro`),
 * while a walk of the parsed value reads each number once. Bodies that hold such a number (a u64
 * worker id sent as a JSON number) are rare and take the slow path; a leading-zero or negative
 * literal is never quoted (the first is not JSON, the second not a u64).
 */
export function parseJsonExact(text: string, opts: { signed?: boolean } = {}): unknown {
  const value: unknown = JSON.parse(text)
  return holdsUnsafeNumber(value) ? JSON.parse(quoteLongIntegers(text, opts.signed === true)) : value
}

/** Whether a parsed JSON value holds a number beyond ±2^53 - 1 (a rounded integer, or a float that large). */
function holdsUnsafeNumber(root: unknown): boolean {
  // an explicit stack: JSON.parse takes nesting deeper than the call stack allows
  const stack: unknown[] = [root]
  while (stack.length > 0) {
    const v = stack.pop()
    if (typeof v === 'number') {
      if (v > Number.MAX_SAFE_INTEGER || v < -Number.MAX_SAFE_INTEGER) return true
    } else if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        const e: unknown = v[i]
        if (typeof e === 'number') {
          if (e > Number.MAX_SAFE_INTEGER || e < -Number.MAX_SAFE_INTEGER) return true
        } else if (typeof e === 'object' && e !== null) stack.push(e)
      }
    } else if (typeof v === 'object' && v !== null) {
      // Object.values, not for-in: it sees an own "__proto__" member that JSON.parse made
      for (const e of Object.values(v)) if (typeof e === 'number' || (typeof e === 'object' && e !== null)) stack.push(e)
    }
  }
  return false
}

const MAX_SAFE_TEXT = String(Number.MAX_SAFE_INTEGER)

/**
 * A bare unsigned integer literal past 2^53 − 1: the ones JSON.parse would round. Only these are
 * quoted, so a safe 16-digit integer is a number whatever else the body holds.
 */
function unsafeIntegerLiteral(lit: string, signed: boolean): boolean {
  // i64 fields (Dynamo's block hashes) keep their sign: "-9223372036854775808" stays exact too
  if (signed && lit.charCodeAt(0) === 45) return unsafeIntegerLiteral(lit.slice(1), false)
  if (lit.length < MAX_SAFE_TEXT.length || !/^\d+$/.test(lit)) return false
  return lit.length > MAX_SAFE_TEXT.length || lit > MAX_SAFE_TEXT
}

function quoteLongIntegers(text: string, signed: boolean): string {
  let out = ''
  let last = 0
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === 34) {
      const e = jsonTextStringEnd(text, i)
      if (e < 0) break
      i = e
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
      if (unsafeIntegerLiteral(lit, signed)) {
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
  throw new KvrError(
    'KVR_ERR_INVALID_REQUEST',
    `${field} must be an unsigned 64-bit integer (a JSON integer or a decimal string), got ${JSON.stringify(v) ?? String(v)}`,
  )
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
