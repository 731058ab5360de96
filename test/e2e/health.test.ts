// Worker health at process level: `kv-router serve` with `kv-router mocker` processes as its
// workers, probed every second. Under a steady stream of requests, an engine killed with SIGKILL
// is unreachable and out of routing within two probe intervals, and no request fails meanwhile
// (the ones sent to it are retried elsewhere); started again on its port, it is healthy and
// routed. With every engine killed, /ready is 503. An engine registering another block size is
// misconfigured and takes no request until it registers with the router's. The embedded fleet
// answers the probes too.
import t from 'tap'
import type { Test } from 'tap'
import { runCli as run } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'
import { waitUntil } from '../helpers/wait.js'

const BS = 16
const INTERVAL_MS = 1000

async function ready(p: CliProcess, re: RegExp, what: string): Promise<RegExpExecArray> {
  let code: number | null | undefined
  void p.exited.then((c) => (code = c))
  await waitUntil(`${what} (${p.err()})`, () => re.test(p.out()) || code !== undefined, 20_000)
  const m = re.exec(p.out())
  if (m === null) throw new Error(`${what}: exited ${String(code)}: ${p.err()}`)
  return m
}

/** One `kv-router mocker` engine; its URL. `args` may pin its port, id and router. */
async function engine(t: Test, args: string[] = []): Promise<{ p: CliProcess; url: string; port: number }> {
  const p = run(['mocker', '--num-workers', '1', '--block-size', String(BS), '--speedup-ratio', '10', '--host', '127.0.0.1', '--http-port', '0', ...args])
  t.teardown(async () => {
    if (p.p.exitCode === null && p.p.signalCode === null) p.p.kill('SIGKILL')
    await p.exited
  })
  const url = (await ready(p, /^kv-router mocker: ready 1 engine\(s\) (http:\/\/\S+)\n/, 'mocker ready'))[1] as string
  return { p, url, port: Number(new URL(url).port) }
}

async function kill(e: { p: CliProcess }): Promise<number> {
  e.p.p.kill('SIGKILL')
  await e.p.exited
  return performance.now()
}

async function router(t: Test, args: string[]): Promise<string> {
  const p = run(['serve', '--http-host', '127.0.0.1', '--http-port', '0', '--router-block-size', String(BS), '--router-event-threads', '1', ...args])
  t.teardown(async () => {
    p.p.kill('SIGTERM')
    await p.exited
  })
  return (await ready(p, /listening on (http:\/\/\S+)/, 'router listening'))[1] as string
}

interface WorkerView {
  id: number
  health: string
  health_reason: string | null
  probe: { path: string; consecutive_failures: number; last_ok_ms_ago: number | null } | null
}

const workers = async (base: string): Promise<WorkerView[]> => ((await (await fetch(`${base}/v1/workers`)).json()) as { workers: WorkerView[] }).workers
const healthOf = async (base: string, id: number): Promise<string | undefined> => (await workers(base)).find((w) => w.id === id)?.health

async function metric(base: string, name: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text()
  const line = text.split('\n').find((l) => l.startsWith(`${name} `))
  return line === undefined ? 0 : Number(line.slice(name.length + 1))
}

/** Polls until `cond`, returning when it first held. */
async function when(what: string, cond: () => Promise<boolean>, timeoutMs = 10_000): Promise<number> {
  await waitUntil(what, cond, timeoutMs, 25)
  return performance.now()
}

/**
 * Requests sent without pause by a few clients, each with a prompt of its own: every answer's
 * status, worker and time. stop() ends them and resolves once the last is answered.
 */
function load(base: string, clients = 3): { sent: { at: number; status: number; worker: number; body: string }[]; stop(): Promise<void> } {
  const sent: { at: number; status: number; worker: number; body: string }[] = []
  let running = true
  let n = 0
  const loop = async (): Promise<void> => {
    while (running) {
      const i = n++
      const prompt = Array.from({ length: 3 * BS }, (_, k) => (i * 7919 + k) % 50_000)
      try {
        const r = await fetch(`${base}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ prompt, max_tokens: 2 }),
        })
        const body = await r.text()
        const worker = r.status === 200 ? (JSON.parse(body) as { nvext: { worker_id: { decode_worker_id: number } } }).nvext.worker_id.decode_worker_id : -1
        sent.push({ at: performance.now(), status: r.status, worker, body: r.status === 200 ? '' : body })
      } catch (err) {
        sent.push({ at: performance.now(), status: 0, worker: -1, body: String(err) })
      }
      await new Promise((r) => setTimeout(r, 10))
    }
  }
  const loops = Array.from({ length: clients }, loop)
  return {
    sent,
    async stop() {
      running = false
      await Promise.all(loops)
    },
  }
}

t.test('an engine killed: out of routing within two probe intervals, no request failed; started again: routed', async (t) => {
  const engines = [await engine(t), await engine(t), await engine(t)]
  const base = await router(t, [
    '--router-health-probe-interval-secs',
    String(INTERVAL_MS / 1000),
    '--router-health-probe-timeout-secs',
    '0.5',
    ...engines.flatMap((e, i) => ['--worker', `${i + 1}=${e.url}`]),
  ])
  await when('every worker probed once', async () => (await workers(base)).every((w) => w.probe !== null && w.probe.last_ok_ms_ago !== null))
  t.same(
    (await workers(base)).map((w) => [w.id, w.health, w.probe?.path]),
    [
      [1, 'healthy', '/health'],
      [2, 'healthy', '/health'],
      [3, 'healthy', '/health'],
    ],
  )

  const traffic = load(base)
  await when('worker 2 takes requests', async () => traffic.sent.some((x) => x.worker === 2))
  const killedAt = await kill(engines[1] as { p: CliProcess })
  const outAt = await when('worker 2 unreachable', async () => (await healthOf(base, 2)) === 'unreachable')
  t.ok(outAt - killedAt <= 2 * INTERVAL_MS, `unreachable ${(outAt - killedAt).toFixed(0)} ms after the kill (two intervals: ${2 * INTERVAL_MS} ms)`)
  const w2 = (await workers(base)).find((w) => w.id === 2)
  t.match(w2?.health_reason, /^2 health probe\(s\) in a row failed, the last: GET \/health: .*ECONNREFUSED/)
  // the requests sent to it before were retried: none is routed there any more
  await new Promise((r) => setTimeout(r, 200))
  const retries = await metric(base, 'kvrouter_proxy_retries_total')
  t.ok(retries >= 1, `requests were sent to it after the kill, and retried (${retries})`)
  await new Promise((r) => setTimeout(r, 2 * INTERVAL_MS))
  t.equal(await metric(base, 'kvrouter_proxy_retries_total'), retries, 'no request tried on it once it was unreachable')
  const during = traffic.sent.filter((x) => x.at > killedAt)
  t.ok(during.length > 20, `${during.length} requests answered since the kill`)
  t.notOk(
    during.some((x) => x.worker === 2),
    'none answered by it',
  )

  // started again on its port: healthy at a probe, and routed
  const again = await engine(t, ['--http-port', String((engines[1] as { port: number }).port)])
  const upAt = performance.now()
  const backAt = await when('worker 2 healthy again', async () => (await healthOf(base, 2)) === 'healthy')
  t.ok(backAt - upAt <= 2 * INTERVAL_MS, `healthy ${(backAt - upAt).toFixed(0)} ms after it started`)
  await when('worker 2 answers requests again', async () => traffic.sent.some((x) => x.at > backAt && x.worker === 2))
  await traffic.stop()
  const failed = traffic.sent.filter((x) => x.status !== 200)
  t.same(failed, [], `none of ${traffic.sent.length} requests failed`)
  t.ok(again.url.endsWith(`:${(engines[1] as { port: number }).port}`))

  // every engine killed: not ready, and refused at once
  const allKilledAt = Math.max(...(await Promise.all([again, engines[0], engines[2]].map((e) => kill(e as { p: CliProcess })))))
  const notReadyAt = await when('/ready 503', async () => (await fetch(`${base}/ready`)).status === 503)
  t.ok(notReadyAt - allKilledAt <= 2 * INTERVAL_MS, `/ready 503 ${(notReadyAt - allKilledAt).toFixed(0)} ms after the last kill`)
  const r = await fetch(`${base}/ready`)
  t.match(await r.json(), { ready: false, workers: 3, healthy_workers: 0 })
  const refused = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 1 }),
  })
  t.equal(refused.status, 503)
  t.match(await refused.json(), { error: { code: 'KVR_ERR_NO_WORKERS' } })
  // one back: ready
  await engine(t, ['--http-port', String((engines[0] as { port: number }).port)])
  await when('/ready 200', async () => (await fetch(`${base}/ready`)).status === 200, 2 * INTERVAL_MS + 1000)
})

t.test('another block size: misconfigured, no request; registered with the right one: routed', async (t) => {
  const base = await router(t, ['--router-health-probe-interval-secs', String(INTERVAL_MS / 1000)])
  await engine(t, ['--router-url', base, '--first-worker-id', '1'])
  const wrong = await engine(t, ['--router-url', base, '--first-worker-id', '2', '--block-size', String(2 * BS)])
  await when('both registered', async () => (await workers(base)).length === 2)
  const w = (await workers(base)).find((x) => x.id === 2)
  t.equal(w?.health, 'misconfigured')
  t.equal(w?.health_reason, `block size ${2 * BS}, the router's is ${BS}: its KV blocks can never match; register it again with block size ${BS}`)
  t.match(await (await fetch(`${base}/metrics`)).text(), /^kvrouter_workers\{state="misconfigured"\} 1$/m)
  const traffic = load(base)
  await when('40 requests', async () => traffic.sent.length >= 40)
  t.same([...new Set(traffic.sent.map((x) => x.worker))], [1], 'every request to worker 1')
  // the same worker registered again with the router's block size (SIGKILL: the wrong engine
  // would unregister worker 2 on SIGTERM)
  await engine(t, ['--router-url', base, '--first-worker-id', '2'])
  await kill(wrong)
  const fixedAt = await when('worker 2 healthy', async () => (await healthOf(base, 2)) === 'healthy')
  await when('worker 2 takes requests', async () => traffic.sent.some((x) => x.at > fixedAt && x.worker === 2))
  await traffic.stop()
  t.same(
    traffic.sent.filter((x) => x.status !== 200),
    [],
    `none of ${traffic.sent.length} requests failed`,
  )
})

t.test('the embedded fleet answers the probes', async (t) => {
  const base = await router(t, ['--embedded-fleet', '2', '--router-health-probe-interval-secs', '0.2'])
  await when('both probed', async () =>
    (await workers(base)).every((w) => w.probe !== null && w.probe.consecutive_failures === 0 && w.probe.last_ok_ms_ago !== null),
  )
  t.same(
    (await workers(base)).map((w) => [w.health, w.probe?.path]),
    [
      ['healthy', '/health'],
      ['healthy', '/health'],
    ],
  )
  t.equal((await fetch(`${base}/ready`)).status, 200)
})
