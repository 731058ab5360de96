// `kv-router serve`: options, start-up lines, signals. The parts are put together in src/app.ts.
import { ConfigError, parseServeConfig, serveHelp } from '../config.js'
import type { ServeConfig } from '../config.js'
import { startApp } from '../app.js'
import { loadTokenizer } from '../tokenizer/tokenizer.js'
import type { TextTokenizer } from '../tokenizer/tokenizer.js'
import { isKvrError } from '../errors.js'
import { applyNice } from '../runtime/nice.js'
import { addSecret, configureLog, limited, log, redactSecrets } from '../runtime/log.js'
import { die } from './flags.js'

/**
 * Options that only act in a mode not chosen (Dynamo deployments set them by env for every
 * router): said at start-up rather than ignored silently.
 */
function withoutEffect(cfg: ServeConfig): string[] {
  const out: string[] = []
  if (!cfg.durableKvEvents) {
    if (cfg.resetStates) out.push('--router-reset-states has no effect without --router-durable-kv-events')
    if (cfg.snapshotThreshold !== 1_000_000) out.push('--router-snapshot-threshold has no effect without --router-durable-kv-events')
  }
  return out
}

/** Dynamo's cost flags set to other than their defaults while kv mode uses the latency cost, which has none of them. */
function unusedCostFlags(cfg: ServeConfig): string[] {
  if (cfg.mode !== 'kv' || cfg.cost !== 'latency') return []
  const set: string[] = []
  if (cfg.overlapScoreWeight !== 1) set.push('--router-kv-overlap-score-weight (--router-prefill-load-scale)')
  if (cfg.overlapScoreCredit !== 1) set.push('--router-kv-overlap-score-credit')
  if (cfg.overlapScoreCreditDecay !== 0) set.push('--router-kv-overlap-score-credit-decay')
  if (cfg.decodeActiveRequestWeight !== 0) set.push('--router-decode-active-request-weight')
  return set.map((f) => `${f} tunes Dynamo's cost and has no effect under --router-cost latency (the default); add --router-cost dynamo to use it`)
}

/** The configuration as the debug log shows it: the API key and URL credentials left out, u64 ids as text. */
function loggedConfig(cfg: ServeConfig): Record<string, unknown> {
  const out: Record<string, unknown> = { ...cfg, apiKey: cfg.apiKey === null ? null : '[redacted]' }
  for (const [k, v] of Object.entries(out)) if (typeof v === 'string') out[k] = redactSecrets(v)
  out.workers = cfg.workers.map((w) => ({ ...w, id: w.id.toString(), url: redactSecrets(w.url) }))
  return out
}

export async function serveMain(argv: string[]): Promise<void> {
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
  configureLog({ level: cfg.logLevel, format: cfg.logFormat })
  if (cfg.apiKey !== null) addSecret(cfg.apiKey)
  log.debug({ config: loggedConfig(cfg) }, 'configuration')
  for (const line of withoutEffect(cfg)) log.warn(line)
  for (const line of unusedCostFlags(cfg)) log.warn(line)
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
    log.warn(
      `no chat template beside ${cfg.tokenizer ?? ''} (chat_template.jinja, or chat_template in tokenizer_config.json): chat requests are tokenized with kv-router's own template, which engines do not use, so they will not match cached prefixes`,
    )
  }
  const { router, app, embedded, port } = await startApp(cfg, tokenizer)
  const fleet = embedded?.workers ?? []
  process.stdout.write(
    `kv-router listening on http://${cfg.httpHost}:${port} (mode ${cfg.mode}${cfg.mode === 'kv' && !cfg.kvEvents ? ' approximate: no KV events, caches predicted' : ''}, block size ${cfg.blockSize}, ${router.pool.size} shard(s), ${router.registry.all().length} worker(s)${fleet.length > 0 ? `, ${fleet.length} embedded simulated` : ''}${cfg.nice !== null ? `, nice ${cfg.nice}` : ''}${router.replicas !== null ? `, replica sync as router ${router.replicas.routerId}` : ''}${router.durable !== null ? `, durable consumer ${router.durable.consumer}` : ''})\n`,
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
      limited.flush()
      if (!drained) log.warn({ cut, timeout_secs: cfg.shutdownTimeoutSecs }, 'the drain timed out: in-flight requests were cut')
      // exit 0 all the same: the shutdown asked for happened, and a rollout that meets a stream
      // longer than the timeout is not a failure of the router; the line says what was lost
      process.stdout.write(`kv-router: stopped${drained ? '' : ` (drain timed out after ${cfg.shutdownTimeoutSecs} s: ${cut} in-flight request(s) cut)`}\n`)
      process.exit(0)
    })()
  }
  process.on('SIGTERM', () => stop('SIGTERM'))
  process.on('SIGINT', () => stop('SIGINT'))
}
