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
// leases), etcd and NATS; then it removes the temporary directory and exits 0. A child that exits
// on its own stops the rest too (exit 1). The options are in docs/configuration.md#cluster.
import { spawn } from 'node:child_process'
import { accessSync, constants, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { request } from 'node:http'
import { connect, createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { delimiter, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = fileURLToPath(new URL('../', import.meta.url))
const HAPROXY_CFG = join(root, 'deploy', 'haproxy', 'haproxy.cfg')
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
// executables and ports

function isExecutable(path) {
  try {
    accessSync(path, constants.X_OK)
    return statSync(path).isFile()
  } catch {
    return false
  }
}

/** A server's binary from PATH or the (s)bin directories Debian installs into (root's PATH may lack /usr/sbin). */
function requireBinary(name, debianPackage) {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin', '/usr/local/sbin', '/usr/bin', '/usr/local/bin', '/sbin', '/bin']
  for (const dir of dirs) if (dir !== '' && isExecutable(join(dir, name))) return join(dir, name)
  process.stderr.write(`cluster: ${name} not found (PATH and the sbin directories); on Debian: apt-get update && apt-get install -y ${debianPackage}\n`)
  process.exit(1)
}

/** `count` distinct free ports on 127.0.0.1: all held open at once, then released. */
async function freePorts(count) {
  const servers = []
  try {
    for (let i = 0; i < count; i++) {
      servers.push(
        await new Promise((resolve, reject) => {
          const s = createServer()
          s.once('error', reject)
          s.listen({ host: '127.0.0.1', port: 0, exclusive: true }, () => resolve(s))
        }),
      )
    }
    return servers.map((s) => s.address().port)
  } finally {
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))))
  }
}

// ---------------------------------------------------------------------------------------------
// children

const TAIL_LINES = 40

/** A child process in its own process group, so a terminal's Ctrl-C reaches this script only, which stops the children in order. */
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

/** Whether a NATS server on the port greets with INFO. */
function natsGreets(port) {
  return new Promise((resolve) => {
    const s = connect({ host: '127.0.0.1', port })
    const done = (ok) => {
      s.destroy()
      resolve(ok)
    }
    s.setTimeout(1000, () => done(false))
    s.on('error', () => done(false))
    s.on('data', (d) => done(d.toString('utf8').startsWith('INFO ')))
  })
}

/** Polls `probe` until it returns true; fails when any child has exited or the time is up. */
async function waitFor(child, what, probe, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  let last = 'no answer yet'
  for (;;) {
    const gone = children.find((c) => !c.running)
    if (gone !== undefined) throw new StartError(gone, `${gone.name} exited while starting (${describe(gone.exitInfo)})`)
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
const bins = { nats: requireBinary('nats-server', 'nats-server'), etcd: requireBinary('etcd', 'etcd-server'), haproxy: requireBinary('haproxy', 'haproxy') }
if (!existsFile(MAIN)) {
  process.stderr.write(`cluster: ${MAIN} is missing: build first (node scripts/build.mjs; npm run cluster does)\n`)
  process.exit(1)
}
const { ROUTER_V8_FLAGS } = await import(pathToFileURL(join(root, 'dist', 'src', 'runtime', 'v8-flags.js')).href)
// deploy/haproxy/haproxy.cfg rendered for loopback, as the tests render it
const { haproxyBindPorts, renderHaproxyConfig } = await import(pathToFileURL(join(root, 'dist', 'src', 'deploy', 'haproxy.js')).href)
const haproxyTemplate = readFileSync(HAPROXY_CFG, 'utf8')
const binds = haproxyBindPorts(haproxyTemplate)

function existsFile(path) {
  try {
    return statSync(path).isFile()
  } catch {
    return false
  }
}

const dir = mkdtempSync(join(tmpdir(), 'kvr-cluster-'))
/** Started children, in start order; stopped in reverse groups (see stopAll). */
const children = []
let stopping = null

/** Stops every child in order, removes the directory and exits with `code`. */
function stopAll(code, reason) {
  if (stopping !== null) return stopping
  if (reason !== undefined) process.stderr.write(`cluster: ${reason}\n`)
  stopping = (async () => {
    const named = (prefix) => children.filter((c) => c.name.startsWith(prefix))
    // HAProxy first, so nothing new reaches a replica; the replicas drain before their engines go;
    // the engines revoke their leases while etcd is still up
    const order = [
      [named('haproxy'), 'SIGTERM', 5_000],
      [named('router-'), 'SIGTERM', 30_000],
      [named('mocker'), 'SIGTERM', 10_000],
      [named('etcd'), 'SIGTERM', 10_000],
      [named('nats'), 'SIGTERM', 10_000],
    ]
    for (const [group, signal, ms] of order) await Promise.all(group.map((c) => c.stop(signal, ms)))
    rmSync(dir, { recursive: true, force: true, maxRetries: 3, retryDelay: 50 })
    process.stdout.write(`cluster: stopped, ${dir} removed\n`)
    process.exit(code)
  })()
  return stopping
}

/** On a second signal: no more waiting, every child is killed at once. */
function killAll() {
  for (const c of children) {
    try {
      if (c.running) c.proc.kill('SIGKILL')
    } catch {
      // gone meanwhile
    }
  }
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

function start(name, bin, args, extra = {}) {
  const child = new Child(name, bin, args, { cwd: dir, echo: opts.logs || extra.echo === true, env: extra.env })
  children.push(child)
  void child.exited.then((e) => {
    if (stopping === null && started) void stopAll(1, `${name} exited (${describe(e)}); stopping the rest. Its last lines:\n${child.tail.join('\n')}`)
  })
  return child
}

let started = false
try {
  const [natsPort, etcdPort, etcdPeerPort, ...rest] = await freePorts(3 + opts.replicas + binds.length)
  const routerPorts = rest.slice(0, opts.replicas)
  const bindPorts = new Map(binds.map((p, i) => [p, rest[opts.replicas + i]]))
  // the clients' frontend is the first bind, as in docker-compose.yml, where it is published on 8000
  if (opts.port !== 0) bindPorts.set(binds[0], opts.port)
  const lbPort = bindPorts.get(binds[0])
  const natsUrl = `nats://127.0.0.1:${natsPort}`
  const etcdUrl = `http://127.0.0.1:${etcdPort}`

  const nats = start('nats', bins.nats, ['--addr', '127.0.0.1', '--port', String(natsPort), '--jetstream', '--store_dir', join(dir, 'nats')])
  // etcd reads ETCD_* variables as flags: none of the caller's may conflict with these
  const etcdEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('ETCD_')))
  const etcd = start(
    'etcd',
    bins.etcd,
    [
      '--name=kvr-cluster',
      `--data-dir=${join(dir, 'etcd')}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=http://127.0.0.1:${etcdPeerPort}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${etcdPeerPort}`,
      `--initial-cluster=kvr-cluster=http://127.0.0.1:${etcdPeerPort}`,
    ],
    { env: etcdEnv },
  )
  await Promise.all([
    waitFor(nats, 'INFO on its port', () => natsGreets(natsPort), 20_000),
    waitFor(etcd, 'GET /health', async () => (await get(`${etcdUrl}/health`)).body.includes('"true"'), 20_000),
  ])

  // the routers only from kv-router's own environment: a DYN_* variable of the caller's shell
  // would configure them unseen
  const routerEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('DYN_') && k !== 'NATS_SERVER' && k !== 'ETCD_ENDPOINTS'))
  const routers = routerPorts.map((port, i) =>
    start(
      `router-${i + 1}`,
      process.execPath,
      [
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
        ...opts.serveArgs,
      ],
      { echo: true, env: routerEnv },
    ),
  )
  // listening means subscribed; /ready waits for a worker, which comes after
  await Promise.all(
    routers.map((r, i) => waitFor(r, 'GET /health', async () => (await get(`http://127.0.0.1:${routerPorts[i]}/health`)).status === 200, 30_000)),
  )

  // after the routers: KV events go over plain NATS subjects, which only reach subscribers
  const mocker = start(
    'mocker',
    process.execPath,
    [
      MAIN,
      'mocker',
      `--num-workers=${opts.engines}`,
      `--block-size=${opts.blockSize}`,
      `--speedup-ratio=${opts.speedup}`,
      '--host=127.0.0.1',
      '--http-port=0',
      `--nats-url=${natsUrl}`,
      `--etcd-url=${etcdUrl}`,
    ],
    { echo: true },
  )
  await waitFor(mocker, 'its ready line', () => /kv-router mocker: ready/.test(mocker.out), 30_000)
  const engineUrls = /kv-router mocker: ready \d+ engine\(s\) (.*)/.exec(mocker.out)?.[1]?.trim().split(' ') ?? []
  // every replica discovers every engine in etcd
  await Promise.all(
    routers.map((r, i) =>
      waitFor(
        r,
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

  const cfgPath = join(dir, 'haproxy.cfg')
  writeFileSync(
    cfgPath,
    renderHaproxyConfig(
      haproxyTemplate,
      bindPorts,
      routerPorts.map((port, i) => ({ name: `router-${i + 1}`, port })),
    ),
  )
  const haproxy = start('haproxy', bins.haproxy, ['-db', '-f', cfgPath])
  // through HAProxy until every replica has answered: each is in the rotation
  const seen = new Set()
  await waitFor(
    haproxy,
    'GET /ready through to every replica',
    async () => {
      const r = await get(`http://127.0.0.1:${lbPort}/ready`)
      if (r.status === 200 && typeof r.headers['x-router-replica'] === 'string') seen.add(r.headers['x-router-replica'])
      return seen.size === opts.replicas || `status ${r.status}, replicas seen: ${[...seen].join(', ') || 'none'}`
    },
    30_000,
  )
  started = true
  // a child that exited during the last wait
  for (const c of children) if (!c.running) await stopAll(1, `${c.name} exited (${describe(c.exitInfo)})`)

  const stats = [...bindPorts.entries()].filter(([from]) => from !== binds[0]).map(([, port]) => `http://127.0.0.1:${port}`)
  const lines = [
    `cluster: ready http://127.0.0.1:${lbPort}`,
    `  haproxy    http://127.0.0.1:${lbPort}${stats.length > 0 ? ` (stats and metrics: ${stats.map((u) => `${u}/stats ${u}/metrics`).join(', ')})` : ''}`,
    ...routers.map((r, i) => `  ${r.name.padEnd(10)} http://127.0.0.1:${routerPorts[i]}`),
    `  engines    ${engineUrls.join(' ')}`,
    `  nats       ${natsUrl}`,
    `  etcd       ${etcdUrl}`,
    `  dir        ${dir}`,
    `  pids       ${children.map((c) => `${c.name}=${c.proc.pid}`).join(' ')}`,
    `try: curl -si http://127.0.0.1:${lbPort}/v1/completions -H 'content-type: application/json' -d '{"model":"kv-router-model","prompt":"Hello, cluster","max_tokens":4}'`,
    'Ctrl-C stops everything.',
  ]
  process.stdout.write(lines.join('\n') + '\n')
} catch (err) {
  const tail = err instanceof StartError ? `\n--- ${err.child.name}'s last lines ---\n${err.child.tail.join('\n')}` : ''
  await stopAll(1, `${err instanceof Error ? err.message : String(err)}${tail}`)
}
