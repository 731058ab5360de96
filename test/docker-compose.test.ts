// No container engine runs on the machines that test this project, so docker-compose.yml, the
// configurations it mounts and the Dockerfile are checked here instead: every command line goes
// through the parser of the kv-router command it runs, HAProxy's configuration through haproxy
// itself, and the services agree with each other (addresses, ports, block size, the replicas
// HAProxy balances and Prometheus scrapes, health checks that the dependencies wait on, the
// trace the load generator mounts, the files the observe profile mounts and Grafana's provisioning).
import t from 'tap'
import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { dirname, isAbsolute, join, resolve } from 'node:path'
import { parse } from 'yaml'
import { parseServeConfig, type ServeConfig } from '../src/config.js'
import { parseMockerArgs } from '../src/sim/mocker/main.js'
import { parseReplayArgs, type ReplayArgs } from '../src/sim/replay/main.js'
import { requireExecutable } from '../src/deploy/services.js'
import { parseOptions } from '../src/config/table.js'
import { INDEXER_TABLE } from '../src/indexer/main.js'
import { repoRoot } from './helpers/paths.js'

const root = repoRoot

interface Service {
  image?: string
  build?: string
  hostname?: string
  command?: string[]
  ports?: string[]
  volumes?: string[]
  environment?: Record<string, string>
  profiles?: string[]
  depends_on?: Record<string, { condition: string }>
  healthcheck?: { test: string[] }
  ulimits?: Record<string, number | { soft: number; hard: number }>
  stop_grace_period?: string
  restart?: string
}

/** Compose's interpolation with no variables set: `${X:-default}` is the default; `${X}` is refused. */
function interpolate(s: string): string {
  return s.replace(/\$\{([A-Z0-9_]+)(:-([^}]*))?\}/g, (_m, name: string, _d, dflt: string | undefined) => {
    if (dflt === undefined) throw new Error(`\${${name}} has no default: docker compose up would need it set`)
    return dflt
  })
}

const file = parse(readFileSync(join(root, 'docker-compose.yml'), 'utf8'), { merge: true }) as { services: Record<string, Service> }
const services = file.services
const svc = (name: string): Service => {
  const s = services[name]
  if (s === undefined) throw new Error(`docker-compose.yml has no service "${name}"`)
  return s
}
const cmd = (name: string): string[] => (svc(name).command ?? []).map(interpolate)
/** `--flag=value` or `--flag value` from a command line. */
function flag(argv: readonly string[], name: string): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string
    if (a === name) return argv[i + 1]
    if (a.startsWith(`${name}=`)) return a.slice(name.length + 1)
  }
  return undefined
}
const hostPort = (url: string): string => {
  const u = new URL(url)
  return `${u.hostname}:${u.port}`
}
/** `HOST:CONTAINER` (or `IP:HOST:CONTAINER`) of a ports entry, as numbers: [host, container]. */
const published = (name: string): [number, number][] =>
  (svc(name).ports ?? []).map((p) => {
    const parts = interpolate(p).split(':')
    return [Number(parts[parts.length - 2]), Number(parts[parts.length - 1])]
  })
/** The host file a service mounts at `target`, resolved against the repository. */
function mounted(name: string, target: string): string | undefined {
  for (const v of svc(name).volumes ?? []) {
    const [source, to] = interpolate(v).split(':') as [string, string | undefined]
    if (to === target) return isAbsolute(source) ? source : resolve(root, source)
  }
  return undefined
}

/** The router replicas of the default topology: every service outside a profile that runs `kv-router serve`. */
const routerNames = Object.keys(services).filter((name) => cmd(name)[0] === 'serve' && svc(name).profiles === undefined)
/** The replicas of the shared-index profile. */
const sharedNames = Object.keys(services).filter((name) => cmd(name)[0] === 'serve' && svc(name).profiles?.includes('shared-index') === true)
const routerCfg = (name: string): ServeConfig => {
  const cfg = parseServeConfig(cmd(name).slice(1), {})
  if (cfg === 'help') throw new Error(`${name} asks for help`)
  return cfg
}
const firstRouter = (): ServeConfig => routerCfg(routerNames[0] as string)

interface HaSection {
  kind: string
  name: string
  /** Directives, split on blanks, comments left out. */
  lines: string[][]
}
/** HAProxy's configuration as sections of directives; enough of its grammar for these checks. */
function parseHaproxy(text: string): HaSection[] {
  const out: HaSection[] = []
  for (const raw of text.split('\n')) {
    const line = raw.trim()
    if (line === '' || line.startsWith('#')) continue
    const words = line.split(/\s+/)
    if (!/^\s/.test(raw)) out.push({ kind: words[0] as string, name: words[1] ?? '', lines: [] })
    else out[out.length - 1]?.lines.push(words)
  }
  return out
}
const haproxyFile = mounted('haproxy', '/usr/local/etc/haproxy/haproxy.cfg')
const haproxy = parseHaproxy(haproxyFile !== undefined && existsSync(haproxyFile) ? readFileSync(haproxyFile, 'utf8') : '')
const haSection = (kind: string, name: string): HaSection => {
  const s = haproxy.find((x) => x.kind === kind && x.name === name)
  if (s === undefined) throw new Error(`haproxy.cfg has no ${kind} ${name}`)
  return s
}
/** The directives of a section that start with these words. */
const directives = (s: HaSection, ...words: string[]): string[][] => s.lines.filter((l) => words.every((w, i) => l[i] === w))
const bindPort = (s: HaSection): number => {
  const binds = directives(s, 'bind')
  if (binds.length !== 1) throw new Error(`${s.kind} ${s.name} has ${binds.length} bind lines`)
  return Number(/:(\d+)$/.exec(binds[0]?.[1] ?? '')?.[1])
}
/** The frontend clients reach: the one whose default backend holds the replicas. */
const frontend = (): HaSection => {
  const f = haproxy.find((x) => x.kind === 'frontend' && directives(x, 'default_backend').length > 0)
  if (f === undefined) throw new Error('haproxy.cfg has no frontend with a default_backend')
  return f
}
const backend = (): HaSection => haSection('backend', directives(frontend(), 'default_backend')[0]?.[1] ?? '')
/** HAProxy's time syntax (5s, 10m, 250 = ms) in seconds. */
function haSeconds(v: string | undefined): number {
  const m = /^(\d+)(us|ms|s|m|h|d)?$/.exec(v ?? '')
  if (m === null) throw new Error(`not an HAProxy time: ${v}`)
  const unit = { us: 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600, d: 86400 }[m[2] ?? 'ms'] as number
  return Number(m[1]) * unit
}

t.test('the services of the fleet are there, on pinned images', async (t) => {
  for (const name of ['nats', 'etcd', 'router-1', 'router-2', 'haproxy', 'mocker', 'loadgen', 'prometheus', 'grafana']) t.ok(services[name], `service ${name}`)
  for (const [name, s] of Object.entries(services)) {
    t.ok(s.image, `${name} names its image`)
    t.notMatch(s.image ?? '', /:latest$|^[^:]+$/, `${name}'s image has a pinned tag`)
  }
  const built = Object.entries(services).filter(([, s]) => s.build !== undefined)
  t.ok(built.length >= 4, 'routers, engines and load generator are built from this repository')
  for (const [name, s] of built) {
    t.equal(s.build, '.', `${name} builds the Dockerfile at the root`)
    t.equal(s.image, 'kv-router:local', `${name} shares the one kv-router image`)
  }
  t.same(svc('loadgen').profiles, ['load'], 'the load generator runs only when asked for')
  t.same(svc('prometheus').profiles, ['observe'], 'Prometheus runs only when asked for')
  t.same(svc('grafana').profiles, ['observe'], 'and Grafana with it')
  // a port published twice would stop `docker compose up` with "port is already allocated"
  const hostPorts = Object.keys(services).flatMap((name) => published(name).map(([host]) => host))
  t.same(hostPorts, [...new Set(hostPorts)], `every host port is published once (${hostPorts.join(', ')})`)
})

t.test('every dependency exists and has the health check its dependants wait for', async (t) => {
  for (const [name, s] of Object.entries(services)) {
    t.notOk(Array.isArray(s.depends_on), `${name} names a condition for each dependency`)
    for (const [dep, how] of Object.entries(s.depends_on ?? {})) {
      t.ok(services[dep], `${name} depends on an existing service (${dep})`)
      if (how.condition === 'service_healthy') t.ok(services[dep]?.healthcheck?.test.length, `${dep} has a health check (${name} waits for it)`)
    }
  }
  t.ok(cmd('nats').includes('--jetstream') || cmd('nats').includes('-js'), 'nats-server runs with JetStream')
})

t.test('two router replicas run one valid `kv-router serve` with replica sync, pointed at the fleet', async (t) => {
  t.same(routerNames.sort(), ['router-1', 'router-2'], 'the services that run kv-router serve are the two replicas')
  const first = firstRouter()
  for (const name of routerNames) {
    const argv = cmd(name)
    let cfg: ServeConfig | 'help' | undefined
    t.doesNotThrow(() => {
      cfg = parseServeConfig(argv.slice(1), {})
    }, `${name}: every flag is accepted`)
    if (cfg === undefined || cfg === 'help') return t.fail(`${name}: no configuration`)
    t.same(cfg, first, `${name} is configured as the other replica`)
    t.equal(cfg.replicaSync, true, `${name} shares its bookings (--router-replica-sync)`)
    t.equal(cfg.mode, 'kv')
    t.equal(cfg.tokenizer, 'bytes', `${name} hashes text prompts as the simulated engines read them`)
    t.equal(hostPort(cfg.natsUrl ?? ''), 'nats:4222', `${name}: KV events from the nats service`)
    t.equal(hostPort(cfg.etcdUrl ?? ''), 'etcd:2379', `${name}: workers from the etcd service`)
    t.equal(cfg.nice, 0, 'niceness 0 unless KVR_ROUTER_NICE says otherwise')
    // the image runs as an unprivileged user, for whom RLIMIT_NICE is what allows 20 - limit
    const limit = svc(name).ulimits?.nice
    t.equal(typeof limit === 'object' ? limit.soft : limit, 40, 'RLIMIT_NICE lets any KVR_ROUTER_NICE down to -20 take effect')
    const port = cfg.httpPort
    t.ok(
      published(name).some(([, container]) => container === port),
      `${name}: the published port is the one it listens on`,
    )
    // /health, not /ready: the engines start once the routers are healthy, and /ready waits for a worker
    t.match(svc(name).healthcheck?.test.join(' ') ?? '', new RegExp(`127\\.0\\.0\\.1:${port}/health`), `${name} is healthy once it listens`)
    // Docker sends SIGKILL at the grace period: the router's own deadline must come first, with
    // time left to cut the rest, free its bookings and stop its threads
    const grace = /^(\d+)s$/.exec(svc(name).stop_grace_period ?? '')
    t.ok(grace, 'a grace period in seconds')
    t.ok(
      Number(grace?.[1]) >= cfg.shutdownTimeoutSecs + 5,
      `${name}: grace ${svc(name).stop_grace_period} leaves 5 s after the drain deadline (${cfg.shutdownTimeoutSecs} s)`,
    )
    t.equal(svc(name).restart, 'unless-stopped', `${name} comes back if it exits`)
    t.equal(svc(name).hostname, name, `${name} is named after its service`)
  }
  t.ok(cmd('etcd').includes('--advertise-client-urls=http://etcd:2379'), 'etcd advertises the address the routers use')
  t.equal(svc('mocker').restart, 'unless-stopped', 'the engines come back if they exit')
})

t.test('HAProxy balances exactly the router replicas, checks /ready and listens where it is published', async (t) => {
  t.ok(haproxyFile !== undefined && existsSync(haproxyFile), `the haproxy service mounts its configuration from the repository (${haproxyFile})`)
  t.equal(haproxyFile, join(root, 'deploy', 'haproxy', 'haproxy.cfg'))
  // haproxy itself reads the file: a directive it does not know, or a bad value, fails here. The
  // replicas' names resolve only inside compose; init-addr none lets the check pass without them
  const bin = requireExecutable('haproxy', 'haproxy')
  let check = ''
  try {
    check = execFileSync(bin, ['-c', '-f', haproxyFile as string], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string }
    t.fail(`haproxy -c refuses the configuration:\n${e.stdout ?? ''}${e.stderr ?? ''}`)
  }
  t.match(check, /Configuration file is valid/, 'haproxy -c accepts the configuration')

  const port = bindPort(frontend())
  t.ok(
    published('haproxy').some(([, container]) => container === port),
    `the frontend's port (${port}) is the one the haproxy service publishes`,
  )
  t.ok(
    published('haproxy').some(([host, container]) => host === 8000 && container === port),
    'clients reach it on the host port a single router had (8000)',
  )
  const be = backend()
  const servers = directives(be, 'server').map((l) => ({ name: l[1] as string, address: l[2] as string }))
  t.same(servers.map((s) => s.name).sort(), [...routerNames].sort(), 'one server per router replica, named after its service')
  for (const s of servers) t.equal(s.address, `${s.name}:${routerCfg(s.name).httpPort}`, `${s.name}: the service's name and the port it listens on`)
  const serverOptions = [...directives(be, 'default-server'), ...directives(be, 'server')].flat()
  t.ok(serverOptions.includes('check'), 'every replica is health-checked')
  t.ok(directives(be, 'option', 'httpchk').length === 1, 'the health check is an HTTP request')
  const send = directives(be, 'http-check', 'send')[0] ?? []
  t.equal(send[send.indexOf('meth') + 1], 'GET')
  t.equal(send[send.indexOf('uri') + 1], '/ready', 'the health check asks /ready: a draining or recovering replica leaves the rotation')
  t.same(directives(be, 'http-check', 'expect')[0], ['http-check', 'expect', 'status', '200'], 'and wants 200')
  t.match(directives(be, 'balance')[0]?.[1] ?? '', /^(leastconn|roundrobin)$/, 'requests are spread over the replicas')
  t.ok(
    directives(be, 'http-response', 'set-header').some((l) => l[2] === 'x-router-replica' && l[3] === '%[srv_name]'),
    'answers name the replica that served them (x-router-replica)',
  )

  // streamed completions: inactivity timeouts long enough for a prefill behind a queue
  const defaults = haSection('defaults', '')
  const timeout = (what: string): number => haSeconds(directives(defaults, 'timeout', what)[0]?.[2])
  t.ok(timeout('server') >= 300, `timeout server ${timeout('server')} s lets a stream wait for its first token`)
  t.ok(timeout('client') >= timeout('server'), 'timeout client is no shorter than timeout server')
  t.ok(timeout('connect') <= 10, 'a replica that does not accept is given up quickly')
  t.equal(directives(defaults, 'mode')[0]?.[1], 'http', 'HTTP mode, for the health checks and the header')
  t.ok(directives(defaults, 'option', 'redispatch').length === 1, 'a refused connection is retried on the other replica')

  t.match(svc('haproxy').healthcheck?.test.join(' ') ?? '', new RegExp(`127\\.0\\.0\\.1:${port}/ready`), 'healthy once /ready passes through it')
  for (const name of routerNames) t.equal(svc('haproxy').depends_on?.[name]?.condition, 'service_healthy', `it starts once ${name} listens`)
  t.equal(svc('haproxy').restart, 'unless-stopped')
})

t.test('Prometheus scrapes both replicas and HAProxy', async (t) => {
  const file = mounted('prometheus', '/etc/prometheus/prometheus.yml')
  t.equal(file, join(root, 'deploy', 'prometheus', 'prometheus.yml'), 'the prometheus service mounts its configuration from the repository')
  if (file === undefined) return
  interface Job {
    job_name: string
    metrics_path?: string
    static_configs: { targets: string[] }[]
  }
  let config: { global?: { scrape_interval?: string }; scrape_configs: Job[] } | undefined
  t.doesNotThrow(() => {
    config = parse(readFileSync(file, 'utf8')) as typeof config
  }, 'prometheus.yml is YAML')
  const jobs = config?.scrape_configs ?? []
  const targets = (name: string): string[] =>
    jobs
      .filter((j) => j.job_name === name)
      .flatMap((j) => j.static_configs.flatMap((c) => c.targets))
      .sort()
  t.same(
    targets('kv-router'),
    routerNames.map((name) => `${name}:${routerCfg(name).httpPort}`).sort(),
    'the kv-router job scrapes every replica on the port it listens on',
  )
  for (const j of jobs) t.equal(j.metrics_path ?? '/metrics', '/metrics', `${j.job_name}: /metrics`)
  const stats = haproxy.find((x) => x.kind === 'frontend' && x.lines.some((l) => l.includes('prometheus-exporter')))
  t.ok(stats, 'HAProxy serves its own metrics (Prometheus exporter)')
  if (stats === undefined) return
  t.match(directives(stats, 'http-request', 'use-service', 'prometheus-exporter')[0]?.join(' ') ?? '', /path \/metrics/, 'on /metrics')
  t.same(targets('haproxy'), [`haproxy:${bindPort(stats)}`], "the haproxy job scrapes the exporter's frontend")
  t.ok(
    published('haproxy').some(([, container]) => container === bindPort(stats)),
    "the exporter's port is published too",
  )
  t.ok(
    published('prometheus').some(([, container]) => container === 9090),
    'Prometheus on :9090',
  )
})

t.test('the observe profile mounts files of the repository that exist', async (t) => {
  const observe = Object.keys(services).filter((name) => svc(name).profiles?.includes('observe'))
  t.same(observe.sort(), ['grafana', 'prometheus'])
  for (const name of observe)
    for (const v of svc(name).volumes ?? []) {
      const [source, target, mode] = interpolate(v).split(':') as [string, string, string | undefined]
      const path = isAbsolute(source) ? source : resolve(root, source)
      t.ok(path.startsWith(`${root}/`) && existsSync(path), `${name}: ${source} exists in the repository`)
      t.ok(target.startsWith('/'), `${name}: mounted at an absolute path (${target})`)
      t.equal(mode, 'ro', `${name}: ${source} read-only`)
    }
})

t.test('Grafana reads the compose Prometheus and provisions the repository dashboard', async (t) => {
  const dsDir = mounted('grafana', '/etc/grafana/provisioning/datasources')
  const dbDir = mounted('grafana', '/etc/grafana/provisioning/dashboards')
  t.equal(dsDir, join(root, 'deploy', 'grafana', 'provisioning', 'datasources'))
  t.equal(dbDir, join(root, 'deploy', 'grafana', 'provisioning', 'dashboards'))
  if (dsDir === undefined || dbDir === undefined) return
  const yamlIn = (dir: string): Record<string, unknown>[] =>
    readdirSync(dir)
      .filter((f) => /\.ya?ml$/.test(f))
      .map((f) => parse(readFileSync(join(dir, f), 'utf8')) as Record<string, unknown>)
  interface Datasource {
    type: string
    url: string
    isDefault?: boolean
  }
  const datasources = yamlIn(dsDir).flatMap((f) => (f.datasources ?? []) as Datasource[])
  const prom = datasources.filter((d) => d.type === 'prometheus')
  t.equal(prom.length, 1, 'one Prometheus data source')
  t.equal(prom[0]?.isDefault, true, "the default one, which the dashboard's data-source variable starts on")
  t.equal(hostPort(prom[0]?.url ?? 'http://x'), 'prometheus:9090', 'the prometheus service, on the port it listens on')
  t.ok(
    published('prometheus').some(([, container]) => container === 9090),
    'which Prometheus listens on',
  )
  interface Provider {
    type: string
    options: { path: string }
  }
  const providers = yamlIn(dbDir).flatMap((f) => (f.providers ?? []) as Provider[])
  t.equal(providers.length, 1)
  t.equal(providers[0]?.type, 'file')
  const dashboard = join(root, 'deploy', 'grafana', 'kv-router.json')
  const target = (svc('grafana').volumes ?? []).map((v) => interpolate(v).split(':')).find(([source]) => resolve(root, source as string) === dashboard)?.[1]
  t.ok(target, 'the dashboard is mounted')
  t.equal(dirname(target ?? ''), providers[0]?.options.path, 'into the folder the provider loads')
  t.equal(svc('grafana').environment?.GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH, target, 'and it is the home dashboard')
  t.equal((JSON.parse(readFileSync(dashboard, 'utf8')) as { uid: string }).uid, 'kv-router')
  t.ok(
    published('grafana').some(([host, container]) => host === 3000 && container === 3000),
    'Grafana on :3000',
  )
  t.equal(svc('grafana').depends_on?.prometheus?.condition, 'service_started')
  t.match(svc('grafana').image ?? '', /^grafana\/grafana:\d+\.\d+\.\d+$/, 'a pinned Grafana release')
})

t.test('the engines are a valid `kv-router mocker` that the routers can reach and agree with', async (t) => {
  const argv = cmd('mocker')
  t.equal(argv[0], 'mocker')
  t.doesNotThrow(() => parseMockerArgs(argv.slice(1)), 'every flag is accepted')
  const router = firstRouter()
  t.equal(Number(flag(argv, '--block-size')), router.blockSize, 'engines and routers use one block size')
  t.equal(flag(argv, '--advertise-host'), 'mocker', 'engines advertise their service name, which the routers resolve')
  t.equal(flag(argv, '--host'), '0.0.0.0', 'engines listen beyond the container')
  t.equal(hostPort(flag(argv, '--nats-url') ?? ''), 'nats:4222', 'events go where the routers listen')
  t.equal(hostPort(flag(argv, '--etcd-url') ?? ''), 'etcd:2379', 'engines register where the routers look')
  t.match(
    svc('mocker').healthcheck?.test.join(' ') ?? '',
    new RegExp(`127\\.0\\.0\\.1:${flag(argv, '--http-port')}/health`),
    'the health check asks the first engine',
  )
  for (const name of routerNames) t.ok(svc('mocker').depends_on?.[name], `engines start after ${name} has subscribed`)
})

t.test('the shared-index profile: replicas on one kv-router indexer, registering ZMQ engines they agree with', async (t) => {
  t.same(sharedNames.sort(), ['router-shared-1', 'router-shared-2'], 'two replicas in the profile')
  for (const name of ['indexer', 'mocker-zmq', ...sharedNames]) t.same(svc(name).profiles, ['shared-index'], `${name} runs only when asked for`)
  const indexer = cmd('indexer')
  t.equal(indexer[0], 'indexer', 'the indexer service runs kv-router indexer')
  let parsed: { port: number; host: string } | 'help' | undefined
  t.doesNotThrow(() => {
    const p = parseOptions<{ port: number; host: string }>(INDEXER_TABLE, indexer.slice(1), {})
    parsed = p === 'help' ? 'help' : p.config
  }, 'the indexer: every flag is accepted')
  if (parsed === undefined || parsed === 'help') return t.fail('the indexer: no configuration')
  const indexerPort = parsed.port
  t.ok(
    published('indexer').some(([, c]) => c === indexerPort),
    'the indexer publishes the port it listens on',
  )
  t.equal(parsed.host, '0.0.0.0', 'the indexer listens beyond its container')
  t.match(svc('indexer').healthcheck?.test.join(' ') ?? '', new RegExp(`127\\.0\\.0\\.1:${indexerPort}/health`), 'its health check asks its port')
  const engines = cmd('mocker-zmq')
  t.doesNotThrow(() => parseMockerArgs(engines.slice(1)), 'the ZMQ engines: every flag is accepted')
  const n = Number(flag(engines, '--num-workers'))
  const pub = Number(new URL(flag(engines, '--kv-events-zmq') ?? '').port)
  const replay = Number(new URL(flag(engines, '--kv-events-replay-zmq') ?? '').port)
  const http = Number(flag(engines, '--http-port'))
  const first = Number(flag(engines, '--first-worker-id'))
  const host = flag(engines, '--advertise-host')
  let cfg0: ServeConfig | undefined
  for (const name of sharedNames) {
    const cfg = routerCfg(name)
    cfg0 ??= cfg
    t.same(cfg, cfg0, `${name} is configured as the other replica`)
    t.equal(hostPort(cfg.indexerUrl ?? ''), `indexer:${indexerPort}`, `${name} asks the indexer service`)
    t.equal(cfg.kvEvents, false, `${name} consumes no KV events itself`)
    t.equal(cfg.natsUrl, null, `${name}: no NATS`)
    t.equal(cfg.blockSize, Number(flag(engines, '--block-size')), `${name} and the engines use one block size`)
    t.equal(svc(name).depends_on?.indexer?.condition, 'service_healthy', `${name} starts once the indexer answers`)
    t.equal(cfg.workers.length, n, `${name} lists every engine`)
    for (let i = 0; i < n; i++) {
      const w = cfg.workers[i]
      t.equal(w?.id, BigInt(first + i), `engine ${i}: its worker id`)
      t.equal(w?.url, `http://${host}:${http + i}`, `engine ${i}: its HTTP port`)
      t.equal(w?.kvEvents?.endpoint, `tcp://${host}:${pub + i}`, `engine ${i}: its PUB port, which the indexer is told`)
      t.equal(w?.kvEvents?.replay, `tcp://${host}:${replay + i}`, `engine ${i}: its replay port`)
    }
    t.ok(
      published(name).some(([, container]) => container === cfg.httpPort),
      `${name}: the published port is the one it listens on`,
    )
  }
})

t.test('the load generator replays the trace through HAProxy', async (t) => {
  const argv = cmd('loadgen')
  t.equal(argv[0], 'replay')
  let args: ReplayArgs | 'help' | undefined
  t.doesNotThrow(() => {
    args = parseReplayArgs(argv.slice(1))
  }, 'every flag is accepted')
  if (args === undefined || args === 'help') return t.fail('no arguments')
  t.equal(hostPort(args.url), `haproxy:${bindPort(frontend())}`, "it targets HAProxy's frontend, not one replica")
  t.equal(svc('loadgen').depends_on?.haproxy?.condition, 'service_healthy', 'once a replica is in the rotation')
  t.equal(args.timeScale, Number(flag(cmd('mocker'), '--speedup-ratio')), 'durations are reported in simulated time')
  const mount = (svc('loadgen').volumes ?? [])
    .map(interpolate)
    .map((v) => v.split(':'))
    .find(([, target]) => target !== undefined && args !== undefined && args !== 'help' && args.trace.startsWith(`${target}/`))
  t.ok(mount, 'the trace file lies in a mounted folder')
  if (mount === undefined) return
  const source = mount[0] as string
  const hostDir = isAbsolute(source) ? source : resolve(root, source)
  const traceFile = join(hostDir, args.trace.slice((mount[1] as string).length + 1))
  t.ok(existsSync(traceFile) && statSync(traceFile).size > 0, `the default mount holds the trace (${traceFile})`)
})

t.test('the Dockerfile builds what the services run', async (t) => {
  const text = readFileSync(join(root, 'Dockerfile'), 'utf8')
  t.match(text, /COPY package\.json package-lock\.json/, 'installs from the lockfile')
  t.match(text, /RUN npm ci/, 'with npm ci, which builds dist/ through the prepare script')
  // `npm ci` runs tsc over everything tsconfig.json includes (bench/ and test/ share support/)
  const tsconfig = JSON.parse(readFileSync(join(root, 'tsconfig.json'), 'utf8')) as { include: string[] }
  const dirs = new Set(tsconfig.include.map((g) => g.split('/')[0] as string))
  t.ok(dirs.size >= 4, 'tsconfig.json includes src, workers, bench and test')
  for (const dir of dirs) t.match(text, new RegExp(`^COPY ${dir} ${dir}$`, 'm'), `copies ${dir}/, which the build compiles`)
  const entry = /ENTRYPOINT (\[.*\])/.exec(text)
  t.ok(entry, 'has an exec-form ENTRYPOINT')
  const argv = JSON.parse(entry?.[1] ?? '[]') as string[]
  // the executable itself: its shebang carries the router's V8 flags (scripts/build.mjs)
  t.same(argv, ['/app/dist/src/main.js'])
  t.ok(existsSync(join(root, 'src', 'main.ts')), 'which is built from src/main.ts')
  t.match(readFileSync(join(root, '.dockerignore'), 'utf8'), /^node_modules$/m, 'the host node_modules stays out of the build context')
})

t.test('the image runs a supported Node LTS that package.json admits', async (t) => {
  const text = readFileSync(join(root, 'Dockerfile'), 'utf8')
  const majors = [...text.matchAll(/^FROM node:(\d+)\b/gm)].map((m) => Number(m[1]))
  t.equal(majors.length, 2, 'the build and run stages both start from the node image')
  // Node 20 left support in April 2026; even majors are the LTS lines
  for (const major of majors) t.ok(major >= 22 && major % 2 === 0, `node:${major} is an LTS line still supported`)
  const engines = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { engines: { node: string } }).engines.node
  const min = /^>=(\d+)\./.exec(engines)
  t.ok(min, `engines.node is a lower bound (${engines})`)
  for (const major of majors) t.ok(Number(min?.[1]) <= major, `engines.node (${engines}) admits node:${major}`)
})
