// Shared by the recovery tests: overlaps as comparable text, and one-block stored events with explicit ids.
import type { RouterEvent } from '../../src/codec/events.js'
import type { OverlapScore } from '../../src/index/kv-index.js'

const key = (s: OverlapScore): string => `${s.worker_id}:${s.dp_rank}=${s.overlap_blocks}/${s.tree_size}`
export const canon = (xs: OverlapScore[]): string[] => xs.map(key).sort()

/** A one-block stored event with an explicit id: block hash 100·tok, tokens hash tok. */
export function ev(worker: bigint, id: number, tok: number, parentTok: number | null): RouterEvent {
  return {
    worker_id: worker,
    event: {
      event_id: BigInt(id),
      dp_rank: 0,
      data: {
        stored: { parent_hash: parentTok === null ? null : BigInt(parentTok * 100), blocks: [{ block_hash: BigInt(tok * 100), tokens_hash: BigInt(tok) }] },
      },
    },
  }
}
