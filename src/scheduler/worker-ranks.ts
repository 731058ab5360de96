// The worker-rank table: the unit the scheduler books onto is (worker_id, dp_rank),
// and on the main thread every such pair is a dense integer slot so that loads, overlaps and
// candidate sets are plain typed arrays indexed by slot. Registration is rare (discovery), so
// the bigint-keyed maps live only here; the per-request path reads the typed arrays.
import { fmix32 } from '../codec/hash-mix.js'
import { KvrError } from '../errors.js'
import { DEFAULT_MAX_BATCHED_TOKENS } from './options.js'
import { grow } from './typed-arrays.js'

export type DeviceType = 'gpu' | 'cpu'
export const DEVICE_GPU = 0
export const DEVICE_CPU = 1

export interface WorkerRankInfo {
  /** 'cpu' workers form their own group in device-aware-weighted mode; anything else is non-CPU. */
  device?: DeviceType
  /** From the worker's runtime config; DEFAULT_MAX_BATCHED_TOKENS when unknown. */
  maxNumBatchedTokens?: number
  /** KV capacity in blocks, needed by the decode-blocks busy threshold; 0/undefined = unknown. */
  totalKvBlocks?: number
}

interface WorkerEntry {
  index: number
  ranks: Map<number, number>
}

const MAX_DP_RANK = 0xffffffff

export class WorkerRanks {
  /** Per slot: 1 while registered. */
  live = new Uint8Array(8)
  device = new Uint8Array(8)
  maxNumBatchedTokens = new Float64Array(8)
  totalKvBlocks = new Float64Array(8)
  /**
   * The worker's own count of active KV blocks from its load metrics (`kv_metrics`),
   * or -1 when it has reported none; load shedding takes the larger of it and the router's own.
   */
  reportedActiveBlocks = new Float64Array(8).fill(-1)
  dpRank = new Uint32Array(8)
  /**
   * Per slot: a 32-bit hash of (worker id, dp rank), the same in every router process whatever
   * slot the rank got there, so replicas can agree on an order of worker-ranks (see Selector).
   */
  identity = new Uint32Array(8)
  /** Dense per-worker index (shared by all ranks of one worker_id), for "all ranks busy" checks. */
  workerIndex = new Int32Array(8)
  /** Ranks registered per worker index. */
  rankCount = new Int32Array(8)
  /** Registered slots in ascending order; valid up to liveCount. */
  liveSlots = new Int32Array(8)
  liveCount = 0
  /** One past the highest slot ever handed out; per-slot arrays elsewhere size themselves by it. */
  slotCapacity = 0
  /** Bumped on every registration change, so callers can cache derived data. */
  version = 0

  private workerIds: (bigint | undefined)[] = []
  private byWorker = new Map<bigint, WorkerEntry>()
  private freeSlots: number[] = []
  private freeWorkerIndices: number[] = []
  private workerIndexTop = 0

  /** Registers a worker-rank (or updates its info) and returns its slot. */
  register(workerId: bigint, dpRank: number, info: WorkerRankInfo = {}): number {
    if (typeof workerId !== 'bigint' || workerId < 0n || workerId > 0xffffffffffffffffn) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `worker id must be a u64 bigint, got ${String(workerId)}`)
    }
    if (!Number.isInteger(dpRank) || dpRank < 0 || dpRank > MAX_DP_RANK) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `dp rank must be an integer in [0, ${MAX_DP_RANK}], got ${String(dpRank)}`)
    }
    const mnbt = info.maxNumBatchedTokens ?? DEFAULT_MAX_BATCHED_TOKENS
    if (!Number.isFinite(mnbt) || mnbt <= 0) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `maxNumBatchedTokens must be a positive number, got ${String(mnbt)}`)
    }
    const kvBlocks = info.totalKvBlocks ?? 0
    if (!Number.isFinite(kvBlocks) || kvBlocks < 0) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `totalKvBlocks must be a non-negative number, got ${String(kvBlocks)}`)
    }
    let entry = this.byWorker.get(workerId)
    if (entry === undefined) {
      const index = this.freeWorkerIndices.pop() ?? this.workerIndexTop++
      if (index >= this.rankCount.length) this.rankCount = grow(this.rankCount, index + 1)
      this.rankCount[index] = 0
      entry = { index, ranks: new Map() }
      this.byWorker.set(workerId, entry)
    }
    let slot = entry.ranks.get(dpRank)
    const fresh = slot === undefined
    if (slot === undefined) {
      slot = this.freeSlots.pop() ?? this.slotCapacity++
      this.ensure(slot + 1)
      entry.ranks.set(dpRank, slot)
      this.workerIds[slot] = workerId
      this.live[slot] = 1
      this.dpRank[slot] = dpRank
      this.identity[slot] = identityHash(workerId, dpRank)
      this.workerIndex[slot] = entry.index
      this.rankCount[entry.index] = (this.rankCount[entry.index] ?? 0) + 1
      this.rebuildLive()
    }
    this.device[slot] = info.device === 'cpu' ? DEVICE_CPU : DEVICE_GPU
    this.maxNumBatchedTokens[slot] = mnbt
    this.totalKvBlocks[slot] = kvBlocks
    if (fresh) this.reportedActiveBlocks[slot] = -1
    this.version++
    return slot
  }

  /** Removes one worker-rank; returns its (now free) slot or -1 when unknown. */
  remove(workerId: bigint, dpRank: number): number {
    const entry = this.byWorker.get(workerId)
    const slot = entry?.ranks.get(dpRank)
    if (entry === undefined || slot === undefined) return -1
    entry.ranks.delete(dpRank)
    this.rankCount[entry.index] = (this.rankCount[entry.index] ?? 1) - 1
    if (entry.ranks.size === 0) {
      this.byWorker.delete(workerId)
      this.freeWorkerIndices.push(entry.index)
    }
    this.live[slot] = 0
    this.workerIds[slot] = undefined
    this.freeSlots.push(slot)
    this.rebuildLive()
    this.version++
    return slot
  }

  /** Removes every rank of a worker (discovery "instance removed"); returns the freed slots. */
  removeWorker(workerId: bigint): number[] {
    const entry = this.byWorker.get(workerId)
    if (entry === undefined) return []
    const out: number[] = []
    for (const rank of [...entry.ranks.keys()]) out.push(this.remove(workerId, rank))
    return out
  }

  slotOf(workerId: bigint, dpRank: number): number {
    return this.byWorker.get(workerId)?.ranks.get(dpRank) ?? -1
  }

  /** Slots of every rank of a worker, ascending; empty when unknown. */
  slotsOf(workerId: bigint): number[] {
    const entry = this.byWorker.get(workerId)
    if (entry === undefined) return []
    return [...entry.ranks.values()].sort((x, y) => x - y)
  }

  isLive(slot: number): boolean {
    return slot >= 0 && slot < this.slotCapacity && this.live[slot] === 1
  }

  workerIdOf(slot: number): bigint {
    const id = this.workerIds[slot]
    if (id === undefined) throw new KvrError('KVR_ERR_UNKNOWN_WORKER', `slot ${slot} holds no worker-rank`)
    return id
  }

  dpRankOf(slot: number): number {
    return this.dpRank[slot] ?? 0
  }

  deviceOf(slot: number): DeviceType {
    return this.device[slot] === DEVICE_CPU ? 'cpu' : 'gpu'
  }

  get workerCount(): number {
    return this.byWorker.size
  }

  private ensure(n: number): void {
    if (n <= this.live.length) return
    const cap = Math.max(n, this.live.length * 2)
    this.live = grow(this.live, cap)
    this.device = grow(this.device, cap)
    this.maxNumBatchedTokens = grow(this.maxNumBatchedTokens, cap)
    this.totalKvBlocks = grow(this.totalKvBlocks, cap)
    const reported = this.reportedActiveBlocks.length
    this.reportedActiveBlocks = grow(this.reportedActiveBlocks, cap)
    this.reportedActiveBlocks.fill(-1, reported)
    this.dpRank = grow(this.dpRank, cap)
    this.identity = grow(this.identity, cap)
    this.workerIndex = grow(this.workerIndex, cap)
    this.liveSlots = grow(this.liveSlots, cap)
  }

  private rebuildLive(): void {
    let n = 0
    for (let s = 0; s < this.slotCapacity; s++) if (this.live[s] === 1) this.liveSlots[n++] = s
    this.liveCount = n
  }
}

/** A well-mixed 32-bit hash of a worker-rank's identity (murmur3's finalizer over its words). */
export function identityHash(workerId: bigint, dpRank: number): number {
  let h = 0x2545f491
  for (const w of [Number(workerId & 0xffffffffn), Number((workerId >> 32n) & 0xffffffffn), dpRank >>> 0]) {
    h = Math.imul(h ^ w, 0xcc9e2d51)
    h = (h << 15) | (h >>> 17)
    h = Math.imul(h, 0x1b873593)
  }
  return fmix32(h)
}
