// Dynamo-compatible block hashing: XXH3-64 with seed 1337 over each complete block's
// tokens as u32 little-endian, and the chained sequence hash over (previous, local) pairs.
// The hashing itself runs in WebAssembly (xxh3.ts), a prompt per call; u64 results travel as
// u32 halves so the hot path does no bigint arithmetic.
import { endianness } from 'node:os'
import { KvrError } from '../errors.js'
import { chainHalves, hashBytesInto, hashTokenArea, tokenArea } from './xxh3.js'

export const XXH3_SEED = 1337n
const SEED_LO = 1337
const SEED_HI = 0
export const MAX_BLOCK_SIZE = 65536

// Typed-array views give the host's byte order; the wire format is little-endian, and every
// platform Node ships for (x86-64, arm64) is, so refuse to run rather than hash wrongly.
if (endianness() !== 'LE') throw new Error('kv-router requires a little-endian host')
const halves = new Uint32Array(2)
const one = new BigUint64Array(halves.buffer)

/** XXH3-64 of raw bytes with the given seed (1337 unless a salt applies). */
export function xxh3_64(data: Uint8Array | string, seed: bigint = XXH3_SEED): bigint {
  const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data
  const s = BigInt.asUintN(64, seed)
  hashBytesInto(bytes, Number(s & 0xffffffffn), Number(s >> 32n), halves)
  return one[0] as bigint
}

export function checkBlockSize(blockSize: number): void {
  if (!Number.isInteger(blockSize) || blockSize < 1 || blockSize > MAX_BLOCK_SIZE) {
    throw new KvrError('KVR_ERR_INVALID_BLOCK_SIZE', `block size must be an integer in [1, ${MAX_BLOCK_SIZE}], got ${String(blockSize)}`)
  }
}

function tokenError(index: number, value: unknown): KvrError {
  return new KvrError('KVR_ERR_TOKEN_OUT_OF_RANGE', `token at index ${index} is ${String(value)}; token ids must be integers in [0, 4294967295]`)
}

/** Number of complete blocks; the trailing partial block is never hashed, as in Dynamo. */
export function completeBlocks(tokenCount: number, blockSize: number): number {
  return Math.floor(tokenCount / blockSize)
}

/**
 * Local block hashes of every complete block, written as u32 halves into lo/hi (which must hold
 * at least completeBlocks() entries). Every token of the prompt is validated, including those of
 * the ignored partial block, so a bad prompt is refused whole. Returns the number of blocks.
 */
export function blockHashesInto(tokens: ArrayLike<number>, blockSize: number, lo: Uint32Array, hi: Uint32Array): number {
  return promptHashesInto(tokens, blockSize, lo, hi)
}

/**
 * Local block hashes and, when sLo/sHi are given, the chained sequence hashes of the complete
 * blocks in one pass. A Uint32Array holds valid token ids by construction and is copied as is;
 * any other array is validated token by token, including the ignored partial block.
 */
export function promptHashesInto(tokens: ArrayLike<number>, blockSize: number, lo: Uint32Array, hi: Uint32Array, sLo?: Uint32Array, sHi?: Uint32Array): number {
  checkBlockSize(blockSize)
  const n = completeBlocks(tokens.length, blockSize)
  const words = n * blockSize
  if (tokens instanceof Uint32Array) {
    tokenArea(words, n).set(words === tokens.length ? tokens : tokens.subarray(0, words))
  } else {
    for (let i = words; i < tokens.length; i++) {
      const t = tokens[i] as number
      if (t >>> 0 !== t) throw tokenError(i, t)
    }
    const area = tokenArea(words, n)
    for (let i = 0; i < words; i++) {
      const t = tokens[i] as number
      if (t >>> 0 !== t) throw tokenError(i, t)
      area[i] = t
    }
  }
  hashTokenArea(blockSize, n, SEED_LO, SEED_HI, lo, hi, sLo, sHi)
  return n
}

/** Local block hashes (`tokens_hash`) of the complete blocks, as u64 values. */
export function computeBlockHashes(tokens: ArrayLike<number>, blockSize: number): BigUint64Array {
  checkBlockSize(blockSize)
  const n = completeBlocks(tokens.length, blockSize)
  const lo = new Uint32Array(n)
  const hi = new Uint32Array(n)
  blockHashesInto(tokens, blockSize, lo, hi)
  return joinHalves(lo, hi, n)
}

/** Chained sequence hashes from local hashes given as halves; writes halves into outLo/outHi. */
export function sequenceHashesInto(lo: Uint32Array, hi: Uint32Array, n: number, outLo: Uint32Array, outHi: Uint32Array): void {
  if (n > 0) chainHalves(lo, hi, n, SEED_LO, SEED_HI, outLo, outHi)
}

/** Chained sequence hashes of a list of local block hashes. */
export function computeSequenceHashes(local: BigUint64Array): BigUint64Array {
  const n = local.length
  const lo = new Uint32Array(n)
  const hi = new Uint32Array(n)
  splitHalves(local, lo, hi)
  const outLo = new Uint32Array(n)
  const outHi = new Uint32Array(n)
  sequenceHashesInto(lo, hi, n, outLo, outHi)
  return joinHalves(outLo, outHi, n)
}

export function joinHalves(lo: Uint32Array, hi: Uint32Array, n: number): BigUint64Array {
  const out = new BigUint64Array(n)
  const w = new Uint32Array(out.buffer)
  for (let i = 0; i < n; i++) {
    w[2 * i] = lo[i] as number
    w[2 * i + 1] = hi[i] as number
  }
  return out
}

export function splitHalves(values: BigUint64Array, lo: Uint32Array, hi: Uint32Array): void {
  const w = new Uint32Array(values.buffer, values.byteOffset, values.length * 2)
  for (let i = 0; i < values.length; i++) {
    lo[i] = w[2 * i] as number
    hi[i] = w[2 * i + 1] as number
  }
}

// ---- salted and multimodal block hashes (Dynamo 1.4.0) ----
// A block of a LoRA adapter's request, or of a request with a cache salt, must not match the same
// tokens of another adapter or tenant: the block hash's seed folds both names in. A block that
// holds media (images, audio) appends the media's hashes to its tokens. Both are as Dynamo
// 1.4.0's router computes them (docs/dynamo-compatibility.md, "Block hashing").

const HEX64 = /^[0-9a-fA-F]{64}$/

/**
 * The block-hash seed of a request: 1337, plus XXH3(lora name, seed 0) when an adapter is named,
 * plus XXH3(cache salt, seed 1) when a salt is given, wrapping at 2^64. Empty names count as none.
 */
export function saltSeed(loraName: string | null | undefined, cacheSalt: string | null | undefined): bigint {
  let seed = XXH3_SEED
  if (loraName) seed += xxh3_64(loraName, 0n)
  if (cacheSalt) seed += xxh3_64(cacheSalt, 1n)
  return BigInt.asUintN(64, seed)
}

/** The u64 a media item's identifier stands for: a sha256 hex digest's first 16 hex digits, else XXH3(identifier, seed 0). */
export function mmHashOf(identifier: string): bigint {
  return HEX64.test(identifier) ? BigInt(`0x${identifier.slice(0, 16)}`) : xxh3_64(identifier, 0n)
}

/**
 * Local block hashes of the complete blocks with a given seed (saltSeed()): as promptHashesInto's
 * local hashes, which are the same numbers for seed 1337.
 */
export function seededBlockHashesInto(tokens: ArrayLike<number>, blockSize: number, seed: bigint, lo: Uint32Array, hi: Uint32Array): number {
  if (seed === XXH3_SEED) return promptHashesInto(tokens, blockSize, lo, hi)
  checkBlockSize(blockSize)
  const n = completeBlocks(tokens.length, blockSize)
  const words = n * blockSize
  const area = tokenArea(words, n)
  for (let i = 0; i < words; i++) {
    const t = tokens[i] as number
    if (t >>> 0 !== t) throw tokenError(i, t)
    area[i] = t
  }
  hashTokenArea(blockSize, n, Number(seed & 0xffffffffn), Number(seed >> 32n), lo, hi)
  return n
}

/**
 * The local hash of one block that holds media: its tokens (u32 LE) followed by the media hashes
 * in ascending order (u64 LE), hashed with `seed`. Writes the halves to out[0], out[1].
 */
export function mmBlockHashInto(tokens: ArrayLike<number>, from: number, blockSize: number, mmHashes: readonly bigint[], seed: bigint, out: Uint32Array): void {
  const sorted = [...mmHashes].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
  const bytes = new Uint8Array(blockSize * 4 + sorted.length * 8)
  const v = new DataView(bytes.buffer)
  for (let i = 0; i < blockSize; i++) {
    const t = tokens[from + i] as number
    if (t >>> 0 !== t) throw tokenError(from + i, t)
    v.setUint32(i * 4, t, true)
  }
  for (let j = 0; j < sorted.length; j++) v.setBigUint64(blockSize * 4 + j * 8, BigInt.asUintN(64, sorted[j] as bigint), true)
  const s = BigInt.asUintN(64, seed)
  hashBytesInto(bytes, Number(s & 0xffffffffn), Number(s >> 32n), out)
}
