// `kv-router indexer`'s HTTP routes: Dynamo's standalone KV indexer API (docs/indexer.md), with
// the Mooncake RFC's field names accepted where they do not collide. Bodies are read with exact
// u64s (and exact negative i64s: Dynamo's block hashes are i64). Every refusal answers Dynamo's
// {"error": message} with our code beside it, and is counted.
import Fastify from 'fastify'
import type { FastifyError, FastifyInstance, FastifyReply } from 'fastify'
import { KvrError, isKvrError } from '../errors.js'
import type { ErrorCode } from '../errors.js'
import { parseJsonExact, readU64, serializeJson } from '../codec/json.js'
import type { ShardPool } from '../shards/pool.js'
import { DEFAULT_ROUTING_GROUP } from './registry.js'
import type { IndexerRegistry, Registration } from './registry.js'
import type { IndexerMetrics } from './metrics.js'
import { log } from '../runtime/log.js'
import { rawBodyParser } from '../http/plugins/parsers.js'
import { RouteBodyScanner } from '../codec/route-body.js'

/** Dynamo's: a million tokens as JSON text fit. */
export const BODY_LIMIT_BYTES = 8 * 1024 * 1024

const U64 = {
  anyOf: [
    { type: 'integer', minimum: 0 },
    { type: 'string', pattern: '^[0-9]{1,20}$' },
  ],
}
const I64 = { anyOf: [{ type: 'integer' }, { type: 'string', pattern: '^-?[0-9]{1,20}$' }] }
const NAME = { type: 'string', minLength: 1 }
const OPT_STR = { type: ['string', 'null'] }
const RANK = { type: ['integer', 'null'], minimum: 0, maximum: 0xffffffff }
/** Dynamo's model_name; the RFC's modelname (and model in /query) name the same. */
const MODEL_REQUIRED = { anyOf: [{ required: ['model_name'] }, { required: ['modelname'] }, { required: ['model'] }] }

const registerSchema = {
  type: 'object',
  required: ['instance_id', 'endpoint', 'block_size'],
  ...MODEL_REQUIRED,
  properties: {
    instance_id: U64,
    endpoint: { type: 'string' },
    model_name: NAME,
    modelname: NAME,
    model: NAME,
    routing_group: NAME,
    tenant_id: OPT_STR,
    block_size: { type: 'integer', minimum: 1, maximum: 65536 },
    dp_rank: RANK,
    replay_endpoint: OPT_STR,
    additional_salt: OPT_STR,
    additionalsalt: OPT_STR,
    type: OPT_STR,
    lora_name: OPT_STR,
  },
}

const unregisterSchema = {
  type: 'object',
  required: ['instance_id'],
  ...MODEL_REQUIRED,
  properties: {
    instance_id: U64,
    model_name: NAME,
    modelname: NAME,
    model: NAME,
    routing_group: { type: ['string', 'null'] },
    tenant_id: OPT_STR,
    dp_rank: RANK,
  },
}

const queryCommon = {
  model_name: NAME,
  modelname: NAME,
  model: NAME,
  routing_group: NAME,
  tenant_id: OPT_STR,
  lora_name: OPT_STR,
  cache_salt: OPT_STR,
  instance_id: { anyOf: [U64, { type: 'null' }] },
  block_size: { type: ['integer', 'null'] },
}

/** /query's members beside token_ids (read by the scanner): those of queryCommon, with one model name required. */
function checkQueryMembers(b: Body): void {
  const bad = (msg: string): never => {
    throw new KvrError('KVR_ERR_INVALID_REQUEST', `invalid body: ${msg}`)
  }
  if (b.model_name === undefined && b.modelname === undefined && b.model === undefined) bad("body must have required property 'model_name'")
  for (const k of ['model_name', 'modelname', 'model', 'routing_group'] as const) {
    const v = b[k]
    if (v !== undefined && (typeof v !== 'string' || v.length === 0)) bad(`body/${k} must be a non-empty string`)
  }
  for (const k of ['tenant_id', 'lora_name', 'cache_salt'] as const) {
    const v = b[k]
    if (v !== undefined && v !== null && typeof v !== 'string') bad(`body/${k} must be a string or null`)
  }
  const id = b.instance_id
  if (id !== undefined && id !== null) readU64(id, 'instance_id')
  const bs = b.block_size
  if (bs !== undefined && bs !== null && !Number.isInteger(bs)) bad('body/block_size must be an integer or null')
}

const queryByHashSchema = {
  type: 'object',
  required: ['block_hashes'],
  ...MODEL_REQUIRED,
  properties: { ...queryCommon, block_hashes: { type: 'array', items: I64 } },
}

const peerSchema = { type: 'object', required: ['url'], properties: { url: { type: 'string', minLength: 1 } } }

type Body = Record<string, unknown>

const modelOf = (b: Body): string => (b.model_name ?? b.modelname ?? b.model) as string
const groupOf = (b: Body): string => (typeof b.routing_group === 'string' ? b.routing_group : DEFAULT_ROUTING_GROUP)
const optStr = (v: unknown): string | null => (typeof v === 'string' && v !== '' ? v : null)
const rankOf = (v: unknown): number | null => (typeof v === 'number' ? v : null)

/** An i64 or u64 block hash as its u64 bits. */
function hashBits(v: unknown): bigint {
  const b = BigInt(v as number | string)
  if (b < -(1n << 63n) || b > 0xffffffffffffffffn) throw new KvrError('KVR_ERR_INVALID_REQUEST', `block_hashes: ${String(v)} is not a 64-bit integer`)
  return BigInt.asUintN(64, b)
}

/** GET /workers' entries: one per instance in a group, its ranks' endpoints by rank. */
function workerEntries(regs: readonly Registration[]): unknown[] {
  const out = new Map<
    string,
    {
      instance_id: bigint
      model_name: string
      routing_group: string
      block_size: number
      endpoints: Record<string, string>
      replay_endpoints: Record<string, string>
    }
  >()
  for (const r of regs) {
    const key = `${r.instanceId}\u0000${r.modelName}\u0000${r.routingGroup}`
    let e = out.get(key)
    if (e === undefined) {
      e = { instance_id: r.instanceId, model_name: r.modelName, routing_group: r.routingGroup, block_size: r.blockSize, endpoints: {}, replay_endpoints: {} }
      out.set(key, e)
    }
    e.endpoints[String(r.dpRank)] = r.endpoint
    if (r.replayEndpoint !== null) e.replay_endpoints[String(r.dpRank)] = r.replayEndpoint
  }
  return [...out.values()]
}

/** The KVR code of a framework refusal (fastify's own errors). */
function codeOf(err: FastifyError | KvrError): { code: ErrorCode; status: number } {
  if (isKvrError(err)) return { code: err.code, status: err.statusCode }
  const f = err as FastifyError
  if (f.validation !== undefined) return { code: 'KVR_ERR_INVALID_REQUEST', status: 400 }
  switch (f.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { code: 'KVR_ERR_BODY_TOO_LARGE', status: 413 }
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return { code: f.statusCode === 415 ? 'KVR_ERR_UNSUPPORTED_MEDIA_TYPE' : 'KVR_ERR_INVALID_REQUEST', status: f.statusCode ?? 400 }
    default:
      if (f.statusCode !== undefined && f.statusCode >= 400 && f.statusCode < 500) return { code: 'KVR_ERR_INVALID_REQUEST', status: f.statusCode }
      return { code: 'KVR_ERR_UPSTREAM', status: 500 }
  }
}

export interface IndexerServerDeps {
  registry: IndexerRegistry
  pool: ShardPool
  metrics: IndexerMetrics
}

export function buildIndexerServer(d: IndexerServerDeps): FastifyInstance {
  const { registry, pool, metrics } = d
  const app = Fastify({
    bodyLimit: BODY_LIMIT_BYTES,
    logger: false,
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, allErrors: false } },
  })
  app.removeContentTypeParser(['application/json', 'text/plain'])
  app.addContentTypeParser('application/json', { parseAs: 'string', bodyLimit: BODY_LIMIT_BYTES }, (_req, body, done) => {
    try {
      done(null, body === '' ? undefined : parseJsonExact(body as string, { signed: true }))
    } catch (e) {
      done(new KvrError('KVR_ERR_INVALID_REQUEST', `malformed JSON: ${(e as Error).message}`), undefined)
    }
  })

  const refuse = (reply: FastifyReply, route: string, status: number, code: ErrorCode, message: string): FastifyReply => {
    metrics.rejected(route, code)
    return reply
      .code(status)
      .type('application/json')
      .send(JSON.stringify({ error: message, code }))
  }
  app.setErrorHandler((err: FastifyError | KvrError, req, reply) => {
    const { code, status } = codeOf(err)
    const route = req.routeOptions.url ?? 'unknown'
    if (status >= 500) log.error({ err, route }, 'indexer route failed')
    const message = (err as FastifyError).validation !== undefined ? `invalid body: ${err.message}` : status >= 500 ? 'internal error' : err.message
    return refuse(reply, route, status, code, message)
  })
  app.setNotFoundHandler((req, reply) => refuse(reply, 'unknown', 404, 'KVR_ERR_NOT_FOUND', `no route ${req.method} ${req.url.split('?')[0]}`))

  const json = (reply: FastifyReply, status: number, value: unknown): FastifyReply => reply.code(status).type('application/json').send(serializeJson(value))
  const ok = { status: 'ok' }

  app.post('/register', { schema: { body: registerSchema } }, async (req, reply) => {
    const b = req.body as Body
    await registry.register({
      instanceId: readU64(b.instance_id, 'instance_id'),
      dpRank: rankOf(b.dp_rank) ?? 0,
      modelName: modelOf(b),
      routingGroup: groupOf(b),
      blockSize: b.block_size as number,
      endpoint: b.endpoint as string,
      replayEndpoint: optStr(b.replay_endpoint),
    })
    metrics.registrations++
    return json(reply, 201, ok)
  })

  app.post('/unregister', { schema: { body: unregisterSchema } }, async (req, reply) => {
    const b = req.body as Body
    const group = typeof b.routing_group === 'string' ? b.routing_group : null
    await registry.unregister(readU64(b.instance_id, 'instance_id'), modelOf(b), group, rankOf(b.dp_rank))
    return json(reply, 200, ok)
  })

  app.get('/workers', async (req, reply) => {
    const q = req.query as Record<string, unknown>
    const str = (v: unknown): string | null => (typeof v === 'string' ? v : null)
    return json(reply, 200, workerEntries(registry.list(str(q.model_name), str(q.routing_group))))
  })

  // /query takes its body as bytes: token_ids go straight into a reused Uint32Array, checked as
  // they are read, where a JSON.parse and a schema would box and check 4,096 numbers one by one;
  // the small members are checked as the schema has them.
  app.register(async (scope) => {
    rawBodyParser(scope, BODY_LIMIT_BYTES)
    const scanner = new RouteBodyScanner()
    scope.post('/query', async (req, reply) => {
      const body = scanner.scan(req.body as Buffer)
      const b = body.rest
      checkQueryMembers(b)
      if (body.tokens === null) throw new KvrError('KVR_ERR_INVALID_REQUEST', "invalid body: body must have required property 'token_ids'")
      const g = registry.group(modelOf(b), groupOf(b))
      const started = performance.now()
      // hashed before the first await: the tokens are a view into the scanner's buffer
      const r = await registry.queryTokens(g, body.tokens, optStr(b.lora_name), optStr(b.cache_salt))
      metrics.query('query', performance.now() - started)
      return json(reply, 200, r)
    })
  })

  app.post('/query_by_hash', { schema: { body: queryByHashSchema } }, async (req, reply) => {
    const b = req.body as Body
    if (b.cache_salt !== undefined && b.cache_salt !== null) {
      throw new KvrError('KVR_ERR_INVALID_REQUEST', 'cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt')
    }
    const g = registry.group(modelOf(b), groupOf(b))
    const hashes = (b.block_hashes as unknown[]).map(hashBits)
    const started = performance.now()
    const r = await registry.queryHashes(g, hashes)
    metrics.query('query_by_hash', performance.now() - started)
    return json(reply, 200, r)
  })

  app.get('/dump', async (_req, reply) => {
    const events = await pool.dump()
    const out: Record<string, { block_size: number; events: unknown[] }> = {}
    for (const g of registry.allGroups()) out[`${g.modelName}:${g.routingGroup}`] = { block_size: g.blockSize, events: [] }
    for (const ev of events) {
      const reg = registry.registrationOf(ev.worker_id)
      if (reg === undefined) continue
      const entry = out[`${reg.modelName}:${reg.routingGroup}`]
      if (entry === undefined) continue
      const rank = ev.event.dp_rank === 0 ? reg.dpRank : ev.event.dp_rank
      entry.events.push({ ...ev, worker_id: reg.instanceId, event: { ...ev.event, dp_rank: rank } })
    }
    return json(reply, 200, out)
  })

  // kv-router's own: what a recovering indexer loads (registrations, then the binary snapshot)
  app.get('/snapshot', async (_req, reply) =>
    reply
      .code(200)
      .type('application/octet-stream')
      .send(Buffer.from(await pool.snapshot())),
  )

  app.post('/register_peer', { schema: { body: peerSchema } }, async (req, reply) => {
    registry.peers.add((req.body as { url: string }).url)
    return json(reply, 201, ok)
  })
  app.post('/deregister_peer', { schema: { body: peerSchema } }, async (req, reply) => {
    if (registry.peers.delete((req.body as { url: string }).url)) return json(reply, 200, ok)
    return refuse(reply, '/deregister_peer', 404, 'KVR_ERR_NOT_FOUND', 'peer not found')
  })
  app.get('/peers', async (_req, reply) => json(reply, 200, [...registry.peers]))

  app.get('/health', async (_req, reply) => reply.code(200).send())
  // logs go to stderr, which has nothing to reopen: Dynamo answers the same without a log file
  app.post('/reopen_logs', async (_req, reply) => json(reply, 200, ok))
  app.get('/metrics', async (_req, reply) =>
    reply
      .code(200)
      .type(metrics.registry.contentType)
      .send(await metrics.registry.metrics()),
  )
  return app
}
