// Per-publisher sequence numbers of the event plane. Each publisher numbers its messages from 0,
// one more per message, so what follows the last one seen tells what happened:
//   next      sequence = last + 1 (or the first message seen of a publisher)
//   gap       sequence > last + 1: messages never arrived (the SUB fell behind its high-water
//             mark, a reconnect): the worker-rank goes to recovery
//   restart   sequence 0 after a later one: a new publisher counting from 0 again
//   stale     any other sequence ≤ last: late or repeated, dropped
// Publishers are keyed by their u64 id held as u32 halves, so the lookup builds no value.
export const Seq = { Next: 0, Gap: 1, Restart: 2, Stale: 3 } as const
export type Seq = (typeof Seq)[keyof typeof Seq]

interface Publisher {
  hi: number
  lo: number
  lastHi: number
  lastLo: number
}

const TWO32 = 4294967296

export class PublisherSequences {
  private readonly byKey = new Map<number, Publisher[]>()
  /** The last gap's first missing sequence and its count (valid after a Gap verdict). */
  missing = 0

  /** The verdict on a publisher's next message, which becomes its last unless stale. */
  see(pubHi: number, pubLo: number, seqHi: number, seqLo: number): Seq {
    const key = (pubLo ^ Math.imul(pubHi, 0x9e3779b1)) >>> 0
    let list = this.byKey.get(key)
    if (list === undefined) this.byKey.set(key, (list = []))
    let p: Publisher | undefined
    for (const e of list) if (e.hi === pubHi && e.lo === pubLo) p = e
    if (p === undefined) {
      list.push({ hi: pubHi, lo: pubLo, lastHi: seqHi, lastLo: seqLo })
      return Seq.Next
    }
    const last = p.lastHi * TWO32 + p.lastLo
    const seq = seqHi * TWO32 + seqLo
    // above 2^53 the doubles round: compare the halves there
    const exact = p.lastHi < 0x200000 && seqHi < 0x200000
    const after = exact ? seq > last : seqHi > p.lastHi || (seqHi === p.lastHi && seqLo > p.lastLo)
    if (!after) {
      if (seqHi !== 0 || seqLo !== 0) return Seq.Stale
      p.lastHi = 0
      p.lastLo = 0
      return Seq.Restart
    }
    const next = exact ? seq === last + 1 : seqHi === p.lastHi ? seqLo === p.lastLo + 1 : seqLo === 0 && p.lastLo === 0xffffffff && seqHi === p.lastHi + 1
    p.lastHi = seqHi
    p.lastLo = seqLo
    if (next) return Seq.Next
    this.missing = exact ? seq - last - 1 : Number.POSITIVE_INFINITY
    return Seq.Gap
  }

  /** Forgets a publisher (its record went; a new one with its id starts afresh). */
  forget(pubHi: number, pubLo: number): void {
    const key = (pubLo ^ Math.imul(pubHi, 0x9e3779b1)) >>> 0
    const list = this.byKey.get(key)
    if (list === undefined) return
    const rest = list.filter((e) => e.hi !== pubHi || e.lo !== pubLo)
    if (rest.length === 0) this.byKey.delete(key)
    else this.byKey.set(key, rest)
  }

  get size(): number {
    let n = 0
    for (const l of this.byKey.values()) n += l.length
    return n
  }
}
