// Failing workers are left out of routing for a while. A dead worker would otherwise take
// requests, and every retry could land on dead ones (a failure frees its bookings, so it looks
// idle), until its etcd lease ran out.
import type { WorkerRankRef } from '../scheduler/scheduler.js'
import type { WorkerInfo, WorkerRegistry } from './worker-registry.js'

/** A failing worker's first time out of routing, and the longest. */
const SUSPEND_BASE_MS = 1000
const SUSPEND_MAX_MS = 30_000

export class Suspension {
  /** Workers left out of routing after failures, until their time is up. */
  private readonly suspended = new Set<bigint>()

  constructor(private readonly registry: WorkerRegistry) {}

  /** Whether any worker may be suspended now (a cheap check for the route path). */
  get any(): boolean {
    return this.suspended.size !== 0
  }

  /**
   * A request to the worker failed before its first token: it is left out for 1 s, doubling with
   * each failure in a row up to 30 s. When the time is up, the next request may go there again:
   * an answer ends the suspension, a failure lengthens it.
   */
  failed(id: bigint): void {
    const w = this.registry.get(id)
    if (w === undefined) return
    w.failures++
    w.suspendedUntil = performance.now() + Math.min(SUSPEND_MAX_MS, SUSPEND_BASE_MS * 2 ** Math.min(16, w.failures - 1))
    this.suspended.add(id)
  }

  /** A request to the worker got its first token (or its whole answer). */
  answered(w: WorkerInfo): void {
    // an answer on a registration since replaced says nothing of the new one
    if (w.failures === 0 || this.registry.get(w.id) !== w) return
    w.failures = 0
    w.suspendedUntil = 0
    this.suspended.delete(w.id)
  }

  /** The worker (re-)registered or left: it starts with a clean record. */
  forget(id: bigint): void {
    this.suspended.delete(id)
  }

  /** True while the worker is left out of routing. */
  isSuspended(w: WorkerInfo): boolean {
    return w.suspendedUntil > performance.now()
  }

  /** Workers left out of routing now. */
  count(): number {
    let n = 0
    for (const w of this.registry.all()) if (this.isSuspended(w)) n++
    return n
  }

  /**
   * `exclude` with the suspended workers' ranks added; `exclude` itself when none is suspended
   * now, or when every worker not `held` out of routing otherwise (unreachable, misconfigured)
   * is: then none is left out, as a try beats a certain refusal.
   */
  exclusions(exclude: readonly WorkerRankRef[] | undefined, held?: ReadonlySet<bigint>): readonly WorkerRankRef[] | undefined {
    const now = performance.now()
    let out: WorkerRankRef[] | null = null
    let open = 0
    for (const id of this.suspended) {
      const w = this.registry.get(id)
      if (w === undefined || w.suspendedUntil <= now) {
        // its time is up: routed again, and kept only as failing until it answers
        this.suspended.delete(id)
        continue
      }
      if (held?.has(id) === true) continue
      open++
      out ??= exclude === undefined ? [] : [...exclude]
      for (let r = 0; r < w.dpRanks; r++) out.push({ workerId: id, dpRank: r })
    }
    if (out === null || open >= this.registry.size - (held?.size ?? 0)) return exclude
    return out
  }
}
