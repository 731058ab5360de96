// Binary snapshots of the index (src/index/snapshot-format.ts), this shard's side. Taking one:
// the index writes its part straight from its arrays. Loading one is two steps, so that a
// snapshot is applied whole or not at all, across every shard: the pool hands each shard the
// parts naming its workers in shared memory (no copy) and the shard checks them all before
// keeping them (stageSnapshot); once every shard has said yes, a SNAPSHOT record in the ring
// applies them, in order with the events (or drops them when one shard said no).
//
// Applied, a part is a tree dump of each of its worker-ranks this shard owns, as a worker's
// dump in a recovery is (parking.ts): a hold open for the worker-rank lets its events go first
// (they came before the snapshot), then the worker-rank is emptied and filled from the part.
// The parts of another shard count's snapshot are loaded by whichever shards own their workers.
import { KvrError } from '../../src/errors.js'
import { SnapshotPart, checkPart } from '../../src/index/snapshot-format.js'
import { shardOf } from '../../src/thread/protocol.js'
import { SNAPSHOT, readU32 } from '../../src/thread/records.js'
import { letGo } from './parking.js'
import { counters, index, init, me } from './state.js'

interface Staged {
  buf: SharedArrayBuffer
  parts: readonly number[]
}

const staged = new Map<number, Staged>()

/** Checks the parts (offset, length pairs into buf) whole; null when all are sound, else why not. */
export function stage(buf: SharedArrayBuffer, parts: readonly number[], ticket: number): string | null {
  try {
    for (let i = 0; i < parts.length; i += 2) checkPart(new Uint8Array(buf, parts[i], parts[i + 1]), `part at byte ${parts[i]}`)
  } catch (err) {
    if (err instanceof KvrError) return err.message
    throw err
  }
  staged.set(ticket, { buf, parts })
  return null
}

/** A SNAPSHOT record: the staged parts applied, or dropped. One with no staged parts (a restart since) is dropped. */
export function onSnapshotRecord(bytes: Uint8Array): void {
  if (bytes.length >= SNAPSHOT.length) {
    const ticket = readU32(bytes, SNAPSHOT.at.ticket)
    const s = staged.get(ticket)
    staged.delete(ticket)
    if (s !== undefined && bytes[SNAPSHOT.at.flag] === 1) apply(s)
  }
  counters.processed++
}

function apply(s: Staged): void {
  for (let i = 0; i < s.parts.length; i += 2) {
    const p = new SnapshotPart(new Uint8Array(s.buf, s.parts[i], s.parts[i + 1]))
    const take = new Uint8Array(p.workers)
    for (let w = 0; w < p.workers; w++) {
      const lo = p.workerIdLo(w)
      const hi = p.workerIdHi(w)
      if (shardOf(lo, hi, init.shards) !== me) continue
      take[w] = 1
      letGo(lo, hi, p.workerRank(w))
    }
    index.loadSnapshotPart(p, take)
  }
}
