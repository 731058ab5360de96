// Terse builders for index tests. Block pairs are [block_hash, tokens_hash]; the unit
// convention of the reference tests (tokens_hash = i, block_hash = 100·i) reads well here.
import type { RouterEvent } from '../../src/codec/events.js'

let nextId = 0n

export function stored(worker: bigint | number, parent: bigint | number | null, blocks: [bigint | number, bigint | number][], dpRank = 0): RouterEvent {
  return {
    worker_id: BigInt(worker),
    event: {
      event_id: nextId++,
      dp_rank: dpRank,
      data: {
        stored: { parent_hash: parent === null ? null : BigInt(parent), blocks: blocks.map(([b, t]) => ({ block_hash: BigInt(b), tokens_hash: BigInt(t) })) },
      },
    },
  }
}

/** A chain of blocks with tokens_hash = i and block_hash = 100·i for each i. */
export function chain(worker: bigint | number, parentTok: number | null, toks: number[], dpRank = 0): RouterEvent {
  return stored(
    worker,
    parentTok === null ? null : parentTok * 100,
    toks.map((i) => [i * 100, i]),
    dpRank,
  )
}

export function removed(worker: bigint | number, hashes: (bigint | number)[], dpRank = 0): RouterEvent {
  return { worker_id: BigInt(worker), event: { event_id: nextId++, dp_rank: dpRank, data: { removed: { block_hashes: hashes.map((h) => BigInt(h)) } } } }
}

export function cleared(worker: bigint | number, dpRank = 0): RouterEvent {
  return { worker_id: BigInt(worker), event: { event_id: nextId++, dp_rank: dpRank, data: 'cleared' } }
}
