#!/usr/bin/env -S node --min-semi-space-size=64 --max-semi-space-size=64 --no-memory-reducer --heap-growing-percent=100 --initial-old-space-size=128
// The `kv-router` executable: `serve` (the router), `mocker` (simulated engines, src/mocker/)
// and `replay`. Invalid options exit with status 2 and one line naming the option and what it
// accepts.
import { readFileSync } from 'node:fs'
import { ConfigError, parseServeConfig, serveHelp } from './config.js'
import type { ServeConfig } from './config.js'
import { buildApp } from './http/server.js'
import type { App } from './http/server.js'
import { Router } from './core/router.js'
import { MockerFleet } from './sim/mocker/fleet.js'
import { loadTokenizer } from './tokenizer/tokenizer.js'
import type { TextTokenizer } from './tokenizer/tokenizer.js'
import { isKvrError } from './errors.js'
import { U64_MAX } from './codec/u64.js'
import { die } from './cli/flags.js'
import { settleHeap } from './runtime/heap-settle.js'
import { applyNice } from './runtime/nice.js'
import { workerHeapsAtDefaults } from './runtime/v8-flags.js'

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }

const usage = `kv-router ${pkg.version} — KV-cache-aware request router for LLM inference fleets

usage: kv-router <command> [options]

commands:
  serve     run the router (kv-router serve --help for its options)
  mocker    run simulated vLLM-like engines (kv-router mocker --help for its options)
  replay    replay a Mooncake trace against a router, with TTFT, ITL and hit-rate figures

options:
  -h, --help     show this help
  -v, --version  print the version
`


/**
 * Options accepted under Dynamo's names for drop-in command lines, whose features are later
 * issues: said at start-up rather than ignored silently.
 */
function notYetInEffect(cfg: ServeConfig): string[] {
  const out: string[] = []
  if (cfg.replicaSync) out.push('--router-replica-sync has no effect yet: bookings are not shared between replicas')
  if (cfg.durableKvEvents) out.push('--router-durable-kv-events has no effect yet: events are read from core NATS, not JetStream')
  if (cfg.resetStates) out.push('--router-reset-states has no effect yet (JetStream only)')
  if (cfg.snapshotThreshold !== 1_000_000) out.push('--router-snapshot-threshold has no effect yet (JetStream only)')
  return out
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
  for (const line of notYetInEffect(cfg)) process.stderr.write(`kv-router: warning: ${line}\n`)
  // before any thread of ours starts: shards and tokenizers inherit the main thread's niceness
  if (cfg.nice !== null) {
    try {
      applyNice(cfg.nice)
    } catch (err) {
      if (isKvrError(err)) die(`serve: ${err.message}`)
      throw err
    }
  }
  let tokenizer: TextTokenizer | null
  try {
    tokenizer = await loadTokenizer(cfg.tokenizer, cfg.tokenizerThreads)
  } catch (err) {
    if (isKvrError(err)) die(`serve: ${err.message}`)
    throw err
  }
  // an engine renders chat with the model's template; without it the router hashes other tokens
  if (tokenizer?.kind === 'hf' && tokenizer.chatTemplate === null) {
    process.stderr.write(`kv-router: warning: no chat template beside ${cfg.tokenizer ?? ''} (chat_template.jinja, or chat_template in tokenizer_config.json): chat requests are tokenized with kv-router's own template, which engines do not use, so they will not match cached prefixes\n`)
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
  // The embedded fleet (`npm start`): mocker engines in this process, their KV events handed
  // straight to the shards. Sped up 10×, so a short demo request answers in milliseconds while
  // the timing model still orders prefill and decode costs as a real engine would.
  // Numbered after the largest static --worker id: a --worker without an id takes its position
  // (1, 2, …), and an engine given the same id would silently replace it.
  const firstEmbeddedId = cfg.workers.reduce((max, w) => (w.id > max ? w.id : max), 0n) + 1n
  if (cfg.embeddedFleet > 0 && firstEmbeddedId + BigInt(cfg.embeddedFleet - 1) > U64_MAX) {
    die(`serve: --embedded-fleet: no room for ${cfg.embeddedFleet} worker id(s) after the largest --worker id ${firstEmbeddedId - 1n}`)
  }
  let embedded: MockerFleet | null = null
  try {
    if (cfg.embeddedFleet > 0) embedded = await MockerFleet.start({ numWorkers: cfg.embeddedFleet, firstWorkerId: firstEmbeddedId, blockSize: cfg.blockSize, numGpuBlocks: 16384, speedupRatio: 10, modelName: cfg.modelName, onEvent: (ev) => router.ingestEvent(ev) })
    for (const e of embedded?.workers ?? []) await router.addWorker({ id: e.workerId, url: e.url, capacity: e.capacity, maxNumBatchedTokens: e.engine.config.maxNumBatchedTokens })
  } catch (err) {
    // a start-up failure is one line, as for every other part of serve, not a stack trace
    await embedded?.close()
    await router.close()
    die(`serve: --embedded-fleet: the simulated engines did not start: ${(err as Error).message}`)
  }
  const fleet = embedded?.workers ?? []
  try {
    await app.fastify.ready()
    settleHeap()
    await app.fastify.listen({ host: cfg.httpHost, port: cfg.httpPort })
  } catch (err) {
    die(`serve: cannot listen on ${cfg.httpHost}:${cfg.httpPort}: ${(err as Error).message}`)
  }
  const addr = app.fastify.server.address()
  const port = typeof addr === 'object' && addr !== null ? addr.port : cfg.httpPort
  process.stdout.write(
    `kv-router listening on http://${cfg.httpHost}:${port} (mode ${cfg.mode}, block size ${cfg.blockSize}, ${router.pool.size} shard(s), ${router.workers().length} worker(s)${fleet.length > 0 ? `, ${fleet.length} embedded simulated` : ''}${cfg.nice !== null ? `, nice ${cfg.nice}` : ''})\n`,
  )
  let stopping = false
  const stop = (signal: string): void => {
    if (stopping) {
      // a second signal while draining: the operator does not want to wait
      process.stdout.write(`kv-router: ${signal} again: exiting without draining\n`)
      process.exit(1)
    }
    stopping = true
    process.stdout.write(`kv-router: ${signal}: draining ${app.proxy.inFlight} in-flight request(s)\n`)
    void (async () => {
      const { drained, cut } = await app.shutdown(cfg.shutdownTimeoutSecs * 1000)
      await embedded?.close()
      await router.close()
      await tokenizer?.close()
      // exit 0 all the same: the shutdown asked for happened, and a rollout that meets a stream
      // longer than the timeout is not a failure of the router; the line says what was lost
      process.stdout.write(`kv-router: stopped${drained ? '' : ` (drain timed out after ${cfg.shutdownTimeoutSecs} s: ${cut} in-flight request(s) cut)`}\n`)
      process.exit(0)
    })()
  }
  process.on('SIGTERM', () => stop('SIGTERM'))
  process.on('SIGINT', () => stop('SIGINT'))
}

// before any thread starts: the heap sizes of the shebang's flags are the main thread's alone
workerHeapsAtDefaults()

const [command, ...rest] = process.argv.slice(2)
if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
  process.stdout.write(usage)
} else if (command === '-v' || command === '--version') {
  process.stdout.write(`${pkg.version}\n`)
} else if (command === 'serve') {
  await serve(rest)
} else if (command === 'mocker') {
  await (await import('./sim/mocker/main.js')).mockerMain(rest)
} else if (command === 'replay') {
  await (await import('./sim/replay/main.js')).replayMain(rest)
} else {
  // one line, as for a bad option: the usage is a --help away, and 14 lines of it would bury
  // the mistake in a script's log
  die(`unknown command ${JSON.stringify(command)} (see kv-router --help)`)
}
