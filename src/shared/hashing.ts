// Dynamo-compatible block hashing (spec §1): XXH3-64 with seed 1337 over each complete block's
// tokens as u32 little-endian, and the chained sequence hash over (previous, local) pairs.
// The native xxh3 binding is called once per block; its bigint result is split into halves
// through a shared BigUint64Array so the hot path does no bigint arithmetic.
import { xxh3 } from '@node-rs/xxhash'
import { endianness } from 'node:os'
import { KvrError } from './errors.js'

export const XXH3_SEED = 1337n
export const MAX_BLOCK_SIZE = 65536

// Typed-array views give the host's byte order; the wire format is little-endian, and every
// platform Node ships for (x86-64, arm64) is, so refuse to run rather than hash wrongly.
if (endianness() !== 'LE') throw new Error('kv-router requires a little-endian host')
const pair = new BigUint64Array(2)
const pairWords = new Uint32Array(pair.buffer)
const pairBytes = new Uint8Array(pair.buffer)

let blockWords = new Uint32Array(64)
let blockBytes = new Uint8Array(blockWords.buffer)

/** XXH3-64 of raw bytes with the given seed (1337 unless a salt applies). */
export function xxh3_64(data: Uint8Array | string, seed: bigint = XXH3_SEED): bigint {
  return xxh3.xxh64(data, seed)
}

export function checkBlockSize(blockSize: number): void {
  if (!Number.isInteger(blockSize) || blockSize < 1 || blockSize > MAX_BLOCK_SIZE) {
    throw new KvrError('KVR_ERR_INVALID_BLOCK_SIZE', `block size must be an integer in [1, ${MAX_BLOCK_SIZE}], got ${String(blockSize)}`)
  }
}

function tokenError(index: number, value: unknown): KvrError {
  return new KvrError('KVR_ERR_TOKEN_OUT_OF_RANGE', `token at index ${index} is ${String(value)}; token ids must be integers in [0, 4294967295]`)
}

/** Number of complete blocks; the trailing partial block is never hashed (spec §1.2). */
export function completeBlocks(tokenCount: number, blockSize: number): number {
  return Math.floor(tokenCount / blockSize)
}

/**
 * Local block hashes of every complete block, written as u32 halves into lo/hi (which must hold
 * at least completeBlocks() entries). Every token of the prompt is validated, including those of
 * the ignored partial block, so a bad prompt is refused whole. Returns the number of blocks.
 */
export function blockHashesInto(tokens: ArrayLike<number>, blockSize: number, lo: Uint32Array, hi: Uint32Array): number {
  checkBlockSize(blockSize)
  const n = completeBlocks(tokens.length, blockSize)
  for (let i = n * blockSize; i < tokens.length; i++) {
    const t = tokens[i] as number
    if (t >>> 0 !== t) throw tokenError(i, t)
  }
  if (blockWords.length !== blockSize) {
    blockWords = new Uint32Array(blockSize)
    blockBytes = new Uint8Array(blockWords.buffer)
  }
  const words = blockWords
  for (let b = 0, base = 0; b < n; b++, base += blockSize) {
    for (let j = 0; j < blockSize; j++) {
      const t = tokens[base + j] as number
      if (t >>> 0 !== t) throw tokenError(base + j, t)
      words[j] = t
    }
    pair[0] = xxh3.xxh64(blockBytes, XXH3_SEED)
    lo[b] = pairWords[0] as number
    hi[b] = pairWords[1] as number
  }
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
  if (n === 0) return
  outLo[0] = lo[0] as number
  outHi[0] = hi[0] as number
  for (let i = 1; i < n; i++) {
    // pair = LE64(previous sequence hash) ‖ LE64(local hash)
    pairWords[0] = outLo[i - 1] as number
    pairWords[1] = outHi[i - 1] as number
    pairWords[2] = lo[i] as number
    pairWords[3] = hi[i] as number
    pair[0] = xxh3.xxh64(pairBytes, XXH3_SEED)
    outLo[i] = pairWords[0] as number
    outHi[i] = pairWords[1] as number
  }
}

/** Chained sequence hashes (spec §1.3) of a list of local block hashes. */
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
