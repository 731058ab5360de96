// The shard pool's options, with their defaults and bounds.
import { cpuBudget } from '../runtime/cpu-budget.js'
import { checkRingCapacity } from '../thread/ring.js'
import { MAX_SHARDS, QRING_SIZE } from '../thread/protocol.js'
import { KvrError } from '../errors.js'

export interface ShardPoolOptions {
  /** Number of shard threads, at most 31; default max(1, cores − 1), cores as cpuBudget() counts them. */
  shards?: number
  /** Bytes of each shard's event ring (power of two); default 4 MiB. */
  ringBytes?: number
  /** Queries in flight at once; more wait for a free slot. Default 64. */
  querySlots?: number
  /** Longest query in blocks; longer prompts are matched on their first this-many blocks. */
  maxQueryBlocks?: number
  /** Worker-ranks one shard may hold (also the size of its result area). Default 2048. */
  maxWorkerRanksPerShard?: number
  /** Cap on (block, worker-rank) entries per shard. */
  maxBlocksPerShard?: number
  /** Shard heartbeat period when idle; default 100 ms. */
  heartbeatMs?: number
  /** A shard whose heartbeat has not moved for this long is restarted; default 5000 ms. */
  stallMs?: number
  /** How long an idle shard spins before it sleeps; default 200 µs when a core is spare beyond the event loop and the shards, else 0. */
  shardSpinUs?: number
  /**
   * Longest continuous work a shard does between turns of its event loop when no control call
   * is waiting; default 50 ms. Tests raise it to show control calls do not wait for it.
   */
  shardYieldMaxMs?: number
  /**
   * How long a query spins on the event loop for its answer before it awaits; default 60 µs when a core is spare for every shard
   * beside the event loop, else 0.
   */
  querySpinUs?: number
  /**
   * Bytes of event messages queued behind full rings, all shards, above which offer() drops
   * (counted) and the HTTP ingest refuses with 503; default 256 MiB. push() always queues.
   */
  maxPendingBytes?: number
}

export type PoolOptions = Readonly<Required<ShardPoolOptions>>

function positive(name: string, v: number | undefined, dflt: number, max = Number.MAX_SAFE_INTEGER): number {
  const x = v ?? dflt
  if (!Number.isInteger(x) || x < 1 || x > max) throw new KvrError('KVR_ERR_INVALID_OPTION', `${name} must be an integer in [1, ${max}], got ${String(v)}`)
  return x
}

/** The options with every default filled in; throws KVR_ERR_INVALID_OPTION on one out of range. */
export function resolveOptions(options: ShardPoolOptions): PoolOptions {
  const cores = cpuBudget()
  const shards = positive('shards', options.shards, Math.min(MAX_SHARDS, Math.max(1, cores - 1)), MAX_SHARDS)
  const o: Required<ShardPoolOptions> = {
    shards,
    ringBytes: options.ringBytes ?? 4 * 1024 * 1024,
    querySlots: positive('querySlots', options.querySlots, 64, QRING_SIZE),
    maxQueryBlocks: positive('maxQueryBlocks', options.maxQueryBlocks, 16384, 1 << 20),
    maxWorkerRanksPerShard: positive('maxWorkerRanksPerShard', options.maxWorkerRanksPerShard, 2048, 0xfffe),
    maxBlocksPerShard: positive('maxBlocksPerShard', options.maxBlocksPerShard, 60_000_000, 67_000_000),
    heartbeatMs: positive('heartbeatMs', options.heartbeatMs, 100, 60_000),
    stallMs: positive('stallMs', options.stallMs, 5000, 3_600_000),
    shardYieldMaxMs: positive('shardYieldMaxMs', options.shardYieldMaxMs, 50, 3_600_000),
    // Spinning only pays with a core to spare beyond the event loop and the shards; without
    // one, a spinning shard takes the CPU the event loop needs to feed it.
    shardSpinUs: options.shardSpinUs ?? (cores > shards + 1 ? 200 : 0),
    // The same for the event loop's wait for an answer: with no core to spare for every
    // shard, its spin takes the CPU a shard needs to answer. 60 µs rather than 30: a busy
    // shard often answers between the two, and an answer that misses the spin costs a wake
    // through Atomics.waitAsync (20-60 µs). In alternated runs of `npm run bench:index`, 60 took
    // the saturated lookup p99 from about 53 to 42 µs; /v1/route throughput did not change.
    querySpinUs: options.querySpinUs ?? (cores > shards ? 60 : 0),
    maxPendingBytes: positive('maxPendingBytes', options.maxPendingBytes, 256 * 1024 * 1024, Number.MAX_SAFE_INTEGER),
  }
  try {
    checkRingCapacity(o.ringBytes)
  } catch (err) {
    throw new KvrError('KVR_ERR_INVALID_OPTION', `ringBytes: ${(err as Error).message}`)
  }
  return Object.freeze(o)
}
