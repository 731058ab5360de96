// The WebAssembly token-id scanner (token-scan.wat), one instance per thread. The bytes of a
// `token_ids` array are copied into the module's memory, the ids come back as a fresh
// Uint32Array; null means the array is not in the plain layout and the caller's own scanner
// must take it (it also produces every error message).
import { TOKEN_SCAN_WASM_BASE64 } from './token-scan-wasm.js'

declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object
  Instance: new (module: object) => { exports: unknown }
}

interface Exports {
  memory: { buffer: ArrayBuffer; grow(pages: number): number }
  tokens(p: number, end: number, dst: number): number
}

/** Where the input bytes start; address 0 holds the end offset the module reports. */
const SRC = 64
const PAGE = 65536

const wasm = new WebAssembly.Instance(new WebAssembly.Module(Buffer.from(TOKEN_SCAN_WASM_BASE64, 'base64'))).exports as Exports
let u8 = new Uint8Array(wasm.memory.buffer)
let i32 = new Int32Array(wasm.memory.buffer)

/** Index in the scanned buffer just past the closing "]" of the last successful scan. */
export let scannedEnd = 0

/** Token ids of the array whose first element starts at buf[from]; null when not plain. */
export function scanPlainTokens(buf: Uint8Array, from: number): Uint32Array | null {
  const len = buf.length - from
  if (len <= 0) return null
  // at most one id per two bytes ("1,"), written 4-byte aligned after the input
  const dst = (SRC + len + 3) & ~3
  const need = dst + 4 * (Math.floor(len / 2) + 1)
  if (need > wasm.memory.buffer.byteLength) {
    wasm.memory.grow(Math.ceil((need - wasm.memory.buffer.byteLength) / PAGE))
    u8 = new Uint8Array(wasm.memory.buffer)
    i32 = new Int32Array(wasm.memory.buffer)
  }
  u8.set(from === 0 ? buf : buf.subarray(from), SRC)
  const n = wasm.tokens(SRC, SRC + len, dst)
  if (n < 0) return null
  scannedEnd = from + ((i32[0] as number) - SRC)
  return new Uint32Array(wasm.memory.buffer, dst, n).slice()
}
