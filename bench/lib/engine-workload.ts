// An engine's KV events as vLLM publishes them, for bench:zmq: requests that share system
// prompts (a prefix cache), each storing the blocks it computed as one chain (BlockStored with
// the prefix's last block as parent), and the oldest requests' blocks evicted leaf first
// (BlockRemoved) once the cache holds its capacity. 16-token blocks, token ids over a 150k
// vocabulary, u64 block hashes as vLLM's int hashes are. The same events come as vLLM's map-form
// and array-form batches and as the RouterEvent JSON the router's other intakes take (with the
// tokens_hash the engine path computes in the shard).
import { Packr } from 'msgpackr'
import { computeBlockHashes } from '../../src/codec/hashing.js'
import { encodeRouterEvent, type RouterEvent } from '../../src/codec/events.js'

export interface EngineWorkloadOptions {
  /** Block operations (stored + removed blocks) to generate, at least. */
  blockOps: number
  blockSize?: number
  eventsPerBatch?: number
  /** Blocks the engine caches before it evicts. */
  capacity?: number
  workerId?: bigint
  seed?: number
}

export interface EngineWorkload {
  mapBatches: Uint8Array[]
  arrayBatches: Uint8Array[]
  /** One RouterEvent JSON message per event, event ids from 1. */
  json: Uint8Array[]
  events: number
  blockOps: number
  storedBlocks: number
  removedBlocks: number
}

function rng(seed: number): () => number {
  let s = seed >>> 0
  return () => {
    s = (s + 0x6d2b79f5) >>> 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

interface Ev {
  stored: boolean
  hashes: bigint[]
  parent: bigint | null
  tokens: number[]
}

export function buildEngineWorkload(o: EngineWorkloadOptions): EngineWorkload {
  const bs = o.blockSize ?? 16
  const perBatch = o.eventsPerBatch ?? 16
  const capacity = o.capacity ?? 50_000
  const workerId = o.workerId ?? 1n
  const rand = rng(o.seed ?? 42)
  const int = (n: number): number => Math.floor(rand() * n)
  const hash = (): bigint => (BigInt(int(2 ** 32)) << 32n) | BigInt(int(2 ** 32))
  const tokens = (blocks: number): number[] => Array.from({ length: blocks * bs }, () => int(150_000))
  const prefixes = Array.from({ length: 32 }, () => {
    const n = 4 + int(28)
    return { hashes: Array.from({ length: n }, hash), tokens: tokens(n), stored: false }
  })
  const events: Ev[] = []
  const live: bigint[][] = []
  let cached = 0
  let ops = 0
  let storedBlocks = 0
  let removedBlocks = 0
  while (ops < o.blockOps) {
    const p = rand() < 0.8 ? (prefixes[int(prefixes.length)] as (typeof prefixes)[number]) : null
    if (p !== null && !p.stored) {
      p.stored = true
      events.push({ stored: true, hashes: p.hashes, parent: null, tokens: p.tokens })
      ops += p.hashes.length
      storedBlocks += p.hashes.length
    }
    const n = 2 + int(23)
    const own = Array.from({ length: n }, hash)
    events.push({ stored: true, hashes: own, parent: p === null ? null : (p.hashes[p.hashes.length - 1] as bigint), tokens: tokens(n) })
    live.push(own)
    cached += n
    ops += n
    storedBlocks += n
    while (cached > capacity) {
      const old = live.shift() as bigint[]
      events.push({ stored: false, hashes: [...old].reverse(), parent: null, tokens: [] })
      cached -= old.length
      ops += old.length
      removedBlocks += old.length
    }
  }
  const packr = new Packr({ useRecords: false, variableMapSize: true })
  const mapBatches: Uint8Array[] = []
  const arrayBatches: Uint8Array[] = []
  for (let i = 0; i < events.length; i += perBatch) {
    const slice = events.slice(i, i + perBatch)
    const ts = 1789095808.83 + i / 1000
    mapBatches.push(
      packr.pack([
        ts,
        slice.map((e) =>
          e.stored
            ? {
                type: 'BlockStored',
                block_hashes: e.hashes,
                parent_block_hash: e.parent,
                token_ids: e.tokens,
                block_size: bs,
                lora_id: null,
                medium: 'GPU',
                lora_name: null,
                extra_keys: e.hashes.map(() => null),
                group_idx: 0,
                kv_cache_spec_kind: 'full_attention',
              }
            : { type: 'BlockRemoved', block_hashes: e.hashes, medium: 'GPU', group_idx: 0 },
        ),
        0,
      ]),
    )
    arrayBatches.push(
      packr.pack([
        ts,
        slice.map((e) =>
          e.stored ? ['BlockStored', e.hashes, e.parent, e.tokens, bs, null, 'GPU', null, null, 0, 'full_attention'] : ['BlockRemoved', e.hashes, 'GPU', 0],
        ),
        0,
      ]),
    )
  }
  const json = events.map((e, i) => {
    const ev: RouterEvent = {
      worker_id: workerId,
      event: {
        event_id: BigInt(i + 1),
        dp_rank: 0,
        data: e.stored
          ? {
              stored: {
                parent_hash: e.parent,
                blocks: [...computeBlockHashes(e.tokens, bs)].map((t, k) => ({ block_hash: e.hashes[k] as bigint, tokens_hash: t })),
              },
            }
          : { removed: { block_hashes: e.hashes } },
      },
    }
    return Buffer.from(encodeRouterEvent(ev))
  })
  return { mapBatches, arrayBatches, json, events: events.length, blockOps: ops, storedBlocks, removedBlocks }
}
