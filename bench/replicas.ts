// Replica benchmark (npm run bench:replicas): bench:e2e's slice of the Mooncake conversation
// trace, at its load and time compression, replayed through HAProxy (deploy/haproxy/haproxy.cfg,
// rendered for loopback) to kv-router replicas in three setups, one after another in one run:
// one replica; two replicas that do not share their bookings; two with --router-replica-sync.
// Every setup gets a fresh nats-server, etcd, `kv-router mocker` fleet (cold caches) and
// replicas; the engines register in etcd and publish their KV events on NATS, so every replica
// holds the whole index and the setups differ only in how many routers decide and what they know
// of each other's requests in flight.
//
// `--setups shared-index` runs another comparison: the engines publish on their own ZMQ streams
// (no NATS events, no etcd), and 2 then 4 synced replicas either each subscribe to every engine
// (local indexes) or all ask one `kv-router indexer` (--indexer-url), which alone subscribes. One
// more replica, outside the balancer and without replica sync, takes the KV events a replica
// takes and routes nothing: its CPU over the replay is what a replica spends on KV events, over
// an idle router's baseline.
//
// The question: do synced replicas route as well as one router? Two unsynced replicas each see
// half the load, so each sends requests to workers that only look idle to it; synced ones book
// each other's requests as their own, one sync delay (about a millisecond) late, and two that
// decide within that delay can take the same worker (kvrouter_replica_races_total counts it).
//
// Times, capacity and the latency figures are bench:e2e's (see there): latencies in simulated
// ms (wall × --speedup), K KV blocks per engine so that the fleet holds everything the slice
// stores. The routers run kv mode at its defaults (the latency cost).
//
// Run: npm run bench:replicas [-- --minutes M | --full] [--workers N] [--speedup S] [--load X]
//      [--capacity-factor F] [--max-in-flight N] [--trace FILE] [--router-args "FLAGS"]
//      [--setups sync|shared-index]
// Results: bench/results/replicas.json and a printed table.
import { readFileSync, writeFileSync } from 'node:fs'
import { availableParallelism, cpus } from 'node:os'
import { join, relative } from 'node:path'
import { readTrace } from '../src/sim/replay/trace.js'
import type { TraceRequest } from '../src/sim/replay/trace.js'
import { cacheBound } from '../src/sim/replay/bound.js'
import { startReplay } from '../src/sim/replay/client.js'
import type { ReplayResult } from '../src/sim/replay/client.js'
import { summarize } from '../src/sim/replay/summary.js'
import type { ReplaySummary } from '../src/sim/replay/summary.js'
import { startEtcd, startHaproxy, startNats } from '../src/deploy/services.js'
import type { EtcdServer, HaproxyServer, NatsServer } from '../src/deploy/services.js'
import { bucketQuantile, histogramBuckets } from './lib/indexer.js'
import { processTicks, repoRoot, resultsDir, textTable, TICKS_PER_S } from './lib/common.js'
import { cpuSample, cpuShares, start, startZmqFleet, stop, workerIds } from './lib/processes.js'
import type { Child } from './lib/processes.js'
import { ArgError, counterSum, parseReplicasArgs, replicaBars, setupsOf, sharedIndexBars } from './lib/replicas.js'
import type { ReplicasArgs, Setup, SetupFigures } from './lib/replicas.js'

const BLOCK_SIZE = 64
const MODEL = 'replicas-model'
// kv mode's defaults, as a user runs it
const ROUTER_COST = ['--router-mode', 'kv']
/** Share of the machine other processes may use during a setup before the run is flagged. */
const OTHER_CPU_WARN = 0.1
/** How long the observer's idle baseline is measured, before the replay. */
const IDLE_WINDOW_MS = 15_000

interface SetupRun {
  summary: ReplaySummary
  result: ReplayResult
  wallS: number
  /** Sum of kvrouter_replica_races_total over the replicas; null without replica sync. */
  races: number | null
  /** Completions each replica answered (dynamo_frontend_requests_total), in replica order. */
  perReplica: number[]
  cpu: { own: number; other: number } | null
  /** CPU seconds of the observer replica over the replay; null without one. */
  observerCpuS: number | null
  /** The observer's CPU seconds above its idle baseline (measured before the replay): its KV events. */
  observerEventCpuS: number | null
  /** Resident memory of each serving replica at the end, MB. */
  rssMb: (number | null)[]
  /** Bytes of engine KV event streams each serving replica received over ZMQ (null: none). */
  eventBytes: (number | null)[]
  /** Event messages each serving replica's shards took. */
  eventMessages: (number | null)[]
  indexer: { rssMb: number | null; cpuS: number | null; eventBytes: number | null; answerP50Ms: number | null; answerP99Ms: number | null } | null
  /** The serving replicas' remote index queries by result (kvrouter_indexer_queries_total); null without a shared indexer. */
  remoteQueries: Record<string, number> | null
}

async function until(what: string, ok: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await ok().catch(() => false)) return
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs / 1000} s`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

async function metrics(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`)).text()
}

function vmRssMb(pid: number | undefined): number | null {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
    return m === null ? null : Number(m[1]) / 1024
  } catch {
    return null
  }
}

async function runSetup(setup: Setup, a: ReplicasArgs, requests: TraceRequest[], k: number): Promise<SetupRun> {
  let nats: NatsServer | null = null
  let etcd: EtcdServer | null = null
  let lb: HaproxyServer | null = null
  let mocker: Child | null = null
  let indexer: Child | null = null
  const routers: Child[] = []
  try {
    nats = await startNats({ jetstream: false })
    const routerArgs = (): string[] => [
      'serve',
      '--http-host',
      '127.0.0.1',
      '--http-port',
      '0',
      ...ROUTER_COST,
      '--router-block-size',
      String(BLOCK_SIZE),
      '--router-event-threads',
      '1',
      '--model-name',
      MODEL,
      '--shutdown-timeout-secs',
      '5',
      '--nats-url',
      (nats as NatsServer).url,
    ]
    // with engines on ZMQ, one more replica outside the balancer: it takes the KV events a replica
    // takes (and no peer's bookings) and routes nothing, so its CPU is what a replica spends on
    // KV events, over the baseline of an idle router (health probes, timers) that both setups share
    const withObserver = setup.index !== 'nats'
    if (setup.index === 'nats') {
      etcd = await startEtcd()
      for (let i = 0; i < setup.replicas; i++) {
        const args = [...routerArgs(), '--etcd-url', etcd.url, ...(setup.sync ? ['--router-replica-sync'] : []), ...a.routerArgs]
        routers.push(await start(args, /listening on (http:\/\/\S+)/))
      }
      mocker = await start(
        [
          'mocker',
          '--num-workers',
          String(a.workers),
          '--block-size',
          String(BLOCK_SIZE),
          '--num-gpu-blocks-override',
          String(k),
          '--speedup-ratio',
          String(a.speedup),
        ].concat(['--model-name', MODEL, '--nats-url', nats.url, '--etcd-url', etcd.url]),
        /kv-router mocker: ready (\d+) engine\(s\)/,
      )
    } else {
      const fleet = await startZmqFleet(a.workers, [
        '--block-size',
        String(BLOCK_SIZE),
        '--num-gpu-blocks-override',
        String(k),
        '--speedup-ratio',
        String(a.speedup),
        '--model-name',
        MODEL,
      ])
      const specs = fleet.engines.map((u, i) => `${i + 1}=${u},kv-events=${fleet.endpoint(i)},replay=${fleet.replay(i)}`)
      mocker = fleet.mocker
      const shared: string[] = []
      if (setup.index === 'shared') {
        indexer = await start(['indexer', '--host', '127.0.0.1', '--port', '0', '--threads', '1'], /kv-router indexer: ready (http:\/\/\S+)/)
        shared.push('--indexer-url', indexer.match[1] as string)
      }
      for (let i = 0; i < setup.replicas + 1; i++) {
        const args = [...routerArgs(), ...specs.flatMap((w) => ['--worker', w]), ...shared]
        // the observer (the last) without replica sync: the peers' bookings are not KV events
        const observer = i === setup.replicas
        args.push(...(setup.sync && !observer ? ['--router-replica-sync'] : []), ...a.routerArgs)
        routers.push(await start(args, /listening on (http:\/\/\S+)/))
      }
    }
    const urls = routers.map((r) => r.match[1] as string)
    for (const url of urls) await until(`${url} lists the ${a.workers} engines`, async () => (await workerIds(url)).ids.length === a.workers, 30_000)
    const { ids } = await workerIds(urls[0] as string)
    const served = withObserver ? urls.slice(0, setup.replicas) : urls
    const names = served.map((_, i) => `router-${i + 1}`)
    const balancer = await startHaproxy({ backends: served.map((u, i) => ({ name: names[i] as string, port: Number(new URL(u).port) })) })
    lb = balancer
    await until(
      'every replica UP in HAProxy',
      async () => [...(await balancer.serverStatus()).values()].filter((s) => s === 'UP').length === setup.replicas,
      30_000,
    )

    const observer = withObserver ? routers[routers.length - 1] : undefined
    const pids = [...routers.map((r) => r.p.pid), mocker.p.pid, balancer.pid, nats.pid, etcd?.pid, indexer?.p.pid].filter((p) => p !== undefined)
    // the observer's idle baseline (probes, timers, heartbeats), measured before any traffic
    let idleRate: number | null = null
    if (observer !== undefined) {
      const i0 = processTicks(observer.p.pid)
      const w0 = performance.now()
      await new Promise((r) => setTimeout(r, IDLE_WINDOW_MS))
      const i1 = processTicks(observer.p.pid)
      if (i0 !== null && i1 !== null) idleRate = (i1 - i0) / TICKS_PER_S / ((performance.now() - w0) / 1000)
    }
    const obs0 = observer === undefined ? null : processTicks(observer.p.pid)
    const idx0 = indexer === null ? null : processTicks(indexer.p.pid)
    const idxHist0 = indexer === null ? null : histogramBuckets(await metrics(indexer.match[1] as string), 'kvrouter_indexer_answer_seconds')
    const t0 = performance.now()
    const cpu0 = cpuSample(pids)
    const run = startReplay({ url: balancer.url, requests, speedup: a.load * a.speedup, maxInFlight: a.maxInFlight, model: MODEL, timeoutMs: 600_000 })
    const tty = process.stderr.isTTY === true
    const ticker = setInterval(
      () => {
        const p = run.progress()
        const line =
          `  ${setup.label}: ${Math.floor((p.done / Math.max(1, p.total)) * 100)}%  sent ${p.sent}/${p.total}  in flight ${p.inFlight}  ` +
          `failed ${p.failed}  ${p.elapsedS.toFixed(0)}/${p.scheduleS.toFixed(0)} s`
        process.stderr.write(tty ? `\r${line}\u001b[K` : `${line}\n`)
      },
      tty ? 500 : 15_000,
    )
    let result: ReplayResult
    try {
      result = await run.done
    } finally {
      clearInterval(ticker)
      if (tty) process.stderr.write('\r\u001b[K')
    }
    const wallS = (performance.now() - t0) / 1000
    const cpu = cpuShares(cpu0, cpuSample(pids))
    const obs1 = observer === undefined ? null : processTicks(observer.p.pid)
    const observerCpuS = obs0 === null || obs1 === null ? null : (obs1 - obs0) / TICKS_PER_S
    // what the KV events cost it: its CPU over the replay less its idle rate over as long
    const observerEventCpuS = observerCpuS === null || idleRate === null ? null : Math.max(0, observerCpuS - idleRate * wallS)
    const idx1 = indexer === null ? null : processTicks(indexer.p.pid)
    const texts = await Promise.all(urls.map(metrics))
    const servedTexts = texts.slice(0, setup.replicas)
    const races = setup.sync ? servedTexts.reduce((s, m) => s + (counterSum(m, 'kvrouter_replica_races_total') ?? 0), 0) : null
    const perReplica = servedTexts.map((m) => counterSum(m, 'dynamo_frontend_requests_total') ?? 0)
    const rssMb = routers.slice(0, setup.replicas).map((r) => vmRssMb(r.p.pid))
    const remoteQueries =
      setup.index === 'shared'
        ? Object.fromEntries(
            ['ok', 'timeout', 'error', 'unavailable'].map((k) => [
              k,
              servedTexts.reduce((t, m) => t + (counterSum(m, 'kvrouter_indexer_queries_total', `result="${k}"`) ?? 0), 0),
            ]),
          )
        : null
    // event traffic into each replica: ZMQ bytes (engines' streams), or event messages its shards took (NATS)
    const eventBytes = servedTexts.map((m) => counterSum(m, 'kvrouter_zmq_total', 'what="bytes"'))
    const eventMessages = servedTexts.map((m) => counterSum(m, 'kvrouter_shard_events_received_total'))
    const idxText = indexer === null ? '' : await metrics(indexer.match[1] as string)
    const idxHist1 = histogramBuckets(idxText, 'kvrouter_indexer_answer_seconds')
    const answerQ = (q: number): number | null => {
      const v = idxHist0 === null ? null : bucketQuantile(idxHist0, idxHist1, q)
      return v === null ? null : v * 1000
    }
    const indexerFigures =
      indexer === null
        ? null
        : {
            answerP50Ms: answerQ(0.5),
            answerP99Ms: answerQ(0.99),
            rssMb: vmRssMb(indexer.p.pid),
            cpuS: idx0 === null || idx1 === null ? null : (idx1 - idx0) / TICKS_PER_S,
            eventBytes: counterSum(idxText, 'kvrouter_zmq_total', 'what="bytes"'),
          }
    const summary = summarize(result.records, { gaps: result.itlGaps, timeScale: a.speedup, workers: ids })
    return {
      summary,
      result,
      wallS,
      races,
      perReplica,
      cpu,
      observerCpuS,
      rssMb,
      eventBytes,
      eventMessages,
      indexer: indexerFigures,
      remoteQueries,
      observerEventCpuS,
    }
  } finally {
    // the balancer first, so nothing new reaches a replica; the engines revoke their leases while etcd is up
    await lb?.stop()
    await Promise.all(routers.map(stop))
    if (mocker !== null) await stop(mocker)
    if (indexer !== null) await stop(indexer)
    await etcd?.stop()
    await nats?.stop()
  }
}

function pct(v: number | null): string {
  return v === null ? 'n/a' : `${(v * 100).toFixed(1)}%`
}
function ms(v: number | null): string {
  return v === null ? 'n/a' : v >= 100 ? v.toFixed(0) : v.toFixed(1)
}

async function main(): Promise<void> {
  let a: ReplicasArgs
  try {
    a = parseReplicasArgs(process.argv.slice(2))
  } catch (err) {
    if (!(err instanceof ArgError)) throw err
    process.stderr.write(`bench:replicas: ${err.message}\n`)
    process.exit(2)
  }
  const tracePath = a.trace ?? join(repoRoot(), 'data', 'conversation_trace.jsonl')
  const all = readTrace(tracePath)
  const requests = a.minutes === null ? all : all.filter((r) => r.timestamp < (a.minutes as number) * 60_000)
  if (requests.length === 0) {
    process.stderr.write('bench:replicas: the slice holds no request\n')
    process.exit(2)
  }
  const bound = cacheBound(requests, BLOCK_SIZE)
  const k = Math.ceil((bound.uniqueBlocks / a.workers) * a.capacityFactor)
  const spanS = ((requests[requests.length - 1] as TraceRequest).timestamp - (requests[0] as TraceRequest).timestamp) / 1000
  const replaySpeedup = a.load * a.speedup
  const command = `npm run bench:replicas${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`
  const sliceName = a.minutes === null ? 'the whole trace' : `the first ${a.minutes} min`
  console.log(
    `bench:replicas — ${sliceName} of ${relative(process.cwd(), tracePath)}: ` +
      `${requests.length} requests over ${(spanS / 60).toFixed(1)} min, through HAProxy`,
  )
  console.log(
    `  infinite-cache hit-rate bound (block ${BLOCK_SIZE}): ${pct(bound.hitRate)}; K = ${k} KV blocks per engine (× ${a.workers} engines, factor ` +
      `${a.capacityFactor})`,
  )
  console.log(
    `  mocker --speedup-ratio ${a.speedup}, load × ${a.load} → replay at ${replaySpeedup}× the trace: ~${(spanS / replaySpeedup).toFixed(0)} s of ` +
      `sending per setup`,
  )
  console.log(`  routers: ${[...ROUTER_COST, ...a.routerArgs].join(' ')}`)

  const runs = new Map<Setup, SetupRun>()
  for (const setup of setupsOf(a.setups)) {
    const r = await runSetup(setup, a, requests, k)
    runs.set(setup, r)
    const s = r.summary
    const cpuNote = r.cpu === null ? '' : `; CPU: bench ${pct(r.cpu.own)} of the machine, other processes ${pct(r.cpu.other)}`
    const remoteNote =
      r.remoteQueries === null
        ? ''
        : `; indexer queries ${Object.entries(r.remoteQueries)
            .map(([k, v]) => `${k} ${v}`)
            .join(', ')}, its answer time p50 ≤ ${r.indexer?.answerP50Ms ?? 'n/a'} ms, p99 ≤ ${r.indexer?.answerP99Ms ?? 'n/a'} ms`
    console.log(
      `  ${setup.label}: ${s.ok}/${s.requests} ok in ${r.wallS.toFixed(0)} s wall; TTFT p50/p90/p99 ${ms(s.ttft_ms.p50)}/${ms(s.ttft_ms.p90)}/` +
        `${ms(s.ttft_ms.p99)} ms, hit rate ${pct(s.hit_rate)}, spread ${s.spread?.toFixed(2) ?? '∞'}, races ${r.races ?? 'n/a'}${cpuNote}${remoteNote}`,
    )
    if (r.cpu !== null && r.cpu.other > OTHER_CPU_WARN)
      console.log(
        `  WARNING: other processes used ${pct(r.cpu.other)} of the machine during ${setup.label}: its latencies are inflated; rerun on a quiet machine`,
      )
  }
  const figures: Record<string, SetupFigures> = {}
  for (const [setup, r] of runs)
    figures[setup.key] = {
      hitRate: r.summary.hit_rate,
      ttftP90: r.summary.ttft_ms.p90,
      errors: r.summary.errors,
      observerCpuS: r.observerCpuS,
      observerEventCpuS: r.observerEventCpuS,
    }
  const bars = setupsOf(a.setups).some((x) => x.index !== 'nats') ? sharedIndexBars(figures) : replicaBars(figures)

  const rows = [...runs].map(([setup, r]) => {
    const s = r.summary
    return [
      setup.label,
      String(s.requests),
      String(s.errors),
      pct(s.hit_rate),
      ms(s.ttft_ms.p50),
      ms(s.ttft_ms.p90),
      ms(s.ttft_ms.p99),
      s.spread === null ? '∞' : s.spread.toFixed(2),
      r.races === null ? 'n/a' : String(r.races),
      r.perReplica.join(' / '),
      ms(s.send_lag_ms.p99),
    ]
  })
  console.log(
    `\nper setup (TTFT in SIMULATED ms = wall × ${a.speedup}; spread = max/min requests per engine; races = kvrouter_replica_races_total, all replicas)`,
  )
  console.log(
    textTable(
      ['setup', 'requests', 'errors', 'hit rate', 'TTFT p50', 'TTFT p90', 'TTFT p99', 'spread', 'races', 'per replica', 'send lag p99 (wall ms)'],
      rows,
    ),
  )
  console.log(`infinite-cache bound: ${pct(bound.hitRate)}`)
  if (setupsOf(a.setups).some((x) => x.index !== 'nats')) {
    const mb = (v: number | null): string => (v === null ? 'n/a' : v.toFixed(0))
    const sum = (xs: (number | null)[]): number | null => (xs.some((x) => x === null) ? null : xs.reduce<number>((t, x) => t + (x as number), 0))
    console.log(
      '\nwhat each replica carries (observer: one more replica outside the balancer, without replica sync, routing nothing: its CPU is what a ' +
        'replica spends on KV events, over an idle router’s baseline)',
    )
    console.log(
      textTable(
        [
          'setup',
          'observer CPU s',
          'of it on KV events',
          'replica RSS MB',
          'KV event MB into replicas',
          'event msgs into replicas',
          'indexer CPU s',
          'indexer RSS MB',
          'KV event MB into indexer',
        ],
        [...runs].map(([setup, r]) => {
          const bytes = sum(r.eventBytes)
          return [
            setup.label,
            r.observerCpuS === null ? 'n/a' : r.observerCpuS.toFixed(2),
            r.observerEventCpuS === null ? 'n/a' : r.observerEventCpuS.toFixed(2),
            r.rssMb.map(mb).join(' / '),
            bytes === null ? '0' : (bytes / 1e6).toFixed(1),
            String(sum(r.eventMessages) ?? 0),
            r.indexer?.cpuS?.toFixed(2) ?? 'n/a',
            mb(r.indexer?.rssMb ?? null),
            r.indexer?.eventBytes === null || r.indexer === null ? 'n/a' : ((r.indexer.eventBytes as number) / 1e6).toFixed(1),
          ]
        }),
      ),
    )
  }
  console.log('\ntargets')
  console.log(
    textTable(
      ['check', 'value', 'target', 'result'],
      bars.map((b) => [b.bar, b.value, b.target, b.pass === null ? 'n/a' : b.pass ? 'PASS' : 'FAIL']),
    ),
  )

  const setups = Object.fromEntries(
    [...runs].map(([setup, r]) => {
      const s = r.summary
      return [
        setup.key,
        {
          label: setup.label,
          replicas: setup.replicas,
          replica_sync: setup.sync,
          requests: s.requests,
          errors: s.errors,
          error_kinds: s.error_kinds,
          hit_rate: s.hit_rate,
          ttft_ms: { p50: s.ttft_ms.p50, p90: s.ttft_ms.p90, p99: s.ttft_ms.p99, mean: s.ttft_ms.mean },
          tpot_ms: { p50: s.tpot_ms.p50, p99: s.tpot_ms.p99 },
          spread: s.spread,
          workers: s.workers,
          // null: no replica sync, nothing counts them
          races: r.races,
          requests_per_replica: r.perReplica,
          prompt_tokens: s.prompt_tokens,
          cached_tokens: s.cached_tokens,
          send_lag_wall_ms: { p50: s.send_lag_ms.p50, p99: s.send_lag_ms.p99, max: s.send_lag_ms.max },
          wall_s: r.wallS,
          cpu_share: r.cpu === null ? null : { bench_processes: r.cpu.own, other_processes: r.cpu.other },
          index: setup.index,
          observer_cpu_s: r.observerCpuS,
          observer_event_cpu_s: r.observerEventCpuS,
          replica_rss_mb: r.rssMb,
          replica_event_bytes: r.eventBytes,
          replica_event_messages: r.eventMessages,
          indexer:
            r.indexer === null
              ? null
              : {
                  rss_mb: r.indexer.rssMb,
                  cpu_s: r.indexer.cpuS,
                  event_bytes: r.indexer.eventBytes,
                  answer_ms_bucket_bounds: { p50: r.indexer.answerP50Ms, p99: r.indexer.answerP99Ms },
                },
          remote_index_queries: r.remoteQueries,
        },
      ]
    }),
  )
  const out = {
    benchmark: 'replicas',
    date: new Date().toISOString(),
    node: process.version,
    cpus: availableParallelism(),
    cpuModel: cpus()[0]?.model ?? 'unknown',
    hit_rate_bound: bound.hitRate,
    config: {
      workers: a.workers,
      K: k,
      capacity_factor: a.capacityFactor,
      block_size: BLOCK_SIZE,
      speedup: a.speedup,
      load: a.load,
      replay_speedup: replaySpeedup,
      minutes: a.minutes,
      requests: requests.length,
      max_in_flight: a.maxInFlight,
      trace: relative(repoRoot(), tracePath),
      command,
      router_args: [...ROUTER_COST, ...a.routerArgs],
      time_unit: `simulated ms (wall ms × ${a.speedup})`,
    },
    setups,
    bars,
  }
  const file = join(resultsDir(), 'replicas.json')
  writeFileSync(file, JSON.stringify(out, null, 2) + '\n')
  console.log(`\nwritten to ${file}`)
}

await main()
