// The local event ring and the worker query endpoint over HTTP: every response
// variant, consecutive original ids, exact u64s, and a tree dump that rebuilds the engine's
// cached set in an empty index.
import t from 'tap'
import { MockEngine } from '../../../src/sim/mocker/engine.js'
import { EngineServer, KV_QUERY_PATH } from '../../../src/sim/mocker/server.js'
import { EventRing, encodeKvQueryResponse } from '../../../src/sim/mocker/event-ring.js'
import { EventDecoder } from '../../../src/codec/event-decoder.js'
import type { RouterEvent } from '../../../src/codec/events.js'
import { parseJsonExact } from '../../../src/codec/json.js'
import { APPLY_OK, KvIndex } from '../../../src/index/kv-index.js'

const WORKER = 2n ** 63n + 5n // a lease-sized id: exact only if nothing goes through a double
const events: RouterEvent[] = []
const engine = new MockEngine({ workerId: WORKER, blockSize: 4, numGpuBlocks: 12, speedupRatio: 0, ringSize: 16, onEvent: (ev) => events.push(ev) })
const server = new EngineServer({ engine })
const url = await server.listen()
t.teardown(async () => {
  await server.close()
  engine.close()
})

async function query(body: string): Promise<{ status: number; text: string; obj: Record<string, unknown> }> {
  const r = await fetch(url + KV_QUERY_PATH, { method: 'POST', headers: { 'content-type': 'application/json' }, body })
  const text = await r.text()
  return { status: r.status, text, obj: parseJsonExact(text) as Record<string, unknown> }
}
const q = (start: bigint | null, end: bigint | null, worker: bigint = WORKER): string =>
  `{"worker_id":${worker},"start_event_id":${start ?? 'null'},"end_event_id":${end ?? 'null'}}`

async function complete(prompt: number[]): Promise<void> {
  const r = await fetch(url + '/v1/completions', { method: 'POST', body: JSON.stringify({ prompt, max_tokens: 1 }) })
  t.equal(r.status, 200)
  await r.text()
}

/** Decodes a list of events from the response text (u64 kept exact by parseJsonExact). */
function eventsOf(list: unknown): RouterEvent[] {
  const d = new EventDecoder()
  return (list as object[]).map((o) => {
    const ev = d.decodeString(JSON.stringify(o))
    return {
      worker_id: (BigInt(ev.workerHi) << 32n) | BigInt(ev.workerLo >>> 0),
      event: { event_id: (BigInt(ev.eventIdHi) << 32n) | BigInt(ev.eventIdLo >>> 0), dp_rank: ev.dpRank, data: 'cleared' },
    }
  })
}

t.test('before any event: a start is too new, no start is an empty dump', async (t) => {
  const a = await query(q(1n, null))
  t.equal(a.status, 200)
  t.same(a.obj, { TooNew: { requested_start: 1, requested_end: null, newest_available: 0 } })
  t.same((await query(q(null, null))).obj, { TreeDump: [] })
})

t.test('events, ranges, too new, invalid, errors', async (t) => {
  // 40 distinct two-block prompts through a 12-block pool: stores and evictions, > 16 events
  for (let i = 0; i < 40; i++) await complete([i * 10 + 1, i * 10 + 2, i * 10 + 3, i * 10 + 4, i * 10 + 5, i * 10 + 6, i * 10 + 7, i * 10 + 8])
  t.ok(events.length > 40, `${events.length} events`)
  const newest = BigInt(events.length)
  t.equal(engine.ring.newestId, newest)
  t.equal(engine.ring.oldestId, newest - 15n, 'the ring keeps the last 16 here (1,024 by default)')

  const mid = await query(q(newest - 5n, newest - 2n))
  t.equal(mid.status, 200)
  t.ok(mid.text.startsWith('{"Events":['))
  t.match(mid.text, `"worker_id":${WORKER},`, 'worker id written as an exact integer')
  const got = eventsOf(mid.obj['Events'])
  t.same(
    got.map((e) => e.event.event_id),
    [newest - 5n, newest - 4n, newest - 3n, newest - 2n],
    'original ids, consecutive, inclusive range',
  )
  t.same(
    got.map((e) => e.worker_id),
    [WORKER, WORKER, WORKER, WORKER],
  )
  // the same events as were published, byte for byte
  t.same(mid.text, encodeKvQueryResponse({ Events: events.slice(events.length - 6, events.length - 2) }))

  t.same(
    eventsOf((await query(q(newest - 1n, null))).obj['Events']).map((e) => e.event.event_id),
    [newest - 1n, newest],
    'no end: up to the newest',
  )
  t.same(
    eventsOf((await query(q(newest, newest + 50n))).obj['Events']).map((e) => e.event.event_id),
    [newest],
    'an end past the newest: what exists',
  )
  t.same((await query(q(newest + 1n, newest + 9n))).obj, {
    TooNew: { requested_start: Number(newest + 1n), requested_end: Number(newest + 9n), newest_available: Number(newest) },
  })
  t.same((await query(q(9n, 3n))).obj, { InvalidRange: { start_id: 9, end_id: 3 } })

  const other = await query(q(1n, 2n, WORKER + 1n))
  t.equal(other.status, 404)
  t.match(other.obj, { Error: /worker 9223372036854775814 is not served here/ })
  const bad = await query('{"worker_id":')
  t.equal(bad.status, 400)
  t.match(bad.obj, { Error: /not valid JSON/ })
  t.match((await query('{"worker_id":-1}')).obj, { Error: /worker_id must be an unsigned 64-bit integer/ })
  t.match((await query(`{"worker_id":"${WORKER}","start_event_id":"x"}`)).obj, { Error: /start_event_id/ })
  t.match((await query(`{"worker_id":"${WORKER}","dp_rank":1}`)).obj, { Error: /rank 0 only/ })
  t.ok('Events' in (await query(`{"worker_id":"${WORKER}","start_event_id":"${newest}","end_event_id":"${newest}"}`)).obj, 'u64s as decimal strings too')
})

t.test('a start older than the ring, or none, gives a tree dump that rebuilds the cached set', async (t) => {
  for (const body of [q(1n, 5n), q(null, null), q(null, 3n)]) {
    const r = await query(body)
    t.equal(r.status, 200)
    t.ok(r.text.startsWith('{"TreeDump":['), body)
    const list = r.obj['TreeDump'] as object[]
    const index = new KvIndex()
    const d = new EventDecoder()
    let rejected = 0
    list.forEach((o) => {
      if (index.apply(d.decodeString(JSON.stringify(o))) !== APPLY_OK) rejected++
    })
    t.equal(rejected, 0, 'parents come before children')
    t.same(
      eventsOf(list).map((e) => e.event.event_id),
      list.map((_, i) => BigInt(i)),
      'synthetic ids from 0',
    )
    const held = new Set<bigint>()
    for (const ev of index.dump())
      if (typeof ev.event.data === 'object' && 'stored' in ev.event.data) for (const b of ev.event.data.stored.blocks) held.add(b.block_hash)
    t.same(held, engine.pool.cachedBlocks(), 'the same cached set as the pool')
    t.equal(index.treeSizes()[0]?.worker_id, WORKER)
    t.equal(index.treeSizes()[0]?.tree_size, engine.pool.used)
  }
})

t.test('the ring on its own', async (t) => {
  t.throws(() => new EventRing(0), /positive integer/)
  const ring = new EventRing(2)
  const ev = (id: bigint): RouterEvent => ({
    worker_id: 1n,
    event: { event_id: id, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: id, tokens_hash: id }] } } },
  })
  ring.push(ev(5n))
  t.throws(() => ring.push(ev(7n)), /does not follow 5/)
  ring.push(ev(6n))
  ring.push(ev(7n))
  t.equal(ring.length, 2)
  t.same([ring.oldestId, ring.newestId], [6n, 7n])
  t.same(
    ring.range(6n, 7n).map((e) => e.event.event_id),
    [6n, 7n],
  )
  t.same(
    encodeKvQueryResponse({ TooNew: { requested_start: 2n ** 64n - 1n, requested_end: null, newest_available: 7n } }),
    '{"TooNew":{"requested_start":18446744073709551615,"requested_end":null,"newest_available":7}}',
  )
  t.same(encodeKvQueryResponse({ InvalidRange: { start_id: 2n ** 60n, end_id: 1n } }), `{"InvalidRange":{"start_id":${2n ** 60n},"end_id":1}}`)
})
