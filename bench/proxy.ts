// Proxy overhead (issue #5 bar): streaming completions through `kv-router serve` against the
// same requests straight to the simulated engines, at a steady 200 concurrent streams.
//
// autocannon paces by bursts, which made even the direct path's p99 a queueing artefact; this
// generator is open-loop instead: requests start evenly spaced at a fixed rate (scheduled
// against the monotonic clock, never waiting for earlier responses), so the number of open
// streams is rate × stream duration and the p99 difference is the router's own cost.
//
// The upstreams are fixed-timing SSE servers in a child process (first token after 50 ms, then
// one every 50 ms, 16 tokens), not the mocker: the mocker's batched steps put hundreds of ms of
// step-alignment jitter into each TTFT, which would drown a difference of a millisecond. The
// router runs round-robin, as the direct path does, so both paths load the upstreams alike and
// the difference is the hop itself: parsing, routing, booking, proxying every chunk.
//
// Two kinds of rounds. Sequential: a direct phase, then a routed one, two rounds. Paired (the
// headline): both paths at once, `streams` open on each, requests interleaved one by one. On this
// shared machine the direct path's own p99 moved by 5 ms from one 10 s phase to the next, more
// than the bar; in a paired round whatever the machine does falls on both paths alike, so the
// p99 difference is what the hop adds. ROUTER_NODE_FLAGS="…" passes node flags to the router
// child, and to the bare proxy below (diagnosis: --trace-gc, --cpu-prof, --import of a probe; a
// V8 flag then applies to both). BENCH_PROXY_MODE=kv runs the
// router in kv mode instead, so each request also takes an overlap query through the shard; the
// upstreams emit no KV events, so the choice still spreads by load. BENCH_PROXY_PROMPT_TOKENS=4096
// sends long prompts instead of 64-token ones: what KV-aware routing usually carries, and where
// the router's body handling and its GC show (bench/HISTORY.md, bench:route, session 13).
//
// Alternating rounds: the paired rounds' two paths each hold `streams` open, so the machine carries
// twice the bar's load. These hold the bar's load exactly, one path at a time: each path serves
// four short slices in the order direct, routed, routed, direct, direct, routed, routed, direct,
// each slice ramping up from idle, and only requests sent once a slice's streams are all open
// count; a path's p99 is over its slices' pooled samples (as many as one paired phase has). Slices
// of a few seconds share the machine's slower drift; what a paired round shares and these do not
// is the moment-to-moment noise. In session 22's runs (README, Benchmarks) the router's overhead
// was the higher of the two in two runs of three: at the bar's load it took more CPU per request
// and its p50 overhead was twice the paired rounds'.
//
// Where the TTFT overhead arises: the client notes when it hands each request to undici and the
// upstream stamps its first event with when the request reached it and when the event left, all on
// CLOCK_MONOTONIC, which every process on the machine shares. So each TTFT splits into ingress (client sends ->
// upstream has the whole request), the upstream's own 50 ms, and egress (first event leaves the
// upstream -> client has it); a path's p99 of each, against the direct path's in the same round,
// says whether the hop's cost is on the way in (parse, route, book, dispatch) or on the way out
// (parse the upstream's response, rewrite the first event, write it). The router only appends
// `nvext` to the first event, so the stamps reach the client; a request without them fails the run.
//
// Bare rounds: the same paired rounds with the smallest proxy on the router's own stack in its
// place: fastify takes the body as bytes (its default reader, one copy more than the router's, which
// at 64 tokens is a few hundred bytes), undici sends it to the next upstream in turn, and each
// chunk of the answer goes back through Node's response. It parses no JSON, routes, books and
// counts nothing. It runs with the router's V8 flags, so that the two differ in their work only.
// What it adds over the relay is the stack's share of the overhead; what the router adds over it
// is the router's own work.
//
// Priority rounds: the same paired rounds against a second router started with `--nice -10`
// (src/runtime/nice.ts), so that its threads run ahead of the load generator and the upstreams that
// share the machine's cores. The overhead then falls, but not for free: the load generator and
// the upstreams wait instead, which slows the direct path too (README, "Scheduling priority"), so
// read these rounds with the direct path's own p99 beside them. Where the system refuses a
// negative niceness (no root, CAP_SYS_NICE or RLIMIT_NICE), they are not run and the result says why.
//
// Reference rounds: the same paired rounds with a bare TCP relay in the router's place (a Node
// process that pipes each client connection to one upstream, parsing nothing). They tell what
// one more process hop costs on this machine at that hour, so that the router's figure can be
// split into the hop, which no proxy avoids, and the router's own work. They run after the
// router's rounds, so that the router's conditions are those the headline always had. Each
// process in the router's place first serves a paired round that is not counted (the priority
// rounds' router two, as much load as the first router had served before its paired rounds): in
// ten runs the first round of a fresh bare proxy was always the slowest of its three, at 2.05-16.87
// ms against 0.34-3.12 ms for the other two (bench/HISTORY.md, bench:route, session 15).
//
// Side-by-side rounds: the router and the bare proxy served at once, three lanes (direct, router,
// bare) interleaved one by one, so that both meet the same moments of the machine. The bare
// rounds above run minutes after the router's, in another phase of the machine: in session 17
// the router's overhead exceeded the bare proxy's by 0.21-2.44 ms across runs, yet in a one-off
// run of eight rounds side by side the router's median was below the bare proxy's (2.57 against
// 2.87 ms; bench/HISTORY.md, bench:route, session 18). Three lanes load the machine half as much again as
// two, so these rounds compare the two proxies with each other; the bar is read from the paired
// and alternating rounds.
//
// Each round's p99 overhead comes with a 95% bootstrap interval, and each kind of round with the
// p99 over its rounds' samples pooled: the p99 of one phase rests on its slowest 1% (24 requests
// in 10 s), and in the session the intervals were added its sampling alone moved it by a
// millisecond or two either way, as much as the round-to-round spread that earlier sessions
// put down to the machine's phases (bench/HISTORY.md, bench:route, session 22).
import type { ChildProcess } from 'node:child_process'
import { existsSync } from 'node:fs'
import { createServer, type ServerResponse } from 'node:http'
import { Agent } from 'undici'
import { quantile, quantileDifferenceInterval } from './bootstrap.js'
import { announceReady, bytesApp, child, machineStealTicks, median, processTicks, standInAgent, TICKS_PER_S } from './common.js'
import { ROUTER_V8_FLAGS } from '../src/runtime/v8-flags.js'
import { rawClientProxy, rawServerProxy } from './raw-http.js'

/** Processes that can stand in the router's place: reference proxies, and the raw-socket measuring sticks of bench/raw-http.ts. */
const REFERENCES = ['bare', 'bare-node', 'relay', 'raw-client', 'raw-server', 'raw-both'] as const
type Reference = (typeof REFERENCES)[number]
/** `router-b` is a second build of the router (BENCH_PROXY_ROUTER_B), for an A/B of a change. */
type HopName = 'router' | 'router-b' | Reference

export interface PhaseResult {
  path: 'direct' | HopName
  requests: number
  errors: number
  /** Streams open at once, averaged over the phase. */
  meanOpen: number
  ttftMs: { p50: number; p99: number }
  totalMs: { p50: number; p99: number }
  /** Client sends -> the upstream has the whole request (CLOCK_MONOTONIC on both sides). */
  ingressMs: { p50: number; p99: number }
  /** The upstream writes the first event -> the client has it. */
  egressMs: { p50: number; p99: number }
  /** CPU time (all threads, from /proc) of the process in the path (router, bare proxy or relay), per request of the phase; null for direct phases or off Linux. */
  hopCpuUsPerRequest: number | null
  /** CPU of each process over the phase, in % of one core (the machine has to share its cores between them). */
  cpuPct: { client: number; upstreams: number | null; hop: number | null }
  /** The router's GC pauses over the phase, from its /metrics (router lanes only). Each scavenge stalls every request in flight. */
  hopGc: GcTotals | null
  /** The router's main-thread event-loop delay over the phase (router lanes only), from its /metrics: busy, or waiting for a core. */
  hopLoopDelayMs: { p99: number; max: number } | null
  /**
   * The machine's steal time over the phase (ms, all CPUs together): the hypervisor running
   * something else while this VM had work. Null off Linux.
   */
  stealMs: number | null
}

export interface GcTotals {
  scavenges: number
  scavengeMs: number
  majors: number
  majorMs: number
}

/**
 * The router's GC pause totals (`nodejs_gc_duration_seconds`) and its event-loop delay since the
 * previous scrape (`kvrouter_eventloop_delay_*`: each scrape starts a new interval, so the reading at
 * a phase's end covers the phase).
 */
async function readRouterPauses(base: string): Promise<GcTotals & { loopP99Ms: number; loopMaxMs: number }> {
  const body = await (await fetch(`${base}/metrics`)).text()
  const read = (what: 'count' | 'sum', kind: string): number => {
    const m = body.match(new RegExp(`^nodejs_gc_duration_seconds_${what}\\{kind="${kind}"\\} (\\S+)$`, 'm'))
    return m === null ? 0 : Number(m[1])
  }
  const lag = (k: string): number => {
    const m = body.match(new RegExp(`^kvrouter_eventloop_delay_${k}_seconds (\\S+)$`, 'm'))
    return m === null ? Number.NaN : Number(m[1]) * 1000
  }
  return {
    scavenges: read('count', 'minor'),
    scavengeMs: read('sum', 'minor') * 1000,
    majors: read('count', 'major'),
    majorMs: read('sum', 'major') * 1000,
    loopP99Ms: lag('p99'),
    loopMaxMs: lag('max'),
  }
}

function sumGc(gs: GcTotals[]): GcTotals {
  const t: GcTotals = { scavenges: 0, scavengeMs: 0, majors: 0, majorMs: 0 }
  for (const g of gs) {
    t.scavenges += g.scavenges
    t.scavengeMs += g.scavengeMs
    t.majors += g.majors
    t.majorMs += g.majorMs
  }
  return t
}

function gcDiff(a: GcTotals, b: GcTotals): GcTotals {
  return { scavenges: b.scavenges - a.scavenges, scavengeMs: b.scavengeMs - a.scavengeMs, majors: b.majors - a.majors, majorMs: b.majorMs - a.majorMs }
}

/** One direct phase and one routed phase (or both lanes of one paired phase) and their p99 difference. */
export interface Round {
  direct: PhaseResult
  /** The lane through the extra process: the router, or the bare proxy or the relay in their rounds. */
  hop: PhaseResult
  p99TtftOverheadMs: number
  /** 95% bootstrap interval of p99TtftOverheadMs: the round's own sampling noise. */
  p99TtftOverheadCi95Ms: [number, number]
  p99TotalOverheadMs: number
  /** The hop's p99 ingress and egress less the direct path's: where the TTFT overhead arises. */
  p99IngressOverheadMs: number
  p99EgressOverheadMs: number
}

export interface ProxyResult {
  streamsTarget: number
  /** The router's --router-mode. */
  mode: 'round-robin' | 'kv'
  ratePerSec: number
  seconds: number
  /** The phase length of the paired and alternating rounds (the bar's): longer, for a narrower interval. */
  headlineSeconds: number
  engines: number
  promptTokens: number
  maxTokens: number
  ttftMs: number
  itlMs: number
  rounds: Round[]
  /** Sequential rounds: a direct phase, then a routed one. */
  p99TtftOverheadMsMedian: number
  p99TotalOverheadMsMedian: number
  /** Paired rounds: both paths at once, requests interleaved one by one (the headline). */
  paired: PairedSummary
  /** Alternating rounds: one path at a time in short slices, the bar's load exactly (see alternatingRound). */
  alternating: PairedSummary
  /** The router's CPU per request, median over the sequential and the paired rounds. */
  routerCpuUsPerRequestMedian: number | null
  /** Paired rounds with a router started with --nice (PRIORITY_NICE); refused says why they did not run. */
  priority: { nice: number; summary: PairedSummary | null; refused: string | null }
  /** Paired rounds with the bare fastify + undici proxy in the router's place: the stack's floor. */
  bare: PairedSummary
  /** Paired rounds with the bare TCP relay in the router's place: the cost of the hop alone. */
  relay: PairedSummary
  /** Rounds with the router and the bare proxy served at once, each against the same direct path. */
  sideBySide: SideBySide
}

/** One round of three lanes at once: direct, router and bare proxy, requests interleaved one by one. */
export interface SideBySideRound {
  router: Round
  bare: Round
}

export interface SideBySide {
  rounds: SideBySideRound[]
  /** Medians over the rounds of each one's p99 TTFT overhead (ms). */
  routerTtftMs: number
  bareTtftMs: number
  /** Median over the rounds of the router's overhead less the bare proxy's in the same round (ms). */
  routerLessBareTtftMs: number
  routerCpuUsPerRequest: number | null
  bareCpuUsPerRequest: number | null
}

function sideBySide(rounds: SideBySideRound[]): SideBySide {
  return {
    rounds,
    routerTtftMs: median(rounds.map((x) => x.router.p99TtftOverheadMs)),
    bareTtftMs: median(rounds.map((x) => x.bare.p99TtftOverheadMs)),
    routerLessBareTtftMs: median(rounds.map((x) => x.router.p99TtftOverheadMs - x.bare.p99TtftOverheadMs)),
    routerCpuUsPerRequest: cpuMedian(rounds.map((x) => x.router)),
    bareCpuUsPerRequest: cpuMedian(rounds.map((x) => x.bare)),
  }
}

/** A set of paired rounds and the medians of their p99 overheads (ms) and of the hop's CPU per request. */
export interface PairedSummary {
  rounds: Round[]
  ttftMs: number
  /** The p99 TTFT overhead over the rounds' samples pooled (three times a round's), and its 95% bootstrap interval. */
  pooledTtftMs: number
  pooledTtftCi95Ms: [number, number]
  totalMs: number
  ingressMs: number
  egressMs: number
  cpuUsPerRequest: number | null
}

function cpuMedian(rs: Round[]): number | null {
  const xs = rs.map((x) => x.hop.hopCpuUsPerRequest)
  return xs.every((x) => x !== null) ? median(xs as number[]) : null
}

function summary(rounds: Round[]): PairedSummary {
  const m = (k: 'p99TtftOverheadMs' | 'p99TotalOverheadMs' | 'p99IngressOverheadMs' | 'p99EgressOverheadMs'): number => median(rounds.map((x) => x[k]))
  const pool = (side: 'direct' | 'hop'): number[] => rounds.flatMap((x) => ttftSamples(x[side])).sort((a, b) => a - b)
  const d = pool('direct')
  const h = pool('hop')
  return {
    rounds,
    ttftMs: m('p99TtftOverheadMs'),
    pooledTtftMs: quantile(h, 0.99) - quantile(d, 0.99),
    pooledTtftCi95Ms: overheadCi(d, h),
    totalMs: m('p99TotalOverheadMs'),
    ingressMs: m('p99IngressOverheadMs'),
    egressMs: m('p99EgressOverheadMs'),
    cpuUsPerRequest: cpuMedian(rounds),
  }
}

/** The niceness of the priority rounds' router: ahead of everything at the default 0. */
const PRIORITY_NICE = -10

const TTFT_MS = 50
const ITL_MS = 50

/** CLOCK_MONOTONIC in µs: the same clock in every process of the machine. */
function monoUs(): number {
  return Number(process.hrtime.bigint() / 1000n)
}

/** Child process: `count` fixed-timing OpenAI-style SSE servers; prints their URLs. */
async function upstreams(count: number): Promise<void> {
  const urls: string[] = []
  for (let i = 0; i < count; i++) {
    const server = createServer((req, res) => {
      req.resume()
      req.on('end', () => {
        const arrived = monoUs()
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
        let sent = 0
        const tick = (): void => {
          if (res.destroyed) return
          if (sent === MAX_TOKENS) {
            res.end(
              'data: {"id":"u","object":"text_completion","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":16,"total_tokens":80,"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n',
            )
            return
          }
          sent++
          const stamp = sent === 1 ? `"bench_in":${arrived},"bench_out":${monoUs()},` : ''
          res.write(`data: {"id":"u","object":"text_completion",${stamp}"choices":[{"index":0,"text":"t${sent}","finish_reason":${sent === MAX_TOKENS ? '"length"' : 'null'}}]}\n\n`)
          setTimeout(tick, ITL_MS)
        }
        setTimeout(tick, TTFT_MS)
      })
    })
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
    urls.push(`http://127.0.0.1:${(server.address() as { port: number }).port}`)
  }
  announceReady('upstreams', urls.join(' '))
}

/**
 * Child process: the reference hop. Each client connection is piped to one upstream (round-robin
 * by connection, as the router spreads requests); bytes pass through unread, so what it adds is
 * the process hop itself: two more socket reads and writes per chunk and the wake-ups.
 */
async function relay(urls: string[]): Promise<void> {
  const net = await import('node:net')
  const targets = urls.map((u) => new URL(u))
  let next = 0
  const server = net.createServer((client) => {
    const t = targets[next++ % targets.length] as URL
    const upstream = net.connect(Number(t.port), t.hostname)
    client.setNoDelay(true)
    upstream.setNoDelay(true)
    client.pipe(upstream)
    upstream.pipe(client)
    client.on('error', () => upstream.destroy())
    upstream.on('error', () => client.destroy())
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => client.destroy())
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  announceReady('relay', `http://127.0.0.1:${(server.address() as { port: number }).port}`)
}

/**
 * The bare proxies' forwarding: the body to the next upstream in turn through undici, each chunk
 * of the answer back through Node's response as it comes, the upstream request aborted when the
 * client goes.
 */
function bareForwarder(urls: string[], upstream: Agent): (body: Buffer, res: ServerResponse) => void {
  let next = 0
  return (body, res) => {
    const url = new URL(urls[next++ % urls.length] as string)
    let abort: ((err?: Error) => void) | null = null
    res.on('close', () => {
      if (!res.writableFinished) abort?.(new Error('client gone'))
    })
    upstream.dispatch(
      { origin: url.origin, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' }, body },
      {
        onConnect(a: (err?: Error) => void) {
          abort = a
        },
        onHeaders(status: number) {
          res.writeHead(status, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
          return true
        },
        onData(chunk: Buffer) {
          res.write(chunk)
          return true
        },
        onComplete() {
          res.end()
        },
        onError() {
          res.destroy()
        },
      },
    )
  }
}

/** A stand-in proxy listening, and how to stop it. */
export interface BareProxy {
  url: string
  close: () => Promise<void>
}

/**
 * The bare proxy, round-robin over the upstreams, with nothing of the router's own work (see the
 * header). On the router's stack (`fastify`: fastify, undici), or without fastify (`node`: Node's
 * HTTP server alone, the same parser, llhttp, and the same response), so that the two differ by
 * what fastify itself costs a request: routing, its request and reply objects, hooks, body reader.
 */
export async function bareProxy(urls: string[], on: 'fastify' | 'node'): Promise<BareProxy> {
  const upstream = standInAgent()
  const forward = bareForwarder(urls, upstream)
  if (on === 'fastify') {
    const app = await bytesApp()
    app.post('/v1/completions', (req, reply) => {
      reply.hijack()
      forward(req.body as Buffer, reply.raw)
    })
    return { url: await app.listen({ port: 0, host: '127.0.0.1' }), close: () => app.close().then(() => upstream.close()) }
  }
  const server = createServer((req, res) => {
    if (req.method !== 'POST' || req.url !== '/v1/completions') {
      req.resume()
      res.writeHead(404).end()
      return
    }
    const parts: Buffer[] = []
    req.on('data', (c: Buffer) => parts.push(c))
    req.on('end', () => forward(parts.length === 1 ? (parts[0] as Buffer) : Buffer.concat(parts), res))
  })
  // fastify's default, which the other kind runs with
  server.keepAliveTimeout = 72_000
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections()
        server.close(() => r())
      }).then(() => upstream.close()),
  }
}

let promptSeed = 1
function uniquePrompt(tokens: number): string {
  // xorshift over a per-request seed: every prompt differs from its first block on
  let x = (promptSeed++ * 2654435761) >>> 0 || 1
  const ids: number[] = []
  for (let i = 0; i < tokens; i++) {
    x ^= x << 13
    x >>>= 0
    x ^= x >>> 17
    x ^= x << 5
    x >>>= 0
    ids.push(x % 150_000)
  }
  return JSON.stringify({ model: 'mock', prompt: ids, max_tokens: MAX_TOKENS, stream: true })
}

/** bench_in and bench_out of a first event, or null when the chunk does not hold both. */
function stamps(chunk: Buffer): { in: number; out: number } | null {
  const m = /"bench_in":(\d+),"bench_out":(\d+)/.exec(chunk.toString('latin1'))
  return m === null ? null : { in: Number(m[1]), out: Number(m[2]) }
}

const PROMPT_TOKENS = ((): number => {
  const v = Number(process.env.BENCH_PROXY_PROMPT_TOKENS ?? 64)
  if (!Number.isInteger(v) || v < 1 || v > 65536) throw new Error(`BENCH_PROXY_PROMPT_TOKENS must be an integer in [1, 65536], got ${process.env.BENCH_PROXY_PROMPT_TOKENS}`)
  return v
})()
const MAX_TOKENS = 16

/** A build of the router: a phase reads its GC pauses and event-loop delay from its /metrics. */
const isRouter = (path: PhaseResult['path']): boolean => path === 'router' || path === 'router-b'

interface Lane {
  path: PhaseResult['path']
  urls: string[]
  /** The process behind the lane (router, bare proxy or relay), whose CPU the phase reads; none for the direct path. */
  pid?: number | undefined
}

/**
 * Open-loop load over one or more lanes at `rate` requests/s each: request k goes to lane
 * k mod lanes, so lanes run side by side and share whatever the machine does meanwhile.
 */
async function phase(lanes: Lane[], rate: number, seconds: number, agent: Agent, upstreamsPid?: number, countFromMs = 0): Promise<PhaseResult[]> {
  const routerLane = lanes.find((l) => isRouter(l.path))
  const routerUrl = routerLane?.urls[0]
  const gc0 = routerUrl === undefined ? null : await readRouterPauses(routerUrl)
  const hop0 = lanes.map((l) => processTicks(l.pid))
  const up0 = processTicks(upstreamsPid)
  const steal0 = machineStealTicks()
  const client0 = process.cpuUsage()
  const wall0 = performance.now()
  const stats = lanes.map(() => ({
    ttft: [] as number[],
    total: [] as number[],
    ingress: [] as number[],
    egress: [] as number[],
    errors: 0,
    rampErrors: 0,
    requests: 0,
    counted: 0,
    open: 0,
    openArea: 0,
    lastChange: performance.now(),
  }))
  const track = (st: (typeof stats)[number], d: number): void => {
    const now = performance.now()
    st.openArea += st.open * (now - st.lastChange)
    st.lastChange = now
    st.open += d
  }
  const inflight: Promise<void>[] = []
  const one = (st: (typeof stats)[number], url: URL, body: string, counted: boolean): Promise<void> =>
    new Promise<void>((resolve) => {
      const sent = monoUs()
      // undici's dispatcher callbacks, not a Readable body iterated with for-await: the load
      // generator shares the 2 cores with the router, and its own per-chunk promises and ticks
      // would take CPU from the process being measured
      const t0 = performance.now()
      track(st, 1)
      let status = 0
      let first = -1
      let split: { ingress: number; egress: number } | null = null
      const done = (ok: boolean): void => {
        if (!counted) {
          // a ramp-up request: it loads the machine like the others, its times are not kept
          if (!(ok && status === 200 && first >= 0)) st.rampErrors++
        } else if (ok && status === 200 && first >= 0) {
          st.ttft.push(first - t0)
          st.total.push(performance.now() - t0)
          if (split !== null) {
            st.ingress.push(split.ingress)
            st.egress.push(split.egress)
          }
        } else st.errors++
        track(st, -1)
        resolve()
      }
      agent.dispatch(
        { origin: url.origin, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' }, body },
        {
          onConnect() {},
          onHeaders(code: number) {
            status = code
            return true
          },
          onData(chunk: Buffer) {
            if (first < 0 && chunk.length > 0) {
              first = performance.now()
              const got = monoUs()
              const s = stamps(chunk)
              if (s !== null) split = { ingress: (s.in - sent) / 1000, egress: (got - s.out) / 1000 }
            }
            return true
          },
          onComplete() {
            done(true)
          },
          onError() {
            done(false)
          },
        },
      )
    })
  const targets = lanes.map((l) => l.urls.map((u) => new URL(u)))
  const start = performance.now()
  const end = start + seconds * 1000
  const countFrom = start + countFromMs
  const interval = 1000 / (rate * lanes.length)
  let k = 0
  for (;;) {
    const due = start + k * interval
    if (due >= end) break
    const wait = due - performance.now()
    if (wait > 1) await new Promise((r) => setTimeout(r, wait - 0.5))
    else if (wait > 0) await new Promise((r) => setImmediate(r))
    if (performance.now() < due) continue
    const lane = k % lanes.length
    const st = stats[lane] as (typeof stats)[number]
    const urls = targets[lane] as URL[]
    const counted = due >= countFrom
    if (counted && st.counted === 0) {
      // the open-stream average covers the counted sends only
      st.openArea = 0
      st.lastChange = performance.now()
    }
    inflight.push(one(st, urls[st.requests % urls.length] as URL, uniquePrompt(PROMPT_TOKENS), counted))
    st.requests++
    if (counted) st.counted++
    k++
  }
  const sendEnd = performance.now()
  // the streams still open drain after the last send: the average is of the sends' span only
  const openDuringSends = stats.map((st) => st.openArea + st.open * (sendEnd - st.lastChange))
  await Promise.all(inflight)
  const hop1 = lanes.map((l) => processTicks(l.pid))
  const steal1 = machineStealTicks()
  const stealMs = steal0 === null || steal1 === null ? null : ((steal1 - steal0) / TICKS_PER_S) * 1000
  const wallS = (performance.now() - wall0) / 1000
  const client1 = process.cpuUsage(client0)
  const pct = (t0: number | null, t1: number | null): number | null => (t0 === null || t1 === null ? null : ((t1 - t0) / TICKS_PER_S / wallS) * 100)
  const clientPct = ((client1.user + client1.system) / 1e6 / wallS) * 100
  const upstreamsPct = pct(up0, processTicks(upstreamsPid))
  const gc1 = routerUrl === undefined ? null : await readRouterPauses(routerUrl)
  const hopGc = gc0 === null || gc1 === null ? null : gcDiff(gc0, gc1)
  return lanes.map((l, i) => {
    const st = stats[i] as (typeof stats)[number]
    // a first event without the upstream's stamps would drop out of the split unseen
    if (st.ingress.length !== st.ttft.length) throw new Error(`${l.path}: ${st.ttft.length - st.ingress.length} of ${st.ttft.length} first events came without the upstream's time stamps`)
    for (const xs of [st.ttft, st.total, st.ingress, st.egress]) xs.sort((a, b) => a - b)
    const h0 = hop0[i] ?? null
    const h1 = hop1[i] ?? null
    const result: PhaseResult = {
      path: l.path,
      requests: st.counted,
      errors: st.errors + st.rampErrors,
      meanOpen: (openDuringSends[i] as number) / (sendEnd - Math.max(start, countFrom)),
      ttftMs: { p50: quantile(st.ttft, 0.5), p99: quantile(st.ttft, 0.99) },
      totalMs: { p50: quantile(st.total, 0.5), p99: quantile(st.total, 0.99) },
      ingressMs: { p50: quantile(st.ingress, 0.5), p99: quantile(st.ingress, 0.99) },
      egressMs: { p50: quantile(st.egress, 0.5), p99: quantile(st.egress, 0.99) },
      hopCpuUsPerRequest: h0 === null || h1 === null ? null : (((h1 - h0) / TICKS_PER_S) * 1e6) / st.requests,
      cpuPct: { client: clientPct, upstreams: upstreamsPct, hop: pct(h0, h1) },
      hopGc: l === routerLane ? hopGc : null,
      hopLoopDelayMs: l === routerLane && gc1 !== null ? { p99: gc1.loopP99Ms, max: gc1.loopMaxMs } : null,
      stealMs,
    }
    samplesOf.set(result, { ttft: st.ttft, total: st.total, ingress: st.ingress, egress: st.egress, sent: st.requests })
    return result
  })
}

/** Each phase lane's sorted samples, kept beside its result (not in the JSON) so that slices can be merged. */
const samplesOf = new WeakMap<PhaseResult, { ttft: number[]; total: number[]; ingress: number[]; egress: number[]; sent: number }>()

/** Slices of one lane as one result: their samples pooled, counts summed, CPU weighted by requests sent. */
function merge(slices: PhaseResult[]): PhaseResult {
  const first = slices[0]
  if (first === undefined) throw new Error('merge: no slices')
  const raw = slices.map((x) => {
    const r = samplesOf.get(x)
    if (r === undefined) throw new Error('merge: a slice without its samples')
    return r
  })
  const pool = (k: 'ttft' | 'total' | 'ingress' | 'egress'): number[] => raw.flatMap((r) => r[k]).sort((a, b) => a - b)
  const ttft = pool('ttft')
  const total = pool('total')
  const ingress = pool('ingress')
  const egress = pool('egress')
  const q = (xs: number[]): { p50: number; p99: number } => ({ p50: quantile(xs, 0.5), p99: quantile(xs, 0.99) })
  const mean = (xs: (number | null)[]): number | null => (xs.every((x) => x !== null) ? (xs as number[]).reduce((a, b) => a + b, 0) / xs.length : null)
  const sent = raw.reduce((a, r) => a + r.sent, 0)
  const cpu = slices.every((x) => x.hopCpuUsPerRequest !== null) ? slices.reduce((a, x, i) => a + (x.hopCpuUsPerRequest as number) * (raw[i] as { sent: number }).sent, 0) / sent : null
  const gcs = slices.map((x) => x.hopGc)
  const loops = slices.map((x) => x.hopLoopDelayMs)
  const merged: PhaseResult = {
    path: first.path,
    requests: slices.reduce((a, x) => a + x.requests, 0),
    errors: slices.reduce((a, x) => a + x.errors, 0),
    meanOpen: mean(slices.map((x) => x.meanOpen)) as number,
    ttftMs: q(ttft),
    totalMs: q(total),
    ingressMs: q(ingress),
    egressMs: q(egress),
    hopCpuUsPerRequest: cpu,
    cpuPct: { client: mean(slices.map((x) => x.cpuPct.client)) as number, upstreams: mean(slices.map((x) => x.cpuPct.upstreams)), hop: mean(slices.map((x) => x.cpuPct.hop)) },
    hopGc: gcs.every((g) => g !== null) ? sumGc(gcs as GcTotals[]) : null,
    hopLoopDelayMs: loops.every((l) => l !== null) ? { p99: median(loops.map((l) => (l as { p99: number }).p99)), max: Math.max(...loops.map((l) => (l as { max: number }).max)) } : null,
    stealMs: slices.every((x) => x.stealMs !== null) ? slices.reduce((a, x) => a + (x.stealMs as number), 0) : null,
  }
  samplesOf.set(merged, { ttft, total, ingress, egress, sent })
  return merged
}

/**
 * 95% bootstrap interval of p99(hop) - p99(direct): how far the figure of one round could move on
 * the same machine moments from the sampling alone (2,000 resamples: the interval's ends settle to
 * a few hundredths of a ms).
 */
function overheadCi(direct: number[], hop: number[]): [number, number] {
  return quantileDifferenceInterval(direct, hop, { q: 0.99, level: 0.95, resamples: 2000 })
}

function ttftSamples(x: PhaseResult): number[] {
  const r = samplesOf.get(x)
  if (r === undefined) throw new Error(`${x.path}: a phase result without its samples`)
  return r.ttft
}

function round(d: PhaseResult, r: PhaseResult): Round {
  return {
    direct: d,
    hop: r,
    p99TtftOverheadMs: r.ttftMs.p99 - d.ttftMs.p99,
    p99TtftOverheadCi95Ms: overheadCi(ttftSamples(d), ttftSamples(r)),
    p99TotalOverheadMs: r.totalMs.p99 - d.totalMs.p99,
    p99IngressOverheadMs: r.ingressMs.p99 - d.ingressMs.p99,
    p99EgressOverheadMs: r.egressMs.p99 - d.egressMs.p99,
  }
}

/** This module's file: run again as the upstreams, the bare proxy or the relay. */
const SELF = new URL(import.meta.url).pathname

/** The router's node flags: its own V8 flags, then ROUTER_NODE_FLAGS (see the header). */
function routerNodeFlags(): string[] {
  return [...ROUTER_V8_FLAGS, ...(process.env.ROUTER_NODE_FLAGS ?? '').split(' ').filter((x) => x !== '')]
}

/** The upstreams' child process and their URLs. */
async function startUpstreams(engines: number): Promise<{ p: ChildProcess; urls: string[] }> {
  const up = await child([SELF, '--upstreams', String(engines)], /upstreams ready ([^\n]+)\n/)
  return { p: up.p, urls: (up.m[1] as string).trim().split(/\s+/) }
}

/** `kv-router serve` in front of the upstreams, with the router's node flags. */
function serveArgs(cli: string, mode: 'round-robin' | 'kv', upstreamUrls: string[]): string[] {
  const workers = upstreamUrls.flatMap((u, i) => ['--worker', `${i + 1}=${u}`])
  return [...routerNodeFlags(), cli, 'serve', '--http-host', '127.0.0.1', '--http-port', '0', '--router-block-size', '64', '--router-queue-threshold', 'none', '--router-mode', mode, ...workers]
}

/**
 * A reference process in the router's place. Those that parse HTTP get the router's V8 flags, so
 * that they differ from it in their work only; the relay, which allocates next to nothing, runs as
 * it always has.
 */
function startReference(path: Reference, upstreamUrls: string[]): Promise<{ p: ChildProcess; m: RegExpMatchArray }> {
  return child([...(path === 'relay' ? [] : routerNodeFlags()), SELF, `--${path}`, ...upstreamUrls], new RegExp(`${path} ready (\\S+)`))
}

/** The stream length on the direct path, unloaded, and the open-loop rate that keeps `streams` open. */
async function calibrate(direct: Lane, streams: number, agent: Agent): Promise<{ rate: number; streamMs: number }> {
  const [probe] = (await phase([direct], 20, 3, agent)) as [PhaseResult]
  return { rate: Math.max(1, Math.round(streams / (probe.totalMs.p50 / 1000))), streamMs: probe.totalMs.p50 }
}

/** A bootstrap interval as printed. */
function interval([lo, hi]: [number, number]): string {
  return `${lo.toFixed(2)} to ${hi.toFixed(2)}`
}

/**
 * One alternating round: the bar's load, `streams` open on one path at a time, the paths taking
 * turns in short slices (direct, routed, routed, direct, and again) so that the machine's drift over
 * the round falls on both alike. Each slice ramps up from idle; only requests sent once its streams
 * are all open count (a stream's length after the start), and a path's p99 is over the pooled
 * samples of its slices, as many as one paired phase has.
 */
async function alternatingRound(direct: Lane, routed: Lane, rate: number, streamMs: number, seconds: number, agent: Agent, upstreamsPid: number | undefined): Promise<Round> {
  const slices = 4
  // a tenth over the calibrated stream length: by then streams end as fast as new ones open
  const rampMs = Math.ceil(streamMs * 1.1)
  const sliceS = seconds / slices + rampMs / 1000
  const out: { direct: PhaseResult[]; router: PhaseResult[] } = { direct: [], router: [] }
  for (let i = 0; i < slices; i++) {
    const order = i % 2 === 0 ? [direct, routed] : [routed, direct]
    for (const lane of order) {
      const [x] = (await phase([lane], rate, sliceS, agent, upstreamsPid, rampMs)) as [PhaseResult]
      out[lane.path === 'direct' ? 'direct' : 'router'].push(x)
    }
  }
  return round(merge(out.direct), merge(out.router))
}

export async function benchProxy(cli: string, opts: { streams?: number; seconds?: number; engines?: number; mode?: 'round-robin' | 'kv' } = {}): Promise<ProxyResult> {
  const streams = opts.streams ?? 200
  const seconds = opts.seconds ?? 10
  // The p99 of one 10-s phase (2,330 requests, its 24 slowest deciding it) moves by a millisecond
  // or two either way from sampling alone (its bootstrap interval, printed per round); the rounds
  // the bar is read from run twice as long, so that the p99 pooled over three of them rests on six
  // times as many samples, an interval about 2.5 times narrower.
  const headlineSeconds = 2 * seconds
  const mode = opts.mode ?? 'round-robin'
  const engines = opts.engines ?? 4
  const up = await startUpstreams(engines)
  const directUrls = up.urls
  let router: ChildProcess | undefined
  /** The reference processes (bare proxy, relay), killed at the end whatever happens. */
  const others: ChildProcess[] = []
  // paired rounds hold `streams` open on each path at once, side-by-side rounds on each of three
  const agent = new Agent({ connections: 3 * streams + 56, pipelining: 1, keepAliveTimeout: 30_000 })
  try {
    const serve = serveArgs(cli, mode, directUrls)
    const started = await child(serve, /listening on (http:\/\/\S+)/)
    router = started.p
    const upPid = up.p.pid
    const direct: Lane = { path: 'direct', urls: directUrls }
    const routed: Lane = { path: 'router', urls: [started.m[1] as string], pid: router.pid }
    const { rate, streamMs } = await calibrate(direct, streams, agent)
    await phase([routed], rate, 3, agent)
    const rounds: Round[] = []
    for (let i = 0; i < 2; i++) {
      const [d] = (await phase([direct], rate, seconds, agent, upPid)) as [PhaseResult]
      const [r] = (await phase([routed], rate, seconds, agent, upPid)) as [PhaseResult]
      rounds.push(round(d, r))
    }
    const paired: Round[] = []
    for (let i = 0; i < 3; i++) {
      const [d, r] = (await phase([direct, routed], rate, headlineSeconds, agent, upPid)) as [PhaseResult, PhaseResult]
      paired.push(round(d, r))
    }
    const alternating: Round[] = []
    for (let i = 0; i < 3; i++) alternating.push(await alternatingRound(direct, routed, rate, streamMs, headlineSeconds, agent, upPid))
    /**
     * Three paired rounds with `c` in the router's place, after `warm` that are not counted (see the
     * header); then `andThen`, if given, while `c` still runs.
     */
    const roundsWith = async (c: { p: ChildProcess; m: RegExpMatchArray }, path: Lane['path'], warm: number, andThen?: (lane: Lane) => Promise<void>): Promise<Round[]> => {
      others.push(c.p)
      const lane: Lane = { path, urls: [c.m[1] as string], pid: c.p.pid }
      try {
        await phase([lane], rate, 3, agent)
        for (let i = 0; i < warm; i++) await phase([direct, lane], rate, seconds, agent, upPid)
        const out: Round[] = []
        for (let i = 0; i < 3; i++) out.push(round(...((await phase([direct, lane], rate, seconds, agent, upPid)) as [PhaseResult, PhaseResult])))
        if (andThen !== undefined) await andThen(lane)
        return out
      } finally {
        // gone before the next process takes its place, not draining beside it
        if (c.p.exitCode === null && c.p.signalCode === null) {
          const gone = new Promise((r) => c.p.once('exit', r))
          c.p.kill('SIGTERM')
          await gone
        }
      }
    }
    let priority: ProxyResult['priority']
    let nice: { p: ChildProcess; m: RegExpMatchArray } | null = null
    let refused: string | null = null
    try {
      nice = await child([...serve, '--nice', String(PRIORITY_NICE)], /listening on (http:\/\/\S+)/)
    } catch (err) {
      // a refused niceness is exit 2 with the router's reason; anything else is the benchmark's failure
      const m = /^child exited 2: (.*)/.exec((err as Error).message)
      if (m === null) throw err
      refused = (m[1] as string).trim()
    }
    // two rounds not counted: the load the first router had served before its paired rounds, in
    // which a fresh router's heap makes its first growth under load
    if (nice !== null) priority = { nice: PRIORITY_NICE, summary: summary(await roundsWith(nice, 'router', 2)), refused: null }
    else priority = { nice: PRIORITY_NICE, summary: null, refused }
    const referenceRounds = async (path: 'bare' | 'relay', andThen?: (lane: Lane) => Promise<void>): Promise<Round[]> => roundsWith(await startReference(path, directUrls), path, 1, andThen)
    const together: SideBySideRound[] = []
    const bareRounds = await referenceRounds('bare', async (bareLane) => {
      // the router idled through the priority and bare rounds: its connections are let go after
      // 5 s idle, so it serves alone for a moment first, then one round together uncounted
      await phase([routed], rate, 3, agent)
      await phase([direct, routed, bareLane], rate, seconds, agent, upPid)
      for (let i = 0; i < 3; i++) {
        const [d, r, b] = (await phase([direct, routed, bareLane], rate, seconds, agent, upPid)) as [PhaseResult, PhaseResult, PhaseResult]
        together.push({ router: round(d, r), bare: round(d, b) })
      }
    })
    const relayRounds = await referenceRounds('relay')
    return {
      streamsTarget: streams,
      mode,
      ratePerSec: rate,
      seconds,
      headlineSeconds,
      engines,
      promptTokens: PROMPT_TOKENS,
      maxTokens: MAX_TOKENS,
      ttftMs: TTFT_MS,
      itlMs: ITL_MS,
      rounds,
      p99TtftOverheadMsMedian: median(rounds.map((x) => x.p99TtftOverheadMs)),
      p99TotalOverheadMsMedian: median(rounds.map((x) => x.p99TotalOverheadMs)),
      paired: summary(paired),
      alternating: summary(alternating),
      routerCpuUsPerRequestMedian: cpuMedian([...rounds, ...paired]),
      priority,
      bare: summary(bareRounds),
      sideBySide: sideBySide(together),
      relay: summary(relayRounds),
    }
  } finally {
    await agent.close()
    router?.kill('SIGTERM')
    for (const o of others) o.kill('SIGTERM')
    up.p.kill('SIGTERM')
  }
}

/**
 * A round's steal time: a round in which the hypervisor held back this VM's CPUs is the machine's,
 * whatever the hop did. Nothing where /proc/stat cannot say.
 */
function stealText(direct: PhaseResult, hop: PhaseResult, samePhase: boolean): string {
  const ms = (x: number | null): string => (x === null ? '–' : `${x.toFixed(0)} ms`)
  if (direct.stealMs === null && hop.stealMs === null) return ''
  return samePhase ? ` | machine steal ${ms(hop.stealMs)}` : ` | machine steal: direct phase ${ms(direct.stealMs)}, routed phase ${ms(hop.stealMs)}`
}

export function printProxy(p: ProxyResult): void {
  console.log(
    `\nproxy: ${p.engines} fixed-timing upstreams (first token ${p.ttftMs} ms, then every ${p.itlMs} ms, ${p.maxTokens} tokens), ${p.promptTokens}-token prompts, open-loop at ${p.ratePerSec}/s per path for ~${p.streamsTarget} concurrent streams, ${p.seconds} s per phase (paired and alternating rounds ${p.headlineSeconds} s), router in ${p.mode} mode`,
  )
  console.log('round        | path   | requests | errors | mean open | TTFT p50 ms | TTFT p99 ms | total p50 ms | total p99 ms | ingress p50 / p99 ms | egress p50 / p99 ms | hop CPU µs/req')
  const row = (label: string, x: PhaseResult): void =>
    console.log(
      `${label.padEnd(12)} | ${x.path.padEnd(6)} | ${String(x.requests).padStart(8)} | ${String(x.errors).padStart(6)} | ${x.meanOpen.toFixed(0).padStart(9)} | ${x.ttftMs.p50.toFixed(2).padStart(11)} | ${x.ttftMs.p99.toFixed(2).padStart(11)} | ${x.totalMs.p50.toFixed(2).padStart(12)} | ${x.totalMs.p99.toFixed(2).padStart(12)} | ${`${x.ingressMs.p50.toFixed(2)} / ${x.ingressMs.p99.toFixed(2)}`.padStart(20)} | ${`${x.egressMs.p50.toFixed(2)} / ${x.egressMs.p99.toFixed(2)}`.padStart(19)} | ${(x.hopCpuUsPerRequest === null ? '–' : x.hopCpuUsPerRequest.toFixed(0)).padStart(14)}`,
    )
  const f = (x: number | null): string => (x === null ? '–' : `${x.toFixed(0)}%`)
  const rows = (label: string, rs: Round[]): void =>
    rs.forEach((r, i) => {
      for (const x of [r.direct, r.hop]) row(`${label} ${i + 1}`, x)
      const c = r.hop.cpuPct
      const d = r.direct.cpuPct
      const hop = r.hop.path
      // the lanes of one phase share the phase's client and upstreams readings
      const samePhase = c.client === d.client && c.upstreams === d.upstreams
      const load = samePhase
        ? `client ${f(c.client)}, upstreams ${f(c.upstreams)}, ${hop} ${f(c.hop)}`
        : `direct phase: client ${f(d.client)}, upstreams ${f(d.upstreams)}; routed phase: client ${f(c.client)}, upstreams ${f(c.upstreams)}, ${hop} ${f(c.hop)}`
      const g = r.hop.hopGc
      const gcText = g === null ? '' : ` | router GC pauses: ${g.scavenges} scavenges, ${g.scavengeMs.toFixed(1)} ms${g.majors > 0 ? `; ${g.majors} major, ${g.majorMs.toFixed(1)} ms` : ''}`
      const ld = r.hop.hopLoopDelayMs
      const loopText = ld === null ? '' : ` | router event-loop delay p99 ${ld.p99.toFixed(1)} ms, max ${ld.max.toFixed(1)} ms`
      console.log(
        `${''.padEnd(12)} | p99 overhead: TTFT ${r.p99TtftOverheadMs.toFixed(2)} ms (95% bootstrap ${interval(r.p99TtftOverheadCi95Ms)}; ingress ${r.p99IngressOverheadMs.toFixed(2)}, egress ${r.p99EgressOverheadMs.toFixed(2)}), total ${r.p99TotalOverheadMs.toFixed(2)} ms | CPU of one core: ${load}${gcText}${loopText}${stealText(r.direct, r.hop, samePhase)}`,
      )
    })
  rows('sequential', p.rounds)
  rows('paired', p.paired.rounds)
  rows('alternate', p.alternating.rounds)
  if (p.priority.summary !== null) rows(`nice ${p.priority.nice}`, p.priority.summary.rounds)
  rows('bare', p.bare.rounds)
  rows('reference', p.relay.rounds)
  const sb = p.sideBySide
  sb.rounds.forEach((r, i) => {
    for (const x of [r.router.direct, r.router.hop, r.bare.hop]) row(`together ${i + 1}`, x)
    const c = r.router.hop.cpuPct
    console.log(
      `${''.padEnd(12)} | p99 TTFT overhead: router ${r.router.p99TtftOverheadMs.toFixed(2)} ms, bare ${r.bare.p99TtftOverheadMs.toFixed(2)} ms, router less bare ${(r.router.p99TtftOverheadMs - r.bare.p99TtftOverheadMs).toFixed(2)} ms | CPU of one core: client ${f(c.client)}, upstreams ${f(c.upstreams)}, router ${f(c.hop)}, bare ${f(r.bare.hop.cpuPct.hop)}${stealText(r.router.direct, r.router.hop, true)}`,
    )
  })
  const us = (x: number | null): string => (x === null ? '–' : x.toFixed(0))
  const medians = (s: PairedSummary): string =>
    `TTFT ${s.ttftMs.toFixed(2)} ms (pooled over the rounds ${s.pooledTtftMs.toFixed(2)} ms, 95% bootstrap ${interval(s.pooledTtftCi95Ms)}; ingress ${s.ingressMs.toFixed(2)}, egress ${s.egressMs.toFixed(2)}), total ${s.totalMs.toFixed(2)} ms`
  console.log(
    `p99 overhead, medians: paired ${medians(p.paired)}; alternating (one path at a time, ~${p.streamsTarget} streams in all) ${medians(p.alternating)}; sequential TTFT ${p.p99TtftOverheadMsMedian.toFixed(2)} ms, total ${p.p99TotalOverheadMsMedian.toFixed(2)} ms; router CPU ${us(p.routerCpuUsPerRequestMedian)} µs per request`,
  )
  // absolute p99s beside the overheads: at a higher priority the router's overhead falls partly because the direct path slows
  const abs = (rs: Round[]): string => `direct ${median(rs.map((r) => r.direct.ttftMs.p99)).toFixed(2)} ms, routed ${median(rs.map((r) => r.hop.ttftMs.p99)).toFixed(2)} ms`
  const ps = p.priority.summary
  console.log(
    ps === null
      ? `router at --nice ${p.priority.nice}: not run: ${p.priority.refused}`
      : `router at --nice ${p.priority.nice} (its threads ahead of the load generator and the upstreams on the shared cores), paired rounds: p99 overhead, medians: ${medians(ps)}; its CPU ${us(ps.cpuUsPerRequest)} µs per request; TTFT p99 medians ${abs(ps.rounds)} (at the default priority ${abs(p.paired.rounds)})`,
  )
  console.log(`bare proxy (fastify + undici, no routing, in the router's place, paired rounds): p99 overhead, medians: ${medians(p.bare)}; its CPU ${us(p.bare.cpuUsPerRequest)} µs per request`)
  console.log(`reference hop (a bare TCP relay in the router's place, paired rounds): p99 overhead, medians: ${medians(p.relay)}; relay CPU ${us(p.relay.cpuUsPerRequest)} µs per request`)
  console.log(
    `router and bare proxy side by side (three lanes at once, each against the same direct path): p99 TTFT overhead, medians: router ${sb.routerTtftMs.toFixed(2)} ms, bare ${sb.bareTtftMs.toFixed(2)} ms, router less bare ${sb.routerLessBareTtftMs.toFixed(2)} ms; CPU µs per request: router ${us(sb.routerCpuUsPerRequest)}, bare ${us(sb.bareCpuUsPerRequest)}`,
  )
}

/**
 * Diagnosis (`BENCH_PROXY_ALTERNATING=1 node dist/bench/proxy.js`): the alternating rounds alone,
 * with the router, the bare proxy and the relay each in turn in the hop's place, interleaved round
 * by round so that they meet the same phases of the machine. It says whether a figure of the
 * alternating rounds belongs to the router or to any hop at that load. `BENCH_PROXY_HOPS` names
 * the hops instead (comma-separated; `router`, `router-b` and any of REFERENCES), e.g. the
 * raw-socket proxies of bench/raw-http.ts beside the bare one, to see which side of Node's HTTP
 * stack a figure is on, or `router,router-b` with BENCH_PROXY_ROUTER_B naming another build's
 * cli.js, to see what a change does.
 */
async function alternatingHops(cli: string, seconds: number, names: readonly HopName[], cliB?: string): Promise<void> {
  const streams = 200
  const up = await startUpstreams(4)
  const agent = new Agent({ connections: 2 * streams + 56, pipelining: 1, keepAliveTimeout: 30_000 })
  const procs: ChildProcess[] = [up.p]
  try {
    const started: [PhaseResult['path'], { p: ChildProcess; m: RegExpMatchArray }][] = []
    for (const name of names) {
      const c =
        name === 'router' || name === 'router-b'
          ? await child(serveArgs(name === 'router' ? cli : (cliB as string), 'round-robin', up.urls), /listening on (http:\/\/\S+)/)
          : await startReference(name, up.urls)
      procs.push(c.p)
      started.push([name, c])
    }
    const direct: Lane = { path: 'direct', urls: up.urls }
    const hops: Lane[] = started.map(([path, c]) => ({ path, urls: [c.m[1] as string], pid: c.p.pid }))
    const { rate, streamMs } = await calibrate(direct, streams, agent)
    // each hop warmed as the main run warms its processes: a phase alone, then one paired round
    for (const h of hops) {
      await phase([h], rate, 3, agent)
      await phase([direct, h], rate, seconds, agent)
    }
    const rounds = new Map<string, Round[]>(hops.map((h) => [h.path, []]))
    for (let i = 0; i < 3; i++) for (const h of hops) rounds.get(h.path)?.push(await alternatingRound(direct, h, rate, streamMs, 2 * seconds, agent, up.p.pid))
    console.log(`alternating rounds, ${2 * seconds} s each, open-loop at ${rate}/s, one path at a time; p99 TTFT overhead per round (95% bootstrap), pooled over the three, hop CPU µs per request`)
    for (const [path, rs] of rounds) {
      const s = summary(rs)
      const each = rs.map((r) => `${r.p99TtftOverheadMs.toFixed(2)} (${interval(r.p99TtftOverheadCi95Ms)}), p50 +${(r.hop.ttftMs.p50 - r.direct.ttftMs.p50).toFixed(2)}`).join(' | ')
      const gcs = rs.map((r) => r.hop.hopGc)
      const g = gcs.every((x) => x !== null) ? sumGc(gcs as GcTotals[]) : null
      const gc = g === null ? '' : ` | GC in the three: ${g.scavenges} scavenges (${g.scavengeMs.toFixed(0)} ms), ${g.majors} mark-compacts (${g.majorMs.toFixed(0)} ms)`
      const steal = (side: 'direct' | 'hop'): string => {
        const xs = rs.map((r) => r[side].stealMs)
        return xs.every((x) => x !== null) ? `${(xs as number[]).reduce((a, b) => a + b, 0).toFixed(0)} ms` : '–'
      }
      console.log(
        `${path.padEnd(10)} | ${each} | pooled ${s.pooledTtftMs.toFixed(2)} (${interval(s.pooledTtftCi95Ms)}) | CPU ${s.cpuUsPerRequest === null ? '–' : s.cpuUsPerRequest.toFixed(0)}${gc} | machine steal in the three: direct phases ${steal('direct')}, ${path} phases ${steal('hop')}`,
      )
    }
  } finally {
    await agent.close()
    for (const p of procs) p.kill('SIGTERM')
  }
}

/**
 * The hops BENCH_PROXY_HOPS names, checked before anything starts. `router-b` needs `routerB`, the
 * path of another build's `dist/src/main.js` (a worktree with the change), and `routerB` needs it.
 */
export function hopNames(list: string, routerB?: string): HopName[] {
  const names = list.split(',').map((n) => n.trim())
  const known: readonly string[] = ['router', 'router-b', ...REFERENCES]
  const unknown = names.filter((n) => !known.includes(n))
  // a name twice would merge its rounds into one row, read as one hop's
  if (unknown.length > 0 || new Set(names).size !== names.length)
    throw new Error(`BENCH_PROXY_HOPS takes a comma-separated list of ${known.join(', ')}, each at most once; got ${JSON.stringify(list)}`)
  if (names.includes('router-b') !== (routerB !== undefined))
    throw new Error("BENCH_PROXY_ROUTER_B (the path of a second build's dist/src/main.js) and the hop router-b in BENCH_PROXY_HOPS go together")
  if (routerB !== undefined && !existsSync(routerB)) throw new Error(`BENCH_PROXY_ROUTER_B: no file ${JSON.stringify(routerB)}`)
  return names as HopName[]
}

if (process.argv[2] === '--upstreams') {
  await upstreams(Number(process.argv[3] ?? 4))
} else if (process.argv[2] === '--relay') {
  await relay(process.argv.slice(3))
} else if (process.argv[2] === '--bare') {
  announceReady('bare', (await bareProxy(process.argv.slice(3), 'fastify')).url)
} else if (process.argv[2] === '--bare-node') {
  announceReady('bare-node', (await bareProxy(process.argv.slice(3), 'node')).url)
} else if (process.argv[2] === '--raw-client') {
  await rawClientProxy(process.argv.slice(3))
} else if (process.argv[2] === '--raw-server') {
  await rawServerProxy(process.argv.slice(3), 'undici')
} else if (process.argv[2] === '--raw-both') {
  await rawServerProxy(process.argv.slice(3), 'raw')
} else if (process.argv[1]?.endsWith('proxy.js') === true && process.env.BENCH_PROXY_ALTERNATING === '1') {
  const routerB = process.env.BENCH_PROXY_ROUTER_B
  await alternatingHops(
    new URL('../src/main.js', import.meta.url).pathname,
    Number(process.env.BENCH_PROXY_SECS ?? 10),
    hopNames(process.env.BENCH_PROXY_HOPS ?? 'router,bare,relay', routerB),
    routerB,
  )
} else if (process.argv[1]?.endsWith('proxy.js') === true) {
  if (process.env.BENCH_PROXY_HOPS !== undefined || process.env.BENCH_PROXY_ROUTER_B !== undefined)
    throw new Error('BENCH_PROXY_HOPS and BENCH_PROXY_ROUTER_B name the hops of BENCH_PROXY_ALTERNATING=1; the full run has its own')
  const cli = new URL('../src/main.js', import.meta.url).pathname
  const r = await benchProxy(cli, { seconds: Number(process.env.BENCH_PROXY_SECS ?? 10), mode: process.env.BENCH_PROXY_MODE === 'kv' ? 'kv' : 'round-robin' })
  printProxy(r)
}
