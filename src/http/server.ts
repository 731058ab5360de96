// The HTTP API (docs/http-api.md) on fastify. Routes:
//   POST /v1/completions, /v1/chat/completions   OpenAI-compatible, proxied (src/http/proxy/proxy.ts)
//   GET  /v1/models
//   POST /v1/route, /v1/overlap                  standalone decision / overlap (hot path: the
//                                                body is scanned, not JSON.parsed: route-body.ts)
//   POST /v1/route/:id/prefill-complete, DELETE /v1/route/:id
//   POST /v1/kv-events                           one RouterEvent or an array
//   GET|POST /v1/workers, DELETE /v1/workers/:id
//   GET  /v1/replicas                            replica sync: this replica and its peers
//   GET|POST /busy_threshold
//   GET  /health, /live, /ready, /metrics
//   GET  /status (and / redirecting there), /v1/status, /v1/status/stream   the live status page
// With --api-key every POST and DELETE needs `Authorization: Bearer KEY`.
import Fastify, { LogController } from 'fastify'
import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import type { Dispatcher } from 'undici'
import type { Router } from '../core/router.js'
import type { TextTokenizer } from '../tokenizer/tokenizer.js'
import { KvrError } from '../errors.js'
import { log } from '../runtime/log.js'
import type { Logger } from '../runtime/log.js'
import { requestLines } from './request-log.js'
import { UpstreamProxy } from './proxy/proxy.js'
import { clientErrorHandler, errorHandler, sendError } from './error-handler.js'
import type { HttpContext } from './context.js'
import { apiKeyAuth } from './plugins/auth.js'
import { jsonParser } from './plugins/parsers.js'
import { drainOnShutdown } from './plugins/shutdown.js'
import type { ShutdownResult } from './plugins/shutdown.js'
import { busyThresholdRoutes } from './routes/busy-threshold.js'
import { healthRoutes } from './routes/health.js'
import { inferenceRoutes } from './routes/inference.js'
import { kvEventRoutes } from './routes/kv-events.js'
import { decisionRoutes } from './routes/route.js'
import { replicaRoutes } from './routes/replicas.js'
import { statusRoutes } from './routes/status.js'
import { workerRoutes } from './routes/workers.js'

export type { ShutdownResult } from './plugins/shutdown.js'

export interface AppOptions {
  router: Router
  tokenizer: TextTokenizer | null
  /** The logger of the app's request lines and of fastify; the process's (src/runtime/log.ts) by default. */
  logger?: Logger
  /**
   * The undici dispatcher the proxy sends upstream requests through, for an embedder that needs
   * its own (TLS settings, an egress proxy); a keep-alive Agent by default. The app does not
   * close a dispatcher it was given.
   */
  dispatcher?: Dispatcher
}

export interface App {
  fastify: FastifyInstance
  proxy: UpstreamProxy
  /** Stops accepting, drains every open request (proxied, or still arriving) up to timeoutMs, then cuts what is left and closes. */
  shutdown(timeoutMs: number): Promise<ShutdownResult>
}

class NoRequestLines extends LogController {
  override incomingRequest(): void {}
  override requestCompleted(): void {}
}

export async function buildApp(opts: AppOptions): Promise<App> {
  const router = opts.router
  const cfg = router.config
  const logger = opts.logger ?? log
  const fastify = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    // fastify's two lines per request are left out (the router writes one of its own), and so is
    // the child logger it would make for each request
    logController: new NoRequestLines(),
    childLoggerFactory: (l) => l,
    bodyLimit: cfg.bodyLimit,
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, allErrors: false } },
    forceCloseConnections: 'idle',
    return503OnClosing: true,
    // a path fastify cannot decode, and Node's parser errors, in the catalogue's JSON like the rest
    frameworkErrors: (err, _req, reply) => void sendError(reply, err),
    clientErrorHandler,
  })
  const proxy = new UpstreamProxy(router, {
    retries: cfg.proxyRetries,
    dispatcher: opts.dispatcher,
    logger,
    requestPlane: router.parts.requestPlane,
    tokenizer: cfg.tokenizer,
  })
  fastify.setErrorHandler(errorHandler)
  fastify.setNotFoundHandler((req, reply) => {
    void sendError(reply, new KvrError('KVR_ERR_NOT_FOUND', `no route ${req.method} ${req.url}`))
  })
  jsonParser(fastify, cfg.bodyLimit)
  apiKeyAuth(fastify, cfg.apiKey, cfg.publicMetrics)
  const drain = drainOnShutdown(fastify, proxy)
  requestLines(fastify, logger)
  const ctx: HttpContext = { router, cfg, tokenizer: opts.tokenizer, proxy, log: logger, closing: drain.closing }
  healthRoutes(fastify, ctx)
  const listWorkers = workerRoutes(fastify, ctx)
  statusRoutes(fastify, ctx, listWorkers)
  replicaRoutes(fastify, ctx)
  busyThresholdRoutes(fastify, ctx)
  await decisionRoutes(fastify, ctx)
  await kvEventRoutes(fastify, ctx)
  inferenceRoutes(fastify, ctx)
  await fastify.ready()
  return { fastify, proxy, shutdown: drain.shutdown }
}
