import { setFlagsFromString } from 'node:v8'

// V8 flags the router process is started with: the shebang of src/main.ts, `npm start` and the
// benchmarks all pass these (a test keeps the three in step). Setting them once the process runs
// is too late for the main thread: V8 sizes a heap when it creates it (which is also why
// workerHeapsAtDefaults below can give later threads other sizes).
//
// Why a fixed 64 MB young generation: each open stream keeps young objects alive for its whole
// life (`--trace-gc-nvp` at 200 streams: about 1.9 MB survives every scavenge, some 9 KB per
// stream), so every scavenge copies them, a 4–10 ms pause on a busy 2-core machine. V8's default young generation starts small and grows slowly, and scavenged about once
// per 800 ms under that load, and those pauses were the router's TTFT p99. At 64 MB the scavenges
// are a fifth as many and the p99 overhead fell from 6–11 ms to 1–2 ms in paired rounds of
// `node dist/bench/proxy.js` (bench/HISTORY.md, bench:route, session 5). The cost is memory: up to 128 MB more RSS.
// Re-measured in session 14 (README, "Node flags"), with about 4 KB of heap per open stream
// instead of 9: V8's default young generation now gives 64-token streams a shorter tail, but
// 4,096-token prompts more mark-compacts and /v1/route 15% fewer requests/s. Long prompts are
// what a KV-aware router carries, so 64 MB stays.
//
// Why no memory reducer: when the router idles, V8's memory reducer runs "reduce" full GCs that
// shrink the heap, which then has to grow back under the load that follows. That is the likely
// cause rather than a proven one (a `--trace-gc` run showed a reduce GC in an idle gap and a full
// GC in the next busy round); the effect was measured. In a one-off harness where the router
// idled 24 s before each round (session 9, bench/HISTORY.md), three alternated pairs of runs gave
// its p99 TTFT overhead run medians of 3.20, 2.27 and 2.79 ms without the reducer and 4.46, 14.88
// and 7.38 ms with it; under steady load the two were alike (session 8). A replica behind a load balancer idles and wakes all day. The cost: an idle
// router keeps the heap its busiest minute grew.
//
// Why the old generation grows by 100% of what a full GC leaves alive: the router's old generation
// is small (tens of MB) and V8 sized its next limit so close to it that, under 200 open streams,
// what each scavenge promotes brought a mark-compact every 14 s or so, each an atomic pause of
// 5-13 ms that every request in flight waits out. In four runs of `node dist/bench/proxy.js`
// without the flag, two had a mark-compact in three of their five router rounds and two had none;
// in three with it, each had exactly one, in the first paired round (the heap's first growth
// under load), and none after (bench/HISTORY.md, bench:route, session 12; the rounds now print
// the router's GC pauses). The cost is memory: the old generation may grow to twice what is live
// (a few tens of MB here) before it is collected.
//
// Why an old generation of at least 128 MB before V8 collects it: V8 starts marking when what is
// left below the old generation's limit falls to the young generation's size (64 MB here), and the
// limit it sets after a full GC is about twice what is live plus that same 64 MB. For the router,
// with some 14 MB live after the full GC of start-up (src/runtime/heap-settle.ts), that left about 9 MB
// for what the scavenges promote, and the first minute under load promotes about that much:
// `--trace-incremental-marking` showed marking start at 22 MB of an 89 MB limit 44 s into
// `node dist/bench/proxy.js`. That first mark-compact came 44-50 s into the load in each of session
// 19's three runs of that benchmark, and fell in a counted round in two of session 18's four runs
// of bench:route. A limit set with this flag is also a floor for every limit
// after it, so marking now waits until about 64 MB: in a 30-s-per-phase run (4.5 minutes of load in
// 640 s) the old generation grew from 13 to 31 MB with no mark-compact at all (bench/HISTORY.md,
// bench:route, session 19). Mark-compacts are deferred, not removed: at that run's 0.03-0.045 MB/s
// of promotion under load the next would come after another 12-20 minutes. The cost is memory: up
// to some 50 MB more of dead objects in the main thread's heap before they are collected (the
// sizing flags are the main thread's alone: workerHeapsAtDefaults below).
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
 * (`npm run bench:thread-heaps`, medians of 3), and V8's defaults are what `npm run bench:index`
 * has always measured the shards with. Heap sizes are read when an isolate's heap is made, so the main thread,
 * whose heap exists already, keeps its sizes (test/v8-flags.test.ts checks both sides).
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
