// Routing on lower storage tiers, through the real router (shard threads, query board) and its HTTP
// API: a worker holding the prompt in its host tier beats one holding nothing and loses to one
// holding it on the device, under both costs; /v1/route explains each candidate's tiers.
import t from 'tap'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'
import { encodeRouterEvent, type StorageTierName } from '../../src/codec/events.js'
import { harness, tokens } from './helpers.js'

const json = { 'content-type': 'application/json' }
const prompt = tokens(16, 500)
const local = computeBlockHashes(prompt, 4)
const seq = computeSequenceHashes(local)

interface Row {
  worker_id: number
  overlap_blocks: number
  device_blocks: number
  host_blocks: number
  disk_blocks: number
}

for (const cost of ['latency', 'dynamo'] as const) {
  t.test(`--router-cost ${cost}`, async (t) => {
    const h = await harness(['--router-block-size', '4', '--router-cost', cost])
    t.teardown(() => h.close())
    const post = (url: string, payload: string) => h.app.fastify.inject({ method: 'POST', url, payload, headers: json })
    const store = async (worker: number, tier: StorageTierName, n: number): Promise<void> => {
      const blocks = Array.from({ length: n }, (_, i) => ({ block_hash: seq[i] as bigint, tokens_hash: local[i] as bigint }))
      const ev = encodeRouterEvent({
        worker_id: BigInt(worker),
        storage_tier: tier,
        event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } },
      })
      t.equal((await post('/v1/kv-events', `[${ev}]`)).statusCode, 202)
      await h.router.pool.flush()
    }
    const route = async (): Promise<{ worker_id: number; candidates: Row[] }> => {
      const r = await post('/v1/route', JSON.stringify({ token_ids: prompt }))
      t.equal(r.statusCode, 200)
      return r.json() as { worker_id: number; candidates: Row[] }
    }
    for (const id of [1, 2]) t.equal((await post('/v1/workers', JSON.stringify({ id, url: `http://127.0.0.1:${10 + id}` }))).statusCode, 201)
    // worker 1 holds the whole prompt in its host tier only
    await store(1, 'host_pinned', 4)
    const a = await route()
    t.equal(a.worker_id, 1, 'the host-tier prefix beats nothing')
    const one = a.candidates.find((c) => c.worker_id === 1)
    t.same(one && [one.device_blocks, one.host_blocks, one.disk_blocks, one.overlap_blocks], [0, 4, 4, 3], 'explained: 0.75 × 4 host blocks')
    const two = a.candidates.find((c) => c.worker_id === 2)
    t.same(two && [two.device_blocks, two.host_blocks, two.disk_blocks, two.overlap_blocks], [0, 0, 0, 0])
    // worker 3 holds it on the device
    t.equal((await post('/v1/workers', JSON.stringify({ id: 3, url: 'http://127.0.0.1:13' }))).statusCode, 201)
    await store(3, 'device', 4)
    const b = await route()
    t.equal(b.worker_id, 3, 'the device prefix beats the host-tier one')
    // the lower tiers as metrics and per worker-rank
    const metrics = (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
    const lower = [...metrics.matchAll(/^kvrouter_shard_lower_tier_blocks\{[^}]*\} (\d+)/gm)].reduce((s, m) => s + Number(m[1]), 0)
    t.equal(lower, 4, 'kvrouter_shard_lower_tier_blocks')
    const workers = (await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json() as {
      workers: { id: number; ranks: { cached_blocks: number; lower_tier_blocks: number }[] }[]
    }
    t.same(workers.workers.map((w) => [w.id, w.ranks[0]?.cached_blocks, w.ranks[0]?.lower_tier_blocks]).sort(), [
      [1, 0, 4],
      [2, 0, 0],
      [3, 4, 0],
    ])
    // /v1/overlap shows the tiers too
    const ov = (await post('/v1/overlap', JSON.stringify({ token_ids: prompt }))).json() as { scores: { worker_id: number; host_blocks?: number }[] }
    t.equal(ov.scores.find((s) => s.worker_id === 1)?.host_blocks, 4)
  })
}
