// `kv-router indexer`: a standalone KV indexer with the HTTP API of Dynamo's (docs/indexer.md).
// Engines register their ZMQ KV-event streams; the indexer follows them (replay, gaps, restarts:
// the router's own engine intake) into one shard pool, and answers overlap queries per
// (model_name, routing_group). One line on stdout once it listens:
//
//   kv-router indexer: ready http://HOST:PORT
//
// SIGTERM/SIGINT close the listeners, the server and the pool, and exit 0.
import { ConfigError, opt, optionsHelp, parseOptions } from '../config/table.js'
import type { CommandTable, ConfigOf } from '../config/table.js'
import { isHttpUrl } from '../core/endpoints.js'
import { FatalError, commandArgs } from '../runtime/fatal.js'
import { configureLog, log, parseLogLevel } from '../runtime/log.js'
import { MAX_SHARDS } from '../thread/protocol.js'
import { ShardPool } from '../shards/pool.js'
import { IndexerRegistry } from './registry.js'
import { buildIndexerServer } from './server.js'
import { IndexerMetrics } from './metrics.js'
import { recoverFromPeers } from './recovery.js'

/** Comma-separated http(s) URLs, without trailing slashes. */
function peerList(t: string): string[] | undefined {
  const urls = t
    .split(',')
    .map((u) => u.trim())
    .filter((u) => u !== '')
  return urls.every(isHttpUrl) ? urls.map((u) => u.replace(/\/+$/, '')) : undefined
}

const INDEXER_ROWS = [
  opt({
    flag: '--port',
    aliases: ['--http-port'],
    key: 'port',
    kind: 'int',
    min: 0,
    max: 65535,
    dflt: 8090,
    metavar: 'PORT',
    group: 'HTTP (names as in Dynamo’s dynamo-kv-indexer)',
    help: 'HTTP port (0: any free port)',
    doc: 'HTTP port; 0 takes any free port (the ready line names it). Dynamo’s default, 8090.',
  }),
  opt({
    flag: '--host',
    aliases: ['--http-host'],
    key: 'host',
    kind: 'str',
    dflt: '0.0.0.0',
    metavar: 'HOST',
    help: 'address the HTTP server binds',
    doc: 'Address the HTTP server binds.',
  }),
  opt({
    flag: '--threads',
    key: 'threads',
    kind: 'int',
    min: 1,
    max: MAX_SHARDS,
    dflt: null,
    metavar: 'N',
    help: 'index shard threads (default: cores - 1)',
    doc: `Index shard threads (1–${MAX_SHARDS}); unset, one fewer than the cores, at least one.`,
    docDefault: 'cores − 1',
  }),
  opt({
    flag: '--peers',
    key: 'peers',
    kind: 'str',
    read: peerList,
    accepts: 'comma-separated http(s) URLs',
    dflt: null,
    metavar: 'URLS',
    help: 'indexers to recover from at start (their registrations and index), kept as peers',
    doc:
      'Comma-separated URLs of running indexers: at start the first that answers gives its registrations and its index, ' +
      'then the engines’ streams are followed; all are listed by `GET /peers`.',
  }),
  opt({
    flag: '--log-level',
    key: 'logLevel',
    kind: 'str',
    read: (t: string) => parseLogLevel(t) ?? undefined,
    accepts: 'one of error|warn|info|debug|trace|off (also fatal, silent)',
    dflt: 'info',
    help: 'least severe log lines written (stderr)',
    doc: 'Least severe log lines written on stderr: `error`, `warn`, `info`, `debug`, `trace`, `off`.',
  }),
] as const

type IndexerConfig = ConfigOf<typeof INDEXER_ROWS>

export const INDEXER_TABLE: CommandTable = {
  command: 'indexer',
  options: INDEXER_ROWS,
  unknown: (arg) =>
    arg.startsWith('--')
      ? `unknown option ${arg} (kv-router indexer --help lists the options)`
      : `unexpected argument ${JSON.stringify(arg)} (kv-router indexer --help lists the options)`,
}

export const indexerHelp = (): string => `usage: kv-router indexer [options]

A standalone KV indexer with the HTTP API of Dynamo's (Mooncake KV Indexer RFC #1403): engines
register their ZMQ KV-event streams (POST /register), the indexer follows them, and schedulers or
router replicas ask it which workers cache a prompt's blocks (POST /query, POST /query_by_hash).
${optionsHelp(INDEXER_TABLE)}
Routes: POST /register /unregister /query /query_by_hash /register_peer /deregister_peer
/reopen_logs; GET /workers /dump /peers /health /metrics /snapshot. Once listening, one line on
stdout:
  kv-router indexer: ready http://HOST:PORT
`

class IndexerArgError extends Error {}

function parseIndexerArgs(argv: readonly string[]): IndexerConfig | 'help' {
  try {
    const p = parseOptions<IndexerConfig>(INDEXER_TABLE, argv)
    return p === 'help' ? 'help' : p.config
  } catch (err) {
    if (err instanceof ConfigError) throw new IndexerArgError(err.message)
    throw err
  }
}

export async function indexerMain(argv: string[]): Promise<number> {
  const cfg = commandArgs(
    'indexer',
    () => parseIndexerArgs(argv),
    (e) => e instanceof IndexerArgError,
    indexerHelp,
  )
  if (cfg === null) return 0
  configureLog({ level: cfg.logLevel })
  const pool = await ShardPool.start(cfg.threads === null ? {} : { shards: cfg.threads })
  const registry = new IndexerRegistry(pool)
  const metrics = new IndexerMetrics(registry)
  const app = buildIndexerServer({ registry, pool, metrics })
  const peers = cfg.peers ?? []
  for (const p of peers) registry.peers.add(p)
  if (peers.length > 0) {
    const from = await recoverFromPeers(peers, registry, pool)
    if (from === null) log.warn({ peers }, 'no peer could be recovered from: the indexer starts empty')
    else log.info({ peer: from.peer, workers: from.workers, blocks: from.entries }, 'recovered from a peer')
  }
  let address: string
  try {
    address = await app.listen({ host: cfg.host, port: cfg.port })
  } catch (err) {
    await registry.close()
    await pool.close()
    throw new FatalError(`indexer: --port: cannot listen on ${cfg.host}:${cfg.port}: ${(err as Error).message}`)
  }
  const port = (app.server.address() as { port: number }).port
  const host = cfg.host === '0.0.0.0' ? '127.0.0.1' : cfg.host
  log.info({ address }, 'indexer listening')
  process.stdout.write(`kv-router indexer: ready http://${host.includes(':') ? `[${host}]` : host}:${port}\n`)
  let stopped: (code: number) => void = () => undefined
  const done = new Promise<number>((resolve) => (stopped = resolve))
  let stopping = false
  const stop = (): void => {
    if (stopping) return
    stopping = true
    void (async () => {
      await app.close()
      await registry.close()
      await pool.close()
    })().finally(() => stopped(0))
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  return done
}
