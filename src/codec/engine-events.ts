// vLLM's and SGLang's own KV events (MessagePack over ZMQ): the rules that turn them into the
// index's DecodedEvent, shared by the decoder the shards run (engine-stream.ts) and the reference
// decoder it is held to (support/engine-reference-decoder.ts).
//
// A batch is `[ts, events, data_parallel_rank]` (the rank is missing in old vLLM; a map with those
// keys is taken too). Each event is a tagged struct in one of two forms, both in the field:
//   arrays  ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//           lora_name, extra_keys, group_idx, kv_cache_spec_kind, …]   (vLLM before PR #42892;
//           SGLang's short tuples end at medium, SGLang ≥ 0.5.18 may add a {cache_salt} map)
//           ["BlockRemoved", block_hashes, medium, group_idx, …]   ["AllBlocksCleared", …]
//   maps    {"type": "BlockStored", "block_hashes": …, …}   (vLLM since PR #42892, merged
//           2026-06; SGLang since PR #37482), defaults left out
// Unknown keys and trailing elements are ignored, as msgspec does. Layouts as in vLLM's
// vllm/distributed/kv_events.py and SGLang's kv_events.py of late 2026.
//
// What the router makes of them, as Dynamo 1.4.0's engine listener does:
// - block hashes are the engine's, as u64: an int (signed or unsigned, the same 64 bits), or
//   bytes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: a sha256 digest), of which the last 8
//   bytes read big-endian are the u64, which is the int vLLM sends for the same digest otherwise;
// - tokens_hash is computed here from the block's token ids, seeded by the LoRA name and cache
//   salt and extended by the block's media (src/codec/hashing.ts);
// - a block size other than the router's hashes other token runs than the router's prompts: such
//   an event is not applied (counted);
// - medium names the tier (absent or GPU = device, the only one routed on);
// - attention groups other than full attention (sliding windows) do not hold whole prefixes and
//   are not applied.
import { KvrError } from '../errors.js'
import { type DecodedEvent, StorageTier } from './event-decoder.js'
import { mmBlockHashInto, mmHashOf, saltSeed, seededBlockHashesInto, XXH3_SEED } from './hashing.js'

/** Why an engine event was not applied, for the drop counters. */
export const EngineSkip = {
  BlockSizeMismatch: 'block_size_mismatch',
  AttentionKind: 'attention_kind',
  UnknownEvent: 'unknown_event',
  Empty: 'empty',
} as const
export type EngineSkip = (typeof EngineSkip)[keyof typeof EngineSkip]

const TWO32 = 4294967296
/** Cache-salt strings Dynamo's own publishers mark with this prefix in extra_keys. */
const SALT_PREFIX = 'dynamo-cache-salt:'
/** kv_cache_spec_kind values whose blocks chain whole prefixes. */
export const PREFIX_KINDS = new Set(['full_attention', 'mla_attention', 'sink_full_attention'])
/** Salted chains remembered per decoder, so a continuation without the salt still gets its seed. */
const MAX_SALTED_BLOCKS = 1 << 20

/** The storage tier a `medium` names. */
export function tierOf(medium: unknown): number {
  if (medium === null || medium === undefined) return StorageTier.Device
  if (typeof medium !== 'string') throw wrongType('medium', 'a string or null', medium)
  const m = medium.toUpperCase()
  if (m === 'GPU' || m === 'DEVICE' || m === 'CUDA' || m === 'HBM') return StorageTier.Device
  if (m.startsWith('CPU') || m === 'HOST' || m === 'HOST_PINNED') return StorageTier.HostPinned
  if (m === 'DISK' || m === 'NVME' || m === 'STORAGE' || m === 'SSD') return StorageTier.Disk
  return StorageTier.External
}

export function wrongType(field: string, want: string, got: unknown): KvrError {
  const kind = got === null ? 'null' : Array.isArray(got) ? 'an array' : got instanceof Uint8Array ? 'bytes' : typeof got
  return new KvrError('KVR_ERR_EVENT_WRONG_TYPE', `${field} must be ${want}, got ${kind}`)
}

/**
 * Reads one engine block hash as u64 halves into out[0] (low) and out[1] (high).
 */
export function hashHalves(v: unknown, field: string, out: Uint32Array): void {
  if (typeof v === 'number') {
    if (!Number.isInteger(v)) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} must be an integer, got ${v}`)
    if (v >= 0 && v < 2 ** 53) {
      out[0] = v >>> 0
      out[1] = Math.floor(v / TWO32)
      return
    }
    // a negative i64 (or a float msgpack would not send for an int): two's complement bits
    return hashHalves(BigInt(v), field, out)
  }
  if (typeof v === 'bigint') {
    if (v < -(1n << 63n) || v >= 1n << 64n) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} does not fit 64 bits`)
    const u = BigInt.asUintN(64, v)
    out[0] = Number(u & 0xffffffffn)
    out[1] = Number(u >> 32n)
    return
  }
  if (v instanceof Uint8Array) {
    if (v.length === 0) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `${field} is empty bytes`)
    // the last 8 bytes, big-endian (fewer: right-aligned)
    let hi = 0
    let lo = 0
    const from = Math.max(0, v.length - 8)
    for (let i = from; i < v.length; i++) {
      hi = ((hi << 8) | (lo >>> 24)) >>> 0
      lo = ((lo << 8) | (v[i] as number)) >>> 0
    }
    out[0] = lo
    out[1] = hi
    return
  }
  throw wrongType(field, 'an integer or bytes', v)
}

export function arrayField(v: unknown, field: string): readonly unknown[] {
  if (!Array.isArray(v)) throw wrongType(field, 'an array', v)
  return v
}

export function optString(v: unknown, field: string): string | null {
  if (v === null || v === undefined) return null
  if (typeof v !== 'string') throw wrongType(field, 'a string or null', v)
  return v === '' ? null : v
}

/**
 * A decoder of engine batches as the shard drives it: begin() reads a batch's frame (and checks
 * all of it is well-formed MessagePack), then next() converts its events one at a time into a
 * DecodedEvent. Both throw KvrError on bad input. Per worker-rank state (salted chains) lives in
 * the decoder, so one worker's batches must always reach the same decoder.
 */
export interface EngineBatchDecoder {
  /** Set by the last stored event refused for its block size. */
  readonly lastMismatch: { eventBlockSize: number; routerBlockSize: number } | null
  /** Reads a batch; returns the number of its events. */
  begin(payload: Uint8Array): number
  /** The batch's own data-parallel rank, null when it names none. */
  readonly batchRank: number | null
  /** The next event of the batch into `out`: null when it is to be applied, else why not. */
  next(workerLo: number, workerHi: number, dpRank: number, out: DecodedEvent): EngineSkip | null
  /** Forgets a worker-rank's salted chains (its engine restarted). */
  forgetRank(workerLo: number, workerHi: number, dpRank: number): void
  /** Forgets the salted chains of every rank of a worker. */
  forgetWorker(workerLo: number, workerHi: number): void
}

/** What every engine decoder shares: the rules that turn a stored block's tokens into its tokens_hash. */
export abstract class EngineDecoderBase {
  /** Events not applied, by reason (counted by whoever drives the decoder). */
  readonly skipped: Record<EngineSkip, number> = { block_size_mismatch: 0, attention_kind: 0, unknown_event: 0, empty: 0 }
  /** Block-size mismatches by (event's, router's) size, for a bounded number of warnings. */
  lastMismatch: { eventBlockSize: number; routerBlockSize: number } | null = null
  protected tokenWords = new Uint32Array(1024)
  private readonly mmOut = new Uint32Array(2)
  /** Per worker-rank, the seed of each salted block seen, for continuations that do not repeat the salt. */
  private readonly salted = new Map<string, Map<bigint, bigint>>()
  protected saltedCount = 0

  constructor(protected readonly blockSize: number) {}

  protected mismatch(bs: number): EngineSkip {
    this.lastMismatch = { eventBlockSize: bs, routerBlockSize: this.blockSize }
    return EngineSkip.BlockSizeMismatch
  }

  /** tokenWords, at least `words` long. */
  protected words(words: number): Uint32Array {
    if (this.tokenWords.length < words) this.tokenWords = new Uint32Array(Math.max(words, this.tokenWords.length * 2))
    return this.tokenWords
  }

  /**
   * The tokens_hash of out's `n` blocks from tokenWords (n × block size ids), seeded by the LoRA
   * name and cache salt (or the salt its parent's chain had), extended by the blocks' media.
   */
  protected hashBlocks(out: DecodedEvent, n: number, loraName: string | null, cacheSalt: string | null, extra: readonly unknown[] | null): void {
    const bs = this.blockSize
    const salt = cacheSalt ?? saltIn(extra, loraName)
    let seed = salt !== null || loraName !== null ? saltSeed(loraName, salt) : XXH3_SEED
    // a continuation of a salted chain carries no salt of its own: it inherits its parent's seed
    if (salt === null && out.hasParent && this.saltedCount > 0) seed = this.inherited(out, seed)
    const tw = this.tokenWords
    seededBlockHashesInto(tw.subarray(0, n * bs), bs, seed, out.tokensLo, out.tokensHi)
    if (extra !== null) this.mediaHashes(extra, tw, bs, n, seed, out)
    out.count = n
    if (seed !== XXH3_SEED) this.rememberSalted(out, seed)
  }

  /** Re-hashes the blocks that hold media: their tokens, then their media hashes. */
  private mediaHashes(extra: readonly unknown[], tokens: Uint32Array, bs: number, n: number, seed: bigint, out: DecodedEvent): void {
    for (let i = 0; i < n && i < extra.length; i++) {
      const keys = extra[i]
      if (keys === null || keys === undefined) continue
      const list = arrayField(keys, `extra_keys[${i}]`)
      let mm: bigint[] | null = null
      for (const k of list) {
        // (identifier, offset) of a media item that overlaps this block
        if (Array.isArray(k) && typeof k[0] === 'string') (mm ??= []).push(mmHashOf(k[0]))
      }
      if (mm === null) continue
      mmBlockHashInto(tokens, i * bs, bs, mm, seed, this.mmOut)
      out.tokensLo[i] = this.mmOut[0] as number
      out.tokensHi[i] = this.mmOut[1] as number
    }
  }

  private rankMap(workerLo: number, workerHi: number, dpRank: number, create: boolean): Map<bigint, bigint> | undefined {
    const key = `${workerLo}:${workerHi}:${dpRank}`
    let m = this.salted.get(key)
    if (m === undefined && create) this.salted.set(key, (m = new Map()))
    return m
  }

  private inherited(out: DecodedEvent, seed: bigint): bigint {
    const m = this.rankMap(out.workerLo, out.workerHi, out.dpRank, false)
    return m?.get(BigInt(out.parentHi) * 4294967296n + BigInt(out.parentLo)) ?? seed
  }

  private rememberSalted(out: DecodedEvent, seed: bigint): void {
    const m = this.rankMap(out.workerLo, out.workerHi, out.dpRank, true) as Map<bigint, bigint>
    for (let i = 0; i < out.count; i++) {
      const key = BigInt(out.blockHi[i] as number) * 4294967296n + BigInt(out.blockLo[i] as number)
      if (!m.has(key)) this.saltedCount++
      m.set(key, seed)
    }
    // bounded: the oldest salted blocks are forgotten first (their continuations then hash unsalted)
    while (this.saltedCount > MAX_SALTED_BLOCKS) {
      for (const [k, rank] of this.salted) {
        const first = rank.keys().next()
        if (first.done === true) {
          this.salted.delete(k)
          continue
        }
        rank.delete(first.value)
        this.saltedCount--
        break
      }
    }
  }

  protected forgetSalted(workerLo: number, workerHi: number, dpRank: number, lo: number, hi: number): void {
    const m = this.rankMap(workerLo, workerHi, dpRank, false)
    if (m?.delete(BigInt(hi) * 4294967296n + BigInt(lo)) === true) this.saltedCount--
  }

  forgetRank(workerLo: number, workerHi: number, dpRank: number): void {
    const key = `${workerLo}:${workerHi}:${dpRank}`
    const m = this.salted.get(key)
    if (m === undefined) return
    this.saltedCount -= m.size
    this.salted.delete(key)
  }

  forgetWorker(workerLo: number, workerHi: number): void {
    if (this.saltedCount === 0) return
    const prefix = `${workerLo}:${workerHi}:`
    for (const [k, m] of this.salted) {
      if (!k.startsWith(prefix)) continue
      this.saltedCount -= m.size
      this.salted.delete(k)
    }
  }
}

export function tokenError(i: number, t: unknown): KvrError {
  return new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `token_ids[${i}] must be an integer in [0, 2^32), got ${String(t)}`)
}

/** A batch's data_parallel_rank, checked. */
export function rankOf(r: unknown): number {
  if (typeof r !== 'number' || !Number.isInteger(r) || r < 0 || r > 0xffffffff)
    throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `data_parallel_rank must be an integer in [0, 2^32), got ${String(r)}`)
  return r
}

/**
 * The cache salt in a stored event's extra keys: a string of the first block's keys that is not
 * the LoRA name (vLLM lists the adapter on every block, then media, then the salt on the first).
 */
function saltIn(extra: readonly unknown[] | null, loraName: string | null): string | null {
  const first = extra?.[0]
  if (!Array.isArray(first)) return null
  for (const k of first) {
    if (typeof k !== 'string' || k === '' || k === loraName) continue
    return k.startsWith(SALT_PREFIX) ? k.slice(SALT_PREFIX.length) || null : k
  }
  return null
}
