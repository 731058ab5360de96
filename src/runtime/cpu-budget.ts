// How many cores this process may use, for the thread-count and spin defaults. Node 20's
// os.availableParallelism() counts the CPUs the process may be scheduled on (its affinity mask),
// not its CPU quota: in a container limited to 2 CPUs on a 64-core host it says 64, and the
// router would start 31 indexer shards and let idle ones spin, burning the quota and getting
// throttled. The quota is the cgroup's: cgroup v2 `cpu.max`
// ("QUOTA PERIOD", or "max PERIOD" for none), cgroup v1 `cpu.cfs_quota_us` (-1 for none) over
// `cpu.cfs_period_us`.
import { readFileSync } from 'node:fs'
import { availableParallelism } from 'node:os'

/** Reads a file's text, or null when it cannot be read. */
export type ReadText = (path: string) => string | null

function readText(path: string): string | null {
  try {
    return readFileSync(path, 'utf8')
  } catch {
    return null
  }
}

/** Cores a quota allows (rounded up, at least 1); null for no quota or text that is not one. */
export function quotaCores(quota: number, period: number): number | null {
  if (!Number.isFinite(quota) || !Number.isFinite(period) || quota <= 0 || period <= 0) return null
  return Math.max(1, Math.ceil(quota / period))
}

/** The cgroup v2 `cpu.max` text as cores; null for "max" or anything else. */
export function parseCpuMax(text: string): number | null {
  const m = /^\s*(max|\d+)\s+(\d+)\s*$/.exec(text)
  if (m === null || m[1] === 'max') return null
  return quotaCores(Number(m[1]), Number(m[2]))
}

/**
 * The CPU quota of this process's cgroup, in cores, or null when there is none (or none can be
 * read: not Linux, no cgroup file system). The process's own cgroup is looked up in
 * /proc/self/cgroup, then the root of the mount, which is the process's own cgroup inside a
 * container with a cgroup namespace.
 */
export function cgroupCpuQuota(read: ReadText = readText): number | null {
  const self = read('/proc/self/cgroup') ?? ''
  const v2: string[] = []
  const v1: string[] = []
  for (const line of self.split('\n')) {
    const [, controllers, path] = /^\d+:([^:]*):(.*)$/.exec(line) ?? []
    if (path === undefined || controllers === undefined) continue
    const rel = path === '/' ? '' : path
    if (controllers === '') v2.push(`/sys/fs/cgroup${rel}/cpu.max`)
    else if (controllers.split(',').includes('cpu')) v1.push(`/sys/fs/cgroup/${controllers}${rel}`, `/sys/fs/cgroup/cpu${rel}`)
  }
  v2.push('/sys/fs/cgroup/cpu.max')
  v1.push('/sys/fs/cgroup/cpu,cpuacct', '/sys/fs/cgroup/cpu')
  for (const p of v2) {
    const t = read(p)
    if (t !== null) return parseCpuMax(t)
  }
  for (const dir of v1) {
    const q = read(`${dir}/cpu.cfs_quota_us`)
    const p = read(`${dir}/cpu.cfs_period_us`)
    if (q !== null && p !== null) return quotaCores(Number(q.trim()), Number(p.trim()))
  }
  return null
}

/** Cores for the defaults: the CPUs the process may run on, capped by its cgroup's quota. */
export function cpuBudget(read: ReadText = readText, cpus: number = availableParallelism()): number {
  const quota = cgroupCpuQuota(read)
  return Math.max(1, quota === null ? cpus : Math.min(cpus, quota))
}
