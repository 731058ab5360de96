// The fast part of reading `token_ids`: the WebAssembly scanner of token-scan.wat, fed the body
// a window at a time. It takes the common `1,22,333,` run of an array and leaves the rest (the
// last id, ids it does not take whole, every error) to route-body.ts's byte loop.
import { TOKEN_SCAN_WASM_BASE64 } from './token-scan-wasm.js'

// The lib settings here carry no WebAssembly declarations; these are the few parts used.
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object
  Instance: new (module: object) => { exports: unknown }
}

interface Exports {
  memory: { buffer: ArrayBuffer }
  tokens(p: number, end: number, out: number): number
  stop(): number
}

/** Where ids land, grown as needed; `n` is how many the last call wrote. */
export interface TokenSink {
  tok: Uint32Array
  n: number
}

// The memory map of token-scan.wat: a fixed window, so memory stays at its 4 pages whatever the
// body's size.
const IN = 64
const WINDOW = 65536
const OUT = IN + WINDOW + 64

/**
 * The module, or null where this runtime cannot compile it (a CPU without the SIMD it needs):
 * the byte loop then reads every id, correctly and about three times as slowly (bench:micro).
 */
const wasm: Exports | null = (() => {
  try {
    return new WebAssembly.Instance(new WebAssembly.Module(Buffer.from(TOKEN_SCAN_WASM_BASE64, 'base64'))).exports as Exports
  } catch {
    return null
  }
})()
const u8 = wasm === null ? new Uint8Array(0) : new Uint8Array(wasm.memory.buffer)
const u32 = wasm === null ? new Uint32Array(0) : new Uint32Array(wasm.memory.buffer)

/** True when the WebAssembly scanner runs here (false: the byte loop does all the work). */
export const tokenScanAccelerated = wasm !== null

/**
 * Reads ids from buf at i into sink.tok (growing it), as many as the scanner takes whole.
 * Returns the first byte it did not take; sink.n is how many ids it wrote.
 */
export function scanTokenIds(buf: Uint8Array, i: number, sink: TokenSink): number {
  sink.n = 0
  if (wasm === null) return i
  const len = buf.length
  let n = 0
  for (;;) {
    const take = Math.min(WINDOW, len - i)
    u8.set(buf.subarray(i, i + take), IN)
    const got = wasm.tokens(IN, IN + take, OUT)
    const stop = wasm.stop() - IN
    if (got > 0) {
      let tok = sink.tok
      if (tok.length < n + got) {
        const bigger = new Uint32Array(Math.max(tok.length * 2, n + got))
        bigger.set(tok.subarray(0, n))
        sink.tok = tok = bigger
      }
      tok.set(u32.subarray(OUT >>> 2, (OUT >>> 2) + got), n)
      n += got
    }
    i += stop
    // A full window that was read to its last few bytes stopped at an id cut by the window's
    // end, and the next window starts with it; any other stop is at something not taken.
    if (take < WINDOW || got === 0 || stop < WINDOW - 64) break
  }
  sink.n = n
  return i
}
