// --nice sets the niceness of every thread of the router: the main thread, V8's and libuv's
// threads that exist at start, and the shard threads started after (which inherit it). Read back
// from /proc, where Linux keeps a niceness per thread.
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { setPriority } from 'node:os'
import { cliArgv, runCli, waitForOutput } from '../helpers/cli.js'
import { parseServeConfig } from '../../src/config.js'

const notLinux = process.platform === 'linux' ? false : 'reads thread niceness from /proc (Linux)'

/** Niceness of each thread of `pid`, by thread name. */
function threadNiceness(pid: number): { name: string; nice: number }[] {
  const out: { name: string; nice: number }[] = []
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    let stat: string
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8')
    } catch {
      continue // a thread that ended since the listing
    }
    const name = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'))
    // fields after the name start at field 3 (state); the niceness is field 19
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    out.push({ name, nice: Number(f[16]) })
  }
  return out
}

/** Whether this process may set niceness `nice` (root, CAP_SYS_NICE or RLIMIT_NICE), tried on a throwaway child. */
async function mayTake(nice: number): Promise<boolean> {
  const p = spawn('sleep', ['30'])
  await new Promise((r) => p.once('spawn', r))
  try {
    setPriority(p.pid as number, nice)
    return true
  } catch {
    return false
  } finally {
    p.kill('SIGKILL')
  }
}

async function serveWith(
  nice: number,
  shards = 2,
): Promise<{ threads: { name: string; nice: number }[]; line: string } | { code: number | null; stderr: string }> {
  const c = runCli([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-event-threads',
    String(shards),
    '--worker',
    '1=http://127.0.0.1:9',
    '--nice',
    String(nice),
  ])
  const line = (await waitForOutput(c, /kv-router listening on [^\n]*\n/))?.[0] ?? null
  if (line === null) return { code: await c.exited, stderr: c.err() }
  const threads = threadNiceness(c.p.pid as number)
  c.p.kill('SIGKILL')
  await c.exited
  return { threads, line }
}

t.test('--nice and DYN_ROUTER_NICE: an integer in [-20, 19], the flag wins', async (t) => {
  t.equal((parseServeConfig([], {}) as { nice: number | null }).nice, null, 'left alone by default')
  t.equal((parseServeConfig(['--nice', '-7'], {}) as { nice: number | null }).nice, -7)
  t.equal((parseServeConfig(['--nice', '4'], { DYN_ROUTER_NICE: '-3' }) as { nice: number | null }).nice, 4)
  t.equal((parseServeConfig([], { DYN_ROUTER_NICE: '-3' }) as { nice: number | null }).nice, -3)
  t.throws(() => parseServeConfig(['--nice', '20'], {}), /^--nice must be an integer in \[-20, 19\], got "20"$/)
  t.throws(() => parseServeConfig(['--nice', '-21'], {}), /^--nice must be an integer in \[-20, 19\], got "-21"$/)
  t.throws(() => parseServeConfig(['--nice', 'high'], {}), /^--nice must be an integer in \[-20, 19\], got "high"$/)
})

t.test('a positive niceness reaches every thread, shards included', { skip: notLinux }, async (t) => {
  const one = await serveWith(19, 1)
  const three = await serveWith(19, 3)
  if (!('threads' in one)) return t.fail(`serve exited ${one.code}: ${one.stderr}`)
  if (!('threads' in three)) return t.fail(`serve exited ${three.code}: ${three.stderr}`)
  t.match(three.line, /, nice 19\)/, 'the listening line says so')
  // two shards more, two threads more: the ones started after --nice was applied are among those read
  t.ok(three.threads.length >= one.threads.length + 2, `${one.threads.length} threads with one shard, ${three.threads.length} with three`)
  for (const r of [one, three])
    t.same(
      r.threads.filter((x) => x.nice !== 19),
      [],
      'no thread left at another niceness',
    )
})

t.test('a negative niceness: applied where the system allows it, else exit 2 with one line', { skip: notLinux }, async (t) => {
  const allowed = await mayTake(-2)
  const r = await serveWith(-2)
  if (allowed) {
    if (!('threads' in r)) return t.fail(`serve exited ${r.code}: ${r.stderr}`)
    t.same(
      r.threads.filter((x) => x.nice !== -2),
      [],
      'every thread at -2',
    )
  } else {
    if ('threads' in r) return t.fail('serve started although this process may not raise a priority')
    t.equal(r.code, 2)
    t.match(
      r.stderr,
      new RegExp(
        '^kv-router: serve: --nice -2: the system refused the priority \\((EACCES|EPERM)\\); a niceness below the current one needs root, ' +
          'CAP_SYS_NICE or an RLIMIT_NICE \\(ulimit -e\\) of at least 22$',
        'm',
      ),
    )
    t.equal(r.stderr.split('\n').length, 2, 'one line')
  }
})

/** Why the router cannot be started as `nobody` here, or false when it can (root, a checkout nobody may read, no RLIMIT_NICE that allows -5). */
function cannotRunAsNobody(): string | false {
  if (notLinux !== false) return notLinux
  if (process.getuid?.() !== 0) return 'needs root to start the router as another user (the previous test saw this side when not root)'
  const limit = /^Max nice priority\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))
  if (limit !== null && Number(limit[1]) >= 25) return `RLIMIT_NICE ${limit[1]} lets any user take -5`
  const v = spawnSync(process.execPath, cliArgv(['--version']), { uid: 65534, gid: 65534, env: { PATH: process.env.PATH }, encoding: 'utf8' })
  if (!/^\d+\.\d+\.\d+/.test(v.stdout ?? '')) return `nobody cannot run the checkout's CLI here (${v.error?.message ?? (v.stderr ?? '').split('\n')[0]})`
  return false
}

t.test('started as a user who may not raise a priority: exit 2 with one line, nothing served', { skip: cannotRunAsNobody() }, async (t) => {
  const p = spawn(
    process.execPath,
    cliArgv(['serve', '--http-host', '127.0.0.1', '--http-port', '0', '--router-event-threads', '1', '--worker', '1=http://127.0.0.1:9', '--nice', '-5']),
    {
      uid: 65534,
      gid: 65534,
      env: { PATH: process.env.PATH },
    },
  )
  let out = ''
  let err = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  p.stderr.on('data', (d: Buffer) => (err += d.toString()))
  p.stdout.on('data', () => {
    // had it been allowed, it would serve until killed
    if (/listening/.test(out)) p.kill('SIGKILL')
  })
  const code = await new Promise<number | null>((r) => {
    p.on('close', r)
    p.on('error', (e) => {
      t.fail(`spawn as nobody: ${e.message}`)
      r(null)
    })
  })
  t.equal(code, 2)
  // the first line only: under tap, its coverage hook in the child then fails to write its record as that user
  t.equal(
    err.split('\n')[0],
    'kv-router: serve: --nice -5: the system refused the priority (EACCES); a niceness below the current one needs root, CAP_SYS_NICE or an ' +
      'RLIMIT_NICE (ulimit -e) of at least 25',
  )
  t.notMatch(out, /listening/)
})
