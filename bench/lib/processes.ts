// The processes of an end-to-end benchmark: `kv-router` commands started as children and awaited
// until their stdout says they are ready, stopped with SIGTERM, the workers a router lists, and
// how much of the machine the benchmark's processes and everything else used meanwhile.
import { spawn } from 'node:child_process'
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { processTicks, repoRoot, TICKS_PER_S } from './common.js'
import { ROUTER_V8_FLAGS } from '../../src/runtime/v8-flags.js'

export interface Child {
  p: ChildProcessWithoutNullStreams
  match: RegExpMatchArray
  stderr: () => string
  exit: Promise<number | null>
}

/**
 * Starts `node dist/src/main.js ARGS` and resolves once stdout matches `ready`; with `nice`, under
 * nice(1) at that niceness (every thread of the process inherits it).
 */
export function start(args: string[], ready: RegExp, timeoutMs = 60_000, opts: { nice?: number } = {}): Promise<Child> {
  const cli = join(repoRoot(), 'dist', 'src', 'main.js')
  return new Promise((resolve, reject) => {
    const argv = [...(args[0] === 'serve' || args[0] === 'indexer' ? ROUTER_V8_FLAGS : []), cli, ...args]
    const env = { env: { PATH: process.env.PATH ?? '' } }
    const p = opts.nice === undefined ? spawn(process.execPath, argv, env) : spawn('nice', ['-n', String(opts.nice), process.execPath, ...argv], env)
    let out = ''
    let err = ''
    let done = false
    const exit = new Promise<number | null>((r) => p.on('close', (code) => r(code)))
    const timer = setTimeout(() => {
      done = true
      p.kill('SIGKILL')
      reject(new Error(`${args[0]} not ready after ${timeoutMs / 1000} s: ${out} ${err}`))
    }, timeoutMs)
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const m = out.match(ready)
      if (m !== null && !done) {
        done = true
        clearTimeout(timer)
        resolve({ p, match: m, stderr: () => err, exit })
      }
    })
    // keep the tail only: a long run's logs should not grow without bound
    p.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-4000)))
    void exit.then((code) => {
      if (!done) {
        done = true
        clearTimeout(timer)
        reject(new Error(`${args[0]} exited ${code} before it was ready: ${out} ${err}`))
      }
    })
  })
}

export async function stop(c: Child): Promise<void> {
  if (c.p.exitCode !== null || c.p.signalCode !== null) return
  c.p.kill('SIGTERM')
  const timer = setTimeout(() => c.p.kill('SIGKILL'), 20_000)
  await c.exit
  clearTimeout(timer)
}

export async function workerIds(url: string): Promise<{ ids: string[]; cachedBlocks: number }> {
  const text = await (await fetch(`${url}/v1/workers`)).text()
  // ids are u64: their exact decimal strings, not JSON numbers (an unregistered worker-rank's
  // field is worker_id_str, so it is not counted)
  const ids = [...text.matchAll(/"id_str":"(\d+)"/g)].map((m) => m[1] as string)
  let cachedBlocks = 0
  for (const m of text.matchAll(/"cached_blocks":(\d+)/g)) cachedBlocks += Number(m[1])
  return { ids, cachedBlocks }
}

// The machine is shared and has 2 cores: anything else running during a run inflates its
// latencies. CPU time from /proc (Linux; null elsewhere) over the replay tells how much of the
// machine the benchmark's own processes used and how much went to other processes.

function machineTicks(): { busy: number; total: number } | null {
  try {
    const f = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').trim().split(/\s+/).slice(1, 9).map(Number)
    const total = f.reduce((x, y) => x + y, 0)
    return { busy: total - (f[3] ?? 0) - (f[4] ?? 0), total }
  } catch {
    return null
  }
}

function selfTicks(): number {
  const u = process.cpuUsage()
  return ((u.user + u.system) / 1e6) * TICKS_PER_S
}

export interface CpuSample {
  machine: { busy: number; total: number } | null
  own: (number | null)[]
}

export function cpuSample(pids: (number | undefined)[]): CpuSample {
  return { machine: machineTicks(), own: [selfTicks(), ...pids.map(processTicks)] }
}

/** Shares of the whole machine (all cores) used by our processes and by everything else. */
export function cpuShares(a: CpuSample, b: CpuSample): { own: number; other: number } | null {
  if (a.machine === null || b.machine === null || a.own.some((x) => x === null) || b.own.some((x) => x === null)) return null
  const total = b.machine.total - a.machine.total
  if (total <= 0) return null
  let own = 0
  for (let i = 0; i < a.own.length; i++) own += (b.own[i] as number) - (a.own[i] as number)
  const busy = b.machine.busy - a.machine.busy
  return { own: own / total, other: Math.max(0, busy - own) / total }
}

/** A `kv-router mocker` fleet publishing its engines' KV events over ZMQ, and where to read them. */
export interface ZmqFleet {
  mocker: Child
  /** Each engine's HTTP URL, engine i has worker id i + 1. */
  engines: string[]
  /** Engine i's PUB endpoint. */
  endpoint: (i: number) => string
  /** Engine i's replay endpoint. */
  replay: (i: number) => string
}

/**
 * Starts `workers` mocker engines (ids from 1) whose KV events go out over ZMQ, PUB on base + i and
 * replay on base + workers + i, on a random base of loopback ports, tried again on another when
 * one is taken. `args` are further mocker flags (block size, pool, speed, model).
 */
export async function startZmqFleet(workers: number, args: string[], opts: { nice?: number } = {}): Promise<ZmqFleet> {
  for (let attempt = 0; ; attempt++) {
    const base = 30000 + Math.floor(Math.random() * 4000) * 4
    const endpoint = (i: number): string => `tcp://127.0.0.1:${base + i}`
    const replay = (i: number): string => `tcp://127.0.0.1:${base + workers + i}`
    try {
      const fleetArgs = ['mocker', '--num-workers', String(workers), '--first-worker-id', '1', '--host', '127.0.0.1', '--http-port', '0']
      fleetArgs.push(...args, '--kv-events-zmq', endpoint(0), '--kv-events-replay-zmq', replay(0))
      const mocker = await start(fleetArgs, /kv-router mocker: ready \d+ engine\(s\)(( http:\/\/\S+)+)/, 60_000, opts)
      return { mocker, engines: (mocker.match[1] as string).trim().split(' '), endpoint, replay }
    } catch (err) {
      if (attempt > 5 || !/cannot bind/.test(String(err))) throw err
    }
  }
}
