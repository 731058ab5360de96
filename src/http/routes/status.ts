// The live status page: GET /status serves one self-contained HTML file (src/http/status/page.html,
// inline CSS and JS), `/` redirects there, and the page reads GET /v1/status/stream (server-sent
// events, one snapshot per interval) or polls GET /v1/status. A snapshot is the workers as GET
// /v1/workers lists them, cumulative counters read from the metrics registry (the page derives the
// rates from two snapshots), the queue, and the routing decisions after the reader's last one.
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { hostname } from 'node:os'
import { PassThrough } from 'node:stream'
import type { FastifyInstance } from 'fastify'
import type { Registry } from 'prom-client'
import { serializeJson } from '../../codec/json.js'
import type { DecisionEntry } from '../../core/decision-log.js'
import { KvrError } from '../../errors.js'
import type { Candidate } from '../../scheduler/selector.js'
import type { HttpContext } from '../context.js'
import { candidateJson } from './route.js'
import type { ListWorkers } from './workers.js'

/** Decisions one snapshot carries at most (the newest). */
const DECISIONS_PER_SNAPSHOT = 32
/** Candidate rows one decision carries at most: the cheapest, and the chosen one. */
const CANDIDATES_PER_DECISION = 16
/** A poll keeps decisions explained this long (the page polls every 2 s). */
const POLL_WATCH_MS = 15_000
/** How often open streams are looked at: a due snapshot, or the drain that ends them. */
const STREAM_TICK_MS = 250
/** A stream whose reader has this much unread is skipped until it catches up. */
const STREAM_MAX_BUFFERED = 1 << 20

const PAGE_FILE = new URL('../status/page.html', import.meta.url)

/** The page, and a Content-Security-Policy that admits only its own inline script and style. */
function loadPage(): { html: string; csp: string } {
  const html = readFileSync(PAGE_FILE, 'utf8')
  const hash = (re: RegExp): string => {
    const m = re.exec(html)
    if (m === null) throw new Error(`${PAGE_FILE.pathname}: no ${re.source}`)
    return `'sha256-${createHash('sha256')
      .update(m[1] as string)
      .digest('base64')}'`
  }
  const script = hash(/<script>([\s\S]*?)<\/script>/)
  const style = hash(/<style>([\s\S]*?)<\/style>/)
  return {
    html,
    csp:
      `default-src 'none'; script-src ${script}; style-src ${style}; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; ` +
      `frame-ancestors 'none'`,
  }
}

export function statusRoutes(fastify: FastifyInstance, ctx: HttpContext, listWorkers: ListWorkers): void {
  const { router, cfg } = ctx
  const page = loadPage()
  const host = hostname()
  const startedAt = Date.now()

  fastify.get('/', async (_req, reply) => reply.redirect('status', 302))
  fastify.get('/status', async (_req, reply) =>
    reply
      .header('content-type', 'text/html; charset=utf-8')
      .header('cache-control', 'no-cache')
      .header('content-security-policy', page.csp)
      .header('x-content-type-options', 'nosniff')
      .header('referrer-policy', 'no-referrer')
      .send(page.html),
  )

  // What every snapshot shares: readers due at the same tick wait for one build.
  let building: Promise<string> | null = null
  const common = (): Promise<string> => {
    if (building === null) {
      const b = commonPart()
      building = b
      const done = (): void => {
        if (building === b) building = null
      }
      b.then(done, done)
    }
    return building
  }
  const commonPart = async (): Promise<string> => {
    const reg = router.metrics.registry
    const stats = router.scheduler.stats()
    const health = router.pool.health()
    const conn = router.connected
    const sync = router.replicas
    const [workers, counters] = await Promise.all([listWorkers(true), readCounters(reg)])
    const body = serializeJson({
      time_ms: Date.now(),
      router: {
        router_id: router.instanceId.toString(),
        host,
        mode: cfg.mode,
        kv_events: cfg.kvEvents,
        block_size: cfg.blockSize,
        model: cfg.modelName,
        uptime_s: Math.round((Date.now() - startedAt) / 1000),
        shards: health.length,
        recovering_shards: health.filter((h) => h !== 'exact').length,
        nats: conn.nats,
        etcd: conn.etcd,
        replica_sync: sync === null ? null : { in_step: sync.inStep, connected: sync.connected, peers: sync.livePeers },
        remote_index: router.parts.remote === null ? null : router.parts.remote.status(),
        closing: ctx.closing(),
      },
      workers: workers.workers,
      unregistered: workers.unregistered.length,
      queue: {
        depth: stats.queueDepth,
        max_pending: stats.queueMaxPending,
        queued_total: stats.queuedTotal,
        queue_full_total: stats.queueFullTotal,
        all_busy_total: stats.allBusyTotal,
        booked: stats.bookedRequests,
        remote_bookings: stats.remoteBookings,
      },
      ...counters,
    })
    return body.slice(0, -1)
  }

  // Decisions as JSON, kept by sequence number while they are in the ring: readers share them.
  const decisionText = new Map<number, string>()
  const decisions = (since: number): { text: string; newest: number } => {
    const log = router.decisions
    const list = log.since(since, DECISIONS_PER_SNAPSHOT)
    let text = ''
    for (const e of list) {
      let s = decisionText.get(e.seq)
      if (s === undefined) decisionText.set(e.seq, (s = decisionJson(e)))
      text += (text === '' ? '' : ',') + s
    }
    for (const seq of decisionText.keys()) if (seq <= log.newest - log.capacity) decisionText.delete(seq)
    return { text, newest: log.newest }
  }
  const snapshot = async (since: number): Promise<string> => {
    const head = await common()
    // after the await: the decisions are the newest, and read out of the ring in one go
    const d = decisions(since)
    return `${head},"decision_seq":${d.newest},"decisions":[${d.text}]}`
  }

  fastify.get('/v1/status', async (req, reply) => {
    const q = req.query as Record<string, unknown>
    const since = intParam(q.since, 'since', 0, Number.MAX_SAFE_INTEGER, 0)
    router.decisions.watch(POLL_WATCH_MS)
    return reply
      .header('content-type', 'application/json')
      .header('cache-control', 'no-store')
      .send(await snapshot(since))
  })

  // Server-sent events: `event: status` with one snapshot per interval, the first at once. The
  // page reads them with fetch (an EventSource cannot send the API key). Streams end when the
  // router drains.
  interface Reader {
    out: PassThrough
    since: number
    intervalMs: number
    due: number
    busy: boolean
    release: () => void
  }
  const readers = new Set<Reader>()
  let timer: NodeJS.Timeout | null = null
  const end = (r: Reader): void => {
    if (!readers.delete(r)) return
    r.release()
    r.out.end()
    if (readers.size === 0 && timer !== null) {
      clearInterval(timer)
      timer = null
    }
  }
  const send = async (r: Reader): Promise<void> => {
    r.busy = true
    try {
      const text = await snapshot(r.since)
      r.since = router.decisions.newest
      if (readers.has(r)) r.out.write(`event: status\ndata: ${text}\n\n`)
    } catch (err) {
      // the router is closing under it, most likely: the reader reconnects
      if (readers.has(r)) r.out.write(`event: error\ndata: ${JSON.stringify({ message: (err as Error).message })}\n\n`)
      end(r)
    } finally {
      r.busy = false
    }
  }
  const tick = (): void => {
    const now = performance.now()
    for (const r of readers) {
      if (ctx.closing()) {
        end(r)
        continue
      }
      if (r.busy || now < r.due || r.out.writableLength > STREAM_MAX_BUFFERED) continue
      r.due = now + r.intervalMs
      void send(r)
    }
  }
  // no HEAD twin: it would open a stream that sends nothing and never ends
  fastify.get('/v1/status/stream', { exposeHeadRoute: false }, async (req, reply) => {
    const q = req.query as Record<string, unknown>
    const intervalMs = intParam(q.interval_ms, 'interval_ms', 250, 60_000, 1000)
    const since = intParam(q.since, 'since', 0, Number.MAX_SAFE_INTEGER, 0)
    const r: Reader = { out: new PassThrough(), since, intervalMs, due: performance.now() + intervalMs, busy: false, release: router.decisions.hold() }
    readers.add(r)
    reply.raw.once('close', () => end(r))
    timer ??= setInterval(tick, STREAM_TICK_MS).unref()
    void send(r)
    return reply.header('content-type', 'text/event-stream; charset=utf-8').header('cache-control', 'no-store').header('x-accel-buffering', 'no').send(r.out)
  })
}

/** An optional integer query parameter in [min, max]. */
function intParam(v: unknown, name: string, min: number, max: number, dflt: number): number {
  if (v === undefined) return dflt
  const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : Number.NaN
  if (!Number.isSafeInteger(n) || n < min || n > max)
    throw new KvrError('KVR_ERR_INVALID_REQUEST', `${name} must be an integer in [${min}, ${max}], got ${JSON.stringify(v)}`)
  return n
}

function decisionJson(e: DecisionEntry): string {
  const id = e.workerId.toString()
  let s =
    `{"seq":${e.seq},"at_ms":${Math.round(performance.timeOrigin + e.at)},"request_id":` +
    `${e.requestId === undefined ? 'null' : JSON.stringify(e.requestId)},"worker_id":${id},"worker_id_str":"${id}","dp_rank":${e.dpRank},` +
    `"overlap_blocks":${e.overlapBlocks},"blocks":${e.blocks},"isl":${e.isl},"booked":${e.booked},"waited_ms":${e.waitedMs}`
  const cs = e.candidates
  if (cs === undefined) return `${s},"candidates":null,"candidates_total":null}`
  // the cheapest first; the chosen one kept even when it is not among them (a temperature draw)
  const rows = [...cs].sort((a, b) => a.logit - b.logit)
  const shown = rows.slice(0, CANDIDATES_PER_DECISION)
  const chosen = rows.find((c) => c.workerId === e.workerId && c.dpRank === e.dpRank)
  if (chosen !== undefined && !shown.includes(chosen)) shown.push(chosen)
  s += `,"candidates":[${shown.map((c: Candidate) => candidateJson(c)).join(',')}],"candidates_total":${cs.length}}`
  return s
}

/** A metric's samples summed, optionally grouped by one label; null when it is not registered. */
async function samples(reg: Registry, name: string, series = name): Promise<{ labels: Partial<Record<string, string | number>>; value: number }[] | null> {
  const m = reg.getSingleMetric(name)
  if (m === undefined) return null
  const got = await m.get()
  return got.values.filter((v) => ((v as { metricName?: string }).metricName ?? name) === series)
}
async function total(
  reg: Registry,
  name: string,
  series = name,
  where?: (labels: Partial<Record<string, string | number>>) => boolean,
): Promise<number | null> {
  const vs = await samples(reg, name, series)
  if (vs === null) return null
  let n = 0
  for (const v of vs) if (where === undefined || where(v.labels)) n += v.value
  return n
}
async function byLabel(
  reg: Registry,
  name: string,
  label: string,
  where?: (labels: Partial<Record<string, string | number>>) => boolean,
): Promise<Record<string, number> | null> {
  const vs = await samples(reg, name)
  if (vs === null) return null
  const out: Record<string, number> = {}
  for (const v of vs) {
    if (where !== undefined && !where(v.labels)) continue
    const k = String(v.labels[label] ?? '')
    out[k] = (out[k] ?? 0) + v.value
  }
  return out
}

/**
 * The counters the page shows, read series by series from the registry Prometheus scrapes, so
 * the page and a dashboard agree. Never the whole registry: the event-loop delay gauges start a
 * new interval at each read, which would take it from the scraper.
 */
async function readCounters(reg: Registry): Promise<Record<string, unknown>> {
  const hit = 'dynamo_component_router_kv_hit_rate'
  const ttft = 'dynamo_component_router_time_to_first_token_seconds'
  const [routed, byStatus, inflight, rejected, retries, upstream, hitSum, hitCount, ttftSum, ttftCount] = await Promise.all([
    total(reg, 'dynamo_component_router_requests_total'),
    byLabel(reg, 'dynamo_frontend_requests_total', 'status'),
    total(reg, 'dynamo_frontend_inflight_requests'),
    total(reg, 'dynamo_frontend_model_rejection_total'),
    total(reg, 'kvrouter_proxy_retries_total'),
    total(reg, 'kvrouter_proxy_upstream_errors_total'),
    total(reg, hit, `${hit}_sum`),
    total(reg, hit, `${hit}_count`),
    total(reg, ttft, `${ttft}_sum`),
    total(reg, ttft, `${ttft}_count`),
  ])
  const [received, applied, byType, rejectedEv, malformed, gaps, lost, dropped, httpReceived, httpRefused, pending, replicaDropped] = await Promise.all([
    total(reg, 'kvrouter_shard_events_received_total'),
    total(reg, 'kvrouter_shard_events_applied_total'),
    byLabel(reg, 'dynamo_component_kv_cache_events_applied', 'event_type', (l) => l.status === 'ok'),
    total(reg, 'kvrouter_shard_events_rejected_total'),
    total(reg, 'kvrouter_shard_events_malformed_total'),
    total(reg, 'kvrouter_shard_event_gaps_total'),
    total(reg, 'kvrouter_shard_events_lost_total'),
    total(reg, 'kvrouter_events_dropped_total'),
    total(reg, 'kvrouter_http_events_received_total'),
    total(reg, 'kvrouter_http_events_refused_total'),
    total(reg, 'kvrouter_shard_pending_messages'),
    total(reg, 'kvrouter_replica_events_dropped_total'),
  ])
  const [recovery, restarts] = await Promise.all([byLabel(reg, 'kvrouter_index_recovery_total', 'what'), total(reg, 'kvrouter_shard_restarts_total')])
  return {
    requests: { routed, by_status: byStatus, inflight, rejected, retries, upstream_errors: upstream },
    hit_rate: { sum: hitSum, count: hitCount },
    ttft_seconds: { sum: ttftSum, count: ttftCount },
    events: {
      received,
      applied,
      applied_by_type: byType,
      rejected: rejectedEv,
      malformed,
      gaps,
      lost,
      dropped,
      http_received: httpReceived,
      http_refused: httpRefused,
      pending_messages: pending,
      replica_dropped: replicaDropped,
    },
    recovery: { ...(recovery ?? {}), shard_restarts: restarts },
  }
}
