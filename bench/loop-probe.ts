// Event-loop and GC probe for a router under a benchmark's load, loaded with node's --import:
//   ROUTER_NODE_FLAGS="--import ./dist/bench/loop-probe.js" node dist/bench/proxy.js
// On exit (the benchmark stops its router with SIGTERM) it writes one JSON line to
// LOOP_PROBE_OUT (default bench/results/loop-probe.json): event-loop delay percentiles, the GC
// pauses seen, and how often the loop was away for more than 5 ms. It tells a GC pause from a
// loop the OS did not schedule: both stall the loop, only the first shows as a GC entry.
import { constants, monitorEventLoopDelay, PerformanceObserver } from 'node:perf_hooks'
import { openSync, readSync, writeFileSync } from 'node:fs'

const delay = monitorEventLoopDelay({ resolution: 1 })
delay.enable()
const gcMs: number[] = []
const KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'scavenge',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'mark_compact',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incremental_marking',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weak_callbacks',
}
const byKind: Record<string, number[]> = {}
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    gcMs.push(e.duration)
    const kind = KINDS[(e as unknown as { detail?: { kind?: number } }).detail?.kind ?? -1] ?? 'other'
    ;(byKind[kind] ??= []).push(e.duration)
  }
}).observe({ entryTypes: ['gc'] })
const stalls: number[] = []
// Where a stall's time went, from the kernel's own accounting of this thread
// (/proc/thread-self/schedstat: ns on a CPU, ns runnable but waiting for one): on-CPU time is
// our own work (JS or GC), run-queue time is the OS giving the CPU to someone else, and the
// remainder is time asleep past the timer's due time.
const sched = { onCpuMs: 0, runQueueMs: 0, asleepMs: 0 }
const schedFd = openSync('/proc/thread-self/schedstat', 'r')
const schedBuf = Buffer.alloc(128)
const readSched = (): [number, number] => {
  const n = readSync(schedFd, schedBuf, 0, 128, 0)
  const parts = schedBuf.toString('latin1', 0, n).split(' ')
  return [Number(parts[0]) / 1e6, Number(parts[1]) / 1e6]
}
let [lastRun, lastWait] = readSched()
let last = performance.now()
setInterval(() => {
  const now = performance.now()
  const [run, wait] = readSched()
  if (now - last > 5) {
    stalls.push(now - last)
    sched.onCpuMs += run - lastRun
    sched.runQueueMs += wait - lastWait
    sched.asleepMs += now - last - (run - lastRun) - (wait - lastWait)
  }
  last = now
  lastRun = run
  lastWait = wait
}, 1).unref()

let written = false
function write(): void {
  if (written) return
  written = true
  const top = (xs: number[]): number[] =>
    [...xs]
      .sort((a, b) => a - b)
      .slice(-10)
      .map((x) => Math.round(x * 10) / 10)
  const out = {
    pid: process.pid,
    loop_delay_ms: { p50: delay.percentile(50) / 1e6, p99: delay.percentile(99) / 1e6, p999: delay.percentile(99.9) / 1e6, max: delay.max / 1e6 },
    gc: {
      count: gcMs.length,
      total_ms: Math.round(gcMs.reduce((a, b) => a + b, 0)),
      longest_ms: top(gcMs),
      by_kind: Object.fromEntries(Object.entries(byKind).map(([k, xs]) => [k, { count: xs.length, total_ms: Math.round(xs.reduce((a, b) => a + b, 0)), longest_ms: top(xs).slice(-3) }])),
    },
    stalls_over_5ms: {
      count: stalls.length,
      total_ms: Math.round(stalls.reduce((a, b) => a + b, 0)),
      longest_ms: top(stalls),
      on_cpu_ms: Math.round(sched.onCpuMs),
      run_queue_ms: Math.round(sched.runQueueMs),
      asleep_ms: Math.round(sched.asleepMs),
    },
  }
  writeFileSync(process.env.LOOP_PROBE_OUT ?? 'bench/results/loop-probe.json', JSON.stringify(out) + '\n')
}
process.once('SIGTERM', () => {
  write()
  process.exit(0)
})
process.once('exit', write)
