// What the router's start-up GC does to process.nextTick (src/runtime/heap-settle.ts). Node builds each
// tick record with an object literal with symbol keys. After a full GC with no record alive, and
// no optimized code yet inlining the literal, every nextTick was measured to take a runtime call
// (its key stores megamorphic, as a CPU profile showed) for the rest of the process's life.
// Node's streams call nextTick for each chunk read or written, so the router paid it on every
// upstream chunk of every stream.
//
// Each case runs in a fresh process with the router's V8 flags: nextTick is used a little (as while
// the router starts), then the case's GC, if any, then nextTick is timed in bursts of 1,000 from one
// hot function, each burst drained before the next. The three cases alternate, so that whatever the
// machine does falls on all three alike. Part of `npm run bench:micro`; alone:
// `node dist/bench/next-tick.js`.
import { spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { ROUTER_V8_FLAGS } from '../src/runtime/v8-flags.js'
import { fullGc, settleHeap } from '../src/runtime/heap-settle.js'
import { median } from './common.js'

export type NextTickCase = 'no-gc' | 'gc-on-empty-queue' | 'settle-heap'
export const NEXT_TICK_CASES: readonly NextTickCase[] = ['no-gc', 'gc-on-empty-queue', 'settle-heap']

export interface NextTickResult {
  /** ns per process.nextTick (queued and run), median over the runs of each case. */
  nsPerCall: Record<NextTickCase, number>
  runs: Record<NextTickCase, number[]>
}

function noop(): void {}

function burst(n: number): void {
  for (let i = 0; i < n; i++) process.nextTick(noop)
}

/** ns per nextTick over `bursts` bursts of 1,000. */
async function timeBursts(bursts: number): Promise<number> {
  const t0 = process.hrtime.bigint()
  for (let b = 0; b < bursts; b++) {
    burst(1000)
    await new Promise((r) => setImmediate(r))
  }
  return Number(process.hrtime.bigint() - t0) / (bursts * 1000)
}

async function childMain(kind: NextTickCase): Promise<void> {
  // a few hundred ticks, none from a hot function: what the router's start-up makes (once
  // TurboFan compiles a caller, its code holds the literal's maps, and the GC leaves them)
  for (let i = 0; i < 200; i++) await new Promise((r) => process.nextTick(r))
  if (kind === 'gc-on-empty-queue') fullGc()()
  else if (kind === 'settle-heap') settleHeap()
  // the first timing includes the optimizing compile of burst(): left out
  await timeBursts(200)
  const xs: number[] = []
  for (let k = 0; k < 5; k++) xs.push(await timeBursts(200))
  process.stdout.write(`${JSON.stringify({ ns: median(xs) })}\n`)
}

export function benchNextTick(rounds = 3): NextTickResult {
  const self = fileURLToPath(import.meta.url)
  const runs = { 'no-gc': [], 'gc-on-empty-queue': [], 'settle-heap': [] } as Record<NextTickCase, number[]>
  for (let r = 0; r < rounds; r++) {
    for (const kind of NEXT_TICK_CASES) {
      const out = spawnSync(process.execPath, [...ROUTER_V8_FLAGS, self, '--child', kind], { encoding: 'utf8', timeout: 60_000 })
      if (out.status !== 0) throw new Error(`next-tick child (${kind}) failed: ${out.stderr}`)
      runs[kind].push((JSON.parse(out.stdout) as { ns: number }).ns)
    }
  }
  const nsPerCall = Object.fromEntries(NEXT_TICK_CASES.map((k) => [k, median(runs[k])])) as Record<NextTickCase, number>
  return { nsPerCall, runs }
}

export function printNextTick(r: NextTickResult): void {
  const f = (k: NextTickCase): string => `${r.nsPerCall[k].toFixed(0).padStart(6)} ns   (runs ${r.runs[k].map((x) => x.toFixed(0)).join(', ')})`
  console.log('\nprocess.nextTick after start-up, router V8 flags, fresh process per run, ns per call (queued and run)')
  console.log(`  no full GC                         ${f('no-gc')}`)
  console.log(`  a full GC on an empty tick queue   ${f('gc-on-empty-queue')}`)
  console.log(`  settleHeap (a tick held across)    ${f('settle-heap')}`)
}

if (process.argv[2] === '--child') {
  const kind = process.argv[3] as NextTickCase
  if (!NEXT_TICK_CASES.includes(kind)) throw new Error(`next-tick child: unknown case ${String(kind)} (one of ${NEXT_TICK_CASES.join(', ')})`)
  await childMain(kind)
} else if (process.argv[1] === fileURLToPath(import.meta.url)) {
  printNextTick(benchNextTick())
}
