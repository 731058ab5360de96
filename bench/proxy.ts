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
// the difference is the hop itself: parsing, routing, booking, proxying every chunk. Direct and
// routed phases alternate, two rounds each. ROUTER_NODE_FLAGS="…" passes node flags to the router
// child (diagnosis: --trace-gc, --cpu-prof, --import of a probe).
import type { ChildProcess } from 'node:child_process'
import { Agent, request } from 'undici'
import { child, median, processTicks, TICKS_PER_S } from './common.js'

export interface PhaseResult {
  path: 'direct' | 'router'
  requests: number
  errors: number
  /** Streams open at once, averaged over the phase. */
  meanOpen: number
  ttftMs: { p50: number; p99: number }
  totalMs: { p50: number; p99: number }
  /** The router process's CPU time (all its threads, from /proc) per request of the phase; null for direct phases or off Linux. */
  routerCpuUsPerRequest: number | null
}

export interface ProxyResult {
  streamsTarget: number
  ratePerSec: number
  seconds: number
  engines: number
  promptTokens: number
  maxTokens: number
  ttftMs: number
  itlMs: number
  rounds: { direct: PhaseResult; router: PhaseResult; p99TtftOverheadMs: number; p99TotalOverheadMs: number }[]
  p99TtftOverheadMsMedian: number
  p99TotalOverheadMsMedian: number
  routerCpuUsPerRequestMedian: number | null
}

function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number
}



const TTFT_MS = 50
const ITL_MS = 50

/** Child process: `count` fixed-timing OpenAI-style SSE servers; prints their URLs. */
async function upstreams(count: number): Promise<void> {
  const { createServer } = await import('node:http')
  const urls: string[] = []
  for (let i = 0; i < count; i++) {
    const server = createServer((req, res) => {
      req.resume()
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
        let sent = 0
        const tick = (): void => {
          if (res.destroyed) return
          if (sent === MAX_TOKENS) {
            res.end('data: {"id":"u","object":"text_completion","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":16,"total_tokens":80,"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n')
            return
          }
          sent++
          res.write(`data: {"id":"u","object":"text_completion","choices":[{"index":0,"text":"t${sent}","finish_reason":${sent === MAX_TOKENS ? '"length"' : 'null'}}]}\n\n`)
          setTimeout(tick, ITL_MS)
        }
        setTimeout(tick, TTFT_MS)
      })
    })
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
    urls.push(`http://127.0.0.1:${(server.address() as { port: number }).port}`)
  }
  process.stdout.write(`upstreams ready ${urls.join(' ')}\n`)
  process.on('SIGTERM', () => process.exit(0))
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

const PROMPT_TOKENS = 64
const MAX_TOKENS = 16

async function phase(path: 'direct' | 'router', urls: string[], rate: number, seconds: number, agent: Agent, routerPid?: number): Promise<PhaseResult> {
  const ticks0 = path === 'router' ? processTicks(routerPid) : null
  const ttft: number[] = []
  const total: number[] = []
  let errors = 0
  let open = 0
  let openArea = 0
  let lastChange = performance.now()
  const track = (d: number): void => {
    const now = performance.now()
    openArea += open * (now - lastChange)
    lastChange = now
    open += d
  }
  const inflight: Promise<void>[] = []
  const one = async (url: string, body: string): Promise<void> => {
    const t0 = performance.now()
    track(1)
    try {
      const res = await request(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, dispatcher: agent })
      let first = -1
      for await (const chunk of res.body) {
        if (first < 0 && (chunk as Buffer).length > 0) first = performance.now()
      }
      if (res.statusCode !== 200 || first < 0) errors++
      else {
        ttft.push(first - t0)
        total.push(performance.now() - t0)
      }
    } catch {
      errors++
    } finally {
      track(-1)
    }
  }
  const start = performance.now()
  const end = start + seconds * 1000
  const interval = 1000 / rate
  let k = 0
  for (;;) {
    const due = start + k * interval
    if (due >= end) break
    const wait = due - performance.now()
    if (wait > 1) await new Promise((r) => setTimeout(r, wait - 0.5))
    else if (wait > 0) await new Promise((r) => setImmediate(r))
    if (performance.now() < due) continue
    inflight.push(one(urls[k % urls.length] as string, uniquePrompt(PROMPT_TOKENS)))
    k++
  }
  const sendEnd = performance.now()
  const openDuringSends = openArea + open * (sendEnd - lastChange)
  await Promise.all(inflight)
  const ticks1 = ticks0 === null ? null : processTicks(routerPid)
  ttft.sort((a, b) => a - b)
  total.sort((a, b) => a - b)
  return {
    path,
    requests: k,
    errors,
    meanOpen: openDuringSends / (sendEnd - start),
    ttftMs: { p50: quantile(ttft, 0.5), p99: quantile(ttft, 0.99) },
    totalMs: { p50: quantile(total, 0.5), p99: quantile(total, 0.99) },
    routerCpuUsPerRequest: ticks0 === null || ticks1 === null ? null : (((ticks1 - ticks0) / TICKS_PER_S) * 1e6) / k,
  }
}

export async function benchProxy(cli: string, opts: { streams?: number; seconds?: number; engines?: number } = {}): Promise<ProxyResult> {
  const streams = opts.streams ?? 200
  const seconds = opts.seconds ?? 10
  const engines = opts.engines ?? 4
  const self = new URL(import.meta.url).pathname
  const up = await child([self, '--upstreams', String(engines)], /upstreams ready ([^\n]+)\n/)
  const direct = (up.m[1] as string).trim().split(/\s+/)
  const workerArgs = direct.flatMap((u, i) => ['--worker', `${i + 1}=${u}`])
  let router: ChildProcess | undefined
  const agent = new Agent({ connections: streams + 56, pipelining: 1, keepAliveTimeout: 30_000 })
  try {
    const started = await child(
      [...(process.env.ROUTER_NODE_FLAGS ?? '').split(' ').filter((x) => x !== ''), cli, 'serve', '--http-host', '127.0.0.1', '--http-port', '0', '--router-block-size', '64', '--router-queue-threshold', 'none', '--router-mode', 'round-robin', ...workerArgs],
      /listening on (http:\/\/\S+)/,
    )
    router = started.p
    const base = started.m[1] as string
    // calibrate the stream length, then the rate that keeps `streams` open
    const probe = await phase('direct', direct, 20, 3, agent)
    const rate = Math.max(1, Math.round(streams / (probe.totalMs.p50 / 1000)))
    await phase('router', [base], rate, 3, agent)
    const rounds: ProxyResult['rounds'] = []
    for (let i = 0; i < 2; i++) {
      const d = await phase('direct', direct, rate, seconds, agent)
      const r = await phase('router', [base], rate, seconds, agent, router.pid)
      rounds.push({ direct: d, router: r, p99TtftOverheadMs: r.ttftMs.p99 - d.ttftMs.p99, p99TotalOverheadMs: r.totalMs.p99 - d.totalMs.p99 })
    }
    return {
      streamsTarget: streams,
      ratePerSec: rate,
      seconds,
      engines,
      promptTokens: PROMPT_TOKENS,
      maxTokens: MAX_TOKENS,
      ttftMs: TTFT_MS,
      itlMs: ITL_MS,
      rounds,
      p99TtftOverheadMsMedian: median(rounds.map((x) => x.p99TtftOverheadMs)),
      p99TotalOverheadMsMedian: median(rounds.map((x) => x.p99TotalOverheadMs)),
      routerCpuUsPerRequestMedian: rounds.every((x) => x.router.routerCpuUsPerRequest !== null) ? median(rounds.map((x) => x.router.routerCpuUsPerRequest as number)) : null,
    }
  } finally {
    await agent.close()
    router?.kill('SIGTERM')
    up.p.kill('SIGTERM')
  }
}

export function printProxy(p: ProxyResult): void {
  console.log(`\nproxy: ${p.engines} fixed-timing upstreams (first token ${p.ttftMs} ms, then every ${p.itlMs} ms, ${p.maxTokens} tokens), ${p.promptTokens}-token prompts, open-loop at ${p.ratePerSec}/s for ~${p.streamsTarget} concurrent streams, ${p.seconds} s per phase, router in round-robin mode`)
  console.log('round | path   | requests | errors | mean open | TTFT p50 ms | TTFT p99 ms | total p50 ms | total p99 ms | router CPU µs/req')
  p.rounds.forEach((r, i) => {
    for (const x of [r.direct, r.router]) {
      console.log(`${String(i + 1).padStart(5)} | ${x.path.padEnd(6)} | ${String(x.requests).padStart(8)} | ${String(x.errors).padStart(6)} | ${x.meanOpen.toFixed(0).padStart(9)} | ${x.ttftMs.p50.toFixed(2).padStart(11)} | ${x.ttftMs.p99.toFixed(2).padStart(11)} | ${x.totalMs.p50.toFixed(2).padStart(12)} | ${x.totalMs.p99.toFixed(2).padStart(12)} | ${(x.routerCpuUsPerRequest === null ? '–' : x.routerCpuUsPerRequest.toFixed(0)).padStart(17)}`)
    }
    console.log(`      | p99 overhead: TTFT ${r.p99TtftOverheadMs.toFixed(2)} ms, total ${r.p99TotalOverheadMs.toFixed(2)} ms`)
  })
}

if (process.argv[2] === '--upstreams') {
  await upstreams(Number(process.argv[3] ?? 4))
} else if (process.argv[1]?.endsWith('proxy.js') === true) {
  const cli = new URL('../src/cli.js', import.meta.url).pathname
  const r = await benchProxy(cli, { seconds: Number(process.env.BENCH_PROXY_SECS ?? 10) })
  printProxy(r)
}
