// Control calls to the shard threads over comlink (ShardApi). Each one names a barrier, the
// count of messages pushed to the shard before it, so it answers as of every event before it;
// the control records that must apply in order with a worker's events travel in the ring
// instead (control-records.ts).
import type * as Comlink from 'comlink'
import type { RouterEvent } from '../codec/events.js'
import { u64Hi, u64Lo } from '../codec/u64.js'
import { KvrError } from '../errors.js'
import type { OverlapScore } from '../index/kv-index.js'
import { C, CONTROL_POSTED, DOORBELL, type ShardApi, type ShardStats } from '../thread/protocol.js'
import type { Shard } from './shard.js'

/** Runs a control call on a shard; rejects, instead of waiting forever, if the thread exits. */
export function call<T>(sh: Shard, fn: (api: Comlink.Remote<ShardApi>) => Promise<T>): Promise<T> {
  const reply = fn(sh.api)
  // the call is posted (comlink posts synchronously); a shard asleep in its futex wait must
  // wake to take it in
  Atomics.add(sh.ctrl, CONTROL_POSTED, 1)
  Atomics.add(sh.ctrl, DOORBELL, 1)
  Atomics.notify(sh.ctrl, DOORBELL)
  return Promise.race([
    reply,
    sh.exited.then((code) => {
      throw new KvrError('KVR_ERR_SHARD_RESTARTED', `shard ${sh.index} exited (code ${code}) during the operation`)
    }),
  ])
}

/** The control calls of the pool, over the shards as lifecycle.ts replaces them. */
export class ShardControl {
  constructor(
    private readonly shards: readonly Shard[],
    private readonly owner: (workerId: bigint) => Shard,
  ) {}

  /** Resolves once the shard has processed every message pushed to it before the call. */
  async barrier(sh: Shard): Promise<void> {
    await call(sh, (api) => api.barrier(sh.enqueued))
  }

  /** The barrier of every shard. */
  async flush(): Promise<void> {
    await Promise.all(this.shards.map((sh) => this.barrier(sh)))
  }

  ensureWorker(workerId: bigint, dpRank: number): Promise<boolean> {
    const sh = this.owner(workerId)
    return call(sh, (api) => api.ensureWorker(u64Lo(workerId), u64Hi(workerId), dpRank, sh.enqueued))
  }

  /** Tree sizes of the worker-ranks held by the shard that owns `workerId`. */
  shardTreeSizes(workerId: bigint): Promise<OverlapScore[]> {
    const sh = this.owner(workerId)
    return call(sh, (api) => api.treeSizes(sh.enqueued))
  }

  async treeSizes(): Promise<OverlapScore[]> {
    const parts = await Promise.all(this.shards.map((sh) => call(sh, (api) => api.treeSizes(sh.enqueued))))
    return parts.flat()
  }

  /** treeSizes() as the shards hold them now, events still queued not waited for. */
  async treeSizesNow(): Promise<OverlapScore[]> {
    const parts = await Promise.all(this.shards.map((sh) => call(sh, (api) => api.treeSizes(Atomics.load(sh.ctrl, C.processed)))))
    return parts.flat()
  }

  async dump(): Promise<RouterEvent[]> {
    const parts = await Promise.all(this.shards.map((sh) => call(sh, (api) => api.dump(sh.enqueued))))
    const all = parts.flat()
    all.forEach((ev, i) => (ev.event.event_id = BigInt(i)))
    return all
  }

  /** Every shard's binary snapshot part, as of the events pushed to it before the call. */
  snapshotParts(): Promise<Uint8Array[]> {
    return Promise.all(this.shards.map((sh) => call(sh, (api) => api.snapshot(sh.enqueued))))
  }

  /** Has a shard check and keep the parts of a snapshot (ShardApi.stageSnapshot). */
  stageSnapshot(sh: Shard, buf: SharedArrayBuffer, parts: readonly number[], ticket: number): Promise<string | null> {
    return call(sh, (api) => api.stageSnapshot(buf, parts, ticket))
  }

  stats(): Promise<ShardStats[]> {
    return Promise.all(this.shards.map((sh) => call(sh, (api) => api.stats())))
  }

  block(sh: Shard, ms: number): void {
    void call(sh, (api) => api.block(ms)).catch(() => undefined)
  }

  /** Asks every shard to stop once it has applied what was pushed to it; a dead one settles with its exit. */
  async shutdown(): Promise<void> {
    await Promise.all(this.shards.map((sh) => call(sh, (api) => api.shutdown(sh.enqueued)).catch(() => undefined)))
  }
}
