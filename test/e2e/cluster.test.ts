// `npm run cluster` (scripts/cluster.mjs) as a process, with real nats-server, etcd and haproxy:
// completions sent to HAProxy are answered by both replicas, a replica killed with SIGKILL is
// restarted while HAProxy keeps answering, and SIGTERM leaves no child and no temporary directory
// behind. Its options are the ones docs/configuration.md lists.
import t from 'tap'
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, readFileSync, rmSync } from 'node:fs'
import { requireExecutable } from '../../src/deploy/services.js'
import { fromRoot } from '../helpers/paths.js'

const script = fromRoot('scripts', 'cluster.mjs')
const docs = fromRoot('docs', 'configuration.md')

/** Whether a process with this id exists (a zombie counts: it has not been reaped). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}

async function waitUntil(what: string, ok: () => boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

/** Asks `ok` again every 100 ms (one call at a time) until it answers true; an error counts as false. */
async function pollUntil(what: string, ok: () => Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await ok().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

/** The sum of a counter's samples whose labels include `labels`. */
function counter(metrics: string, name: string, labels: string): number {
  let sum = 0
  for (const line of metrics.split('\n')) if (line.startsWith(`${name}{`) && line.includes(labels)) sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  return sum
}

/** A completion through HAProxy: its status and the replica that answered. */
async function complete(lb: string, prompt: string): Promise<{ status: number; replica: string | null; body: string }> {
  const res = await fetch(`${lb}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'kv-router-model', prompt, max_tokens: 2 }),
  })
  return { status: res.status, replica: res.headers.get('x-router-replica'), body: await res.text() }
}

t.test(
  'npm run cluster: two replicas behind HAProxy both answer, a killed replica is restarted, SIGTERM stops every child and removes the temp dir',
  async (t) => {
    for (const [bin, pkg] of [
      ['nats-server', 'nats-server'],
      ['etcd', 'etcd-server'],
      ['haproxy', 'haproxy'],
    ] as const)
      requireExecutable(bin, pkg)
    // PATH only: the caller's DYN_* or KVR_* variables must not change what is tested
    const p = spawn(process.execPath, [script, '--port', '0', '--engines', '2'], { env: { PATH: process.env.PATH }, stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    p.stdout.on('data', (d: Buffer) => (out += d.toString()))
    p.stderr.on('data', (d: Buffer) => (err += d.toString()))
    const exited = new Promise<number | null>((resolve) => p.on('exit', (code) => resolve(code)))
    let code: number | null | undefined
    void exited.then((c) => (code = c))
    const pids = (): Map<string, number> =>
      new Map([...(/ {2}pids +(.*)/.exec(out)?.[1]?.matchAll(/(\S+)=(\d+)/g) ?? [])].map((m) => [m[1] as string, Number(m[2])]))
    const dir = (): string | undefined => / {2}dir +(\S+)/.exec(out)?.[1]
    /** Pids of replicas started again, from the restart lines. */
    const restarted = (): number[] => [...out.matchAll(/cluster: router-\d+ restarted \(restart \d+\), pid (\d+)/g)].map((m) => Number(m[1]))
    t.teardown(() => {
      // a failed run: nothing may outlive the test
      if (code === undefined) p.kill('SIGKILL')
      for (const pid of [...pids().values(), ...restarted()]) {
        try {
          process.kill(-pid, 'SIGKILL')
        } catch {
          // gone
        }
      }
      const d = dir()
      if (d?.includes('kvr-cluster-')) rmSync(d, { recursive: true, force: true })
    })

    await waitUntil('the ready lines', () => /Ctrl-C stops everything/.test(out) || code !== undefined, 35_000).catch((e: Error) =>
      t.fail(`${e.message}\n${out}\n${err}`),
    )
    const lb = /cluster: ready (http:\/\/127\.0\.0\.1:\d+)/.exec(out)?.[1]
    if (lb === undefined) return t.fail(`no ready line; exit ${code}\n${out}\n${err}`)
    const routers = [...out.matchAll(/ {2}(router-\d+) +(http:\/\/127\.0\.0\.1:\d+)/g)].map((m) => ({ name: m[1] as string, url: m[2] as string }))
    t.same(
      routers.map((r) => r.name),
      ['router-1', 'router-2'],
      'two replicas',
    )
    t.same([...pids().keys()].sort(), ['etcd', 'haproxy', 'mocker', 'nats', 'router-1', 'router-2'], 'every child is listed')
    const tmp = dir()
    t.ok(tmp !== undefined && existsSync(tmp), `the temp dir exists while it runs (${tmp})`)
    for (const r of routers) {
      const ready = (await (await fetch(`${r.url}/ready`)).json()) as { ready: boolean; workers: number }
      t.same([ready.ready, ready.workers], [true, 2], `${r.name} is ready with both engines from etcd`)
    }

    // non-streamed and streamed completions through HAProxy
    const answeredBy = new Map<string, number>()
    const sent = 8
    for (let i = 0; i < sent; i++) {
      const stream = i % 4 === 3
      const res = await fetch(`${lb}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'kv-router-model',
          prompt: `request ${i}: a prompt long enough to fill one 64-token block of the simulated engines' caches`,
          max_tokens: 4,
          stream,
        }),
      })
      const body = await res.text()
      t.equal(res.status, 200, `request ${i} (${stream ? 'streamed' : 'unary'}) is answered: ${body.slice(0, 200)}`)
      if (stream) t.match(body, /data: \[DONE\]/, 'the stream comes through HAProxy to its end')
      else t.equal((JSON.parse(body) as { usage: { completion_tokens: number } }).usage.completion_tokens, 4)
      const replica = res.headers.get('x-router-replica') ?? 'none'
      answeredBy.set(replica, (answeredBy.get(replica) ?? 0) + 1)
    }
    t.same([...answeredBy.keys()].sort(), ['router-1', 'router-2'], `both replicas answered (${JSON.stringify(Object.fromEntries(answeredBy))})`)
    // each replica counted the requests HAProxy says it served
    for (const r of routers) {
      const metrics = await (await fetch(`${r.url}/metrics`)).text()
      t.equal(
        counter(metrics, 'dynamo_frontend_requests_total', 'status="200"'),
        answeredBy.get(r.name),
        `${r.name}'s metrics count the completions it answered`,
      )
    }

    // a replica that dies is started again on its port, and HAProxy answers throughout
    const [first] = routers
    const killed = pids().get('router-1')
    if (first === undefined || killed === undefined) return t.fail('no router-1')
    process.kill(killed, 'SIGKILL')
    await waitUntil('the exit line', () => /cluster: router-1 exited \(signal SIGKILL\); restarting it/.test(err), 10_000).catch((e: Error) =>
      t.fail(`${e.message}\n${err}`),
    )
    t.notOk(alive(killed), `the killed replica (${killed}) is gone`)
    const during = await complete(lb, 'asked while router-1 is down')
    t.equal(during.status, 200, `HAProxy answers while router-1 is down: ${during.body.slice(0, 200)}`)
    t.equal(during.replica, 'router-2', 'from the other replica')
    await waitUntil('the restart line', () => restarted().length > 0, 15_000).catch((e: Error) => t.fail(`${e.message}\n${out}\n${err}`))
    const [again] = restarted()
    t.ok(again !== undefined && again !== killed && alive(again), `router-1 runs again with a new pid (${again})`)
    let ready: { ready?: boolean; workers?: number } = {}
    await pollUntil(
      'router-1 ready again',
      async () => {
        ready = (await (await fetch(`${first.url}/ready`)).json()) as typeof ready
        return ready.ready === true && ready.workers === 2
      },
      30_000,
    ).catch((e: Error) => t.fail(`${e.message}: ${JSON.stringify(ready)}\n${out}\n${err}`))
    t.same([ready.ready, ready.workers], [true, 2], 'the restarted router-1 is ready with both engines from etcd')
    // back in HAProxy's rotation once its health check passes twice (inter 2s, rise 2)
    const replicas = new Set<string>()
    await pollUntil(
      'router-1 answering through HAProxy',
      async () => {
        const r = await complete(lb, `after the restart ${replicas.size}`)
        if (r.status === 200 && r.replica !== null) replicas.add(r.replica)
        return replicas.has('router-1')
      },
      30_000,
    ).catch((e: Error) => t.fail(`${e.message}: ${[...replicas].join(', ')}`))
    t.ok(replicas.has('router-1'), 'HAProxy sends requests to the restarted router-1 again')
    t.notMatch(out + err, /stopping the rest|cluster: stopped/, 'nothing else was stopped')

    const listed = new Map([...pids()].map(([name, pid]) => [name, name === 'router-1' ? (again as number) : pid]))
    for (const [name, pid] of listed) t.ok(alive(pid), `${name} (${pid}) runs before SIGTERM`)
    p.kill('SIGTERM')
    await waitUntil('exit after SIGTERM', () => code !== undefined, 30_000).catch((e: Error) => t.fail(`${e.message}\n${out}\n${err}`))
    t.equal(code, 0, 'exit 0 after SIGTERM')
    t.match(out, /cluster: stopped/)
    for (const [name, pid] of listed) t.notOk(alive(pid), `${name} (${pid}) is gone`)
    t.notOk(tmp !== undefined && existsSync(tmp), 'the temp dir is removed')
  },
)

t.test('npm run cluster: the options docs/configuration.md lists, and a bad one exits 2', async (t) => {
  const help = spawnSync(process.execPath, [script, '--help'], { encoding: 'utf8', env: { PATH: process.env.PATH } })
  t.equal(help.status, 0)
  const options = [...help.stdout.matchAll(/^ {2}(--[a-z-]+)/gm)].map((m) => m[1] as string).sort()
  t.ok(options.length >= 5, `--help lists its options (${options.join(' ')})`)
  const doc = readFileSync(docs, 'utf8')
  const start = doc.indexOf('\n## cluster\n')
  t.ok(start > 0, 'docs/configuration.md has a cluster section')
  const end = doc.indexOf('\n## ', start + 1)
  const section = doc.slice(start, end < 0 ? undefined : end)
  const documented = [...section.matchAll(/^\| `(--[a-z-]+)`/gm)].map((m) => m[1] as string).sort()
  t.same(documented, options, 'the same options as --help')
  const env = [...help.stdout.matchAll(/env (KVR_[A-Z_]+)/g)].map((m) => m[1] as string)
  for (const name of env) t.match(section, `\`${name}\``, `${name} is documented`)

  const bad = spawnSync(process.execPath, [script, '--engines', '0'], { encoding: 'utf8', env: { PATH: process.env.PATH } })
  t.equal(bad.status, 2, 'an invalid value exits 2')
  t.match(bad.stderr, /--engines must be an integer in \[1, 256\], got "0"/)
  t.equal(bad.stderr.trim().split('\n').length, 1, 'in one line')
  const unknown = spawnSync(process.execPath, [script, '--bogus'], { encoding: 'utf8', env: { PATH: process.env.PATH } })
  t.equal(unknown.status, 2)
  t.match(unknown.stderr, /unknown option "--bogus"/)
})
