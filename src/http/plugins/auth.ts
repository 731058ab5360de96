// --api-key: every route but the probes (/health, /ready) and, unless --no-public-metrics,
// /metrics needs `Authorization: Bearer KEY`: reads too, as they show worker URLs and the fleet.
// The status page's HTML (/status, and / that redirects there) is open as well: it holds no data,
// and a browser cannot send the header when it opens it; the page asks for the key and sends it
// to /v1/status*, which need it.
import { timingSafeEqual } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import { KvrError } from '../../errors.js'
import { sendError } from '../error-handler.js'
import { headerValue } from '../request.js'

export function apiKeyAuth(fastify: FastifyInstance, key: string | null, publicMetrics: boolean): void {
  const apiKey = key === null ? null : Buffer.from(key)
  // route patterns, so a query string or a trailing slash does not open or close a route
  const open = new Set(['/health', '/ready', '/', '/status', ...(publicMetrics ? ['/metrics'] : [])])
  if (apiKey !== null) {
    fastify.addHook('onRequest', async (req, reply) => {
      const route = req.routeOptions.url
      if (route !== undefined && open.has(route)) return
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
}
