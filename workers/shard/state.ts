// What every part of the shard thread shares: the views of its workerData (the control and
// query-board words, the event ring), its KvIndex and event decoder, and the counters it
// publishes. One instance per thread, built when the thread starts.
import { workerData } from 'node:worker_threads'
import { KvIndex } from '../../src/index/kv-index.js'
import { RouterEventDecoder } from '../../src/codec/dynamo-msgpack.js'
import { RingConsumer } from '../../src/thread/ring.js'
import { BoardLayout, RING_READ, RING_WRITE, type ShardInit } from '../../src/thread/protocol.js'

export const init = workerData as ShardInit
/** This shard's number: its bit in a query's pending mask, its column of the results. */
export const me = init.index
export const ctrl = new Int32Array(init.ctrl)
export const board = new Int32Array(init.board)
export const layout = new BoardLayout(init.geometry)
export const index = new KvIndex({ maxBlocks: init.maxBlocks, maxWorkerRanks: init.geometry.maxResults })
export const decoder = new RouterEventDecoder()
export const ring = new RingConsumer(ctrl, { write: RING_WRITE, read: RING_READ }, init.ring)

/**
 * Counts since the thread started, published into ctrl by publishCounters (apply.ts).
 * `processed` is the barrier count: every ring message (event or control record) adds one once
 * this thread is done with it (applied, dropped, sent back, or held for a recovery).
 */
export const counters = {
  received: 0,
  applied: 0,
  malformed: 0,
  misplaced: 0,
  gaps: 0,
  processed: 0,
  queries: 0,
}
