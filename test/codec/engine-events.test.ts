// vLLM's and SGLang's KV-event batches, built from the documented layouts (both forms, old short
// tuples, unknown keys, trailing fields), decoded into what the index applies. Every fixture runs
// against both decoders: the hand-written one the shards use (engine-stream.ts) and the msgpackr
// one it is held to (support/engine-reference-decoder.ts).
import t from 'tap'
import { pack, Packr } from 'msgpackr'
import { type EngineBatchDecoder, EngineSkip, hashHalves, tierOf } from '../../src/codec/engine-events.js'
import { EngineEventDecoder } from '../../support/engine-reference-decoder.js'
import { EngineStreamDecoder } from '../../src/codec/engine-stream.js'
import { DecodedEvent, EventKind, StorageTier } from '../../src/codec/event-decoder.js'
import { isKvrError } from '../../src/errors.js'
import { Rng } from '../helpers/rng.js'
import { computeBlockHashes, joinHalves, saltSeed, seededBlockHashesInto } from '../../src/codec/hashing.js'

const BS = 4
const tokens = [1, 2, 3, 4, 5, 6, 7, 8]
const plain = [...computeBlockHashes(tokens, BS)]

function u64(lo: Uint32Array, hi: Uint32Array, n: number): bigint[] {
  return [...joinHalves(lo, hi, n)]
}

const DECODERS: [string, (bs: number) => EngineBatchDecoder][] = [
  ['hand-written', (bs) => new EngineStreamDecoder(bs)],
  ['msgpackr', (bs) => new EngineEventDecoder(bs)],
]

function stored(d: DecodedEvent): { blocks: bigint[]; tokens: bigint[]; parent: bigint | null; tier: number } {
  return {
    blocks: u64(d.blockLo, d.blockHi, d.count),
    tokens: u64(d.tokensLo, d.tokensHi, d.count),
    parent: d.hasParent ? (BigInt(d.parentHi) << 32n) | BigInt(d.parentLo) : null,
    tier: d.tier,
  }
}

for (const [name, make] of DECODERS) {
  /** Decodes a batch and converts its events for worker 7; returns [skip, event] pairs. */
  const run = (batch: unknown, dec = make(BS)): { rank: number | null; out: [EngineSkip | null, DecodedEvent][] } => {
    const n = dec.begin(pack(batch))
    const out: [EngineSkip | null, DecodedEvent][] = []
    for (let i = 0; i < n; i++) {
      const d = new DecodedEvent()
      out.push([dec.next(7, 0, dec.batchRank ?? 0, d), d])
    }
    return { rank: dec.batchRank, out }
  }
  t.test(name, async (t) => {
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
      const dec = make(BS)
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
      const dec = make(BS)
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
      const { out: hexOut } = run([
        0,
        [{ type: 'BlockStored', block_hashes: [1], token_ids: [1, 2, 3, 4], block_size: BS, extra_keys: [[['000000000000002a' + '0'.repeat(48), 0]]] }],
        0,
      ])
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
      const dec = make(BS)
      const begin = (b: Uint8Array): number => dec.begin(b)
      /** The first event of a batch holding `ev`. */
      const one = (ev: unknown): EngineSkip | null => {
        dec.begin(pack([0, [ev], 0]))
        return dec.next(7, 0, 0, new DecodedEvent())
      }
      t.throws(() => begin(new Uint8Array([0x93, 0x01])), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' })
      t.throws(() => begin(new Uint8Array([0xc1])), { code: /KVR_ERR_EVENT_(MALFORMED_MSGPACK|WRONG_TYPE)/ }, 'a byte MessagePack never uses')
      t.throws(() => begin(new Uint8Array(0)), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' }, 'empty')
      const whole = pack([0, [['BlockStored', [1], null, tokens, BS, null, null]], 0])
      t.throws(() => begin(whole.subarray(0, whole.length - 3)), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' }, 'truncated')
      t.throws(() => begin(Buffer.concat([whole, Buffer.from([0])])), { code: 'KVR_ERR_EVENT_MALFORMED_MSGPACK' }, 'data after the batch')
      t.throws(() => begin(pack('hello')), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => begin(pack([0, 'not events', 0])), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => begin(pack(['soon', [], 0])), { code: 'KVR_ERR_EVENT_WRONG_TYPE' }, 'a timestamp that is no number')
      t.throws(() => begin(pack([0, [], -1])), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => begin(pack([0, [], 1.5])), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.equal(begin(pack({ ts: 1, events: [], data_parallel_rank: 3 })), 0)
      t.equal(dec.batchRank, 3, 'a map batch')
      begin(pack({ events: [], ts: 2, data_parallel_rank: null, attn_dp_rank: 5, later: 'x' }))
      t.equal(dec.batchRank, 5, "SGLang's attention rank, keys in any order")
      begin(pack([1.5, []]))
      t.equal(dec.batchRank, null, 'no rank at all (old vLLM)')
      t.throws(() => one(5), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one(['BlockStored', 'x', null, tokens, BS]), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one(['BlockStored', [1], null, 'x', BS]), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one(['BlockStored', [1], null, [1, 2, -3, 4], BS]), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => one(['BlockStored', [1], null, [1, 2, 2 ** 32, 4], BS]), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => one(['BlockStored', [1], null, [1, 2, 'x', 4], BS]), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => one(['BlockStored', [1], null, [1, 2, 3.5, 4], BS]), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => one(['BlockStored', [1], null, tokens, 0]), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => one({ type: 'BlockStored', block_hashes: [1], token_ids: tokens }), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' }, 'no block size')
      t.throws(() => one(['BlockStored', [1], 'p', tokens, BS]), { code: 'KVR_ERR_EVENT_WRONG_TYPE' }, 'a parent that is a string')
      t.throws(() => one(['BlockStored', [1.5], null, tokens, BS]), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => one(['BlockStored', [new Uint8Array(0)], null, tokens, BS]), { code: 'KVR_ERR_EVENT_INVALID_NUMBER' })
      t.throws(() => one({ type: 'BlockStored', block_hashes: [1], token_ids: tokens, block_size: BS, lora_name: 3 }), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one({ type: 'BlockStored', block_hashes: [1], token_ids: tokens, block_size: BS, extra_keys: 'x' }), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one({ type: 'BlockStored', block_hashes: [1], token_ids: tokens, block_size: BS, medium: 1 }), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one({ type: 'BlockRemoved', block_hashes: 1 }), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one([7]), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one([]), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.throws(() => one({ block_hashes: [1] }), { code: 'KVR_ERR_EVENT_WRONG_TYPE' }, 'a map with no type')
      t.equal(one({ type: 'BlockRemoved', block_hashes: [] }), EngineSkip.Empty)
      // a malformed event does not stop the batch's next one from being read
      t.equal(dec.begin(pack([0, [5, ['BlockRemoved', [9]]], 0])), 2)
      t.throws(() => dec.next(7, 0, 0, new DecodedEvent()), { code: 'KVR_ERR_EVENT_WRONG_TYPE' })
      t.equal(dec.next(7, 0, 0, new DecodedEvent()), null)
    })

    t.test('a batch cut anywhere is refused, whatever its form', async (t) => {
      const dec = make(BS)
      for (const batch of [
        [
          1.5,
          [
            ['BlockStored', [2n ** 64n - 1n, -5], 3, tokens, BS, null, 'GPU', 'lora', [['lora'], null]],
            ['BlockRemoved', [1], null],
          ],
          2,
        ],
        {
          ts: 1.5,
          events: [
            { type: 'BlockStored', block_hashes: [new Uint8Array(32).fill(7)], token_ids: tokens.slice(0, 4), block_size: BS, extra_keys: [[['img', 0]]] },
          ],
          data_parallel_rank: 0,
        },
      ]) {
        const whole = pack(batch)
        let refused = 0
        for (let cut = 0; cut < whole.length; cut++) {
          try {
            dec.begin(whole.subarray(0, cut))
          } catch (err) {
            if ((err as { code?: string }).code === 'KVR_ERR_EVENT_MALFORMED_MSGPACK' || (err as { code?: string }).code === 'KVR_ERR_EVENT_WRONG_TYPE')
              refused++
          }
        }
        t.equal(refused, whole.length, 'every prefix refused before an event is read')
      }
    })

    t.test('integers of every width and sign, tokens included', async (t) => {
      // msgpack writes each int in its smallest form: these cover fixint, (u)int8/16/32/64, negative fixint
      const hashes = [0, 5, 200, 60000, 2 ** 31, 2 ** 32 + 7, 2n ** 63n, 2n ** 64n - 1n, -1, -100, -30000, -(2 ** 31), -(2n ** 63n)]
      const want = hashes.map((h) => BigInt.asUintN(64, BigInt(h)))
      const toks = [0, 1, 127, 128, 255, 256, 65535, 65536, 2 ** 32 - 1, 7, 8, 9]
      const { out } = run([
        0,
        [
          ['BlockStored', hashes.slice(0, 3), null, toks, BS, null, null],
          ['BlockRemoved', hashes],
        ],
        0,
      ])
      t.equal(out[0]?.[0], null)
      t.same(stored(out[0]?.[1] as DecodedEvent).tokens, [...computeBlockHashes(toks, BS)])
      const r = out[1]?.[1] as DecodedEvent
      t.same(u64(r.blockLo, r.blockHi, r.count), want)
      // a packer that writes every float as float64 and ints as floats where it can
      const floats = new Packr({ useRecords: false, useFloat32: 0 })
      const dec = make(BS)
      const n = dec.begin(floats.pack([1.25, [['BlockStored', [3], null, [1, 2, 3, 4], 4.0, null, null]], 0]))
      const d = new DecodedEvent()
      t.equal(n, 1)
      t.equal(dec.next(7, 0, 0, d), null)
      t.same(stored(d).tokens, [plain[0]])
    })

    t.test('each medium names its tier', async (t) => {
      const media: [unknown, number][] = [
        [null, StorageTier.Device],
        ['GPU', StorageTier.Device],
        ['cuda', StorageTier.Device],
        ['CPU', StorageTier.HostPinned],
        ['CPU_PINNED', StorageTier.HostPinned],
        ['HOST', StorageTier.HostPinned],
        ['DISK', StorageTier.Disk],
        ['NVME', StorageTier.Disk],
        ['STORAGE', StorageTier.Disk],
        ['S3', StorageTier.External],
      ]
      for (const form of ['array', 'map'] as const) {
        const events = media.map(([m]) =>
          form === 'array'
            ? ['BlockStored', [1], null, tokens.slice(0, 4), BS, null, m]
            : { type: 'BlockStored', block_hashes: [1], token_ids: tokens.slice(0, 4), block_size: BS, medium: m },
        )
        const removed = media.map(([m]) => (form === 'array' ? ['BlockRemoved', [1], m] : { type: 'BlockRemoved', block_hashes: [1], medium: m }))
        const { out } = run([0, [...events, ...removed], 0])
        t.same(
          out.map((x) => x[1].tier),
          [...media, ...media].map((x) => x[1]),
          form,
        )
      }
      const { out } = run([0, [{ type: 'BlockStored', block_hashes: [1], token_ids: tokens.slice(0, 4), block_size: BS }], 0])
      t.equal(out[0]?.[1].tier, StorageTier.Device, 'absent: the device')
    })

    t.test('unknown keys of every kind, and a map in the 8th place of a stored array', async (t) => {
      const { out } = run([
        0,
        [
          {
            extra: { nested: [1, { x: new Uint8Array(3) }] },
            type: 'BlockStored',
            7: 'int key',
            block_size: BS,
            token_ids: tokens.slice(0, 4),
            block_hashes: [4],
            big: 2n ** 64n - 1n,
            f: 1.5,
          },
          ['BlockStored', [5], null, tokens.slice(0, 4), BS, 9, 'GPU', { cache_salt: null, other: 1 }, null, 0, 'full_attention', { future: true }],
          ['BlockStored', [6], null, tokens.slice(0, 4), BS, null, 'GPU', 42],
        ],
        0,
      ])
      t.same(
        out.map((x) => x[0]),
        [null, null, null],
      )
      for (const [, d] of out) t.same(stored(d).tokens, [plain[0]])
    })
  })
}

t.test('the two decoders agree on random batches of both forms', async (t) => {
  const rng = new Rng(17)
  const hand = new EngineStreamDecoder(BS)
  const ref = new EngineEventDecoder(BS)
  const pick = <T>(xs: readonly T[]): T => rng.pick(xs as T[])
  let compared = 0
  for (let b = 0; b < 300; b++) {
    const events: unknown[] = []
    for (let e = 0; e < 1 + rng.int(6); e++) {
      const n = 1 + rng.int(4)
      const hashes = Array.from({ length: n }, () =>
        pick<unknown>([rng.int(1000), -1 - rng.int(1000), 2n ** 64n - BigInt(1 + rng.int(9)), new Uint8Array(32).fill(rng.int(256))]),
      )
      const toks = Array.from({ length: n * BS - (rng.next() < 0.2 ? 1 : 0) }, () => pick([rng.int(128), rng.int(70000), 2 ** 32 - 1 - rng.int(5)]))
      const lora = pick([null, 'my-lora', ''])
      const extra = pick<unknown>([
        null,
        undefined,
        Array.from({ length: n }, () => null),
        [['tenant-a']],
        [null, [['img-1', 0]]],
        [['dynamo-cache-salt:t'], null],
      ])
      const parent = pick<unknown>([null, undefined, rng.int(1000)])
      const medium = pick([null, 'GPU', 'CPU', 'DISK'])
      const kind = pick([null, 'full_attention', 'sliding_window'])
      const bs = pick([BS, BS, BS, BS * 2])
      const r = rng.next()
      if (r < 0.5) {
        if (rng.next() < 0.5) events.push(['BlockStored', hashes, parent ?? null, toks, bs, null, medium, lora, extra ?? null, 0, kind, 'trailing'])
        else {
          const m: Record<string, unknown> = { type: 'BlockStored', block_hashes: hashes, token_ids: toks, block_size: bs, unknown: [1, 2] }
          if (parent !== undefined) m.parent_block_hash = parent
          if (medium !== null) m.medium = medium
          if (lora !== null) m.lora_name = lora
          if (extra !== undefined) m.extra_keys = extra
          if (kind !== null) m.kv_cache_spec_kind = kind
          if (rng.next() < 0.2) m.cache_salt = 'tenant-b'
          events.push(m)
        }
      } else if (r < 0.85) events.push(rng.next() < 0.5 ? ['BlockRemoved', hashes, medium] : { type: 'BlockRemoved', block_hashes: hashes, medium })
      else if (r < 0.95) events.push(rng.next() < 0.5 ? ['AllBlocksCleared'] : { type: 'AllBlocksCleared' })
      else events.push({ type: 'Other' })
    }
    const bytes = pack(rng.next() < 0.5 ? [rng.next(), events, rng.int(3)] : { ts: rng.next(), events, data_parallel_rank: rng.int(3) })
    const n = hand.begin(bytes)
    t.equal(ref.begin(bytes), n)
    t.equal(hand.batchRank, ref.batchRank)
    for (let i = 0; i < n; i++) {
      const a = new DecodedEvent()
      const c = new DecodedEvent()
      const sa = hand.next(7, 0, hand.batchRank ?? 0, a)
      const sc = ref.next(7, 0, ref.batchRank ?? 0, c)
      if (sa !== sc || a.kind !== c.kind || a.tier !== c.tier || a.count !== c.count || a.hasParent !== c.hasParent || a.parentLo !== c.parentLo) {
        t.fail(`batch ${b} event ${i} differs: ${sa} ${sc}`)
        return
      }
      if (sa === null && a.kind !== EventKind.Cleared) {
        const x = a.kind === EventKind.Stored ? stored(a) : u64(a.blockLo, a.blockHi, a.count)
        const y = c.kind === EventKind.Stored ? stored(c) : u64(c.blockLo, c.blockHi, c.count)
        if (
          JSON.stringify(x, (_k, v) => (typeof v === 'bigint' ? v.toString() : v)) !== JSON.stringify(y, (_k, v) => (typeof v === 'bigint' ? v.toString() : v))
        ) {
          t.fail(`batch ${b} event ${i}: blocks differ`)
          return
        }
      }
      compared++
    }
  }
  t.ok(compared > 500, `${compared} events compared`)
})

t.test('bytes changed at random: the shards’ decoder refuses with a KvrError, never anything else', async (t) => {
  const rng = new Rng(23)
  const dec = new EngineStreamDecoder(BS)
  const seeds = [
    pack([
      1.5,
      [
        ['BlockStored', [2n ** 64n - 1n, -5, 7], 3, [...tokens, 9, 9, 9, 70000], BS, null, 'GPU', 'lora', [['lora'], null, [['img', 0]]], 0, 'full_attention'],
        ['BlockRemoved', [1, 2], 'CPU'],
      ],
      2,
    ]),
    pack({
      ts: 1.5,
      events: [
        { type: 'BlockStored', block_hashes: [new Uint8Array(32).fill(7), 3], token_ids: tokens, block_size: BS, cache_salt: 's', extra_keys: [null, null] },
        { type: 'AllBlocksCleared' },
      ],
      data_parallel_rank: 0,
    }),
  ]
  let refused = 0
  let other = 0
  for (let i = 0; i < 20_000; i++) {
    const b = Uint8Array.from(rng.pick(seeds))
    for (let k = 0; k < 1 + rng.int(3); k++) b[rng.int(b.length)] = rng.int(256)
    try {
      const n = dec.begin(b)
      for (let e = 0; e < n; e++) dec.next(7, 0, dec.batchRank ?? 0, new DecodedEvent())
    } catch (err) {
      if (isKvrError(err)) refused++
      else other++
    }
  }
  t.equal(other, 0, 'no other error')
  t.ok(refused > 1000, `${refused} refused`)
})
