// The cores the thread and spin defaults are sized for: the CPUs the process may use, capped by
// its cgroup's CPU quota (v2 cpu.max, v1 cfs quota over period), read as a container sees them.
import t from 'tap'
import { availableParallelism } from 'node:os'
import { cgroupCpuQuota, cpuBudget, parseCpuMax, quotaCores } from '../../src/runtime/cpu-budget.js'
import type { ReadText } from '../../src/runtime/cpu-budget.js'

const files =
  (m: Record<string, string>): ReadText =>
  (p) =>
    m[p] ?? null

t.test('quota text', async (t) => {
  t.equal(parseCpuMax('max 100000\n'), null, 'no quota')
  t.equal(parseCpuMax('200000 100000\n'), 2)
  t.equal(parseCpuMax('150000 100000'), 2, 'a fraction of a core rounds up')
  t.equal(parseCpuMax('50000 100000'), 1, 'at least one')
  t.equal(parseCpuMax('garbage'), null)
  t.equal(parseCpuMax('0 100000'), null, 'a zero quota is not one')
  t.equal(quotaCores(-1, 100000), null, 'v1 says -1 for none')
  t.equal(quotaCores(400000, 100000), 4)
  t.equal(quotaCores(NaN, 100000), null)
})

t.test("cgroup v2: the process's own cgroup, else the root of the mount (a container)", async (t) => {
  t.equal(
    cgroupCpuQuota(
      files({
        '/proc/self/cgroup': '0::/kubepods/pod1/c1\n',
        '/sys/fs/cgroup/kubepods/pod1/c1/cpu.max': '300000 100000\n',
        '/sys/fs/cgroup/cpu.max': 'max 100000\n',
      }),
    ),
    3,
  )
  t.equal(cgroupCpuQuota(files({ '/proc/self/cgroup': '0::/\n', '/sys/fs/cgroup/cpu.max': '200000 100000\n' })), 2, 'namespaced: the root is the container')
  t.equal(cgroupCpuQuota(files({ '/proc/self/cgroup': '0::/user.slice\n', '/sys/fs/cgroup/user.slice/cpu.max': 'max 100000\n' })), null)
})

t.test('cgroup v1: cfs quota over period', async (t) => {
  const self = '12:pids:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n'
  t.equal(
    cgroupCpuQuota(
      files({
        '/proc/self/cgroup': self,
        '/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us': '250000\n',
        '/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us': '100000\n',
      }),
    ),
    3,
  )
  t.equal(
    cgroupCpuQuota(
      files({
        '/proc/self/cgroup': self,
        '/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us': '100000\n',
        '/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us': '100000\n',
      }),
    ),
    1,
    'inside the container the mount root is its cgroup',
  )
  t.equal(
    cgroupCpuQuota(files({ '/proc/self/cgroup': self, '/sys/fs/cgroup/cpu/cpu.cfs_quota_us': '-1\n', '/sys/fs/cgroup/cpu/cpu.cfs_period_us': '100000\n' })),
    null,
  )
})

t.test('nothing readable: no quota', async (t) => {
  t.equal(cgroupCpuQuota(files({})), null)
})

t.test('the budget: CPUs capped by the quota, never below one', async (t) => {
  const two = files({ '/proc/self/cgroup': '0::/\n', '/sys/fs/cgroup/cpu.max': '200000 100000\n' })
  t.equal(cpuBudget(two, 64), 2, 'a 2-CPU container on a 64-core host')
  t.equal(cpuBudget(two, 1), 1, 'a quota above the CPUs the process may use changes nothing')
  t.equal(cpuBudget(files({}), 8), 8)
  t.equal(cpuBudget(files({}), 0), 1)
  // this machine, as the router reads it
  const here = cpuBudget()
  t.ok(here >= 1 && here <= availableParallelism(), `this machine: ${here} of ${availableParallelism()} CPUs`)
})
