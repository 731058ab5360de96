#!/usr/bin/env node
// The `kv-router` executable: `serve` (the router) and a minimal `mocker` (simulated engines
// that POST their KV events to a router; the full mocker is a later issue). Invalid options exit
// with status 2 and one line naming the option and what it accepts.
import { readFileSync } from 'node:fs'
import { ConfigError, parseServeConfig, serveHelp } from './config.js'
import type { ServeConfig } from './config.js'
import { buildApp } from './http/app.js'
import type { App } from './http/app.js'
import { Router } from './router.js'
import { SimEngine, startFleet } from './sim-engine.js'
import { loadTokenizer } from './tokenizer.js'
import type { TextTokenizer } from './tokenizer.js'
import { isKvrError } from './shared/errors.js'

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }

const usage = `kv-router ${pkg.version} — KV-cache-aware request router for LLM inference fleets

usage: kv-router <command> [options]

commands:
  serve     run the router (kv-router serve --help for its options)
  mocker    run simulated engines that register with a router and post their KV events
  replay    replay a Mooncake trace against a router (not available yet: issue #7)

options:
  -h, --help     show this help
  -v, --version  print the version
`

const mockerHelp = `usage: kv-router mocker --router-url URL [options]

  --router-url URL        router to register with and post KV events to (required)
  --num-workers N         engines to start (default 1)
  --block-size N          KV block size in tokens (default 128; must match the router's)
  --capacity N            KV blocks per engine (default 4096)
  --first-worker-id N     worker id of the first engine (default 1000)
  --host HOST             address the engines listen on (default 127.0.0.1)
  --ttft-ms N, --itl-ms N simulated delays (default 5 and 2)
  --api-key KEY           the router's --api-key
`

function die(line: string): never {
  process.stderr.write(`kv-router: ${line}\n`)
  process.exit(2)
}

async function serve(argv: string[]): Promise<void> {
  let cfg: ServeConfig | 'help'
  try {
    cfg = parseServeConfig(argv)
  } catch (err) {
    if (err instanceof ConfigError) die(`serve: ${err.message}`)
    throw err
  }
  if (cfg === 'help') {
    process.stdout.write(serveHelp())
    return
  }
  let tokenizer: TextTokenizer | null
  try {
    tokenizer = await loadTokenizer(cfg.tokenizer, cfg.tokenizerThreads)
  } catch (err) {
    if (isKvrError(err)) die(`serve: ${err.message}`)
    throw err
  }
  let router: Router
  try {
    router = await Router.start(cfg)
  } catch (err) {
    // an unreachable NATS or etcd at start: the message names the URL and what failed
    if (isKvrError(err)) die(`serve: ${err.message}`)
    throw err
  }
  let app: App
  try {
    app = await buildApp({ router, tokenizer })
  } catch (err) {
    await router.close()
    throw err
  }
  const fleet: SimEngine[] =
    cfg.embeddedFleet > 0 ? await startFleet(cfg.embeddedFleet, cfg.blockSize, (ev) => router.ingestEvent(ev), { capacity: 16384 }) : []
  for (const e of fleet) await router.addWorker({ id: e.workerId, url: e.url, capacity: e.capacity })
  try {
    await app.fastify.listen({ host: cfg.httpHost, port: cfg.httpPort })
  } catch (err) {
    die(`serve: cannot listen on ${cfg.httpHost}:${cfg.httpPort}: ${(err as Error).message}`)
  }
  const addr = app.fastify.server.address()
  const port = typeof addr === 'object' && addr !== null ? addr.port : cfg.httpPort
  process.stdout.write(
    `kv-router listening on http://${cfg.httpHost}:${port} (mode ${cfg.mode}, block size ${cfg.blockSize}, ${router.pool.size} shard(s), ${router.workers().length} worker(s)${fleet.length > 0 ? `, ${fleet.length} embedded simulated` : ''})\n`,
  )
  let stopping = false
  const stop = (signal: string): void => {
    if (stopping) return
    stopping = true
    process.stdout.write(`kv-router: ${signal}: draining ${app.proxy.inFlight} in-flight request(s)\n`)
    void (async () => {
      const drained = await app.shutdown(cfg.shutdownTimeoutSecs * 1000)
      for (const e of fleet) await e.close()
      await router.close()
      await tokenizer?.close()
      process.stdout.write(`kv-router: stopped${drained ? '' : ' (drain timed out)'}\n`)
      process.exit(0)
    })()
  }
  process.on('SIGTERM', () => stop('SIGTERM'))
  process.on('SIGINT', () => stop('SIGINT'))
}

function flagValue(argv: string[], name: string): string | undefined {
  const i = argv.findIndex((a) => a === name || a.startsWith(`${name}=`))
  if (i < 0) return undefined
  const a = argv[i] as string
  return a.includes('=') ? a.slice(a.indexOf('=') + 1) : argv[i + 1]
}

function intFlag(argv: string[], name: string, dflt: number, min: number, max: number): number {
  const v = flagValue(argv, name)
  if (v === undefined) return dflt
  const n = Number(v)
  if (!/^[0-9]+$/.test(v) || n < min || n > max) die(`mocker: ${name} must be an integer in [${min}, ${max}], got ${JSON.stringify(v)}`)
  return n
}

async function mocker(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(mockerHelp)
    return
  }
  const routerUrl = flagValue(argv, '--router-url')
  if (routerUrl === undefined || !/^https?:\/\//.test(routerUrl)) die('mocker: --router-url must be a URL (http://host:port)')
  const n = intFlag(argv, '--num-workers', 1, 1, 256)
  const bs = intFlag(argv, '--block-size', 128, 1, 65536)
  const capacity = intFlag(argv, '--capacity', 4096, 1, 1 << 26)
  const first = intFlag(argv, '--first-worker-id', 1000, 0, Number.MAX_SAFE_INTEGER)
  const ttftMs = intFlag(argv, '--ttft-ms', 5, 0, 60_000)
  const itlMs = intFlag(argv, '--itl-ms', 2, 0, 60_000)
  const apiKey = flagValue(argv, '--api-key')
  const host = flagValue(argv, '--host') ?? '127.0.0.1'
  const engines: SimEngine[] = []
  const headers: Record<string, string> = { 'content-type': 'application/json' }
  if (apiKey !== undefined) headers.authorization = `Bearer ${apiKey}`
  for (let i = 0; i < n; i++) {
    const o: ConstructorParameters<typeof SimEngine>[0] = { workerId: BigInt(first + i), blockSize: bs, capacity, host, routerUrl, ttftMs, itlMs }
    if (apiKey !== undefined) o.apiKey = apiKey
    const e = new SimEngine(o)
    await e.listen()
    const res = await fetch(`${routerUrl}/v1/workers`, { method: 'POST', headers, body: JSON.stringify({ id: String(e.workerId), url: e.url, block_size: bs, capacity }) })
    if (!res.ok) die(`mocker: the router refused worker ${e.workerId}: ${res.status} ${await res.text()}`)
    engines.push(e)
  }
  process.stdout.write(`kv-router mocker: ${n} engine(s) registered with ${routerUrl}: ${engines.map((e) => e.url).join(' ')}\n`)
  const stop = (): void => {
    void Promise.all(engines.map((e) => e.close())).then(() => process.exit(0))
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

const [command, ...rest] = process.argv.slice(2)
if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
  process.stdout.write(usage)
} else if (command === '-v' || command === '--version') {
  process.stdout.write(`${pkg.version}\n`)
} else if (command === 'serve') {
  await serve(rest)
} else if (command === 'mocker') {
  await mocker(rest)
} else if (command === 'replay') {
  process.stderr.write('kv-router replay: not available in this build yet (issue #7)\n')
  process.exitCode = 2
} else {
  process.stderr.write(`kv-router: unknown command "${command}"\n\n${usage}`)
  process.exitCode = 2
}
