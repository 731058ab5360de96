// No container engine runs on the machines that test this project, so docker-compose.yml and the
// Dockerfile are checked here instead: every command line goes through the parser of the
// kv-router command it runs, and the services agree with each other (addresses, ports, block
// size, health checks that the dependencies wait on, the trace the load generator mounts).
import t from 'tap'
import { existsSync, readFileSync, statSync } from 'node:fs'
import { dirname, isAbsolute, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parse } from 'yaml'
import { parseServeConfig, type ServeConfig } from '../src/config.js'
import { parseMockerArgs } from '../src/sim/mocker/main.js'
import { parseReplayArgs, type ReplayArgs } from '../src/sim/replay/main.js'

function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url))
  while (!existsSync(join(dir, 'package.json'))) dir = dirname(dir)
  return dir
}
const root = repoRoot()

interface Service {
  image?: string
  build?: string
  command?: string[]
  ports?: string[]
  volumes?: string[]
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

t.test('the services of a load-test fleet are there, on pinned images', async (t) => {
  for (const name of ['nats', 'etcd', 'router', 'mocker', 'loadgen']) t.ok(services[name], `service ${name}`)
  for (const [name, s] of Object.entries(services)) {
    t.ok(s.image, `${name} names its image`)
    t.notMatch(s.image ?? '', /:latest$|^[^:]+$/, `${name}'s image has a pinned tag`)
  }
  const built = Object.entries(services).filter(([, s]) => s.build !== undefined)
  t.ok(built.length >= 3, 'router, engines and load generator are built from this repository')
  for (const [name, s] of built) {
    t.equal(s.build, '.', `${name} builds the Dockerfile at the root`)
    t.equal(s.image, 'kv-router:local', `${name} shares the one kv-router image`)
  }
  t.same(svc('loadgen').profiles, ['load'], 'the load generator runs only when asked for')
})

t.test('every dependency exists and has the health check its dependants wait for', async (t) => {
  for (const [name, s] of Object.entries(services)) {
    for (const [dep, how] of Object.entries(s.depends_on ?? {})) {
      t.ok(services[dep], `${name} depends on an existing service (${dep})`)
      if (how.condition === 'service_healthy') t.ok(services[dep]?.healthcheck?.test.length, `${dep} has a health check (${name} waits for it)`)
    }
  }
  t.ok(cmd('nats').includes('--jetstream') || cmd('nats').includes('-js'), 'nats-server runs with JetStream')
})

t.test('the router command is a valid `kv-router serve` and points at the fleet', async (t) => {
  const argv = cmd('router')
  t.equal(argv[0], 'serve')
  let cfg: ServeConfig | 'help' | undefined
  t.doesNotThrow(() => {
    cfg = parseServeConfig(argv.slice(1), {})
  }, 'every flag is accepted')
  if (cfg === undefined || cfg === 'help') return t.fail('no configuration')
  t.equal(cfg.mode, 'kv')
  t.equal(hostPort(cfg.natsUrl ?? ''), 'nats:4222', 'KV events from the nats service')
  t.equal(hostPort(cfg.etcdUrl ?? ''), 'etcd:2379', 'workers from the etcd service')
  t.equal(cfg.nice, 0, 'niceness 0 unless KVR_ROUTER_NICE says otherwise')
  // the image runs as an unprivileged user, for whom RLIMIT_NICE is what allows 20 - limit
  const limit = svc('router').ulimits?.nice
  t.equal(typeof limit === 'object' ? limit.soft : limit, 40, 'RLIMIT_NICE lets any KVR_ROUTER_NICE down to -20 take effect')
  const port = cfg.httpPort
  t.ok(
    (svc('router').ports ?? []).some((p) => p.endsWith(`:${port}`)),
    'the published port is the one it listens on',
  )
  t.match(svc('router').healthcheck?.test.join(' ') ?? '', new RegExp(`127\\.0\\.0\\.1:${port}/ready`), 'healthy once /ready says so')
  t.ok(cmd('etcd').includes('--advertise-client-urls=http://etcd:2379'), 'etcd advertises the address the router uses')
  // Docker sends SIGKILL at the grace period: the router's own deadline must come first, with
  // time left to cut the rest, free its bookings and stop its threads
  const grace = /^(\d+)s$/.exec(svc('router').stop_grace_period ?? '')
  t.ok(grace, 'a grace period in seconds')
  t.ok(Number(grace?.[1]) >= cfg.shutdownTimeoutSecs + 5, `grace ${svc('router').stop_grace_period} leaves 5 s after the drain deadline (${cfg.shutdownTimeoutSecs} s)`)
  for (const name of ['router', 'mocker']) t.equal(svc(name).restart, 'unless-stopped', `${name} comes back if it exits`)
})

t.test('the engines are a valid `kv-router mocker` that the router can reach and agree with', async (t) => {
  const argv = cmd('mocker')
  t.equal(argv[0], 'mocker')
  t.doesNotThrow(() => parseMockerArgs(argv.slice(1)), 'every flag is accepted')
  const router = parseServeConfig(cmd('router').slice(1), {}) as ServeConfig
  t.equal(Number(flag(argv, '--block-size')), router.blockSize, 'engines and router use one block size')
  t.equal(flag(argv, '--advertise-host'), 'mocker', 'engines advertise their service name, which the router resolves')
  t.equal(flag(argv, '--host'), '0.0.0.0', 'engines listen beyond the container')
  t.equal(hostPort(flag(argv, '--nats-url') ?? ''), 'nats:4222', 'events go where the router listens')
  t.equal(hostPort(flag(argv, '--etcd-url') ?? ''), 'etcd:2379', 'engines register where the router looks')
  t.match(svc('mocker').healthcheck?.test.join(' ') ?? '', new RegExp(`127\\.0\\.0\\.1:${flag(argv, '--http-port')}/health`), 'the health check asks the first engine')
  t.ok(svc('mocker').depends_on?.router, 'engines start after the router has subscribed')
})

t.test('the load generator replays the trace through the router', async (t) => {
  const argv = cmd('loadgen')
  t.equal(argv[0], 'replay')
  let args: ReplayArgs | 'help' | undefined
  t.doesNotThrow(() => {
    args = parseReplayArgs(argv.slice(1))
  }, 'every flag is accepted')
  if (args === undefined || args === 'help') return t.fail('no arguments')
  const router = parseServeConfig(cmd('router').slice(1), {}) as ServeConfig
  t.equal(hostPort(args.url), `router:${router.httpPort}`, 'it targets the router service')
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
  // `npm ci` runs tsc over everything tsconfig.json includes (bench/ imports test helpers)
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
