// The standalone decision routes: /v1/route (decide, and optionally book), /v1/overlap, and the
// release routes of a booking. The hot path: bodies are scanned in place, not JSON.parsed
// (src/codec/route-body.ts).
import type { FastifyInstance } from 'fastify'
import type { RouteInput } from '../../core/router.js'
import { MAX_ISL } from '../../scheduler/scheduler.js'
import type { Candidate } from '../../scheduler/selector.js'
import type { OverlapResult } from '../../shards/pool.js'
import { KvrError } from '../../errors.js'
import { blockHashesInto } from '../../codec/hashing.js'
import { u64ToString } from '../../codec/u64.js'
import { readU64 } from '../../codec/json.js'
import { RouteBodyScanner } from '../../codec/route-body.js'
import type { RouteBody } from '../../codec/route-body.js'
import { rawBodyParser } from '../plugins/parsers.js'
import { ROUTED, latencyObjectives, overrides } from '../request.js'
import type { RequestWithBytes } from '../request.js'
import type { HttpContext } from '../context.js'

/** A candidate's match per storage tier, cumulative: device, then through host, then through disk and external. */
export interface TierBlocks {
  device: number
  host: number
  disk: number
}

/** Each worker-rank's match per tier in an overlap answer, by `worker_id:dp_rank`. */
export function tierBlocksOf(r: OverlapResult): Map<string, TierBlocks> {
  const out = new Map<string, TierBlocks>()
  for (let i = 0; i < r.count; i++) {
    const d = r.overlap[i] as number
    const key = `${u64ToString(r.workerIdLo[i] as number, r.workerIdHi[i] as number)}:${r.dpRank[i]}`
    out.set(key, { device: d, host: r.overlapHost?.[i] ?? d, disk: r.overlapDisk?.[i] ?? d })
  }
  return out
}

/** One row of an explained decision (also the status page's, which has no `tiers`). */
export function candidateJson(c: Candidate, tiers?: Map<string, TierBlocks>): string {
  const id = c.workerId.toString()
  // the latency cost's terms, in seconds, after Dynamo's fields (absent under --router-cost dynamo)
  const terms =
    c.ttftSecs === undefined ? '' : `,"ttft_secs":${c.ttftSecs},"decode_slowdown_secs":${c.slowdownSecs ?? 0},"queueing_secs":${c.queueingSecs ?? 0}`
  // a request with latency objectives: the predicted TPOT there and whether both predictions meet them
  const objectives = c.meetsObjectives === undefined ? '' : `,"tpot_secs":${c.tpotSecs ?? 0},"meets_objectives":${c.meetsObjectives}`
  const tiered = tiers === undefined ? '' : tierJson(tiers.get(`${id}:${c.dpRank}`))
  return (
    `{"worker_id":${id},"worker_id_str":"${id}","dp_rank":${c.dpRank},"overlap_blocks":${c.overlapBlocks},"prefill_blocks":${c.prefillBlocks},` +
    `"decode_blocks":${c.decodeBlocks},"logit":${Number.isFinite(c.logit) ? c.logit : 'null'}` +
    `${c.treeSize === undefined ? '' : `,"tree_size":${c.treeSize}`}${terms}${objectives}${tiered}}`
  )
}

/** overlap_blocks is these weighted (--router-host-cache-hit-weight, --router-disk-cache-hit-weight). */
function tierJson(t: TierBlocks | undefined): string {
  return `,"device_blocks":${t?.device ?? 0},"host_blocks":${t?.host ?? 0},"disk_blocks":${t?.disk ?? 0}`
}

/** Registers the routes in their own scope, where bodies arrive as bytes. */
export async function decisionRoutes(fastify: FastifyInstance, ctx: HttpContext): Promise<void> {
  const { router, cfg } = ctx
  // the decision goes into the request's log line, when there is one
  const logged = ctx.log.isLevelEnabled('info')
  await fastify.register(async (scope) => {
    const scanner = new RouteBodyScanner()
    rawBodyParser(scope, cfg.bodyLimit)

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
        if (typeof r !== 'number' || !Number.isInteger(r) || r < 0 || r > 0xffffffff)
          throw new KvrError('KVR_ERR_INVALID_REQUEST', 'dp_rank must be an integer in [0, 2^32)')
        if (input.workerId === undefined) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'dp_rank needs the worker it belongs to (worker_id)')
        input.dpRank = r
      }
      if (rest.priority !== undefined && rest.priority !== null) {
        const p = rest.priority
        // i32 as Dynamo's agent_hints.priority, and as the completions routes' schema has it
        if (typeof p !== 'number' || !Number.isInteger(p) || p < -2147483648 || p > 2147483647)
          throw new KvrError('KVR_ERR_INVALID_REQUEST', `priority must be an integer in [-2^31, 2^31), got ${JSON.stringify(p)}`)
        input.priority = p
      }
      // the body's slo only: a client of /v1/route states its objectives where it states its priority
      latencyObjectives(null, rest.slo, 'slo', input)
      if (rest.isl !== undefined) {
        const n = rest.isl
        if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > MAX_ISL)
          throw new KvrError('KVR_ERR_INVALID_REQUEST', `isl must be an integer in [0, 2^32), got ${JSON.stringify(n)}`)
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
        if (id !== undefined && (typeof id !== 'string' || id.length === 0 || id.length > 256))
          throw new KvrError('KVR_ERR_INVALID_REQUEST', 'request_id must be a non-empty string (≤ 256 chars)')
        if (id !== undefined && router.requestIds.isOurs(id as string))
          throw new KvrError(
            'KVR_ERR_INVALID_REQUEST',
            `request_id ${JSON.stringify(id)} is in the router's own id space (ids it makes begin with ` +
              `${JSON.stringify(router.requestIds.prefix)}): choose another`,
          )
        input.id = (id as string | undefined) ?? router.requestIds.create()
      }
      const { decision, overlap } = await router.route(input)
      if (logged) (req as RequestWithBytes)[ROUTED] = decision
      const wid = decision.workerId.toString()
      let s = `{"worker_id":${wid},"worker_id_str":"${wid}","dp_rank":${decision.dpRank},"overlap_blocks":${decision.overlapBlocks},"candidates":[`
      const cs = decision.candidates ?? []
      const tiers = tierBlocksOf(overlap)
      for (let i = 0; i < cs.length; i++) s += (i === 0 ? '' : ',') + candidateJson(cs[i] as Candidate, tiers)
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
        const wid = u64ToString(r.workerIdLo[i] as number, r.workerIdHi[i] as number)
        const tiers = r.overlapHost === undefined ? '' : `,"host_blocks":${r.overlapHost[i]},"disk_blocks":${r.overlapDisk?.[i] ?? r.overlapHost[i]}`
        scores.push(
          `{"worker_id":${wid},"worker_id_str":"${wid}","dp_rank":${r.dpRank[i]},"overlap_blocks":${r.overlap[i]},"tree_size":${r.treeSize[i]}${tiers}}`,
        )
      }
      return reply
        .header('content-type', 'application/json')
        .send(`{"blocks":${lo.length},"block_size":${bs},"scores":[${scores.join(',')}],"recovering_shards":${JSON.stringify(r.recoveringShards)}}`)
    })

    scope.post('/v1/route/:id/prefill-complete', async (req, reply) => {
      const id = (req.params as { id: string }).id
      if (router.requestIds.isProxied(id)) throw proxiedBooking(id)
      if (!router.scheduler.markPrefillComplete(id)) throw new KvrError('KVR_ERR_UNKNOWN_REQUEST', `no booked request ${id}`)
      return reply.send({ request_id: id, prefill_complete: true })
    })
    scope.delete('/v1/route/:id', async (req, reply) => {
      const id = (req.params as { id: string }).id
      if (router.requestIds.isProxied(id)) throw proxiedBooking(id)
      if (!router.scheduler.free(id)) throw new KvrError('KVR_ERR_UNKNOWN_REQUEST', `no booked request ${id}`)
      return reply.send({ request_id: id, released: true })
    })
  })
}

/** A booking of a request the router proxies: it follows that request, not the release routes. */
const proxiedBooking = (id: string): KvrError =>
  new KvrError(
    'KVR_ERR_UNKNOWN_REQUEST',
    `no request booked through /v1/route has the id ${id}: it is one the router is proxying, whose booking ends with its stream`,
  )
