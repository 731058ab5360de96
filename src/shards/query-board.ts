// The main thread's side of the query board (layout in src/thread/protocol.ts): a query's
// blocks go into a free slot, its number into every shard's query ring, and the answers, one
// column per shard, are merged once every shard has cleared its pending bit. The queries of one
// event-loop turn share a doorbell and a wake-up.
import {
  B_ANSWERS,
  B_MAIN_WAITING,
  BoardLayout,
  Q_FLAGS,
  Q_N,
  Q_PENDING,
  QF_EARLY_EXIT,
  QRING_BASE,
  QRING_SIZE,
  QRING_WRITE,
  RESULT_WORDS,
} from '../thread/protocol.js'
import type { PoolOptions } from './options.js'
import { type Shard, ringDoorbell } from './shard.js'

/** The merged answer of one overlap query. */
export interface OverlapResult {
  count: number
  workerIdLo: Uint32Array
  workerIdHi: Uint32Array
  dpRank: Uint32Array
  /** Matched leading blocks. */
  overlap: Uint32Array
  /** Blocks the worker-rank holds. */
  treeSize: Uint32Array
  /**
   * Leading blocks matched through the device match extended by the worker-rank's host-tier
   * blocks, then further by its disk and external blocks (Dynamo's lower-tier continuation): each
   * at least the one before, cumulative through the tiers before it. Present only when some
   * worker-rank of the answer matched beyond its device blocks; absent means equal to `overlap`.
   */
  overlapHost?: Uint32Array
  overlapDisk?: Uint32Array
  /** Shards whose answer is not exact (restarted and not rebuilt, or died during the query). */
  recoveringShards: number[]
}

export interface QueryOptions {
  /** Wait until every event pushed before this query is applied. */
  readYourWrites?: boolean
  earlyExit?: boolean
}

interface Asked {
  /** Board word of the slot's PENDING bits. */
  at: number
  resolve: () => void
}

interface Slot {
  index: number
  recovering: Set<number> | null
}

export class QueryBoard {
  readonly board: SharedArrayBuffer
  readonly layout: BoardLayout
  private readonly b: Int32Array
  /** PENDING value of a fresh query: one bit per shard. */
  private readonly allShards: number
  private readonly freeSlots: number[] = []
  private readonly slots: Slot[] = []
  private readonly slotWaiters: (() => void)[] = []
  /** Queries handed to the shards whose answers have not been collected yet. */
  private readonly asked: Asked[] = []
  private askScheduled = false
  private awaitingAnswers = false

  constructor(
    private readonly opts: PoolOptions,
    private readonly shards: readonly Shard[],
  ) {
    this.allShards = opts.shards === 31 ? 0x7fffffff : (1 << opts.shards) - 1
    this.layout = new BoardLayout({ shards: opts.shards, slots: opts.querySlots, maxBlocks: opts.maxQueryBlocks, maxResults: opts.maxWorkerRanksPerShard })
    this.board = new SharedArrayBuffer(this.layout.totalWords * 4)
    this.b = new Int32Array(this.board)
    for (let s = 0; s < opts.querySlots; s++) {
      this.freeSlots.push(s)
      this.slots.push({ index: s, recovering: null })
    }
  }

  /** Overlap of a prompt's local block hashes with every worker-rank, merged over the shards. */
  async query(lo: Uint32Array, hi: Uint32Array, n: number, options: QueryOptions): Promise<OverlapResult> {
    const blocks = Math.min(n, this.opts.maxQueryBlocks)
    const slot = this.freeSlots.pop() ?? (await this.waitForSlot())
    const L = this.layout
    const b = this.b
    const base = L.slot(slot)
    try {
      new Uint32Array(this.board, L.lo(slot) * 4, blocks).set(lo.subarray(0, blocks))
      new Uint32Array(this.board, L.hi(slot) * 4, blocks).set(hi.subarray(0, blocks))
      b[base + Q_N] = blocks
      b[base + Q_FLAGS] = options.earlyExit === true ? QF_EARLY_EXIT : 0
      const rec = this.slots[slot] as Slot
      rec.recovering = null
      for (const sh of this.shards) {
        b[L.barrier(slot, sh.index)] = options.readYourWrites === true ? sh.enqueued : -1
        if (sh.health === 'recovering') (rec.recovering ??= new Set()).add(sh.index)
      }
      Atomics.store(b, base + Q_PENDING, this.allShards)
      for (const sh of this.shards) {
        const qw = Atomics.load(sh.ctrl, QRING_WRITE) >>> 0
        sh.ctrl[QRING_BASE + (qw & (QRING_SIZE - 1))] = slot
        Atomics.store(sh.ctrl, QRING_WRITE, (qw + 1) | 0)
      }
      await new Promise<void>((resolve) => {
        this.asked.push({ at: base + Q_PENDING, resolve })
        if (!this.askScheduled) {
          this.askScheduled = true
          setImmediate(this.ask)
        }
      })
      return this.merge(slot, rec)
    } finally {
      this.releaseSlot(slot)
    }
  }

  // Queries asked during one event-loop turn share a doorbell and a wake-up: under load a turn
  // carries many requests, and a futex round trip per query costs more than the query itself.
  private readonly ask = (): void => {
    this.askScheduled = false
    for (const sh of this.shards) ringDoorbell(sh)
    // an answer usually takes a few µs; a wake-up through the event loop tens
    const until = performance.now() + this.opts.querySpinUs / 1000
    do {
      if (this.settle() === 0) return
    } while (performance.now() < until)
    if (!this.awaitingAnswers) void this.awaitAnswers()
  }

  /** Resolves every answered query; returns how many are still owed. */
  private settle(): number {
    const b = this.b
    const q = this.asked
    let j = 0
    for (let i = 0; i < q.length; i++) {
      const a = q[i] as Asked
      if (Atomics.load(b, a.at) === 0) a.resolve()
      else q[j++] = a
    }
    q.length = j
    return j
  }

  private async awaitAnswers(): Promise<void> {
    const b = this.b
    this.awaitingAnswers = true
    Atomics.store(b, B_MAIN_WAITING, 1)
    try {
      for (;;) {
        // read the count before checking, so an answer landing in between changes it and the
        // wait returns at once instead of sleeping past it
        const seen = Atomics.load(b, B_ANSWERS)
        if (this.settle() === 0) return
        const r = Atomics.waitAsync(b, B_ANSWERS, seen, 1000)
        if (r.async) await r.value
      }
    } finally {
      Atomics.store(b, B_MAIN_WAITING, 0)
      this.awaitingAnswers = false
    }
  }

  private merge(slot: number, rec: Slot): OverlapResult {
    const L = this.layout
    const b = this.b
    let total = 0
    for (let k = 0; k < this.shards.length; k++) total += b[L.results(slot, k)] as number
    const out: OverlapResult = {
      count: total,
      workerIdLo: new Uint32Array(total),
      workerIdHi: new Uint32Array(total),
      dpRank: new Uint32Array(total),
      overlap: new Uint32Array(total),
      treeSize: new Uint32Array(total),
      recoveringShards: rec.recovering === null ? [] : [...rec.recovering].sort((x, y) => x - y),
    }
    let j = 0
    let tiered = false
    for (let k = 0; k < this.shards.length; k++) {
      let o = L.results(slot, k)
      const m = b[o++] as number
      for (let i = 0; i < m; i++, o += RESULT_WORDS, j++) {
        out.workerIdLo[j] = b[o] as number
        out.workerIdHi[j] = b[o + 1] as number
        out.dpRank[j] = b[o + 2] as number
        out.overlap[j] = b[o + 3] as number
        out.treeSize[j] = b[o + 4] as number
        if (b[o + 6] !== b[o + 3]) tiered = true
      }
    }
    if (tiered) this.tiers(slot, out)
    return out
  }

  /** The host and disk overlaps of an answer some worker-rank of which matched beyond its device blocks. */
  private tiers(slot: number, out: OverlapResult): void {
    const L = this.layout
    const b = this.b
    const host = new Uint32Array(out.count)
    const disk = new Uint32Array(out.count)
    let j = 0
    for (let k = 0; k < this.shards.length; k++) {
      let o = L.results(slot, k)
      const m = b[o++] as number
      for (let i = 0; i < m; i++, o += RESULT_WORDS, j++) {
        host[j] = b[o + 5] as number
        disk[j] = b[o + 6] as number
      }
    }
    out.overlapHost = host
    out.overlapDisk = disk
  }

  private waitForSlot(): Promise<number> {
    return new Promise((resolve) => {
      this.slotWaiters.push(() => resolve(this.freeSlots.pop() as number))
    })
  }

  private releaseSlot(slot: number): void {
    this.freeSlots.push(slot)
    const next = this.slotWaiters.shift()
    if (next !== undefined) next()
  }

  /**
   * Completes, on behalf of a shard that is gone, every query still waiting for it: its part
   * of the answer is empty and the answer says the shard is not exact.
   */
  finishOwedQueries(shard: number): void {
    const L = this.layout
    const bit = 1 << shard
    for (const rec of this.slots) {
      if (this.freeSlots.includes(rec.index)) continue
      const at = L.slot(rec.index) + Q_PENDING
      const before = Atomics.and(this.b, at, ~bit)
      if ((before & bit) === 0) continue
      this.b[L.results(rec.index, shard)] = 0
      ;(rec.recovering ??= new Set()).add(shard)
      if ((before & ~bit) === 0) Atomics.add(this.b, B_ANSWERS, 1)
    }
    Atomics.notify(this.b, B_ANSWERS)
    this.settle()
  }
}
