// Helpers the benchmarks share: the repository root and bench/results/ under it, a child process
// awaited until its stdout shows a ready line (and the child's side of that: announceReady), the
// fastify app and undici Agent of the stand-in proxies, the median of repetitions, and a process's CPU
// time and the machine's steal time from /proc.
import { spawn } from 'node:child_process'
import { Agent } from 'undici'
import type { ChildProcess } from 'node:child_process'
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** The directory holding package.json, found upwards from this module (bench/lib or dist/bench/lib). */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url))
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir)
    if (up === dir) return process.cwd()
    dir = up
  }
  return dir
}

/**
 * Starts `node ...args`; resolves once stdout matches `ready`, rejects if it exits first. With
 * `quiet`, the child's stderr (a router's log: a line per request) is read but not passed on.
 */
export function child(args: string[], ready: RegExp, opts: { quiet?: boolean } = {}): Promise<{ p: ChildProcess; m: RegExpMatchArray }> {
  return new Promise((resolve, reject) => {
    // stderr is passed on as it comes, and its first line kept: a child that refuses its options says why there
    const p = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    p.stderr?.on('data', (d: Buffer) => {
      if (opts.quiet !== true) process.stderr.write(d)
      if (err.length < 4096) err += d.toString()
    })
    p.stdout?.on('data', (d: Buffer) => {
      out += d.toString()
      const m = out.match(ready)
      if (m !== null) resolve({ p, m })
    })
    p.on('exit', (code) => reject(new Error(`child exited ${code}: ${err.split('\n')[0] ?? ''} ${out}`)))
  })
}

/** bench/results/ (git ignores its JSON and SVG), created if missing: where every benchmark writes its figures. */
export function resultsDir(): string {
  const dir = join(repoRoot(), 'bench', 'results')
  mkdirSync(dir, { recursive: true })
  return dir
}

export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2
}

/** USER_HZ, the unit of /proc CPU times: 100 on every Linux ABI Node supports. */
export const TICKS_PER_S = 100

/** utime + stime of a process in ticks (TICKS_PER_S), from /proc (Linux); null elsewhere. */
export function processTicks(pid: number | undefined): number | null {
  if (pid === undefined) return null
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // the command name may hold spaces: fields are counted after its closing parenthesis
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return Number(f[11]) + Number(f[12])
  } catch {
    return null
  }
}

/**
 * Involuntary context switches of every thread of a process so far (the scheduler took the CPU
 * from a thread that could still run), or null without /proc. Their rate says how often a
 * process's threads wait for a core rather than for work.
 */
export function preemptions(pid: number | undefined): number | null {
  if (pid === undefined) return null
  try {
    let sum = 0
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      const m = /nonvoluntary_ctxt_switches:\s*(\d+)/.exec(readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8'))
      if (m !== null) sum += Number(m[1])
    }
    return sum
  } catch {
    return null
  }
}

/**
 * The steal time in /proc/stat's text, all CPUs together, in ticks: time in which the hypervisor
 * ran something else while this machine's virtual CPUs had work to do. Null if the text has no
 * aggregate line with the field (kernels before 2.6.11, or not Linux).
 */
export function stealTicksOf(procStat: string): number | null {
  const end = procStat.indexOf('\n')
  const line = end === -1 ? procStat : procStat.slice(0, end)
  // cpu user nice system idle iowait irq softirq steal ...
  const f = line.trim().split(/\s+/)
  if (f[0] !== 'cpu' || f[8] === undefined || !/^\d+$/.test(f[8])) return null
  return Number(f[8])
}

/** The machine's steal time so far, in ticks (TICKS_PER_S); null off Linux. */
export function machineStealTicks(): number | null {
  try {
    return stealTicksOf(readFileSync('/proc/stat', 'utf8'))
  } catch {
    return null
  }
}

/**
 * A benchmark child's last step: the ready line `child` waits for (`NAME ready URL…`), and an exit
 * on SIGTERM, which is how the parent stops it.
 */
export function announceReady(name: string, urls: string): void {
  process.stdout.write(`${name} ready ${urls}\n`)
  process.on('SIGTERM', () => process.exit(0))
}

/**
 * The fastify app of the proxies that stand in the router's place: it takes a JSON body as the
 * bytes that came, unparsed, so that what a proxy adds is its forwarding and nothing else.
 */
export async function bytesApp(): Promise<import('fastify').FastifyInstance> {
  const { default: Fastify } = await import('fastify')
  const app = Fastify({ bodyLimit: 64 << 20 })
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => done(null, body))
  return app
}

/**
 * The undici Agent of a stand-in proxy: the router's pool (src/http/proxy/proxy.ts) without its timeouts,
 * which the benchmark's fixed-timing upstreams never come near, so that the stand-ins and the
 * router open and reuse their upstream connections alike.
 */
export function standInAgent(): Agent {
  return new Agent({ connections: 1024, keepAliveTimeout: 30_000 })
}

/** A plain-text table: the first `left` columns aligned left, the others right (figures). */
export function textTable(header: readonly string[], rows: readonly (readonly string[])[], left = 1): string {
  const w = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)))
  const line = (cells: readonly string[]): string => cells.map((c, i) => (i < left ? c.padEnd(w[i] as number) : c.padStart(w[i] as number))).join(' | ')
  return [line(header), w.map((n) => '-'.repeat(n)).join('-|-'), ...rows.map(line)].join('\n')
}
