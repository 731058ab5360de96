// `kv-router serve`: options, start-up lines, signals. The parts are put together in src/app.ts;
// the embedded fleet (`--embedded-fleet`) is started here and handed in.
import { parseServe, serveHelp, serveWithoutEffect } from '../config.js'
import type { ServeConfig } from '../config.js'
import { ConfigError } from '../config/table.js'
import { startApp } from '../app.js'
import type { EmbeddedEngines, StartEmbedded } from '../app.js'
import { MockerFleet } from '../sim/mocker/fleet.js'
import { loadTokenizer } from '../tokenizer/tokenizer.js'
import type { TextTokenizer } from '../tokenizer/tokenizer.js'
import { isKvrError } from '../errors.js'
import { applyNice } from '../runtime/nice.js'
import { FatalError, commandArgs } from '../runtime/fatal.js'
import { addSecret, configureLog, limited, log, redactSecrets } from '../runtime/log.js'

/** The configuration as the debug log shows it: the API key and URL credentials left out, u64 ids as text. */
function loggedConfig(cfg: ServeConfig): Record<string, unknown> {
  const out: Record<string, unknown> = { ...cfg, apiKey: cfg.apiKey === null ? null : '[redacted]' }
  for (const [k, v] of Object.entries(out)) if (typeof v === 'string') out[k] = redactSecrets(v)
  out.workers = cfg.workers.map((w) => ({ ...w, id: w.id.toString(), url: redactSecrets(w.url) }))
  return out
}

/**
 * The embedded fleet (`npm start`): mocker engines in this process, their KV events handed
 * straight to the shards. Sped up 10×, so a short demo request answers in milliseconds while the
 * timing model still orders prefill and decode costs as a real engine would.
 */
function embeddedFleet(cfg: ServeConfig): StartEmbedded {
  return async (count, firstWorkerId, onEvent): Promise<EmbeddedEngines> => {
    const fleet = await MockerFleet.start({
      numWorkers: count,
      firstWorkerId,
      blockSize: cfg.blockSize,
      numGpuBlocks: 16384,
      speedupRatio: 10,
      modelName: cfg.modelName,
      onEvent,
    })
    return {
      workers: fleet.workers.map((e) => ({ workerId: e.workerId, url: e.url, capacity: e.capacity, maxNumBatchedTokens: e.engine.config.maxNumBatchedTokens })),
      close: () => fleet.close(),
    }
  }
}

/** A KvrError of a start-up step as the one line serve exits with. */
function fatal(err: unknown): never {
  if (isKvrError(err)) throw new FatalError(`serve: ${err.message}`)
  throw err
}

/** Longest wait for the transports and embedded engines to close after the drain. */
const CLOSE_LIMIT_MS = 15_000

/**
 * Runs the router until SIGTERM or SIGINT; resolves with the exit status once it has stopped.
 * Throws FatalError (one line, status 2) for an invalid option or a part that does not start.
 */
export async function serveMain(argv: string[]): Promise<number> {
  const parsed = commandArgs(
    'serve',
    () => parseServe(argv),
    (err) => err instanceof ConfigError,
    serveHelp,
  )
  if (parsed === null) return 0
  const cfg = parsed.config
  configureLog({ level: cfg.logLevel, format: cfg.logFormat })
  if (cfg.apiKey !== null) addSecret(cfg.apiKey)
  log.debug({ config: loggedConfig(cfg) }, 'configuration')
  // options that only act in a mode not chosen (Dynamo deployments set them by env for every
  // router): said at start-up rather than ignored silently
  for (const line of serveWithoutEffect(parsed)) log.warn(line)
  // before any thread of ours starts: shards and tokenizers inherit the main thread's niceness
  if (cfg.nice !== null) {
    try {
      applyNice(cfg.nice)
    } catch (err) {
      fatal(err)
    }
  }
  let tokenizer: TextTokenizer | null = null
  try {
    tokenizer = await loadTokenizer(cfg.tokenizer, cfg.tokenizerThreads)
  } catch (err) {
    fatal(err)
  }
  // an engine renders chat with the model's template; without it the router hashes other tokens
  if (tokenizer?.kind === 'hf' && tokenizer.chatTemplate === null) {
    log.warn(
      `no chat template beside ${cfg.tokenizer ?? ''} (chat_template.jinja, or chat_template in tokenizer_config.json): chat requests are ` +
        `tokenized with kv-router's own template, which engines do not use, so they will not match cached prefixes`,
    )
  }
  const { router, app, embedded, port } = await startApp(cfg, tokenizer, cfg.embeddedFleet > 0 ? embeddedFleet(cfg) : null)
  const fleet = embedded?.workers ?? []
  process.stdout.write(
    `kv-router listening on http://${cfg.httpHost}:${port} (mode ${cfg.mode}` +
      `${cfg.mode === 'kv' && !cfg.kvEvents ? ' approximate: no KV events, caches predicted' : ''}, block size ${cfg.blockSize}, ` +
      `${router.pool.size} shard(s), ${router.registry.all().length} worker(s)${fleet.length > 0 ? `, ${fleet.length} embedded simulated` : ''}` +
      `${cfg.nice !== null ? `, nice ${cfg.nice}` : ''}${router.replicas !== null ? `, replica sync as router ${router.replicas.routerId}` : ''}` +
      `${router.durable !== null ? `, durable consumer ${router.durable.consumer}` : ''})\n`,
  )
  return new Promise<number>((resolve) => {
    let stopping = false
    const stop = (signal: string): void => {
      if (stopping) {
        // a second signal while draining: the operator does not want to wait
        process.stdout.write(`kv-router: ${signal} again: exiting without draining\n`)
        resolve(1)
        return
      }
      stopping = true
      process.stdout.write(`kv-router: ${signal}: draining ${app.proxy.inFlight} in-flight request(s)\n`)
      void (async () => {
        const { drained, cut } = await app.shutdown(cfg.shutdownTimeoutSecs * 1000)
        // each transport bounds its own steps; this bounds their sum, as a stop that waits on a
        // server that went away is worse than one that leaves it to clean up after itself
        const closing = setTimeout(() => {
          process.stdout.write(`kv-router: closing the transports took over ${CLOSE_LIMIT_MS / 1000} s: exiting without waiting\n`)
          limited.flush()
          resolve(1)
        }, CLOSE_LIMIT_MS)
        await embedded?.close()
        await router.close()
        await tokenizer?.close()
        clearTimeout(closing)
        limited.flush()
        if (!drained) log.warn({ cut, timeout_secs: cfg.shutdownTimeoutSecs }, 'the drain timed out: in-flight requests were cut')
        // exit 0 all the same: the shutdown asked for happened, and a rollout that meets a stream
        // longer than the timeout is not a failure of the router; the line says what was lost
        process.stdout.write(`kv-router: stopped${drained ? '' : ` (drain timed out after ${cfg.shutdownTimeoutSecs} s: ${cut} in-flight request(s) cut)`}\n`)
        resolve(0)
      })()
    }
    process.on('SIGTERM', () => stop('SIGTERM'))
    process.on('SIGINT', () => stop('SIGINT'))
  })
}
