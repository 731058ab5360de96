// Single-producer/single-consumer byte ring in a SharedArrayBuffer: the main thread writes raw
// event messages, one shard reads them. No locks and no messages: the producer publishes its
// write counter with Atomics.store after the record is complete, the consumer publishes its read
// counter after it is done with a record, so each side only ever reads the other's counter.
//
//   data:   [hdr|payload..pad][hdr|payload..pad]...[PAD → skip to 0]
//   hdr:    u32: bit 31 PAD (rest of the buffer is unused, continue at offset 0),
//                bit 30 MORE (a fragment; the message continues in the next record),
//                bits 0..29 payload length
//
// Counters are byte positions that only grow (mod 2^32); position & (capacity-1) is the offset.
// A record never wraps: when it does not fit before the end, a PAD header skips the tail, so the
// consumer always gets a contiguous view and decodes without copying. Messages larger than a
// quarter of the ring are cut into fragments that the consumer reassembles, so a message of any
// size passes through a ring of any size (it just takes several rounds).

export const RING_PAD = 0x80000000 | 0
export const RING_MORE = 0x40000000
const LEN_MASK = 0x3fffffff

/** Offsets (in Int32 words) of the ring's two counters inside a control Int32Array. */
export interface RingCounters {
  readonly write: number
  readonly read: number
}

function align4(n: number): number {
  return (n + 3) & ~3
}

export function checkRingCapacity(capacity: number): void {
  if (!Number.isInteger(capacity) || capacity < 64 || capacity > 1 << 30 || (capacity & (capacity - 1)) !== 0) {
    throw new RangeError(`ring capacity must be a power of two in [64, 2^30], got ${capacity}`)
  }
}

/** What both ends hold: views of the data and the control words. */
abstract class RingEnd {
  protected readonly words: Int32Array
  protected readonly bytes: Uint8Array
  protected readonly mask: number

  constructor(
    protected readonly ctrl: Int32Array,
    protected readonly at: RingCounters,
    data: SharedArrayBuffer,
  ) {
    checkRingCapacity(data.byteLength)
    this.words = new Int32Array(data)
    this.bytes = new Uint8Array(data)
    this.mask = data.byteLength - 1
  }
}

export class RingProducer extends RingEnd {
  private readonly maxFragment = (this.mask + 1) / 4 - 4

  get capacity(): number {
    return this.mask + 1
  }

  /** Bytes currently unread. */
  get used(): number {
    return (Atomics.load(this.ctrl, this.at.write) - Atomics.load(this.ctrl, this.at.read)) >>> 0
  }

  /**
   * Writes `msg[offset..]` as far as space allows, whole fragments only, and returns the new
   * offset: `msg.length` when the message is fully in the ring, less when the ring filled up
   * (call again with the returned offset once the consumer has read). Never overwrites unread data.
   * An empty message writes nothing: a message is never empty on this protocol.
   */
  write(msg: Uint8Array, offset = 0): number {
    const ctrl = this.ctrl
    const cap = this.mask + 1
    let w = Atomics.load(ctrl, this.at.write) >>> 0
    const r = Atomics.load(ctrl, this.at.read) >>> 0
    let free = cap - ((w - r) >>> 0)
    const start = w
    let off = offset
    const total = msg.length
    while (off < total) {
      const len = Math.min(total - off, this.maxFragment)
      const need = 4 + align4(len)
      const pos = w & this.mask
      const tail = cap - pos
      const pad = need > tail ? tail : 0
      if (pad + need > free) break
      if (pad > 0) {
        this.words[pos >> 2] = RING_PAD
        w = (w + pad) >>> 0
        free -= pad
      }
      const p = w & this.mask
      const more = off + len < total ? RING_MORE : 0
      this.words[p >> 2] = len | more
      this.bytes.set(len === total ? msg : msg.subarray(off, off + len), p + 4)
      w = (w + need) >>> 0
      free -= need
      off += len
    }
    if (w !== start) Atomics.store(ctrl, this.at.write, w | 0)
    return off
  }
}

export class RingConsumer extends RingEnd {
  private assembly = new Uint8Array(1024)
  private assembled = 0
  private r = Atomics.load(this.ctrl, this.at.read) >>> 0

  /** True when no record is waiting. */
  empty(): boolean {
    return Atomics.load(this.ctrl, this.at.write) >>> 0 === this.r
  }

  /**
   * Hands up to `max` complete messages to `onMessage` (a view valid only during the call) and
   * returns how many it handed over. The read counter is published once at the end, so the
   * producer sees the space only after the views are no longer used.
   */
  read(max: number, onMessage: (msg: Uint8Array) => void): number {
    const w = Atomics.load(this.ctrl, this.at.write) >>> 0
    let r = this.r
    let n = 0
    while (r !== w && n < max) {
      const pos = r & this.mask
      const h = this.words[pos >> 2] as number
      if (h === RING_PAD) {
        r = (r + (this.mask + 1 - pos)) >>> 0
        continue
      }
      const len = h & LEN_MASK
      const view = this.bytes.subarray(pos + 4, pos + 4 + len)
      r = (r + 4 + align4(len)) >>> 0
      if ((h & RING_MORE) !== 0 || this.assembled > 0) {
        this.append(view)
        if ((h & RING_MORE) !== 0) continue
        const whole = this.assembly.subarray(0, this.assembled)
        this.assembled = 0
        onMessage(whole)
      } else {
        onMessage(view)
      }
      n++
    }
    if (r !== this.r) {
      this.r = r
      Atomics.store(this.ctrl, this.at.read, r | 0)
    }
    return n
  }

  private append(view: Uint8Array): void {
    const need = this.assembled + view.length
    if (need > this.assembly.length) {
      let cap = this.assembly.length * 2
      while (cap < need) cap *= 2
      const grown = new Uint8Array(cap)
      grown.set(this.assembly.subarray(0, this.assembled))
      this.assembly = grown
    }
    this.assembly.set(view, this.assembled)
    this.assembled = need
  }
}
