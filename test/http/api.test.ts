// The non-proxy API through inject(): /v1/route (query only and booked, with its lifecycle),
// /v1/overlap after real events, /v1/workers with exact u64 ids, busy thresholds, metrics.
import t from 'tap'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { fullGc } from '../../src/runtime/heap-settle.js'
import { harness, tokens } from './helpers.js'

const BIG = 18446744073709551557n // a u64 far above 2^53
const h = await harness(['--router-block-size', '4'])
t.teardown(() => h.close())
const json = { 'content-type': 'application/json' }

async function post(url: string, body: unknown) {
  const res = await h.app.fastify.inject({ method: 'POST', url, payload: typeof body === 'string' ? body : JSON.stringify(body), headers: json })
  return res
}

t.test('workers: register with u64 ids (string or integer), list exactly, delete', async (t) => {
  const a = await post('/v1/workers', { id: BIG.toString(), url: 'http://127.0.0.1:9/', capacity: 100, device_type: 'gpu' })
  t.equal(a.statusCode, 201)
  t.match(a.body, `"id":${BIG}`, 'the id is written as an exact integer')
  const b = await post('/v1/workers', `{"id":${BIG - 1n},"url":"http://127.0.0.1:10","dp_size":2}`)
  t.equal(b.statusCode, 201, 'a bare integer above 2^53 is read exactly')
  t.match(b.body, `"id":${BIG - 1n}`)
  const again = await post('/v1/workers', { id: (BIG - 1n).toString(), url: 'http://127.0.0.1:10', dp_size: 1 })
  t.equal(again.statusCode, 200, 're-registration updates')
  const list = await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })
  t.match(list.body, `"id":${BIG},"id_str":"${BIG}","url":"http://127.0.0.1:9"`)
  t.equal(h.router.scheduler.workers.slotsOf(BIG - 1n).length, 1, 'the dropped rank is gone')
  const del = await h.app.fastify.inject({ method: 'DELETE', url: `/v1/workers/${BIG - 1n}` })
  t.equal(del.statusCode, 200)
  t.equal(del.body, `{"removed":${BIG - 1n},"removed_str":"${BIG - 1n}"}`)
  t.equal(h.router.registry.all().length, 1)
})

t.test('route: query only, then events move the decision to the worker that holds the prefix', async (t) => {
  await post('/v1/workers', { id: 2, url: 'http://127.0.0.1:11' })
  const prompt = tokens(16, 100)
  const q = await post('/v1/route', { token_ids: prompt })
  t.equal(q.statusCode, 200)
  const body = q.json() as { worker_id: unknown; candidates: { worker_id: unknown; logit: number }[]; request_id?: string }
  t.equal(body.candidates.length, 2)
  t.equal(body.request_id, undefined, 'nothing booked without update_states')
  t.equal(h.router.scheduler.stats().bookedRequests, 0)
  // worker BIG stores the first 3 blocks of the prompt
  const local = computeBlockHashes(prompt, 4)
  const seq = computeSequenceHashes(local)
  const blocks = [0, 1, 2].map((i) => ({ block_hash: seq[i] as bigint, tokens_hash: local[i] as bigint }))
  const ev = encodeRouterEvent({ worker_id: BIG, event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } })
  const r = await post('/v1/kv-events', `[${ev}]`)
  t.equal(r.statusCode, 202)
  await h.router.pool.flush()
  const ov = await post('/v1/overlap', { token_ids: prompt })
  t.match(ov.body, `{"worker_id":${BIG},"worker_id_str":"${BIG}","dp_rank":0,"overlap_blocks":3,"tree_size":3}`)
  const byHash = await post('/v1/overlap', `{"block_hashes":[${[...local].join(',')}]}`)
  t.match(byHash.body, `"overlap_blocks":3`, 'block hashes as bare u64 integers')
  const byStr = await post('/v1/route', { block_hashes: [...local].map(String) })
  t.match(byStr.body, `"worker_id":${BIG}`)
  const d = await post('/v1/route', { token_ids: prompt })
  t.match(d.body, `{"worker_id":${BIG},"worker_id_str":"${BIG}","dp_rank":0,"overlap_blocks":3,`)
  // the latency cost explains itself in seconds after Dynamo's fields
  const row = (d.json() as { candidates: Record<string, number>[] }).candidates[0] ?? {}
  t.match(d.body, `"worker_id":${BIG},"worker_id_str":"${BIG}","dp_rank":0,"overlap_blocks":3,"prefill_blocks":1,"decode_blocks":4,"logit":`)
  t.equal(row.logit, (row.ttft_secs ?? NaN) + (row.decode_slowdown_secs ?? NaN) + (row.queueing_secs ?? NaN))
  t.ok((row.ttft_secs ?? 0) > 0)
})

t.test("route under --router-cost dynamo: Dynamo's fields only, and its per-request credit", async (t) => {
  const hd = await harness(['--router-block-size', '4', '--router-cost', 'dynamo'])
  t.teardown(() => hd.close())
  const inject = (body: unknown) => hd.app.fastify.inject({ method: 'POST', url: '/v1/route', payload: JSON.stringify(body), headers: json })
  await hd.app.fastify.inject({ method: 'POST', url: '/v1/workers', payload: JSON.stringify({ id: 1, url: 'http://127.0.0.1:11' }), headers: json })
  const prompt = tokens(16, 100)
  const local = computeBlockHashes(prompt, 4)
  const seq = computeSequenceHashes(local)
  const blocks = [0, 1, 2].map((i) => ({ block_hash: seq[i] as bigint, tokens_hash: local[i] as bigint }))
  hd.router.ingestEvent({ worker_id: 1n, event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } })
  await hd.router.pool.flush()
  const d = await inject({ token_ids: prompt })
  t.match(
    d.body,
    '"worker_id":1,"worker_id_str":"1","dp_rank":0,"overlap_blocks":3,"prefill_blocks":1,"decode_blocks":4,"logit":5,"tree_size":3,' +
      '"device_blocks":3,"host_blocks":3,"disk_blocks":3}',
  )
  t.notMatch(d.body, 'ttft_secs')
  // Era C credit per request: 3 cached blocks × 2 cover the 4-block prompt, the prefill term is 0
  const cr = await inject({ token_ids: prompt, router_config_override: { overlap_score_credit: 2 } })
  t.match(cr.body, '"worker_id":1,"worker_id_str":"1","dp_rank":0,"overlap_blocks":3,"prefill_blocks":0,')
})

t.test('route with update_states books until released', async (t) => {
  const r = await post('/v1/route', {
    token_ids: tokens(40, 7000),
    update_states: true,
    request_id: 'req-1',
    router_config_override: { overlap_score_weight: 2 },
  })
  t.equal(r.statusCode, 200)
  t.equal((r.json() as { request_id: string }).request_id, 'req-1')
  const s = h.router.scheduler.stats()
  t.equal(s.bookedRequests, 1)
  t.ok(
    s.slots.some((x) => x.prefillTokens === 40),
    'prefill tokens booked',
  )
  const dup = await post('/v1/route', { token_ids: tokens(8), update_states: true, request_id: 'req-1' })
  t.equal(dup.statusCode, 409)
  const pc = await post('/v1/route/req-1/prefill-complete', '')
  t.equal(pc.statusCode, 200)
  t.notOk(h.router.scheduler.stats().slots.some((x) => x.prefillTokens > 0))
  const del = await h.app.fastify.inject({ method: 'DELETE', url: '/v1/route/req-1' })
  t.equal(del.statusCode, 200)
  t.equal(h.router.scheduler.stats().bookedRequests, 0)
  const again = await h.app.fastify.inject({ method: 'DELETE', url: '/v1/route/req-1' })
  t.equal(again.statusCode, 404, 'released once')
  const auto = await post('/v1/route', { token_ids: tokens(8), update_states: true })
  const id = (auto.json() as { request_id: string }).request_id
  t.type(id, 'string')
  t.ok(h.router.scheduler.free(id))
})

t.test("busy thresholds: all busy gives Dynamo's 503 with Retry-After", async (t) => {
  const set = await post('/busy_threshold', { active_prefill_tokens_threshold: 0 })
  t.equal((set.json() as { thresholds: { active_prefill_tokens_threshold: number }[] }).thresholds[0]?.active_prefill_tokens_threshold, 0)
  const ids = []
  for (let i = 0; i < 2; i++) {
    const r = await post('/v1/route', { token_ids: tokens(8, 50_000 + i * 100), update_states: true })
    ids.push((r.json() as { request_id: string }).request_id)
  }
  const busy = await post('/v1/route', { token_ids: tokens(8, 999) })
  t.equal(busy.statusCode, 503)
  t.equal(busy.headers['retry-after'], '1')
  const body = busy.json() as { message: string; type: string; code: number; error: { code: string } }
  t.equal(body.message, 'Service temporarily unavailable: All workers are busy, please retry later')
  t.equal(body.type, 'service_unavailable')
  t.equal(body.code, 503)
  t.equal(body.error.code, 'KVR_ERR_ALL_WORKERS_BUSY')
  for (const id of ids) h.router.scheduler.free(id)
  await post('/busy_threshold', { active_prefill_tokens_threshold: null })
  const get = await h.app.fastify.inject({ method: 'GET', url: '/busy_threshold' })
  t.match(get.body, '"active_prefill_tokens_threshold":null')
})

t.test('busy thresholds: a field the route does not know is refused, nothing changed', async (t) => {
  const before = (await h.app.fastify.inject({ method: 'GET', url: '/busy_threshold' })).body
  const r = await post('/busy_threshold', { active_prefil_tokens_threshold: 5, active_decode_blocks_threshold: 0.5 })
  t.equal(r.statusCode, 400)
  t.match(r.json(), { error: { code: 'KVR_ERR_INVALID_REQUEST', message: /must NOT have additional properties \("active_prefil_tokens_threshold"\)/ } })
  t.equal((await h.app.fastify.inject({ method: 'GET', url: '/busy_threshold' })).body, before, 'the valid field beside it was not applied either')
})

t.test('metrics, models, health, ready', async (t) => {
  await h.router.pool.flush()
  const m = await h.app.fastify.inject({ method: 'GET', url: '/metrics' })
  t.equal(m.statusCode, 200)
  // worker 2 sent no events: the requests routed to it are predicted blocks beside BIG's 3
  const predicted = h.router.scheduler.stats().approximateBlocks
  for (const name of [
    'dynamo_component_router_requests_total',
    'dynamo_router_overhead_block_hashing_ms_bucket',
    'dynamo_router_overhead_indexer_find_matches_ms_count',
    'dynamo_router_overhead_scheduling_ms_sum',
    'dynamo_router_overhead_total_ms_count',
    'dynamo_component_router_kv_hit_rate_bucket',
    'dynamo_frontend_router_queue_pending_requests{worker_type="decode"} 0',
    `dynamo_frontend_worker_active_decode_blocks{worker_id="${BIG}",dp_rank="0",worker_type="decode"}`,
    'kvrouter_shard_events_applied_total{shard="0"} ',
    `kvrouter_shard_blocks{shard="0"} ${3 + predicted}`,
    'kvrouter_worker_ranks_no_events 1',
    'kvrouter_http_events_received_total 1',
    'nodejs_gc_duration_seconds_bucket{le="0.005",kind="minor"}',
    'nodejs_gc_duration_seconds_count{kind="major"}',
  ])
    t.match(m.body, name, name)
  t.match(m.body, /dynamo_component_router_requests_total\{[^}]*\} [1-9]/, 'decisions counted')
  const models = await h.app.fastify.inject({ method: 'GET', url: '/v1/models' })
  t.equal((models.json() as { data: { id: string }[] }).data[0]?.id, 'kv-router-model')
  t.equal((await h.app.fastify.inject({ method: 'GET', url: '/health' })).statusCode, 200)
  const ready = await h.app.fastify.inject({ method: 'GET', url: '/ready' })
  t.equal(ready.statusCode, 200)
  t.equal((ready.json() as { ready: boolean }).ready, true)
})

t.test("metrics: the main thread's GC pauses are counted by kind", async (t) => {
  const count = async (kind: string): Promise<number> => {
    const body = (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
    const m = body.match(new RegExp(`^nodejs_gc_duration_seconds_count\\{kind="${kind}"\\} (\\d+)$`, 'm'))
    return m === null ? -1 : Number(m[1])
  }
  const before = await count('major')
  t.ok(before >= 0, 'the series exists before any pause of its kind')
  fullGc()()
  // the observer hears of a GC after it, not during it
  for (let i = 0; i < 200 && (await count('major')) <= before; i++) await new Promise((r) => setTimeout(r, 10))
  t.ok((await count('major')) > before, 'a full GC is counted')
  t.match((await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body, /^nodejs_gc_duration_seconds_sum\{kind="major"\} [0-9.e-]+$/m)
})

t.test('metrics: event-loop delay since the last scrape, process CPU and memory', async (t) => {
  const scrape = async (): Promise<(name: string) => number> => {
    const body = (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
    return (name) => {
      const m = body.match(new RegExp(`^${name} (\\S+)$`, 'm'))
      return m === null ? Number.NaN : Number(m[1])
    }
  }
  // spins until the process has had `ms` of CPU (not wall time: on a busy machine a core is not
  // always there), or 3 s have passed
  const burn = (ms: number): void => {
    const c0 = process.cpuUsage()
    const end = performance.now() + 3000
    for (;;) {
      const c = process.cpuUsage(c0)
      if ((c.user + c.system) / 1000 >= ms || performance.now() > end) return
    }
  }
  const first = await scrape()
  await new Promise((r) => setTimeout(r, 30))
  burn(200)
  // the delay is recorded when the loop's next sample comes due, after the block
  await new Promise((r) => setTimeout(r, 40))
  const blocked = await scrape()
  t.ok(
    blocked('kvrouter_eventloop_delay_max_seconds') >= 0.15,
    `a 200 ms block shows as the interval's max (${blocked('kvrouter_eventloop_delay_max_seconds')} s)`,
  )
  for (const k of ['mean', 'p50', 'p90', 'p99']) {
    const v = blocked(`kvrouter_eventloop_delay_${k}_seconds`)
    t.ok(v >= 0 && v <= blocked('kvrouter_eventloop_delay_max_seconds'), `${k} within [0, max]: ${v}`)
  }
  t.ok(blocked('process_cpu_seconds_total') - first('process_cpu_seconds_total') >= 0.15, 'the CPU burnt is counted')
  t.ok(
    Math.abs(blocked('process_cpu_seconds_total') - blocked('process_cpu_user_seconds_total') - blocked('process_cpu_system_seconds_total')) < 0.05,
    'user + system = total',
  )
  // 20 samples or so: their median is the idle loop's, even on a busy machine
  await new Promise((r) => setTimeout(r, 200))
  const after = await scrape()
  t.ok(
    after('kvrouter_eventloop_delay_max_seconds') < blocked('kvrouter_eventloop_delay_max_seconds'),
    `a new interval began at the last scrape (max ${after('kvrouter_eventloop_delay_max_seconds')} s)`,
  )
  t.ok(
    after('kvrouter_eventloop_delay_p50_seconds') < 0.008,
    `the sampling period is not counted as delay (p50 ${after('kvrouter_eventloop_delay_p50_seconds')} s)`,
  )
  t.ok(after('process_resident_memory_bytes') > 10 * 1024 * 1024, 'resident memory')
  t.ok(
    after('nodejs_heap_size_used_bytes') > 0 && after('nodejs_heap_size_used_bytes') <= after('nodejs_heap_size_total_bytes'),
    'heap used within heap reserved',
  )
  t.ok(after('nodejs_external_memory_bytes') >= 0)
  const start = after('process_start_time_seconds')
  t.ok(Math.abs(start - (Date.now() / 1000 - process.uptime())) <= 1, 'start time')
})

t.test('metrics: the model label takes at most 256 values from request bodies, then "(other)"', async (t) => {
  const hm = await harness(['--router-block-size', '4'])
  t.teardown(() => hm.close())
  for (let i = 0; i < 300; i++) {
    const r = await hm.app.fastify.inject({
      method: 'POST',
      url: '/v1/completions',
      headers: { 'content-type': 'application/json' },
      payload: JSON.stringify({ model: `m${i}`, prompt: tokens(8) }),
    })
    t.equal(r.statusCode >= 400, true, 'no worker: an error, still counted')
  }
  const body = (await hm.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  const models = new Set<string>()
  let total = 0
  for (const line of body.split('\n')) {
    if (!line.startsWith('dynamo_frontend_requests_total{')) continue
    models.add(/model="([^"]*)"/.exec(line)?.[1] ?? '')
    total += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  t.equal(models.size, 257, '256 models and "(other)"')
  t.ok(models.has('m0') && models.has('m255') && !models.has('m256'), 'the first 256 kept their names')
  t.ok(models.has('(other)'))
  t.equal(total, 300, 'every request counted')
  t.match(body, /^dynamo_frontend_inflight_requests\{model="m0"\} 0$/m, 'nothing left in flight')
})

t.test('approximate mode (--no-router-kv-events): decisions become the index', async (t) => {
  const a = await harness(['--router-block-size', '4', '--no-router-kv-events'])
  t.teardown(() => a.close())
  await a.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9' })
  await a.router.addWorker({ id: BIG, url: 'http://127.0.0.1:9' })
  const prompt = tokens(20, 300)
  const first = await a.app.fastify.inject({
    method: 'POST',
    url: '/v1/route',
    headers: json,
    payload: JSON.stringify({ token_ids: prompt, update_states: true, request_id: 'p1' }),
  })
  const chosen = /^\{"worker_id":(\d+)/.exec(first.body)?.[1] as string
  t.ok(a.router.scheduler.free('p1'))
  await a.router.pool.flush()
  const again = await a.app.fastify.inject({ method: 'POST', url: '/v1/route', headers: json, payload: JSON.stringify({ token_ids: prompt }) })
  t.match(
    again.body,
    new RegExp(`^\\{"worker_id":${chosen},"worker_id_str":"${chosen}","dp_rank":0,"overlap_blocks":5,`),
    'the predicted prefix is found where it was routed',
  )
})

t.test('kv dump: the index as Stored events, whole or for one worker, u64 exact', async (t) => {
  const prompt = tokens(12, 300)
  const local = computeBlockHashes(prompt, 4)
  const seq = computeSequenceHashes(local)
  const blocks = [0, 1, 2].map((i) => ({ block_hash: seq[i] as bigint, tokens_hash: local[i] as bigint }))
  const other = 77n
  await post('/v1/workers', { id: String(other), url: 'http://127.0.0.1:12' })
  const evs = [BIG, other].map((w) =>
    encodeRouterEvent({
      worker_id: w,
      event: { event_id: 9n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: w === BIG ? blocks : blocks.slice(0, 1) } } },
    }),
  )
  t.equal((await post('/v1/kv-events', `[${evs.join(',')}]`)).statusCode, 202)
  await h.router.pool.flush()
  const all = await h.app.fastify.inject({ method: 'GET', url: '/v1/kv/dump' })
  t.equal(all.statusCode, 200)
  for (const b of blocks) t.match(all.body, `"block_hash":${b.block_hash}`, 'hashes above 2^53 are exact')
  const mine = await h.app.fastify.inject({ method: 'GET', url: `/v1/kv/dump?worker_id=${other}` })
  const parsed = JSON.parse(mine.body) as { events: { worker_id: number }[] }
  t.ok(parsed.events.length >= 1)
  t.ok(
    parsed.events.every((e) => e.worker_id === Number(other)),
    'only the asked worker',
  )
  t.notMatch(mine.body, `"block_hash":${seq[2]}`, "the other worker's deeper blocks are not in it")
  const bad = await h.app.fastify.inject({ method: 'GET', url: '/v1/kv/dump?worker_id=-3' })
  t.equal(bad.statusCode, 400)
  t.match(bad.body, 'KVR_ERR_')
  await h.app.fastify.inject({ method: 'DELETE', url: `/v1/workers/${other}` })
})

t.test('membership changes of one worker apply in order: a removal during a pending add or update wins', async (t) => {
  const id = 4242n
  const slots = (): number => h.router.scheduler.stats().slots.filter((s) => s.workerId === id).length
  // add and remove asked back to back, as etcd reports a lease's keys put and then deleted
  const adding = h.router.addWorker({ id, url: 'http://127.0.0.1:9' })
  const removing = h.router.removeWorker(id)
  await adding
  t.equal(await removing, true, 'the removal applied after the add')
  t.equal(h.router.registry.get(id), undefined, 'not in the worker table')
  t.equal(slots(), 0, 'no scheduler slot')
  // an update (the card key deleted first) and then the removal (the instance key)
  await h.router.addWorker({ id, url: 'http://127.0.0.1:9', capacity: 100 })
  const updating = h.router.addWorker({ id, url: 'http://127.0.0.1:9' })
  const removing2 = h.router.removeWorker(id)
  await updating
  t.equal(await removing2, true)
  t.equal(h.router.registry.get(id), undefined, 'an update still under way does not bring it back')
  t.equal(slots(), 0)
  // and the other way round: removed, then added again, ends registered
  const r3 = h.router.removeWorker(id)
  const a3 = h.router.addWorker({ id, url: 'http://127.0.0.1:9' })
  t.equal(await r3, false, 'nothing to remove')
  await a3
  t.ok(h.router.registry.get(id) !== undefined, 'registered')
  t.equal(slots(), 1)
  t.ok(await h.router.removeWorker(id))
})

t.test('workers known only from KV events: listed, removable, and giving way to a registration when the table is full', async (t) => {
  const own = await harness(['--router-block-size', '4'])
  t.teardown(() => own.close())
  const send = (body: string) => own.app.fastify.inject({ method: 'POST', url: '/v1/kv-events', payload: body, headers: json })
  const stored = (w: bigint, rank = 0) =>
    encodeRouterEvent({
      worker_id: w,
      event: { event_id: 1n, dp_rank: rank, data: { stored: { parent_hash: null, blocks: [{ block_hash: 4242n + w, tokens_hash: 4242n + w }] } } },
    })
  await own.app.fastify.inject({ method: 'POST', url: '/v1/workers', payload: JSON.stringify({ id: 1, url: 'http://127.0.0.1:9' }), headers: json })
  t.equal((await send(`[${stored(424242n)},${stored(1n, 7)}]`)).statusCode, 202)
  await own.router.pool.flush()
  const list = (await own.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json() as {
    workers: unknown[]
    unregistered: { worker_id: number; dp_rank: number; cached_blocks: number }[]
  }
  t.equal(list.workers.length, 1)
  t.same(
    list.unregistered.map((u) => [u.worker_id, u.dp_rank, u.cached_blocks]).sort((a, b) => (a[0] as number) - (b[0] as number)),
    [
      [1, 7, 1],
      [424242, 0, 1],
    ],
    "an unregistered worker and a rank beyond a worker's dp_size",
  )
  const del = await own.app.fastify.inject({ method: 'DELETE', url: '/v1/workers/424242' })
  t.equal(del.statusCode, 200, 'an id known only from events can be dropped')
  const dump = await own.app.fastify.inject({ method: 'GET', url: '/v1/kv/dump?worker_id=424242' })
  t.equal(dump.body, '{"events":[]}', 'its blocks are gone from the index')
  t.equal((await own.app.fastify.inject({ method: 'DELETE', url: '/v1/workers/424242' })).statusCode, 404, 'and then it is unknown')
  t.equal((await own.app.fastify.inject({ method: 'DELETE', url: '/v1/workers/999' })).statusCode, 404)

  // fill the shard's worker-rank table with event-only workers, all of two blocks but one
  const max = own.router.pool.maxWorkerRanksPerShard
  const two = (w: bigint): string =>
    encodeRouterEvent({
      worker_id: w,
      event: {
        event_id: 1n,
        dp_rank: 0,
        data: {
          stored: {
            parent_hash: null,
            blocks: [
              { block_hash: 1n, tokens_hash: 1n },
              { block_hash: 2n, tokens_hash: 2n },
            ],
          },
        },
      },
    })
  const ghosts: string[] = []
  for (let i = 0; i < max - 2; i++) ghosts.push(i === 123 ? stored(5_000_000n + BigInt(i)) : two(5_000_000n + BigInt(i)))
  t.equal((await send(`[${ghosts.join(',')}]`)).statusCode, 202)
  await own.router.pool.flush()
  // a registration makes room by dropping the event-only worker that holds the fewest blocks
  // (otherwise made-up worker ids in events would keep every real worker out)
  const ok = await own.app.fastify.inject({
    method: 'POST',
    url: '/v1/workers',
    payload: JSON.stringify({ id: 31337, url: 'http://127.0.0.1:9' }),
    headers: json,
  })
  t.equal(ok.statusCode, 201, 'a full table takes a registered worker')
  t.equal(await own.router.pool.indexedRanks(5_000_123n), 0, 'the one-block ghost gave way')
  t.equal(await own.router.pool.indexedRanks(5_000_000n), 1, 'the others stay')
  t.equal(own.router.evictedUnregistered, 1)
  t.equal((await send(stored(31337n))).statusCode, 202)
  await own.router.pool.flush()
  const ov = await own.app.fastify.inject({ method: 'POST', url: '/v1/overlap', payload: `{"block_hashes":[${4242n + 31337n}]}`, headers: json })
  t.match(ov.body, '"worker_id":31337', 'its events are indexed')
})

t.test('a table full of registered worker-ranks refuses a registration, and leaves nothing of it behind', async (t) => {
  const own = await harness(['--router-block-size', '4'])
  t.teardown(() => own.close())
  const reg = (id: number, dp: number) =>
    own.app.fastify.inject({ method: 'POST', url: '/v1/workers', payload: JSON.stringify({ id, url: 'http://127.0.0.1:9', dp_size: dp }), headers: json })
  t.equal(own.router.pool.maxWorkerRanksPerShard, 2048)
  t.equal((await reg(1, 1024)).statusCode, 201)
  t.equal((await reg(2, 1023)).statusCode, 201)
  // one slot left: a worker of two ranks does not fit, and leaves no rank behind
  const twoRanks = await reg(777, 2)
  t.equal(twoRanks.statusCode, 503, 'a worker the index cannot hold is not answered 201')
  t.match(twoRanks.json(), { error: { code: 'KVR_ERR_TOO_MANY_WORKERS', message: /all of registered workers/ } })
  t.equal(await own.router.pool.indexedRanks(777n), 0, 'the rank that fitted was given back')
  t.equal(own.router.registry.get(777n), undefined, 'and not routed to')
  t.equal((await reg(778, 1)).statusCode, 201, 'the last slot takes a worker of one rank')
})

t.test("request ids: a client cannot book in the router's own id space", async (t) => {
  const auto = await post('/v1/route', { token_ids: tokens(8), update_states: true })
  const id = (auto.json() as { request_id: string }).request_id
  t.ok(id.startsWith(h.router.requestIds.prefix))
  const next = h.router.requestIds.prefix + 'zz'
  const taken = await post('/v1/route', { token_ids: tokens(8), update_states: true, request_id: next })
  t.equal(taken.statusCode, 400)
  t.match(taken.json(), { error: { code: 'KVR_ERR_INVALID_REQUEST', message: /router's own id space/ } })
  t.equal(h.router.scheduler.stats().bookedRequests, 1, 'nothing booked under it')
  const mine = await post('/v1/route', { token_ids: tokens(8), update_states: true, request_id: 'client-' + id })
  t.equal(mine.statusCode, 200, "an id of the client's own is booked")
  t.ok(h.router.scheduler.free(id))
  t.ok(h.router.scheduler.free('client-' + id))
  // the proxy's own bookings cannot be released or marked through the /v1/route routes
  const proxied = h.router.requestIds.create(true)
  t.ok(h.router.requestIds.isProxied(proxied))
  t.notOk(h.router.requestIds.isProxied(h.router.requestIds.create()))
  await h.router.route({ tokens: tokens(8), id: proxied, updateStates: true })
  for (const [method, url] of [
    ['DELETE', `/v1/route/${proxied}`],
    ['POST', `/v1/route/${proxied}/prefill-complete`],
  ] as const) {
    const r = await h.app.fastify.inject({ method, url, headers: json, payload: method === 'POST' ? '' : undefined })
    t.equal(r.statusCode, 404, `${method} ${url}`)
    t.match(r.json(), { error: { code: 'KVR_ERR_UNKNOWN_REQUEST', message: /the router is proxying/ } })
  }
  t.equal(h.router.scheduler.stats().bookedRequests, 1, 'the proxied booking is still held')
  t.ok(h.router.scheduler.free(proxied))
})

t.test('--encoder-cuda-to-cpu-ratio and --router-max-index-blocks reach the scheduler and the shards', async (t) => {
  const dev = await harness(['--router-block-size', '4', '--router-mode', 'device-aware-weighted', '--encoder-cuda-to-cpu-ratio', '1'])
  t.teardown(() => dev.close())
  await dev.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9', device: 'cpu' })
  await dev.router.addWorker({ id: 2n, url: 'http://127.0.0.1:10', device: 'gpu' })
  const picks: string[] = []
  for (let i = 0; i < 6; i++) {
    const r = await dev.app.fastify.inject({
      method: 'POST',
      url: '/v1/route',
      payload: JSON.stringify({ token_ids: tokens(8, i * 100), update_states: true }),
      headers: json,
    })
    picks.push(String((r.json() as { worker_id: number }).worker_id))
  }
  // at ratio 1 a GPU worker counts as one CPU worker, so the two take turns (at 8 the GPU took 5 of 6)
  t.same(picks.slice().sort(), ['1', '1', '1', '2', '2', '2'], picks.join(' '))

  const capped = await harness(['--router-block-size', '4', '--router-max-index-blocks', '3'])
  t.teardown(() => capped.close())
  const blocks = [1n, 2n, 3n, 4n, 5n].map((b) => ({ block_hash: b, tokens_hash: b }))
  const ev = encodeRouterEvent({ worker_id: 9n, event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } })
  t.equal((await capped.app.fastify.inject({ method: 'POST', url: '/v1/kv-events', payload: ev, headers: json })).statusCode, 202)
  await capped.router.pool.flush()
  const m = (await capped.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  t.match(m, /kvrouter_shard_events_rejected_total\{[^}]*reason="capacity"[^}]*\} [1-9]/, 'blocks past the cap are rejected as capacity')
  const dump = (await capped.app.fastify.inject({ method: 'GET', url: '/v1/kv/dump' })).json() as {
    events: { event: { data: { stored: { blocks: unknown[] } } } }[]
  }
  const held = dump.events.reduce((n, e) => n + e.event.data.stored.blocks.length, 0)
  t.ok(held <= 3, `the shard holds at most 3 blocks (held ${held})`)
})

t.test('kv_cache_events_applied counts by event type and status, as Dynamo names them', async (t) => {
  const own = await harness(['--router-block-size', '4'])
  t.teardown(() => own.close())
  const ev = (id: bigint, data: object | string) => JSON.stringify({ worker_id: 3, event: { event_id: Number(id), dp_rank: 0, data } })
  const batch = [
    ev(1n, { stored: { parent_hash: null, blocks: [{ block_hash: 11, tokens_hash: 22 }] } }),
    ev(2n, { stored: { parent_hash: 999, blocks: [{ block_hash: 12, tokens_hash: 23 }] } }),
    ev(3n, { removed: { block_hashes: [11] } }),
    ev(4n, { removed: { block_hashes: [77] } }),
    ev(5n, 'cleared'),
  ]
  t.equal((await own.app.fastify.inject({ method: 'POST', url: '/v1/kv-events', payload: `[${batch.join(',')}]`, headers: json })).statusCode, 202)
  await own.router.pool.flush()
  const m = (await own.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  const line = (type: string, status: string): number => {
    const hit = m.split('\n').find((l) => l.startsWith(`dynamo_component_kv_cache_events_applied{event_type="${type}",status="${status}"}`))
    return hit === undefined ? -1 : Number(hit.split(' ').pop())
  }
  t.equal(line('stored', 'ok'), 1)
  t.equal(line('stored', 'parent_block_not_found'), 1)
  t.equal(line('removed', 'ok'), 1)
  t.equal(line('removed', 'block_not_found'), 1)
  t.equal(line('cleared', 'ok'), 1)
  t.notMatch(m, 'event_type="all"', 'no lumped label any more')
})

t.test('a large event batch lets other requests through while it is decoded', async (t) => {
  const own = await harness(['--router-block-size', '4'])
  t.teardown(() => own.close())
  const evs: string[] = []
  for (let i = 0; i < 40_000; i++) evs.push(`{"worker_id":${i % 50},"event":{"event_id":${i + 1},"data":"cleared","dp_rank":0}}`)
  const body = `[${evs.join(',')}]`
  for (let round = 0; round < 3; round++) {
    const order: string[] = []
    const batch = own.app.fastify.inject({ method: 'POST', url: '/v1/kv-events', payload: body, headers: json }).then((r) => {
      order.push('batch')
      return r
    })
    // the batch is being decoded by now
    await new Promise((r) => setTimeout(r, 5))
    const health = own.app.fastify.inject({ method: 'GET', url: '/health' }).then(() => order.push('health'))
    const [r] = await Promise.all([batch, health])
    t.equal(r.statusCode, 202)
    t.same(order, ['health', 'batch'], `round ${round}: answered before the batch was`)
  }
})

t.test("workers: the engine's own KV-event endpoints are registered and checked", async (t) => {
  const ok = await post('/v1/workers', {
    id: 901,
    url: 'http://127.0.0.1:9',
    dp_size: 2,
    kv_events_endpoint: 'tcp://127.0.0.1:1',
    replay_endpoint: 'tcp://127.0.0.1:3',
    kv_events_topic: 'kv-events',
  })
  t.equal(ok.statusCode, 201)
  t.match(ok.json(), { kv_events_endpoint: 'tcp://127.0.0.1:1', replay_endpoint: 'tcp://127.0.0.1:3', kv_events_topic: 'kv-events' })
  t.same(h.router.registry.get(901n)?.kvEvents, { endpoint: 'tcp://127.0.0.1:1', replay: 'tcp://127.0.0.1:3', topic: 'kv-events' })
  const plain = await post('/v1/workers', { id: 902, url: 'http://127.0.0.1:9' })
  t.match(plain.json(), { kv_events_endpoint: null, replay_endpoint: null, kv_events_topic: null })
  for (const [body, re] of [
    [{ kv_events_endpoint: 'http://h:1' }, /kv_events_endpoint/],
    [{ kv_events_endpoint: 'tcp://h' }, /kv_events_endpoint must be tcp:\/\/HOST:PORT/],
    [{ kv_events_endpoint: 'tcp://h:65535', dp_size: 2 }, /PORT \+ dp_size - 1 at most 65535/],
    [{ kv_events_endpoint: 'tcp://h:1', replay_endpoint: 'tcp://h:0' }, /replay_endpoint must be tcp/],
    [{ replay_endpoint: 'tcp://h:2' }, /need kv_events_endpoint/],
  ] as const) {
    const res = await post('/v1/workers', { id: 903, url: 'http://127.0.0.1:9', ...body })
    t.equal(res.statusCode, 400, JSON.stringify(body))
    t.match(res.body, re)
  }
  t.equal(h.router.registry.get(903n), undefined, 'nothing registered')
  t.ok(await h.router.removeWorker(901n))
  t.ok(await h.router.removeWorker(902n))
})
