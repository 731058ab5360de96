// The worker registry over HTTP, and the index as the events that rebuild it.
import type { FastifyInstance } from 'fastify'
import { engineEventsSpec, RECORD_FIELDS, workerUrl } from '../../core/endpoints.js'
import type { EngineEventsSpec } from '../../core/endpoints.js'
import type { RankIndexState, Router, WorkerInfo } from '../../core/router.js'
import type { DeviceType } from '../../scheduler/worker-ranks.js'
import type { LearnedEngine } from '../../scheduler/engine-estimator.js'
import { isKvrError, KvrError } from '../../errors.js'
import { encodeRouterEvent } from '../../codec/events.js'
import { readU64, serializeJson } from '../../codec/json.js'
import { workerSchema } from '../schemas.js'
import type { HttpContext } from '../context.js'

/** GET /v1/workers's answer; the status page shows it too. */
export interface WorkersAnswer {
  workers: object[]
  unregistered: object[]
}

/**
 * What makes GET /v1/workers's answer. Its cached blocks count every event taken before it
 * (read your writes); with `now`, as the shards hold them now, not waiting out an event backlog
 * (the status page, refreshed every few seconds, must not stall behind a flood).
 */
export type ListWorkers = (now?: boolean) => Promise<WorkersAnswer>

/** Registers the routes; returns what makes GET /v1/workers's answer. */
export function workerRoutes(fastify: FastifyInstance, ctx: HttpContext): ListWorkers {
  const { router, cfg } = ctx
  const listWorkers = async (now = false): Promise<WorkersAnswer> => {
    const stats = router.scheduler.stats().slots
    const health = router.pool.health()
    const cached = new Map<string, number>()
    const lastEvent = new Map<string, bigint>()
    const lower = new Map<string, number>()
    const sizes = await (now ? router.pool.treeSizesNow() : router.pool.treeSizes())
    for (const t of sizes) {
      cached.set(`${t.worker_id}:${t.dp_rank}`, t.tree_size)
      if (t.last_event_id !== undefined) lastEvent.set(`${t.worker_id}:${t.dp_rank}`, t.last_event_id)
      if (t.lower_tier_blocks !== undefined) lower.set(`${t.worker_id}:${t.dp_rank}`, t.lower_tier_blocks)
    }
    // worker-ranks the index holds from KV events alone: no URL to route to, yet they take slots
    // and memory until their worker registers or DELETE /v1/workers/{id} drops them
    const unregistered = []
    for (const t of sizes) {
      const w = router.registry.get(t.worker_id)
      if (w === undefined || t.dp_rank >= w.dpRanks)
        unregistered.push({
          worker_id: t.worker_id,
          worker_id_str: t.worker_id.toString(),
          dp_rank: t.dp_rank,
          cached_blocks: t.tree_size,
          last_event_id: t.last_event_id ?? null,
        })
    }
    const out = router.registry.all().map((w) => {
      const ranks: { index: RankIndexState; [field: string]: unknown }[] = []
      for (let r = 0; r < w.dpRanks; r++) {
        const s = stats.find((x) => x.workerId === w.id && x.dpRank === r)
        const slot = s?.slot ?? router.scheduler.slotOf(w.id, r)
        ranks.push({
          dp_rank: r,
          index: router.indexStateOf(w.id, r),
          cached_blocks: cached.get(`${w.id}:${r}`) ?? 0,
          last_event_id: lastEvent.get(`${w.id}:${r}`) ?? null,
          active_blocks: s?.activeBlocks ?? 0,
          prefill_tokens: s?.prefillTokens ?? 0,
          in_flight: s?.inFlight ?? 0,
          engine_model: slot < 0 ? null : engineModelJson(router.scheduler.learnedEngine(slot)),
          lower_tier_blocks: lower.get(`${w.id}:${r}`) ?? 0,
        })
      }
      // the shard's state first (a restarted shard lost every worker it held), then the ranks'
      const shardState = health[router.pool.shardOf(w.id)] ?? 'exact'
      const index = shardState !== 'exact' ? shardState : (WORKER_STATES.find((st) => ranks.some((x) => x.index === st)) ?? 'exact')
      return {
        id: w.id,
        id_str: w.id.toString(),
        url: w.url,
        request_plane: w.requestPlane ?? null,
        source: w.source,
        block_size: w.blockSize,
        capacity: w.capacity,
        device_type: w.device,
        dp_size: w.dpRanks,
        max_num_batched_tokens: w.maxNumBatchedTokens ?? null,
        kv_events_endpoint: w.kvEvents?.endpoint ?? null,
        replay_endpoint: w.kvEvents?.replay ?? null,
        kv_events_topic: w.kvEvents?.topic ?? null,
        decisions_only: w.decisionsOnly,
        ...healthOf(router, w),
        index,
        ranks,
      }
    })
    return { workers: out, unregistered }
  }
  fastify.get('/v1/workers', async (_req, reply) => reply.header('content-type', 'application/json').send(serializeJson(await listWorkers())))
  // The index itself, as the Stored events that rebuild it (parents first), for inspection and
  // for checking it against the engines' own caches. Optionally one worker's part only.
  fastify.get('/v1/kv/dump', async (req, reply) => {
    const q = req.query as { worker_id?: string }
    const only = q.worker_id === undefined ? undefined : readU64(q.worker_id, 'worker_id')
    const events = await router.pool.dump()
    let s = '{"events":['
    let first = true
    for (const ev of events) {
      if (only !== undefined && ev.worker_id !== only) continue
      s += (first ? '' : ',') + encodeRouterEvent(ev)
      first = false
    }
    return reply.header('content-type', 'application/json').send(s + ']}')
  })
  fastify.post('/v1/workers', { schema: { body: workerSchema } }, async (req, reply) => {
    const b = req.body as Record<string, unknown>
    const idRaw = b.id ?? b.worker_id
    if (idRaw === undefined) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'body must have "id" (u64)')
    const id = readU64(idRaw, 'id')
    // another block size is registered, and shown misconfigured (out of kv routing) until the
    // worker registers again with the router's: refused, it would be invisible
    const bs = (b.block_size as number | undefined) ?? cfg.blockSize
    const device: DeviceType = b.device_type === 'cpu' ? 'cpu' : 'gpu'
    const url = workerUrl(b.url as string)
    if (url === null)
      throw new KvrError(
        'KVR_ERR_INVALID_REQUEST',
        `url must be an http:// or https:// URL with a host (and a port in [0, 65535]), got ${JSON.stringify(b.url)}`,
      )
    const reg: Parameters<Router['addWorker']>[0] = {
      id,
      url,
      blockSize: bs,
      device,
      capacity: (b.capacity ?? b.total_kv_blocks ?? 0) as number,
      dpRanks: (b.dp_size as number | undefined) ?? 1,
    }
    if (typeof b.max_num_batched_tokens === 'number') reg.maxNumBatchedTokens = b.max_num_batched_tokens
    if (b.decisions_only === true) reg.decisionsOnly = true
    reg.kvEvents = engineEvents(b, reg.dpRanks ?? 1)
    const existed = router.registry.get(id) !== undefined
    const w = await router.addWorker(reg)
    return reply
      .code(existed ? 200 : 201)
      .header('content-type', 'application/json')
      .send(
        serializeJson({
          id: w.id,
          id_str: w.id.toString(),
          url: w.url,
          block_size: w.blockSize,
          capacity: w.capacity,
          device_type: w.device,
          dp_size: w.dpRanks,
          kv_events_endpoint: w.kvEvents?.endpoint ?? null,
          replay_endpoint: w.kvEvents?.replay ?? null,
          kv_events_topic: w.kvEvents?.topic ?? null,
          decisions_only: w.decisionsOnly,
          health: router.health.state(w.id, false),
          health_reason: router.health.reason(w.id),
        }),
      )
  })
  fastify.delete('/v1/workers/:id', async (req, reply) => {
    const id = readU64((req.params as { id: string }).id, 'worker id')
    if (!(await router.removeWorker(id))) throw new KvrError('KVR_ERR_UNKNOWN_WORKER', `worker ${id} is neither registered nor in the index`)
    return reply.header('content-type', 'application/json').send(`{"removed":${id.toString()},"removed_str":"${id.toString()}"}`)
  })
  return listWorkers
}

/**
 * A worker's health: its state, why when it is not healthy, the proxy's record of failed requests
 * and the health probes' (null without probes, or before the first ends).
 */
function healthOf(router: Router, w: WorkerInfo): Record<string, unknown> {
  const suspended = router.suspension.isSuspended(w)
  const state = router.health.state(w.id, suspended)
  const reason = state === 'suspended' ? `${w.failures} request(s) in a row failed before their first token` : router.health.reason(w.id)
  return {
    health: state,
    health_reason: reason,
    suspended_for_ms: suspended ? Math.ceil(w.suspendedUntil - performance.now()) : 0,
    consecutive_failures: w.failures,
    probe: router.health.probe(w.id),
  }
}

/** A worker-rank's learned engine model as the API shows it; null while learning is off. */
function engineModelJson(e: LearnedEngine | null): Record<string, unknown> | null {
  if (e === null) return null
  return {
    source: { prefill: e.prefillSource, decode: e.decodeSource },
    prefill: { a_ms_per_token2: e.prefill.a, b_ms_per_token: e.prefill.b, c_ms: e.prefill.c },
    decode: { base_ms: e.decode.base, rise_ms: e.decode.rise },
    prefill_speed: e.prefillSpeed,
    decode_speed: e.decodeSpeed,
    samples: { ttft: e.ttftSamples, itl: e.itlSamples },
    spread: { ttft: e.ttftSpread, itl: e.itlSpread },
  }
}

/** The engine-event fields of a registration: every rank's port (port + rank) must be one. */
function engineEvents(b: Record<string, unknown>, dpRanks: number): EngineEventsSpec | null {
  try {
    return engineEventsSpec({ endpoint: b.kv_events_endpoint, replay: b.replay_endpoint, topic: b.kv_events_topic }, dpRanks, RECORD_FIELDS)
  } catch (err) {
    throw isKvrError(err, 'KVR_ERR_INVALID_ENDPOINT') ? new KvrError('KVR_ERR_INVALID_REQUEST', err.message) : err
  }
}

/** A worker's index state is its ranks' first state in this order. */
const WORKER_STATES: readonly RankIndexState[] = ['recovering', 'degraded', 'no-events', 'predicted']
