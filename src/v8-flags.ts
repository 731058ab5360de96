// V8 flags the router process is started with: the shebang of src/cli.ts, `npm start` and the
// benchmarks all pass these (a test keeps the three in step). They cannot be set once the process
// runs: V8 sizes its young generation when the heap is created.
//
// Why a fixed 64 MB young generation: each open stream keeps young objects alive for its whole
// life (`--trace-gc-nvp` at 200 streams: about 1.9 MB survives every scavenge, some 9 KB per
// stream), so every scavenge copies them, a 4–10 ms pause on a busy 2-core machine. V8's default young generation starts small and grows slowly, and scavenged about once
// per 800 ms under that load, and those pauses were the router's TTFT p99. At 64 MB the scavenges
// are a fifth as many and the p99 overhead fell from 6–11 ms to 1–2 ms in paired rounds of
// `node dist/bench/proxy.js` (bench/HISTORY.md, bench:route, session 5). The cost is memory: up to 128 MB more RSS.
//
// Why no memory reducer: when the router idles, V8's memory reducer runs "reduce" full GCs that
// shrink the heap, which then has to grow back under the load that follows. That is the likely
// cause rather than a proven one (a `--trace-gc` run showed a reduce GC in an idle gap and a full
// GC in the next busy round); the effect was measured. In a one-off harness where the router
// idled 24 s before each round (session 9, bench/HISTORY.md), three alternated pairs of runs gave
// its p99 TTFT overhead run medians of 3.20, 2.27 and 2.79 ms without the reducer and 4.46, 14.88
// and 7.38 ms with it; under steady load the two were alike (session 8). A replica behind a load balancer idles and wakes all day. The cost: an idle
// router keeps the heap its busiest minute grew.
export const ROUTER_V8_FLAGS: readonly string[] = Object.freeze(['--min-semi-space-size=64', '--max-semi-space-size=64', '--no-memory-reducer'])
