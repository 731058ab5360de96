// One log line per HTTP request, at info, when it has been answered: the proxy writes the line
// of a proxied completion (it knows the worker, the attempts and the first token), an onResponse
// hook every other. Probes and scrapes log at debug, so a balancer's probe every second does not
// fill the log. Nothing here runs when the level leaves the lines out: the hook is not installed,
// and the proxy checks one boolean.
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { RouteDecision } from '../scheduler/scheduler.js'
import type { Logger } from '../runtime/log.js'
import { writeJsonLine } from '../runtime/log.js'
import { PROXIED, ROUTED } from './request.js'
import type { RequestWithBytes } from './request.js'

const PROBES = new Set(['/health', '/live', '/ready', '/metrics'])

const ms = (x: number): number => Math.round(x * 1000) / 1000

/** The fields of a routing decision in a request line; u64 worker ids as decimal text, exact. */
function decisionFields(d: RouteDecision): string {
  const f = `,"worker_id":"${d.workerId}","dp_rank":${d.dpRank},"overlap_blocks":${d.overlapBlocks}`
  return d.waitedMs > 0 ? `${f},"queued_ms":${ms(d.waitedMs)}` : f
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
    // one string, not an object through pino: the line of every request is on the hot path
    const d = r[ROUTED]
    const fields =
      `,"request_id":${JSON.stringify(req.id)},"method":${JSON.stringify(req.method)},"route":${JSON.stringify(route ?? null)},` +
      `"status":${reply.statusCode}${d === undefined ? '' : decisionFields(d)},"duration_ms":${ms(reply.elapsedTime)}`
    writeJsonLine(logger, probe ? 'debug' : 'info', fields, 'request')
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
  let fields =
    `,"request_id":${JSON.stringify(p.requestId)},"method":"POST","route":${JSON.stringify(p.path)},"status":${status},"model":` +
    `${JSON.stringify(p.model)},"stream":${p.stream}`
  if (p.decision !== null) fields += decisionFields(p.decision)
  if (p.attempts > 1) fields += `,"attempts":${p.attempts}`
  if (p.ttftMs >= 0) fields += `,"ttft_ms":${ms(p.ttftMs)}`
  fields += `,"duration_ms":${ms(durationMs)}`
  if (p.errorCode !== null) fields += `,"code":${JSON.stringify(p.errorCode)}`
  writeJsonLine(logger, 'info', fields, 'request')
}
