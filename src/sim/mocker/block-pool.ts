// The paged KV block pool of one simulated engine, with prefix caching: a full
// block is identified by its chained sequence hash, which names the whole prefix up
// to and including it, so finding a prompt's cached prefix is one lookup per block.
//
// A cached block is either active (held by at least one running request) or inactive (kept
// for reuse, evictable, in LRU order). KV events follow the mocker: only a fresh allocation of
// a full block emits Stored; reusing a cached block emits nothing; evicting emits Removed.
// The event's `block_hash` is the sequence hash (the engine's external id), `tokens_hash` the
// local hash the router navigates by.
//
// Eviction never orphans a cached block. A request releases its blocks last-first, so a chain's
// tail is always older in the LRU than its head, and any request that touches a block also
// touches all its ancestors. The least recently used inactive block is therefore always a leaf
// of the cached set, and the cached set stays closed under prefixes — which is what makes the
// router's radix tree, rebuilt from these events, agree with the pool block for block (the
// property test checks exactly that). Should a chain ever be broken anyway (a cached block
// found after a miss), the block is re-announced in the Stored event rather than silently
// reused, because the router dropped it from the tree when its parent went.
//
// Everything per block lives in typed arrays indexed by slot and u64 hashes are u32 halves; the
// only bigints are the ones inside event objects, built only when a sink is attached.
//
// With a host tier (`hostCapacity` > 0, host-tier.ts) an evicted block is offloaded there rather
// than lost, with a Stored event of tier `host_pinned` (vLLM's `medium: "CPU"`) after the device's
// Removed; the host tier's own evictions are Removed events of that tier. A block brought back
// from the host is a device miss like any other: a fresh slot and a device Stored event, as vLLM
// announces the blocks it loads; the host keeps its copy. For the host events the pool keeps each
// device block's parent and token ids, which it otherwise has no use for.
import type { RouterEvent, StorageTierName, StoredBlock } from '../../codec/events.js'
import { sequenceHashesInto } from '../../codec/hashing.js'
import { u64FromParts } from '../../codec/u64.js'
import { HostTier } from './host-tier.js'

export interface BlockPoolOptions {
  /** Blocks the pool holds (an engine's `num_gpu_blocks`). */
  capacity: number
  /** Tokens per block; informational here, the pool works on hashes of complete blocks. */
  blockSize: number
  workerId?: bigint
  dpRank?: number
  /** Blocks of the host (CPU) offload tier; 0 (default): none. */
  hostCapacity?: number
  /**
   * Receives every KV event, in order. Without one, no event objects are built at all. With a
   * Stored event comes `tokens` when the allocation was given the request's tokens: the token
   * ids of the stored blocks, blockSize per block (a view of the caller's array, not a copy).
   */
  sink?: BlockPoolSink
}

export type BlockPoolSink = (ev: RouterEvent, tokens?: Uint32Array) => void

export type RequestId = number | string

export interface AllocateResult {
  /** False when the blocks could not be found room for: nothing was changed (preempt). */
  ok: boolean
  /** Blocks of this call that were cached (a contiguous run from its first block). */
  hits: number
  /** Blocks freshly stored by this call. */
  stored: number
  /** Inactive blocks evicted to make room. */
  evicted: number
  /** Blocks the call needed room for (the misses). */
  needed: number
  /** Blocks that could be made free: free slots plus evictable inactive ones. */
  available: number
}

/** Largest capacity; keeps every slot index and the hash table comfortably in int32 range. */
export const MAX_POOL_CAPACITY = 1 << 26

const EMPTY = -1

function checkCount(n: number, lo: Uint32Array, hi: Uint32Array): void {
  if (!Number.isInteger(n) || n < 0 || n > lo.length || n > hi.length) {
    throw new RangeError(`block count ${String(n)} is not within the ${Math.min(lo.length, hi.length)} hashes given`)
  }
}

interface RequestBlocks {
  slots: Int32Array
  count: number
}

export class BlockPool {
  readonly capacity: number
  readonly blockSize: number
  readonly workerId: bigint
  readonly dpRank: number
  private readonly sink: BlockPoolSink | undefined
  /** The host offload tier, or null. */
  readonly host: HostTier | null
  // with a host tier: each device block's parent and token ids (the host events carry them)
  private parLo: Uint32Array | null = null
  private parHi: Uint32Array | null = null
  private hasPar: Uint8Array | null = null
  private slotTokens: Uint32Array | null = null
  private hasTok: Uint8Array | null = null

  // --- per-slot state ---
  private seqLo: Uint32Array
  private seqHi: Uint32Array
  private tokLo: Uint32Array
  private tokHi: Uint32Array
  /** Running requests holding the block; -1 marks a free slot. */
  private refs: Int32Array
  /** LRU of inactive blocks: a doubly linked list through slots, sentinel at `capacity`. */
  private prev: Int32Array
  private next: Int32Array
  private freeSlots: Int32Array
  private freeCount: number

  // --- sequence hash → slot: open addressing, linear probing, backward-shift deletion ---
  private table: Int32Array
  private mask: number
  private shift: number

  private requests = new Map<RequestId, RequestBlocks>()

  // --- scratch for one allocation ---
  private found = new Int32Array(64)
  private sLo = new Uint32Array(65)
  private sHi = new Uint32Array(65)
  private cLo = new Uint32Array(65)
  private cHi = new Uint32Array(65)
  private evLo: number[] = []
  private evHi: number[] = []

  // --- counters ---
  private active = 0
  private nextEventId = 1
  /** Prompt blocks found cached, over all allocations. */
  hits = 0
  /** Prompt blocks not found cached, over all successful allocations. */
  misses = 0
  evictions = 0
  /** Blocks announced in Stored events. */
  storedBlocks = 0
  /** Allocations refused for lack of room. */
  preemptions = 0
  /** Events emitted (whether or not a sink consumed them). */
  events = 0
  /** Blocks brought back from the host tier (a request's prefix continued there). */
  hostLoads = 0

  constructor(options: BlockPoolOptions) {
    const { capacity, blockSize } = options
    if (!Number.isInteger(capacity) || capacity < 1 || capacity > MAX_POOL_CAPACITY) {
      throw new RangeError(`block pool capacity must be an integer in [1, ${MAX_POOL_CAPACITY}], got ${String(capacity)}`)
    }
    if (!Number.isInteger(blockSize) || blockSize < 1) throw new RangeError(`block size must be a positive integer, got ${String(blockSize)}`)
    const dpRank = options.dpRank ?? 0
    if (!Number.isInteger(dpRank) || dpRank < 0 || dpRank > 0xffffffff) throw new RangeError(`dp_rank must be a u32, got ${String(dpRank)}`)
    const workerId = options.workerId ?? 0n
    if (workerId < 0n || workerId > 0xffffffffffffffffn) throw new RangeError(`worker id must be a u64, got ${String(workerId)}`)
    this.capacity = capacity
    this.blockSize = blockSize
    this.workerId = workerId
    this.dpRank = dpRank
    this.sink = options.sink
    this.seqLo = new Uint32Array(capacity)
    this.seqHi = new Uint32Array(capacity)
    this.tokLo = new Uint32Array(capacity)
    this.tokHi = new Uint32Array(capacity)
    this.refs = new Int32Array(capacity).fill(-1)
    this.prev = new Int32Array(capacity + 1).fill(EMPTY)
    this.next = new Int32Array(capacity + 1).fill(EMPTY)
    this.prev[capacity] = capacity
    this.next[capacity] = capacity
    // Handed out from the low slots first; the order is irrelevant to behaviour.
    this.freeSlots = new Int32Array(capacity)
    for (let i = 0; i < capacity; i++) this.freeSlots[i] = capacity - 1 - i
    this.freeCount = capacity
    let bits = 4
    while (1 << bits < capacity * 2) bits++
    this.table = new Int32Array(1 << bits).fill(EMPTY)
    this.mask = (1 << bits) - 1
    this.shift = 32 - bits
    const hostCapacity = options.hostCapacity ?? 0
    if (!Number.isInteger(hostCapacity) || hostCapacity < 0 || hostCapacity > MAX_POOL_CAPACITY) {
      throw new RangeError(`host tier capacity must be an integer in [0, ${MAX_POOL_CAPACITY}], got ${String(hostCapacity)}`)
    }
    // token ids only matter to a sink's events
    const keepTokens = this.sink !== undefined
    this.host = hostCapacity > 0 ? new HostTier(hostCapacity, blockSize, keepTokens) : null
    if (this.host !== null) {
      this.parLo = new Uint32Array(capacity)
      this.parHi = new Uint32Array(capacity)
      this.hasPar = new Uint8Array(capacity)
      this.hasTok = new Uint8Array(capacity)
      if (keepTokens) this.slotTokens = new Uint32Array(capacity * blockSize)
    }
  }

  // ------------------------------------------------------------------------------------------
  // introspection

  /** Blocks holding cached content (active + inactive). */
  get used(): number {
    return this.capacity - this.freeCount
  }
  /** Blocks held by running requests. */
  get activeBlocks(): number {
    return this.active
  }
  /** Cached blocks no request holds (evictable). */
  get inactiveBlocks(): number {
    return this.capacity - this.freeCount - this.active
  }
  get freeBlocks(): number {
    return this.freeCount
  }
  /** Requests currently holding blocks (or registered with none). */
  get runningRequests(): number {
    return this.requests.size
  }
  /** event_id of the next event. */
  get nextEvent(): number {
    return this.nextEventId
  }

  /** Sequence hashes of every cached block. Cold path (builds bigints). */
  cachedBlocks(): Set<bigint> {
    const out = new Set<bigint>()
    for (let s = 0; s < this.capacity; s++) if ((this.refs[s] as number) >= 0) out.add(u64FromParts(this.seqLo[s] as number, this.seqHi[s] as number))
    return out
  }

  /** Every cached block's local hash (tokens_hash) by its sequence hash. Cold path. */
  cachedTokensHashes(): Map<bigint, bigint> {
    const out = new Map<bigint, bigint>()
    for (let s = 0; s < this.capacity; s++) {
      if ((this.refs[s] as number) >= 0)
        out.set(u64FromParts(this.seqLo[s] as number, this.seqHi[s] as number), u64FromParts(this.tokLo[s] as number, this.tokHi[s] as number))
    }
    return out
  }

  /** Blocks held by a request, or -1 when it is unknown. */
  requestBlocks(requestId: RequestId): number {
    const r = this.requests.get(requestId)
    return r === undefined ? -1 : r.count
  }

  /** True when a block with this sequence hash is cached. */
  isCached(seqLo: number, seqHi: number): boolean {
    return this.lookup(seqLo >>> 0, seqHi >>> 0) !== EMPTY
  }

  /** Refcount of a cached block (0 = inactive), or -1 when not cached. */
  refCount(seqLo: number, seqHi: number): number {
    const s = this.lookup(seqLo >>> 0, seqHi >>> 0)
    return s === EMPTY ? -1 : (this.refs[s] as number)
  }

  /** Sequence hashes of the inactive blocks, least recently used first (next to evict first). */
  lruOrder(): bigint[] {
    const out: bigint[] = []
    const c = this.capacity
    for (let s = this.next[c] as number; s !== c; s = this.next[s] as number) out.push(u64FromParts(this.seqLo[s] as number, this.seqHi[s] as number))
    return out
  }

  /**
   * Cached prefix of a prompt, in blocks, without touching the pool: what an allocation now
   * would count as hits.
   */
  prefixHits(localLo: Uint32Array, localHi: Uint32Array, n: number): number {
    checkCount(n, localLo, localHi)
    this.ensureScratch(n)
    sequenceHashesInto(localLo, localHi, n, this.sLo, this.sHi)
    let h = 0
    while (h < n && this.lookup(this.sLo[h] as number, this.sHi[h] as number) !== EMPTY) h++
    return h
  }

  /**
   * Blocks from(inclusive) … to(exclusive) of a prompt, by sequence hash, that the host tier
   * holds in a row from `from`: how far a device match continues there. 0 without a host tier.
   */
  hostRun(seqLo: Uint32Array, seqHi: Uint32Array, from: number, to: number): number {
    const h = this.host
    if (h === null) return 0
    let i = from
    while (i < to && h.find(seqLo[i] as number, seqHi[i] as number) !== EMPTY) i++
    return i - from
  }

  // ------------------------------------------------------------------------------------------
  // allocation

  /**
   * Gives request `requestId` the first `n` complete blocks of its prompt (local hashes as
   * halves). A request that already holds blocks is extended (e.g. by decoded blocks): its held
   * blocks must be the first ones of `n`, and only the rest is processed. Either every block is
   * placed, or — when misses outnumber free plus evictable blocks — nothing changes and the
   * result says `ok: false`: the engine's cue to preempt or queue. `tokens`, the request's token
   * ids from its first block on, only travels to the sink with the Stored event (engines that
   * publish vLLM's events, which carry them).
   */
  allocate(requestId: RequestId, localLo: Uint32Array, localHi: Uint32Array, n: number, tokens?: Uint32Array): AllocateResult {
    checkCount(n, localLo, localHi)
    if (tokens !== undefined && tokens.length < n * this.blockSize)
      throw new RangeError(`${n} blocks need ${n * this.blockSize} tokens, ${tokens.length} given`)
    const req = this.requests.get(requestId)
    const held = req === undefined ? 0 : req.count
    if (n < held) throw new RangeError(`request ${String(requestId)} holds ${held} blocks; an allocation cannot shrink it to ${n}`)
    const m = n - held
    this.ensureScratch(m)
    // Sequence hashes of the new part, chained from the last held block: sequenceHashesInto
    // starts its chain with element 0 as given, so the parent's hash goes there.
    const cLo = this.cLo
    const cHi = this.cHi
    const sLo = this.sLo
    const sHi = this.sHi
    let parentLo = 0
    let parentHi = 0
    if (held > 0) {
      const ps = (req as RequestBlocks).slots[held - 1] as number
      parentLo = this.seqLo[ps] as number
      parentHi = this.seqHi[ps] as number
      cLo[0] = parentLo
      cHi[0] = parentHi
      cLo.set(localLo.subarray(held, n), 1)
      cHi.set(localHi.subarray(held, n), 1)
      sequenceHashesInto(cLo, cHi, m + 1, sLo, sHi)
      sLo.copyWithin(0, 1, m + 1)
      sHi.copyWithin(0, 1, m + 1)
    } else {
      sequenceHashesInto(localLo, localHi, n, sLo, sHi)
    }

    // Pass 1, read-only: what is cached, and is there room for the rest?
    const found = this.found
    let hits = 0
    let prefix = true
    let needed = 0
    let pinned = 0
    for (let i = 0; i < m; i++) {
      const s = this.lookup(sLo[i] as number, sHi[i] as number)
      found[i] = s
      if (s === EMPTY) {
        prefix = false
        needed++
      } else {
        if (prefix) hits++
        if (this.refs[s] === 0) pinned++
      }
    }
    const available = this.freeCount + this.inactiveBlocks - pinned
    if (needed > available) {
      this.preemptions++
      return { ok: false, hits, stored: 0, evicted: 0, needed, available }
    }

    // Pass 2: pin every cached block first, so making room can never evict one of them.
    let r = req
    if (r === undefined) {
      r = { slots: new Int32Array(Math.max(4, n)), count: 0 }
      this.requests.set(requestId, r)
    } else if (r.slots.length < n) {
      const grown = new Int32Array(Math.max(n, r.slots.length * 2))
      grown.set(r.slots.subarray(0, r.count))
      r.slots = grown
    }
    for (let i = 0; i < m; i++) {
      const s = found[i] as number
      if (s !== EMPTY) this.acquire(s)
    }
    const host = this.host
    // a new request's prefix continued in the host tier is loaded from there: most recently used
    // before making room offloads anything
    if (host !== null && held === 0) this.touchHostRun(host, hits, m)
    for (let i = 0; i < m; i++) {
      let s = found[i] as number
      if (s === EMPTY) {
        s = this.takeSlot()
        this.seqLo[s] = sLo[i] as number
        this.seqHi[s] = sHi[i] as number
        this.tokLo[s] = localLo[held + i] as number
        this.tokHi[s] = localHi[held + i] as number
        this.refs[s] = 1
        this.active++
        this.insert(s)
        found[i] = s
        if (host !== null) this.keepForHost(s, i, held, parentLo, parentHi, tokens)
      }
      r.slots[held + i] = s
    }
    r.count = n
    const evicted = this.evLo.length
    const stored = m - hits
    this.hits += hits
    this.misses += stored
    this.evictions += evicted
    this.storedBlocks += stored

    // Both events are built before the sink sees either, so a sink that calls back into the
    // pool cannot disturb this allocation's scratch state.
    let storedData: RouterEvent['event']['data'] | null = null
    if (stored > 0 && this.sink !== undefined) {
      let hasParent = true
      if (hits > 0) {
        parentLo = sLo[hits - 1] as number
        parentHi = sHi[hits - 1] as number
      } else if (held === 0) hasParent = false
      storedData = this.storedData(hasParent, parentLo, parentHi, hits, m)
    }
    const hostEvents = host?.changed ? this.hostEvents(host) : null
    // Removed first: the router must drop the old blocks before it sees the ones in their place.
    if (evicted > 0) this.emitRemoved()
    if (hostEvents !== null) for (const [data, toks] of hostEvents) this.emit(data, toks, 'host_pinned')
    // the Stored event's blocks are the request's blocks held + hits … n (after the cached run)
    if (stored > 0)
      this.emit(storedData, storedData !== null && tokens !== undefined ? tokens.subarray((held + hits) * this.blockSize, n * this.blockSize) : undefined)
    return { ok: true, hits, stored, evicted, needed, available }
  }

  /**
   * Drops a request's hold on its blocks; a block nobody holds any more becomes the most
   * recently used inactive block. Returns false for an unknown request.
   */
  release(requestId: RequestId): boolean {
    const r = this.requests.get(requestId)
    if (r === undefined) return false
    this.requests.delete(requestId)
    // Last block first: a chain's tail must be older in the LRU than its head (see the top).
    for (let i = r.count - 1; i >= 0; i--) {
      const s = r.slots[i] as number
      const c = (this.refs[s] as number) - 1
      this.refs[s] = c
      if (c === 0) {
        this.active--
        this.lruPush(s)
      }
    }
    return true
  }

  // ------------------------------------------------------------------------------------------
  // internals

  private ensureScratch(m: number): void {
    if (this.found.length >= m) return
    let cap = this.found.length
    while (cap < m) cap *= 2
    this.found = new Int32Array(cap)
    this.sLo = new Uint32Array(cap + 1)
    this.sHi = new Uint32Array(cap + 1)
    this.cLo = new Uint32Array(cap + 1)
    this.cHi = new Uint32Array(cap + 1)
  }

  private acquire(s: number): void {
    const c = this.refs[s] as number
    if (c === 0) {
      this.lruUnlink(s)
      this.active++
    }
    this.refs[s] = c + 1
  }

  /** A free slot, evicting the least recently used inactive block when there is none. */
  private takeSlot(): number {
    if (this.freeCount > 0) return this.freeSlots[--this.freeCount] as number
    const c = this.capacity
    const s = this.next[c] as number
    // Unreachable after pass 1's room check; guards the invariant rather than exceed capacity.
    if (s === c) throw new Error('block pool invariant broken: no free or inactive block')
    this.lruUnlink(s)
    if (this.host !== null) this.offload(this.host, s)
    this.remove(s)
    this.evLo.push(this.seqLo[s] as number)
    this.evHi.push(this.seqHi[s] as number)
    return s
  }

  /** Touches the host tier's run of the new blocks from the first device miss (hostRun's). */
  private touchHostRun(host: HostTier, from: number, m: number): void {
    for (let i = from; i < m; i++) {
      const h = host.find(this.sLo[i] as number, this.sHi[i] as number)
      if (h === EMPTY) return
      host.touch(h)
      if (this.found[i] === EMPTY) this.hostLoads++
    }
  }

  /** Records a new device block's parent and token ids, for its host events later. */
  private keepForHost(s: number, i: number, held: number, parentLo: number, parentHi: number, tokens: Uint32Array | undefined): void {
    const hasPar = this.hasPar as Uint8Array
    if (i > 0) {
      ;(this.parLo as Uint32Array)[s] = this.sLo[i - 1] as number
      ;(this.parHi as Uint32Array)[s] = this.sHi[i - 1] as number
      hasPar[s] = 1
    } else {
      ;(this.parLo as Uint32Array)[s] = parentLo
      ;(this.parHi as Uint32Array)[s] = parentHi
      hasPar[s] = held > 0 ? 1 : 0
    }
    const st = this.slotTokens
    const bs = this.blockSize
    if (st !== null && tokens !== undefined) {
      st.set(tokens.subarray((held + i) * bs, (held + i + 1) * bs), s * bs)
      ;(this.hasTok as Uint8Array)[s] = 1
    } else (this.hasTok as Uint8Array)[s] = 0
  }

  /** Hands an evicted device block to the host tier (before its slot is reused). */
  private offload(host: HostTier, s: number): void {
    const hasTok = (this.hasTok as Uint8Array)[s] === 1
    host.offload(
      this.seqLo[s] as number,
      this.seqHi[s] as number,
      this.tokLo[s] as number,
      this.tokHi[s] as number,
      (this.hasPar as Uint8Array)[s] === 1,
      (this.parLo as Uint32Array)[s] as number,
      (this.parHi as Uint32Array)[s] as number,
      hasTok ? this.slotTokens : null,
      s * this.blockSize,
    )
  }

  /**
   * The host tier's changes of this allocation as event data, in order: one Removed for the blocks
   * it evicted, then a Stored per block it took (each with its own parent, as vLLM announces
   * offloaded blocks). Data is null without a sink; the events are numbered all the same.
   */
  private hostEvents(host: HostTier): [RouterEvent['event']['data'] | null, Uint32Array | undefined][] {
    const out: [RouterEvent['event']['data'] | null, Uint32Array | undefined][] = []
    const build = this.sink !== undefined
    const n = host.removedLo.length
    if (n > 0) {
      let data: RouterEvent['event']['data'] | null = null
      if (build) {
        const block_hashes = new Array<bigint>(n)
        for (let i = 0; i < n; i++) block_hashes[i] = u64FromParts(host.removedLo[i] as number, host.removedHi[i] as number)
        data = { removed: { block_hashes } }
      }
      out.push([data, undefined])
    }
    const bs = this.blockSize
    host.takeChanges((s) => {
      if (!build) {
        out.push([null, undefined])
        return
      }
      const parent = host.hasPar[s] === 1 ? u64FromParts(host.parLo[s] as number, host.parHi[s] as number) : null
      const block = {
        block_hash: u64FromParts(host.seqLo[s] as number, host.seqHi[s] as number),
        tokens_hash: u64FromParts(host.tokLo[s] as number, host.tokHi[s] as number),
      }
      // a copy: the slot may be taken by another block before a publisher is done with it
      const toks = host.tokens !== null && host.hasTok[s] === 1 ? host.tokens.slice(s * bs, (s + 1) * bs) : undefined
      out.push([{ stored: { parent_hash: parent, blocks: [block] } }, toks])
    })
    return out
  }

  private lruPush(s: number): void {
    const c = this.capacity
    const last = this.prev[c] as number
    this.prev[s] = last
    this.next[s] = c
    this.next[last] = s
    this.prev[c] = s
  }

  private lruUnlink(s: number): void {
    const p = this.prev[s] as number
    const nx = this.next[s] as number
    this.next[p] = nx
    this.prev[nx] = p
    this.prev[s] = EMPTY
    this.next[s] = EMPTY
  }

  // Multiplicative hashing keeping the top bits, which depend on every bit of both halves:
  // sequence hashes are XXH3 outputs and well spread anyway, but callers may hand in
  // structured local hashes (tests do), and masking low bits would let those cluster.
  private home(lo: number, hi: number): number {
    return Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> this.shift
  }

  private lookup(lo: number, hi: number): number {
    const t = this.table
    const mask = this.mask
    for (let i = this.home(lo, hi); ; i = (i + 1) & mask) {
      const s = t[i] as number
      if (s === EMPTY) return EMPTY
      if (this.seqLo[s] === lo && this.seqHi[s] === hi) return s
    }
  }

  private insert(s: number): void {
    const t = this.table
    const mask = this.mask
    let i = this.home(this.seqLo[s] as number, this.seqHi[s] as number)
    while (t[i] !== EMPTY) i = (i + 1) & mask
    t[i] = s
  }

  /** Removes slot s from the table and frees it (its seq hash stays readable until reuse). */
  private remove(s: number): void {
    const t = this.table
    const mask = this.mask
    let i = this.home(this.seqLo[s] as number, this.seqHi[s] as number)
    while (t[i] !== s) i = (i + 1) & mask
    // Backward-shift deletion keeps probe chains intact without tombstones: move later
    // entries of the cluster into the hole when their home position allows it.
    let j = i
    for (;;) {
      j = (j + 1) & mask
      const x = t[j] as number
      if (x === EMPTY) break
      const h = this.home(this.seqLo[x] as number, this.seqHi[x] as number)
      // x may fill the hole at i unless its home lies cyclically in (i, j].
      if (i <= j ? h <= i || h > j : h <= i && h > j) {
        t[i] = x
        i = j
      }
    }
    t[i] = EMPTY
    this.refs[s] = -1
  }

  private emitRemoved(): void {
    const evLo = this.evLo
    const evHi = this.evHi
    let data: RouterEvent['event']['data'] | null = null
    if (this.sink !== undefined) {
      const block_hashes: bigint[] = new Array<bigint>(evLo.length)
      for (let i = 0; i < evLo.length; i++) block_hashes[i] = u64FromParts(evLo[i] as number, evHi[i] as number)
      data = { removed: { block_hashes } }
    }
    evLo.length = 0
    evHi.length = 0
    this.emit(data)
  }

  /** Stored data for the blocks found[from..to) of this call, chained under the parent. */
  private storedData(hasParent: boolean, parentLo: number, parentHi: number, from: number, to: number): RouterEvent['event']['data'] {
    const blocks: StoredBlock[] = new Array<StoredBlock>(to - from)
    for (let k = from; k < to; k++) {
      const s = this.found[k] as number
      blocks[k - from] = {
        block_hash: u64FromParts(this.seqLo[s] as number, this.seqHi[s] as number),
        tokens_hash: u64FromParts(this.tokLo[s] as number, this.tokHi[s] as number),
      }
    }
    return { stored: { parent_hash: hasParent ? u64FromParts(parentLo, parentHi) : null, blocks } }
  }

  /** Numbers and sends one event; `data` is null when there is no sink to send it to. */
  private emit(data: RouterEvent['event']['data'] | null, tokens?: Uint32Array, tier?: StorageTierName): void {
    const id = this.nextEventId++
    this.events++
    if (data === null || this.sink === undefined) return
    const ev: RouterEvent = { worker_id: this.workerId, event: { event_id: BigInt(id), data, dp_rank: this.dpRank } }
    if (tier !== undefined) ev.storage_tier = tier
    this.sink(ev, tokens)
  }
}
