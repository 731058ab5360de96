// Process level, nothing mocked: nats-server, etcd, a `kv-router mocker` fleet registered in etcd,
// two `kv-router serve --router-replica-sync` replicas and HAProxy in front of them with
// deploy/haproxy/haproxy.cfg (health check on /ready). A booking made on one replica shows in the
// other's GET /v1/workers within 50 ms. Under a steady load of streamed completions through
// HAProxy, one replica is killed with SIGKILL: the only requests that fail are the ones it was
// serving at that moment (HAProxy's x-router-replica header names the replica of each), and
// everything sent afterwards is answered by the survivor. Restarted with the same flags, the
// replica's bookings and index equal the survivor's within 5 s of its /ready turning 200.
import t from 'tap'
import { spawn } from 'node:child_process'
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { Agent, request } from 'undici'
import { getFreePorts, startEtcd, startHaproxy, startNats } from '../../src/deploy/services.js'
import type { HaproxyServer } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { cliArgv } from '../helpers/cli.js'

const BS = 16
const ENGINES = 4
const MODEL = 'sim'

/** Every child this file starts, killed if the test process exits without its teardown. */
const children = new Set<ChildProcessWithoutNullStreams>()
process.on('exit', () => {
  for (const p of children) p.kill('SIGKILL')
})

interface Proc {
  p: ChildProcessWithoutNullStreams
  out: () => string
  err: () => string
  exited: Promise<number | null>
}

function run(args: string[]): Proc {
  const p = spawn(process.execPath, cliArgv(args), { env: { PATH: process.env.PATH } })
  children.add(p)
  let out = ''
  let err = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  // the tail is enough to say why it failed
  p.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-8000)))
  if (process.env['KVR_SERVICE_LOGS'] === '1') {
    p.stdout.pipe(process.stderr)
    p.stderr.pipe(process.stderr)
  }
  const exited = new Promise<number | null>((r) =>
    p.on('close', (code) => {
      children.delete(p)
      r(code)
    }),
  )
  return { p, out: () => out, err: () => err, exited }
}

async function terminate(c: Proc | null): Promise<void> {
  if (c === null || c.p.exitCode !== null || c.p.signalCode !== null) return
  c.p.kill('SIGTERM')
  const timer = setTimeout(() => c.p.kill('SIGKILL'), 15_000)
  await c.exited
  clearTimeout(timer)
}

const nats = await startNats({ jetstream: false })
t.teardown(() => nats.stop())
const etcd = await startEtcd()
t.teardown(() => etcd.stop())

/** A replica on a fixed port, so that it comes back where HAProxy looks for it. */
class Replica {
  proc: Proc | null = null
  routerId = ''
  constructor(
    readonly name: string,
    readonly port: number,
  ) {}

  get base(): string {
    return `http://127.0.0.1:${this.port}`
  }

  async start(): Promise<void> {
    const args = [
      'serve',
      '--http-host',
      '127.0.0.1',
      '--http-port',
      String(this.port),
      '--router-block-size',
      String(BS),
      '--tokenizer',
      'bytes',
      '--router-event-threads',
      '1',
    ]
    args.push('--model-name', MODEL, '--nats-url', nats.url, '--etcd-url', etcd.url, '--router-replica-sync', '--shutdown-timeout-secs', '2')
    const c = run(args)
    this.proc = c
    const re = /listening on http:\/\/\S+ .*replica sync as router (\d+)/
    await waitUntil(`${this.name} listening (${c.err()})`, () => re.test(c.out()) || c.p.exitCode !== null, 30_000, 20)
    const m = re.exec(c.out())
    if (m === null) throw new Error(`${this.name} exited ${c.p.exitCode}: ${c.out()} ${c.err()}`)
    this.routerId = m[1] as string
  }

  async kill9(): Promise<void> {
    const c = this.proc
    if (c === null) return
    c.p.kill('SIGKILL')
    await c.exited
  }

  stop(): Promise<void> {
    return terminate(this.proc)
  }

  async json(path: string): Promise<Record<string, unknown>> {
    const r = await fetch(this.base + path)
    return (await r.json()) as Record<string, unknown>
  }

  async ready(): Promise<number> {
    try {
      const r = await fetch(`${this.base}/ready`)
      await r.arrayBuffer()
      return r.status
    } catch {
      return 0
    }
  }
}

const [portA, portB] = await getFreePorts(2)
const a = new Replica('router-1', portA as number)
const b = new Replica('router-2', portB as number)
t.teardown(() => Promise.all([a.stop(), b.stop()]))
await Promise.all([a.start(), b.start()])

// engines slow at decoding (about 60 ms a token), so that a stream lasts long enough to be cut
// and the KV events of decoded blocks come seldom
const mocker = run(
  [
    'mocker',
    '--num-workers',
    String(ENGINES),
    '--block-size',
    String(BS),
    '--num-gpu-blocks-override',
    '4096',
    '--speedup-ratio',
    '1',
    '--decode-speedup-ratio',
    '0.1',
  ].concat(['--model-name', MODEL, '--nats-url', nats.url, '--etcd-url', etcd.url]),
)
t.teardown(() => terminate(mocker))
await waitUntil(`the mocker's ready line (${mocker.err()})`, () => /kv-router mocker: ready/.test(mocker.out()) || mocker.p.exitCode !== null, 30_000, 20)
if (mocker.p.exitCode !== null) throw new Error(`the mocker exited ${mocker.p.exitCode}: ${mocker.err()}`)
for (const r of [a, b])
  await waitUntil(`${r.name} lists the ${ENGINES} engines`, async () => ((await r.json('/ready'))['workers'] as number) === ENGINES, 20_000, 50)

const lb: HaproxyServer = await startHaproxy({
  backends: [
    { name: a.name, port: a.port },
    { name: b.name, port: b.port },
  ],
})
t.teardown(() => lb.stop())
await waitUntil('both replicas UP in HAProxy', async () => [...(await lb.serverStatus()).values()].filter((s) => s === 'UP').length === 2, 15_000, 100)

/** Bookings and cached blocks per worker-rank, as GET /v1/workers shows them. */
interface WorkerView {
  /** `id:rank` → in_flight, active_blocks, prefill_tokens */
  bookings: Map<string, string>
  cached: Map<string, number>
  inFlight: number
}

async function workers(r: Replica): Promise<WorkerView> {
  const text = await (await fetch(`${r.base}/v1/workers`)).text()
  const view: WorkerView = { bookings: new Map(), cached: new Map(), inFlight: 0 }
  // worker ids are u64: taken from the text, never through a JSON number
  for (const w of text.matchAll(/"id_str":"(\d+)".*?"ranks":\[(.*?)\]\}/g)) {
    for (const rank of (w[2] as string).matchAll(
      /\{"dp_rank":(\d+),"index":"[a-z-]+","cached_blocks":(\d+),"last_event_id":[^,]+,"active_blocks":(\d+),"prefill_tokens":(\d+),"in_flight":(\d+)[,}]/g,
    )) {
      const key = `${w[1]}:${rank[1]}`
      view.cached.set(key, Number(rank[2]))
      view.bookings.set(key, `in_flight ${rank[5]}, active_blocks ${rank[3]}, prefill_tokens ${rank[4]}`)
      view.inFlight += Number(rank[5])
    }
  }
  if (view.cached.size !== ENGINES) throw new Error(`${r.name}: ${view.cached.size} worker-rank(s) read from ${text.slice(0, 300)}`)
  return view
}

/** The index as (worker, rank, parent, block) entries, sorted: GET /v1/kv/dump without its event ids and grouping. */
async function indexEntries(r: Replica): Promise<string[]> {
  const text = await (await fetch(`${r.base}/v1/kv/dump`)).text()
  const out: string[] = []
  for (const ev of text.matchAll(
    /\{"worker_id":(\d+),"event":\{"event_id":\d+,"data":\{"stored":\{"parent_hash":(null|\d+),"blocks":\[(.*?)\]\}\},"dp_rank":(\d+)\}\}/g,
  )) {
    let parent = ev[2] as string
    for (const blk of (ev[3] as string).matchAll(/"block_hash":(\d+)/g)) {
      out.push(`${ev[1]}:${ev[4]} ${parent} ${blk[1]}`)
      parent = blk[1] as string
    }
  }
  return out.sort()
}

const agent = new Agent({ connections: 256 })
t.teardown(() => agent.close())

interface Outcome {
  i: number
  sentAt: number
  endAt: number
  replica: string | null
  status: number
  ok: boolean
  error: string | null
}

/** A streamed completion through HAProxy, read to its end: ok when it ends with `data: [DONE]`. */
async function completion(i: number, maxTokens: number, onFirst?: (replica: string | null) => void, signal?: AbortSignal): Promise<Outcome> {
  const sentAt = performance.now()
  const conversation = i % 6
  // conversations share long prefixes, so the engines cache blocks and the index has them
  const prompt = `conversation ${conversation}: ${'the same long context of this conversation, repeated so that it fills blocks. '.repeat(4)} turn ${i}`
  let replica: string | null = null
  let status = 0
  try {
    const res = await request(`${lb.url}/v1/completions`, {
      method: 'POST',
      dispatcher: agent,
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt, max_tokens: maxTokens, stream: true }),
      signal,
    })
    status = res.statusCode
    const h = res.headers['x-router-replica']
    replica = typeof h === 'string' ? h : null
    let body = ''
    let first = true
    for await (const chunk of res.body) {
      body += (chunk as Buffer).toString()
      if (first) onFirst?.(replica)
      first = false
    }
    const ok = status === 200 && body.includes('data: [DONE]')
    return { i, sentAt, endAt: performance.now(), replica, status, ok, error: ok ? null : `status ${status}, body ends ${JSON.stringify(body.slice(-120))}` }
  } catch (err) {
    return { i, sentAt, endAt: performance.now(), replica, status, ok: false, error: (err as Error).message }
  }
}

t.test('a booking made on one replica is in the other’s GET /v1/replicas within 50 ms, and so is its release', async (t) => {
  const remote = async (r: Replica): Promise<number> => ((await r.json('/v1/replicas'))['self'] as Record<string, number>)['remote_bookings'] as number
  const delays: number[] = []
  // the first two rounds, one each way, warm up paths taken for the first time (the route's
  // handler, the peers' first event); they are not measured
  for (let k = -2; k < 6; k++) {
    const [from, to] = (k + 2) % 2 === 0 ? [a, b] : [b, a]
    t.equal(await remote(to), 0, `${to.name} holds no booking of its peer's yet`)
    const tokens = Array.from({ length: 5 * BS }, (_, j) => 1000 + (k + 2) * 100 + j)
    // the clock runs from before the request that books: an upper bound on the sync delay
    const t0 = performance.now()
    const res = await fetch(`${from.base}/v1/route`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ token_ids: tokens, update_states: true }),
    })
    const routed = (await res.json()) as { request_id: string; worker_id_str: string; dp_rank: number }
    t.equal(res.status, 200)
    await waitUntil(`the booking on ${to.name}`, async () => (await remote(to)) === 1, 2000, 0)
    const booked = performance.now() - t0
    t.equal(
      (await workers(to)).bookings.get(`${routed.worker_id_str}:${routed.dp_rank}`),
      'in_flight 1, active_blocks 5, prefill_tokens 80',
      `${to.name} counts it on the worker ${from.name} chose`,
    )
    const t1 = performance.now()
    const del = await fetch(`${from.base}/v1/route/${routed.request_id}`, { method: 'DELETE' })
    await del.arrayBuffer()
    t.equal(del.status, 200)
    await waitUntil(`the release on ${to.name}`, async () => (await remote(to)) === 0, 2000, 0)
    const released = performance.now() - t1
    t.equal((await workers(to)).inFlight, 0, `${to.name} counts nothing in flight after the release`)
    if (k < 0) continue
    delays.push(booked, released)
    // each figure also holds an HTTP request and a poll, which a loaded machine can delay alone
    t.ok(
      booked <= 250 && released <= 250,
      `${from.name} → ${to.name}: booking visible after ${booked.toFixed(1)} ms, ` + `release after ${released.toFixed(1)} ms`,
    )
  }
  t.comment(`delays, ms: ${delays.map((d) => d.toFixed(1)).join(' ')}`)
  const sorted = [...delays].sort((x, y) => x - y)
  const median = ((sorted[5] as number) + (sorted[6] as number)) / 2
  t.ok(median <= 50, `median of ${delays.length} delays ${median.toFixed(1)} ms`)
})

t.test('kill -9 of a replica under load: only its requests in flight fail; restarted, it equals the survivor within 5 s of ready', async (t) => {
  const outcomes: Promise<Outcome>[] = []
  let n = 0
  const load = setInterval(() => {
    const i = n++
    outcomes.push(completion(i, 8 + (i % 8)))
  }, 40)
  const own = async (r: Replica): Promise<number> => ((await r.json('/v1/replicas'))['self'] as Record<string, number>)['bookings'] as number
  // both replicas serve, each with streams open
  await waitUntil('streams open on both replicas', async () => n > 40 && (await own(a)) >= 3 && (await own(b)) >= 3, 15_000, 50)
  const onA = await own(a)
  const killAt = performance.now()
  await a.kill9()
  t.comment(`${a.name} killed with ${onA} stream(s) of its own open, after ${n} requests`)
  await new Promise((r) => setTimeout(r, 3000))
  clearInterval(load)
  const results = await Promise.all(outcomes)

  const failed = results.filter((r) => !r.ok)
  const served = new Map<string, number>()
  for (const r of results) if (r.ok) served.set(r.replica ?? 'none', (served.get(r.replica ?? 'none') ?? 0) + 1)
  t.comment(`${results.length} requests: ${failed.length} failed, answered ${JSON.stringify(Object.fromEntries(served))}`)
  t.ok(failed.length >= 1, 'the kill cut streams in flight on the killed replica')
  for (const r of failed) {
    const inFlightOnA = r.replica === a.name && r.sentAt < killAt && r.endAt >= killAt
    t.ok(
      inFlightOnA,
      `request ${r.i} failed (${r.error}): it was in flight on ${a.name} (replica ${r.replica}, sent ${(r.sentAt - killAt).toFixed(0)} ms from the kill)`,
    )
  }
  const after = results.filter((r) => r.sentAt > killAt)
  t.ok(after.length >= 30, `${after.length} requests sent after the kill`)
  t.ok(
    after.every((r) => r.ok && r.replica === b.name),
    'every one of them answered in full by the survivor',
  )
  t.ok(
    results.filter((r) => r.replica === b.name).every((r) => r.ok),
    'no request of the survivor failed',
  )

  // streams that outlast the restart, so the survivor has bookings to share
  const hold = new AbortController()
  const holders: string[] = []
  const held = Array.from({ length: 3 }, (_, k) => completion(10_000 + k, 4000, (replica) => holders.push(replica ?? 'none'), hold.signal))
  t.teardown(() => hold.abort())
  await waitUntil('the held streams started', () => holders.length === 3, 10_000, 20)
  t.same(holders, [b.name, b.name, b.name], 'held on the survivor')
  // its peer's bookings went with it: it fell silent
  await waitUntil(
    `${b.name} dropped ${a.name}`,
    async () => {
      const self = (await b.json('/v1/replicas'))['self'] as Record<string, unknown>
      return self['remote_bookings'] === 0
    },
    10_000,
    50,
  )
  t.equal((await workers(b)).inFlight, 3, `${b.name} holds the three streams, nothing else`)

  const oldId = a.routerId
  await a.start()
  t.not(a.routerId, oldId, 'restarted under a new router id (a new etcd lease)')
  await waitUntil(`${a.name} ready again`, async () => (await a.ready()) === 200, 20_000, 10)
  const readyAt = performance.now()
  let last = ''
  let same = false
  let view: WorkerView | null = null
  let entries = 0
  while (!same && performance.now() - readyAt < 5000) {
    const [va, vb, ia, ib] = await Promise.all([workers(a), workers(b), indexEntries(a), indexEntries(b)])
    const ba = JSON.stringify([...va.bookings].sort())
    const bb = JSON.stringify([...vb.bookings].sort())
    const ca = JSON.stringify([...va.cached].sort())
    const cb = JSON.stringify([...vb.cached].sort())
    same = ba === bb && ca === cb && ia.join('\n') === ib.join('\n')
    last = `bookings ${ba} vs ${bb}; cached ${ca} vs ${cb}; index entries ${ia.length} vs ${ib.length}`
    view = va
    entries = ia.length
    if (!same) await new Promise((r) => setTimeout(r, 50))
  }
  const tookMs = performance.now() - readyAt
  t.ok(same, `within 5 s of ready, ${a.name}'s bookings and index equal ${b.name}'s (${tookMs.toFixed(0)} ms; last: ${last})`)
  t.equal(view?.inFlight, 3, `${a.name} holds ${b.name}'s three streams`)
  t.ok(entries > 0, `the index is not empty (${entries} block entries)`)

  // back in HAProxy's rotation: the next requests reach it
  await waitUntil(`${a.name} UP again in HAProxy`, async () => (await lb.serverStatus()).get(a.name) === 'UP', 15_000, 100)
  const back = await completion(20_000, 4)
  t.same([back.ok, back.replica], [true, a.name], `a request is answered by ${a.name} again (leastconn, the survivor holds streams)`)
  hold.abort()
  await Promise.all(held)
})
