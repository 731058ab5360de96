// Engines' own KV events into the router's index: mocker engines publishing vLLM-style over ZMQ,
// the router registering them with a kv-events endpoint. The index holds exactly each pool's
// cached blocks, also after its shard restarts; a restarted engine clears its worker; a
// malformed batch and an event of another block size are counted and skipped; the listeners
// stop with the worker; GET /v1/workers shows the listener's state per rank.
import t from 'tap'
import type { Test } from 'tap'
import { pack } from 'msgpackr'
import { Publisher } from 'zeromq'
import { Router } from '../../src/core/router.js'
import type { RouterEvent } from '../../src/codec/events.js'
import type { MockerFleet } from '../../src/sim/mocker/fleet.js'
import type { MockerWorker } from '../../src/sim/mocker/fleet.js'
import { EngineIntake } from '../../src/transport/engine-intake.js'
import type { ZmqSource } from '../../src/transport/zmq.js'
import { buildApp } from '../../src/http/server.js'
import { config } from '../http/helpers.js'
import { Rng } from '../helpers/rng.js'
import { waitUntil } from '../helpers/wait.js'
import { drive, sortedByKey, zmqFleet } from '../helpers/zmq-fleet.js'

const BS = 4

/** block_hash → tokens_hash the router's index holds for a worker. */
async function held(router: Router, worker: bigint): Promise<Map<bigint, bigint>> {
  await router.pool.flush()
  const m = new Map<bigint, bigint>()
  for (const ev of await router.pool.dump()) {
    if (ev.worker_id !== worker || typeof ev.event.data !== 'object') continue
    if ('stored' in ev.event.data) for (const b of ev.event.data.stored.blocks) m.set(b.block_hash, b.tokens_hash)
    else for (const h of ev.event.data.removed.block_hashes) m.delete(h)
  }
  return sortedByKey(m)
}

const cachedOf = (fleet: MockerFleet, i: number): Map<bigint, bigint> => sortedByKey((fleet.workers[i] as MockerWorker).engine.pool.cachedTokensHashes())

t.test('the metrics are absent until an engine is listened to', async (t) => {
  const router = await startRouter(t)
  const text = await router.metrics.registry.metrics()
  t.notMatch(text, /kvrouter_zmq_total\{/)
  t.notMatch(text, /kvrouter_engine_events_skipped_total\{/)
})

async function startRouter(t: Test): Promise<Router> {
  const router = await Router.start(config(['--router-block-size', String(BS)]))
  t.teardown(() => router.close())
  return router
}

t.test('registered with its kv-events endpoints, each engine is indexed exactly; a late router catches up', async (t) => {
  const { fleet, base } = await zmqFleet(t, { numWorkers: 2, numGpuBlocks: 24, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS })
  const rng = new Rng(5)
  // served before the router starts: it learns them through the replay sockets
  await drive(fleet, rng, 20)
  const router = await startRouter(t)
  const ids = fleet.workers.map((w) => w.workerId)
  for (let i = 0; i < 2; i++)
    await router.addWorker({ id: ids[i] as bigint, url: 'http://127.0.0.1:9', kvEvents: { endpoint: `tcp://127.0.0.1:${base + i}`, replay: `tcp://127.0.0.1:${base + 2 + i}`, topic: '' } })
  for (let i = 0; i < 2; i++) {
    const want = cachedOf(fleet, i)
    t.ok(want.size > 0)
    await waitUntil(`engine ${i} caught up`, async () => (await held(router, ids[i] as bigint)).size === want.size, 10_000)
    t.same(await held(router, ids[i] as bigint), want, `engine ${i}: replayed`)
  }
  // and then live: publish until the live batches reach the index
  await drive(fleet, rng, 60)
  for (let i = 0; i < 2; i++) {
    await waitUntil(`engine ${i} live`, async () => {
      const h = await held(router, ids[i] as bigint)
      const want = cachedOf(fleet, i)
      return h.size === want.size && [...want].every(([k, v]) => h.get(k) === v)
    })
    t.same(await held(router, ids[i] as bigint), cachedOf(fleet, i), `engine ${i}: live`)
    t.equal(router.engines.stateOf(ids[i] as bigint, 0), 'exact')
  }
  // a shard that restarts empty is refilled from the engines' replay buffers
  const restarted = new Promise((r) => router.pool.once('shardRestarted', r))
  await router.pool.terminateShard(0)
  await restarted
  await waitUntil('the shard rebuilt', () => router.pool.health()[0] === 'exact', 10_000)
  for (let i = 0; i < 2; i++) {
    await waitUntil(`engine ${i} replayed again`, async () => (await held(router, ids[i] as bigint)).size === cachedOf(fleet, i).size, 10_000)
    t.same(await held(router, ids[i] as bigint), cachedOf(fleet, i), `engine ${i}: rebuilt after the shard restart`)
  }
  const c = router.engines.counters()
  t.ok(c.batches > 0 && c.replayedBatches > 0, 'batches replayed and live')
  t.equal(c.sinkErrors, 0)
  t.same(router.engines.skipped, { block_size_mismatch: 0, attention_kind: 0, unknown_event: 0, empty: 0 })
  const text = await router.metrics.registry.metrics()
  t.match(text, /kvrouter_zmq_total\{what="batches"\} [1-9]/)
  t.match(text, /kvrouter_zmq_total\{what="replays"\} [2-9]/, 'at least one replay per listener, at its start')
  t.match(text, /kvrouter_engine_events_skipped_total\{reason="block_size_mismatch"\} 0\n/)
  // the listeners stop with the worker, and leave their counts behind
  t.ok(await router.removeWorker(ids[0] as bigint))
  t.equal(router.engines.has(ids[0] as bigint), false)
  t.equal(router.engines.stateOf(ids[0] as bigint, 0), null)
  t.ok(router.engines.counters().batches >= c.batches, 'the totals do not go down')
  t.equal((await held(router, ids[0] as bigint)).size, 0, 'its blocks are gone')
})

t.test('an engine that restarts clears its worker, then is indexed from its new events', async (t) => {
  const first = await zmqFleet(t, { numGpuBlocks: 32, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS })
  const router = await startRouter(t)
  const id = first.fleet.workers[0]?.workerId as bigint
  await router.addWorker({ id, url: 'http://127.0.0.1:9', kvEvents: { endpoint: `tcp://127.0.0.1:${first.base}`, replay: `tcp://127.0.0.1:${first.base + 1}`, topic: '' } })
  const rng = new Rng(9)
  await waitUntil('subscribed', async () => {
    await drive(first.fleet, rng, 3)
    return router.engines.counters().batches > 0
  })
  await drive(first.fleet, rng, 30)
  await waitUntil('indexed', async () => (await held(router, id)).size === cachedOf(first.fleet, 0).size)
  await first.fleet.close()
  // a new publisher on the same ports counts from 0 again
  const second = await zmqFleet(t, { numGpuBlocks: 32, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS }, { base: first.base })
  t.equal(second.fleet.workers[0]?.workerId, id)
  await waitUntil(
    'the restart seen',
    async () => {
      await drive(second.fleet, rng, 3)
      return router.engines.counters().restarts > 0
    },
    15_000,
    50,
  )
  await drive(second.fleet, rng, 10)
  await waitUntil('the new engine indexed', async () => {
    const h = await held(router, id)
    const want = cachedOf(second.fleet, 0)
    return h.size === want.size && [...want].every(([k, v]) => h.get(k) === v)
  })
  t.same(await held(router, id), cachedOf(second.fleet, 0), 'only what the new engine holds')
})

t.test('the sink: malformed batches throw (counted by the listener), skipped events are counted, a restart pushes cleared', async (t) => {
  const pushed: RouterEvent[] = []
  const intake = new EngineIntake(BS, (ev) => pushed.push(ev))
  t.teardown(() => intake.close())
  // a publisher that sends garbage, then a batch of another block size, then a good one
  const pub = new Publisher({ linger: 0 })
  let port = 0
  for (;;) {
    port = 30000 + Math.floor(Math.random() * 20000)
    try {
      await pub.bind(`tcp://127.0.0.1:${port}`)
      break
    } catch {}
  }
  t.teardown(() => pub.close())
  await intake.start(7n, 1, { endpoint: `tcp://127.0.0.1:${port}`, replay: null, topic: '' })
  t.equal(pushed.length, 1, 'the worker is cleared when its listeners start')
  t.same(pushed[0]?.event.data, 'cleared')
  const be = (n: number) => {
    const b = Buffer.alloc(8)
    b.writeBigUInt64BE(BigInt(n))
    return b
  }
  const stored = (bs: number) => ({ type: 'BlockStored', block_hashes: [11, 12], parent_block_hash: null, token_ids: [1, 2, 3, 4, 5, 6, 7, 8], block_size: bs })
  let seq = 0
  await waitUntil(
    'a batch through',
    async () => {
      await pub.send(['', be(seq++), pack([1.5, [stored(BS)], 0])])
      return pushed.length > 1
    },
    10_000,
    50,
  )
  const before = pushed.length
  await pub.send(['', be(seq++), Buffer.from([0xc1])])
  await pub.send(['', be(seq++), pack([1.5, [stored(BS * 2), { type: 'Frobnicated' }], null])])
  await pub.send(['', be(seq++), pack([1.5, [{ type: 'BlockRemoved', block_hashes: [11] }], 3])])
  await waitUntil('the removal', () => pushed.length > before)
  t.equal(intake.counters().sinkErrors, 1, 'the malformed batch')
  t.equal(intake.skipped.block_size_mismatch, 1)
  t.equal(intake.skipped.unknown_event, 1)
  const last = pushed[pushed.length - 1] as RouterEvent
  t.same(last.event.data, { removed: { block_hashes: [11n] } })
  t.equal(last.event.dp_rank, 3, "the batch's own rank")
  // ids per worker-rank from 1 without gaps
  const rank0 = pushed.filter((e) => e.event.dp_rank === 0).map((e) => e.event.event_id)
  t.same(
    rank0,
    rank0.map((_, i) => BigInt(i + 1)),
  )
  const source: ZmqSource = { workerId: 7n, dpRank: 0, endpoint: '', replay: null, topic: '' }
  intake.restarted(source)
  t.same(pushed[pushed.length - 1]?.event.data, 'cleared')
  intake.restarted({ ...source, workerId: 8n })
  t.same(pushed[pushed.length - 1]?.event.data, 'cleared', 'an unknown worker pushes nothing')
  t.equal(pushed.filter((e) => e.event.data === 'cleared').length, 2)
  // the same registration keeps its listeners; another endpoint replaces them
  await intake.start(7n, 1, { endpoint: `tcp://127.0.0.1:${port}`, replay: null, topic: '' })
  t.equal(pushed.filter((e) => e.event.data === 'cleared').length, 2)
  await intake.start(7n, 1, { endpoint: `tcp://127.0.0.1:${port}`, replay: null, topic: 'x' })
  t.equal(pushed.filter((e) => e.event.data === 'cleared').length, 3)
})

t.test('GET /v1/workers shows the listener state per rank', async (t) => {
  const router = await startRouter(t)
  const app = await buildApp({ router, tokenizer: null })
  t.teardown(() => app.shutdown(1000))
  // nothing listens on the replay port: the first replay times out, the rank is degraded
  await router.addWorker({ id: 3n, url: 'http://127.0.0.1:9', dpRanks: 2, kvEvents: { endpoint: 'tcp://127.0.0.1:9', replay: 'tcp://127.0.0.1:19', topic: '' } })
  const get = async () => (await app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json() as { workers: { index: string; ranks: { index: string }[] }[] }
  const w = (await get()).workers[0]
  t.same(
    w?.ranks.map((r) => r.index),
    ['recovering', 'recovering'],
  )
  t.equal(w?.index, 'recovering')
})
