// One RouterEvent as the index applies it, whatever encoding it came in: u64 values as u32
// halves (exact above 2^53, no bigint), block lists in growable typed arrays, reused from one
// event to the next so that nothing is allocated per block.

export const EventKind = { Stored: 1, Removed: 2, Cleared: 3 } as const
export type EventKind = (typeof EventKind)[keyof typeof EventKind]

/** Storage tiers, for the events that name one; only `device` blocks are routed on. */
export const StorageTier = { Device: 0, HostPinned: 1, Disk: 2, External: 3 } as const

export class DecodedEvent {
  workerLo = 0
  workerHi = 0
  eventIdLo = 0
  eventIdHi = 0
  dpRank = 0
  kind: EventKind = EventKind.Cleared
  tier = 0
  hasParent = false
  parentLo = 0
  parentHi = 0
  /** Blocks of a stored event, or hashes of a removed event. */
  count = 0
  blockLo: Uint32Array = new Uint32Array(64)
  blockHi: Uint32Array = new Uint32Array(64)
  tokensLo: Uint32Array = new Uint32Array(64)
  tokensHi: Uint32Array = new Uint32Array(64)
  hasEnvelope = false
  publisherLo = 0
  publisherHi = 0
  sequenceLo = 0
  sequenceHi = 0

  reset(): void {
    this.workerLo = this.workerHi = this.eventIdLo = this.eventIdHi = this.dpRank = 0
    this.kind = EventKind.Cleared
    this.tier = 0
    this.hasParent = false
    this.parentLo = this.parentHi = 0
    this.count = 0
    this.hasEnvelope = false
    this.publisherLo = this.publisherHi = this.sequenceLo = this.sequenceHi = 0
  }

  ensure(n: number): void {
    // Called per block: no closure in here, as a captured variable makes every call allocate
    // a context (about 40 bytes of garbage per block, a scavenge every few ms on a shard).
    if (n <= this.blockLo.length) return
    let cap = this.blockLo.length * 2
    while (cap < n) cap *= 2
    this.blockLo = grown(this.blockLo, cap)
    this.blockHi = grown(this.blockHi, cap)
    this.tokensLo = grown(this.tokensLo, cap)
    this.tokensHi = grown(this.tokensHi, cap)
  }
}

function grown(a: Uint32Array, cap: number): Uint32Array {
  const b = new Uint32Array(cap)
  b.set(a)
  return b
}
