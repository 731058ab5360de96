// Route-decision benchmark (npm run bench:route): selection plus booking, given overlaps, at
// 8, 64 and 512 worker-ranks (bench/lib/decisions.ts; BENCH_ROUTE_BIG=1 adds 1,024 and 7,000, also
// with the tenants model and in workers of 8 dp ranks; BENCH_ROUTE_SIZES=8,64,7000x8:tenants picks;
// BENCH_ROUTE_BASE=<another build's dist> measures that build beside this one), queue push/pop
// throughput at 10,000 waiting requests, and the
// proxy's booking of an attempt through the whole Router.route path, and one proxied request's log
// line at info and with logging off; then the HTTP part, each
// against a baseline measured in the same run:
//   - POST /v1/route with 4,096-token JSON prompts and 16 workers vs a bare fastify route that
//     takes the same bodies as a raw buffer and answers a constant (autocannon from this
//     process, same settings, against a server child process `route.js --serve`), with the
//     server's CPU time per request served beside req/s (steadier on a shared machine); the
//     router's app twice over one router, its request lines logged at the default level (info,
//     JSON lines on the child's stderr, a pipe this process reads as a container runtime would)
//     and with logging off (silent), so one run measures what logging costs: the ratio of each to
//     the baseline, then nine trios of short phases (info, off, and a twin app with logging off
//     for an A/A comparison, the order rotated), whose median info/off ratio is within the noise
//     when its 95% bootstrap interval holds 1;
//   - proxy overhead: streaming completions through `kv-router serve` vs straight to the
//     upstreams, 200 concurrent streams, p99 difference (bench/proxy.ts), with logging at info
//     and, in rounds taken in turn with those, off.
// BENCH_HTTP_LOG_SECS sets the length of a logging trio's phases (3 s).
// `--http-only` runs the HTTP part alone, `--decisions-only` the route decision alone;
// BENCH_HTTP_SECS sets the HTTP phase length (10 s).
//
// Each decision is timed alone with process.hrtime.bigint() over a steady state (see
// bench/lib/decisions.ts). Several repetitions, the fleets' interleaved; medians are reported,
// because a shared machine is noisy.
import { writeFileSync } from 'node:fs'
import { availableParallelism, cpus } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { AddressInfo } from 'node:net'
import autocannon from 'autocannon'
import { benchProxy, printProxy } from './proxy.js'
import { ROUTER_V8_FLAGS, workerHeapsAtDefaults } from '../src/runtime/v8-flags.js'
import Fastify from 'fastify'
import { parseServeConfig } from '../src/config.js'
import type { ServeConfig } from '../src/config.js'
import { buildApp } from '../src/http/server.js'
import { createLogger } from '../src/runtime/log.js'
import type { Logger } from '../src/runtime/log.js'
import { proxiedLine } from '../src/http/request-log.js'
import type { ProxiedRequest } from '../src/http/request-log.js'
import pino from 'pino'
import { Router } from '../src/core/router.js'
import { ClientGone } from '../src/http/proxy/client-gone.js'
import { UpstreamProxy } from '../src/http/proxy/proxy.js'
import { computeBlockHashes, computeSequenceHashes } from '../src/codec/hashing.js'
import { PendingQueue } from '../src/scheduler/pending-queue.js'
import { Xoshiro128 } from '../src/scheduler/rng.js'
import { Scheduler } from '../src/scheduler/scheduler.js'
import { child, median, processTicks, repoRoot, resultsDir, TICKS_PER_S } from './lib/common.js'
import type { DecisionCase, DecisionResult } from './lib/decisions.js'
import { baseScheduler, benchDecisionSet, decisionTable, sizeRatios } from './lib/decisions.js'
import { medianInterval } from './lib/stats.js'

const BLOCK_SIZE = 64
const REPS = 5
const OPS = 20_000
const WARMUP = 20_000
const QUEUE_DEPTH = 10_000

const rng = new Xoshiro128(20240601)

/** The fleets of the decision benchmark (see the header). */
function decisionCases(): DecisionCase[] {
  const big = '8,64,512,1024,7000,1024:tenants,7000:tenants,1024x8:tenants,7000x8:tenants'
  const spec = process.env.BENCH_ROUTE_SIZES ?? (process.env.BENCH_ROUTE_BIG === '1' ? big : '8,64,512')
  return spec.split(',').map((x) => {
    const m = /^(\d+)(?:x(\d+))?(?::(share|tenants))?$/.exec(x.trim())
    const ranks = Number(m?.[1])
    const per = Number(m?.[2] ?? 1)
    if (m === null || ranks < 1 || per < 1 || ranks % per !== 0)
      throw new Error(`BENCH_ROUTE_SIZES: ${JSON.stringify(x)} is not RANKS[xDP_RANKS][:share|:tenants], RANKS a multiple of DP_RANKS`)
    return { ranks, ranksPerWorker: per, model: (m[3] ?? 'share') as DecisionCase['model'] }
  })
}

/**
 * Each fleet's decisions, their repetitions interleaved (benchDecisionSet); past 4,096
 * worker-ranks fewer operations, so that the full scans the run also times stay in minutes.
 */
async function runDecisions(): Promise<DecisionResult[]> {
  const Base = await baseScheduler(process.env.BENCH_ROUTE_BASE)
  const cases = decisionCases().map((c) => {
    const big = c.ranks > 4096
    // the tenants model's prompts: a few per tenant, however many tenants
    const templates = c.model === 'tenants' ? Math.max(2048, c.ranks / 2) : c.ranks > 1024 ? 512 : 2048
    return { c, set: { reps: REPS, ops: big ? 4000 : OPS, warmup: big ? 4000 : WARMUP, templates } }
  })
  return benchDecisionSet(cases, Base)
}

/** Raw heap: one pop plus one push per pair, depth held at QUEUE_DEPTH. */
function benchHeap(): { pairsPerSec: number; reps: number[] } {
  const reps: number[] = []
  const PAIRS = 1_000_000
  const keys = Float64Array.from({ length: 65536 }, () => rng.next() * 1000 - 500)
  for (let r = 0; r < REPS; r++) {
    const q = new PendingQueue()
    for (let h = 0; h < QUEUE_DEPTH; h++) q.push(h, keys[h & 65535] as number)
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < PAIRS; i++) {
      const h = q.pop()
      q.push(h, keys[i & 65535] as number)
    }
    const t1 = process.hrtime.bigint()
    if (q.size !== QUEUE_DEPTH) throw new Error('queue depth drifted')
    reps.push(PAIRS / (Number(t1 - t0) / 1e9))
  }
  return { pairsPerSec: median(reps), reps }
}

/**
 * Through the scheduler: one worker kept busy, 10,000 requests waiting (fcfs). Each pair is one
 * dispatch (prefill-complete of the running request pops the best waiter, selects and books it)
 * plus one new request joining the queue (a promise per waiter, as the HTTP layer would do).
 */
async function benchFacadeQueue(): Promise<{ pairsPerSec: number; reps: number[] }> {
  const reps: number[] = []
  const PAIRS = 50_000
  for (let r = 0; r < REPS; r++) {
    const s = new Scheduler({ blockSize: BLOCK_SIZE, queueThreshold: 1, queueMaxPending: QUEUE_DEPTH + 1, seed: 2 }, { timers: false })
    s.addWorkerRank(1n, 0, { maxNumBatchedTokens: 100 })
    s.tryRoute({ id: 'run-0', isl: 1000 })
    let running = 'run-0'
    const sink = (): void => {}
    const ids = Array.from({ length: QUEUE_DEPTH + PAIRS }, (_, i) => `w-${i}`)
    for (let i = 0; i < QUEUE_DEPTH; i++) s.schedule({ id: ids[i] as string, isl: 1000 }).then(sink, sink)
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < PAIRS; i++) {
      s.markPrefillComplete(running)
      s.free(running)
      const next = ids[i + QUEUE_DEPTH] as string
      s.schedule({ id: next, isl: 1000 }).then(sink, sink)
      // fcfs without priorities dispatches in arrival order: pair i ran ids[i]
      running = ids[i] as string
    }
    const t1 = process.hrtime.bigint()
    if (s.stats().queueDepth !== QUEUE_DEPTH || !s.sequences.has(running)) throw new Error(`queue state drifted: depth ${s.stats().queueDepth}`)
    reps.push(PAIRS / (Number(t1 - t0) / 1e9))
    s.close()
    await new Promise((resolve) => setImmediate(resolve))
  }
  return { pairsPerSec: median(reps), reps }
}

const BOOKINGS = 50_000

/**
 * What the proxy pays to book one attempt and free it: UpstreamProxy.book through Router.route (hashing,
 * the shard's overlap query in kv mode, selection, booking) and the release, one at a time, 4
 * workers, a 64-token prompt: the proxy benchmark's requests. Time per booking, median of REPS.
 */
async function benchBooking(mode: 'round-robin' | 'kv'): Promise<{ mode: string; us: number; reps: number[] }> {
  // no health probes: nothing listens at the workers' addresses, and probes would take them out of routing
  const cfg = parseServeConfig(
    [
      '--router-block-size',
      '64',
      '--router-event-threads',
      '1',
      '--seed',
      '1',
      '--router-queue-threshold',
      'none',
      '--router-health-probe-interval-secs',
      '0',
      '--router-mode',
      mode,
    ],
    {},
  ) as ServeConfig
  const router = await Router.start(cfg)
  try {
    for (let w = 1; w <= 4; w++) await router.addWorker({ id: BigInt(w), url: `http://127.0.0.1:${9000 + w}` })
    const proxy = new UpstreamProxy(router, { retries: 2 })
    const tokens = Array.from({ length: 64 }, (_, i) => (i * 7919) % 150_000)
    const one = async (): Promise<void> => {
      const a = await proxy.book({ tokens, isl: tokens.length }, new ClientGone())
      proxy.release(a.booking)
    }
    for (let i = 0; i < BOOKINGS; i++) await one()
    const reps: number[] = []
    for (let r = 0; r < REPS; r++) {
      const t0 = process.hrtime.bigint()
      for (let i = 0; i < BOOKINGS; i++) await one()
      reps.push(Number(process.hrtime.bigint() - t0) / 1000 / BOOKINGS)
    }
    if (proxy.releasedTotal !== BOOKINGS * (REPS + 1)) throw new Error(`bookings released ${proxy.releasedTotal}, expected ${BOOKINGS * (REPS + 1)}`)
    await proxy.close()
    return { mode, us: median(reps), reps }
  } finally {
    await router.close()
  }
}

const LINES = 100_000

/**
 * One proxied request's log line, alone: at info (the JSON built and written, one write(2) per
 * line as on stderr, here to /dev/null) and with logging off, where the proxy checks one boolean
 * and builds nothing. Time per line, median of REPS.
 */
function benchRequestLine(): { infoUs: number; offUs: number; infoReps: number[]; offReps: number[] } {
  const info = createLogger({ level: 'info', format: 'json', destination: pino.destination({ dest: '/dev/null', sync: true }) })
  const off = createLogger({ level: 'silent' })
  const req: ProxiedRequest = {
    path: '/v1/completions',
    model: 'kv-router-model',
    stream: true,
    requestId: 'rmwyjyelu18b7m26-~1234',
    decision: {
      requestId: 'rmwyjyelu18b7m26-~1234',
      slot: 3,
      workerId: 7587888160958778148n,
      dpRank: 0,
      overlapBlocks: 12,
      booked: true,
      waitedMs: 0,
      candidates: undefined,
    },
    attempts: 1,
    ttftMs: 51.234,
    errorCode: null,
  }
  const run = (logger: Logger): number => {
    // as the proxy does: the line only when its logger takes info
    const l = logger.isLevelEnabled('info') ? logger : null
    const t0 = process.hrtime.bigint()
    for (let i = 0; i < LINES; i++) if (l !== null) proxiedLine(l, req, 200, 812.5 + i)
    return Number(process.hrtime.bigint() - t0) / 1000 / LINES
  }
  run(info)
  run(off)
  const infoReps: number[] = []
  const offReps: number[] = []
  for (let r = 0; r < REPS; r++) {
    infoReps.push(run(info))
    offReps.push(run(off))
  }
  return { infoUs: median(infoReps), offUs: median(offReps), infoReps, offReps }
}

// ---------------------------------------------------------------------------------------------
// HTTP

const HTTP_BLOCK = 64
const HTTP_TOKENS = 4096
const HTTP_WORKERS = 16
const HTTP_SECS = Number(process.env.BENCH_HTTP_SECS ?? 10)
const HTTP_CONNECTIONS = 64

/** 64 prompts of 4,096 tokens: 8 shared system prefixes of 1,024 tokens + unique tails. */
function httpPrompts(): number[][] {
  const r = new Xoshiro128(99)
  const prefixes = Array.from({ length: 8 }, () => Array.from({ length: 1024 }, () => r.int(150_000)))
  return Array.from({ length: 64 }, (_, i) => [...(prefixes[i % 8] as number[]), ...Array.from({ length: HTTP_TOKENS - 1024 }, () => r.int(150_000))])
}

/**
 * Server child: a bare fastify baseline, and the router app twice over one router: its request
 * lines logged at info (the default) and with logging off.
 */
async function serveChild(): Promise<void> {
  // as kv-router does before its threads start: the flags' heap sizes are the main thread's
  workerHeapsAtDefaults()
  const base = Fastify({ bodyLimit: 16 * 1024 * 1024 })
  base.removeContentTypeParser('application/json')
  base.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => done(null, body))
  const constant = '{"worker_id":1,"dp_rank":0,"overlap_blocks":0,"candidates":[]}'
  base.post('/raw', async (_req, reply) => reply.header('content-type', 'application/json').send(constant))
  await base.listen({ host: '127.0.0.1', port: 0 })
  // no health probes: the workers' addresses are made up
  const cfg = parseServeConfig(
    [
      '--router-block-size',
      String(HTTP_BLOCK),
      '--router-event-threads',
      '1',
      '--seed',
      '1',
      '--router-queue-threshold',
      'none',
      '--router-health-probe-interval-secs',
      '0',
    ],
    process.env,
  ) as ServeConfig
  const router = await Router.start(cfg)
  for (let w = 0; w < HTTP_WORKERS; w++) await router.addWorker({ id: BigInt(1_000_000_007 * (w + 1)), url: `http://127.0.0.1:${9000 + w}` })
  // each worker caches one or two of the shared prefixes, so overlaps are real
  const prompts = httpPrompts()
  for (let w = 0; w < HTTP_WORKERS; w++) {
    const p = prompts[w % 8] as number[]
    const local = computeBlockHashes(p.slice(0, 1024), HTTP_BLOCK)
    const seq = computeSequenceHashes(local)
    const blocks = Array.from(local, (h, i) => ({ block_hash: seq[i] as bigint, tokens_hash: h }))
    router.ingestEvent({ worker_id: BigInt(1_000_000_007 * (w + 1)), event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } })
  }
  await router.pool.flush()
  // JSON lines on stderr, as `kv-router serve` writes them
  const app = await buildApp({ router, tokenizer: null, logger: createLogger({ level: 'info', format: 'json' }) })
  await app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const quiet = await buildApp({ router, tokenizer: null, logger: createLogger({ level: 'silent' }) })
  await quiet.fastify.listen({ host: '127.0.0.1', port: 0 })
  // a second app with logging off: the logging pairs compare it with the first (A/A), for the noise
  const quiet2 = await buildApp({ router, tokenizer: null, logger: createLogger({ level: 'silent' }) })
  await quiet2.fastify.listen({ host: '127.0.0.1', port: 0 })
  const port = (f: { server: { address(): unknown } }): number => (f.server.address() as AddressInfo).port
  process.stdout.write(`${JSON.stringify({ baseline: port(base), router: port(app.fastify), silent: port(quiet.fastify), silent2: port(quiet2.fastify) })}\n`)
  process.on('SIGTERM', () => process.exit(0))
  process.on('SIGINT', () => process.exit(0))
}

interface LoadResult {
  reqPerSec: number
  p50Ms: number
  p99Ms: number
  errors: number
  non2xx: number
  /** Requests answered in the phase. */
  served: number
  /**
   * CPU time (all threads) the server process spent per request served, µs; null where
   * /proc is not readable. Steadier than req/s on a shared machine: it does not count the time
   * the server waited for a core.
   */
  cpuUsPerReq: number | null
}

async function load(url: string, requests: { body: string }[], connections: number, serverPid?: number, seconds = HTTP_SECS): Promise<LoadResult> {
  const cpu0 = processTicks(serverPid)
  const r = await autocannon({
    url,
    connections,
    duration: seconds,
    pipelining: 1,
    timeout: 30,
    requests: requests.map((q) => ({ method: 'POST', headers: { 'content-type': 'application/json' }, body: q.body })),
  })
  const cpu1 = processTicks(serverPid)
  const served = r.requests.total
  const cpuUsPerReq = cpu0 !== null && cpu1 !== null && served > 0 ? ((cpu1 - cpu0) * 1e6) / TICKS_PER_S / served : null
  return { reqPerSec: r.requests.average, p50Ms: r.latency.p50, p99Ms: r.latency.p99, errors: r.errors + r.timeouts, non2xx: r.non2xx, served, cpuUsPerReq }
}

interface HttpRound {
  baseline: LoadResult
  /** /v1/route with its request lines logged at info. */
  route: LoadResult
  /** /v1/route with logging off. */
  silent: LoadResult
}

/** One trio of the logging phases: the app logging at info, the app with logging off, and its twin. */
interface LoggingTrio {
  info: LoadResult
  off: LoadResult
  off2: LoadResult
}

/** Short phases of the logging comparison, and how many trios of them (three orders, each as often). */
const LOG_SECS = Number(process.env.BENCH_HTTP_LOG_SECS ?? 3)
const LOG_TRIOS = 9

async function benchHttpRoute(): Promise<object> {
  const self = fileURLToPath(import.meta.url)
  const { p, m } = await child([...ROUTER_V8_FLAGS, self, '--serve'], /(\{.*\})\n/, { quiet: true })
  let newlines = 0
  p.stderr?.on('data', (d: Buffer) => {
    for (let i = d.indexOf(10); i !== -1; i = d.indexOf(10, i + 1)) newlines++
  })
  const ports = JSON.parse(m[1] as string) as { baseline: number; router: number; silent: number; silent2: number }
  const bodies = httpPrompts().map((tokens) => ({ body: JSON.stringify({ token_ids: tokens }) }))
  const rounds: HttpRound[] = []
  const trios: LoggingTrio[] = []
  let logged = 0
  let lines = 0
  try {
    // warm-up of both apps (one router under both: its code is warmed by either)
    await load(`http://127.0.0.1:${ports.router}/v1/route`, bodies, HTTP_CONNECTIONS)
    await load(`http://127.0.0.1:${ports.silent}/v1/route`, bodies, HTTP_CONNECTIONS)
    const before = newlines
    // three rounds, the two routers' order alternated: ratios are reported as their median
    for (let i = 0; i < 3; i++) {
      // the servers live in the one child process, so its CPU during a phase is that server's
      const baseline = await load(`http://127.0.0.1:${ports.baseline}/raw`, bodies, HTTP_CONNECTIONS, p.pid)
      const first = i % 2 === 0 ? ports.router : ports.silent
      const a = await load(`http://127.0.0.1:${first}/v1/route`, bodies, HTTP_CONNECTIONS, p.pid)
      const b = await load(`http://127.0.0.1:${first === ports.router ? ports.silent : ports.router}/v1/route`, bodies, HTTP_CONNECTIONS, p.pid)
      const [route, silent] = first === ports.router ? [a, b] : [b, a]
      rounds.push({ baseline, route, silent })
      logged += route.served
    }
    lines = newlines - before
    // Logging at info against logging off, in short phases taken in trios, the three apps' order
    // rotated so that the machine's drift falls on each alike; the twin with logging off beside
    // them gives the spread the method itself sees (an A/A comparison).
    const apps = [ports.router, ports.silent, ports.silent2]
    for (let i = 0; i < LOG_TRIOS; i++) {
      const got = new Map<number, LoadResult>()
      for (let k = 0; k < 3; k++) {
        const at = apps[(i + k) % 3] as number
        got.set(at, await load(`http://127.0.0.1:${at}/v1/route`, bodies, HTTP_CONNECTIONS, p.pid, LOG_SECS))
      }
      trios.push({ info: got.get(ports.router) as LoadResult, off: got.get(ports.silent) as LoadResult, off2: got.get(ports.silent2) as LoadResult })
    }
  } finally {
    p.kill('SIGTERM')
  }
  const logRatios = rounds.map((x) => x.route.reqPerSec / x.silent.reqPerSec)
  const logCpu = rounds.flatMap((x) => (x.route.cpuUsPerReq !== null && x.silent.cpuUsPerReq !== null ? [x.route.cpuUsPerReq - x.silent.cpuUsPerReq] : []))
  const best = rounds.map((x) => x.route.reqPerSec / x.baseline.reqPerSec)
  const offRatios = rounds.map((x) => x.silent.reqPerSec / x.baseline.reqPerSec)
  const cpuAdded = (a: LoadResult, b: LoadResult): number[] => (a.cpuUsPerReq !== null && b.cpuUsPerReq !== null ? [a.cpuUsPerReq - b.cpuUsPerReq] : [])
  const trioRatios = trios.map((x) => x.info.reqPerSec / x.off.reqPerSec)
  const twinRatios = trios.map((x) => x.off2.reqPerSec / x.off.reqPerSec)
  const trioCpu = trios.flatMap((x) => cpuAdded(x.info, x.off))
  const twinCpu = trios.flatMap((x) => cpuAdded(x.off2, x.off))
  const ratioCi = medianInterval(trioRatios)
  const cpuRatios = rounds.flatMap((x) =>
    x.route.cpuUsPerReq !== null && x.baseline.cpuUsPerReq !== null ? [x.baseline.cpuUsPerReq / x.route.cpuUsPerReq] : [],
  )
  return {
    connections: HTTP_CONNECTIONS,
    seconds: HTTP_SECS,
    tokens: HTTP_TOKENS,
    blockSize: HTTP_BLOCK,
    workers: HTTP_WORKERS,
    rounds,
    ratios: best,
    ratioMedian: median(best),
    // the same ratio with the app whose logging is off, in the same rounds
    ratiosLoggingOff: offRatios,
    ratioMedianLoggingOff: median(offRatios),
    // baseline CPU per request / router CPU per request: the throughput ratio follows it when
    // CPU, the server's or the shared machine's, is what limits both
    cpuRatios,
    cpuRatioMedian: cpuRatios.length > 0 ? median(cpuRatios) : null,
    // logging at info against logging off: req/s ratio, and the CPU a request's line adds
    logging: {
      reqPerSecRatios: logRatios,
      reqPerSecRatioMedian: median(logRatios),
      cpuUsPerReqAdded: logCpu,
      cpuUsPerReqAddedMedian: logCpu.length > 0 ? median(logCpu) : null,
      // lines written in the logged phases against the requests autocannon counted there
      lines,
      requests: logged,
      // the trios of short phases: info/off and the A/A twin/off, medians with 95% bootstrap
      // intervals; logging is within the noise when the info/off interval holds 1
      trioSeconds: LOG_SECS,
      trios,
      trioReqPerSecRatios: trioRatios,
      trioReqPerSecRatioMedian: median(trioRatios),
      trioReqPerSecRatioCi95: ratioCi,
      twinReqPerSecRatios: twinRatios,
      twinReqPerSecRatioMedian: median(twinRatios),
      twinReqPerSecRatioCi95: medianInterval(twinRatios),
      trioCpuUsPerReqAdded: trioCpu,
      trioCpuUsPerReqAddedMedian: trioCpu.length > 0 ? median(trioCpu) : null,
      trioCpuUsPerReqAddedCi95: trioCpu.length > 0 ? medianInterval(trioCpu) : null,
      twinCpuUsPerReqAddedMedian: twinCpu.length > 0 ? median(twinCpu) : null,
      twinCpuUsPerReqAddedCi95: twinCpu.length > 0 ? medianInterval(twinCpu) : null,
      withinNoise: ratioCi[0] <= 1 && 1 <= ratioCi[1],
    },
  }
}

async function main(): Promise<void> {
  if (process.argv.includes('--serve')) return serveChild()
  const httpOnly = process.argv.includes('--http-only')
  if (httpOnly) return mainHttp()
  const decisions = await runDecisions()
  const base = {
    benchmark: 'route',
    date: new Date().toISOString(),
    node: process.version,
    cpus: availableParallelism(),
    cpuModel: cpus()[0]?.model ?? 'unknown',
  }
  if (process.argv.includes('--decisions-only')) {
    const file = join(resultsDir(), 'route.json')
    writeFileSync(
      file,
      JSON.stringify(
        {
          ...base,
          blockSize: BLOCK_SIZE,
          reps: REPS,
          baseBuild: process.env.BENCH_ROUTE_BASE ?? null,
          decision: decisions,
          decisionRatios: sizeRatios(decisions),
        },
        null,
        2,
      ) + '\n',
    )
    for (const l of decisionTable(decisions, REPS)) console.log(l)
    console.log(`written to ${file}`)
    return
  }
  const heap = benchHeap()
  const facade = await benchFacadeQueue()
  const booking = [await benchBooking('round-robin'), await benchBooking('kv')]
  const requestLine = benchRequestLine()
  const result = {
    ...base,
    blockSize: BLOCK_SIZE,
    opsPerRep: OPS,
    reps: REPS,
    baseBuild: process.env.BENCH_ROUTE_BASE ?? null,
    decision: decisions,
    decisionRatios: sizeRatios(decisions),
    queue: {
      depth: QUEUE_DEPTH,
      heapPopPushPairsPerSec: heap.pairsPerSec,
      heapReps: heap.reps,
      schedulerDispatchEnqueuePairsPerSec: facade.pairsPerSec,
      schedulerReps: facade.reps,
    },
    booking,
    requestLine,
  }
  writeFileSync(join(resultsDir(), 'route.json'), JSON.stringify(result, null, 2) + '\n')
  for (const l of decisionTable(decisions, REPS)) console.log(l)
  console.log(
    `queue at ${QUEUE_DEPTH} waiting: heap pop+push ${(heap.pairsPerSec / 1e6).toFixed(2)} M pairs/s; scheduler dispatch+enqueue ` +
      `${(facade.pairsPerSec / 1e3).toFixed(1)} k pairs/s`,
  )
  console.log(
    `proxy booking (UpstreamProxy.book + release, 64-token prompt, 4 workers), median of ${REPS} × ${BOOKINGS}: ` +
      `${booking.map((b) => `${b.mode} ${b.us.toFixed(2)} µs`).join(', ')}`,
  )
  console.log(
    `a proxied request's log line, median of ${REPS} × ${LINES}: ${requestLine.infoUs.toFixed(2)} µs at info (JSON written to /dev/null), ` +
      `${requestLine.offUs.toFixed(3)} µs with logging off`,
  )
  await mainHttp(result)
}

async function mainHttp(prior: object = {}): Promise<void> {
  const http = await benchHttpRoute()
  const proxy = await benchProxy(join(repoRoot(), 'dist', 'src', 'main.js'), { seconds: HTTP_SECS })
  const dir = resultsDir()
  const out = { ...prior, http: { route: http, proxy } }
  writeFileSync(join(dir, 'route.json'), JSON.stringify(out, null, 2) + '\n')
  const h = http as {
    rounds: HttpRound[]
    ratioMedian: number
    cpuRatioMedian: number | null
    ratioMedianLoggingOff: number
    logging: {
      reqPerSecRatioMedian: number
      cpuUsPerReqAddedMedian: number | null
      lines: number
      requests: number
      trioSeconds: number
      trios: LoggingTrio[]
      trioReqPerSecRatioMedian: number
      trioReqPerSecRatioCi95: [number, number]
      twinReqPerSecRatioMedian: number
      twinReqPerSecRatioCi95: [number, number]
      trioCpuUsPerReqAddedMedian: number | null
      trioCpuUsPerReqAddedCi95: [number, number] | null
      twinCpuUsPerReqAddedMedian: number | null
      twinCpuUsPerReqAddedCi95: [number, number] | null
      withinNoise: boolean
    }
  }
  const cpu = (x: number | null): string => (x === null ? '–' : x.toFixed(1))
  console.log(`\nHTTP /v1/route, ${HTTP_TOKENS}-token JSON prompts, ${HTTP_WORKERS} workers, ${HTTP_CONNECTIONS} connections, ${HTTP_SECS} s per run`)
  console.log('round | baseline req/s | baseline p99 ms | baseline cpu µs/req | /v1/route req/s | /v1/route p99 ms | /v1/route cpu µs/req | ratio')
  h.rounds.forEach((r, i) =>
    console.log(
      `${String(i + 1).padStart(5)} | ${r.baseline.reqPerSec.toFixed(0).padStart(14)} | ${r.baseline.p99Ms.toFixed(2).padStart(15)} | ` +
        `${cpu(r.baseline.cpuUsPerReq).padStart(19)} | ${r.route.reqPerSec.toFixed(0).padStart(15)} | ${r.route.p99Ms.toFixed(2).padStart(16)} | ` +
        `${cpu(r.route.cpuUsPerReq).padStart(20)} | ${(r.route.reqPerSec / r.baseline.reqPerSec).toFixed(3)}`,
    ),
  )
  console.log(
    `median ratio ${h.ratioMedian.toFixed(3)} (req/s); median CPU-per-request ratio ` +
      `${h.cpuRatioMedian === null ? '–' : h.cpuRatioMedian.toFixed(3)} (baseline / route)`,
  )
  console.log('\n/v1/route, request lines logged at info (the default) vs logging off, same rounds')
  console.log('round | info req/s | info p99 ms | info cpu µs/req | off req/s | off p99 ms | off cpu µs/req | req/s info/off')
  h.rounds.forEach((r, i) =>
    console.log(
      `${String(i + 1).padStart(5)} | ${r.route.reqPerSec.toFixed(0).padStart(10)} | ${r.route.p99Ms.toFixed(2).padStart(11)} | ` +
        `${cpu(r.route.cpuUsPerReq).padStart(15)} | ${r.silent.reqPerSec.toFixed(0).padStart(9)} | ${r.silent.p99Ms.toFixed(2).padStart(10)} | ` +
        `${cpu(r.silent.cpuUsPerReq).padStart(14)} | ${(r.route.reqPerSec / r.silent.reqPerSec).toFixed(3)}`,
    ),
  )
  const lg = h.logging
  console.log(
    `median req/s ratio info/off ${lg.reqPerSecRatioMedian.toFixed(3)}; CPU a request's line adds, median ` +
      `${lg.cpuUsPerReqAddedMedian === null ? '–' : lg.cpuUsPerReqAddedMedian.toFixed(1)} µs; ${lg.lines} lines for ${lg.requests} requests counted`,
  )
  console.log(
    `/v1/route ratio (req/s against the baseline), median of the rounds: logging at info ${h.ratioMedian.toFixed(3)}, logging off ` +
      `${h.ratioMedianLoggingOff.toFixed(3)}`,
  )
  const ci = (x: [number, number] | null, d: number): string => (x === null ? '–' : `${x[0].toFixed(d)} to ${x[1].toFixed(d)}`)
  console.log(`\n/v1/route logging trios: ${lg.trios.length} × (info, off, off twin), ${lg.trioSeconds} s each, the order rotated`)
  console.log('trio | info req/s | off req/s | twin req/s | info/off | twin/off | info cpu µs/req | off cpu µs/req | twin cpu µs/req')
  lg.trios.forEach((x, i) =>
    console.log(
      `${String(i + 1).padStart(4)} | ${x.info.reqPerSec.toFixed(0).padStart(10)} | ${x.off.reqPerSec.toFixed(0).padStart(9)} | ` +
        `${x.off2.reqPerSec.toFixed(0).padStart(10)} | ${(x.info.reqPerSec / x.off.reqPerSec).toFixed(3).padStart(8)} | ` +
        `${(x.off2.reqPerSec / x.off.reqPerSec).toFixed(3).padStart(8)} | ${cpu(x.info.cpuUsPerReq).padStart(15)} | ` +
        `${cpu(x.off.cpuUsPerReq).padStart(14)} | ${cpu(x.off2.cpuUsPerReq).padStart(15)}`,
    ),
  )
  console.log(
    `median req/s info/off ${lg.trioReqPerSecRatioMedian.toFixed(3)} (95% bootstrap ${ci(lg.trioReqPerSecRatioCi95, 3)}); A/A twin/off ` +
      `${lg.twinReqPerSecRatioMedian.toFixed(3)} (${ci(lg.twinReqPerSecRatioCi95, 3)})`,
  )
  console.log(
    `CPU per request added, median: info − off ${cpu(lg.trioCpuUsPerReqAddedMedian)} µs (${ci(lg.trioCpuUsPerReqAddedCi95, 1)}); A/A twin − off ` +
      `${cpu(lg.twinCpuUsPerReqAddedMedian)} µs (${ci(lg.twinCpuUsPerReqAddedCi95, 1)})`,
  )
  console.log(
    `request logging at info ${lg.withinNoise ? 'is within the noise' : 'is NOT within the noise'}: the info/off interval ` +
      `${lg.withinNoise ? 'holds' : 'does not hold'} 1`,
  )
  printProxy(proxy)
  console.log(`written to ${join(dir, 'route.json')}`)
}

await main()
