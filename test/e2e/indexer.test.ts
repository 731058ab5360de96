// `kv-router indexer` as a process, fed by `kv-router mocker` engines publishing vLLM-style KV
// events over ZMQ (PUB + replay ROUTER, port + engine index). Registrations per dp rank and per
// routing group, /query and /query_by_hash answers in Dynamo's shape, /workers, /dump, peers,
// bad input, a second indexer recovering from the first (--peers), an engine restart, unregister.
//
// Golden shapes, transcribed from Dynamo's source:
// - lib/kv-router/src/standalone_indexer/server.rs@bc2583516003b89fc9f7d1d459b1b334f460b180:
//   POST /register → 201 {"status":"ok"}, 409 {"error":…} on a conflict; POST /unregister → 200
//   {"status":"ok"}, 404 {"error":…}; POST /query and /query_by_hash for an unknown model → 404
//   {"error":"no indexer for model=… …"}; scores {worker_id: {dp_rank: tokens}} (blocks ×
//   block_size); POST /deregister_peer of an unknown peer → 404 {"error":"peer not found"}; GET
//   /dump → {"model:group": {"block_size", "events"}}; GET /workers entries {instance_id,
//   endpoints: {rank: url}}; i64 block hashes taken as their u64 bits (`*h as u64`).
// - lib/kv-router/src/services/overlap.rs@5ea3d18eaab82a2b7d2e8ffae5814aaa05ee67df
//   (MooncakeOverlapSummary): instances {worker_id: {longest_matched, gpu, dp: {rank: tokens}, cpu,
//   disk}}, all in tokens, cpu and disk cumulative through the tiers before them.
import { request } from 'node:http'
import t from 'tap'
import type { Test } from 'tap'
import { computeBlockHashes } from '../../src/codec/hashing.js'
import { runCli } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'
import { waitUntil } from '../helpers/wait.js'

const BS = 16
const BIG_ID = '18446744073709551557'

async function ready(p: CliProcess, re: RegExp, what: string): Promise<RegExpExecArray> {
  let code: number | null | undefined
  void p.exited.then((c) => (code = c))
  await waitUntil(`${what} (${p.err()})`, () => re.test(p.out()) || code !== undefined, 20_000)
  const m = re.exec(p.out())
  if (m === null) throw new Error(`${what}: exited ${String(code)}: ${p.err()}`)
  return m
}

function stopAtEnd(t: Test, p: CliProcess): void {
  t.teardown(async () => {
    p.p.kill('SIGTERM')
    await p.exited
  })
}

/** Two mocker engines: PUB on base, base + 1; replay on base + 2, base + 3. */
async function mocker(t: Test, base: number | null): Promise<{ base: number; urls: string[]; p: CliProcess }> {
  for (let attempt = 0; ; attempt++) {
    const b = base ?? 20000 + Math.floor(Math.random() * 10000) * 4
    const p = runCli([
      'mocker',
      '--num-workers',
      '2',
      '--block-size',
      String(BS),
      '--speedup-ratio',
      '0',
      '--host',
      '127.0.0.1',
      '--http-port',
      '0',
      '--kv-events-zmq',
      `tcp://127.0.0.1:${b}`,
      '--kv-events-replay-zmq',
      `tcp://127.0.0.1:${b + 2}`,
    ])
    stopAtEnd(t, p)
    try {
      const m = await ready(p, /^kv-router mocker: ready 2 engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/, 'mocker ready')
      return { base: b, urls: [m[1] as string, m[2] as string], p }
    } catch (err) {
      // a port someone else holds (or the last engines' sockets, not yet released)
      if (attempt > 10 || !/cannot bind/.test(p.err())) throw err
      await new Promise((r) => setTimeout(r, 200))
    }
  }
}

async function indexer(t: Test, extra: string[] = []): Promise<string> {
  const p = runCli(['indexer', '--port', '0', '--host', '127.0.0.1', '--threads', '2', '--log-level', 'warn', ...extra])
  stopAtEnd(t, p)
  return (await ready(p, /^kv-router indexer: ready (http:\/\/\S+)\n/, 'indexer ready'))[1] as string
}

interface Answer {
  status: number
  text: string
  json: unknown
}

async function call(url: string, method: 'GET' | 'POST', body?: string | object): Promise<Answer> {
  const r = await fetch(url, {
    method,
    ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) }),
  })
  const text = await r.text()
  let json: unknown = null
  try {
    json = JSON.parse(text)
  } catch {
    // not JSON: /health's empty body, /metrics
  }
  return { status: r.status, text, json }
}

/**
 * A POST of a body the server refuses by its length alone: the headers go first, and the body
 * only if no answer came (fetch would write it all and report the reset instead of the answer).
 */
function postByLength(url: string, body: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
      let text = ''
      res.on('data', (d: Buffer) => (text += d.toString()))
      res.on('end', () => {
        resolve({ status: res.statusCode ?? 0, text })
        req.destroy()
      })
    })
    req.on('error', reject)
    req.flushHeaders()
    const timer = setTimeout(() => req.end(body), 2000)
    req.on('response', () => clearTimeout(timer))
  })
}

async function complete(url: string, tokens: number[]): Promise<void> {
  const r = await call(`${url}/v1/completions`, 'POST', { prompt: tokens, max_tokens: 2 })
  if (r.status !== 200) throw new Error(`${url}: ${r.status} ${r.text}`)
}

const seq = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i)

t.test('kv-router indexer with mocker engines over ZMQ', async (t) => {
  const eng = await mocker(t, null)
  const a = await indexer(t)
  const ep = (i: number): string => `tcp://127.0.0.1:${eng.base + i}`
  const rep = (i: number): string => `tcp://127.0.0.1:${eng.base + 2 + i}`

  // instance 7: engine 0 is its rank 0, engine 1 its rank 1; engine 1 is also instance 9 of
  // group "other"; engine 0 is the big-id instance of group "big", followed without a replay socket
  const regs = [
    { instance_id: 7, endpoint: ep(0), replay_endpoint: rep(0), model_name: 'm', block_size: BS, dp_rank: 0 },
    { instance_id: 7, endpoint: ep(1), replay_endpoint: rep(1), model_name: 'm', routing_group: 'default', block_size: BS, dp_rank: 1 },
    // the Mooncake RFC's names: modelname, additionalsalt, type
    { instance_id: 9, endpoint: ep(1), replay_endpoint: rep(1), modelname: 'm', routing_group: 'other', block_size: BS, type: 'vLLM', additionalsalt: 's' },
  ]
  for (const r of regs) {
    const res = await call(`${a}/register`, 'POST', r)
    t.equal(res.status, 201, `register ${r.instance_id} ${r.routing_group ?? 'default'}`)
    t.same(res.json, { status: 'ok' })
  }
  const big = await call(`${a}/register`, 'POST', `{"instance_id":${BIG_ID},"endpoint":"${ep(0)}","model_name":"m","routing_group":"big","block_size":${BS}}`)
  t.equal(big.status, 201, 'a u64 instance id above 2^53 registers')

  await t.test('registration conflicts and bad endpoints', async (t) => {
    const dup = await call(`${a}/register`, 'POST', regs[0] as object)
    t.equal(dup.status, 409, 'the same instance and rank again: 409')
    t.match(dup.json, { error: /already registered/, code: 'KVR_ERR_INDEXER_CONFLICT' })
    const size = await call(`${a}/register`, 'POST', { instance_id: 8, endpoint: ep(0), model_name: 'm', block_size: 32 })
    t.equal(size.status, 409, "another block size for the group's: 409")
    t.match(size.json, { error: /block_size mismatch/, code: 'KVR_ERR_INDEXER_CONFLICT' })
    const bad = await call(`${a}/register`, 'POST', { instance_id: 8, endpoint: 'udp://127.0.0.1:1', model_name: 'm', block_size: BS })
    t.equal(bad.status, 400, 'an endpoint that is not tcp://HOST:PORT: 400')
    t.match(bad.json, { code: 'KVR_ERR_INVALID_ENDPOINT' })
    const badReplay = await call(`${a}/register`, 'POST', { instance_id: 8, endpoint: ep(0), replay_endpoint: 'tcp://nope', model_name: 'm', block_size: BS })
    t.equal(badReplay.status, 400, 'a bad replay endpoint: 400')
  })

  // the group without a replay socket sees only what is published once its socket is subscribed
  // (ZMQ's slow joiner): fresh prompts go to engine 0 until one is seen there
  let pb: number[] = []
  let k = 0
  await waitUntil(
    'group "big" follows engine 0',
    async () => {
      pb = seq(5000 + 100 * k++, 32)
      await complete(eng.urls[0] as string, pb)
      await new Promise((r) => setTimeout(r, 50))
      const r = await call(`${a}/query`, 'POST', { token_ids: pb, model_name: 'm', routing_group: 'big' })
      return r.text.includes(`"${BIG_ID}":{"0":32}`)
    },
    15_000,
    100,
  )

  // engine 0 caches two blocks; engine 1 the first of them and another
  const p0 = seq(1, 40)
  const p1 = [...seq(1, 16), ...seq(500, 20)]
  await complete(eng.urls[0] as string, p0)
  await complete(eng.urls[1] as string, p1)

  const q = { token_ids: p0, model_name: 'm' }
  await waitUntil('both ranks of instance 7 indexed', async () => {
    const r = await call(`${a}/query`, 'POST', q)
    const s = (r.json as { scores: Record<string, Record<string, number>> }).scores
    return s['7']?.['0'] === 32 && s['7']?.['1'] === 16
  })

  await t.test('/query: scores per dp rank, frequencies, instances per tier', async (t) => {
    const r = await call(`${a}/query`, 'POST', q)
    t.equal(r.status, 200)
    t.same(r.json, {
      scores: { '7': { '0': 32, '1': 16 } },
      frequencies: [2, 1],
      // no lower tiers in this index: cpu and disk are the device match
      instances: { '7': { longest_matched: 32, gpu: 32, dp: { '0': 32, '1': 16 }, cpu: 32, disk: 32 } },
    })
    const other = await call(`${a}/query`, 'POST', { token_ids: p0, model_name: 'm', routing_group: 'other' })
    t.same(
      other.json,
      { scores: { '9': { '0': 16 } }, frequencies: [1], instances: { '9': { longest_matched: 16, gpu: 16, dp: { '0': 16 }, cpu: 16, disk: 16 } } },
      'group "other" sees only its worker',
    )
    const bigQ = await call(`${a}/query`, 'POST', { token_ids: pb, model_name: 'm', routing_group: 'big' })
    t.match(bigQ.text, `"scores":{"${BIG_ID}":{"0":32}}`, 'a u64 worker id comes back exact')
    const salted = await call(`${a}/query`, 'POST', { token_ids: p0, model_name: 'm', cache_salt: 'tenant-a' })
    t.same(salted.json, { scores: {}, frequencies: [], instances: {} }, 'a cache salt hashes into another namespace')
    const lora = await call(`${a}/query`, 'POST', { token_ids: p0, model_name: 'm', lora_name: 'adapter' })
    t.same((lora.json as { scores: object }).scores, {}, 'a LoRA name hashes into another namespace')
    const legacy = await call(`${a}/query`, 'POST', { token_ids: p0, model_name: 'm', tenant_id: 'ignored' })
    t.same(legacy.json, r.json, 'the legacy tenant_id is accepted and ignored')
  })

  await t.test('/query_by_hash: local block hashes, u64 or i64', async (t) => {
    const hashes = [...computeBlockHashes(p0, BS)]
    const asU64 = `{"block_hashes":[${hashes.join(',')}],"model_name":"m"}`
    const asI64 = `{"block_hashes":[${hashes.map((h) => BigInt.asIntN(64, h)).join(',')}],"model_name":"m","routing_group":"default"}`
    const byText = await call(`${a}/query`, 'POST', q)
    for (const body of [asU64, asI64]) {
      const r = await call(`${a}/query_by_hash`, 'POST', body)
      t.equal(r.status, 200)
      t.same(r.json, byText.json, 'the same answer as /query on the tokens')
    }
    const salt = await call(`${a}/query_by_hash`, 'POST', { block_hashes: [1], model_name: 'm', cache_salt: 'x' })
    t.equal(salt.status, 400, 'cache_salt is refused')
    t.match(salt.json, { error: /cache_salt is not accepted/, code: 'KVR_ERR_INVALID_REQUEST' })
  })

  await t.test('/workers and /dump', async (t) => {
    const w = await call(`${a}/workers?model_name=m&routing_group=default`, 'GET')
    t.same(w.json, [
      {
        instance_id: 7,
        model_name: 'm',
        routing_group: 'default',
        block_size: BS,
        endpoints: { '0': ep(0), '1': ep(1) },
        replay_endpoints: { '0': rep(0), '1': rep(1) },
      },
    ])
    const all = await call(`${a}/workers`, 'GET')
    t.equal((all.json as unknown[]).length, 3, 'instance 7, instance 9 and the big one')
    t.match(all.text, `"instance_id":${BIG_ID}`, 'the big id exact')
    t.same((await call(`${a}/workers?model_name=none`, 'GET')).json, [], 'an unknown model: an empty list')
    const d = await call(`${a}/dump`, 'GET')
    t.equal(d.status, 200)
    const dump = d.json as Record<string, { block_size: number; events: { worker_id: number; event: { dp_rank: number; data: { stored?: unknown } } }[] }>
    t.same(Object.keys(dump).sort(), ['m:big', 'm:default', 'm:other'])
    t.equal(dump['m:default']?.block_size, BS)
    const stored = (dump['m:default']?.events ?? []).filter((e) => e.event.data.stored !== undefined)
    t.same([...new Set(stored.map((e) => `${e.worker_id}:${e.event.dp_rank}`))].sort(), ['7:0', '7:1'], 'events of instance 7, by rank')
    t.match(d.text, `"worker_id":${BIG_ID}`, 'the big id exact in the dump')
  })

  await t.test('bad input: 400/404/413 with a code, counted', async (t) => {
    const cases: [string, string | object, number, string][] = [
      // the router's /v1/route code for a token id outside [0, 2^32)
      ['/query', { token_ids: [1, 'a'], model_name: 'm' }, 400, 'KVR_ERR_TOKEN_OUT_OF_RANGE'],
      ['/query', { token_ids: [-1], model_name: 'm' }, 400, 'KVR_ERR_TOKEN_OUT_OF_RANGE'],
      ['/query', { token_ids: [2 ** 32], model_name: 'm' }, 400, 'KVR_ERR_TOKEN_OUT_OF_RANGE'],
      ['/query', { token_ids: [1] }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', { model_name: 'm' }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', { token_ids: [1], model_name: 5 }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', { token_ids: [1], model_name: 'm', routing_group: '' }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', { token_ids: [1], model_name: 'm', lora_name: 3 }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', { token_ids: [1], model_name: 'm', instance_id: 'abc' }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', { token_ids: [1], model_name: 'm', block_size: 1.5 }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', '{"token_ids":[1', 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query', { token_ids: [1], model_name: 'nope' }, 404, 'KVR_ERR_UNKNOWN_GROUP'],
      ['/query', { token_ids: [1], model_name: 'm', routing_group: 'nope' }, 404, 'KVR_ERR_UNKNOWN_GROUP'],
      ['/query_by_hash', { block_hashes: ['x'], model_name: 'm' }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/query_by_hash', `{"block_hashes":[18446744073709551616],"model_name":"m"}`, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/register', { instance_id: 'abc', endpoint: ep(0), model_name: 'm', block_size: BS }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/register', { instance_id: 1, endpoint: ep(0), model_name: 'm', block_size: 0 }, 400, 'KVR_ERR_INVALID_REQUEST'],
      ['/unregister', { instance_id: 1234, model_name: 'm' }, 404, 'KVR_ERR_UNKNOWN_WORKER'],
      ['/deregister_peer', { url: 'http://nowhere:1' }, 404, 'KVR_ERR_NOT_FOUND'],
    ]
    for (const [route, body, status, code] of cases) {
      const r = await call(`${a}${route}`, 'POST', body)
      t.equal(r.status, status, `${route} ${typeof body === 'string' ? body : JSON.stringify(body)}`)
      t.match(r.json, { error: String, code }, `${route}: ${code}`)
    }
    t.match((await call(`${a}/deregister_peer`, 'POST', { url: 'http://nowhere:1' })).json, { error: 'peer not found' }, "Dynamo's message")
    // 8 MiB and a byte: refused before it is parsed
    const huge = `{"token_ids":[${'0,'.repeat(4 * 1024 * 1024)}0],"model_name":"m"}`
    const r = await postByLength(`${a}/query`, huge)
    t.equal(r.status, 413, 'a body over 8 MiB: 413')
    t.match(JSON.parse(r.text), { code: 'KVR_ERR_BODY_TOO_LARGE' })
    t.equal((await call(`${a}/nowhere`, 'GET')).status, 404)
    const metrics = (await call(`${a}/metrics`, 'GET')).text
    t.match(metrics, /kvrouter_indexer_requests_rejected_total\{route="\/query",code="KVR_ERR_INVALID_REQUEST"\} 8\n/, 'refusals counted by route and code')
    t.match(metrics, /kvrouter_indexer_requests_rejected_total\{route="\/query",code="KVR_ERR_TOKEN_OUT_OF_RANGE"\} 3\n/)
    t.match(metrics, /kvrouter_indexer_requests_rejected_total\{route="\/query",code="KVR_ERR_BODY_TOO_LARGE"\} 1/)
    t.match(metrics, /kvrouter_indexer_workers 4/)
    t.match(metrics, /kvrouter_indexer_groups 3/)
    const health = await call(`${a}/health`, 'GET')
    t.equal(health.status, 200, '/health')
    t.same((await call(`${a}/reopen_logs`, 'POST')).json, { status: 'ok' })
  })

  await t.test('a second indexer recovers from the first (--peers)', async (t) => {
    const b = await indexer(t, ['--peers', a])
    t.same((await call(`${b}/peers`, 'GET')).json, [a], 'the peer it was started with')
    t.same((await call(`${b}/workers`, 'GET')).json, (await call(`${a}/workers`, 'GET')).json, 'the same registrations')
    for (const group of ['default', 'other']) {
      const body = { token_ids: p0, model_name: 'm', routing_group: group }
      t.same((await call(`${b}/query`, 'POST', body)).json, (await call(`${a}/query`, 'POST', body)).json, `the same answers in group ${group}`)
    }
    // group "big" follows engine 0 without a replay socket: what it held came in the snapshot alone
    const big = (await call(`${b}/query`, 'POST', { token_ids: pb, model_name: 'm', routing_group: 'big' })).text
    t.match(big, `"scores":{"${BIG_ID}":{"0":32}}`, "group big's blocks, from the peer's snapshot")
    // then it follows the streams itself: a new prompt reaches both
    const p2 = seq(900, 33)
    await complete(eng.urls[1] as string, p2)
    for (const x of [a, b]) {
      await waitUntil(`${x} sees the new prompt`, async () => {
        const r = await call(`${x}/query`, 'POST', { token_ids: p2, model_name: 'm' })
        return (r.json as { scores: Record<string, Record<string, number>> }).scores['7']?.['1'] === 32
      })
    }
    t.equal((await call(`${b}/register_peer`, 'POST', { url: 'http://127.0.0.1:1' })).status, 201)
    t.same((await call(`${b}/peers`, 'GET')).json, [a, 'http://127.0.0.1:1'])
    t.same((await call(`${b}/deregister_peer`, 'POST', { url: 'http://127.0.0.1:1' })).json, { status: 'ok' })
  })

  await t.test('an engine restart drops what it held', async (t) => {
    // a restart is seen when the new engine's batches come numbered at or below the last one read;
    // a new stream whose first batch seen is exactly the next number looks like a continuation (the
    // batches before it lost to the reconnect): engine 0 publishes well ahead of that first
    for (let i = 0; i < 30; i++) await complete(eng.urls[0] as string, seq(7000 + 20 * i, 16))
    eng.p.p.kill('SIGTERM')
    await eng.p.exited
    const again = await mocker(t, eng.base)
    // the new engine 0 numbers its batches from 0 again: its rank is cleared, then read on. Its
    // first batches may go out before the listener's socket is back (ZMQ's slow joiner), so new
    // prompts go until one is seen: a later batch shows the gap, and the replay brings the rest.
    let k = 0
    await waitUntil(
      'the restarted engine indexed',
      async () => {
        const p3 = seq(3000 + 100 * k++, 32)
        await complete(again.urls[0] as string, p3)
        await new Promise((r) => setTimeout(r, 50))
        const r = await call(`${a}/query`, 'POST', { token_ids: p3, model_name: 'm' })
        return (r.json as { scores: Record<string, Record<string, number>> }).scores['7']?.['0'] === 32
      },
      15_000,
      100,
    )
    const old = await call(`${a}/query`, 'POST', q)
    t.same((old.json as { scores: Record<string, Record<string, number>> }).scores['7']?.['0'], undefined, 'the old blocks of rank 0 are gone')
    t.match((await call(`${a}/metrics`, 'GET')).text, /kvrouter_zmq_total\{what="restarts"\} [1-9]/, 'the restart counted')
  })

  await t.test('unregister: a rank, then the instance everywhere', async (t) => {
    const one = await call(`${a}/unregister`, 'POST', { instance_id: 7, model_name: 'm', routing_group: 'default', dp_rank: 1 })
    t.same(one.json, { status: 'ok' })
    const w = (await call(`${a}/workers?routing_group=default`, 'GET')).json as { endpoints: object }[]
    t.same(w[0]?.endpoints, { '0': ep(0) }, 'rank 0 stays')
    t.same((await call(`${a}/unregister`, 'POST', { instance_id: 9, model_name: 'm' })).json, { status: 'ok' }, 'no group: every group of the model')
    t.equal((await call(`${a}/unregister`, 'POST', { instance_id: 9, model_name: 'm' })).status, 404, 'then it is not found')
    const r = await call(`${a}/query`, 'POST', { token_ids: p1, model_name: 'm', routing_group: 'other' })
    t.same(r.json, { scores: {}, frequencies: [], instances: {} }, "the group answers without the instance's blocks")
  })
})
