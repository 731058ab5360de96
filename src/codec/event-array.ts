// A body or a recovery holding one RouterEvent object or a JSON array of them, cut into the
// bytes of each event without parsing them (the event decoder validates each one): the HTTP
// ingest takes batches so, and a shard takes a worker query's answer so.
import { KvrError } from '../errors.js'

// Literal byte values in the loops: an imported constant is a module-cell load on every use.
const isWs = (c: number | undefined): boolean => c === 32 || c === 10 || c === 13 || c === 9

/** One event or a JSON array of them → the raw bytes of each event. */
export function splitEvents(buf: Uint8Array | undefined): Uint8Array[] {
  if (!(buf instanceof Uint8Array)) throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', 'the body must be one RouterEvent object or an array of them')
  let i = 0
  while (isWs(buf[i])) i++
  if (buf[i] !== 91) return [buf]
  const wrongType = (): KvrError => new KvrError('KVR_ERR_EVENT_WRONG_TYPE', 'each element of the events array must be a RouterEvent object')
  const out: Uint8Array[] = []
  // between elements: a "{" opens one, "," separates, "]" ends the array; anything else at the
  // top level is an element that is not an object, or broken JSON
  let expectValue = true
  for (let j = i + 1; j < buf.length; j++) {
    const c = buf[j] as number
    if (isWs(c)) continue
    if (c === 93 && (out.length === 0 || !expectValue)) {
      let k = j + 1
      while (isWs(buf[k])) k++
      if (k !== buf.length) throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', `unexpected data after the events array at byte ${k}`)
      return out
    }
    if (c === 44 && !expectValue) {
      expectValue = true
      continue
    }
    if (c !== 123) {
      if (c === 93) throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', `a trailing comma in the events array at byte ${j}`)
      if (expectValue) throw wrongType()
      throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', `expected "," or "]" in the events array at byte ${j}`)
    }
    if (!expectValue) throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', `expected "," or "]" in the events array at byte ${j}`)
    // one object: find its end, strings and nesting considered; the event parser validates it.
    // One flat loop over every byte of the body, as a call per string (jsonValueEnd) timed slower.
    const start = j
    let depth = 0
    let inString = false
    for (; j < buf.length; j++) {
      const d = buf[j]
      if (inString) {
        if (d === 92) j++
        else if (d === 34) inString = false
      } else if (d === 34) inString = true
      else if (d === 123 || d === 91) depth++
      else if ((d === 125 || d === 93) && --depth === 0) break
    }
    if (j >= buf.length) break
    out.push(buf.subarray(start, j + 1))
    expectValue = false
  }
  throw new KvrError('KVR_ERR_EVENT_MALFORMED_JSON', 'the events array is not terminated')
}
