// vLLM's and SGLang's KV-event batches, built from the documented layouts (both forms, old short
// tuples, unknown keys, trailing fields), decoded into what the index applies.
import t from 'tap'
import { pack } from 'msgpackr'
import { EngineEventDecoder, EngineSkip, hashHalves, tierOf } from '../../src/codec/engine-events.js'
import { DecodedEvent, EventKind, StorageTier } from '../../src/codec/event-decoder.js'
import { computeBlockHashes, joinHalves, saltSeed, seededBlockHashesInto } from '../../src/codec/hashing.js'

const BS = 4
const tokens = [1, 2, 3, 4, 5, 6, 7, 8]
const plain = [...computeBlockHashes(tokens, BS)]

function u64(lo: Uint32Array, hi: Uint32Array, n: number): bigint[] {
  return [...joinHalves(lo, hi, n)]
}

/** Decodes a batch and converts its events for worker 7; returns [skip, event] pairs. */
function run(batch: unknown, dec = new EngineEventDecoder(BS)): { rank: number | null; out: [EngineSkip | null, DecodedEvent][] } {
  const b = dec.decodeBatch(pack(batch))
  const out: [EngineSkip | null, DecodedEvent][] = []
  for (const ev of b.events) {
    const d = new DecodedEvent()
    out.push([dec.convert(ev, 7, 0, b.dpRank ?? 0, d), d])
  }
  return { rank: b.dpRank, out }
}

function stored(d: DecodedEvent): { blocks: bigint[]; tokens: bigint[]; parent: bigint | null; tier: number } {
  return { blocks: u64(d.blockLo, d.blockHi, d.count), tokens: u64(d.tokensLo, d.tokensHi, d.count), parent: d.hasParent ? (BigInt(d.parentHi) << 32n) | BigInt(d.parentLo) : null, tier: d.tier }
}

t.test('the array form: vLLM before tagged maps, with trailing fields', async (t) => {
  const { rank, out } = run([
    1789095808.83,
    [
      ['BlockStored', [11, 12], null, tokens, BS, null, 'GPU', null, null, 0, 'full_attention', 'a field from the future'],
      ['BlockStored', [13], 12, [9, 9, 9, 9], BS, null, null],
      ['BlockRemoved', [11, 12], 'GPU', 0, 'trailing'],
      ['AllBlocksCleared', 'trailing'],
    ],
    2,
  ])
  t.equal(rank, 2)
  t.same(
    out.map((x) => x[0]),
    [null, null, null, null],
  )
  const [s0, s1, r, c] = out.map((x) => x[1]) as DecodedEvent[]
  t.same(stored(s0 as DecodedEvent), { blocks: [11n, 12n], tokens: plain, parent: null, tier: StorageTier.Device })
  t.same(stored(s1 as DecodedEvent).parent, 12n)
  t.same(stored(s1 as DecodedEvent).tokens, [...computeBlockHashes([9, 9, 9, 9], BS)])
  t.equal(r?.kind, EventKind.Removed)
  t.same(u64((r as DecodedEvent).blockLo, (r as DecodedEvent).blockHi, (r as DecodedEvent).count), [11n, 12n])
  t.equal(c?.kind, EventKind.Cleared)
  t.equal(c?.workerLo, 7)
})

t.test('the map form: defaults left out, unknown keys ignored', async (t) => {
  const { rank, out } = run([
    1.5,
    [
      {
        type: 'BlockStored',
        block_hashes: [15760518052499183552n],
        parent_block_hash: null,
        token_ids: tokens.slice(0, 4),
        block_size: BS,
        lora_id: null,
        medium: 'GPU',
        lora_name: null,
        extra_keys: [null],
        group_idx: 0,
        kv_cache_spec_kind: 'full_attention',
        locality: 'LOCAL',
        session_id: 'abc',
      },
      { type: 'BlockRemoved', block_hashes: [15760518052499183552n] },
      { type: 'AllBlocksCleared' },
    ],
  ])
  t.equal(rank, null, 'no rank: the caller gives the worker-rank its own')
  t.same(
    out.map((x) => x[0]),
    [null, null, null],
  )
  t.same(stored(out[0]?.[1] as DecodedEvent).blocks, [15760518052499183552n])
  t.same(stored(out[0]?.[1] as DecodedEvent).tokens, [plain[0]])
})

t.test('SGLang: short tuples, and the salt map of later versions', async (t) => {
  const { out } = run([
    0,
    [
      ['BlockStored', [1], null, tokens.slice(0, 4), BS, null, 'GPU'],
      ['BlockStored', [2], null, tokens.slice(0, 4), BS, null, 'GPU', { cache_salt: 'tenant-a' }],
      { type: 'BlockStored', block_hashes: [3], token_ids: tokens.slice(0, 4), block_size: BS, cache_salt: 'tenant-a' },
    ],
    0,
  ])
  t.same(stored(out[0]?.[1] as DecodedEvent).tokens, [plain[0]])
  t.same(stored(out[1]?.[1] as DecodedEvent).tokens, [5738685477468498325n], 'seeded by the salt')
  t.same(stored(out[2]?.[1] as DecodedEvent).tokens, [5738685477468498325n], 'the same salt as a map field')
})

t.test('hash values: signed and unsigned ints are the same 64 bits; bytes are their last 8 bytes', async (t) => {
  const h = new Uint32Array(2)
  const read = (v: unknown): bigint => {
    hashHalves(v, 'x', h)
    return (BigInt(h[1] as number) << 32n) | BigInt(h[0] as number)
  }
  t.equal(read(-1), 2n ** 64n - 1n)
  t.equal(read(-1n), 2n ** 64n - 1n)
  t.equal(read(2n ** 64n - 1n), 2n ** 64n - 1n)
  t.equal(read(-(2n ** 63n)), 2n ** 63n)
  t.equal(read(2 ** 53 - 1), 2n ** 53n - 1n)
  const digest = Buffer.alloc(32)
  for (let i = 0; i < 32; i++) digest[i] = i * 7 + 1
  t.equal(read(new Uint8Array(digest)), digest.readBigUInt64BE(24), 'the u64 vLLM sends as an int for the same digest')
  t.equal(read(new Uint8Array([1, 2])), 0x0102n)
  t.throws(() => read(1.5), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  t.throws(() => read(2n ** 64n), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  t.throws(() => read('12'), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
  t.throws(() => read(new Uint8Array(0)), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  // through a batch, the three spellings of one hash give one block
  const { out } = run([
    0,
    [
      ['BlockStored', [-2], null, tokens.slice(0, 4), BS, null, null],
      ['BlockStored', [2n ** 64n - 2n], null, tokens.slice(0, 4), BS, null, null],
    ],
    0,
  ])
  t.same(stored(out[0]?.[1] as DecodedEvent).blocks, stored(out[1]?.[1] as DecodedEvent).blocks)
})

t.test("a block size other than the router's is not applied; a short token list ends the run", async (t) => {
  const dec = new EngineEventDecoder(BS)
  const { out } = run(
    [
      0,
      [
        ['BlockStored', [1, 2], null, tokens, 8, null, null],
        ['BlockStored', [1, 2, 3], null, tokens.slice(0, 6), BS, null, null],
      ],
      0,
    ],
    dec,
  )
  t.equal(out[0]?.[0], EngineSkip.BlockSizeMismatch)
  t.same(dec.lastMismatch, { eventBlockSize: 8, routerBlockSize: BS })
  t.equal(out[1]?.[0], null)
  t.same(stored(out[1]?.[1] as DecodedEvent).blocks, [1n], 'only the block whose tokens all came')
})

t.test("LoRA names and cache salts seed the block hash; a continuation inherits its chain's salt", async (t) => {
  const lora = [
    ...(() => {
      const lo = new Uint32Array(2)
      const hi = new Uint32Array(2)
      seededBlockHashesInto(tokens, BS, saltSeed('my-lora', null), lo, hi)
      return joinHalves(lo, hi, 2)
    })(),
  ]
  t.same(lora, [15671544057904749233n, 7919241211032067838n])
  const dec = new EngineEventDecoder(BS)
  const { out } = run(
    [
      0,
      [
        { type: 'BlockStored', block_hashes: [1, 2], token_ids: tokens, block_size: BS, lora_name: 'my-lora', extra_keys: [['my-lora'], ['my-lora']] },
        ['BlockStored', [3, 4], null, tokens, BS, null, null, 'my-lora', [['my-lora'], ['my-lora']]],
        { type: 'BlockStored', block_hashes: [5], token_ids: tokens.slice(0, 4), block_size: BS, extra_keys: [['tenant-a']] },
        { type: 'BlockStored', block_hashes: [6], parent_block_hash: 5, token_ids: [9, 9, 9, 9], block_size: BS, extra_keys: [null] },
        { type: 'BlockStored', block_hashes: [8], token_ids: tokens.slice(0, 4), block_size: BS, extra_keys: [['dynamo-cache-salt:tenant-a']] },
      ],
      0,
    ],
    dec,
  )
  t.same(stored(out[0]?.[1] as DecodedEvent).tokens, lora, 'map form')
  t.same(stored(out[1]?.[1] as DecodedEvent).tokens, lora, 'array form')
  t.same(stored(out[2]?.[1] as DecodedEvent).tokens, [5738685477468498325n], "the salt from the first block's extra keys")
  const cont = new Uint32Array(1)
  const contHi = new Uint32Array(1)
  seededBlockHashesInto([9, 9, 9, 9], BS, saltSeed(null, 'tenant-a'), cont, contHi)
  t.same(stored(out[3]?.[1] as DecodedEvent).tokens, u64(cont, contHi, 1), 'the continuation is seeded as its parent was')
  t.same(stored(out[4]?.[1] as DecodedEvent).tokens, [5738685477468498325n], "Dynamo's marked salt")
  // removed, the parent's salt is forgotten: a later continuation of it hashes unsalted
  run([0, [{ type: 'BlockRemoved', block_hashes: [5] }], 0], dec)
  const again = run([0, [{ type: 'BlockStored', block_hashes: [7], parent_block_hash: 5, token_ids: [9, 9, 9, 9], block_size: BS }], 0], dec)
  t.same(stored(again.out[0]?.[1] as DecodedEvent).tokens, [...computeBlockHashes([9, 9, 9, 9], BS)])
})

t.test('media in a block extend its hash', async (t) => {
  const { out } = run([0, [{ type: 'BlockStored', block_hashes: [1, 2], token_ids: tokens, block_size: BS, extra_keys: [null, [['image-7', 0]]] }], 0])
  const s = stored(out[0]?.[1] as DecodedEvent)
  t.equal(s.tokens[0], plain[0], 'the block without media as usual')
  t.not(s.tokens[1], plain[1], 'the block with media differs')
  const { out: hexOut } = run([0, [{ type: 'BlockStored', block_hashes: [1], token_ids: [1, 2, 3, 4], block_size: BS, extra_keys: [[['000000000000002a' + '0'.repeat(48), 0]]] }], 0])
  t.same(stored(hexOut[0]?.[1] as DecodedEvent).tokens, [14000361058806882387n], 'a digest identifier: mm_hash 42')
})

t.test('media, tiers and attention kinds', async (t) => {
  t.equal(tierOf(undefined), StorageTier.Device)
  t.equal(tierOf(null), StorageTier.Device)
  t.equal(tierOf('GPU'), StorageTier.Device)
  t.equal(tierOf('CPU_PINNED'), StorageTier.HostPinned)
  t.equal(tierOf('CPU_TIER1'), StorageTier.HostPinned)
  t.equal(tierOf('DISK'), StorageTier.Disk)
  t.equal(tierOf('STORAGE'), StorageTier.Disk)
  t.equal(tierOf('EXTERNAL'), StorageTier.External)
  t.throws(() => tierOf(3), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
  const { out } = run([
    0,
    [
      ['BlockStored', [1], null, tokens.slice(0, 4), BS, null, 'CPU_PINNED'],
      { type: 'BlockStored', block_hashes: [1], token_ids: tokens.slice(0, 4), block_size: BS, kv_cache_spec_kind: 'sliding_window' },
      { type: 'SomethingNew', x: 1 },
    ],
    0,
  ])
  t.equal(out[0]?.[0], null)
  t.equal(out[0]?.[1].tier, StorageTier.HostPinned, 'applied as a host-tier event (the index keeps device blocks only)')
  t.equal(out[1]?.[0], EngineSkip.AttentionKind)
  t.equal(out[2]?.[0], EngineSkip.UnknownEvent)
})

t.test('bad batches and events are refused with the reason', async (t) => {
  const dec = new EngineEventDecoder(BS)
  t.throws(() => dec.decodeBatch(new Uint8Array([0x93, 0x01])), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' })
  t.throws(() => dec.decodeBatch(new Uint8Array([0xc1])), { code: /KVR_ERR_EVENT_(MALFORMED_MSGPACK|WRONG_TYPE)/ }, 'a byte MessagePack never uses')
  const whole = pack([0, [['BlockStored', [1], null, tokens, BS, null, null]], 0])
  t.throws(() => dec.decodeBatch(whole.subarray(0, whole.length - 3)), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' }, 'truncated')
  t.throws(() => dec.decodeBatch(pack('hello')), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
  t.throws(() => dec.decodeBatch(pack([0, 'not events', 0])), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
  t.throws(() => dec.decodeBatch(pack([0, [], -1])), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  t.same(dec.decodeBatch(pack({ ts: 1, events: [], data_parallel_rank: 3 })).dpRank, 3, 'a map batch')
  const d = new DecodedEvent()
  t.throws(() => dec.convert(5, 7, 0, 0, d), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
  t.throws(() => dec.convert(['BlockStored', 'x', null, tokens, BS], 7, 0, 0, d), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
  t.throws(() => dec.convert(['BlockStored', [1], null, [1, 2, -3, 4], BS], 7, 0, 0, d), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  t.throws(() => dec.convert(['BlockStored', [1], null, tokens, 0], 7, 0, 0, d), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
  t.throws(() => dec.convert([7], 7, 0, 0, d), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
})
