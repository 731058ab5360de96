// The indexer's answer from an overlap result: Dynamo's scores, frequencies and per-instance tier
// summary, in tokens, the group's workers only, the dp rank the registration names for a batch
// stored under the listener's rank 0.
//
// Golden: lib/kv-router/src/services/overlap.rs@5ea3d18eaab82a2b7d2e8ffae5814aaa05ee67df,
// builds_cumulative_multi_rank_mooncake_summary: worker 7, block size 16; rank 0 holds 2 device
// blocks, 1 more on host and 2 more on disk; rank 1 holds 1 device block and 1 more on disk →
// dp {"0": 32, "1": 16}, gpu 32, cpu 48, disk 80, longest_matched 80.
import t from 'tap'
import { u64Hi, u64Lo } from '../../src/codec/u64.js'
import type { OverlapResult } from '../../src/shards/pool.js'
import { internalIdOf, scoreResponse } from '../../src/indexer/registry.js'
import type { Registration } from '../../src/indexer/registry.js'

const BS = 16

function reg(instanceId: bigint, dpRank: number, group = 'default'): Registration {
  return {
    instanceId,
    dpRank,
    modelName: 'm',
    routingGroup: group,
    blockSize: BS,
    endpoint: 'tcp://127.0.0.1:1',
    replayEndpoint: null,
    internalId: internalIdOf('m', group, instanceId, dpRank),
  }
}

/** An overlap result of these rows: [registration, stored rank, device, host-cumulative, disk-cumulative]. */
function result(rows: [Registration, number, number, number | null, number | null][]): OverlapResult {
  const n = rows.length
  const r: OverlapResult = {
    count: n,
    workerIdLo: new Uint32Array(rows.map(([g]) => u64Lo(g.internalId))),
    workerIdHi: new Uint32Array(rows.map(([g]) => u64Hi(g.internalId))),
    dpRank: new Uint32Array(rows.map(([, rank]) => rank)),
    overlap: new Uint32Array(rows.map(([, , d]) => d)),
    treeSize: new Uint32Array(n).fill(10),
    recoveringShards: [],
  }
  if (rows.some(([, , , h]) => h !== null)) r.overlapHost = new Uint32Array(rows.map(([, , d, h]) => h ?? d))
  if (rows.some(([, , , , k]) => k !== null)) r.overlapDisk = new Uint32Array(rows.map(([, , d, h, k]) => k ?? h ?? d))
  return r
}

t.test("Dynamo's cumulative multi-rank summary", async (t) => {
  const r0 = reg(7n, 0)
  const r1 = reg(7n, 1)
  const members = new Map([r0, r1].map((r) => [r.internalId, r]))
  // cumulative in the result: rank 0 → 2, 2 + 1, 2 + 1 + 2; rank 1 → 1, 1, 1 + 1
  const out = scoreResponse(
    { blockSize: BS, members },
    result([
      [r0, 0, 2, 3, 5],
      [r1, 1, 1, 1, 2],
    ]),
  )
  t.same(out.instances, { '7': { longest_matched: 80, gpu: 32, dp: { '0': 32, '1': 16 }, cpu: 48, disk: 80 } })
  t.same(out.scores, { '7': { '0': 32, '1': 16 } })
  t.same(out.frequencies, [2, 1])
})

t.test('without lower tiers, cpu and disk are the device match', async (t) => {
  const r0 = reg(7n, 0)
  const out = scoreResponse({ blockSize: BS, members: new Map([[r0.internalId, r0]]) }, result([[r0, 0, 2, null, null]]))
  t.same(out.instances, { '7': { longest_matched: 32, gpu: 32, dp: { '0': 32 }, cpu: 32, disk: 32 } })
})

t.test("only the group's workers; a worker matched on disk alone is an instance, not a score", async (t) => {
  const mine = reg(5n, 2)
  const other = reg(6n, 0, 'other')
  const out = scoreResponse(
    { blockSize: BS, members: new Map([[mine.internalId, mine]]) },
    result([
      [mine, 0, 0, 0, 3],
      [other, 0, 4, 4, 4],
    ]),
  )
  t.same(out.scores, {}, 'no device match: no score')
  t.same(out.frequencies, [])
  // the batch named no rank (stored under 0): the registration's rank 2 is reported
  t.same(out.instances, { '5': { longest_matched: 48, gpu: 0, dp: { '2': 0 }, cpu: 0, disk: 48 } })
})

t.test('u64 worker ids above 2^53 are exact keys', async (t) => {
  const big = reg(18446744073709551557n, 0)
  const out = scoreResponse({ blockSize: BS, members: new Map([[big.internalId, big]]) }, result([[big, 0, 1, null, null]]))
  t.same(Object.keys(out.scores), ['18446744073709551557'])
})
