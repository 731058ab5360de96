// `npm run cluster`'s options (scripts/cluster.mjs): one table, as for the kv-router commands,
// from which its parser, its --help and its part of docs/configuration.md come.
import { ConfigError, opt, optionsHelp, parseOptions } from '../config/table.js'
import type { CommandTable, ConfigOf } from '../config/table.js'
import { BLOCK_SIZE_OPTION } from '../sim/mocker/engine.js'
import { parseProfileList } from '../sim/mocker/profiles.js'

const CLUSTER_ROWS = [
  opt({
    flag: '--port',
    key: 'port',
    env: ['KVR_CLUSTER_PORT'],
    kind: 'int',
    min: 0,
    max: 65535,
    dflt: 8000,
    help: "HAProxy's port; 0 = a free one",
    doc: "HAProxy's port; 0 = a free one. Every other port is a free one.",
  }),
  opt({
    flag: '--replicas',
    key: 'replicas',
    env: ['KVR_CLUSTER_REPLICAS'],
    kind: 'int',
    min: 1,
    max: 16,
    dflt: 2,
    help: '`kv-router serve` replicas behind HAProxy',
    doc: '`kv-router serve` replicas behind HAProxy, 1–16.',
  }),
  opt({
    flag: '--engines',
    key: 'engines',
    env: ['KVR_ENGINES'],
    kind: 'int',
    min: 1,
    max: 256,
    dflt: 4,
    help: 'simulated engines',
    doc: 'Simulated engines, 1–256.',
  }),
  opt({
    ...BLOCK_SIZE_OPTION,
    dflt: 64,
    help: 'KV block size of the engines and the routers, as in `docker-compose.yml`',
    doc: 'KV block size of the engines and the routers, as in `docker-compose.yml`.',
  }),
  opt({
    flag: '--speedup-ratio',
    key: 'speedup',
    env: ['KVR_MOCKER_SPEEDUP'],
    kind: 'num',
    min: 0,
    dflt: 1,
    help: "the engines' `--speedup-ratio`",
    doc: "The engines' `--speedup-ratio`.",
  }),
  opt({
    flag: '--engine-profile',
    key: 'engineProfile',
    env: ['KVR_MOCKER_PROFILE'],
    kind: 'str',
    read: (t: string) => {
      try {
        parseProfileList(t)
        return t
      } catch (err) {
        throw new ConfigError((err as Error).message.replace(/^--engine-profile: /, ''))
      }
    },
    accepts: 'NAME[@SPEED][:COUNT],…',
    metavar: 'LIST',
    dflt: 'default',
    help: "the engines' `--engine-profile` (timing profiles and speeds, e.g. `large:2,large@0.5:2`)",
    doc: "The engines' `--engine-profile`: timing profiles and speeds ([architecture](architecture.md#engine-profiles)).",
  }),
  opt({
    flag: '--shared-indexer',
    key: 'sharedIndexer',
    env: ['KVR_CLUSTER_SHARED_INDEXER'],
    kind: 'bool',
    dflt: false,
    help: 'one `kv-router indexer` the replicas route on (`--indexer-url`): the engines publish over ZMQ, the replicas consume no KV events',
    doc:
      'Runs one `kv-router indexer` and starts the replicas with `--indexer-url` on it: the engines publish their KV events over ZMQ (and list ' +
      'the endpoints in etcd), the replicas register them with the indexer and consume no KV events themselves ' +
      '([deployment](deployment.md#a-shared-remote-index)).',
  }),
  opt({
    flag: '--logs',
    key: 'logs',
    kind: 'bool',
    flagOnly: true,
    dflt: false,
    docDefault: 'off',
    help: "show the output of `nats-server`, `etcd` and `haproxy` too (the kv-router processes' is always shown, each line prefixed with its process)",
    doc: "Show the output of `nats-server`, `etcd` and `haproxy` too (the kv-router processes' is always shown, each line prefixed with its process).",
  }),
] as const

export type ClusterOptions = ConfigOf<typeof CLUSTER_ROWS> & {
  /** Arguments after a second `--`: added to every replica's `kv-router serve` command line. */
  readonly serveArgs: readonly string[]
}

export const CLUSTER_TABLE: CommandTable = {
  command: 'cluster',
  options: CLUSTER_ROWS,
  unknown: (arg) => `unknown option ${JSON.stringify(arg)}`,
}

export const clusterHelp = `usage: npm run cluster -- [options] [-- serve options]

Runs nats-server, etcd, simulated engines, kv-router replicas and haproxy on 127.0.0.1, the
topology of docker-compose.yml. Ctrl-C (SIGINT) or SIGTERM stops everything.

${optionsHelp(CLUSTER_TABLE)}
Arguments after a second -- are added to every replica's kv-router serve command line.
Every other port is a free one. The last lines of a child's output are printed if it fails.
`

/** The cluster's options from argv and the environment; 'help' for --help. Throws ConfigError with the one line to print. */
export function parseClusterArgs(argv: readonly string[], env: NodeJS.ProcessEnv): ClusterOptions | 'help' {
  const cut = argv.indexOf('--')
  const parsed = parseOptions<ConfigOf<typeof CLUSTER_ROWS>>(CLUSTER_TABLE, cut < 0 ? argv : argv.slice(0, cut), env)
  if (parsed === 'help') return 'help'
  return { ...parsed.config, serveArgs: cut < 0 ? [] : argv.slice(cut + 1) }
}

export { ConfigError }
