// What an index holds, read from its dump (KvIndex.dump, ShardPool.dump) in a form that does not
// depend on the order the dump visits nodes in: per worker-rank, each block hash it holds with
// the path of tokens hashes that leads to it. Two indexes that hold the same give the same text,
// whatever their slots. A dump bridges missing parents with synthetic hashes it removes again,
// and hangs detached subtrees under synthetic anchors (tokens hashes with high half 0xffffffff):
// an anchor reads as `*`.
import type { RouterEvent } from '../../src/codec/events.js'

const ANCHOR_HI = 0xffffffffn

export function dumpPaths(events: readonly RouterEvent[]): string {
  const ranks = new Map<string, Map<bigint, string[]>>()
  for (const ev of events) {
    const key = `${ev.worker_id}:${ev.event.dp_rank}`
    let held = ranks.get(key)
    if (held === undefined) ranks.set(key, (held = new Map()))
    const d = ev.event.data
    if (d === 'cleared') {
      held.clear()
      continue
    }
    if ('removed' in d) {
      for (const h of d.removed.block_hashes) held.delete(h)
      continue
    }
    let path: string[] = []
    if (d.stored.parent_hash !== null) {
      const p = held.get(d.stored.parent_hash)
      if (p === undefined) throw new Error(`the dump names parent ${d.stored.parent_hash} that ${key} does not hold`)
      path = p
    }
    for (const b of d.stored.blocks) {
      path = [...path, path.length === 0 && b.tokens_hash >> 32n === ANCHOR_HI ? '*' : String(b.tokens_hash)]
      held.set(b.block_hash, path)
    }
  }
  return [...ranks]
    .filter(([, held]) => held.size > 0)
    .map(
      ([key, held]) =>
        `${key} ${[...held]
          .map(([h, p]) => `${h}=${p.join('/')}`)
          .sort()
          .join(' ')}`,
    )
    .sort()
    .join('\n')
}
