// One log line per HTTP request, at info, when it has been answered: the proxy writes the line
// of a proxied completion (it knows the worker, the attempts and the first token), an onResponse
// hook every other. Probes and scrapes log at debug, so a balancer's probe every second does not
// fill the log. Nothing here runs when the level leaves the lines out: the hook is not installed,
// and the proxy checks one boolean.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { RouteDecision } from '../scheduler/scheduler.js'
import type { Logger } from '../runtime/log.js'
import { PROXIED, ROUTED } from './request.js'
import type { RequestWithBytes } from './request.js'

const PROBES = new Set(['/health', '/live', '/ready', '/metrics'])

const ms = (x: number): number => Math.round(x * 1000) / 1000

/** The fields of a routing decision in a request line; u64 worker ids as decimal text, exact. */
function decisionFields(o: Record<string, unknown>, d: RouteDecision): void {
  o.worker_id = d.workerId.toString()
  o.dp_rank = d.dpRank
  o.overlap_blocks = d.overlapBlocks
  if (d.waitedMs > 0) o.queued_ms = ms(d.waitedMs)
}

/** Installs the line of every request the proxy does not answer itself. */
export function requestLines(fastify: FastifyInstance, logger: Logger): void {
  if (!logger.isLevelEnabled('info')) return
  const probes = logger.isLevelEnabled('debug')
  fastify.addHook('onResponse', (req: FastifyRequest, reply: FastifyReply, done: () => void) => {
    const r = req as RequestWithBytes
    if (r[PROXIED] === true) return done()
    // a route's pattern, so ids in paths group and a query string (which may carry anything) stays out
    const route = req.routeOptions.url ?? req.url.split('?', 1)[0]
    const probe = route !== undefined && PROBES.has(route)
    if (probe && !probes) return done()
    const o: Record<string, unknown> = { request_id: req.id, method: req.method, route, status: reply.statusCode }
    const d = r[ROUTED]
    if (d !== undefined) decisionFields(o, d)
    o.duration_ms = ms(reply.elapsedTime)
    if (probe) logger.debug(o, 'request')
    else logger.info(o, 'request')
    done()
  })
}

/** What the line of a proxied completion says. */
export interface ProxiedRequest {
  readonly path: string
  readonly model: string
  readonly stream: boolean
  /** The id the worker got as x-request-id (the last attempt's), or the request's own before any booking. */
  readonly requestId: string
  /** The last attempt's decision; null when none was made. */
  readonly decision: RouteDecision | null
  readonly attempts: number
  /** Booking to the first token of a streamed answer; -1 when none came. */
  readonly ttftMs: number
  /** The error code the client got, or null. */
  readonly errorCode: string | null
}

export function proxiedLine(logger: Logger, p: ProxiedRequest, status: number, durationMs: number): void {
  const o: Record<string, unknown> = { request_id: p.requestId, method: 'POST', route: p.path, status, model: p.model, stream: p.stream }
  if (p.decision !== null) decisionFields(o, p.decision)
  if (p.attempts > 1) o.attempts = p.attempts
  if (p.ttftMs >= 0) o.ttft_ms = ms(p.ttftMs)
  o.duration_ms = ms(durationMs)
  if (p.errorCode !== null) o.code = p.errorCode
  logger.info(o, 'request')
}
