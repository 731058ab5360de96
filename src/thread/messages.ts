// What a shard thread posts to the main thread on its own, beside comlink's replies to control
// calls (ShardApi): one discriminated union, switched on `kind` by src/shards/pool.ts. Worker
// ids and event ids travel as u32 halves (lo, hi), as everywhere between the threads.

/** An event decoded for a worker another shard owns: to be pushed there. `bytes` is transferred. */
export interface MisplacedEventMessage {
  kind: 'misplacedEvent'
  bytes: Uint8Array
  lo: number
  hi: number
}

/** A sample of something the shard dropped, for a log line (workers/shard/log.ts). */
export interface LogSampleMessage {
  kind: 'logSample'
  what: string
  fields: Record<string, unknown>
}

/** A worker-rank's engine publishes another block size than the router's (sent once per worker-rank). */
export interface EngineNoteMessage {
  kind: 'engineNote'
  lo: number
  hi: number
  rank: number
  eventBlockSize: number
  routerBlockSize: number
}

/** A recoverable worker-rank skipped event ids [from, to) and its events are held under `ticket`. */
export interface GapMessage {
  kind: 'gap'
  lo: number
  hi: number
  rank: number
  fromLo: number
  fromHi: number
  toLo: number
  toHi: number
  ticket: number
}

export type ShardMessage = MisplacedEventMessage | LogSampleMessage | EngineNoteMessage | GapMessage

const KINDS: ReadonlySet<string> = new Set<ShardMessage['kind']>(['misplacedEvent', 'logSample', 'engineNote', 'gap'])

/** True for a ShardMessage; false for what else the port carries (comlink's replies). */
export function isShardMessage(m: unknown): m is ShardMessage {
  return typeof m === 'object' && m !== null && typeof (m as { kind?: unknown }).kind === 'string' && KINDS.has((m as { kind: string }).kind)
}
