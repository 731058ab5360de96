// Process level, the distributed setup: `kv-router serve --nats-url --etcd-url`
// against a real nats-server and etcd; simulated engines register in etcd under leases and
// publish their KV events on NATS (one through the mocker's own NATS and etcd mode, one with its
// events wrapped in the event-plane envelope and a lease taken by the test). A repeated prompt goes to the worker that holds its prefix;
// a worker whose lease ends leaves routing and the index; losing NATS shows in /ready as degraded.
import t from 'tap'
import { spawn } from 'node:child_process'
import { connect } from 'nats'
import { Etcd3 } from 'etcd3'
import { startEtcd, startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { cliArgv } from '../helpers/cli.js'
import { MockerFleet, type MockerWorker } from '../../src/sim/mocker/fleet.js'
import { encodeEnvelope, encodeRouterEvent } from '../../src/codec/events.js'
import { cardsPrefix, instancesPrefix, kvEventSubjects } from '../../src/transport/dynamo-names.js'

const BS = 16

t.test('serve with NATS and etcd: discovery, routing by prefix, lease expiry, NATS loss', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())

  // the router, as its own process
  const p = spawn(
    process.execPath,
    cliArgv([
      'serve',
      '--http-host',
      '127.0.0.1',
      '--http-port',
      '0',
      '--router-block-size',
      String(BS),
      '--tokenizer',
      'bytes',
      '--router-event-threads',
      '1',
      '--nats-url',
      nats.url,
      '--etcd-url',
      etcd.url,
    ]),
    { env: { PATH: process.env.PATH } },
  )
  let out = ''
  let err = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  p.stderr.on('data', (d: Buffer) => (err += d.toString()))
  const exited = new Promise<number | null>((r) => p.on('close', r))
  t.teardown(async () => {
    p.kill('SIGTERM')
    await exited
  })
  await waitUntil(`router listening (${err})`, () => /listening on http:\/\/\S+/.test(out), 20_000)
  const base = (/listening on (http:\/\/\S+)/.exec(out) as RegExpExecArray)[1] as string
  const get = async (path: string): Promise<{ status: number; body: Record<string, unknown> }> => {
    const r = await fetch(base + path)
    return { status: r.status, body: (await r.json()) as Record<string, unknown> }
  }

  // two engines: events on NATS (one raw, one in the envelope), registration in etcd
  const pub = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 })
  t.teardown(() => pub.close())
  const [subject] = kvEventSubjects('dynamo', 'backend') as [string]
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const enc = new TextEncoder()
  const engines: MockerWorker[] = []
  const leases: { revoke: () => Promise<void> }[] = []
  // engine 0: the mocker's distributed mode (its own lease, raw events on NATS, kv_metrics)
  const own = await MockerFleet.start({ blockSize: BS, speedupRatio: 20, numGpuBlocks: 4096, natsUrl: nats.url, etcdUrl: etcd.url })
  t.teardown(() => own.close())
  const w0 = own.workers[0] as MockerWorker
  engines.push(w0)
  leases.push({ revoke: async () => w0.lease?.revoke() })
  // engine 1: enveloped events, registered by hand under a lease of the test's
  {
    const lease = client.lease(30)
    const id = BigInt(await lease.grant())
    // a lease left to its keep-alives after the client closes keeps the test process alive
    t.teardown(() => lease.revoke().catch(() => undefined))
    let seq = 0n
    const f = await MockerFleet.start({
      firstWorkerId: id,
      blockSize: BS,
      speedupRatio: 20,
      onEvent: (ev) => {
        pub.publish(subject, enc.encode(encodeEnvelope({ publisher_id: id, sequence: seq++, published_at: BigInt(Date.now()), payload: ev })))
      },
    })
    t.teardown(() => f.close())
    const e = f.workers[0] as MockerWorker
    await lease.put(`${instancesPrefix('dynamo', 'backend', 'generate')}${id.toString(16)}`).value(JSON.stringify({ http_url: e.url, device_type: 'cuda' }))
    await lease
      .put(`${cardsPrefix('dynamo', 'backend', 'generate')}${id.toString(16)}`)
      .value(JSON.stringify({ kv_cache_block_size: BS, runtime_config: { total_kv_blocks: 4096, max_num_batched_tokens: 8192 } }))
    engines.push(e)
    leases.push({ revoke: () => lease.revoke() })
  }
  await waitUntil('both workers discovered', async () => ((await get('/v1/workers')).body['workers'] as unknown[] | undefined)?.length === 2, 10_000)
  const listed = (await get('/v1/workers')).body['workers'] as { id: string | number; source: string; url: string }[]
  t.same(
    listed.map((w) => w.source),
    ['etcd', 'etcd'],
  )
  t.same((await get('/ready')).body['nats'], true)
  t.same((await get('/ready')).body['etcd'], true)

  // events from any publisher, raw and enveloped, with u64 values above 2^53, reach /v1/overlap
  const [, oldSubject] = kvEventSubjects('dynamo', 'backend') as [string, string]
  const wRaw = 2n ** 63n + 77n
  const wEnv = 2n ** 62n + 5n
  const h1 = 2n ** 64n - 3n
  const h2 = 2n ** 53n + 1n
  pub.publish(
    subject,
    enc.encode(
      encodeRouterEvent({
        worker_id: wRaw,
        event: {
          event_id: 1n,
          dp_rank: 0,
          data: {
            stored: {
              parent_hash: null,
              blocks: [
                { block_hash: 11n, tokens_hash: h1 },
                { block_hash: 12n, tokens_hash: h2 },
              ],
            },
          },
        },
      }),
    ),
  )
  pub.publish(
    oldSubject,
    enc.encode(
      encodeEnvelope({
        publisher_id: wEnv,
        sequence: 0n,
        published_at: 0n,
        payload: {
          worker_id: wEnv,
          event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 21n, tokens_hash: h1 }] } } },
        },
      }),
    ),
  )
  await pub.flush()
  const overlapOf = async (body: string): Promise<string> =>
    await (await fetch(base + '/v1/overlap', { method: 'POST', headers: { 'content-type': 'application/json' }, body })).text()
  await waitUntil(
    'both events in /v1/overlap',
    async () => {
      const text = await overlapOf(`{"block_hashes":["${h1}","${h2}"]}`)
      return (
        text.includes(`"worker_id":${wRaw},"worker_id_str":"${wRaw}","dp_rank":0,"overlap_blocks":2`) &&
        text.includes(`"worker_id":${wEnv},"worker_id_str":"${wEnv}","dp_rank":0,"overlap_blocks":1`)
      )
    },
    5000,
  )

  // the same prompt twice: the second lands where the first left its blocks
  const prompt = 'The quick brown fox jumps over the lazy dog while the router keeps score of every cached block it has seen.'
  const ask = async (): Promise<{ worker: string; cached: number }> => {
    const r = await fetch(base + '/v1/completions', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt, max_tokens: 4 }),
    })
    t.equal(r.status, 200)
    // worker ids are etcd lease ids, above 2^53: read them from the text, not through a double
    const text = await r.text()
    const id = /"decode_worker_id":"?(\d+)/.exec(text)
    const cached = /"cached_tokens":(\d+)/.exec(text)
    return { worker: id?.[1] ?? '', cached: Number(cached?.[1] ?? -1) }
  }
  const first = await ask()
  await waitUntil(
    "the first request's blocks indexed",
    async () => {
      const text = await (await fetch(base + '/v1/workers')).text()
      const at = text.indexOf(`"id":${first.worker}`) >= 0 ? text.indexOf(`"id":${first.worker}`) : text.indexOf(`"id":"${first.worker}"`)
      return at >= 0 && /"cached_blocks":[1-9]/.test(text.slice(at, text.indexOf('"ranks"', at) + 200))
    },
    5000,
  )
  t.match(await (await fetch(base + '/v1/workers')).text(), /"last_event_id":[1-9]/, 'the last event id of a worker is shown')
  const second = await ask()
  t.equal(second.worker, first.worker, 'routed to the worker that holds the prefix')
  t.ok(second.cached > 0, `and it hit the cache (${second.cached} tokens)`)

  // that worker's lease ends: it leaves routing and the index within 2 s of etcd confirming the
  // revoke (the lease has ended then; etcd's own commit, an fsync on a loaded machine, is not
  // the router's time)
  const idx = engines.findIndex((e) => String(e.workerId) === first.worker)
  const tRevoke = Date.now()
  await leases[idx]?.revoke()
  const t0 = Date.now()
  t.comment(`etcd took ${t0 - tRevoke} ms to confirm the revoke`)
  const promptTokens = `{"token_ids":[${[...Buffer.from(prompt, 'utf8')].join(',')}]}`
  await waitUntil('the worker is gone from routing', async () => ((await get('/v1/workers')).body['workers'] as unknown[]).length === 1, 2000).catch(
    async (err: Error) => {
      // what discovery saw: a missing delete and a lost watch stream look alike from outside
      const m = (await (await fetch(base + '/metrics')).text())
        .split('\n')
        .filter((l) => l.startsWith('kvrouter_etcd_total') || l.startsWith('kvrouter_connection_up'))
      throw new Error(`${err.message}; ${m.join('; ')}`)
    },
  )
  await waitUntil(
    'and from the index',
    async () => !(await overlapOf(promptTokens)).includes(`"worker_id":${first.worker},`),
    Math.max(1, 2000 - (Date.now() - t0)),
  )
  t.ok(Date.now() - t0 <= 2000, 'gone from routing and the index within 2 s')
  const third = await ask()
  t.not(third.worker, first.worker, 'requests go to the remaining worker')

  const metrics = await (await fetch(base + '/metrics')).text()
  t.match(metrics, /kvrouter_nats_total\{what="messages"\} [1-9]/, 'intake counted in /metrics')
  t.match(metrics, /kvrouter_connected\{service="etcd"\} 1/)
  t.match(metrics, /kvrouter_etcd_total\{what="deletes"\} [1-9]/)

  // NATS goes away: still ready (it routes), but degraded; it comes back: not degraded, without a restart
  t.equal((await get('/ready')).body['degraded'], false)
  await nats.kill()
  await waitUntil('degraded without NATS', async () => (await get('/ready')).body['degraded'] === true, 10_000)
  const during = await get('/ready')
  t.equal(during.status, 200, 'a balancer keeps routing through it')
  t.equal(during.body['nats'], false)
  t.equal((await get('/ready?strict')).status, 503, "?strict: the connections count, as in Dynamo's readiness")
  t.not((await ask()).worker, '', 'and it routes')
  await nats.start()
  await waitUntil('whole again', async () => (await get('/ready')).body['degraded'] === false, 15_000)
  t.equal((await get('/ready')).body['nats'], true)
  t.equal((await get('/ready?strict')).status, 200)
})

t.test('an unreachable etcd at start is one clear line and exit status 2', async (t) => {
  const p = spawn(process.execPath, cliArgv(['serve', '--http-port', '0', '--etcd-url', 'http://127.0.0.1:1']), { env: { PATH: process.env.PATH } })
  let err = ''
  p.stderr.on('data', (d: Buffer) => (err += d.toString()))
  const code = await new Promise<number | null>((r) => p.on('close', r))
  t.equal(code, 2)
  t.match(err, /cannot reach etcd at http:\/\/127\.0\.0\.1:1/)
})
