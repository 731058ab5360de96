// One shard thread as the main thread holds it: the thread, its comlink proxy, its control words
// and ring, the messages queued behind its full ring, and what it has counted. The pool's parts
// (lifecycle.ts, writer.ts, query-board.ts, control.ts, counters.ts) share one array of these.
import type { Worker } from 'node:worker_threads'
import type * as Comlink from 'comlink'
import type { RingProducer } from '../thread/ring.js'
import { DOORBELL, SLEEPING, type ShardApi } from '../thread/protocol.js'

export type ShardHealth = 'exact' | 'recovering'

/** A message behind a full ring, written from `offset` on. */
export interface Pending {
  bytes: Uint8Array
  offset: number
}

export interface Shard {
  index: number
  worker: Worker
  api: Comlink.Remote<ShardApi>
  ctrl: Int32Array
  ringSab: SharedArrayBuffer
  producer: RingProducer
  /** Messages pushed since this thread started (mod 2^32), the barrier the shard counts toward. */
  enqueued: number
  pending: Pending[]
  pendingHead: number
  waitingForSpace: boolean
  health: ShardHealth
  restarts: number
  ringFull: number
  ringWaits: number
  lost: number
  lastBeat: number
  lastBeatAt: number
  exiting: boolean
  /** Exited while the pool was closing (not restarted). */
  dead: boolean
  /** Settles when this thread has exited; control calls race it so none waits on a dead thread. */
  exited: Promise<number>
  /** The engine counters of the threads before this one (they start at 0 in each). */
  engineRetired: Float64Array
}

/** Wakes the shard if it sleeps on its doorbell (a running one polls its rings anyway). */
export function ringDoorbell(sh: Shard): void {
  if (Atomics.load(sh.ctrl, SLEEPING) === 1) {
    Atomics.add(sh.ctrl, DOORBELL, 1)
    Atomics.notify(sh.ctrl, DOORBELL)
  }
}
