// A full GC after start-up, before the router takes traffic.
//
// With a 64 MB young generation (src/runtime/v8-flags.ts) nothing is scavenged while the router starts,
// so everything start-up leaves alive (modules, compiled schemas, the metrics registry, the
// shard pool) still sits in the young generation when the first requests come. The first two
// scavenges under load then copy all of it, and the second promotes it, which filled the old
// generation to its first limit and set off a mark-compact right behind it: in a one-off
// harness (bench/HISTORY.md, bench:route, session 10) 21–31 ms scavenges and an 11–13 ms mark-compact in
// the first 10 s of load, and a p99 TTFT overhead of 13.7 and 16.4 ms in that first round. Done
// here, while nothing waits on the router, the same work costs about 25 ms once, and the first
// round's overhead was 2.4 and 2.6 ms. One full GC moves every live young object to the
// old generation and sets the old generation's next limit from what is live.
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'

/**
 * V8's full GC as a function (the benchmarks and tests that measure retained heap use it too);
 * throws where the runtime will not expose one.
 */
export function fullGc(): () => void {
  const existing = (globalThis as { gc?: unknown }).gc
  if (typeof existing === 'function') return existing as () => void
  // gc is only defined in contexts created after the flag is set, hence the fresh context
  setFlagsFromString('--expose-gc')
  const gc = runInNewContext('gc') as unknown
  if (typeof gc !== 'function') throw new Error('this runtime does not expose a full GC (--expose-gc)')
  return gc as () => void
}

/** Moves what start-up left alive into the old generation; returns the ms it took, or null when no GC could be run. */
export function settleHeap(): number | null {
  let gc: () => void
  try {
    gc = fullGc()
  } catch {
    return null
  }
  // One tick stays queued across the GC, so that one of Node's tick records is alive while it runs.
  // process.nextTick builds each record with an object literal with symbol keys. A full GC with no
  // record alive (and, as at start-up, no optimized code inlining the literal) freed the maps that
  // literal goes through; the next record got new ones, the literal's key stores turned megamorphic
  // and stayed so, and every nextTick from then on (Node's streams call it for each chunk read or
  // written) was a runtime call: 390-580 ns against 57-70, about 40 µs of CPU per proxied request
  // under load (bench/HISTORY.md, bench:route, session 17; `node dist/bench/next-tick.js`).
  process.nextTick(noop)
  const t = performance.now()
  gc()
  return performance.now() - t
}

function noop(): void {}
