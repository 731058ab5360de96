// The registered workers: their records, and the order in which membership changes of one worker
// apply. The router core (router.ts) does the registering against the index and the scheduler.
import type { EngineEventsSpec } from './endpoints.js'
import type { DeviceType } from '../scheduler/worker-ranks.js'

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
  /** Its KV events are handed to the router in this process (the embedded fleet). */
  eventsInProcess?: boolean
}

export class WorkerRegistry {
  private readonly table = new Map<bigint, WorkerInfo>()
  /** Per worker, the tail of its membership changes under way. */
  private readonly pending = new Map<bigint, Promise<unknown>>()

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

  set(info: WorkerInfo): void {
    this.table.set(info.id, info)
  }

  delete(id: bigint): boolean {
    return this.table.delete(id)
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
