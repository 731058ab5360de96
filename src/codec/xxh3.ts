// XXH3-64 through the WebAssembly module assembled from xxh3.wat, one instance per thread: a
// whole prompt is hashed in one call (blocks, then the chain), which is what makes hashing cheap
// next to a per-block native call. Inputs are copied into the module's memory above DATA;
// hashes come back as little-endian u64s read as u32 halves, so no bigint is built on the hot
// path.
import { XXH3_WASM_BASE64 } from './xxh3-wasm.js'

// The lib settings here carry no WebAssembly declarations; these are the few parts used.
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object
  Instance: new (module: object) => { exports: unknown }
}

interface Exports {
  memory: { buffer: ArrayBuffer; grow(pages: number): number }
  setSeed(lo: number, hi: number): void
  hashInto(p: number, len: number, out: number): void
  blocks(p: number, size: number, n: number, out: number): void
  chain(local: number, n: number, out: number): void
}

/** First byte JS may use; below it live the secrets and accumulators. */
const DATA = 1024
const PAGE = 65536

const instance = new WebAssembly.Instance(new WebAssembly.Module(Buffer.from(XXH3_WASM_BASE64, 'base64')))
const wasm = instance.exports as Exports

let u8 = new Uint8Array(wasm.memory.buffer)
let u32 = new Uint32Array(wasm.memory.buffer)
let seedLo = -1
let seedHi = -1

/** Makes [DATA, DATA + bytes) addressable; views are renewed after a grow. */
function reserve(bytes: number): void {
  const need = DATA + bytes
  const have = wasm.memory.buffer.byteLength
  if (need <= have) return
  wasm.memory.grow(Math.ceil((need - have) / PAGE))
  u8 = new Uint8Array(wasm.memory.buffer)
  u32 = new Uint32Array(wasm.memory.buffer)
}

function useSeed(lo: number, hi: number): void {
  if (lo === seedLo && hi === seedHi) return
  wasm.setSeed(lo, hi)
  seedLo = lo
  seedHi = hi
}

/** The token words of the next prompt to hash: the caller fills `[0, count)`, then calls hashTokenArea. */
export function tokenArea(count: number, blocks: number): Uint32Array {
  reserve(count * 4 + blocks * 16 + 8)
  return u32.subarray(DATA >>> 2, (DATA >>> 2) + count)
}

/** Offset (bytes) of the u64 results after `tokenBytes` of input, 8-aligned. */
function after(tokenBytes: number): number {
  return (DATA + tokenBytes + 7) & ~7
}

/**
 * Hashes `n` blocks of `blockSize` u32 words already written at the token area; writes local
 * hashes to lo/hi and, when sLo/sHi are given, the chained sequence hashes too.
 */
export function hashTokenArea(
  blockSize: number,
  n: number,
  seed0: number,
  seed1: number,
  lo: Uint32Array,
  hi: Uint32Array,
  sLo?: Uint32Array,
  sHi?: Uint32Array,
): void {
  useSeed(seed0, seed1)
  const bytes = n * blockSize * 4
  const local = after(bytes)
  wasm.blocks(DATA, blockSize * 4, n, local)
  readHalves(local, n, lo, hi)
  if (sLo === undefined || sHi === undefined) return
  const seq = local + n * 8
  wasm.chain(local, n, seq)
  readHalves(seq, n, sLo, sHi)
}

/** n little-endian u64s at byte offset `at`, split into halves. */
function readHalves(at: number, n: number, lo: Uint32Array, hi: Uint32Array): void {
  for (let i = 0, w = at >>> 2; i < n; i++, w += 2) {
    lo[i] = u32[w] as number
    hi[i] = u32[w + 1] as number
  }
}

/** Chained sequence hashes of n local hashes given as halves. */
export function chainHalves(lo: Uint32Array, hi: Uint32Array, n: number, seed0: number, seed1: number, outLo: Uint32Array, outHi: Uint32Array): void {
  useSeed(seed0, seed1)
  reserve(n * 16)
  let w = DATA >>> 2
  for (let i = 0; i < n; i++, w += 2) {
    u32[w] = lo[i] as number
    u32[w + 1] = hi[i] as number
  }
  const out = DATA + n * 8
  wasm.chain(DATA, n, out)
  readHalves(out, n, outLo, outHi)
}

/** XXH3-64 of arbitrary bytes; the result's halves go to out[0] (low) and out[1] (high). */
export function hashBytesInto(data: Uint8Array, seed0: number, seed1: number, out: Uint32Array): void {
  useSeed(seed0, seed1)
  reserve(data.length + 16)
  u8.set(data, DATA)
  const at = after(data.length)
  wasm.hashInto(DATA, data.length, at)
  out[0] = u32[at >>> 2] as number
  out[1] = u32[(at >>> 2) + 1] as number
}
