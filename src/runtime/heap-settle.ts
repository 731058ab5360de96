// A full GC after start-up, before the router takes traffic.
//
// With a 64 MB young generation (src/runtime/v8-flags.ts) nothing is scavenged while the router starts,
// so everything start-up leaves alive (modules, compiled schemas, the metrics registry, the
// shard pool) still sits in the young generation when the first requests come. The first two
// scavenges under load then copy all of it, and the second promotes it, which fills the old
// generation to its first limit and sets off a mark-compact right behind it: pauses of tens of
// ms in the first seconds of load, felt in the first requests' TTFT. Done here, while nothing
// waits on the router, the same work is paid once. One full GC moves every live young object to
// the old generation and sets the old generation's next limit from what is live.
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
  // record alive (and, as at start-up, no optimized code inlining the literal) frees the maps that
  // literal goes through; the next record gets new ones, the literal's key stores turn megamorphic
  // and stay so, and every nextTick from then on (Node's streams call it for each chunk read or
  // written) is a runtime call, several times slower: tens of µs of CPU per proxied request.
  process.nextTick(noop)
  const t = performance.now()
  gc()
  return performance.now() - t
}

function noop(): void {}
