// The remote-index client's wire parts: the /query_by_hash body (local hashes as i64), the
// /register bodies, and the answer read into an OverlapResult in blocks, without losing worker
// ids above 2^53. The golden answers are built as Dynamo's standalone indexer builds them:
// build_score_response in lib/kv-router/src/services/indexer/server.rs@8f8e8e322cacedb0763692dac2b26797b660eef2
// (scores: worker id → dp rank → device TOKENS, i.e. blocks × block_size, keys as decimal
// strings) and MooncakeOverlapSummary in lib/kv-router/src/services/overlap.rs@5ea3d18eaab82a2b7d2e8ffae5814aaa05ee67df
// (its test builds_cumulative_multi_rank_mooncake_summary: worker 7, block size 16, dp {0: 32, 1: 16},
// gpu 32, cpu 48, disk 80, longest_matched 80; cpu and disk cumulative).
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { waitUntil } from '../helpers/wait.js'
import { parseIndexerAnswer, queryByHashBody, RemoteIndexer, registerBodies, u64Text } from '../../src/transport/remote-indexer.js'

function idOf(r: { workerIdLo: Uint32Array; workerIdHi: Uint32Array }, i: number): bigint {
  return (BigInt(r.workerIdHi[i] as number) << 32n) | BigInt(r.workerIdLo[i] as number)
}

t.test('u64Text: decimal of u64 halves, unsigned and as i64', async (t) => {
  const cases: bigint[] = [
    0n,
    1n,
    999_999n,
    1_000_000n,
    2n ** 32n - 1n,
    2n ** 32n,
    2n ** 53n + 1n,
    2n ** 63n - 1n,
    2n ** 63n,
    2n ** 64n - 1n,
    0xdeadbeefcafebaben,
  ]
  for (const v of cases) {
    const lo = Number(v & 0xffffffffn)
    const hi = Number(v >> 32n)
    t.equal(u64Text(lo, hi, false), v.toString(), `unsigned ${v}`)
    t.equal(u64Text(lo, hi, true), BigInt.asIntN(64, v).toString(), `signed ${v}`)
  }
})

t.test('the query_by_hash body carries local hashes as i64, as Dynamo deserializes Vec<i64>', async (t) => {
  const hashes = [5n, 2n ** 63n, 2n ** 64n - 1n]
  const lo = Uint32Array.from(hashes, (h) => Number(h & 0xffffffffn))
  const hi = Uint32Array.from(hashes, (h) => Number(h >> 32n))
  const body = queryByHashBody(lo, hi, 3, 'llama', 'default')
  t.equal(body, '{"block_hashes":[5,-9223372036854775808,-1],"model_name":"llama","routing_group":"default"}')
  // the server maps each back with `*h as u64`
  const back = [...body.matchAll(/-?\d+/g)].slice(0, 3).map((m) => BigInt.asUintN(64, BigInt(m[0])))
  t.same(back, hashes)
  t.equal(queryByHashBody(lo, hi, 1, 'm', 'g'), '{"block_hashes":[5],"model_name":"m","routing_group":"g"}', 'only the first n')
})

t.test('register bodies: one per dp rank, ports offset per rank, instance id written whole', async (t) => {
  const id = 2n ** 64n - 59n
  const bodies = registerBodies(
    { id, dpRanks: 2, kvEvents: { endpoint: 'tcp://10.0.0.5:5557', replay: 'tcp://10.0.0.5:5600', topic: '' } },
    'llama',
    'default',
    16,
  )
  const common = '"model_name":"llama","routing_group":"default","block_size":16'
  t.same(bodies, [
    `{"instance_id":${id},"endpoint":"tcp://10.0.0.5:5557",${common},"dp_rank":0,"replay_endpoint":"tcp://10.0.0.5:5600"}`,
    `{"instance_id":${id},"endpoint":"tcp://10.0.0.5:5558",${common},"dp_rank":1,"replay_endpoint":"tcp://10.0.0.5:5601"}`,
  ])
  const none = registerBodies({ id: 3n, dpRanks: 1, kvEvents: { endpoint: 'tcp://h:1', replay: null, topic: '' } }, 'm', 'default', 32)
  t.same(
    none,
    ['{"instance_id":3,"endpoint":"tcp://h:1","model_name":"m","routing_group":"default","block_size":32,"dp_rank":0}'],
    'no replay endpoint: none sent',
  )
})

t.test("Dynamo's multi-rank tiered summary (overlap.rs test): tokens to blocks, lower tiers on no rank", async (t) => {
  const golden =
    '{"scores":{"7":{"0":32,"1":16}},"frequencies":[2,1],' + '"instances":{"7":{"longest_matched":80,"gpu":32,"dp":{"0":32,"1":16},"cpu":48,"disk":80}}}'
  const r = parseIndexerAnswer(golden, 16)
  if (r === null) throw new Error('parsed null')
  t.equal(r.count, 2)
  const byRank = new Map<number, number>()
  for (let i = 0; i < r.count; i++) {
    t.equal(idOf(r, i), 7n)
    byRank.set(r.dpRank[i] as number, r.overlap[i] as number)
  }
  t.same(
    [...byRank].sort(),
    [
      [0, 2],
      [1, 1],
    ],
    'device tokens 32 and 16 at block size 16 are 2 and 1 blocks',
  )
  // a worker of several ranks: the answer does not say which rank holds cpu/disk, so none gets more than its device overlap
  t.equal(r.overlapHost, undefined)
})

t.test('one rank: its worker summary gives the cumulative host and disk overlaps; an id above 2^53 is exact', async (t) => {
  const big = '18446744073709551557' // 2^64 - 59
  const near = '9007199254740993' // 2^53 + 1: JSON.parse of a number would make it ...992
  const golden =
    `{"scores":{"${big}":{"0":48},"${near}":{"3":16}},"frequencies":[2,2,1],` +
    `"instances":{"${big}":{"longest_matched":80,"gpu":48,"dp":{"0":48},"cpu":64,"disk":80},` +
    `"${near}":{"longest_matched":16,"gpu":16,"dp":{"3":16},"cpu":16,"disk":16},` +
    '"12":{"longest_matched":32,"gpu":0,"dp":{"0":0},"cpu":32,"disk":32}}}'
  const r = parseIndexerAnswer(golden, 16)
  if (r === null) throw new Error('parsed null')
  const rows = new Map<string, [number, number, number, number]>()
  for (let i = 0; i < r.count; i++)
    rows.set(idOf(r, i).toString(), [r.dpRank[i] as number, r.overlap[i] as number, r.overlapHost?.[i] as number, r.overlapDisk?.[i] as number])
  t.same(rows.get(big), [0, 3, 4, 5], '2^64-59: 3 device blocks, 4 through host, 5 through disk')
  t.same(rows.get(near), [3, 1, 1, 1], '2^53+1 keeps its last digit; dp rank 3')
  t.same(rows.get('12'), [0, 0, 2, 2], 'matched on the host tier only: device 0, host 2')
  t.equal(r.count, 3)
})

t.test('empty and malformed answers', async (t) => {
  const empty = parseIndexerAnswer('{"scores":{},"frequencies":[],"instances":{}}', 16)
  t.equal(empty?.count, 0, 'no match: an empty result')
  t.equal(parseIndexerAnswer('{"scores":{"1":{"0":0}},"frequencies":[],"instances":{}}', 16)?.count, 0, 'zero overlap is left out')
  t.equal(parseIndexerAnswer('not json', 16), null)
  t.equal(parseIndexerAnswer('[]', 16), null)
  t.equal(parseIndexerAnswer('{"scores":[]}', 16), null)
  t.equal(parseIndexerAnswer('{"scores":{"x":{"0":16}}}', 16), null, 'a worker id that is no u64')
  t.equal(parseIndexerAnswer('{"scores":{"1":{"-1":16}}}', 16), null, 'a dp rank that is no u32')
  t.equal(parseIndexerAnswer('{"scores":{"18446744073709551616":{"0":16}}}', 16), null, '2^64 is no u64')
  const legacy = parseIndexerAnswer('{"scores":{"5":{"0":64}},"frequencies":[1],"tree_sizes":{"5":{"0":10}}}', 32)
  t.equal(legacy?.overlap[0], 2, 'an older answer without instances: scores alone')
})

t.test('a late answer is a busy indexer: the next query asks it again; three late in a row skip it for its backoff', async (t) => {
  let delayMs = 60
  let queries = 0
  const srv = createServer((req, res) => {
    if (req.url === '/health') return res.end()
    queries++
    req.resume()
    req.on('end', () => {
      setTimeout(() => {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end('{"scores":{"7":{"0":32}},"frequencies":[1,1],"instances":{}}')
      }, delayMs)
    })
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => srv.close(() => r())))
  const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`
  const ri = new RemoteIndexer({ urls: [url], timeoutMs: 20, modelName: 'm', blockSize: 16, backoffMs: 60_000 })
  t.teardown(() => ri.close())
  const lo = new Uint32Array([1, 2])
  const hi = new Uint32Array([0, 0])
  t.equal(await ri.query(lo, hi, 2), null, 'past the deadline: no answer')
  t.equal(await ri.query(lo, hi, 2), null)
  t.same([ri.counts.timeout, ri.counts.unavailable], [2, 0], 'each late query was sent: the indexer is not skipped')
  // the server may see the second one a moment after the client gave up on it
  await waitUntil('the indexer got both', () => queries === 2, 2000)
  t.equal(await ri.query(lo, hi, 2), null)
  t.equal(await ri.query(lo, hi, 2), null)
  t.same([ri.counts.timeout, ri.counts.unavailable], [3, 1], 'the third late one in a row: skipped for its backoff')
  await waitUntil('the indexer got the third', () => queries === 3, 2000)
  await new Promise((r) => setTimeout(r, 50))
  t.equal(queries, 3, 'and not the fourth')
  const fresh = new RemoteIndexer({ urls: [url], timeoutMs: 20, modelName: 'm', blockSize: 16, backoffMs: 60_000 })
  t.teardown(() => fresh.close())
  delayMs = 60
  t.equal(await fresh.query(lo, hi, 2), null)
  delayMs = 0
  const r = await fresh.query(lo, hi, 2)
  t.equal(r?.count, 1, 'in time: the answer')
  t.equal(r?.overlap[0], 2, '32 tokens of block 16')
  delayMs = 60
  t.equal(await fresh.query(lo, hi, 2), null)
  t.equal(await fresh.query(lo, hi, 2), null)
  t.equal(fresh.counts.unavailable, 0, 'an answer in time starts the count again')
})
