// The registered workers: their records, and the order in which membership changes of one worker
// apply. The router core (router.ts) does the registering against the index and the scheduler.
import type { EngineEventsSpec } from './endpoints.js'
import type { DeviceType } from '../scheduler/worker-ranks.js'
import type { WorkerRankRef } from '../scheduler/scheduler.js'

export interface WorkerInfo {
  id: bigint
  url: string
  blockSize: number
  /** KV capacity in blocks (0 = unknown). */
  capacity: number
  device: DeviceType
  dpRanks: number
  maxNumBatchedTokens: number | undefined
  registeredAt: number
  /** Consecutive proxy failures; a success resets it. */
  failures: number
  /** performance.now() until which the worker is left out of routing after failures (0: never was). */
  suspendedUntil: number
  /** Where the worker came from: `--worker` / `POST /v1/workers`, or etcd discovery. */
  source: 'static' | 'etcd'
  /** The engine's own KV-event publisher the router listens to, or null. */
  kvEvents: EngineEventsSpec | null
  /** Its Dynamo TCP request-plane address (`host:port/…`, from etcd), or null: its worker query goes there. */
  requestPlane?: string | null
  /** The model its Dynamo model card names, or null: the model of the requests sent to it. */
  model?: string | null
  /**
   * Registered for routing decisions only (POST /v1/route callers contact it themselves): never
   * probed, never sent a proxied request.
   */
  decisionsOnly: boolean
}

export interface WorkerRegistration {
  id: bigint
  url: string
  blockSize?: number
  capacity?: number
  device?: DeviceType
  dpRanks?: number
  maxNumBatchedTokens?: number
  source?: 'static' | 'etcd'
  kvEvents?: EngineEventsSpec | null
  requestPlane?: string | null
  model?: string | null
  /** Its KV events are handed to the router in this process (the embedded fleet). */
  eventsInProcess?: boolean
  /** For routing decisions only: see WorkerInfo.decisionsOnly. */
  decisionsOnly?: boolean
}

export class WorkerRegistry {
  private readonly table = new Map<bigint, WorkerInfo>()
  /** Per worker, the tail of its membership changes under way. */
  private readonly pending = new Map<bigint, Promise<unknown>>()
  private decisionsOnlyList: readonly WorkerRankRef[] = []

  get(id: bigint): WorkerInfo | undefined {
    return this.table.get(id)
  }

  has(id: bigint): boolean {
    return this.table.has(id)
  }

  get size(): number {
    return this.table.size
  }

  all(): WorkerInfo[] {
    return [...this.table.values()]
  }

  /** The worker-ranks of the workers registered for decisions only, which the proxy leaves out. */
  get decisionsOnly(): readonly WorkerRankRef[] {
    return this.decisionsOnlyList
  }

  set(info: WorkerInfo): void {
    const old = this.table.get(info.id)
    this.table.set(info.id, info)
    if (info.decisionsOnly || old?.decisionsOnly === true) this.listDecisionsOnly()
  }

  delete(id: bigint): boolean {
    const old = this.table.get(id)
    const had = this.table.delete(id)
    if (old?.decisionsOnly === true) this.listDecisionsOnly()
    return had
  }

  /** A new array each time: a proxy run holding the old one keeps what it saw. */
  private listDecisionsOnly(): void {
    const out: WorkerRankRef[] = []
    for (const w of this.table.values()) if (w.decisionsOnly) for (let r = 0; r < w.dpRanks; r++) out.push({ workerId: w.id, dpRank: r })
    this.decisionsOnlyList = out
  }

  /** True while a membership change of the worker is under way (it may hold index slots before it is in the table). */
  changing(id: bigint): boolean {
    return this.pending.has(id)
  }

  /**
   * Runs `op` after the worker's earlier membership changes. Adding awaits the shards, and etcd can
   * report a worker updated and then removed within that await (its lease's two keys deleted one
   * after the other); run side by side, the late add would put back a worker just removed.
   */
  inOrder<T>(id: bigint, op: () => Promise<T>): Promise<T> {
    const prev = this.pending.get(id)
    const next = prev === undefined ? op() : prev.then(op, op)
    const tail = next.then(
      () => undefined,
      () => undefined,
    )
    this.pending.set(id, tail)
    void tail.then(() => {
      if (this.pending.get(id) === tail) this.pending.delete(id)
    })
    return next
  }
}
