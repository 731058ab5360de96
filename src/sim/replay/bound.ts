// The best hit rate any routing could achieve on a trace: one cache that keeps every block it has
// ever seen, visited by every request in trace order. A request's hit is the longest prefix of
// its blocks the cache already holds, counted in tokens (complete blocks only, as an engine's
// prefix cache counts them). No router can beat it with a finite fleet, because each worker only
// ever sees a subset of the blocks this cache sees; it is the yardstick for "achieved hit rate".
//
// Blocks are identified exactly as engines and the router identify them: chained sequence
// hashes over the expanded tokens. The set of seen blocks also gives the number of
// unique blocks, which sizes a fleet that can hold the whole slice.
import { sequenceHashesInto } from '../../codec/hashing.js'
import { TraceBlockHasher } from './trace.js'
import type { TracePrompt } from './trace.js'

export interface CacheBound {
  blockSize: number
  requests: number
  promptTokens: number
  /** Tokens an infinite prefix cache would have served. */
  cachedTokens: number
  /** cachedTokens / promptTokens (0 for an empty trace). */
  hitRate: number
  /** Distinct complete blocks (sequence hashes) in the trace. */
  uniqueBlocks: number
}

export function cacheBound(requests: Iterable<TracePrompt>, blockSize: number): CacheBound {
  const hasher = new TraceBlockHasher(blockSize)
  const seen = new Set<string>()
  let lo = new Uint32Array(256)
  let hi = new Uint32Array(256)
  let sLo = new Uint32Array(256)
  let sHi = new Uint32Array(256)
  let n = 0
  let prompt = 0
  let cached = 0
  for (const req of requests) {
    n++
    prompt += req.input_length
    const blocks = hasher.blockCount(req)
    if (blocks > lo.length) {
      const cap = Math.max(blocks, lo.length * 2)
      lo = new Uint32Array(cap)
      hi = new Uint32Array(cap)
      sLo = new Uint32Array(cap)
      sHi = new Uint32Array(cap)
    }
    hasher.hashesInto(req, lo, hi)
    sequenceHashesInto(lo, hi, blocks, sLo, sHi)
    let prefix = true
    for (let b = 0; b < blocks; b++) {
      const key = `${sHi[b]}:${sLo[b]}`
      if (seen.has(key)) {
        if (prefix) cached += blockSize
      } else {
        prefix = false
        seen.add(key)
      }
    }
  }
  return { blockSize, requests: n, promptTokens: prompt, cachedTokens: cached, hitRate: prompt > 0 ? cached / prompt : 0, uniqueBlocks: seen.size }
}
