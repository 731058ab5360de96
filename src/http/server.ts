// The HTTP API (DESIGN §4.2) on fastify. Routes:
//   POST /v1/completions, /v1/chat/completions   OpenAI-compatible, proxied (src/http/proxy/proxy.ts)
//   GET  /v1/models
//   POST /v1/route, /v1/overlap                  standalone decision / overlap (hot path: the
//                                                body is scanned, not JSON.parsed: route-body.ts)
//   POST /v1/route/:id/prefill-complete, DELETE /v1/route/:id
//   POST /v1/kv-events                           one RouterEvent or an array
//   GET|POST /v1/workers, DELETE /v1/workers/:id
//   GET|POST /busy_threshold
//   GET  /health, /live, /ready, /metrics
// With --api-key every POST and DELETE needs `Authorization: Bearer KEY`.
import { isUtf8 } from 'node:buffer'
import { timingSafeEqual } from 'node:crypto'
import { Server as NetServer } from 'node:net'
import type { Socket } from 'node:net'
import Fastify from 'fastify'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { Dispatcher } from 'undici'
import { workerUrl } from '../config.js'
import type { Router } from '../core/router.js'
import type { RouteInput } from '../core/router.js'
import type { RouterConfigOverride } from '../scheduler/scheduler.js'
import { MAX_ISL } from '../scheduler/scheduler.js'
import { splitEvents } from '../codec/event-array.js'
import type { Candidate } from '../scheduler/selector.js'
import type { DeviceType } from '../scheduler/worker-ranks.js'
import { KvrError } from '../errors.js'
import { encodeRouterEvent, parseRouterEvent } from '../codec/events.js'
import { blockHashesInto } from '../codec/hashing.js'
import { u64ToString } from '../codec/u64.js'
import { chatPromptText } from '../tokenizer/tokenizer.js'
import type { ChatMessage, TextTokenizer } from '../tokenizer/tokenizer.js'
import { Proxy } from './proxy/proxy.js'
import type { ProxyCall } from './proxy/proxy.js'
import { clientErrorHandler, errorHandler, responseUnderWay, sendError } from './error-handler.js'
import { parseJsonExact, readU64, serializeJson } from '../codec/json.js'
import { readBody } from './body.js'
import { RouteBodyScanner } from '../codec/route-body.js'
import type { RouteBody } from '../codec/route-body.js'

export interface AppOptions {
  router: Router
  tokenizer: TextTokenizer | null
  logger?: boolean
  /**
   * The undici dispatcher the proxy sends upstream requests through, for an embedder that needs
   * its own (TLS settings, an egress proxy); a keep-alive Agent by default. The app does not
   * close a dispatcher it was given.
   */
  dispatcher?: Dispatcher
}

export interface App {
  fastify: FastifyInstance
  proxy: Proxy
  /** Stops accepting, drains every open request (proxied, or still arriving) up to timeoutMs, then cuts what is left and closes. */
  shutdown(timeoutMs: number): Promise<ShutdownResult>
}

export interface ShutdownResult {
  /** Nothing had to be cut. */
  drained: boolean
  /** Proxied requests still in flight at the deadline, whose clients were cut off. */
  cut: number
}

const u64Schema = { anyOf: [{ type: 'integer', minimum: 0 }, { type: 'string', pattern: '^(0|[1-9][0-9]{0,19})$' }] }
const overrideSchema = {
  type: 'object',
  properties: {
    overlap_score_weight: { type: 'number', minimum: 0 },
    overlap_score_credit: { type: 'number', minimum: 0 },
    router_temperature: { type: 'number', minimum: 0 },
    assume_kv_reuse: { type: 'boolean' },
    track_prefill_tokens: { type: 'boolean' },
  },
}
const nvextSchema = {
  type: 'object',
  properties: {
    backend_instance_id: u64Schema,
    dp_rank: { type: 'integer', minimum: 0, maximum: 0xffffffff },
    token_data: { type: 'array', items: { type: 'integer' } },
    agent_hints: { type: 'object', properties: { priority: { type: 'integer', minimum: -2147483648, maximum: 2147483647 } } },
    router_config_override: overrideSchema,
  },
}
const completionSchema = {
  type: 'object',
  required: ['prompt'],
  properties: {
    model: { type: 'string' },
    prompt: { anyOf: [{ type: 'string' }, { type: 'array' }] },
    stream: { type: 'boolean' },
    add_special_tokens: { type: 'boolean' },
    max_tokens: { type: ['integer', 'null'], minimum: 0 },
    nvext: nvextSchema,
  },
}
const contentPartSchema = {
  type: 'object',
  required: ['type'],
  properties: { type: { type: 'string' }, text: { type: 'string' } },
  if: { properties: { type: { const: 'text' } } },
  then: { required: ['text'] },
}
const chatSchema = {
  type: 'object',
  required: ['messages'],
  properties: {
    model: { type: 'string' },
    // content: text, a list of parts, or null (an assistant turn that only calls tools); a part
    // is an object naming its type, and a text part's text is a string (a number there was
    // read as empty text; found by an input review)
    messages: { type: 'array', minItems: 1, items: { type: 'object', required: ['role'], properties: { role: { type: 'string' }, content: { anyOf: [{ type: 'string' }, { type: 'array', items: contentPartSchema }, { type: 'null' }] } } } },
    stream: { type: 'boolean' },
    add_special_tokens: { type: 'boolean' },
    add_generation_prompt: { type: 'boolean' },
    chat_template_kwargs: { type: 'object' },
    tools: { type: 'array' },
    max_tokens: { type: ['integer', 'null'], minimum: 0 },
    max_completion_tokens: { type: ['integer', 'null'], minimum: 0 },
    nvext: nvextSchema,
  },
}
const workerSchema = {
  type: 'object',
  required: ['url'],
  properties: {
    id: u64Schema,
    worker_id: u64Schema,
    url: { type: 'string', pattern: '^https?://' },
    block_size: { type: 'integer', minimum: 1, maximum: 65536 },
    capacity: { type: 'integer', minimum: 0 },
    total_kv_blocks: { type: 'integer', minimum: 0 },
    device_type: { type: 'string', enum: ['gpu', 'cpu', 'cuda'] },
    dp_size: { type: 'integer', minimum: 1, maximum: 1024 },
    max_num_batched_tokens: { type: 'integer', minimum: 1 },
  },
}
const thresholdSchema = {
  type: 'object',
  // a misspelt threshold used to be dropped with a 200, the old value left in force
  additionalProperties: false,
  properties: {
    model: { type: 'string' },
    active_decode_blocks_threshold: { type: ['number', 'null'], minimum: 0, maximum: 1 },
    active_prefill_tokens_threshold: { type: ['number', 'null'], minimum: 0 },
    active_prefill_tokens_threshold_frac: { type: ['number', 'null'], minimum: 0 },
  },
}

function overrides(o: unknown): RouterConfigOverride | undefined {
  if (o === undefined || o === null) return undefined
  if (typeof o !== 'object' || Array.isArray(o)) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'router_config_override must be an object')
  const r = o as Record<string, unknown>
  const out: RouterConfigOverride = {}
  const num = (k: string): number | undefined => {
    const v = r[k]
    if (v === undefined || v === null) return undefined
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new KvrError('KVR_ERR_INVALID_REQUEST', `router_config_override.${k} must be a number ≥ 0`)
    return v
  }
  const bool = (k: string): boolean | undefined => {
    const v = r[k]
    if (v === undefined || v === null) return undefined
    if (typeof v !== 'boolean') throw new KvrError('KVR_ERR_INVALID_REQUEST', `router_config_override.${k} must be a boolean`)
    return v
  }
  const w = num('overlap_score_weight')
  if (w !== undefined) out.overlapScoreWeight = w
  const cr = num('overlap_score_credit')
  if (cr !== undefined) out.overlapScoreCredit = cr
  const t = num('router_temperature')
  if (t !== undefined) out.temperature = t
  const a = bool('assume_kv_reuse')
  if (a !== undefined) out.assumeKvReuse = a
  const p = bool('track_prefill_tokens')
  if (p !== undefined) out.trackPrefillTokens = p
  return out
}

function candidateJson(c: Candidate): string {
  return `{"worker_id":${c.workerId.toString()},"dp_rank":${c.dpRank},"overlap_blocks":${c.overlapBlocks},"prefill_blocks":${c.prefillBlocks},"decode_blocks":${c.decodeBlocks},"logit":${Number.isFinite(c.logit) ? c.logit : 'null'}${c.treeSize === undefined ? '' : `,"tree_size":${c.treeSize}`}}`
}

function headerValue(req: FastifyRequest, name: string): string | undefined {
  const v = req.headers[name]
  return Array.isArray(v) ? v[0] : v
}

/** The bytes a request's JSON body was parsed from. */
const BODY_BYTES = Symbol('kvr.bodyBytes')
/** Set on an inference request the proxy took: the proxy counts it, with the status its stream ended on. */
const PROXIED = Symbol('proxied')
type RequestWithBytes = FastifyRequest & { [BODY_BYTES]?: Buffer; [PROXIED]?: true }

export async function buildApp(opts: AppOptions): Promise<App> {
  const router = opts.router
  const cfg = router.config
  const tokenizer = opts.tokenizer
  const fastify = Fastify({
    logger: opts.logger === true ? { level: 'info' } : false,
    bodyLimit: cfg.bodyLimit,
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, allErrors: false } },
    forceCloseConnections: 'idle',
    return503OnClosing: true,
    // a path fastify cannot decode, and Node's parser errors, in the catalogue's JSON like the rest
    frameworkErrors: (err, _req, reply) => void sendError(reply, err),
    clientErrorHandler,
  })
  // The connections open, for the shutdown's sweep: one listener per connection, nothing per request.
  const sockets = new Set<Socket>()
  fastify.server.on('connection', (s: Socket) => {
    sockets.add(s)
    s.once('close', () => sockets.delete(s))
  })
  const proxy = new Proxy(router, { retries: cfg.proxyRetries, dispatcher: opts.dispatcher })
  let closing = false

  fastify.setErrorHandler(errorHandler)
  fastify.setNotFoundHandler((req, reply) => {
    void sendError(reply, new KvrError('KVR_ERR_NOT_FOUND', `no route ${req.method} ${req.url}`))
  })
  // JSON with exact u64s everywhere (the scanner context below replaces it for its routes)
  fastify.removeContentTypeParser(['application/json', 'text/plain'])
  fastify.addContentTypeParser('application/json', (req, payload, done) => {
    // the proxy forwards these very bytes, as they came and without a copy (src/http/body.ts):
    // handed the text, undici would encode it into a buffer of its own
    readBody(payload, cfg.bodyLimit, headerValue(req, 'content-length'), (err, bytes) => {
      if (err !== null || bytes === undefined) return done(err, undefined)
      // JSON is UTF-8 (RFC 8259): bytes that are not would reach the worker as they came while
      // the router read them with replacement characters, so they are refused instead
      if (!isUtf8(bytes)) return done(new KvrError('KVR_ERR_INVALID_REQUEST', 'the body is not valid UTF-8'), undefined)
      try {
        ;(req as RequestWithBytes)[BODY_BYTES] = bytes
        done(null, bytes.length === 0 ? undefined : parseJsonExact(bytes.toString('utf8')))
      } catch (e) {
        done(new KvrError('KVR_ERR_INVALID_REQUEST', `malformed JSON: ${(e as Error).message}`), undefined)
      }
    })
  })

  const apiKey = cfg.apiKey === null ? null : Buffer.from(cfg.apiKey)
  if (apiKey !== null) {
    fastify.addHook('onRequest', async (req, reply) => {
      if (req.method !== 'POST' && req.method !== 'DELETE' && req.method !== 'PUT' && req.method !== 'PATCH') return
      const header = headerValue(req, 'authorization') ?? ''
      // the scheme's name is case-insensitive (RFC 9110 §11.1): `bearer KEY` is the same credential
      const m = /^([A-Za-z]+) +(.*)$/.exec(header)
      let problem: string | null = null
      if (header.length === 0) problem = 'missing Authorization: Bearer header (--api-key is set)'
      else if (m === null || (m[1] as string).toLowerCase() !== 'bearer') problem = 'the Authorization header must be `Bearer KEY` (--api-key is set)'
      else {
        const got = Buffer.from(m[2] as string)
        if (got.length !== apiKey.length || !timingSafeEqual(got, apiKey)) problem = 'wrong API key'
      }
      if (problem !== null) await sendError(reply, new KvrError('KVR_ERR_UNAUTHORIZED', problem))
    })
  }
  // callback style: an async hook costs every request a promise and a microtask turn
  fastify.addHook('onRequest', (_req, reply, done) => {
    if (!closing) return done()
    // answered here, so the lifecycle does not go on (no done())
    reply.header('connection', 'close')
    void sendError(reply, new KvrError('KVR_ERR_SHUTTING_DOWN'))
  })

  // ---- liveness, readiness, metrics ----

  fastify.get('/health', async () => ({ status: 'ok' }))
  fastify.get('/live', async () => ({ status: 'ok' }))
  fastify.get('/ready', async (req, reply) => {
    const health = router.pool.health()
    const recovering = health.filter((h) => h !== 'exact').length
    const pending = router.pool.pendingMessages
    const conn = router.connected
    // A lost NATS or etcd connection leaves the router able to route (on an index that stops
    // learning, with the workers it last knew), and it hits every replica at once: a balancer
    // that took them all out would turn a control-plane blip into an outage (found by an
    // operator review). So it is `degraded` here and in kvrouter_connected, not unready.
    // ?strict: DESIGN §4.2's readiness, the connections included, for a deployment that wants it
    const strict = (req.query as Record<string, unknown> | undefined)?.strict !== undefined
    const degraded = conn.nats === false || conn.etcd === false
    const ready = recovering === 0 && !closing && !(strict && degraded)
    return reply.code(ready ? 200 : 503).send({ ready, degraded, shards: health.length, recovering_shards: recovering, pending_event_messages: pending, workers: router.workers().length, nats: conn.nats, etcd: conn.etcd })
  })
  fastify.get('/metrics', async (_req, reply) => {
    const text = await router.metrics.registry.metrics()
    return reply.header('content-type', router.metrics.registry.contentType).send(text)
  })
  fastify.get('/v1/models', async () => ({
    object: 'list',
    data: [{ id: cfg.modelName, object: 'model', created: 0, owned_by: 'kv-router' }],
  }))

  // ---- workers ----

  fastify.get('/v1/workers', async (_req, reply) => {
    const stats = router.scheduler.stats().slots
    const health = router.pool.health()
    const cached = new Map<string, number>()
    const lastEvent = new Map<string, bigint>()
    const sizes = await router.pool.treeSizes()
    for (const t of sizes) {
      cached.set(`${t.worker_id}:${t.dp_rank}`, t.tree_size)
      if (t.last_event_id !== undefined) lastEvent.set(`${t.worker_id}:${t.dp_rank}`, t.last_event_id)
    }
    // worker-ranks the index holds from KV events alone: no URL to route to, yet they take slots
    // and memory until their worker registers or DELETE /v1/workers/{id} drops them
    const unregistered = []
    for (const t of sizes) {
      const w = router.worker(t.worker_id)
      if (w === undefined || t.dp_rank >= w.dpRanks) unregistered.push({ worker_id: t.worker_id, dp_rank: t.dp_rank, cached_blocks: t.tree_size, last_event_id: t.last_event_id ?? null })
    }
    const out = router.workers().map((w) => {
      const ranks = []
      for (let r = 0; r < w.dpRanks; r++) {
        const s = stats.find((x) => x.workerId === w.id && x.dpRank === r)
        ranks.push({ dp_rank: r, index: router.recovery?.stateOf(w.id, r) ?? 'exact', cached_blocks: cached.get(`${w.id}:${r}`) ?? 0, last_event_id: lastEvent.get(`${w.id}:${r}`) ?? null, active_blocks: s?.activeBlocks ?? 0, prefill_tokens: s?.prefillTokens ?? 0, in_flight: s?.inFlight ?? 0 })
      }
      // the shard's state first (a restarted shard lost every worker it held), then the ranks'
      const shardState = health[router.pool.shardOf(w.id)] ?? 'exact'
      const index = shardState !== 'exact' ? shardState : ranks.some((x) => x.index === 'recovering') ? 'recovering' : ranks.some((x) => x.index === 'degraded') ? 'degraded' : 'exact'
      return {
        id: w.id,
        url: w.url,
        source: w.source,
        block_size: w.blockSize,
        capacity: w.capacity,
        device_type: w.device,
        dp_size: w.dpRanks,
        max_num_batched_tokens: w.maxNumBatchedTokens ?? null,
        // suspended: left out of routing after failures in a row; failing: its time out is up,
        // and the next request may go there (an answer makes it ok)
        health: w.failures === 0 ? 'ok' : router.isSuspended(w) ? 'suspended' : 'failing',
        suspended_for_ms: router.isSuspended(w) ? Math.ceil(w.suspendedUntil - performance.now()) : 0,
        consecutive_failures: w.failures,
        index,
        ranks,
      }
    })
    return reply.header('content-type', 'application/json').send(serializeJson({ workers: out, unregistered }))
  })
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
    const bs = (b.block_size as number | undefined) ?? cfg.blockSize
    if (bs !== cfg.blockSize) throw new KvrError('KVR_ERR_INVALID_BLOCK_SIZE', `worker block_size ${bs} differs from the router's --router-block-size ${cfg.blockSize}: its KV events would never match`)
    const device: DeviceType = b.device_type === 'cpu' ? 'cpu' : 'gpu'
    const url = workerUrl(b.url as string)
    if (url === null) throw new KvrError('KVR_ERR_INVALID_REQUEST', `url must be an http:// or https:// URL with a host (and a port in [0, 65535]), got ${JSON.stringify(b.url)}`)
    const reg: Parameters<Router['addWorker']>[0] = { id, url, blockSize: bs, device, capacity: (b.capacity ?? b.total_kv_blocks ?? 0) as number, dpRanks: (b.dp_size as number | undefined) ?? 1 }
    if (typeof b.max_num_batched_tokens === 'number') reg.maxNumBatchedTokens = b.max_num_batched_tokens
    const existed = router.worker(id) !== undefined
    const w = await router.addWorker(reg)
    return reply
      .code(existed ? 200 : 201)
      .header('content-type', 'application/json')
      .send(serializeJson({ id: w.id, url: w.url, block_size: w.blockSize, capacity: w.capacity, device_type: w.device, dp_size: w.dpRanks }))
  })
  fastify.delete('/v1/workers/:id', async (req, reply) => {
    const id = readU64((req.params as { id: string }).id, 'worker id')
    if (!(await router.removeWorker(id))) throw new KvrError('KVR_ERR_UNKNOWN_WORKER', `worker ${id} is neither registered nor in the index`)
    return reply.header('content-type', 'application/json').send(`{"removed":${id.toString()}}`)
  })

  // ---- busy thresholds (spec §4.7) ----

  const thresholdsJson = (): object => {
    const t = router.scheduler.busyThresholds()
    return {
      thresholds: [
        {
          model: cfg.modelName,
          active_decode_blocks_threshold: t.activeDecodeBlocksThreshold,
          active_prefill_tokens_threshold: t.activePrefillTokensThreshold,
          active_prefill_tokens_threshold_frac: t.activePrefillTokensThresholdFrac,
        },
      ],
    }
  }
  fastify.get('/busy_threshold', async () => thresholdsJson())
  fastify.post('/busy_threshold', { schema: { body: thresholdSchema } }, async (req) => {
    const b = req.body as Record<string, number | null | undefined>
    const patch: Record<string, number | null> = {}
    if (b.active_decode_blocks_threshold !== undefined) patch.activeDecodeBlocksThreshold = b.active_decode_blocks_threshold
    if (b.active_prefill_tokens_threshold !== undefined) patch.activePrefillTokensThreshold = b.active_prefill_tokens_threshold
    if (b.active_prefill_tokens_threshold_frac !== undefined) patch.activePrefillTokensThresholdFrac = b.active_prefill_tokens_threshold_frac
    if (Object.keys(patch).length > 0) router.scheduler.setBusyThresholds(patch)
    return thresholdsJson()
  })

  // ---- the scanner context: /v1/route, /v1/overlap, /v1/kv-events read raw bytes ----

  await fastify.register(async (scope) => {
    const scanner = new RouteBodyScanner()
    scope.removeContentTypeParser('application/json')
    // the scanner reads the bytes where they are: Node's own buffer of the body, not a copy
    scope.addContentTypeParser('application/json', (req, payload, done) => {
      readBody(payload, cfg.bodyLimit, headerValue(req, 'content-length'), (err, bytes) => {
        // the same rule as the JSON parser's: a request_id read with replacement characters
        // was booked under a name its client could not release (found by review); Node's check
        // runs at gigabytes a second, a few µs on a 4,096-token body
        if (err === null && bytes !== undefined && !isUtf8(bytes)) return done(new KvrError('KVR_ERR_INVALID_REQUEST', 'the body is not valid UTF-8'), undefined)
        done(err, bytes)
      })
    })

    const routeInput = (body: RouteBody): RouteInput => {
      const rest = body.rest
      const input: RouteInput = { tokens: body.tokens }
      if (body.tokens === null) {
        if (body.blockLo === null || body.blockHi === null) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'the body needs token_ids or block_hashes')
        input.blockLo = body.blockLo
        input.blockHi = body.blockHi
        input.blockCount = body.blockLo.length
        if (body.blockLo.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'block_hashes is empty')
      } else if (body.tokens.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'token_ids is empty')
      const ov = overrides(rest.router_config_override)
      if (ov !== undefined) input.overrides = ov
      const wid = rest.worker_id ?? rest.backend_instance_id
      if (wid !== undefined && wid !== null) input.workerId = readU64(wid, 'worker_id')
      if (rest.dp_rank !== undefined && rest.dp_rank !== null) {
        const r = rest.dp_rank
        if (typeof r !== 'number' || !Number.isInteger(r) || r < 0 || r > 0xffffffff) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'dp_rank must be an integer in [0, 2^32)')
        if (input.workerId === undefined) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'dp_rank needs the worker it belongs to (worker_id)')
        input.dpRank = r
      }
      if (rest.priority !== undefined && rest.priority !== null) {
        const p = rest.priority
        // i32 as Dynamo's agent_hints.priority, and as the completions routes' schema has it
        if (typeof p !== 'number' || !Number.isInteger(p) || p < -2147483648 || p > 2147483647) throw new KvrError('KVR_ERR_INVALID_REQUEST', `priority must be an integer in [-2^31, 2^31), got ${JSON.stringify(p)}`)
        input.priority = p
      }
      if (rest.isl !== undefined) {
        const n = rest.isl
        if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > MAX_ISL) throw new KvrError('KVR_ERR_INVALID_REQUEST', `isl must be an integer in [0, 2^32), got ${JSON.stringify(n)}`)
        input.isl = n
      }
      return input
    }

    scope.post('/v1/route', async (req, reply) => {
      const body = scanner.scan(req.body as Buffer)
      const input = routeInput(body)
      const rest = body.rest
      const update = rest.update_states
      if (update !== undefined && typeof update !== 'boolean') throw new KvrError('KVR_ERR_INVALID_REQUEST', 'update_states must be a boolean')
      input.updateStates = update === true
      input.explain = true
      if (update === true) {
        const id = rest.request_id
        if (id !== undefined && (typeof id !== 'string' || id.length === 0 || id.length > 256)) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'request_id must be a non-empty string (≤ 256 chars)')
        if (id !== undefined && router.isRouterRequestId(id as string)) throw new KvrError('KVR_ERR_INVALID_REQUEST', `request_id ${JSON.stringify(id)} is in the router's own id space (ids it makes begin with ${JSON.stringify(router.requestIdPrefix)}): choose another`)
        input.id = (id as string | undefined) ?? router.newRequestId()
      }
      const { decision } = await router.route(input)
      let s = `{"worker_id":${decision.workerId.toString()},"dp_rank":${decision.dpRank},"overlap_blocks":${decision.overlapBlocks},"candidates":[`
      const cs = decision.candidates ?? []
      for (let i = 0; i < cs.length; i++) s += (i === 0 ? '' : ',') + candidateJson(cs[i] as Candidate)
      s += ']'
      if (decision.booked && decision.requestId !== undefined) s += `,"request_id":${JSON.stringify(decision.requestId)}`
      return reply.header('content-type', 'application/json').send(s + '}')
    })

    scope.post('/v1/overlap', async (req, reply) => {
      const body = scanner.scan(req.body as Buffer)
      const input = routeInput(body)
      const bs = cfg.blockSize
      let lo: Uint32Array
      let hi: Uint32Array
      if (input.tokens !== null) {
        const n = Math.floor(input.tokens.length / bs)
        lo = new Uint32Array(n)
        hi = new Uint32Array(n)
        blockHashesInto(input.tokens, bs, lo, hi)
      } else {
        lo = input.blockLo as Uint32Array
        hi = input.blockHi as Uint32Array
      }
      const r = await router.pool.query(lo, hi, lo.length)
      const scores = []
      for (let i = 0; i < r.count; i++) {
        scores.push(`{"worker_id":${u64ToString(r.workerIdLo[i] as number, r.workerIdHi[i] as number)},"dp_rank":${r.dpRank[i]},"overlap_blocks":${r.overlap[i]},"tree_size":${r.treeSize[i]}}`)
      }
      return reply.header('content-type', 'application/json').send(`{"blocks":${lo.length},"block_size":${bs},"scores":[${scores.join(',')}],"recovering_shards":${JSON.stringify(r.recoveringShards)}}`)
    })

    scope.post('/v1/route/:id/prefill-complete', async (req, reply) => {
      const id = (req.params as { id: string }).id
      if (router.isProxiedRequestId(id)) throw proxiedBooking(id)
      if (!router.scheduler.markPrefillComplete(id)) throw new KvrError('KVR_ERR_UNKNOWN_REQUEST', `no booked request ${id}`)
      return reply.send({ request_id: id, prefill_complete: true })
    })
    scope.delete('/v1/route/:id', async (req, reply) => {
      const id = (req.params as { id: string }).id
      if (router.isProxiedRequestId(id)) throw proxiedBooking(id)
      if (!router.scheduler.free(id)) throw new KvrError('KVR_ERR_UNKNOWN_REQUEST', `no booked request ${id}`)
      return reply.send({ request_id: id, released: true })
    })

    scope.post('/v1/kv-events', async (req, reply) => {
      // a sender that outruns the shards is told to wait, before anything of its batch is taken,
      // rather than grow the backlog without bound (found by an input review)
      if (router.pool.backlogFull) {
        router.metrics.eventsRefused(1)
        reply.header('retry-after', '1')
        throw new KvrError('KVR_ERR_EVENT_BACKLOG', `${router.pool.pendingMessages} event messages (${router.pool.pendingBytes} bytes) wait for the indexer shards`)
      }
      const buf = req.body as Buffer
      let parts: Uint8Array[]
      // validate the whole batch first, so a bad event refuses the batch and nothing half-applies
      const ids: bigint[] = []
      try {
        parts = splitEvents(buf)
        for (let i = 0; i < parts.length; i++) {
          // a 16 MiB batch is about 250,000 events, all decoded here before any is taken: other
          // requests get a turn every few thousand (found by an input review)
          if ((i & 4095) === 4095) await new Promise<void>((resolve) => setImmediate(resolve))
          try {
            ids.push(parseRouterEvent(parts[i] as Uint8Array).worker_id)
          } catch (err) {
            const e = err as KvrError
            throw new KvrError(e.code ?? 'KVR_ERR_EVENT_MALFORMED_JSON', parts.length > 1 ? `event ${i}: ${e.message}` : e.message)
          }
        }
      } catch (err) {
        router.metrics.eventsRefused(1)
        throw err
      }
      let backpressure = false
      for (let i = 0; i < parts.length; i++) if (!router.ingest(parts[i] as Uint8Array, ids[i])) backpressure = true
      router.metrics.eventsReceived(parts.length)
      return reply.code(202).send({ accepted: parts.length, backpressure })
    })
  })

  // ---- OpenAI-compatible inference ----

  const noTokenizer = (): null => {
    if (cfg.mode === 'kv') throw new KvrError('KVR_ERR_NO_TOKENIZER', 'a text prompt needs a tokenizer in kv mode: start the router with --tokenizer PATH (a tokenizer.json) or --tokenizer bytes, or send token ids')
    return null
  }
  // vLLM's request field, with its defaults: a completion gets the tokenizer's BOS, a rendered chat not
  const specialTokens = (body: Record<string, unknown>, dflt: boolean): boolean => (typeof body.add_special_tokens === 'boolean' ? body.add_special_tokens : dflt)
  const tokensOf = async (text: string, body: Record<string, unknown>): Promise<ArrayLike<number> | null> => (tokenizer === null ? noTokenizer() : tokenizer.encode(text, specialTokens(body, true)))

  const commonRoute = (req: FastifyRequest, body: Record<string, unknown>, tokens: ArrayLike<number> | null, textLength: number): RouteInput => {
    const input: RouteInput = { tokens: tokens ?? [], isl: tokens === null ? Math.ceil(textLength / 4) : tokens.length }
    const nv = (body.nvext ?? {}) as Record<string, unknown>
    const pin = headerValue(req, 'x-worker-instance-id') ?? headerValue(req, 'x-dynamo-worker-instance-id') ?? nv.backend_instance_id
    if (pin !== undefined && pin !== null) input.workerId = readU64(pin, 'nvext.backend_instance_id')
    const rank = headerValue(req, 'x-dp-rank') ?? headerValue(req, 'x-data-parallel-rank') ?? nv.dp_rank
    if (rank !== undefined && rank !== null) {
      // a header is text: Number() read "" and "0x0" as rank 0 (found by review)
      const r = typeof rank === 'string' ? (/^[0-9]{1,10}$/.test(rank) ? Number(rank) : Number.NaN) : Number(rank)
      if (!Number.isInteger(r) || r < 0 || r > 0xffffffff) throw new KvrError('KVR_ERR_INVALID_REQUEST', `dp rank must be a decimal integer in [0, 2^32), got ${JSON.stringify(rank)}`)
      // a rank names one rank of one worker; without the worker it used to be dropped unseen
      if (input.workerId === undefined) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'a dp rank (x-dp-rank, nvext.dp_rank) needs the worker it belongs to (x-worker-instance-id or nvext.backend_instance_id)')
      input.dpRank = r
    }
    const hints = nv.agent_hints as { priority?: number } | undefined
    if (hints?.priority !== undefined) input.priority = hints.priority
    const ov = overrides(nv.router_config_override)
    if (ov !== undefined) input.overrides = ov
    return input
  }

  /**
   * What the proxy needs of a request, taken from its body. The body, its text and the prompt in
   * it would otherwise stay reachable for the whole stream through the request object and this
   * function's frame (65 KB per open stream with a 4,096-token prompt, against 9 KB with 64
   * tokens, before: `node dist/bench/stream-heap.js`); the request lets go of them here, and the
   * proxy drops its own references at the first token, when no retry can need them.
   */
  const proxyCall = async (path: string, chat: boolean, req: FastifyRequest): Promise<ProxyCall> => {
    const body = req.body as Record<string, unknown>
    const nv = (body.nvext ?? {}) as { token_data?: number[] }
    let tokens: ArrayLike<number> | null
    let textLength = 0
    if (Array.isArray(nv.token_data) && nv.token_data.length > 0) {
      tokens = nv.token_data
    } else if (chat) {
      if (tokenizer === null) {
        textLength = chatPromptText(body.messages as ChatMessage[]).length
        tokens = noTokenizer()
      } else {
        const kwargs = body.chat_template_kwargs as Record<string, unknown> | undefined
        const chatRequest = { messages: body.messages as unknown[], addGenerationPrompt: body.add_generation_prompt !== false, kwargs: kwargs ?? null, tools: (body.tools as unknown[] | undefined) ?? null }
        tokens = await tokenizer.encodeChat(chatRequest, specialTokens(body, false))
      }
    } else {
      const p = body.prompt
      if (typeof p === 'string') {
        if (p.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'prompt is empty')
        textLength = p.length
        tokens = await tokensOf(p, body)
      } else {
        const arr = p as unknown[]
        if (arr.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'prompt is empty')
        if (typeof arr[0] === 'number') tokens = arr as number[]
        else if (arr.length === 1 && typeof arr[0] === 'string') {
          textLength = (arr[0] as string).length
          tokens = await tokensOf(arr[0] as string, body)
        } else if (arr.length === 1 && Array.isArray(arr[0])) tokens = arr[0] as number[]
        else throw new KvrError('KVR_ERR_INVALID_REQUEST', 'prompt must be a string, an array of token ids, or one of them in an array (batches are not supported)')
      }
    }
    if (tokens !== null && tokens.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'prompt is empty')
    const input = commonRoute(req, body, tokens, textLength)
    const model = typeof body.model === 'string' ? body.model : cfg.modelName
    const payload = (req as RequestWithBytes)[BODY_BYTES] ?? Buffer.from(JSON.stringify(body))
    ;(req as RequestWithBytes)[BODY_BYTES] = undefined
    req.body = undefined
    ;(req as RequestWithBytes)[PROXIED] = true
    return { path, payload, stream: body.stream === true, route: input, model }
  }

  /**
   * Counts in dynamo_frontend_requests_total an inference request answered before the proxy took
   * it: refused by its key, size, JSON, schema, prompt or chat template, or by a router shutting
   * down. Each of those is an answer a client got, and error-rate dashboards read this series.
   */
  const countUnproxied =
    (path: string) =>
    (req: FastifyRequest, reply: FastifyReply, done: () => void): void => {
      if ((req as RequestWithBytes)[PROXIED] !== true) {
        const b = req.body
        const body = b !== null && typeof b === 'object' && !Array.isArray(b) ? (b as Record<string, unknown>) : {}
        router.metrics.request(typeof body.model === 'string' ? body.model : cfg.modelName, path, body.stream === true ? 'stream' : 'unary', reply.statusCode)
      }
      done()
    }

  // returns nothing: the proxy answers the client itself, errors included, so fastify holds no
  // promise for the life of a stream
  const inference =
    (path: string, chat: boolean) =>
    (req: FastifyRequest, reply: FastifyReply): void => {
      proxyCall(path, chat, req)
        .then((call) => proxy.handle(reply, call))
        .catch((err: unknown) => {
          if (reply.sent || reply.raw.headersSent) reply.log.error({ err }, 'proxying failed after the response began')
          else void reply.send(err)
        })
    }
  fastify.post('/v1/completions', { schema: { body: completionSchema }, onResponse: countUnproxied('/v1/completions') }, inference('/v1/completions', false))
  fastify.post('/v1/chat/completions', { schema: { body: chatSchema }, onResponse: countUnproxied('/v1/chat/completions') }, inference('/v1/chat/completions', true))

  await fastify.ready()

  /**
   * Closes the connections that carry nothing: no response being written (`_httpMessage`, Node's
   * own link from a socket to its response, is cleared only once the last byte is handed to the
   * OS), nothing buffered, and nothing read since the last sweep (no request's headers arriving).
   * Node's closeIdleConnections is not used: it destroys a connection as soon as end() was called,
   * cutting a response still being written to a slow reader (found by review: 3.9 MB of a 20 MB
   * answer arrived).
   */
  const lastRead = new WeakMap<Socket, number>()
  const sweep = (): void => {
    for (const s of sockets) {
      if (responseUnderWay(s) || s.writableLength > 0) continue
      const read = s.bytesRead
      if (lastRead.get(s) === read) s.destroySoon()
      else lastRead.set(s, read)
    }
  }

  const shutdown = async (timeoutMs: number): Promise<ShutdownResult> => {
    closing = true
    let cut = false
    let cutRequests = 0
    // The listener closes at once, so new connections are refused: a balancer that fails over on
    // a refused connection moves on now, not after the drain (found by review). net.Server's close,
    // not http.Server's: the latter also runs closeIdleConnections (see sweep). A request on a
    // connection already open gets 503 with `connection: close` from the onRequest hook above.
    const drained = new Promise<void>((resolve) => fastify.server.once('close', () => resolve()))
    NetServer.prototype.close.call(fastify.server)
    // A keep-alive connection whose last response ends during the drain turns idle and would stay
    // open for fastify's keep-alive timeout (72 s): swept until none is left. A connection still
    // uploading a body has its response assigned, so that request is drained like a proxied one.
    sweep()
    const sweeping = setInterval(sweep, 25)
    // Whatever is still open at the deadline is cut: a stream that never ends, a body that never
    // finishes uploading. A cut client connection is a client disconnect to the proxy: its
    // upstream request is aborted and its booking freed.
    const deadline = setTimeout(() => {
      cut = true
      cutRequests = proxy.inFlight
      fastify.server.closeAllConnections()
    }, timeoutMs)
    try {
      await drained
    } finally {
      clearInterval(sweeping)
      clearTimeout(deadline)
    }
    await fastify.close()
    // the runs of cut connections end as their upstream aborts settle
    const idle = await proxy.drain(1000)
    await proxy.close(cut || !idle)
    return { drained: !cut && idle, cut: cutRequests }
  }
  return { fastify, proxy, shutdown }
}

/** A booking of a request the router proxies: it follows that request, not the release routes. */
const proxiedBooking = (id: string): KvrError => new KvrError('KVR_ERR_UNKNOWN_REQUEST', `no request booked through /v1/route has the id ${id}: it is one the router is proxying, whose booking ends with its stream`)
