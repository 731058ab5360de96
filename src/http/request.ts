// What the routes read of a request beyond its parsed body.
import type { FastifyRequest } from 'fastify'
import type { RouteDecision, RouterConfigOverride } from '../scheduler/scheduler.js'
import { MAX_OBJECTIVE_MS } from '../scheduler/objectives.js'
import { KvrError } from '../errors.js'

/** The bytes a request's JSON body was parsed from. */
export const BODY_BYTES = Symbol('kvr.bodyBytes')
/** Set on an inference request the proxy took: the proxy counts it, with the status its stream ended on. */
export const PROXIED = Symbol('proxied')
/** The decision a /v1/route request made, for its log line (set only while request lines are logged). */
export const ROUTED = Symbol('routed')
export type RequestWithBytes = FastifyRequest & { [BODY_BYTES]?: Buffer; [PROXIED]?: true; [ROUTED]?: RouteDecision }

export function headerValue(req: FastifyRequest, name: string): string | undefined {
  const v = req.headers[name]
  return Array.isArray(v) ? v[0] : v
}

/** A request's router_config_override, validated. */
export function overrides(o: unknown): RouterConfigOverride | undefined {
  if (o === undefined || o === null) return undefined
  if (typeof o !== 'object' || Array.isArray(o)) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'router_config_override must be an object')
  const r = o as Record<string, unknown>
  const out: RouterConfigOverride = {}
  const num = (k: string): number | undefined => {
    const v = r[k]
    if (v === undefined || v === null) return undefined
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
      throw new KvrError('KVR_ERR_INVALID_REQUEST', `router_config_override.${k} must be a number ≥ 0`)
    }
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

/** Where a request's latency objectives go (a RouteInput). */
export interface Objectives {
  ttftObjectiveMs?: number
  tpotObjectiveMs?: number
}

/**
 * A request's latency objectives into `out`: the headers llm-d's endpoint picker reads
 * (x-slo-ttft-ms, x-slo-tpot-ms), else its `slo` object ({ ttft_ms, tpot_ms }; `where` names it in
 * errors). Each a number of ms in (0, 10^7].
 */
export function latencyObjectives(req: FastifyRequest | null, slo: unknown, where: string, out: Objectives): void {
  if (slo !== undefined && slo !== null && (typeof slo !== 'object' || Array.isArray(slo)))
    throw new KvrError('KVR_ERR_INVALID_REQUEST', `${where} must be an object { ttft_ms, tpot_ms }`)
  const body = (slo ?? {}) as Record<string, unknown>
  const one = (header: string, field: string): number | undefined => {
    const h = req === null ? undefined : headerValue(req, header)
    if (h !== undefined) {
      // a header is text: Number() would read "", " " and "0x10" as numbers
      const v = /^[0-9]+(\.[0-9]+)?$/.test(h.trim()) ? Number(h) : Number.NaN
      return checkObjective(v, header, h)
    }
    const v = body[field]
    if (v === undefined || v === null) return undefined
    return checkObjective(v, `${where}.${field}`, v)
  }
  const ttft = one('x-slo-ttft-ms', 'ttft_ms')
  if (ttft !== undefined) out.ttftObjectiveMs = ttft
  const tpot = one('x-slo-tpot-ms', 'tpot_ms')
  if (tpot !== undefined) out.tpotObjectiveMs = tpot
}

function checkObjective(v: unknown, name: string, given: unknown): number {
  if (typeof v !== 'number' || !(v > 0) || !(v <= MAX_OBJECTIVE_MS))
    throw new KvrError('KVR_ERR_INVALID_REQUEST', `${name} must be a number of milliseconds in (0, 10^7], got ${JSON.stringify(given)}`)
  return v
}
