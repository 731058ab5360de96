// The real services kv-router talks to, run as processes on loopback: nats-server (with
// JetStream), etcd, and HAProxy in front of replicas. One launcher for the tests, the benchmarks
// and `npm run cluster`: it finds the binary (PATH, then the (s)bin directories Debian installs
// into, which root's PATH may lack), picks free 127.0.0.1 ports, starts the server in a fresh
// temporary directory, waits until it really answers, and stops it (SIGTERM, then SIGKILL)
// without leaving a process or a directory behind.
//
// Real servers, not mocks, for the tests: the router depends on how these systems actually behave
// (JetStream sequences and acks, redelivery, client reconnects across a restart, lease expiry
// turning into watch DELETE events, data surviving a restart), which a mock would only restate.
//
// A missing binary is an error whose message says how to install it (Debian:
// `apt-get install -y nats-server etcd-server haproxy`). KVR_NATS_SERVER_BIN, KVR_ETCD_BIN and
// KVR_HAPROXY_BIN override the lookup; KVR_SERVICE_LOGS=1 echoes every server's output to stderr.
//
// Orphan protection, in layers:
//   1. `stop()` terminates the server and removes its directory.
//   2. A process 'exit' handler SIGKILLs every server still running and removes the directories.
//   3. Each server has a small detached `sh` watchdog that SIGKILLs it (and removes its directory)
//      once this process is gone without running its 'exit' handlers (SIGKILL, a fatal signal).
// Servers run in their own process group, so a terminal's Ctrl-C reaches only the process that
// started them, which stops them in its own order; their handles are unref'd, so a server left
// running does not keep that process alive (layer 2 then cleans up).
import { spawn, type ChildProcess } from 'node:child_process'
import { accessSync, existsSync, constants as fsConstants, readFileSync, rmSync, statSync } from 'node:fs'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { request as httpRequest } from 'node:http'
import { createServer, connect as netConnect, type Server } from 'node:net'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { randomBytes } from 'node:crypto'
import { haproxyBindPorts, renderHaproxyConfig } from './haproxy.js'
import type { HaproxyBackend } from './haproxy.js'

// ---------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------

export interface ServiceOptions {
  /** How long to wait for the server to answer after spawning it. Default 20000. */
  startTimeoutMs?: number
  /** How long to wait after SIGTERM before escalating to SIGKILL. Default 5000. */
  stopTimeoutMs?: number
  /** Echo server output to stderr (default: env KVR_SERVICE_LOGS === '1'). */
  echoLogs?: boolean
  /** Where the server's own temporary directory is made. Default the system's. */
  parentDir?: string
  /**
   * Called when the server exits on its own while running (not through kill(), restart() or
   * stop()), with how it exited: whoever started it decides whether that ends its work.
   */
  onExit?: (how: string) => void
}

export interface NatsOptions extends ServiceOptions {
  /** Enable JetStream (file storage inside `dataDir`). Default true. */
  jetstream?: boolean
}

export type EtcdOptions = ServiceOptions

/** Lifecycle state of a managed server. */
export type ServiceState =
  /** process is up and answered the readiness probe */
  | 'running'
  /** process is not running (after `kill()`), but ports and data are kept; `start()` brings it back */
  | 'down'
  /** final: `stop()` was called, temp dir removed */
  | 'stopped'

export interface ManagedServer {
  /** Binary name, e.g. 'nats-server' or 'etcd'. */
  readonly name: string
  /** Client URL, stable across restarts. */
  readonly url: string
  /** Client port on 127.0.0.1, stable across restarts. */
  readonly port: number
  /** Fresh temp directory holding the server's data; removed by `stop()`. */
  readonly dataDir: string
  readonly state: ServiceState
  /** PID of the current server process (undefined when not running). */
  readonly pid: number | undefined
  /** Gracefully stop (SIGTERM, then SIGKILL) and start again on the same ports and data dir. */
  restart(): Promise<void>
  /**
   * Stop the process abruptly (default SIGKILL) but keep ports and data so
   * `start()` can bring the server back later. Use to simulate an outage/crash.
   */
  kill(signal?: NodeJS.Signals): Promise<void>
  /** Start again after `kill()`. No-op when already running. */
  start(): Promise<void>
  /** Final stop: SIGTERM, SIGKILL after `stopTimeoutMs`, then remove `dataDir`. Idempotent. */
  stop(): Promise<void>
  /** The last `lines` lines of the server's stdout/stderr. */
  logs(lines?: number): string
}

export interface NatsServer extends ManagedServer {
  /** Whether JetStream is enabled. */
  readonly jetstream: boolean
}

export interface EtcdServer extends ManagedServer {
  /** Raft peer port on 127.0.0.1, stable across restarts. */
  readonly peerPort: number
  readonly peerUrl: string
}

// ---------------------------------------------------------------------------
// Binaries
// ---------------------------------------------------------------------------

const EXTRA_BIN_DIRS = ['/usr/sbin', '/usr/local/sbin', '/usr/bin', '/usr/local/bin', '/sbin', '/bin']

function isExecutableFile(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false
    accessSync(path, fsConstants.X_OK)
    return true
  } catch {
    return false
  }
}

/** Look for an executable in PATH and the usual (s)bin directories. */
export function findExecutable(name: string): string | undefined {
  const pathDirs = (process.env['PATH'] ?? '').split(delimiter).filter(Boolean)
  for (const dir of [...pathDirs, ...EXTRA_BIN_DIRS]) {
    const candidate = join(dir, name)
    if (isExecutableFile(candidate)) return candidate
  }
  return undefined
}

/**
 * Resolve a server binary or throw an Error explaining how to install it.
 * `overrideEnv` names an environment variable that may point at the binary.
 */
export function requireExecutable(name: string, debianPackage: string, overrideEnv?: string): string {
  const override = overrideEnv ? process.env[overrideEnv] : undefined
  if (override) {
    if (isExecutableFile(override)) return override
    throw new Error(`${overrideEnv}=${override} is not an executable file`)
  }
  const found = findExecutable(name)
  if (found) return found
  throw new Error(
    `'${name}' binary not found (searched PATH and ${EXTRA_BIN_DIRS.join(', ')}). ` +
      `Install it with: ` +
      `apt-get update && apt-get install -y ${debianPackage}`,
  )
}

// ---------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------

function listenEphemeral(host: string): Promise<Server> {
  return new Promise((resolve, reject) => {
    const srv = createServer()
    srv.unref()
    srv.once('error', reject)
    srv.listen({ host, port: 0, exclusive: true }, () => resolve(srv))
  })
}

function closeServer(srv: Server): Promise<void> {
  return new Promise((resolve) => srv.close(() => resolve()))
}

/**
 * Reserve `count` distinct free TCP ports on `host` (bind to port 0, read the
 * port, close). All probes are held open together so the ports are distinct.
 * There is an unavoidable window before the server binds; the start helpers
 * retry with new ports if that race is lost.
 */
export async function getFreePorts(count: number, host = '127.0.0.1'): Promise<number[]> {
  const servers: Server[] = []
  try {
    for (let i = 0; i < count; i++) servers.push(await listenEphemeral(host))
    return servers.map((s) => {
      const addr = s.address()
      if (addr === null || typeof addr === 'string') throw new Error('unexpected server address')
      return addr.port
    })
  } finally {
    await Promise.all(servers.map(closeServer))
  }
}

export async function getFreePort(host = '127.0.0.1'): Promise<number> {
  const [port] = await getFreePorts(1, host)
  if (port === undefined) throw new Error('could not allocate a free port')
  return port
}

// ---------------------------------------------------------------------------
// Process-exit safety net
// ---------------------------------------------------------------------------

const liveChildren = new Set<ChildProcess>()
const liveTempDirs = new Set<string>()
let exitHookInstalled = false

function installExitHook(): void {
  if (exitHookInstalled) return
  exitHookInstalled = true
  process.on('exit', () => {
    for (const child of liveChildren) {
      try {
        child.kill('SIGKILL')
      } catch {
        // already gone
      }
    }
    for (const pid of [...liveWatchdogs]) killWatchdog(pid)
    for (const dir of liveTempDirs) {
      try {
        rmSync(dir, { recursive: true, force: true, maxRetries: 3, retryDelay: 20 })
      } catch {
        // best effort
      }
    }
  })
}

/**
 * Detached shell that SIGKILLs the server ($2) once this Node process ($1) is
 * gone, then removes the server's temp dir (passed as WATCHDOG_RMDIR in
 * its environment). It exits by itself as soon as the server exits.
 * "Gone" means the watchdog was re-parented (its parent pid in /proc is no
 * longer ours), which also works while our dead process lingers as an
 * unreaped zombie; without /proc it falls back to `kill -0`. Neither the
 * script nor its argv mention the server names, so
 * `ps aux | grep -E 'nats-server|etcd'` stays meaningful.
 */
const WATCHDOG_SCRIPT = [
  'owner_alive() {',
  '  if [ -r /proc/$$/stat ]; then read -r _ _ _ pp _ < /proc/$$/stat; [ "$pp" = "$1" ];',
  '  else kill -0 "$1" 2>/dev/null; fi',
  '}',
  'while owner_alive "$1"; do kill -0 "$2" 2>/dev/null || exit 0; sleep 0.5; done',
  'kill -9 "$2" 2>/dev/null',
  'if [ -n "${WATCHDOG_RMDIR:-}" ]; then sleep 0.2; rm -rf -- "$WATCHDOG_RMDIR"; fi',
  'exit 0',
].join('\n')

const liveWatchdogs = new Set<number>()

/** Kill a watchdog's whole process group (the shell and its `sleep`). */
function killWatchdog(pid: number): void {
  liveWatchdogs.delete(pid)
  try {
    process.kill(-pid, 'SIGKILL')
  } catch {
    // already gone
  }
}

/** Returns the watchdog's pid (its own process group), or undefined if it could not be started. */
function spawnWatchdog(childPid: number, rmDir: string): number | undefined {
  try {
    const wd = spawn('/bin/sh', ['-c', WATCHDOG_SCRIPT, 'kvr-service-watchdog', String(process.pid), String(childPid)], {
      stdio: 'ignore',
      detached: true,
      env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', WATCHDOG_RMDIR: rmDir },
    })
    wd.on('error', () => {})
    wd.unref()
    if (wd.pid !== undefined) liveWatchdogs.add(wd.pid)
    return wd.pid
  } catch {
    // The 'exit' handler is still in place; the watchdog is an extra layer.
    return undefined
  }
}

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

interface ExitInfo {
  code: number | null
  signal: NodeJS.Signals | null
}

function describeExit(e: ExitInfo): string {
  return e.signal ? `signal ${e.signal}` : `exit code ${String(e.code)}`
}

/** Resolve with the promise's value, or 'timeout' after ms; the timer is always cleared. */
async function raceTimeout<T>(p: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let timer: NodeJS.Timeout | undefined
  try {
    return await Promise.race([
      p,
      new Promise<'timeout'>((resolve) => {
        timer = setTimeout(() => resolve('timeout'), ms)
      }),
    ])
  } finally {
    if (timer) clearTimeout(timer)
  }
}

class LogTail {
  readonly #lines: string[] = []
  readonly #partial = new Map<string, string>()
  constructor(
    private readonly max: number,
    private readonly echoPrefix: string | undefined,
  ) {}

  push(stream: string, chunk: Buffer | string): void {
    const text = (this.#partial.get(stream) ?? '') + chunk.toString()
    const parts = text.split('\n')
    this.#partial.set(stream, parts.pop() ?? '')
    for (const line of parts) this.#add(stream, line)
  }

  mark(text: string): void {
    this.#add('harness', text)
  }

  tail(n: number): string {
    const partials = [...this.#partial.entries()].filter(([, v]) => v !== '').map(([s, v]) => `[${s}] ${v}`)
    return [...this.#lines, ...partials].slice(-n).join('\n')
  }

  #add(stream: string, line: string): void {
    const entry = `[${stream}] ${line.replace(/\r$/, '')}`
    this.#lines.push(entry)
    if (this.#lines.length > this.max) this.#lines.splice(0, this.#lines.length - this.max)
    if (this.echoPrefix !== undefined) process.stderr.write(`${this.echoPrefix} ${entry}\n`)
  }
}

// ---------------------------------------------------------------------------
// Generic managed server
// ---------------------------------------------------------------------------

class StartupError extends Error {
  constructor(
    message: string,
    readonly addressInUse: boolean,
  ) {
    super(message)
    this.name = 'StartupError'
  }
}

abstract class ManagedProcess implements ManagedServer {
  readonly name: string
  readonly dataDir: string
  #state: ServiceState = 'down'
  #child: ChildProcess | undefined
  #exit: Promise<ExitInfo> | undefined
  #ops: Promise<unknown> = Promise.resolve()
  #everStarted = false
  protected readonly log: LogTail
  protected readonly startTimeoutMs: number
  protected readonly stopTimeoutMs: number
  private readonly onExit: ((how: string) => void) | undefined

  protected constructor(
    name: string,
    private readonly bin: string,
    dataDir: string,
    opts: ServiceOptions,
  ) {
    this.name = name
    this.dataDir = dataDir
    this.startTimeoutMs = opts.startTimeoutMs ?? 20_000
    this.stopTimeoutMs = opts.stopTimeoutMs ?? 5_000
    this.onExit = opts.onExit
    const echo = opts.echoLogs ?? process.env['KVR_SERVICE_LOGS'] === '1'
    this.log = new LogTail(200, echo ? `[${name}]` : undefined)
  }

  abstract readonly url: string
  abstract readonly port: number
  /** Command-line arguments for the current port assignment. */
  protected abstract args(): string[]
  /** Resolve when the server is ready; reject (with a reason) when it is not yet. */
  protected abstract probe(timeoutMs: number): Promise<void>
  /** Pick new ports (only used before the first successful start). */
  protected abstract reassignPorts(): Promise<void>
  protected env(): NodeJS.ProcessEnv {
    return { ...process.env }
  }

  get state(): ServiceState {
    return this.#state
  }

  get pid(): number | undefined {
    return this.#state === 'running' ? this.#child?.pid : undefined
  }

  logs(lines = 40): string {
    return this.log.tail(lines)
  }

  start(): Promise<void> {
    return this.#serial(async () => {
      if (this.#state === 'stopped') throw new Error(`${this.name}: start() after final stop()`)
      if (this.#state === 'running') return
      await this.#startWithRetry()
    })
  }

  restart(): Promise<void> {
    return this.#serial(async () => {
      if (this.#state === 'stopped') throw new Error(`${this.name}: restart() after final stop()`)
      this.log.mark('--- restart ---')
      await this.#terminate('SIGTERM')
      await this.#spawnAndWait()
    })
  }

  kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    return this.#serial(async () => {
      if (this.#state === 'stopped') return
      this.log.mark(`--- kill(${signal}) ---`)
      await this.#terminate(signal)
    })
  }

  stop(): Promise<void> {
    return this.#serial(async () => {
      if (this.#state === 'stopped') return
      try {
        await this.#terminate('SIGTERM')
      } finally {
        this.#state = 'stopped'
        await rm(this.dataDir, { recursive: true, force: true, maxRetries: 3, retryDelay: 50 })
        liveTempDirs.delete(this.dataDir)
      }
    })
  }

  /** Run lifecycle operations one at a time, keeping the event loop alive meanwhile. */
  #serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = async (): Promise<T> => {
      const keepAlive = setInterval(() => {}, 1_000)
      try {
        return await fn()
      } finally {
        clearInterval(keepAlive)
      }
    }
    const result = this.#ops.then(run, run)
    this.#ops = result.catch(() => {})
    return result
  }

  async #startWithRetry(): Promise<void> {
    // Ports are picked before the server binds them, so another process can
    // occasionally win the race. Before the first successful start we may
    // simply choose new ports; afterwards the ports are part of the contract.
    const attempts = this.#everStarted ? 1 : 4
    for (let attempt = 1; ; attempt++) {
      try {
        await this.#spawnAndWait()
        return
      } catch (err) {
        if (err instanceof StartupError && err.addressInUse && attempt < attempts) {
          this.log.mark(`--- port already in use, retrying with new ports (attempt ${attempt + 1}) ---`)
          await this.reassignPorts()
          continue
        }
        throw err
      }
    }
  }

  async #spawnAndWait(): Promise<void> {
    installExitHook()
    const args = this.args()
    // its own process group: a terminal's Ctrl-C reaches only the process that started it
    const child = spawn(this.bin, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: this.env(),
      cwd: this.dataDir,
      detached: true,
    })
    const exit = new Promise<ExitInfo>((resolve) => {
      child.once('exit', (code, signal) => resolve({ code, signal }))
      child.once('error', (err) => {
        this.log.mark(`spawn error: ${err.message}`)
        // 'exit' may never come for a failed spawn
        if (child.pid === undefined) resolve({ code: null, signal: null })
      })
    })
    child.stdout?.on('data', (d: Buffer) => this.log.push('out', d))
    child.stderr?.on('data', (d: Buffer) => this.log.push('err', d))
    // A forgotten server does not keep this process alive; the 'exit' hook kills it.
    // Lifecycle operations hold their own keep-alive timer.
    child.unref()
    for (const stream of [child.stdout, child.stderr]) {
      ;(stream as unknown as { unref?: () => void } | null)?.unref?.()
    }
    this.#child = child
    this.#exit = exit
    let watchdogPid: number | undefined
    if (child.pid !== undefined) {
      liveChildren.add(child)
      watchdogPid = spawnWatchdog(child.pid, this.dataDir)
    }
    void exit.then((e) => {
      liveChildren.delete(child)
      if (watchdogPid !== undefined) killWatchdog(watchdogPid)
      if (this.#child === child && this.#state === 'running') {
        this.log.mark('--- server process exited unexpectedly ---')
        this.#state = 'down'
        this.onExit?.(describeExit(e))
      }
    })

    try {
      await this.#waitReady(exit)
    } catch (err) {
      await this.#terminate('SIGKILL')
      throw err
    }
    this.#state = 'running'
    this.#everStarted = true
  }

  async #waitReady(exit: Promise<ExitInfo>): Promise<void> {
    const started = Date.now()
    const deadline = started + this.startTimeoutMs
    let exited: ExitInfo | undefined
    void exit.then((e) => {
      exited = e
    })
    let lastError = 'no probe attempted'
    for (;;) {
      if (exited) {
        const logs = this.log.tail(30)
        throw new StartupError(
          `${this.name} exited during startup (${describeExit(exited)}).\n` + `command: ${this.bin} ${this.args().join(' ')}\n--- last output ---\n${logs}`,
          /address already in use/i.test(logs),
        )
      }
      const remaining = deadline - Date.now()
      if (remaining <= 0) {
        throw new StartupError(
          `${this.name} did not become ready within ${this.startTimeoutMs} ms on ${this.url} ` +
            `(last probe error: ${lastError}).\ncommand: ${this.bin} ${this.args().join(' ')}\n` +
            `--- last output ---\n${this.log.tail(30)}`,
          false,
        )
      }
      try {
        await this.probe(Math.min(1_000, remaining))
        if (!exited) return
      } catch (err) {
        lastError = err instanceof Error ? err.message : String(err)
      }
      await raceTimeout(exit, 50)
    }
  }

  /** Signal the current process (if any) and wait for it to exit; SIGKILL after stopTimeoutMs. */
  async #terminate(signal: NodeJS.Signals): Promise<void> {
    const child = this.#child
    const exit = this.#exit
    if (this.#state !== 'stopped') this.#state = 'down'
    if (!child || !exit) return
    if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
      child.kill(signal)
      if (signal !== 'SIGKILL') {
        const res = await raceTimeout(exit, this.stopTimeoutMs)
        if (res === 'timeout') {
          this.log.mark(`--- no exit ${this.stopTimeoutMs} ms after ${signal}, sending SIGKILL ---`)
          child.kill('SIGKILL')
        }
      }
    }
    await exit
    liveChildren.delete(child)
    this.#child = undefined
    this.#exit = undefined
  }
}

// ---------------------------------------------------------------------------
// NATS
// ---------------------------------------------------------------------------

/** Connect over TCP and read the server's INFO line. */
function readNatsInfo(port: number, timeoutMs: number): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    const socket = netConnect({ host: '127.0.0.1', port })
    let buf = ''
    const finish = (err: Error | undefined, info?: Record<string, unknown>): void => {
      clearTimeout(timer)
      socket.destroy()
      if (err) reject(err)
      else resolve(info ?? {})
    }
    const timer = setTimeout(() => finish(new Error(`no INFO within ${timeoutMs} ms`)), timeoutMs)
    socket.on('error', (err) => finish(err))
    socket.on('data', (d: Buffer) => {
      buf += d.toString('utf8')
      const nl = buf.indexOf('\r\n')
      if (nl < 0) {
        if (buf.length > 64 * 1024) finish(new Error('INFO line too long'))
        return
      }
      const line = buf.slice(0, nl)
      if (!line.startsWith('INFO ')) return finish(new Error(`unexpected first line: ${line.slice(0, 100)}`))
      try {
        finish(undefined, JSON.parse(line.slice(5)) as Record<string, unknown>)
      } catch (err) {
        finish(err instanceof Error ? err : new Error(String(err)))
      }
    })
    socket.on('close', () => finish(new Error('connection closed before INFO')))
  })
}

class NatsProcess extends ManagedProcess implements NatsServer {
  readonly jetstream: boolean
  #port: number

  constructor(bin: string, dataDir: string, port: number, opts: NatsOptions) {
    super('nats-server', bin, dataDir, opts)
    this.jetstream = opts.jetstream ?? true
    this.#port = port
  }

  get port(): number {
    return this.#port
  }

  get url(): string {
    return `nats://127.0.0.1:${this.#port}`
  }

  protected args(): string[] {
    const args = ['--addr', '127.0.0.1', '--port', String(this.#port)]
    // JetStream's store lives under <dataDir>/jetstream
    if (this.jetstream) args.push('--jetstream', '--store_dir', this.dataDir)
    return args
  }

  protected async probe(timeoutMs: number): Promise<void> {
    const info = await readNatsInfo(this.#port, timeoutMs)
    // The client listener only opens after JetStream (including stream
    // recovery) is up, but check the flag explicitly anyway.
    if (this.jetstream && info['jetstream'] !== true) throw new Error('INFO does not advertise jetstream yet')
  }

  protected async reassignPorts(): Promise<void> {
    this.#port = await getFreePort()
  }
}

/** Start a nats-server (JetStream on by default) on a free 127.0.0.1 port. */
export async function startNats(opts: NatsOptions = {}): Promise<NatsServer> {
  const bin = requireExecutable('nats-server', 'nats-server', 'KVR_NATS_SERVER_BIN')
  const dataDir = await mkdtemp(join(opts.parentDir ?? tmpdir(), 'kvr-nats-'))
  liveTempDirs.add(dataDir)
  installExitHook()
  return startedOrStopped(new NatsProcess(bin, dataDir, await getFreePort(), opts))
}

/** Starts a server; one that fails to come up is stopped (and its data dir removed) first. */
async function startedOrStopped<S extends { start(): Promise<void>; stop(): Promise<void> }>(server: S): Promise<S> {
  try {
    await server.start()
  } catch (err) {
    await server.stop().catch(() => {})
    throw err
  }
  return server
}

// ---------------------------------------------------------------------------
// etcd
// ---------------------------------------------------------------------------

function httpGetText(url: string, timeoutMs: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: 'GET', timeout: timeoutMs, agent: false }, (res) => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (c: string) => (text += c))
      res.on('error', reject)
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }))
    })
    req.on('timeout', () => req.destroy(new Error(`timeout after ${timeoutMs} ms`)))
    req.on('error', reject)
    req.end()
  })
}

async function httpGetJson(url: string, timeoutMs: number): Promise<{ status: number; body: unknown }> {
  const { status, text } = await httpGetText(url, timeoutMs)
  try {
    return { status, body: JSON.parse(text) as unknown }
  } catch {
    throw new Error(`non-JSON response (${status}): ${text.slice(0, 200)}`)
  }
}

class EtcdProcess extends ManagedProcess implements EtcdServer {
  #port: number
  #peerPort: number
  readonly #clusterToken = `kvr-${randomBytes(6).toString('hex')}`

  constructor(bin: string, dataDir: string, port: number, peerPort: number, opts: EtcdOptions) {
    super('etcd', bin, dataDir, opts)
    this.#port = port
    this.#peerPort = peerPort
  }

  get port(): number {
    return this.#port
  }

  get peerPort(): number {
    return this.#peerPort
  }

  get url(): string {
    return `http://127.0.0.1:${this.#port}`
  }

  get peerUrl(): string {
    return `http://127.0.0.1:${this.#peerPort}`
  }

  protected args(): string[] {
    const member = 'kvr'
    // The --initial-* flags only matter for the first start; on restart the
    // member data in --data-dir wins, so data survives.
    return [
      `--name=${member}`,
      `--data-dir=${join(this.dataDir, 'etcd')}`,
      `--listen-client-urls=${this.url}`,
      `--advertise-client-urls=${this.url}`,
      `--listen-peer-urls=${this.peerUrl}`,
      `--initial-advertise-peer-urls=${this.peerUrl}`,
      `--initial-cluster=${member}=${this.peerUrl}`,
      '--initial-cluster-state=new',
      `--initial-cluster-token=${this.#clusterToken}`,
      '--logger=zap',
      '--log-outputs=stderr',
    ]
  }

  protected override env(): NodeJS.ProcessEnv {
    // etcd reads ETCD_* variables as flags; don't let the caller's environment
    // (e.g. ETCD_DATA_DIR from a dev shell) conflict with ours.
    const env: NodeJS.ProcessEnv = {}
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('ETCD_')) env[k] = v
    return env
  }

  protected async probe(timeoutMs: number): Promise<void> {
    const { status, body } = await httpGetJson(`${this.url}/health`, timeoutMs)
    const health = typeof body === 'object' && body !== null ? (body as Record<string, unknown>)['health'] : undefined
    if (status !== 200 || health !== 'true') throw new Error(`/health -> ${status} ${JSON.stringify(body)}`)
  }

  protected async reassignPorts(): Promise<void> {
    const [port, peerPort] = await getFreePorts(2)
    if (port === undefined || peerPort === undefined) throw new Error('could not allocate free ports')
    this.#port = port
    this.#peerPort = peerPort
  }
}

/** Start a single-member etcd on free 127.0.0.1 client and peer ports. */
export async function startEtcd(opts: EtcdOptions = {}): Promise<EtcdServer> {
  const bin = requireExecutable('etcd', 'etcd-server', 'KVR_ETCD_BIN')
  const dataDir = await mkdtemp(join(opts.parentDir ?? tmpdir(), 'kvr-etcd-'))
  liveTempDirs.add(dataDir)
  installExitHook()
  const [port, peerPort] = await getFreePorts(2)
  if (port === undefined || peerPort === undefined) throw new Error('could not allocate free ports')
  return startedOrStopped(new EtcdProcess(bin, dataDir, port, peerPort, opts))
}

// ---------------------------------------------------------------------------
// HAProxy
// ---------------------------------------------------------------------------

export interface HaproxyOptions extends ServiceOptions {
  backends: readonly HaproxyBackend[]
  /** The clients' frontend's port (the configuration's first bind). Default a free one. */
  port?: number
}

export interface HaproxyServer extends ManagedServer {
  /** The stats frontend (`/stats`, `/stats;csv`, `/metrics`). */
  readonly statsUrl: string
  /** Each backend server's status as HAProxy's health checks see it: `UP`, `DOWN`, `UP 1/2`, … */
  serverStatus(): Promise<Map<string, string>>
}

/** deploy/haproxy/haproxy.cfg, found upwards from this module (src/deploy or dist/src/deploy). */
export function haproxyConfigPath(): string {
  let dir = dirname(fileURLToPath(import.meta.url))
  for (;;) {
    const candidate = join(dir, 'deploy', 'haproxy', 'haproxy.cfg')
    if (existsSync(candidate)) return candidate
    const up = dirname(dir)
    if (up === dir) throw new Error('deploy/haproxy/haproxy.cfg not found above src/deploy')
    dir = up
  }
}

/** Status by server name from `/stats;csv` (its header line names the columns). */
export function haproxyServerStatus(csv: string, names: readonly string[]): Map<string, string> {
  const lines = csv.split('\n')
  const header = (lines[0] ?? '').replace(/^#\s*/, '').split(',')
  const sv = header.indexOf('svname')
  const st = header.indexOf('status')
  const out = new Map<string, string>()
  for (const line of lines.slice(1)) {
    const f = line.split(',')
    const name = f[sv]
    if (name !== undefined && names.includes(name)) out.set(name, f[st] ?? '')
  }
  return out
}

class HaproxyProcess extends ManagedProcess implements HaproxyServer {
  readonly #template: string
  readonly #binds: number[]
  readonly #backends: readonly HaproxyBackend[]
  readonly #fixedPort: number | undefined
  #ports: number[]

  constructor(bin: string, dataDir: string, template: string, ports: number[], opts: HaproxyOptions) {
    super('haproxy', bin, dataDir, opts)
    this.#template = template
    this.#binds = haproxyBindPorts(template)
    this.#backends = opts.backends
    this.#fixedPort = opts.port
    this.#ports = ports
    if (opts.port !== undefined) this.#ports[0] = opts.port
  }

  get port(): number {
    return this.#ports[0] as number
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`
  }

  get statsUrl(): string {
    return `http://127.0.0.1:${this.#ports[1]}`
  }

  get configPath(): string {
    return join(this.dataDir, 'haproxy.cfg')
  }

  /** Writes the configuration for the current ports; before each first start attempt. */
  async render(): Promise<void> {
    const ports = new Map(this.#binds.map((b, i) => [b, this.#ports[i] as number]))
    await writeFile(this.configPath, renderHaproxyConfig(this.#template, ports, this.#backends))
  }

  protected args(): string[] {
    return ['-db', '-f', this.configPath]
  }

  protected async probe(timeoutMs: number): Promise<void> {
    const { status } = await httpGetText(`${this.statsUrl}/stats;csv`, timeoutMs)
    if (status !== 200) throw new Error(`/stats;csv -> ${status}`)
  }

  protected async reassignPorts(): Promise<void> {
    this.#ports = await getFreePorts(this.#binds.length)
    if (this.#fixedPort !== undefined) this.#ports[0] = this.#fixedPort
    await this.render()
  }

  async serverStatus(): Promise<Map<string, string>> {
    const { text } = await httpGetText(`${this.statsUrl}/stats;csv`, 2_000)
    return haproxyServerStatus(
      text,
      this.#backends.map((b) => b.name),
    )
  }
}

/**
 * Start haproxy with deploy/haproxy/haproxy.cfg rendered for loopback in front of `backends`, on
 * free ports (the clients' frontend is `url`, the stats frontend `statsUrl`). Ready once its stats
 * frontend answers; its health checks of the backends (GET /ready) run from then on.
 */
export async function startHaproxy(opts: HaproxyOptions): Promise<HaproxyServer> {
  const bin = requireExecutable('haproxy', 'haproxy', 'KVR_HAPROXY_BIN')
  const template = readFileSync(haproxyConfigPath(), 'utf8')
  const binds = haproxyBindPorts(template)
  if (binds.length < 2) throw new Error("haproxy.cfg should bind a clients' frontend and a stats frontend")
  const dataDir = await mkdtemp(join(opts.parentDir ?? tmpdir(), 'kvr-haproxy-'))
  liveTempDirs.add(dataDir)
  installExitHook()
  const server = new HaproxyProcess(bin, dataDir, template, await getFreePorts(binds.length), opts)
  await server.render()
  return startedOrStopped(server)
}
