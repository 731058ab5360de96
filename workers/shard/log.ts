// What the shard tells the main thread's log. The main thread counts the shard's drops from its
// shared counters (src/shards/log-watch.ts); the shard only posts a sample of each class, the
// latest at most once a second, so a line there can say what was wrong and with which worker.
import { post } from './post.js'

export const SAMPLE_MALFORMED = 0
export const SAMPLE_REJECTED = 1
export const SAMPLE_ENGINE_MALFORMED = 2
const NAMES = ['events_malformed', 'events_rejected', 'engine_batches_malformed'] as const

const SAMPLE_MS = 1000
const last = new Float64Array(NAMES.length).fill(-Infinity)

/** Posts a sample of class `what` unless one went less than a second ago. */
export function sample(what: number, fields: Record<string, unknown>): void {
  const now = performance.now()
  if (now - (last[what] as number) < SAMPLE_MS) return
  last[what] = now
  post({ kind: 'logSample', what: NAMES[what] as string, fields })
}
