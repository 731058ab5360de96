// Shared helpers for the scheduler tests: a fake clock, chained fake block hashes and a
// scheduler with N single-rank workers registered.
import { Scheduler } from '../../src/scheduler/scheduler.js'
import type { SchedulerOptionsInput } from '../../src/scheduler/options.js'
import type { SchedulerDeps } from '../../src/scheduler/scheduler.js'
import type { WorkerRankInfo } from '../../src/scheduler/worker-ranks.js'

export class FakeClock {
  ms = 0
  now = (): number => this.ms
  advance(ms: number): void {
    this.ms += ms
  }
}

/**
 * Chained hashes for a list of block contents: hash i depends on contents[0..i], like Dynamo's
 * sequence hashes, so two prompts share hashes exactly over their common prefix.
 */
export function chain(contents: readonly number[]): { lo: Uint32Array; hi: Uint32Array } {
  const lo = new Uint32Array(contents.length)
  const hi = new Uint32Array(contents.length)
  let a = 0x12345678
  let b = 0x9abcdef0
  for (let i = 0; i < contents.length; i++) {
    const c = contents[i] as number
    a = Math.imul(a ^ c, 0x85ebca6b) ^ (b >>> 13)
    b = Math.imul(b ^ (a >>> 7) ^ c, 0xc2b2ae35)
    lo[i] = a >>> 0
    hi[i] = b >>> 0
  }
  return { lo, hi }
}

/** Block contents [base, base+1, …] of length n. */
export function blocks(base: number, n: number): number[] {
  return Array.from({ length: n }, (_, i) => base + i)
}

export function makeScheduler(
  options: SchedulerOptionsInput,
  workerCount: number,
  info: WorkerRankInfo | ((i: number) => WorkerRankInfo) = {},
  deps: SchedulerDeps = {},
): { s: Scheduler; clock: FakeClock; slots: number[] } {
  const clock = new FakeClock()
  // Dynamo's cost unless a test asks for another: its logits are small sums a reader can check
  // by hand, which the mechanics tested here (booking, queue, prediction, retries) rely on;
  // cost.test.ts checks the latency cost. No learning unless asked: a fake clock's times are no
  // engine's (engine-estimator.test.ts feeds it on purpose)
  const s = new Scheduler({ seed: 7, cost: 'dynamo', learnEngines: false, ...options }, { clock: clock.now, timers: false, ...deps })
  const slots: number[] = []
  for (let i = 0; i < workerCount; i++) slots.push(s.addWorkerRank(BigInt(i + 1), 0, typeof info === 'function' ? info(i) : info))
  return { s, clock, slots }
}

/** Overlap array by slot from a { slot: blocks } record. */
export function overlaps(bySlot: Record<number, number>, size = 16): Float64Array {
  const a = new Float64Array(size)
  for (const [k, v] of Object.entries(bySlot)) a[Number(k)] = v
  return a
}
