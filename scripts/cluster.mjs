#!/usr/bin/env node
// `npm run cluster`: the topology of docker-compose.yml as processes on loopback, without a
// container engine. nats-server (JetStream, its store in a temporary directory), etcd (its data
// there too), a `kv-router mocker` fleet that registers in etcd and publishes KV events on NATS,
// two `kv-router serve` replicas with --router-replica-sync, and haproxy in front of them, run
// with deploy/haproxy/haproxy.cfg rendered for loopback (the one source of HAProxy's settings).
//
//   npm run cluster [-- [options] [-- serve options for every replica]]
//
// It prints the URLs once HAProxy passes /ready through to every replica, and stops everything on
// SIGINT or SIGTERM: HAProxy first, then the replicas (they drain), the engines (they revoke their
// leases), etcd and NATS; then it removes the temporary directory and exits 0. Once it is up, a
// replica, the engines or HAProxy that exits is started again, as compose's `restart:
// unless-stopped` does, with a growing delay while it keeps exiting; NATS or etcd exiting stops
// the rest (exit 1). nats-server, etcd and haproxy are run by the launcher the tests and
// benchmarks use (src/deploy/services.ts, from dist/). The options are in
// docs/configuration.md#cluster.
import { spawn } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { request } from 'node:http'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = fileURLToPath(new URL('../', import.meta.url))
const MAIN = join(root, 'dist', 'src', 'main.js')

// the options' one table (src/cli/cluster-options.ts): parser, --help and docs/configuration.md
const { ConfigError, clusterHelp, parseClusterArgs } = await import(pathToFileURL(join(root, 'dist', 'src', 'cli', 'cluster-options.js')).href)

/** The options, or the one line and status 2 of a bad command line, as kv-router's own commands do. */
function parseArgs(argv, env) {
  let opts
  try {
    opts = parseClusterArgs(argv, env)
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err
    process.stderr.write(`cluster: ${err.message} (npm run cluster -- --help)\n`)
    process.exit(2)
  }
  if (opts === 'help') {
    process.stdout.write(clusterHelp)
    process.exit(0)
  }
  return opts
}

// ---------------------------------------------------------------------------------------------
// children

const TAIL_LINES = 40

/** A kv-router process in its own process group, so a terminal's Ctrl-C reaches this script only, which stops the children in order. */
class Child {
  constructor(name, bin, args, { cwd, echo, env }) {
    this.name = name
    this.tail = []
    this.out = ''
    this.proc = spawn(bin, args, { cwd, env: env ?? process.env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] })
    this.exited = new Promise((resolve) => {
      this.proc.once('exit', (code, signal) => resolve({ code, signal }))
      this.proc.once('error', (err) => {
        this.push(`spawn error: ${err.message}`, false)
        if (this.proc.pid === undefined) resolve({ code: null, signal: null })
      })
    })
    this.exitInfo = null
    void this.exited.then((e) => (this.exitInfo = e))
    for (const [stream, isErr] of [
      [this.proc.stdout, false],
      [this.proc.stderr, true],
    ]) {
      let partial = ''
      stream.setEncoding('utf8')
      stream.on('data', (d) => {
        if (!isErr) this.out += d
        const lines = (partial + d).split('\n')
        partial = lines.pop() ?? ''
        for (const l of lines) this.push(l, echo, isErr)
      })
    }
  }

  push(line, echo, isErr = true) {
    this.tail.push(line)
    if (this.tail.length > TAIL_LINES) this.tail.shift()
    if (echo) (isErr ? process.stderr : process.stdout).write(`[${this.name}] ${line}\n`)
  }

  get pid() {
    return this.proc.pid
  }

  get running() {
    return this.exitInfo === null && this.proc.pid !== undefined
  }

  /** Signal it, wait up to `ms`, then SIGKILL and wait for the exit. */
  async stop(signal, ms) {
    if (!this.running) return this.exited
    try {
      this.proc.kill(signal)
    } catch {
      // gone meanwhile
    }
    let timer
    const late = await Promise.race([this.exited.then(() => false), new Promise((resolve) => (timer = setTimeout(() => resolve(true), ms)))])
    clearTimeout(timer)
    if (late) {
      process.stderr.write(`cluster: ${this.name} still running ${ms} ms after ${signal}: SIGKILL\n`)
      try {
        this.proc.kill('SIGKILL')
      } catch {
        // gone meanwhile
      }
    }
    return this.exited
  }
}

/**
 * A kv-router process run as compose's `restart: unless-stopped` runs a container: once the
 * cluster is up, an exit is followed by a new start with the same command line. One that ran
 * for RESTART_STABLE_MS comes back at once; one that keeps exiting waits twice as long each time,
 * up to RESTART_MAX_MS, so a replica that cannot start does not spin.
 */
class Supervised {
  constructor(name, spec, echo) {
    this.name = name
    this.spec = spec
    this.echo = echo
    this.restarts = 0
    this.delay = 0
    this.timer = null
    this.run()
  }

  run() {
    this.child = new Child(this.name, this.spec.bin, this.spec.args, { cwd: dir, echo: opts.logs || this.echo, env: this.spec.env })
    this.since = Date.now()
    const child = this.child
    void child.exited.then((e) => {
      if (stopping === null && child === this.child) this.exited(e)
    })
  }

  exited(e) {
    // before the ready line an exit is a failed start (a bad serve option, say): waitFor reports it
    if (!started) return
    const ranFor = Date.now() - this.since
    this.delay = ranFor >= RESTART_STABLE_MS ? RESTART_FIRST_MS : Math.min(RESTART_MAX_MS, Math.max(RESTART_BACKOFF_MS, this.delay * 2))
    const why = ranFor >= RESTART_STABLE_MS ? '' : ` (it ran ${(ranFor / 1000).toFixed(1)} s: backing off)`
    process.stderr.write(`cluster: ${this.name} exited (${describe(e)}); restarting it in ${(this.delay / 1000).toFixed(1)} s${why}\n`)
    if (!this.echo) process.stderr.write(`--- ${this.name}'s last lines ---\n${this.child.tail.join('\n')}\n`)
    this.timer = setTimeout(() => {
      this.timer = null
      if (stopping !== null) return
      this.restarts++
      this.run()
      process.stdout.write(`cluster: ${this.name} restarted (restart ${this.restarts}), pid ${this.child.pid}\n`)
    }, this.delay)
  }

  /** Stops it for good: no restart after this. */
  stop(signal, ms) {
    if (this.timer !== null) clearTimeout(this.timer)
    this.timer = null
    return this.child.stop(signal, ms)
  }
}

const RESTART_FIRST_MS = 100
const RESTART_BACKOFF_MS = 1_000
const RESTART_MAX_MS = 30_000
const RESTART_STABLE_MS = 10_000

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** GET a loopback URL: { status, headers, body } or the error. */
function get(url, timeoutMs = 2000) {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent: false, timeout: timeoutMs }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d) => (body += d))
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs} ms`)))
    req.on('error', reject)
    req.end()
  })
}

/** Polls `probe` until it returns true; fails when a child has exited or the time is up. */
async function waitFor(child, what, probe, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  let last = 'no answer yet'
  for (;;) {
    const gone = supervised.find((s) => !s.child.running)
    if (gone !== undefined) throw new StartError(gone.child, `${gone.name} exited while starting (${describe(gone.child.exitInfo)})`)
    try {
      const r = await probe()
      if (r === true) return
      if (typeof r === 'string') last = r
    } catch (err) {
      last = err instanceof Error ? err.message : String(err)
    }
    if (Date.now() > deadline) throw new StartError(child, `${child.name}: ${what} not within ${timeoutMs / 1000} s (${last})`)
    await sleep(100)
  }
}

/** True when a TCP port on 127.0.0.1 can be bound now. */
function portFree(port) {
  return new Promise((resolve) => {
    const srv = createServer()
    srv.once('error', () => resolve(false))
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)))
  })
}

/** The mocker's ZMQ flags on a run of 2n free ports (engine i: PUB base + i, replay base + n + i). */
async function zmqArgs(n) {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 20000 + Math.floor(Math.random() * 30000)
    let free = true
    for (let p = base; p < base + 2 * n && free; p++) free = await portFree(p)
    if (free) return [`--kv-events-zmq=tcp://127.0.0.1:${base}`, `--kv-events-replay-zmq=tcp://127.0.0.1:${base + n}`]
  }
  throw new Error(`no run of ${2 * n} free ports for the engines' ZMQ sockets`)
}

class StartError extends Error {
  constructor(child, message) {
    super(message)
    this.child = child
  }
}

const describe = (e) => (e === null ? 'running' : e.signal !== null ? `signal ${e.signal}` : `status ${e.code}`)

// ---------------------------------------------------------------------------------------------
// the cluster

const opts = parseArgs(process.argv.slice(2), process.env)
if (!existsSync(MAIN)) {
  process.stderr.write(`cluster: ${MAIN} is missing: build first (node scripts/build.mjs; npm run cluster does)\n`)
  process.exit(1)
}
const { ROUTER_V8_FLAGS } = await import(pathToFileURL(join(root, 'dist', 'src', 'runtime', 'v8-flags.js')).href)
// nats-server, etcd and haproxy through the launcher the tests and benchmarks use
const services = await import(pathToFileURL(join(root, 'dist', 'src', 'deploy', 'services.js')).href)
for (const [name, pkg, env] of [
  ['nats-server', 'nats-server', 'KVR_NATS_SERVER_BIN'],
  ['etcd', 'etcd-server', 'KVR_ETCD_BIN'],
  ['haproxy', 'haproxy', 'KVR_HAPROXY_BIN'],
]) {
  try {
    services.requireExecutable(name, pkg, env)
  } catch (err) {
    process.stderr.write(`cluster: ${err.message}\n`)
    process.exit(1)
  }
}

const dir = mkdtempSync(join(tmpdir(), 'kvr-cluster-'))
/** The kv-router processes, restarted when they exit. */
const supervised = []
/** nats-server, etcd and haproxy, once started. */
const servers = { nats: null, etcd: null, haproxy: null }
let stopping = null
let started = false

/** Stops every child in order, removes the directory and exits with `code`. */
function stopAll(code, reason) {
  if (stopping !== null) return stopping
  if (reason !== undefined) process.stderr.write(`cluster: ${reason}\n`)
  stopping = (async () => {
    const named = (prefix) => supervised.filter((s) => s.name.startsWith(prefix))
    // HAProxy first, so nothing new reaches a replica; the replicas drain before their engines go;
    // the engines revoke their leases while etcd is still up
    await servers.haproxy?.stop()
    await Promise.all(named('router-').map((s) => s.stop('SIGTERM', 30_000)))
    await Promise.all(named('mocker').map((s) => s.stop('SIGTERM', 10_000)))
    await Promise.all(named('indexer').map((s) => s.stop('SIGTERM', 10_000)))
    await servers.etcd?.stop()
    await servers.nats?.stop()
    rmSync(dir, { recursive: true, force: true, maxRetries: 3, retryDelay: 50 })
    process.stdout.write(`cluster: stopped, ${dir} removed\n`)
    process.exit(code)
  })()
  return stopping
}

/** On a second signal: no more waiting, every child is killed at once. */
function killAll() {
  for (const s of supervised) {
    try {
      if (s.child.running) s.child.proc.kill('SIGKILL')
    } catch {
      // gone meanwhile
    }
  }
  rmSync(dir, { recursive: true, force: true, maxRetries: 3, retryDelay: 50 })
  // the launcher's exit hook kills nats-server, etcd and haproxy and removes their directories
  process.exit(1)
}

for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(signal, () => {
    if (stopping !== null) {
      process.stderr.write(`cluster: ${signal} again: killing every child\n`)
      killAll()
      return
    }
    process.stdout.write(`cluster: ${signal}: stopping\n`)
    void stopAll(0)
  })
}

/** What the launcher passes every server: its directory under ours, and what to do when it dies. */
function serverOptions(name, onExit) {
  return { parentDir: dir, echoLogs: opts.logs, stopTimeoutMs: 10_000, onExit: (how) => onExit(name, how) }
}

/** NATS and etcd hold what every other process relies on: without them the cluster stops. */
function fatalExit(name, how) {
  const server = servers[name]
  void stopAll(1, `${name} exited (${how}); it cannot be restarted, so the rest stops. Its last lines:\n${server?.logs(TAIL_LINES) ?? ''}`)
}

/** HAProxy holds no state: it comes back on the same ports, as a replica does. */
let haproxyDelay = 0
let haproxySince = 0
function haproxyExit(_name, how) {
  if (stopping !== null) return
  const ranFor = Date.now() - haproxySince
  haproxyDelay = ranFor >= RESTART_STABLE_MS ? RESTART_FIRST_MS : Math.min(RESTART_MAX_MS, Math.max(RESTART_BACKOFF_MS, haproxyDelay * 2))
  process.stderr.write(`cluster: haproxy exited (${how}); restarting it in ${(haproxyDelay / 1000).toFixed(1)} s\n`)
  setTimeout(async () => {
    if (stopping !== null) return
    haproxySince = Date.now()
    try {
      await servers.haproxy.start()
      process.stdout.write(`cluster: haproxy restarted, pid ${servers.haproxy.pid}\n`)
    } catch (err) {
      haproxyExit('haproxy', err instanceof Error ? err.message.split('\n')[0] : String(err))
    }
  }, haproxyDelay)
}

try {
  const [natsServer, etcdServer] = await Promise.allSettled([
    services.startNats(serverOptions('nats', fatalExit)),
    services.startEtcd(serverOptions('etcd', fatalExit)),
  ])
  if (natsServer.status === 'fulfilled') servers.nats = natsServer.value
  if (etcdServer.status === 'fulfilled') servers.etcd = etcdServer.value
  for (const r of [natsServer, etcdServer]) if (r.status === 'rejected') throw r.reason
  const natsUrl = servers.nats.url
  const etcdUrl = servers.etcd.url
  const routerPorts = await services.getFreePorts(opts.replicas)
  // --shared-indexer: one kv-router indexer, which reads the engines' ZMQ streams for every replica
  let indexerUrl = null
  if (opts.sharedIndexer) {
    const [indexerPort] = await services.getFreePorts(1)
    const indexer = new Supervised('indexer', { bin: process.execPath, args: [MAIN, 'indexer', '--http-host=127.0.0.1', `--http-port=${indexerPort}`] }, true)
    supervised.push(indexer)
    indexerUrl = `http://127.0.0.1:${indexerPort}`
    await waitFor(indexer.child, 'GET /health', async () => (await get(`${indexerUrl}/health`)).status === 200, 30_000)
  }

  // the routers only from kv-router's own environment: a DYN_* variable of the caller's shell
  // would configure them unseen
  const routerEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('DYN_') && k !== 'NATS_SERVER' && k !== 'ETCD_ENDPOINTS'))
  const routers = routerPorts.map((port, i) => {
    const args = [
      ...ROUTER_V8_FLAGS,
      MAIN,
      'serve',
      '--http-host=127.0.0.1',
      `--http-port=${port}`,
      `--router-block-size=${opts.blockSize}`,
      `--nats-url=${natsUrl}`,
      `--etcd-url=${etcdUrl}`,
      '--router-mode=kv',
      '--router-replica-sync',
      // text prompts hashed as their UTF-8 bytes, as the simulated engines read them
      '--tokenizer=bytes',
      '--shutdown-timeout-secs=10',
      ...(indexerUrl === null ? [] : [`--indexer-url=${indexerUrl}`]),
      ...opts.serveArgs,
    ]
    const s = new Supervised(`router-${i + 1}`, { bin: process.execPath, args, env: routerEnv }, true)
    supervised.push(s)
    return s
  })
  // listening means subscribed; /ready waits for a worker, which comes after
  await Promise.all(
    routers.map((r, i) => waitFor(r.child, 'GET /health', async () => (await get(`http://127.0.0.1:${routerPorts[i]}/health`)).status === 200, 30_000)),
  )

  // after the routers: KV events go over plain NATS subjects, which only reach subscribers
  const mockerArgs = [
    MAIN,
    'mocker',
    `--num-workers=${opts.engines}`,
    `--block-size=${opts.blockSize}`,
    `--speedup-ratio=${opts.speedup}`,
    `--engine-profile=${opts.engineProfile}`,
    '--host=127.0.0.1',
    '--http-port=0',
    `--etcd-url=${etcdUrl}`,
    // with a shared indexer the engines publish over ZMQ instead of NATS (PUB base + i, replay base + n + i) and list those
    // endpoints in etcd, where the replicas find them and tell the indexer
    ...(indexerUrl === null ? [`--nats-url=${natsUrl}`] : await zmqArgs(opts.engines)),
  ]
  const mocker = new Supervised('mocker', { bin: process.execPath, args: mockerArgs }, true)
  supervised.push(mocker)
  await waitFor(mocker.child, 'its ready line', () => /kv-router mocker: ready/.test(mocker.child.out), 30_000)
  const engineUrls = /kv-router mocker: ready \d+ engine\(s\) (.*)/.exec(mocker.child.out)?.[1]?.trim().split(' ') ?? []
  // every replica discovers every engine in etcd
  await Promise.all(
    routers.map((r, i) =>
      waitFor(
        r.child,
        `${opts.engines} workers from etcd`,
        async () => {
          const r = await get(`http://127.0.0.1:${routerPorts[i]}/ready`)
          const workers = JSON.parse(r.body).workers
          return (workers >= opts.engines && r.status === 200) || `${workers} worker(s), /ready ${r.status}`
        },
        30_000,
      ),
    ),
  )

  // the clients' frontend is the configuration's first bind, as in docker-compose.yml, where it is published on 8000
  haproxySince = Date.now()
  servers.haproxy = await services.startHaproxy({
    ...serverOptions('haproxy', haproxyExit),
    stopTimeoutMs: 5_000,
    backends: routerPorts.map((port, i) => ({ name: `router-${i + 1}`, port })),
    ...(opts.port !== 0 ? { port: opts.port } : {}),
  })
  const lb = servers.haproxy.url
  // through HAProxy until every replica has answered: each is in the rotation
  const seen = new Set()
  const haproxyTail = {
    name: 'haproxy',
    get tail() {
      return servers.haproxy.logs(TAIL_LINES).split('\n')
    },
  }
  await waitFor(
    haproxyTail,
    'GET /ready through to every replica',
    async () => {
      const r = await get(`${lb}/ready`)
      if (r.status === 200 && typeof r.headers['x-router-replica'] === 'string') seen.add(r.headers['x-router-replica'])
      return seen.size === opts.replicas || `status ${r.status}, replicas seen: ${[...seen].join(', ') || 'none'}`
    },
    30_000,
  )
  // a child that exited during the last wait
  for (const s of supervised) if (!s.child.running) await stopAll(1, `${s.name} exited while starting (${describe(s.child.exitInfo)})`)
  started = true

  const stats = servers.haproxy.statsUrl
  const pids = [['nats', servers.nats.pid], ['etcd', servers.etcd.pid], ...supervised.map((s) => [s.name, s.child.pid]), ['haproxy', servers.haproxy.pid]]
  const lines = [
    `cluster: ready ${lb}`,
    `  haproxy    ${lb} (stats and metrics: ${stats}/stats ${stats}/metrics)`,
    ...routers.map((r, i) => `  ${r.name.padEnd(10)} http://127.0.0.1:${routerPorts[i]}`),
    `  engines    ${engineUrls.join(' ')}`,
    ...(indexerUrl === null ? [] : [`  indexer    ${indexerUrl} (the replicas route on it: --indexer-url)`]),
    `  nats       ${natsUrl}`,
    `  etcd       ${etcdUrl}`,
    `  dir        ${dir}`,
    `  pids       ${pids.map(([name, pid]) => `${name}=${pid}`).join(' ')}`,
    `try: curl -si ${lb}/v1/completions -H 'content-type: application/json' -d '{"model":"kv-router-model","prompt":"Hello, cluster","max_tokens":4}'`,
    'A replica, the engines or HAProxy that exits is restarted; NATS or etcd exiting stops everything.',
    'Ctrl-C stops everything.',
  ]
  process.stdout.write(lines.join('\n') + '\n')
} catch (err) {
  const tail = err instanceof StartError ? `\n--- ${err.child.name}'s last lines ---\n${err.child.tail.join('\n')}` : ''
  await stopAll(1, `${err instanceof Error ? err.message : String(err)}${tail}`)
}
