// `kv-router serve --etcd-url` (no other transport flag) in front of `kv-router mocker --dynamo`
// processes, as in front of an unchanged Dynamo fleet: the engines' KV events reach the router on
// the ZMQ event plane (found through their event-channel records in etcd, endpoint- or
// component-scoped), and what it missed comes back through the worker query over the TCP request
// plane: blocks cached before the router started (the registration's dump), an engine that
// crashed and came back as a new instance, and a batch of messages its publisher never sent
// (`--dynamo-drop-kv-events`). Each time the router's index (GET /v1/kv/dump) must hold, per
// worker, exactly the blocks the engine's pool holds (its worker query's tree dump), and the
// counters must say which recovery ran, over TCP, once per loss.
//
// The workers' instance records name only a TCP address: the router's etcd discovery registers
// them as request-plane workers.
import t from 'tap'
import type { Test } from 'tap'
import { Router } from '../../src/core/router.js'
import { buildApp } from '../../src/http/server.js'
import type { App } from '../../src/http/server.js'
import { startEtcd } from '../../src/deploy/services.js'
import { config } from '../http/helpers.js'
import { runCli } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'
import { waitUntil } from '../helpers/wait.js'

const BS = 16

interface Engine {
  id: bigint
  http: string
}

interface Mocker {
  proc: CliProcess
  engines: Engine[]
}

interface EngineStats {
  worker_query: { answered: number }
  kv_events: { sent: number; dropped: number }
}

/** `kv-router mocker --dynamo` as a process, its engines' ids and HTTP servers (for /stats and driving them). */
async function mocker(t: Test, etcdUrl: string, n: number, extra: string[] = []): Promise<Mocker> {
  const proc = runCli([
    'mocker',
    '--dynamo',
    '--etcd-url',
    etcdUrl,
    '--lease-ttl-secs',
    '2',
    '--num-workers',
    String(n),
    '--block-size',
    String(BS),
    '--speedup-ratio',
    '0',
    '--host',
    '127.0.0.1',
    '--http-port',
    '0',
    ...extra,
  ])
  t.teardown(async () => {
    if (proc.p.exitCode === null && proc.p.signalCode === null) proc.p.kill('SIGTERM')
    await proc.exited
  })
  let code: number | null | undefined
  void proc.exited.then((c) => (code = c))
  const ready = /^kv-router mocker: ready \d+ engine\(s\) (.+)\n/m
  await waitUntil(`mocker ready (${proc.err()})`, () => ready.test(proc.out()) || code !== undefined, 20_000)
  const urls = ready.exec(proc.out())?.[1]?.split(' ')
  const ids = /worker ids ([\d ]+);/.exec(proc.err())?.[1]?.split(' ')
  if (urls === undefined || ids === undefined || urls.length !== n || ids.length !== n) throw new Error(`mocker: exited ${String(code)}: ${proc.err()}`)
  return { proc, engines: ids.map((id, i) => ({ id: BigInt(id), http: urls[i] as string })) }
}

async function serve(t: Test, etcdUrl: string): Promise<{ router: Router; app: App }> {
  const router = await Router.start(config(['--router-block-size', String(BS), '--etcd-url', etcdUrl, '--router-event-recovery']))
  t.teardown(() => router.close())
  const app = await buildApp({ router, tokenizer: null })
  t.teardown(() => app.shutdown(1000))
  return { router, app }
}

async function complete(http: string, prompt: string): Promise<void> {
  const r = await fetch(`${http}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: 4 }),
  })
  if (r.status !== 200) throw new Error(`${http}: ${r.status} ${await r.text()}`)
  await r.arrayBuffer()
}

async function stats(e: Engine): Promise<EngineStats> {
  return ((await (await fetch(`${e.http}/stats`)).json()) as { dynamo: EngineStats }).dynamo
}

/** block_hash values in a JSON answer, as decimal strings (read from the text: hashes pass 2^53). */
function storedHashes(json: string): Set<string> {
  return new Set([...json.matchAll(/"block_hash":(\d+)/g)].map((m) => m[1] as string))
}

const dumpOf = async (app: App, id: bigint): Promise<string> => (await app.fastify.inject({ method: 'GET', url: `/v1/kv/dump?worker_id=${id}` })).body

/** '' when the router's index holds, per engine, exactly the blocks its pool holds; else what differs. */
async function compare(app: App, engines: Engine[]): Promise<string> {
  for (const e of engines) {
    const r = await fetch(`${e.http}/v1/kv/query`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: `{"worker_id":${e.id},"start_event_id":null,"end_event_id":null}`,
    })
    if (r.status !== 200) return `engine ${e.id} answers ${r.status}`
    const pool = storedHashes(await r.text())
    const index = storedHashes(await dumpOf(app, e.id))
    if (pool.size === 0 || pool.size !== index.size || [...pool].some((h) => !index.has(h)))
      return `worker ${e.id}: pool ${pool.size} blocks, index ${index.size}`
  }
  return ''
}

async function metric(app: App, series: string): Promise<number> {
  const text = (await app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  const line = text.split('\n').find((l) => l.startsWith(`${series} `))
  return line === undefined ? Number.NaN : Number(line.slice(series.length + 1))
}

let asked = 0
/** A prompt of a few blocks with a prefix shared by every other request. */
const prompt = (): string =>
  `${asked % 2 === 0 ? 'A shared system prompt of the fleet, ' : 'Another common preamble, longer, '}question ${asked++} about KV blocks`

const recovered = (r: Router): { gaps: number; ranges: number; dumps: number; failed: number; covered: number } => {
  const c = r.recovery?.counters
  if (c === undefined) throw new Error('the router recovers no events')
  return { gaps: c.gaps, ranges: c.ranges, dumps: c.dumps, failed: c.failed, covered: c.covered }
}

for (const scope of ['endpoint', 'component'] as const) {
  t.test(`${scope}-scoped channels: blocks cached before the router come as a dump over TCP, later ones as events`, async (t) => {
    const etcd = await startEtcd()
    t.teardown(() => etcd.stop())
    const m = await mocker(t, etcd.url, 2, ['--dynamo-event-channels', scope])
    // served before the router exists: only the worker query can tell it
    for (let i = 0; i < 6; i++) await complete((m.engines[i % 2] as Engine).http, prompt())
    const before = await Promise.all(m.engines.map(stats))

    const { router, app } = await serve(t, etcd.url)
    await waitUntil('the engines registered from etcd', () => m.engines.every((e) => router.parts.registry.has(e.id)))
    let mismatch = ''
    await waitUntil('the dumps applied', async () => (mismatch = await compare(app, m.engines)) === '', 15_000, 50)
    t.equal(mismatch, '', 'caught up through the worker query: index and pools hold the same blocks')
    t.equal(recovered(router).dumps, 2, 'one dump per worker, at its registration')
    t.equal(router.eventPlane?.endpoints.direct.length, 2, "a SUB on each engine's kv-events publisher")

    for (let i = 0; i < 12; i++) await complete((m.engines[i % 2] as Engine).http, prompt())
    await waitUntil('the index equals the pools', async () => (mismatch = await compare(app, m.engines)) === '', 15_000, 50)
    t.equal(mismatch, '', 'after requests on the engines: index and pools hold the same blocks')

    const after = await Promise.all(m.engines.map(stats))
    for (let i = 0; i < 2; i++) {
      const asked = (after[i] as EngineStats).worker_query.answered - (before[i] as EngineStats).worker_query.answered
      t.ok(asked >= 2, `engine ${i} answered the probe and the dump on its request plane (${asked})`)
    }
    t.ok((await metric(app, 'kvrouter_request_plane_total{what="requests"}')) >= 4, "the queries went over Dynamo's TCP request plane")
    t.ok((await metric(app, 'kvrouter_event_plane_total{what="applied"}')) > 0, 'events came on the ZMQ event plane')
    t.equal(recovered(router).failed, 0)
    const listed = JSON.parse((await app.fastify.inject({ method: 'GET', url: '/v1/workers' })).body) as { workers: { id_str: string; index: string }[] }
    t.same(
      m.engines.map((e) => listed.workers.find((w) => w.id_str === String(e.id))?.index),
      ['exact', 'exact'],
      'both workers exact',
    )
  })
}

t.test('an engine restarted as a new instance, then a batch it never sent: both recovered over TCP, each loss once', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const a = await mocker(t, etcd.url, 1)
  const b = await mocker(t, etcd.url, 1)
  const engines = [...a.engines, ...b.engines]
  const { router, app } = await serve(t, etcd.url)
  const [ea, eb] = engines as [Engine, Engine]
  await waitUntil('both registered', () => router.parts.registry.has(ea.id) && router.parts.registry.has(eb.id))
  for (let i = 0; i < 8; i++) await complete((engines[i % 2] as Engine).http, prompt())
  let mismatch = ''
  await waitUntil('the index equals the pools', async () => (mismatch = await compare(app, [ea, eb])) === '', 15_000, 50)
  t.equal(mismatch, '', 'before the crash: index and pools hold the same blocks')

  // a crash: no shutdown, the lease expires (2 s) and the records with it
  b.proc.p.kill('SIGKILL')
  await waitUntil('the crashed worker removed', async () => !router.parts.registry.has(eb.id) && storedHashes(await dumpOf(app, eb.id)).size === 0, 15_000, 50)
  t.equal(storedHashes(await dumpOf(app, eb.id)).size, 0, "the crashed instance's blocks left the index")

  // back as a new instance (a new lease), whose publisher skips its messages 20 to 22
  const from = 20
  const c = await mocker(t, etcd.url, 1, ['--dynamo-drop-kv-events', `${from}:3`])
  const ec = c.engines[0] as Engine
  engines.push(ec)
  t.not(ec.id, eb.id, 'a new instance id')
  await waitUntil('the new instance registered', () => router.parts.registry.has(ec.id))
  // until the router's SUB has joined, the first events may be missed; a range recovers them
  await waitUntil('its first blocks indexed', async () => {
    await complete(ec.http, prompt())
    return storedHashes(await dumpOf(app, ec.id)).size > 0
  })
  await waitUntil('the index equals the pools', async () => (mismatch = await compare(app, [ea, ec])) === '', 15_000, 50)
  t.equal(mismatch, '', 'after the restart: index and pools hold the same blocks')
  t.ok((await stats(ec)).kv_events.sent < from, 'the fault is still ahead')

  const r0 = recovered(router)
  const gaps0 = router.eventPlane?.counters.gaps ?? 0
  const queries0 = (await stats(ec)).worker_query.answered
  const tcp0 = await metric(app, 'kvrouter_request_plane_total{what="requests"}')
  await waitUntil('messages past the dropped ones published', async () => {
    await complete(ec.http, prompt())
    const s = (await stats(ec)).kv_events
    return s.dropped === 3 && s.sent > from
  })
  await waitUntil('the index equals the pools', async () => (mismatch = await compare(app, [ea, ec])) === '', 15_000, 50)
  t.equal(mismatch, '', 'after the lost batch: index and pools hold the same blocks')
  const r1 = recovered(router)
  t.equal((router.eventPlane?.counters.gaps ?? 0) - gaps0, 1, 'the event plane saw one sequence gap')
  t.same(
    { gaps: r1.gaps - r0.gaps, ranges: r1.ranges - r0.ranges, dumps: r1.dumps - r0.dumps, failed: r1.failed - r0.failed, covered: r1.covered - r0.covered },
    { gaps: 1, ranges: 1, dumps: 0, failed: 0, covered: 1 },
    "one recovery of the missing range: the shard's event-id gap; the event plane's report of the same loss is covered by it",
  )
  t.equal((await stats(ec)).worker_query.answered - queries0, 1, 'the engine answered one worker query on its request plane')
  t.equal((await metric(app, 'kvrouter_request_plane_total{what="requests"}')) - tcp0, 1, 'sent over the TCP request plane')
  t.equal(await metric(app, 'kvrouter_index_recovery_total{what="covered"}'), r1.covered, 'the metric shows it')
})
