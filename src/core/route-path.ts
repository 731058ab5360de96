// The route path every API uses: token ids → local block hashes → overlap query over the shards →
// sequence hashes → schedule, with session pinning. Per-request buffers come from a small free
// list so a steady stream of requests allocates only the pool's merged answer and the list of
// slots it names.
import type { OverlapResult } from '../shards/pool.js'
import type { CancelSignal, RouteDecision, RouterConfigOverride, Scheduler, WorkerRankRef } from '../scheduler/scheduler.js'
import type { ReplicaSync } from '../transport/replica-sync.js'
import { promptHashesInto, sequenceHashesInto } from '../codec/hashing.js'
import { KvrError } from '../errors.js'
import { u64FromParts } from '../codec/u64.js'
import type { RouterParts } from './router-parts.js'
import type { SessionAffinity } from './session-affinity.js'

export interface RouteInput {
  /** Token ids of the prompt (validated while hashing), or null when blocks are given. */
  tokens: ArrayLike<number> | null
  /** Local block hashes given directly (u64 halves), instead of tokens. */
  blockLo?: Uint32Array
  blockHi?: Uint32Array
  blockCount?: number
  /** Prompt length in tokens; defaults to tokens.length (or blocks × block size). */
  isl?: number
  id?: string
  workerId?: bigint
  dpRank?: number
  priority?: number
  /** Latency objectives, ms (see ScheduleRequest). */
  ttftObjectiveMs?: number
  tpotObjectiveMs?: number
  overrides?: RouterConfigOverride
  updateStates?: boolean
  explain?: boolean
  /** X-Dynamo-Session-ID: the session the request belongs to (session affinity). */
  sessionId?: string
  /** Worker-ranks not to choose: the attempts a retry has tried (see ScheduleRequest.exclude). */
  exclude?: readonly WorkerRankRef[]
  signal?: CancelSignal
}

interface Scratch {
  lo: Uint32Array
  hi: Uint32Array
  sLo: Uint32Array
  sHi: Uint32Array
}

const EMPTY_RESULT: OverlapResult = {
  count: 0,
  workerIdLo: new Uint32Array(0),
  workerIdHi: new Uint32Array(0),
  dpRank: new Uint32Array(0),
  overlap: new Uint32Array(0),
  treeSize: new Uint32Array(0),
  recoveringShards: [],
}

export class RoutePath {
  private readonly scratch: Scratch[] = []
  /** (worker id as a safe number, dp rank) → slot, rebuilt when registrations change. */
  private slotCache = new Map<number, number>()
  private slotCacheVersion = -1

  constructor(
    private readonly parts: RouterParts,
    /** Session bindings are shared with the other replicas, when replica sync is on. */
    private readonly replicas: ReplicaSync | null,
  ) {}

  private takeScratch(n: number): Scratch {
    const s = this.scratch.pop()
    if (s !== undefined && s.lo.length >= n) return s
    const c = Math.max(64, 1 << Math.ceil(Math.log2(Math.max(1, n))))
    return { lo: new Uint32Array(c), hi: new Uint32Array(c), sLo: new Uint32Array(c), sHi: new Uint32Array(c) }
  }

  private giveScratch(s: Scratch): void {
    if (this.scratch.length < 256) this.scratch.push(s)
  }

  /** Slot of (worker, rank) in the scheduler, -1 when not registered there. */
  slotOf(lo: number, hi: number, rank: number): number {
    const w = this.parts.scheduler.workers
    if (this.slotCacheVersion !== w.version) {
      this.slotCache.clear()
      this.slotCacheVersion = w.version
    }
    if (hi >= 0x200000 || rank > 0x7ff) return w.slotOf(u64FromParts(lo, hi), rank)
    // hi < 2^21 and rank < 2^11: hi·2^32 + lo fits 53 bits; the rank goes into a float's spare range
    const key = (hi * 4294967296 + lo) * 2048 + rank
    let slot = this.slotCache.get(key)
    if (slot === undefined) {
      slot = w.slotOf(u64FromParts(lo, hi), rank)
      if (Number.isSafeInteger(key)) this.slotCache.set(key, slot)
    }
    return slot
  }

  /**
   * Routes one prompt. Timings go to the overhead histograms. Throws KvrError
   * (TOKEN_OUT_OF_RANGE, UNKNOWN_WORKER, NO_WORKERS, ALL_WORKERS_BUSY, QUEUE_FULL, …).
   */
  async route(input: RouteInput): Promise<{ decision: RouteDecision; overlap: OverlapResult; blocks: number; isl: number }> {
    if (this.parts.closed) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the router is shutting down')
    const t0 = performance.now()
    const bs = this.parts.config.blockSize
    let n: number
    let sc: Scratch
    let isl: number
    if (input.tokens !== null) {
      const tokens = input.tokens
      sc = this.takeScratch(Math.floor(tokens.length / bs))
      try {
        n = promptHashesInto(tokens, bs, sc.lo, sc.hi, sc.sLo, sc.sHi)
      } catch (err) {
        this.giveScratch(sc)
        throw err
      }
      isl = input.isl ?? tokens.length
    } else {
      const lo = input.blockLo as Uint32Array
      const hi = input.blockHi as Uint32Array
      n = input.blockCount ?? lo.length
      sc = this.takeScratch(n)
      sc.lo.set(lo.subarray(0, n))
      sc.hi.set(hi.subarray(0, n))
      isl = input.isl ?? n * bs
      sequenceHashesInto(sc.lo, sc.hi, n, sc.sLo, sc.sHi)
    }
    try {
      const t1 = performance.now()
      // The non-kv modes need no overlap; kv mode asks the shards (in approximate mode they hold
      // the synthetic events of the scheduler's predictions).
      const kv = this.parts.config.mode === 'kv'
      // with a shared remote index, its answer; the local (approximate) one when it gives none in time
      const remote = kv && n > 0 && this.parts.remote !== null ? await this.parts.remote.query(sc.lo, sc.hi, n) : null
      const overlap = remote ?? (kv && n > 0 ? await this.parts.pool.query(sc.lo, sc.hi, n) : EMPTY_RESULT)
      const t2 = performance.now()
      const w = this.parts.scheduler.workers
      // the status page shows each candidate's cost terms, built only while someone watches
      const explain = input.explain === true || this.parts.decisions.watchingAt(t2)
      // the worker-ranks holding a prefix, by slot: a list as long as the answer, not an array per worker-rank
      let slots: Int32Array | undefined
      let values: Float64Array | undefined
      let trees: Float64Array | undefined
      if (overlap.count > 0) {
        slots = new Int32Array(overlap.count)
        values = new Float64Array(overlap.count)
        if (explain) trees = new Float64Array(w.slotCapacity)
        let k = 0
        for (let i = 0; i < overlap.count; i++) {
          const slot = this.slotOf(overlap.workerIdLo[i] as number, overlap.workerIdHi[i] as number, overlap.dpRank[i] as number)
          if (slot < 0) continue
          slots[k] = slot
          values[k++] = tieredOverlap(overlap, i, this.parts.config.hostCacheHitWeight, this.parts.config.diskCacheHitWeight)
          if (trees !== undefined) trees[slot] = overlap.treeSize[i] as number
        }
        if (k < overlap.count) {
          slots = slots.subarray(0, k)
          values = values.subarray(0, k)
        }
      }
      const t3 = performance.now()
      const update = input.updateStates !== false
      const id = update ? (input.id ?? this.parts.requestIds.create()) : input.id
      const req: Parameters<Scheduler['schedule']>[0] = {
        isl,
        seqLo: sc.sLo,
        seqHi: sc.sHi,
        blockCount: n,
        localLo: sc.lo,
        localHi: sc.hi,
        updateStates: update,
      }
      if (id !== undefined) req.id = id
      if (slots !== undefined) {
        req.overlapSlots = slots
        req.overlapValues = values
      }
      if (trees !== undefined) req.treeSizes = trees
      if (input.priority !== undefined) req.priority = input.priority
      if (input.ttftObjectiveMs !== undefined) req.ttftObjectiveMs = input.ttftObjectiveMs
      if (input.tpotObjectiveMs !== undefined) req.tpotObjectiveMs = input.tpotObjectiveMs
      if (input.workerId !== undefined) req.workerId = input.workerId
      if (input.dpRank !== undefined) req.dpRank = input.dpRank
      const session = this.parts.sessions !== null && input.sessionId !== undefined && input.workerId === undefined ? input.sessionId : undefined
      if (session !== undefined) this.pinToSession(session, input.exclude, req)
      if (input.overrides !== undefined) req.overrides = input.overrides
      if (explain) req.explain = true
      const exclude =
        this.parts.suspension.any && input.workerId === undefined ? this.parts.suspension.exclusions(input.exclude, this.parts.health.held) : input.exclude
      if (exclude !== undefined) req.exclude = exclude
      if (input.signal !== undefined) req.signal = input.signal
      const decision = await this.parts.scheduler.schedule(req)
      if (update && this.parts.eventSources.size !== 0) this.parts.eventSources.routed(decision.workerId)
      if (session !== undefined && update) {
        ;(this.parts.sessions as SessionAffinity).bind(session, decision.workerId, decision.dpRank, performance.now())
        // the session's next turn may reach another replica
        this.replicas?.shareSessionBinding(session, decision.workerId, decision.dpRank, this.parts.config.sessionAffinityTtlSecs * 1000)
      }
      const t4 = performance.now()
      this.parts.metrics.observeOverhead(t1 - t0, t2 - t1, t4 - t3, t4 - t0)
      this.parts.metrics.observeDecision(decision, n, isl)
      this.parts.decisions.record(decision, n, isl, t4)
      return { decision, overlap, blocks: n, isl }
    } finally {
      this.giveScratch(sc)
    }
  }

  /** Pins the request to its session's worker-rank when that binding is live and the rank can take it. */
  private pinToSession(session: string, exclude: readonly WorkerRankRef[] | undefined, req: { workerId?: bigint; dpRank?: number }): void {
    const sessions = this.parts.sessions as SessionAffinity
    const b = sessions.get(session, performance.now())
    if (b === undefined) {
      sessions.counters.bound++
      return
    }
    const w = this.parts.registry.get(b.workerId)
    const slot = this.parts.scheduler.workers.slotOf(b.workerId, b.dpRank)
    const tried = exclude?.some((x) => x.workerId === b.workerId && x.dpRank === b.dpRank) === true
    if (w === undefined || slot < 0 || tried || this.parts.suspension.isSuspended(w) || this.parts.health.isHeld(w.id) || this.parts.scheduler.isBusy(slot)) {
      sessions.counters.broken++
      return
    }
    sessions.counters.hits++
    req.workerId = b.workerId
    req.dpRank = b.dpRank
  }
}

/**
 * The overlap, in device blocks, of answer row `i`: its device blocks, plus `host` × the blocks its
 * host tier extends them by, plus `disk` × the blocks its disk and external tiers extend that by
 * (Dynamo's cache_hit_estimates_from_tiered_matches, lib/kv-router/src/scheduling: a lower-tier
 * block must be loaded before it saves prefill).
 */
export function tieredOverlap(r: OverlapResult, i: number, host: number, disk: number): number {
  const d = r.overlap[i] as number
  if (r.overlapHost === undefined || r.overlapDisk === undefined) return d
  const h = r.overlapHost[i] as number
  return d + host * (h - d) + disk * ((r.overlapDisk[i] as number) - h)
}
