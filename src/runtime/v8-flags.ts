import { setFlagsFromString } from 'node:v8'

// V8 flags the router process is started with. This list is their one source: the build writes it
// into the shebang of the `kv-router` executable (scripts/build.mjs), which `npm start` and the
// Dockerfile run, and the benchmarks and tests import it. Setting them once the process runs is
// too late for the main thread: V8 sizes a heap when it creates it (which is also why
// workerHeapsAtDefaults below can give later threads other sizes). docs/operations.md has the
// figures behind each; briefly:
//
// A fixed 64 MB young generation: each open stream keeps young objects alive for its whole life,
// so every scavenge copies them, a pause of several ms on a busy 2-core machine. V8's default young
// generation starts small and scavenges often under that load; at 64 MB the scavenges are a fifth
// as many, and the proxy's p99 TTFT overhead falls to 1-2 ms in `npm run bench:route`. Long prompts
// also give /v1/route more requests/s with it. The cost: up to 128 MB more RSS.
//
// No memory reducer: an idle router otherwise runs "reduce" full GCs that shrink the heap, which
// must then grow back under the load that follows, and a replica behind a balancer idles and wakes
// all day; with the reducer, the p99 TTFT overhead after an idle spell was several times higher.
// The cost: an idle router keeps the heap its busiest minute grew.
//
// Old generation grown by 100% of what a full GC leaves alive, and at least 128 MB before V8
// collects it: the router's live old generation is small (tens of MB), and V8's own limits sit so
// close to it that what each scavenge promotes under 200 open streams brings a mark-compact (an
// atomic pause of 5-13 ms every request in flight waits out) every few seconds to a minute. With
// these, marking waits until about 64 MB: mark-compacts are deferred by many minutes of load, not
// removed. The cost: up to some 50 MB of dead objects in the main thread's heap before they are
// collected (the sizing flags are the main thread's alone: workerHeapsAtDefaults below).
export const ROUTER_V8_FLAGS: readonly string[] = Object.freeze([
  '--min-semi-space-size=64',
  '--max-semi-space-size=64',
  '--no-memory-reducer',
  '--heap-growing-percent=100',
  '--initial-old-space-size=128',
])

/** The flags above that size a heap: V8 reads them once, when it creates an isolate's heap. */
const HEAP_SIZE_FLAGS: readonly string[] = Object.freeze(['--min-semi-space-size', '--max-semi-space-size', '--initial-old-space-size'])

/**
 * Gives the threads started after this call V8's own heap sizes; returns the flags it set back.
 *
 * V8 flags belong to the process, so without this every worker thread (each index shard, each
 * tokenizer thread) would get the main thread's fixed 64 MB semi-spaces and its 128 MB old
 * generation floor. What those buy, a proxy's requests held up by fewer pauses, is the main
 * thread's alone, and the cost is per thread: a thread that keeps allocating touches all of its
 * young generation in time: with 4 shards taking the Mooncake trace's events 20 times, a process
 * with these flags peaked at 560 MB with them in every thread and at 438 MB with this call
 * (medians of 3), and V8's defaults are what `npm run bench:index`
 * has always measured the shards with. Heap sizes are read when an isolate's heap is made, so the main thread,
 * whose heap exists already, keeps its sizes (test/runtime/v8-flags.test.ts checks both sides).
 * Only flags this process got exactly as the router sets them are touched: a size the operator
 * chose on the command line for every thread stays.
 */
export function workerHeapsAtDefaults(execArgv: readonly string[] = process.execArgv): string[] {
  const reset: string[] = []
  for (const name of HEAP_SIZE_FLAGS) {
    const ours = ROUTER_V8_FLAGS.find((f) => f.startsWith(`${name}=`))
    if (ours === undefined || !execArgv.includes(ours)) continue
    // 0 is V8's "not set": an isolate made from now on sizes that part of its heap itself
    setFlagsFromString(`${name}=0`)
    reset.push(name)
  }
  return reset
}
