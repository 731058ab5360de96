// The composition root of `kv-router serve`: the router core, the HTTP server and, with
// --embedded-fleet, the simulated engines the serve command hands in. A part that fails to start
// is a FatalError: one line on stderr and exit status 2, as for a bad option.
import type { ServeConfig } from './config.js'
import { buildApp } from './http/server.js'
import type { App } from './http/server.js'
import { Router } from './core/router.js'
import type { RouterEvent } from './codec/events.js'
import type { TextTokenizer } from './tokenizer/tokenizer.js'
import { isKvrError } from './errors.js'
import { U64_MAX } from './codec/u64.js'
import { FatalError } from './runtime/fatal.js'
import { settleHeap } from './runtime/heap-settle.js'
import { hostname } from 'node:os'

/** Engines run in this process, their KV events handed straight to the router. */
export interface EmbeddedEngines {
  readonly workers: readonly { readonly workerId: bigint; readonly url: string; readonly capacity: number; readonly maxNumBatchedTokens: number }[]
  close(): Promise<void>
}

/** Starts `count` engines numbered from `firstWorkerId`, each KV event given to `onEvent`. */
export type StartEmbedded = (count: number, firstWorkerId: bigint, onEvent: (ev: RouterEvent) => void) => Promise<EmbeddedEngines>

export interface RunningApp {
  readonly router: Router
  readonly app: App
  readonly embedded: EmbeddedEngines | null
  /** The port the HTTP server listens on. */
  readonly port: number
}

/** Starts the router and its HTTP server, listening when it returns. Throws FatalError for a part that does not start. */
export async function startApp(cfg: ServeConfig, tokenizer: TextTokenizer | null, startEmbedded: StartEmbedded | null): Promise<RunningApp> {
  // The embedded engines are numbered after the largest static --worker id: a --worker without an
  // id takes its position (1, 2, …), and an engine given the same id would silently replace it.
  const firstEmbeddedId = cfg.workers.reduce((max, w) => (w.id > max ? w.id : max), 0n) + 1n
  if (cfg.embeddedFleet > 0 && firstEmbeddedId + BigInt(cfg.embeddedFleet - 1) > U64_MAX) {
    throw new FatalError(`serve: --embedded-fleet: no room for ${cfg.embeddedFleet} worker id(s) after the largest --worker id ${firstEmbeddedId - 1n}`)
  }
  let router: Router
  try {
    router = await Router.start(cfg)
  } catch (err) {
    // an unreachable NATS or etcd at start: the message names the URL and what failed
    if (isKvrError(err)) throw new FatalError(`serve: ${err.message}`)
    throw err
  }
  let app: App
  try {
    app = await buildApp({ router, tokenizer })
  } catch (err) {
    await router.close()
    throw err
  }
  let embedded: EmbeddedEngines | null = null
  try {
    if (cfg.embeddedFleet > 0 && startEmbedded !== null) embedded = await startEmbedded(cfg.embeddedFleet, firstEmbeddedId, (ev) => router.ingestEvent(ev))
    for (const e of embedded?.workers ?? [])
      await router.addWorker({ id: e.workerId, url: e.url, capacity: e.capacity, maxNumBatchedTokens: e.maxNumBatchedTokens, eventsInProcess: true })
  } catch (err) {
    // a start-up failure is one line, as for every other part of serve, not a stack trace
    await embedded?.close()
    await router.close()
    throw new FatalError(`serve: --embedded-fleet: the simulated engines did not start: ${(err as Error).message}`)
  }
  try {
    await app.fastify.ready()
    settleHeap()
    await app.fastify.listen({ host: cfg.httpHost, port: cfg.httpPort })
  } catch (err) {
    throw new FatalError(`serve: cannot listen on ${cfg.httpHost}:${cfg.httpPort}: ${(err as Error).message}`)
  }
  const addr = app.fastify.server.address()
  const port = typeof addr === 'object' && addr !== null ? addr.port : cfg.httpPort
  // the address peers and the registry show: the host's name when listening on every interface
  const host = cfg.httpHost === '0.0.0.0' || cfg.httpHost === '::' ? hostname() : cfg.httpHost
  await router.advertise(`http://${host.includes(':') ? `[${host}]` : host}:${port}`)
  return { router, app, embedded, port }
}
