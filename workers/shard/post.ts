// The shard's one way to tell the main thread something outside comlink's replies: a typed
// ShardMessage (src/thread/messages.ts), switched on its kind by the pool.
import { parentPort, type TransferListItem } from 'node:worker_threads'
import type { ShardMessage } from '../../src/thread/messages.js'

export function post(msg: ShardMessage, transfer?: readonly TransferListItem[]): void {
  parentPort?.postMessage(msg, transfer)
}
