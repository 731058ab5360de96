// Proxy overhead (part of `npm run bench:route`; alone: `node dist/bench/proxy.js`): streaming
// completions through `kv-router serve` against the same requests sent straight to the
// upstreams, at a steady 200 concurrent streams. The figure is the router's p99 TTFT overhead:
// the routed path's p99 time to first token less the direct path's (target: at most 2 ms).
//
// The load is open loop: requests start evenly spaced at a fixed rate, scheduled against the
// monotonic clock and never waiting for earlier responses, so the number of open streams is rate
// × stream duration and a slow path cannot lower its own load. (autocannon's bursts made even the
// direct path's p99 a queueing artefact.)
//
// The upstreams are fixed-timing SSE servers in a child process (first token after 50 ms, then
// one every 50 ms, 16 tokens), not the mocker: its batched steps put hundreds of ms of step
// jitter into each TTFT, which would drown a difference of a millisecond. The router runs
// round-robin, as the direct path spreads its requests, so both paths load the upstreams alike and
// the difference is the hop itself: parsing, routing, booking, proxying every chunk.
//
// Rounds, three of each kind:
//   paired       (the headline) both paths at once, 200 streams open on each, requests
//                interleaved one by one: whatever the shared machine does falls on both alike.
//   log off      paired rounds, each taken in turn with a paired one, against a second router
//                started with `--log-level off`: the headline router writes a JSON line per
//                request at info, as by default, to a pipe this process reads. Request logging is
//                within the noise when the 95% bootstrap interval of the difference of the two
//                pooled p99 TTFT overheads holds 0.
//   alternating  the target's load exactly, one path at a time: each path serves four slices in
//                the order direct, routed, routed, direct, ..., each slice ramping up from idle,
//                and only requests sent once its streams are all open count. A path's p99 is over
//                its slices' pooled samples, as many as one paired phase has.
//   nice -10     paired rounds against a second router started with `--nice -10`, its threads
//                ahead of the load generator and the upstreams on the shared cores. Its overhead
//                falls partly because the others wait instead, so read it with the direct
//                path's own p99 beside it. Not run, with the reason, where the system refuses a
//                negative niceness (no root, CAP_SYS_NICE or RLIMIT_NICE).
//   bare         paired rounds with the smallest proxy on the router's own stack in its place:
//                fastify takes the body as bytes, undici sends it to the next upstream in turn,
//                each chunk of the answer goes back as it comes. It parses no JSON and routes,
//                books and counts nothing; it runs with the router's V8 flags, so the two differ
//                in their work only.
//   relay        paired rounds with a TCP relay in the router's place: each client connection
//                piped to one upstream, nothing parsed. The cost of one more process hop.
// The router less the bare proxy is the router's own work; the bare proxy less the relay is what
// Node's HTTP server and client cost; the relay is the hop no proxy avoids. Every process in the
// router's place serves a phase alone and one paired round that is not counted first: a fresh
// process's first round under load is its slowest (code not yet optimised, the heap's first
// growth, connections to open).
//
// Each round's p99 overhead comes with a 95% bootstrap interval, and each kind of round with the
// p99 over its three rounds' samples pooled: a phase's p99 rests on its slowest 1% (a few dozen
// requests), and sampling alone moves it by a millisecond or two either way.
//
// Where the overhead arises: the client notes when it hands each request to undici, and the
// upstream stamps its first event with when the request reached it and when the event left, all
// on CLOCK_MONOTONIC, which every process on the machine shares. Each TTFT then splits into
// ingress (client sends -> upstream has the whole request), the upstream's own 50 ms, and egress
// (first event leaves the upstream -> client has it). The router appends `nvext` to the first
// event only, so the stamps reach the client; a request without them fails the run.
//
// Beside each round: the CPU per request of the process in the path and each process's share of
// a core (from /proc), the router's GC pauses and event-loop delay (from its /metrics), and the
// machine's steal time.
//
// Environment: BENCH_PROXY_SECS, the phase length of the uncounted and reference rounds (10 s;
// paired and alternating phases are twice as long); BENCH_PROXY_MODE=kv runs the router in kv
// mode, so each request also takes an overlap query through a shard (the upstreams publish no
// KV events, so the choice still spreads by load); BENCH_PROXY_PROMPT_TOKENS (64) sets the
// prompt length, and 4096 is what KV-aware routing usually carries; ROUTER_NODE_FLAGS adds node
// flags to the router and the bare proxy (`--cpu-prof`, `--trace-gc`, an `--import` probe).
import type { ChildProcess } from 'node:child_process'
import { createServer, type ServerResponse } from 'node:http'
import { Agent } from 'undici'
import { overheadDifferenceInterval, quantile, quantileDifferenceInterval } from './lib/stats.js'
import { announceReady, bytesApp, child, machineStealTicks, median, processTicks, standInAgent, TICKS_PER_S } from './lib/common.js'
import { ROUTER_V8_FLAGS } from '../src/runtime/v8-flags.js'

/** The processes that stand in the router's place in the reference rounds. */
type Reference = 'bare' | 'relay'
type HopName = 'router' | Reference

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
  /**
   * CPU time (all threads, from /proc) of the process in the path (router, bare proxy or relay), per request of the phase; null for
   * direct phases or off Linux.
   */
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
  /** The phase length of the paired and alternating rounds (the target's): longer, for a narrower interval. */
  headlineSeconds: number
  engines: number
  promptTokens: number
  maxTokens: number
  ttftMs: number
  itlMs: number
  /** Paired rounds: both paths at once, requests interleaved one by one (the headline). */
  paired: PairedSummary
  /** Paired rounds, taken in turn with those above, against a second router with logging off. */
  pairedLoggingOff: PairedSummary
  /**
   * The router's pooled p99 TTFT overhead with its request lines at info (the default) less the
   * same with logging off, with its 95% bootstrap interval: within the noise when it holds 0.
   */
  logging: { differenceMs: number; ci95Ms: [number, number]; withinNoise: boolean }
  /** Alternating rounds: one path at a time in short slices, the target's load exactly (see alternatingRound). */
  alternating: PairedSummary
  /** Paired rounds with a router started with --nice (PRIORITY_NICE); refused says why they did not run. */
  priority: { nice: number; summary: PairedSummary | null; refused: string | null }
  /** Paired rounds with the bare fastify + undici proxy in the router's place: the stack's floor. */
  bare: PairedSummary
  /** Paired rounds with the bare TCP relay in the router's place: the cost of the hop alone. */
  relay: PairedSummary
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

/** The logged router's pooled p99 TTFT overhead less the quiet one's, and its bootstrap interval. */
function loggingDifference(logged: PairedSummary, quiet: PairedSummary): ProxyResult['logging'] {
  const pool = (rs: Round[], side: 'direct' | 'hop'): number[] => rs.flatMap((x) => ttftSamples(x[side])).sort((a, b) => a - b)
  const ci95Ms = overheadDifferenceInterval(
    pool(logged.rounds, 'direct'),
    pool(logged.rounds, 'hop'),
    pool(quiet.rounds, 'direct'),
    pool(quiet.rounds, 'hop'),
    { resamples: 2000 },
  )
  return { differenceMs: logged.pooledTtftMs - quiet.pooledTtftMs, ci95Ms, withinNoise: ci95Ms[0] <= 0 && 0 <= ci95Ms[1] }
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
              'data: {"id":"u","object":"text_completion","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":16,"total_tokens":80,' +
                '"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n',
            )
            return
          }
          sent++
          const stamp = sent === 1 ? `"bench_in":${arrived},"bench_out":${monoUs()},` : ''
          res.write(
            `data: {"id":"u","object":"text_completion",${stamp}"choices":[{"index":0,"text":"t${sent}","finish_reason":` +
              `${sent === MAX_TOKENS ? '"length"' : 'null'}}]}\n\n`,
          )
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

/** A stand-in proxy listening, and how to stop it. */
export interface BareProxy {
  url: string
  close: () => Promise<void>
}

/**
 * The bare proxy, round-robin over the upstreams, with nothing of the router's own work (see the
 * header): fastify takes the body as bytes, undici sends it to the next upstream in turn, each
 * chunk of the answer goes back through Node's response as it comes, and the upstream request is
 * aborted when the client goes.
 */
export async function bareProxy(urls: string[]): Promise<BareProxy> {
  const upstream = standInAgent()
  let next = 0
  const forward = (body: Buffer, res: ServerResponse): void => {
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
  const app = await bytesApp()
  app.post('/v1/completions', (req, reply) => {
    reply.hijack()
    forward(req.body as Buffer, reply.raw)
  })
  return { url: await app.listen({ port: 0, host: '127.0.0.1' }), close: () => app.close().then(() => upstream.close()) }
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
  if (!Number.isInteger(v) || v < 1 || v > 65536)
    throw new Error(`BENCH_PROXY_PROMPT_TOKENS must be an integer in [1, 65536], got ${process.env.BENCH_PROXY_PROMPT_TOKENS}`)
  return v
})()
const MAX_TOKENS = 16

/** The router's lane: a phase reads its GC pauses and event-loop delay from its /metrics. */
const isRouter = (path: PhaseResult['path']): boolean => path === 'router'

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
    if (st.ingress.length !== st.ttft.length)
      throw new Error(`${l.path}: ${st.ttft.length - st.ingress.length} of ${st.ttft.length} first events came without the upstream's time stamps`)
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
  const cpu = slices.every((x) => x.hopCpuUsPerRequest !== null)
    ? slices.reduce((a, x, i) => a + (x.hopCpuUsPerRequest as number) * (raw[i] as { sent: number }).sent, 0) / sent
    : null
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
    cpuPct: {
      client: mean(slices.map((x) => x.cpuPct.client)) as number,
      upstreams: mean(slices.map((x) => x.cpuPct.upstreams)),
      hop: mean(slices.map((x) => x.cpuPct.hop)),
    },
    hopGc: gcs.every((g) => g !== null) ? sumGc(gcs as GcTotals[]) : null,
    hopLoopDelayMs: loops.every((l) => l !== null)
      ? { p99: median(loops.map((l) => (l as { p99: number }).p99)), max: Math.max(...loops.map((l) => (l as { max: number }).max)) }
      : null,
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
  return [
    ...routerNodeFlags(),
    cli,
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-block-size',
    '64',
    '--router-queue-threshold',
    'none',
    '--router-mode',
    mode,
    ...workers,
  ]
}

/**
 * A reference process in the router's place. The bare proxy gets the router's node flags, so that
 * the two differ in their work only; the relay, which parses nothing and allocates next to
 * nothing, runs with Node's defaults.
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
 * One alternating round: the target's load, `streams` open on one path at a time, the paths taking
 * turns in short slices (direct, routed, routed, direct, and again) so that the machine's drift over
 * the round falls on both alike. Each slice ramps up from idle; only requests sent once its streams
 * are all open count (a stream's length after the start), and a path's p99 is over the pooled
 * samples of its slices, as many as one paired phase has.
 */
async function alternatingRound(
  direct: Lane,
  routed: Lane,
  rate: number,
  streamMs: number,
  seconds: number,
  agent: Agent,
  upstreamsPid: number | undefined,
): Promise<Round> {
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

export async function benchProxy(
  cli: string,
  opts: { streams?: number; seconds?: number; engines?: number; mode?: 'round-robin' | 'kv' } = {},
): Promise<ProxyResult> {
  const streams = opts.streams ?? 200
  const seconds = opts.seconds ?? 10
  // The p99 of one 10-s phase (about 2,300 requests, its slowest two dozen deciding it) moves by a
  // millisecond or two either way from sampling alone (its bootstrap interval, printed per round);
  // the rounds the target is read from run twice as long, so that the p99 pooled over three of them
  // rests on six times as many samples, an interval about 2.5 times narrower.
  const headlineSeconds = 2 * seconds
  const mode = opts.mode ?? 'round-robin'
  const engines = opts.engines ?? 4
  const up = await startUpstreams(engines)
  const directUrls = up.urls
  let router: ChildProcess | undefined
  let quiet: ChildProcess | undefined
  /** The processes of the other rounds (router at --nice, bare proxy, relay), killed at the end whatever happens. */
  const others: ChildProcess[] = []
  // paired rounds hold `streams` open on each path at once
  const agent = new Agent({ connections: 2 * streams + 56, pipelining: 1, keepAliveTimeout: 30_000 })
  try {
    const serve = serveArgs(cli, mode, directUrls)
    // its log (a line per request, at the default level) is read as a collector would, not shown
    const started = await child(serve, /listening on (http:\/\/\S+)/, { quiet: true })
    router = started.p
    const upPid = up.p.pid
    const direct: Lane = { path: 'direct', urls: directUrls }
    const routed: Lane = { path: 'router', urls: [started.m[1] as string], pid: router.pid }
    // the same router with logging off, for what its request lines cost
    const quietStarted = await child([...serve, '--log-level', 'off'], /listening on (http:\/\/\S+)/, { quiet: true })
    quiet = quietStarted.p
    const routedQuiet: Lane = { path: 'router', urls: [quietStarted.m[1] as string], pid: quiet.pid }
    const { rate, streamMs } = await calibrate(direct, streams, agent)
    // not counted: a phase alone, then a paired round (see the header)
    for (const lane of [routed, routedQuiet]) {
      await phase([lane], rate, 3, agent)
      await phase([direct, lane], rate, seconds, agent, upPid)
    }
    // the two routers' rounds in turn, the first of each pair alternated
    const paired: Round[] = []
    const pairedOff: Round[] = []
    for (let i = 0; i < 3; i++) {
      for (const logged of i % 2 === 0 ? [true, false] : [false, true]) {
        const [d, r] = (await phase([direct, logged ? routed : routedQuiet], rate, headlineSeconds, agent, upPid)) as [PhaseResult, PhaseResult]
        ;(logged ? paired : pairedOff).push(round(d, r))
      }
    }
    quiet.kill('SIGTERM')
    const alternating: Round[] = []
    for (let i = 0; i < 3; i++) alternating.push(await alternatingRound(direct, routed, rate, streamMs, headlineSeconds, agent, upPid))
    /** Three paired rounds with `c` in the router's place, after a phase alone and a paired round not counted. */
    const roundsWith = async (c: { p: ChildProcess; m: RegExpMatchArray }, path: Lane['path']): Promise<Round[]> => {
      others.push(c.p)
      const lane: Lane = { path, urls: [c.m[1] as string], pid: c.p.pid }
      try {
        await phase([lane], rate, 3, agent)
        await phase([direct, lane], rate, seconds, agent, upPid)
        const out: Round[] = []
        for (let i = 0; i < 3; i++) out.push(round(...((await phase([direct, lane], rate, seconds, agent, upPid)) as [PhaseResult, PhaseResult])))
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
      nice = await child([...serve, '--nice', String(PRIORITY_NICE)], /listening on (http:\/\/\S+)/, { quiet: true })
    } catch (err) {
      // a refused niceness is exit 2 with the router's reason; anything else is the benchmark's failure
      const m = /^child exited 2: (.*)/.exec((err as Error).message)
      if (m === null) throw err
      refused = (m[1] as string).trim()
    }
    if (nice !== null) priority = { nice: PRIORITY_NICE, summary: summary(await roundsWith(nice, 'router')), refused: null }
    else priority = { nice: PRIORITY_NICE, summary: null, refused }
    const bareRounds = await roundsWith(await startReference('bare', directUrls), 'bare')
    const relayRounds = await roundsWith(await startReference('relay', directUrls), 'relay')
    const pairedSummary = summary(paired)
    const offSummary = summary(pairedOff)
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
      paired: pairedSummary,
      pairedLoggingOff: offSummary,
      logging: loggingDifference(pairedSummary, offSummary),
      alternating: summary(alternating),
      priority,
      bare: summary(bareRounds),
      relay: summary(relayRounds),
    }
  } finally {
    await agent.close()
    router?.kill('SIGTERM')
    quiet?.kill('SIGTERM')
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
    `\nproxy: ${p.engines} fixed-timing upstreams (first token ${p.ttftMs} ms, then every ${p.itlMs} ms, ${p.maxTokens} tokens), ` +
      `${p.promptTokens}-token prompts, open-loop at ${p.ratePerSec}/s per path for ~${p.streamsTarget} concurrent streams, ${p.seconds} s per ` +
      `phase (paired and alternating rounds ${p.headlineSeconds} s), router in ${p.mode} mode`,
  )
  console.log(
    'round        | path   | requests | errors | mean open | TTFT p50 ms | TTFT p99 ms | total p50 ms | total p99 ms | ingress p50 / p99 ms | ' +
      'egress p50 / p99 ms | hop CPU µs/req',
  )
  const row = (label: string, x: PhaseResult): void =>
    console.log(
      `${label.padEnd(12)} | ${x.path.padEnd(6)} | ${String(x.requests).padStart(8)} | ${String(x.errors).padStart(6)} | ` +
        `${x.meanOpen.toFixed(0).padStart(9)} | ${x.ttftMs.p50.toFixed(2).padStart(11)} | ${x.ttftMs.p99.toFixed(2).padStart(11)} | ` +
        `${x.totalMs.p50.toFixed(2).padStart(12)} | ${x.totalMs.p99.toFixed(2).padStart(12)} | ` +
        `${`${x.ingressMs.p50.toFixed(2)} / ${x.ingressMs.p99.toFixed(2)}`.padStart(20)} | ` +
        `${`${x.egressMs.p50.toFixed(2)} / ${x.egressMs.p99.toFixed(2)}`.padStart(19)} | ` +
        `${(x.hopCpuUsPerRequest === null ? '–' : x.hopCpuUsPerRequest.toFixed(0)).padStart(14)}`,
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
        : `direct phase: client ${f(d.client)}, upstreams ${f(d.upstreams)}; routed phase: client ${f(c.client)}, upstreams ${f(c.upstreams)}, ` +
          `${hop} ${f(c.hop)}`
      const g = r.hop.hopGc
      const gcText =
        g === null
          ? ''
          : ` | router GC pauses: ${g.scavenges} scavenges, ${g.scavengeMs.toFixed(1)} ms` +
            `${g.majors > 0 ? `; ${g.majors} major, ${g.majorMs.toFixed(1)} ms` : ''}`
      const ld = r.hop.hopLoopDelayMs
      const loopText = ld === null ? '' : ` | router event-loop delay p99 ${ld.p99.toFixed(1)} ms, max ${ld.max.toFixed(1)} ms`
      console.log(
        `${''.padEnd(12)} | p99 overhead: TTFT ${r.p99TtftOverheadMs.toFixed(2)} ms (95% bootstrap ${interval(r.p99TtftOverheadCi95Ms)}; ingress ` +
          `${r.p99IngressOverheadMs.toFixed(2)}, egress ${r.p99EgressOverheadMs.toFixed(2)}), total ${r.p99TotalOverheadMs.toFixed(2)} ms | CPU of ` +
          `one core: ${load}${gcText}${loopText}${stealText(r.direct, r.hop, samePhase)}`,
      )
    })
  rows('paired', p.paired.rounds)
  rows('log off', p.pairedLoggingOff.rounds)
  rows('alternate', p.alternating.rounds)
  if (p.priority.summary !== null) rows(`nice ${p.priority.nice}`, p.priority.summary.rounds)
  rows('bare', p.bare.rounds)
  rows('relay', p.relay.rounds)
  const us = (x: number | null): string => (x === null ? '–' : x.toFixed(0))
  // absolute p99s beside the overheads: at a higher priority the router's overhead falls partly because the direct path slows
  const abs = (rs: Round[]): string => `${median(rs.map((r) => r.direct.ttftMs.p99)).toFixed(2)} / ${median(rs.map((r) => r.hop.ttftMs.p99)).toFixed(2)}`
  console.log("\np99 TTFT overhead by kind of round, ms (pooled: over the three rounds' samples; median: of the three rounds' own)")
  console.log("rounds      | in the router's place  | pooled | 95% bootstrap    | median | ingress / egress | TTFT p99 direct / hop | CPU µs/req")
  const line = (name: string, hop: string, x: PairedSummary): void =>
    console.log(
      `${name.padEnd(11)} | ${hop.padEnd(22)} | ${x.pooledTtftMs.toFixed(2).padStart(6)} | ${interval(x.pooledTtftCi95Ms).padEnd(16)} | ` +
        `${x.ttftMs.toFixed(2).padStart(6)} | ${`${x.ingressMs.toFixed(2)} / ${x.egressMs.toFixed(2)}`.padStart(16)} | ` +
        `${abs(x.rounds).padStart(21)} | ${us(x.cpuUsPerRequest).padStart(10)}`,
    )
  line('paired', 'router', p.paired)
  line('log off', 'router, --log-level off', p.pairedLoggingOff)
  line('alternating', 'router', p.alternating)
  if (p.priority.summary !== null) line(`nice ${p.priority.nice}`, `router at --nice ${p.priority.nice}`, p.priority.summary)
  else console.log(`nice ${p.priority.nice}    | not run: ${p.priority.refused}`)
  line('bare', 'fastify + undici proxy', p.bare)
  line('relay', 'TCP relay', p.relay)
  const g = p.logging
  console.log(
    `\nrequest logging at info (paired less log off): p99 TTFT overhead ${g.differenceMs >= 0 ? '+' : ''}${g.differenceMs.toFixed(2)} ms (95% ` +
      `bootstrap ${interval(g.ci95Ms)}): ${g.withinNoise ? 'within the noise' : 'NOT within the noise'}`,
  )
}

if (process.argv[2] === '--upstreams') {
  await upstreams(Number(process.argv[3] ?? 4))
} else if (process.argv[2] === '--relay') {
  await relay(process.argv.slice(3))
} else if (process.argv[2] === '--bare') {
  announceReady('bare', (await bareProxy(process.argv.slice(3))).url)
} else if (process.argv[1]?.endsWith('proxy.js') === true) {
  const cli = new URL('../src/main.js', import.meta.url).pathname
  const r = await benchProxy(cli, { seconds: Number(process.env.BENCH_PROXY_SECS ?? 10), mode: process.env.BENCH_PROXY_MODE === 'kv' ? 'kv' : 'round-robin' })
  printProxy(r)
}
