// Shared setup for the HTTP tests: a router with one shard and the fastify app, driven through
// inject(); and tiny upstream servers whose behaviour each test scripts.
import { createServer } from 'node:http'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Dispatcher } from 'undici'
import { parseServeConfig } from '../../src/config.js'
import type { ServeConfig } from '../../src/config.js'
import { buildApp } from '../../src/http/server.js'
import type { App } from '../../src/http/server.js'
import { Router } from '../../src/core/router.js'
import type { TextTokenizer } from '../../src/tokenizer/tokenizer.js'

export interface Harness {
  router: Router
  app: App
  close(): Promise<void>
}

export function config(argv: string[] = [], env: NodeJS.ProcessEnv = {}): ServeConfig {
  // no recovery probes (POST /v1/kv/query) and no health probes (GET /health) unless a test
  // asks: its scripted upstreams would take them for requests of their own
  const c = parseServeConfig(
    ['--router-event-threads', '1', '--seed', '7', '--no-router-event-recovery', '--router-health-probe-interval-secs', '0', ...argv],
    env,
  )
  if (c === 'help') throw new Error('unexpected help')
  return c
}

export async function harness(argv: string[] = [], tokenizer: TextTokenizer | null = null, dispatcher?: Dispatcher): Promise<Harness> {
  const router = await Router.start(config(argv))
  const app = await buildApp({ router, tokenizer, dispatcher })
  return {
    router,
    app,
    async close() {
      await app.shutdown(1000)
      await router.close()
    },
  }
}

/** An upstream's answer to one request; `raw` is the body's bytes as they arrived. */
export type Handler = (req: IncomingMessage, body: string, res: ServerResponse, raw: Buffer) => void | Promise<void>

export async function upstream(handler: Handler): Promise<{ url: string; server: Server; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const raw = Buffer.concat(chunks)
      void handler(req, raw.toString('utf8'), res, raw)
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  return {
    url,
    server,
    async close() {
      server.closeAllConnections()
      await new Promise<void>((r) => server.close(() => r()))
    },
  }
}

/**
 * A router (block size 2) with the tokenizer `tok` and one worker (id 1) that answers every
 * request with the body it got; the test's teardown closes all three, the tokenizer last.
 */
export async function tokenizedRouter(t: { teardown(fn: () => Promise<void>): void }, tok: TextTokenizer): Promise<Harness> {
  const h = await harness(['--router-block-size', '2'], tok)
  const s = await upstream((_req, body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ echo: JSON.parse(body) as unknown }))
  })
  t.teardown(async () => {
    await h.close()
    await s.close()
    await tok.close()
  })
  await h.router.addWorker({ id: 1n, url: s.url })
  return h
}

export function tokens(n: number, from = 0): number[] {
  return Array.from({ length: n }, (_, i) => from + i)
}

export function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms
  return new Promise((resolve, reject) => {
    const tick = (): void => {
      if (cond()) resolve()
      else if (Date.now() > end) reject(new Error('condition not reached'))
      else setTimeout(tick, 5)
    }
    tick()
  })
}

/** One SSE event carrying `obj`. */
export const sse = (obj: unknown): string => `data: ${JSON.stringify(obj)}\n\n`

/** An OpenAI-style completion chunk with `text`. */
export const chunk = (text: string) => ({ id: 'c', object: 'text_completion', created: 1, model: 'm', choices: [{ index: 0, text, finish_reason: null }] })

/** Scripted upstreams registered as workers 100, 101, ... of `h`; close() removes and stops them. */
export async function workerFleet(h: Harness, handlers: Handler[]) {
  const servers: Awaited<ReturnType<typeof upstream>>[] = []
  for (let i = 0; i < handlers.length; i++) {
    const s = await upstream(handlers[i] as Handler)
    servers.push(s)
    await h.router.addWorker({ id: BigInt(100 + i), url: s.url })
  }
  return {
    servers,
    async close() {
      for (let i = 0; i < servers.length; i++) {
        await h.router.removeWorker(BigInt(100 + i))
        await servers[i]?.close()
      }
    },
  }
}

/** Sum of a metric's samples on `hh`'s /metrics whose labels include all of `labels`. */
export async function metricSum(hh: Harness, name: string, labels: Record<string, string> = {}): Promise<number> {
  const body = (await hh.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  let sum = 0
  for (const line of body.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue
    sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return sum
}

/** Starts `hh`'s app on a free loopback port and returns the port. */
export async function listening(hh: Harness): Promise<number> {
  await hh.app.fastify.listen({ host: '127.0.0.1', port: 0 })
  return (hh.app.fastify.server.address() as AddressInfo).port
}
