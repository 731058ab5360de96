// Lower-tier events from the wire into the index: a Dynamo RouterEvent of the host_pinned tier and a
// vLLM BlockStored whose medium is "CPU" are indexed in the host tier and extend the device match.
import t from 'tap'
import { pack } from 'msgpackr'
import { DynamoMsgpackDecoder } from '../../src/codec/dynamo-msgpack.js'
import { EngineStreamDecoder } from '../../src/codec/engine-stream.js'
import { DecodedEvent, StorageTier } from '../../src/codec/event-decoder.js'
import { computeBlockHashes } from '../../src/codec/hashing.js'
import { KvIndex } from '../../src/index/kv-index.js'
import { chain } from '../helpers/events.js'
import { toDecoded } from '../../src/codec/events.js'

t.test('a Dynamo RouterEvent with storage_tier host_pinned goes into the host tier', async (t) => {
  // rmp_serde::to_vec_named of RouterEvent { worker_id: 7, storage_tier: HostPinned, event: KvCacheEvent { event_id: 3,
  // data: Stored { parent_hash: Some(200), blocks: [{ block_hash: 201, tokens_hash: 2 }] }, dp_rank: 0 } }, the struct and
  // its snake_case StorageTier of lib/kv-router/src/protocols.rs (the tiered RouterEvent; older copies, e.g. @cfa22544, have no
  // storage_tier and read as device), fields named, None options left out, maps as fixmaps
  const hex =
    '83' + // RouterEvent: 3 fields
    'a9776f726b65725f6964' +
    '07' + // "worker_id": 7
    'ac73746f726167655f74696572' +
    'ab686f73745f70696e6e6564' + // "storage_tier": "host_pinned"
    'a56576656e74' +
    '83' + // "event": 3 fields
    'a86576656e745f6964' +
    '03' + // "event_id": 3
    'a464617461' +
    '81' +
    'a673746f726564' +
    '82' + // "data": {"stored": 2 fields}
    'ab706172656e745f68617368' +
    'ccc8' + // "parent_hash": 200
    'a6626c6f636b73' +
    '91' +
    '82' + // "blocks": [ 2 fields
    'aa626c6f636b5f68617368' +
    'ccc9' + // "block_hash": 201
    'ab746f6b656e735f68617368' +
    '02' + // "tokens_hash": 2 ]
    'a764705f72616e6b' +
    '00' // "dp_rank": 0
  const ev = new DynamoMsgpackDecoder().decode(Buffer.from(hex, 'hex'))
  t.equal(ev.tier, StorageTier.HostPinned)
  const ix = new KvIndex()
  // block 200 (tokens_hash 1) on the device, then its continuation in the host tier
  t.equal(
    ix.apply(
      toDecoded({
        ...chain(7, null, [2]),
        event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks: [{ block_hash: 200n, tokens_hash: 1n }] } } },
      }),
    ),
    0,
  )
  t.equal(ix.apply(ev), 0)
  t.equal(ix.liveEntries, 1)
  t.same(ix.lowerTierBlocks(), [1, 0, 0])
  const [s] = ix.overlapScores([1n, 2n, 3n])
  t.same([s?.overlap_blocks, s?.overlap_host, s?.overlap_disk], [1, 2, 2])
})

t.test('a vLLM BlockStored with medium "CPU" goes into the host tier', async (t) => {
  // cpu_event_with_full_payload_is_indexable of lib/kv-router/src/zmq_wire/tests.rs@17b173e9: block_hashes [201, 202],
  // parent 200, token_ids 10..17, block_size 4, medium "CPU" → StorageTier::HostPinned; here in vLLM's array form
  const bs = 4
  const dec = new EngineStreamDecoder(bs)
  const device = [1, 2, 3, 4]
  const host = [10, 11, 12, 13, 14, 15, 16, 17]
  const n = dec.begin(
    pack([
      1789095808.5,
      [
        ['BlockStored', [200], null, device, bs, null, 'GPU'],
        ['BlockStored', [201, 202], 200, host, bs, null, 'CPU'],
      ],
      0,
    ]),
  )
  t.equal(n, 2)
  const ix = new KvIndex()
  const tiers: number[] = []
  for (let i = 0; i < n; i++) {
    const d = new DecodedEvent()
    t.equal(dec.next(7, 0, 0, d), null)
    tiers.push(d.tier)
    t.equal(ix.apply(d), 0)
  }
  t.same(tiers, [StorageTier.Device, StorageTier.HostPinned])
  t.same(ix.lowerTierBlocks(), [2, 0, 0])
  const [s] = ix.overlapScores(computeBlockHashes([...device, ...host, 99, 99, 99, 99], bs))
  t.same([s?.overlap_blocks, s?.overlap_host, s?.overlap_disk], [1, 3, 3], 'the host blocks extend the device block')
})
