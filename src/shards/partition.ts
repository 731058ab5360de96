// Finds the worker id of a raw event message without decoding it, so the main thread can pick
// the message's shard with O(1) work beyond a native substring search. JSON: the first
// `"worker_id"` key (serde writes it first), else the envelope's `"publisher_id"` (the payload
// bytes are a number array the search cannot see into). MessagePack maps (Dynamo's current
// encoding): the key `worker_id` as MessagePack writes it (fixstr 0xa9 and its 9 bytes), then the
// integer after it; an envelope's RouterEvent is a bin, whose bytes the search sees as they are
// (a positional one there is read as below); else `publisher_id`. MessagePack arrays (the positional form) are walked: the first element is
// the worker id, or the publisher id of a positional envelope, whose payload is then read. The
// shard decodes and validates the message fully, and sends back one whose decoded worker is not
// its own; a message with neither key goes to shard 0, where it is counted as malformed with the
// decoder's precise reason.

const WORKER_KEY = Buffer.from('"worker_id"')
const PUBLISHER_KEY = Buffer.from('"publisher_id"')
const MP_WORKER_KEY = Buffer.from([0xa9, ...Buffer.from('worker_id')])
const MP_PUBLISHER_KEY = Buffer.from([0xac, ...Buffer.from('publisher_id')])
const MP_PAYLOAD_KEY = Buffer.from([0xa7, ...Buffer.from('payload')])
const TWO32 = 4294967296
const indexOf = Buffer.prototype.indexOf

export class WorkerIdScan {
  lo = 0
  hi = 0
  /** Position after the MessagePack integer readInt read last. */
  private next = 0

  /** True when a worker id was found; it is then in lo/hi. */
  scan(msg: Uint8Array): boolean {
    // no JSON text starts at 0x80 or above, and every MessagePack map and array does
    if ((msg[0] as number) >= 0x80) return this.scanMsgpack(msg)
    let at = indexOf.call(msg, WORKER_KEY) as number
    let keyLen = WORKER_KEY.length
    if (at < 0) {
      at = indexOf.call(msg, PUBLISHER_KEY) as number
      keyLen = PUBLISHER_KEY.length
      if (at < 0) return false
    }
    let i = at + keyLen
    const end = msg.length
    while (i < end && (msg[i] === 0x20 || msg[i] === 0x09 || msg[i] === 0x0a || msg[i] === 0x0d)) i++
    if (msg[i] !== 0x3a) return false
    i++
    while (i < end && (msg[i] === 0x20 || msg[i] === 0x09 || msg[i] === 0x0a || msg[i] === 0x0d)) i++
    if (msg[i] === 0x22) i++
    let lo = 0
    let hi = 0
    let digits = 0
    while (i < end) {
      const c = (msg[i] as number) - 0x30
      if (c < 0 || c > 9) break
      const l = lo * 10 + c
      const carry = Math.floor(l / TWO32)
      lo = l - carry * TWO32
      hi = hi * 10 + carry
      if (hi >= TWO32) return false
      digits++
      i++
    }
    if (digits === 0) return false
    this.lo = lo
    this.hi = hi
    return true
  }

  private scanMsgpack(msg: Uint8Array): boolean {
    const first = msg[0] as number
    if ((first >= 0x90 && first <= 0x9f) || first === 0xdc || first === 0xdd) return this.scanPositional(msg)
    const at = indexOf.call(msg, MP_WORKER_KEY) as number
    if (at >= 0 && this.readInt(msg, at + MP_WORKER_KEY.length)) return true
    // an envelope around a positional RouterEvent
    const payload = indexOf.call(msg, MP_PAYLOAD_KEY) as number
    if (payload >= 0 && this.readInt(msg, arrayBody(msg, binBody(msg, payload + MP_PAYLOAD_KEY.length)))) return true
    const pub = indexOf.call(msg, MP_PUBLISHER_KEY) as number
    return pub >= 0 && this.readInt(msg, pub + MP_PUBLISHER_KEY.length)
  }

  /** `[worker_id, …]`, or `[publisher_id, sequence, published_at, topic, payload, …]`. */
  private scanPositional(msg: Uint8Array): boolean {
    if (!this.readInt(msg, arrayBody(msg, 0))) return false
    const second = msg[this.next]
    if (second === undefined || !isIntMarker(second)) return true
    const lo = this.lo
    const hi = this.hi
    let p = skipInt(msg, this.next)
    p = skipInt(msg, p)
    p = skipStr(msg, p)
    p = binBody(msg, p)
    if (p >= 0 && p < msg.length) {
      const m = msg[p] as number
      if ((m >= 0x80 && m <= 0x8f) || m === 0xde || m === 0xdf) {
        const at = indexOf.call(msg, MP_WORKER_KEY, p) as number
        if (at >= 0 && this.readInt(msg, at + MP_WORKER_KEY.length)) return true
      } else if (this.readInt(msg, arrayBody(msg, p))) {
        return true
      }
    }
    this.lo = lo
    this.hi = hi
    return true
  }

  /** A MessagePack integer of at least 0 at p into lo/hi (and its end into next); false for anything else. */
  private readInt(msg: Uint8Array, p: number): boolean {
    if (p < 0 || p >= msg.length) return false
    const m = msg[p] as number
    if (m <= 0x7f) {
      this.lo = m
      this.hi = 0
      this.next = p + 1
      return true
    }
    const w = intWidth(m)
    if (w === 0 || p + 1 + w > msg.length) return false
    // a signed width holding a negative value is no id
    if (m >= 0xd0 && (msg[p + 1] as number) >= 0x80) return false
    if (w === 8) {
      this.hi = u32At(msg, p + 1)
      this.lo = u32At(msg, p + 5)
    } else {
      this.hi = 0
      this.lo = w === 4 ? u32At(msg, p + 1) : w === 2 ? ((msg[p + 1] as number) << 8) | (msg[p + 2] as number) : (msg[p + 1] as number)
    }
    this.next = p + 1 + w
    return true
  }
}

function u32At(msg: Uint8Array, p: number): number {
  return (((msg[p] as number) << 24) | ((msg[p + 1] as number) << 16) | ((msg[p + 2] as number) << 8) | (msg[p + 3] as number)) >>> 0
}

/** Bytes after an integer marker: 1, 2, 4 or 8; 0 when m is no sized integer marker. */
function intWidth(m: number): number {
  if (m === 0xcc || m === 0xd0) return 1
  if (m === 0xcd || m === 0xd1) return 2
  if (m === 0xce || m === 0xd2) return 4
  if (m === 0xcf || m === 0xd3) return 8
  return 0
}

function isIntMarker(m: number): boolean {
  return m <= 0x7f || m >= 0xe0 || intWidth(m) !== 0
}

/** Position after an integer at p; -1 when there is none. */
function skipInt(msg: Uint8Array, p: number): number {
  if (p < 0 || p >= msg.length) return -1
  const m = msg[p] as number
  if (m <= 0x7f || m >= 0xe0) return p + 1
  const w = intWidth(m)
  return w === 0 ? -1 : p + 1 + w
}

/** Position after a string at p; -1 when there is none. */
function skipStr(msg: Uint8Array, p: number): number {
  if (p < 0 || p >= msg.length) return -1
  const m = msg[p] as number
  if (m >= 0xa0 && m <= 0xbf) return p + 1 + (m & 0x1f)
  if (m === 0xd9 && p + 1 < msg.length) return p + 2 + (msg[p + 1] as number)
  if (m === 0xda && p + 2 < msg.length) return p + 3 + (((msg[p + 1] as number) << 8) | (msg[p + 2] as number))
  return -1
}

/** Position of a bin's first byte at p; -1 when there is none. */
function binBody(msg: Uint8Array, p: number): number {
  if (p < 0 || p >= msg.length) return -1
  const m = msg[p] as number
  if (m === 0xc4) return p + 2
  if (m === 0xc5) return p + 3
  if (m === 0xc6) return p + 5
  return -1
}

/** Position of an array's first element at p; -1 when there is no array. */
function arrayBody(msg: Uint8Array, p: number): number {
  if (p < 0 || p >= msg.length) return -1
  const m = msg[p] as number
  if (m >= 0x90 && m <= 0x9f) return p + 1
  if (m === 0xdc) return p + 3
  if (m === 0xdd) return p + 5
  return -1
}
