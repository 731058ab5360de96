// Engines' own KV events into the router's index: mocker engines publishing vLLM-style over ZMQ,
// the router registering them with a kv-events endpoint. The index holds exactly each pool's
// cached blocks, also after its shard restarts; a restarted engine rank resets that worker-rank
// alone; stores and removals are de-duplicated per rank; a malformed batch and an event of another
// block size are counted and skipped; the listeners stop with the worker; GET /v1/workers shows
// the listener's state per rank.
import t from 'tap'
import type { Test } from 'tap'
import { pack } from 'msgpackr'
import { Publisher } from 'zeromq'
import { Router } from '../../src/core/router.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { ShardPool } from '../../src/shards/pool.js'
import type { MockerFleet } from '../../src/sim/mocker/fleet.js'
import type { MockerWorker } from '../../src/sim/mocker/fleet.js'
import { EngineIntake } from '../../src/transport/engine-intake.js'
import { buildApp } from '../../src/http/server.js'
import { config } from '../http/helpers.js'
import { Rng } from '../helpers/rng.js'
import { waitUntil } from '../helpers/wait.js'
import { drive, sortedByKey, zmqFleet } from '../helpers/zmq-fleet.js'
import { captureProcessLog, warnings } from '../helpers/log.js'

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
    await router.addWorker({
      id: ids[i] as bigint,
      url: 'http://127.0.0.1:9',
      kvEvents: { endpoint: `tcp://127.0.0.1:${base + i}`, replay: `tcp://127.0.0.1:${base + 2 + i}`, topic: '' },
    })
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

t.test('an engine that restarts is reset, then indexed from its new events', async (t) => {
  const first = await zmqFleet(t, { numGpuBlocks: 32, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS })
  const router = await startRouter(t)
  const id = first.fleet.workers[0]?.workerId as bigint
  await router.addWorker({
    id,
    url: 'http://127.0.0.1:9',
    kvEvents: { endpoint: `tcp://127.0.0.1:${first.base}`, replay: `tcp://127.0.0.1:${first.base + 1}`, topic: '' },
  })
  const rng = new Rng(9)
  await waitUntil('subscribed', async () => {
    await drive(first.fleet, rng, 3)
    return router.engines.counters().batches > 0
  })
  await drive(first.fleet, rng, 30)
  await waitUntil('indexed', async () => (await held(router, id)).size === cachedOf(first.fleet, 0).size)
  await first.fleet.close()
  t.equal(router.engines.counters().restarts, 0, 'no restart while the first engine runs')
  // a new publisher on the same ports counts from 0 again
  const second = await zmqFleet(t, { numGpuBlocks: 32, maxNumSeqs: 4, maxNumBatchedTokens: 64, blockSize: BS }, { base: first.base })
  t.equal(second.fleet.workers[0]?.workerId, id)
  await waitUntil(
    'the restart seen',
    async () => {
      await drive(second.fleet, rng, 3)
      return router.engines.counters().restarts === 1
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

/** Engine publishers on consecutive ports from a free base (rank r on base + r, as the listeners expect). */
async function publishers(t: Test, n: number): Promise<{ pubs: Publisher[]; base: number; seq: number[] }> {
  for (;;) {
    const base = 30000 + Math.floor(Math.random() * 10000) * 2
    const pubs: Publisher[] = []
    try {
      for (let i = 0; i < n; i++) {
        const p = new Publisher({ linger: 0 })
        pubs.push(p)
        await p.bind(`tcp://127.0.0.1:${base + i}`)
      }
      t.teardown(() => {
        for (const p of pubs) p.close()
      })
      return { pubs, base, seq: new Array<number>(n).fill(0) }
    } catch {
      for (const p of pubs) p.close()
    }
  }
}

const be = (n: number): Buffer => {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(BigInt(n))
  return b
}

/** An intake on a one-shard pool of its own, listening to `ranks` publishers as worker `id` (no replay socket). */
async function intakeOn(t: Test, id: bigint, ranks: number) {
  const pool = await ShardPool.start({ shards: 1 })
  const intake = new EngineIntake(BS, pool)
  t.teardown(async () => {
    await intake.close()
    await pool.close()
  })
  const p = await publishers(t, ranks)
  await intake.start(id, ranks, { endpoint: `tcp://127.0.0.1:${p.base}`, replay: null, topic: '' })
  let sent = 0
  /** Sends a batch on rank r's publisher with its next sequence number (or `seq`). */
  const send = (r: number, batch: unknown, seq?: number): Promise<void> => {
    const n = seq ?? (p.seq[r] as number)
    p.seq[r] = n + 1
    sent++
    return (p.pubs[r] as Publisher).send(['', be(n), batch instanceof Uint8Array ? batch : pack(batch)])
  }
  // each listener subscribed (a PUB drops what it sends before): empty batches until one is taken
  for (let r = 0; r < ranks; r++) {
    const before = intake.counters().batches
    await waitUntil(
      `rank ${r} subscribed`,
      async () => {
        await send(r, [0, [], r])
        return intake.counters().batches > before
      },
      10_000,
      50,
    )
  }
  // a warm-up sent after the listener subscribed may still be on its way: the baseline is taken
  // once no more arrive, so that what was sent and not taken is exactly what the PUB dropped
  let quiet = -1
  while (quiet !== intake.counters().batches) {
    quiet = intake.counters().batches
    await new Promise((r) => setTimeout(r, 150))
  }
  const sentBefore = sent
  const takenBefore = intake.counters().batches
  /** Waits until every batch sent since is taken by its listener and applied by the shard. */
  const settle = async (): Promise<void> => {
    await waitUntil('the batches taken', () => intake.counters().batches - takenBefore >= sent - sentBefore, 10_000)
    await pool.flush()
  }
  return { pool, intake, send, settle, pubs: p.pubs }
}

/** block_hash → tokens_hash per rank of a worker, as the index holds them. */
async function ranksHeld(pool: ShardPool, worker: bigint): Promise<Map<number, Set<bigint>>> {
  await pool.flush()
  const m = new Map<number, Set<bigint>>()
  for (const ev of await pool.dump()) {
    if (ev.worker_id !== worker || typeof ev.event.data !== 'object' || !('stored' in ev.event.data)) continue
    const s = m.get(ev.event.dp_rank) ?? new Set<bigint>()
    for (const b of ev.event.data.stored.blocks) s.add(b.block_hash)
    m.set(ev.event.dp_rank, s)
  }
  return m
}

const stored = (hashes: number[], parent: number | null = null, bs = BS) => ({
  type: 'BlockStored',
  block_hashes: hashes,
  parent_block_hash: parent,
  token_ids: hashes.flatMap((h) => [h, 2, 3, 4].slice(0, bs)).concat(new Array(Math.max(0, bs - 4) * hashes.length).fill(9)),
  block_size: bs,
})

t.test('malformed batches are counted by reason, skipped events counted, a block-size mismatch warned of once', async (t) => {
  const { pool, intake, send, settle } = await intakeOn(t, 7n, 1)
  // what the router's worker health hears (the worker is misconfigured until its engine is read afresh)
  const told: unknown[] = []
  intake.blockSizes = { mismatch: (id, rank, size) => told.push(['mismatch', id, rank, size]), reset: (id, rank) => told.push(['reset', id, rank]) }
  const capture = captureProcessLog()
  const said = (): string[] => warnings(capture, 'KVR_BLOCK_SIZE_MISMATCH')
  await send(0, [1.5, [stored([11, 12])], 0])
  await send(0, Buffer.from([0xc1]))
  await send(0, [1.5, 'not events', 0])
  await send(0, [1.5, [['BlockStored', [1], null, [1, 2, -3, 4], BS]], 0])
  // refused whole: the good event before the malformed one is not applied either
  await send(0, [1.5, [stored([21]), ['BlockStored', 'x', null, [1, 2, 3, 4], BS]], 0])
  await send(0, [1.5, [stored([31], null, BS * 2), { type: 'Frobnicated' }, stored([32], null, BS * 2)], null])
  await send(0, [1.5, [stored([41], null, BS * 2), { type: 'BlockRemoved', block_hashes: [] }], null])
  await send(0, [1.5, [{ type: 'BlockRemoved', block_hashes: [12] }], 0])
  await settle()
  await waitUntil('the warning', () => said().length > 0)
  t.same(intake.engineCounters().malformed, { malformed_msgpack: 1, wrong_type: 2, invalid_number: 1, other: 0 })
  t.equal(intake.counters().sinkErrors, 4, 'the malformed batches are sink errors too')
  t.same(intake.skipped, { block_size_mismatch: 3, attention_kind: 0, unknown_event: 1, empty: 1 })
  t.same(await ranksHeld(pool, 7n), new Map([[0, new Set([11n])]]))
  t.equal(said().length, 1, 'once per worker-rank')
  t.match(said()[0], /worker 7 rank 0 publishes KV events of block size 8, the router hashes with 4/)
  const c = pool.counters()[0]
  t.equal(c?.malformed, 0, 'not counted as malformed JSON messages')
  t.equal(c?.gaps, 0)
  t.same(told, [['mismatch', 7n, 0, 8]], 'the mismatch told once per worker-rank')
  await intake.stop(7n)
  t.same(told.at(-1), ['reset', 7n, undefined], 'no longer read: told to forget it')
})

t.test('stores and removals are de-duplicated per rank', async (t) => {
  const { pool, intake, send, settle } = await intakeOn(t, 9n, 2)
  // vLLM reports hash 5 stored twice (two requests computed it), rank 1 once
  await send(0, [0, [stored([5, 6]), stored([5])], 0])
  await send(1, [0, [stored([5])], 1])
  await send(0, [0, [{ type: 'BlockRemoved', block_hashes: [5, 6, 99] }], 0])
  await settle()
  t.same(
    await ranksHeld(pool, 9n),
    new Map([
      [0, new Set([5n])],
      [1, new Set([5n])],
    ]),
    'one removal of two: still held; the other rank counts apart',
  )
  t.same([intake.engineCounters().duplicateStores, intake.engineCounters().suppressedRemovals], [1, 1])
  await send(0, [0, [{ type: 'BlockRemoved', block_hashes: [5] }], 0])
  await settle()
  t.same(await ranksHeld(pool, 9n), new Map([[1, new Set([5n])]]), 'the second removal applies')
  // AllBlocksCleared clears the worker, and its counts start over: one store, one removal
  await send(0, [0, [stored([7]), stored([7]), { type: 'AllBlocksCleared' }, stored([7])], 0])
  await send(0, [0, [{ type: 'BlockRemoved', block_hashes: [7] }], 0])
  await settle()
  t.same(await ranksHeld(pool, 9n), new Map(), 'the count of 7 restarted at the clear')
  t.equal(intake.engineCounters().suppressedRemovals, 1)
})

t.test('a restart of one rank resets that worker-rank only, ordered with its batches; engine events never open a hold or count a gap', async (t) => {
  const { pool, intake, send, settle } = await intakeOn(t, 11n, 2)
  const gaps: unknown[] = []
  pool.on('gap', (g) => gaps.push(g))
  // the worker answers worker queries, and a RouterEvent with a high id went through for rank 1:
  // ids do not matter to engine events
  pool.setRecoverable(11n, true)
  pool.push(Buffer.from(encodeRouterEvent({ worker_id: 11n, event: { event_id: 50n, dp_rank: 1, data: { removed: { block_hashes: [1n] } } } })))
  await send(0, [0, [stored([1, 2]), stored([3], 2)], 0])
  await send(1, [0, [{ type: 'BlockStored', block_hashes: [10, 11], token_ids: [1, 2, 3, 4, 5, 6, 7, 8], block_size: BS, cache_salt: 'tenant-a' }], 1])
  await send(1, [0, [stored([12], 11), stored([13]), stored([13])], 1])
  await settle()
  t.same(
    await ranksHeld(pool, 11n),
    new Map([
      [0, new Set([1n, 2n, 3n])],
      [1, new Set([10n, 11n, 12n, 13n])],
    ]),
  )
  // rank 1's engine restarts: its publisher counts from 0 again
  await send(1, [0, [stored([20])], 1], 0)
  await send(1, [0, [stored([21], 20), { type: 'BlockRemoved', block_hashes: [13] }], 1])
  await settle()
  t.equal(intake.counters().restarts, 1)
  t.same(
    await ranksHeld(pool, 11n),
    new Map([
      [0, new Set([1n, 2n, 3n])],
      [1, new Set([20n, 21n])],
    ]),
    'rank 0 keeps its blocks; rank 1 holds what came after its restart',
  )
  t.equal(intake.engineCounters().suppressedRemovals, 0, "13's double store was forgotten: its removal passed through")
  const c = pool.counters()[0]
  t.equal(c?.gaps, 0, 'no gap counted')
  t.same(gaps, [], 'no hold opened')
  t.equal(pool.counters()[0]?.engine.events, 9)
})

t.test('GET /v1/workers shows the listener state per rank', async (t) => {
  const router = await startRouter(t)
  const app = await buildApp({ router, tokenizer: null })
  t.teardown(() => app.shutdown(1000))
  // nothing listens on the replay port: the first replay times out, the rank is degraded
  await router.addWorker({
    id: 3n,
    url: 'http://127.0.0.1:9',
    dpRanks: 2,
    kvEvents: { endpoint: 'tcp://127.0.0.1:9', replay: 'tcp://127.0.0.1:19', topic: '' },
  })
  const get = async () =>
    (await app.fastify.inject({ method: 'GET', url: '/v1/workers' })).json() as { workers: { index: string; ranks: { index: string }[] }[] }
  const w = (await get()).workers[0]
  t.same(
    w?.ranks.map((r) => r.index),
    ['recovering', 'recovering'],
  )
  t.equal(w?.index, 'recovering')
})

t.test("log lines of an engine's events: a bad frame, a gap without a replay socket, a restart, a batch that does not decode", async (t) => {
  const capture = captureProcessLog('info', 60_000)
  const { pool, intake, send, settle, pubs } = await intakeOn(t, 7n, 1)
  const line = (cls: string): Record<string, unknown> | undefined => capture.records.find((x) => x.class === cls)
  await (pubs[0] as Publisher).send(['', be(99)])
  await send(0, Buffer.from([0xc1]))
  await send(0, [1.5, [stored([21])], 0], 1000)
  await send(0, [1.5, [stored([22])], 0], 0)
  await settle()
  await waitUntil('the listener lines', () => line('zmq_bad_frame') !== undefined && line('zmq_engine_restart') !== undefined)
  t.match(line('zmq_bad_frame'), { level: 'warn', worker_id: '7', dp_rank: 0, endpoint: /^tcp:\/\/127\.0\.0\.1:\d+$/, frames: 2 })
  t.match(line('zmq_gap'), { level: 'info', worker_id: '7', dp_rank: 0, to: '999', replay: false })
  t.match(line('zmq_engine_restart'), { level: 'info', worker_id: '7', seq: '0', last: '1000' })
  // the shard's sample of the batch it refused travels by message
  await new Promise((r) => setTimeout(r, 100))
  pool.logWatch.poll()
  t.match(line('engine_batches_malformed'), {
    level: 'warn',
    count: 1,
    reasons: { malformed_msgpack: 1 },
    last: { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK', worker_id: '7', dp_rank: 0 },
  })
  t.equal(intake.counters().badFrames, 1)
})
