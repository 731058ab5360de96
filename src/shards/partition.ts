// Finds the worker id of a raw event message without decoding it, so the main thread can pick
// the message's shard with O(1) work beyond a native substring search: the first `"worker_id"`
// key (serde writes it first), else the envelope's `"publisher_id"` (Dynamo's publisher id is
// the worker's discovery instance id, and the payload bytes are a number array the search cannot
// see into). The shard decodes and validates the message fully; a message with neither key goes
// to shard 0, where it is counted as malformed with the decoder's precise reason.

const WORKER_KEY = Buffer.from('"worker_id"')
const PUBLISHER_KEY = Buffer.from('"publisher_id"')
const TWO32 = 4294967296
const indexOf = Buffer.prototype.indexOf

export class WorkerIdScan {
  lo = 0
  hi = 0

  /** True when a worker id was found; it is then in lo/hi. */
  scan(msg: Uint8Array): boolean {
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
}
