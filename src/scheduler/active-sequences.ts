// Booked requests and the load they put on each worker-rank: active blocks
// (reference-counted, so a shared prefix counts once per worker-rank), unstarted prefill tokens
// and in-flight requests. A request is a dense handle; every path that ends it (free, stale
// expiry, worker removal) goes through releaseHandle(), which invalidates the handle first, so a
// request is released exactly once whatever ends it and however often it is asked to.
//
// Bookings of other router replicas (replica sync) load the same arrays, so cost and busy checks
// see them, but live in their own id space under an owner number: a peer's request id can never
// free or shadow one of this router's, and everything a peer holds goes at once when it leaves.
import { KvrError } from '../errors.js'
import { limited } from '../runtime/log.js'
import { BlockRefs } from './block-refs.js'
import { growTo } from './typed-arrays.js'

/** How a request's blocks are tracked (Dynamo's active-block tracking toggles). */
export const TRACK_NONE = 0 // --no-router-track-active-blocks: the request adds no blocks
export const TRACK_SHARED = 1 // chained sequence hashes, reference-counted per worker-rank
export const TRACK_UNIQUE = 2 // --no-router-assume-kv-reuse: every block new, never deduplicated
export type TrackMode = typeof TRACK_NONE | typeof TRACK_SHARED | typeof TRACK_UNIQUE

const EMPTY = new Int32Array(0)

/** Told of every change to a slot's load (LoadIndex keeps its order of worker-ranks by it). */
export interface LoadListener {
  loadChanged(slot: number): void
}

/**
 * One booking: the worker-rank it loads and what it puts there. What travels together from the
 * decision to the load arrays and to the observer (replica sync). Callers on the routing path fill
 * one reused object, so a booking allocates nothing for its description; it is read only during the call.
 */
export interface Booking {
  slot: number
  /** Prompt length in tokens. */
  isl: number
  /** The slot's cached prefix, in blocks. */
  overlapBlocks: number
  /** Prefill tokens still to compute on the slot (isl minus the cached prefix; 0 when prefill tracking is off). */
  prefillTokens: number
  /** Whether prefill tokens are tracked (peers are told). */
  trackPrefill: boolean
  /** TRACK_SHARED: the n hashes in lo/hi are referenced on the slot; TRACK_UNIQUE: n blocks are counted without hashes. */
  track: TrackMode
  lo: ArrayLike<number> | undefined
  hi: ArrayLike<number> | undefined
  n: number
}

/** A Booking with every field given or zero (no blocks, prefill tracked), for a reusable scratch or a one-off call. */
export function booking(fields: Partial<Booking> = {}): Booking {
  return { slot: 0, isl: 0, overlapBlocks: 0, prefillTokens: 0, trackPrefill: true, track: TRACK_NONE, lo: undefined, hi: undefined, n: 0, ...fields }
}

/**
 * A local booking as replica catch-up sends it: its shared blocks' hashes read back as u64 halves.
 * trackPrefill is true: prefillTokens is what is left to compute (0 when untracked or done).
 */
export interface LocalBooking extends Booking {
  id: string
  lo: Uint32Array | undefined
  hi: Uint32Array | undefined
}

export interface RequestInfo {
  slot: number
  isl: number
  overlapBlocks: number
  /** Prefill tokens still booked (0 once prefill completed or when not tracked). */
  prefillTokens: number
  /** Blocks the request references (shared or unique). */
  blocks: number
  addedAt: number
}

export class ActiveSequences {
  /** Per slot: distinct active blocks. */
  activeBlocks = new Int32Array(8)
  /** Per slot: booked prefill tokens of requests whose prefill has not completed. */
  prefillTokens = new Float64Array(8)
  /** Per slot: booked requests. */
  inFlight = new Int32Array(8)
  /** Told of each slot whose load changed, once per booking, prefill completion or release. */
  listener: LoadListener | null = null
  /** Requests freed by stale expiry since creation (a metric). */
  expiredTotal = 0
  /** Of them, other replicas' bookings. */
  expiredRemoteTotal = 0

  private readonly refs = new BlockRefs()
  private readonly ids = new Map<string, number>()
  private readonly remoteIds = new Map<string, number>()
  private reqId: (string | undefined)[] = []
  /** Per handle: 0 for this router's bookings, else the peer (replica) that owns it. */
  private reqOwner = new Int32Array(64)
  private reqSlot = new Int32Array(64)
  private reqGen = new Int32Array(64)
  private reqPrefill = new Float64Array(64)
  private reqAddedAt = new Float64Array(64)
  private reqUnique = new Int32Array(64)
  private reqPairCount = new Int32Array(64)
  private reqIsl = new Float64Array(64)
  private reqOverlap = new Float64Array(64)
  private reqPairs: Int32Array<ArrayBuffer>[] = []
  private freeHandles: number[] = []
  private top = 0
  // Pair-index lists recycled by power-of-two size class, so steady-state booking allocates
  // nothing for them.
  private pool: Int32Array<ArrayBuffer>[][] = []
  // Handles in booking order with their generation, for lazy stale expiry: the oldest booking is
  // always at the head, so each check is O(1) amortised.
  private fifo = new Int32Array(128)
  private fifoHead = 0
  private fifoLen = 0

  constructor(private readonly staleMs: number) {}

  /** This router's own bookings. */
  get size(): number {
    return this.ids.size
  }

  /** Other replicas' bookings held. */
  get remoteSize(): number {
    return this.remoteIds.size
  }

  has(id: string): boolean {
    return this.ids.has(id)
  }

  /** Makes the per-slot arrays cover slots [0, n). */
  ensureSlots(n: number): void {
    if (n <= this.activeBlocks.length) return
    const cap = Math.max(n, this.activeBlocks.length * 2)
    this.activeBlocks = growTo(this.activeBlocks, cap)
    this.prefillTokens = growTo(this.prefillTokens, cap)
    this.inFlight = growTo(this.inFlight, cap)
  }

  /**
   * present[slot] = how many of the n hashes are already active on slot (see BlockRefs.countPresent);
   * with `touched`, present must be all zeros and the slots written are listed there (their number returned).
   */
  countPresent(lo: ArrayLike<number>, hi: ArrayLike<number>, n: number, present: Int32Array, touched?: Int32Array): number {
    return this.refs.countPresent(lo, hi, n, present, touched)
  }

  /** Books a request (see Booking). */
  add(id: string, b: Readonly<Booking>, now: number): number {
    if (this.ids.has(id)) throw new KvrError('KVR_ERR_DUPLICATE_REQUEST', `request ${id} is already booked`)
    return this.book(this.ids, id, 0, b, now)
  }

  /**
   * Books another replica's request under `key` (unique per owner and request) for owner ≥ 1;
   * -1 when the key is already booked (a repeated add, or one that catch-up brought first).
   */
  addRemote(key: string, owner: number, b: Readonly<Booking>, now: number): number {
    if (!(owner >= 1)) throw new KvrError('KVR_ERR_INVALID_OPTION', `a remote booking's owner must be ≥ 1, got ${owner}`)
    if (this.remoteIds.has(key)) return -1
    return this.book(this.remoteIds, key, owner, b, now)
  }

  private book(map: Map<string, number>, id: string, owner: number, b: Readonly<Booking>, now: number): number {
    this.expireStale(now)
    const h = this.allocHandle()
    map.set(id, h)
    this.reqId[h] = id
    this.reqOwner[h] = owner
    const slot = b.slot
    const n = b.n
    const lo = b.lo
    const hi = b.hi
    this.reqSlot[h] = slot
    this.reqAddedAt[h] = now
    this.reqIsl[h] = b.isl
    this.reqOverlap[h] = b.overlapBlocks
    this.reqPrefill[h] = b.prefillTokens
    this.prefillTokens[slot] = (this.prefillTokens[slot] as number) + b.prefillTokens
    this.inFlight[slot] = (this.inFlight[slot] as number) + 1
    let unique = 0
    let pairCount = 0
    let pairs = EMPTY
    if (b.track === TRACK_SHARED && n > 0 && lo !== undefined && hi !== undefined) {
      pairs = this.takeList(n)
      pairCount = n
      this.activeBlocks[slot] = (this.activeBlocks[slot] as number) + this.refs.acquireAll(slot, lo, hi, n, pairs)
    } else if (b.track !== TRACK_NONE && n > 0) {
      unique = n
      this.activeBlocks[slot] = (this.activeBlocks[slot] as number) + n
    }
    this.reqPairs[h] = pairs
    this.reqPairCount[h] = pairCount
    this.reqUnique[h] = unique
    this.pushFifo(h)
    this.listener?.loadChanged(slot)
    return h
  }

  /** First token seen: the request's prompt is no longer unstarted work. False if unknown. */
  markPrefillComplete(id: string): boolean {
    return this.prefillDone(this.ids.get(id))
  }

  /** Ends a request (stream end, error, disconnect). False if unknown or already freed. */
  free(id: string): boolean {
    return this.release(this.ids.get(id))
  }

  /** Another replica's request: its prompt is no longer unstarted work. False if unknown. */
  markRemotePrefillComplete(key: string): boolean {
    return this.prefillDone(this.remoteIds.get(key))
  }

  /** Ends another replica's request. False if unknown or already freed. */
  freeRemote(key: string): boolean {
    return this.release(this.remoteIds.get(key))
  }

  private prefillDone(h: number | undefined): boolean {
    if (h === undefined) return false
    if (this.clearPrefill(h)) this.listener?.loadChanged(this.reqSlot[h] as number)
    return true
  }

  private release(h: number | undefined): boolean {
    if (h === undefined) return false
    this.releaseHandle(h)
    return true
  }

  hasRemote(key: string): boolean {
    return this.remoteIds.has(key)
  }

  /** When the remote booking was added (the clock of add()), or -1 when unknown. */
  remoteAddedAt(key: string): number {
    const h = this.remoteIds.get(key)
    return h === undefined ? -1 : (this.reqAddedAt[h] as number)
  }

  /** Frees every booking of one peer (it went away); returns how many. */
  dropOwner(owner: number): number {
    let n = 0
    for (let h = 0; h < this.top; h++) {
      if (this.reqId[h] !== undefined && this.reqOwner[h] === owner) {
        this.releaseHandle(h)
        n++
      }
    }
    return n
  }

  /** Keys of one peer's bookings with when each was added (replica catch-up reconciles them). */
  remoteKeysOf(owner: number): { key: string; addedAt: number }[] {
    const out: { key: string; addedAt: number }[] = []
    for (let h = 0; h < this.top; h++) {
      const key = this.reqId[h]
      if (key !== undefined && this.reqOwner[h] === owner) out.push({ key, addedAt: this.reqAddedAt[h] as number })
    }
    return out
  }

  /** Bookings held per owner (index = owner; 0 = this router's own). */
  countByOwner(): number[] {
    const out: number[] = []
    for (let h = 0; h < this.top; h++) {
      if (this.reqId[h] === undefined) continue
      const o = this.reqOwner[h] as number
      out[o] = (out[o] ?? 0) + 1
    }
    return out
  }

  /** This router's own bookings with their blocks' hashes, for a replica that catches up. */
  localBookings(): LocalBooking[] {
    const out: LocalBooking[] = []
    for (const [id, h] of this.ids) {
      const n = this.reqPairCount[h] as number
      const unique = this.reqUnique[h] as number
      let lo: Uint32Array | undefined
      let hi: Uint32Array | undefined
      if (n > 0) {
        lo = new Uint32Array(n)
        hi = new Uint32Array(n)
        const pairs = this.reqPairs[h] as Int32Array
        for (let i = 0; i < n; i++) this.refs.hashOfPair(pairs[i] as number, lo, hi, i)
      }
      out.push({
        id,
        slot: this.reqSlot[h] as number,
        isl: this.reqIsl[h] as number,
        overlapBlocks: this.reqOverlap[h] as number,
        prefillTokens: this.reqPrefill[h] as number,
        trackPrefill: true,
        track: n > 0 ? TRACK_SHARED : unique > 0 ? TRACK_UNIQUE : TRACK_NONE,
        lo,
        hi,
        n: n > 0 ? n : unique,
      })
    }
    return out
  }

  slotOfRequest(id: string): number {
    const h = this.ids.get(id)
    return h === undefined ? -1 : (this.reqSlot[h] as number)
  }

  /** What a booked request holds (replica sync, debugging); undefined when unknown. */
  requestInfo(id: string): RequestInfo | undefined {
    const h = this.ids.get(id)
    if (h === undefined) return undefined
    return {
      slot: this.reqSlot[h] as number,
      isl: this.reqIsl[h] as number,
      overlapBlocks: this.reqOverlap[h] as number,
      prefillTokens: this.reqPrefill[h] as number,
      blocks: (this.reqPairCount[h] as number) + (this.reqUnique[h] as number),
      addedAt: this.reqAddedAt[h] as number,
    }
  }

  /** Frees requests booked at least staleMs ago; returns how many. */
  expireStale(now: number): number {
    let n = 0
    const remote = this.expiredRemoteTotal
    while (this.fifoLen > 0) {
      const i = this.fifoHead
      const h = this.fifo[i] as number
      const gen = this.fifo[i + 1] as number
      if (this.reqGen[h] === gen && this.reqId[h] !== undefined) {
        if (now - (this.reqAddedAt[h] as number) < this.staleMs) break
        if (this.reqOwner[h] !== 0) this.expiredRemoteTotal++
        this.releaseHandle(h)
        this.expiredTotal++
        n++
      }
      this.fifoHead = (i + 2) % this.fifo.length
      this.fifoLen--
    }
    if (n > 0) {
      const peers = this.expiredRemoteTotal - remote
      limited.warn(
        'bookings_expired',
        { count: n, own: n - peers, peers, stale_secs: this.staleMs / 1000 },
        "bookings older than the stale limit were freed: requests whose end never came (a /v1/route booking never released, a peer's lost free)",
        n,
      )
    }
    return n
  }

  /** Frees every request booked on a slot (the worker-rank went away); returns this router's ids among them. */
  dropSlot(slot: number): string[] {
    const out: string[] = []
    for (let h = 0; h < this.top; h++) {
      const id = this.reqId[h]
      if (id !== undefined && this.reqSlot[h] === slot) {
        if (this.reqOwner[h] === 0) out.push(id)
        this.releaseHandle(h)
      }
    }
    return out
  }

  /** Reference count of a block on a slot (tests, debugging). */
  blockRefCount(slot: number, lo: number, hi: number): number {
    return this.refs.refCount(slot, lo, hi)
  }

  /** Distinct (block, slot) pairs referenced — must be 0 when nothing is booked. */
  get trackedPairs(): number {
    return this.refs.size
  }

  /** Returns whether the slot's booked prefill changed. */
  private clearPrefill(h: number): boolean {
    const p = this.reqPrefill[h] as number
    if (p === 0) return false
    const slot = this.reqSlot[h] as number
    const left = (this.prefillTokens[slot] as number) - p
    // Tokens are integers, so the sum is exact; the clamp only guards against a caller that
    // passed fractional tokens.
    this.prefillTokens[slot] = left > 0 ? left : 0
    this.reqPrefill[h] = 0
    return true
  }

  private releaseHandle(h: number): void {
    const id = this.reqId[h] as string
    // Invalidate first: whatever happens below, this handle can never be released twice.
    this.reqId[h] = undefined
    this.reqGen[h] = (this.reqGen[h] as number) + 1
    if (this.reqOwner[h] === 0) this.ids.delete(id)
    else this.remoteIds.delete(id)
    this.clearPrefill(h)
    const slot = this.reqSlot[h] as number
    this.inFlight[slot] = (this.inFlight[slot] as number) - 1
    const pairs = this.reqPairs[h] as Int32Array<ArrayBuffer>
    const n = this.reqPairCount[h] as number
    let removed = this.reqUnique[h] as number
    for (let i = 0; i < n; i++) if (this.refs.release(pairs[i] as number)) removed++
    this.activeBlocks[slot] = (this.activeBlocks[slot] as number) - removed
    if (pairs.length > 0) this.giveList(pairs)
    this.reqPairs[h] = EMPTY
    this.reqPairCount[h] = 0
    this.reqUnique[h] = 0
    this.freeHandles.push(h)
    this.listener?.loadChanged(slot)
  }

  private allocHandle(): number {
    const h = this.freeHandles.pop()
    if (h !== undefined) return h
    const n = this.top++
    if (n >= this.reqSlot.length) {
      const cap = this.reqSlot.length * 2
      this.reqSlot = growTo(this.reqSlot, cap)
      this.reqOwner = growTo(this.reqOwner, cap)
      this.reqGen = growTo(this.reqGen, cap)
      this.reqUnique = growTo(this.reqUnique, cap)
      this.reqPairCount = growTo(this.reqPairCount, cap)
      this.reqPrefill = growTo(this.reqPrefill, cap)
      this.reqAddedAt = growTo(this.reqAddedAt, cap)
      this.reqIsl = growTo(this.reqIsl, cap)
      this.reqOverlap = growTo(this.reqOverlap, cap)
    }
    return n
  }

  private takeList(n: number): Int32Array<ArrayBuffer> {
    const cls = n <= 1 ? 0 : 32 - Math.clz32(n - 1)
    const list = this.pool[cls]?.pop()
    return list ?? new Int32Array(1 << cls)
  }

  private giveList(a: Int32Array<ArrayBuffer>): void {
    const cls = 31 - Math.clz32(a.length)
    let bucket = this.pool[cls]
    if (bucket === undefined) {
      bucket = []
      this.pool[cls] = bucket
    }
    // Keep a bounded stock per size class; one giant prompt must not pin memory forever.
    if (bucket.length < 256) bucket.push(a)
  }

  private pushFifo(h: number): void {
    if (this.fifoLen * 2 === this.fifo.length) {
      const next = new Int32Array(this.fifo.length * 2)
      for (let k = 0; k < this.fifoLen; k++) {
        const src = (this.fifoHead + 2 * k) % this.fifo.length
        next[2 * k] = this.fifo[src] as number
        next[2 * k + 1] = this.fifo[src + 1] as number
      }
      this.fifo = next
      this.fifoHead = 0
    }
    const at = (this.fifoHead + 2 * this.fifoLen) % this.fifo.length
    this.fifo[at] = h
    this.fifo[at + 1] = this.reqGen[h] as number
    this.fifoLen++
  }
}
