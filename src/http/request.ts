// What the routes read of a request beyond its parsed body.
import type { FastifyRequest } from 'fastify'
import type { RouteDecision, RouterConfigOverride } from '../scheduler/scheduler.js'
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
