// The byte-level pieces every JSON scanner of the codecs stands on: whitespace, where a string
// ends, where a value ends (structure only). The scanners that use them read only part of a text
// (the /v1/route body's two hot members, the events of an array, a RouterEvent), each with its own
// errors, so these report "not found" as -1 and leave the error to the caller.

export const J_SPACE = 0x20
export const J_TAB = 0x09
export const J_LF = 0x0a
export const J_CR = 0x0d
export const J_QUOTE = 0x22
export const J_COMMA = 0x2c
export const J_MINUS = 0x2d
export const J_ZERO = 0x30
export const J_NINE = 0x39
export const J_COLON = 0x3a
export const J_LBRACKET = 0x5b
export const J_BACKSLASH = 0x5c
export const J_RBRACKET = 0x5d
export const J_LBRACE = 0x7b
export const J_RBRACE = 0x7d

export function isJsonSpace(c: number | undefined): boolean {
  return c === J_SPACE || c === J_LF || c === J_CR || c === J_TAB
}

/** The first position at or after i, below end, that is not JSON whitespace. */
export function skipJsonSpace(buf: Uint8Array, i: number, end: number = buf.length): number {
  while (i < end) {
    const c = buf[i] as number
    if (c === J_SPACE || c === J_LF || c === J_CR || c === J_TAB) i++
    else break
  }
  return i
}

/** The position of the quote that closes the string opening at i, or -1 when the text ends first. */
export function jsonStringEnd(buf: Uint8Array, i: number): number {
  for (let j = i + 1; j < buf.length; j++) {
    const c = buf[j]
    if (c === J_BACKSLASH) j++
    else if (c === J_QUOTE) return j
  }
  return -1
}

/**
 * The end (exclusive) of the JSON value at i, from its structure alone (strings and nesting;
 * a scalar runs to the next delimiter): -1 when a string or container is not closed, i when
 * there is no value there. Whoever parses the value validates it.
 */
export function jsonValueEnd(buf: Uint8Array, i: number): number {
  const c = buf[i]
  if (c === J_QUOTE) {
    const e = jsonStringEnd(buf, i)
    return e < 0 ? -1 : e + 1
  }
  if (c === J_LBRACE || c === J_LBRACKET) {
    let depth = 0
    for (let j = i; j < buf.length; j++) {
      const d = buf[j]
      if (d === J_QUOTE) {
        j = jsonStringEnd(buf, j)
        if (j < 0) return -1
      } else if (d === J_LBRACE || d === J_LBRACKET) depth++
      else if (d === J_RBRACE || d === J_RBRACKET) {
        depth--
        if (depth === 0) return j + 1
      }
    }
    return -1
  }
  let j = i
  while (j < buf.length) {
    const d = buf[j] as number
    if (d === J_COMMA || d === J_RBRACE || d === J_RBRACKET || isJsonSpace(d)) break
    j++
  }
  return j
}

/** jsonStringEnd over a JS string (for the scanners that read decoded text): the closing quote's index, or -1. */
export function jsonTextStringEnd(text: string, i: number): number {
  for (let j = i + 1; j < text.length; j++) {
    const c = text.charCodeAt(j)
    if (c === J_BACKSLASH) j++
    else if (c === J_QUOTE) return j
  }
  return -1
}
