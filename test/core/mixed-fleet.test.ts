// A mixed fleet in KV-events mode: a worker with events is exact, one without is routed on
// predictions; the first real event of the predicted worker replaces its predictions in the index
// (whatever that event's id), and from then on it is exact.
import t from 'tap'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { harness, tokens } from '../http/helpers.js'
import { captureProcessLog, warnings } from '../helpers/log.js'

const json = { 'content-type': 'application/json' }

t.test('predicted until the first event, then exactly the events', async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  const post = (url: string, body: string) => h.app.fastify.inject({ method: 'POST', url, payload: body, headers: json })
  await h.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9' })
  await h.router.addWorker({ id: 2n, url: 'http://127.0.0.1:9' })
  // worker 1 sends an event: exact
  t.equal((await post('/v1/kv-events', `[${encodeRouterEvent({ worker_id: 1n, event: { event_id: 1n, dp_rank: 0, data: 'cleared' } })}]`)).statusCode, 202)
  const states = async () =>
    ((await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json() as { workers: { id: number; index: string }[] }).workers.map(
      (w) => `${w.id}:${w.index}`,
    )
  t.same(await states(), ['1:exact', '2:no-events'])

  // a prompt routed to worker 2 (pinned) counts as cached there
  const prompt = tokens(20, 500)
  const r = await post('/v1/route', JSON.stringify({ token_ids: prompt, update_states: true, request_id: 'a', worker_id: 2 }))
  t.equal(r.statusCode, 200)
  t.ok(h.router.scheduler.free('a'))
  await h.router.pool.flush()
  const ov = await post('/v1/overlap', JSON.stringify({ token_ids: prompt }))
  t.match(ov.body, '{"worker_id":2,"worker_id_str":"2","dp_rank":0,"overlap_blocks":5,"tree_size":5}', 'the predicted prefix')
  const unpinned = await post('/v1/route', JSON.stringify({ token_ids: prompt }))
  t.match(unpinned.body, /^\{"worker_id":2,/, 'and the same prompt goes there')

  // worker 2's first event, an id far from the predictions' ids, for other blocks
  const other = tokens(8, 900)
  const local = computeBlockHashes(other, 4)
  const seq = computeSequenceHashes(local)
  const blocks = [0, 1].map((i) => ({ block_hash: seq[i] as bigint, tokens_hash: local[i] as bigint }))
  const ev = encodeRouterEvent({ worker_id: 2n, event: { event_id: 500n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } })
  t.equal((await post('/v1/kv-events', `[${ev}]`)).statusCode, 202)
  await h.router.pool.flush()
  t.same(await states(), ['1:exact', '2:exact'])
  const dump = (await h.app.fastify.inject({ method: 'GET', url: '/v1/kv/dump?worker_id=2' })).body
  t.equal((dump.match(/"block_hash"/g) ?? []).length, 2, 'the index holds its two real blocks, no prediction')
  t.equal(h.router.scheduler.stats().approximateBlocks, 0, 'the predictions are forgotten')
  const gone = await post('/v1/overlap', JSON.stringify({ token_ids: prompt }))
  t.notMatch(gone.body, '"worker_id":2', 'the predicted prefix is gone')
  // its next event follows 500 without a gap
  const next = encodeRouterEvent({ worker_id: 2n, event: { event_id: 501n, dp_rank: 0, data: { removed: { block_hashes: [seq[1] as bigint] } } } })
  await post('/v1/kv-events', `[${next}]`)
  await h.router.pool.flush()
  t.equal(
    h.router.pool.counters().reduce((n, c) => n + c.gaps, 0),
    0,
    'no gap counted',
  )
  // routed again: no new prediction for a worker with events
  await post('/v1/route', JSON.stringify({ token_ids: tokens(12, 700), update_states: true, request_id: 'b', worker_id: 2 }))
  t.equal(h.router.scheduler.stats().approximateBlocks, 0)
  t.match((await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body, /^kvrouter_worker_ranks_no_events 0$/m)
})

t.test('a worker whose events came before it registered is exact at once', async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  h.router.ingestEvent({ worker_id: 3n, event: { event_id: 1n, dp_rank: 0, data: 'cleared' } })
  await h.router.pool.flush()
  await h.router.addWorker({ id: 3n, url: 'http://127.0.0.1:9' })
  t.equal(h.router.indexStateOf(3n, 0), 'exact')
})

t.test('events for an id nobody registered while a registered worker stays silent: the ids do not agree, said once', async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  const capture = captureProcessLog()
  await h.router.addWorker({ id: 1n, url: 'http://127.0.0.1:9' })
  await h.router.checkEventSources()
  t.notOk(
    warnings(capture, 'KVR_WORKER_NO_EVENTS').some((w) => /are not registered/.test(w)),
    'nothing to say before events come',
  )
  h.router.ingestEvent({
    worker_id: 7587889n,
    event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 1n, tokens_hash: 2n }] } } },
  })
  await h.router.pool.flush()
  await h.router.checkEventSources()
  await h.router.checkEventSources()
  const said = warnings(capture, 'KVR_WORKER_NO_EVENTS').filter((w) => /are not registered/.test(w))
  t.equal(said.length, 1, 'once')
  t.match(said[0], 'KV events arrive for worker id(s) 7587889, which are not registered, while registered worker(s) 1 (http://127.0.0.1:9) have sent none')
  t.equal(h.router.indexStateOf(1n, 0), 'no-events')
})

t.test('a worker registered again without its kv-events endpoint: its engine blocks dropped, no-events again', async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  // a listener on an endpoint nobody publishes on; its worker's blocks come from elsewhere here
  await h.router.addWorker({ id: 5n, url: 'http://127.0.0.1:9', kvEvents: { endpoint: 'tcp://127.0.0.1:9', replay: null, topic: '' } })
  h.router.ingestEvent({
    worker_id: 5n,
    event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 1n, tokens_hash: 2n }] } } },
  })
  await h.router.pool.flush()
  t.not(h.router.indexStateOf(5n, 0), 'no-events', 'its events came')
  t.equal((await h.router.pool.treeSizes()).find((x) => x.worker_id === 5n)?.tree_size, 1)
  await h.router.addWorker({ id: 5n, url: 'http://127.0.0.1:9' })
  await h.router.pool.flush()
  t.equal((await h.router.pool.treeSizes()).find((x) => x.worker_id === 5n)?.tree_size ?? 0, 0, 'its blocks are gone')
  t.equal(h.router.indexStateOf(5n, 0), 'no-events')
})

t.test('approximate mode calls every worker predicted', async (t) => {
  const h = await harness(['--router-block-size', '4', '--no-router-kv-events'])
  t.teardown(() => h.close())
  await h.router.addWorker({ id: 4n, url: 'http://127.0.0.1:9' })
  const w = (await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json() as { workers: { index: string; ranks: { index: string }[] }[] }
  t.match(w.workers[0], { index: 'predicted', ranks: [{ index: 'predicted' }] })
})
