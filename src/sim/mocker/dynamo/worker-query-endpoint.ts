// The worker query endpoint `worker_kv_indexer_query_dp{rank}`, answered from the engine's event
// ring (event-ring.ts: its last 1,024 events and a local index for dumps), as a current worker's
// LocalKvIndexer answers it (lib/kv-router/src/indexer/local.rs, stored copies 51766346333 and
// 66415190970; the types in lib/kv-router/src/indexer.rs, stored copy 70140925883):
//
//   request  {worker_id, dp_rank, start_event_id: u64|null, end_event_id: u64|null} (JSON or
//            named MessagePack; later fields such as `kind` have defaults and are ignored)
//   answer   one stream item, the WorkerKvQueryResponse itself (not Annotated):
//     end < start                      {"InvalidRange":{"start_id","end_id"}}
//     start null                       {"TreeDump":{"events":[…],"last_event_id":newest or 0}}
//     nothing buffered yet             {"TreeDump":{"events":[…],"last_event_id":0}}
//     start > newest                   {"TooNew":{"requested_start","requested_end": end or newest,
//                                        "newest_available"}}
//     start older than the ring        {"TreeDump":{…,"last_event_id":newest}}
//     otherwise                        {"Events":{"events": start … newest,"last_event_id":newest}}
//     another worker or rank           {"Error":"…"}
// Events run through the newest buffered event whatever end_event_id says, as the worker's do.
import type { RouterEvent } from '../../../codec/events.js'
import { readU64 } from '../../../codec/json.js'
import type { EventRing } from '../event-ring.js'
import type { EndpointHandler, IncomingRequest } from './request-plane-server.js'
import { ResponseStream } from './response-stream.js'

export type WorkerQueryResponse =
  | { Events: { events: RouterEvent[]; last_event_id: bigint } }
  | { TreeDump: { events: RouterEvent[]; last_event_id: bigint } }
  | { TooNew: { requested_start: bigint | null; requested_end: bigint | null; newest_available: bigint } }
  | { InvalidRange: { start_id: bigint; end_id: bigint } }
  | { Error: string }

export interface WorkerQuery {
  worker_id: bigint
  dp_rank: number
  start_event_id: bigint | null
  end_event_id: bigint | null
}

/** Reads a WorkerKvQueryRequest; a string says what is wrong with it. */
export function readWorkerQuery(body: unknown): WorkerQuery | string {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return 'the query must be an object'
  const b = body as Record<string, unknown>
  try {
    const opt = (v: unknown, f: string): bigint | null => (v === undefined || v === null ? null : readU64(v, f))
    const dp = b.dp_rank ?? 0
    const rank = typeof dp === 'bigint' ? Number(dp) : dp
    if (typeof rank !== 'number' || !Number.isInteger(rank) || rank < 0) return `dp_rank must be a u32, got ${String(dp)}`
    return {
      worker_id: readU64(b.worker_id, 'worker_id'),
      dp_rank: rank,
      start_event_id: opt(b.start_event_id, 'start_event_id'),
      end_event_id: opt(b.end_event_id, 'end_event_id'),
    }
  } catch (err) {
    return (err as Error).message
  }
}

/** The answer of the worker `workerId` (rank 0) from its ring. */
export function answerWorkerQuery(ring: EventRing, workerId: bigint, q: WorkerQuery): WorkerQueryResponse {
  if (q.worker_id !== workerId || q.dp_rank !== 0) return { Error: `worker ${q.worker_id} rank ${q.dp_rank} is not served here (worker ${workerId} rank 0)` }
  const start = q.start_event_id
  const end = q.end_event_id
  if (start !== null && end !== null && end < start) return { InvalidRange: { start_id: start, end_id: end } }
  const empty = ring.length === 0
  const newest = ring.newestId
  if (start === null) return { TreeDump: { events: ring.treeDump(), last_event_id: empty ? 0n : newest } }
  if (empty) return { TreeDump: { events: ring.treeDump(), last_event_id: 0n } }
  if (start > newest) return { TooNew: { requested_start: start, requested_end: end ?? newest, newest_available: newest } }
  if (start < ring.oldestId) return { TreeDump: { events: ring.treeDump(), last_event_id: newest } }
  return { Events: { events: ring.range(start, newest), last_event_id: newest } }
}

const n = (v: bigint | null): string => (v === null ? 'null' : v.toString())

/** A RouterEvent as serde_json writes it (field order of the struct, start_position null). */
export function routerEventJson(ev: RouterEvent): string {
  const e = ev.event
  const d = e.data
  let data: string
  if (d === 'cleared') data = '"cleared"'
  else if ('stored' in d) {
    const blocks = d.stored.blocks.map((b) => `{"block_hash":${b.block_hash},"tokens_hash":${b.tokens_hash},"mm_extra_info":null}`).join(',')
    data = `{"stored":{"parent_hash":${n(d.stored.parent_hash)},"start_position":null,"blocks":[${blocks}]}}`
  } else data = `{"removed":{"block_hashes":[${d.removed.block_hashes.join(',')}]}}`
  const tier = ev.storage_tier ?? 'device'
  return `{"worker_id":${ev.worker_id},"storage_tier":"${tier}","event":{"event_id":${e.event_id},"data":${data},"dp_rank":${e.dp_rank}}}`
}

/** The JSON text of an answer, u64s exact. */
export function workerQueryResponseJson(r: WorkerQueryResponse): string {
  if ('Events' in r) return `{"Events":{"events":[${r.Events.events.map(routerEventJson).join(',')}],"last_event_id":${r.Events.last_event_id}}}`
  if ('TreeDump' in r) return `{"TreeDump":{"events":[${r.TreeDump.events.map(routerEventJson).join(',')}],"last_event_id":${r.TreeDump.last_event_id}}}`
  if ('TooNew' in r) {
    const t = r.TooNew
    return `{"TooNew":{"requested_start":${n(t.requested_start)},"requested_end":${n(t.requested_end)},"newest_available":${t.newest_available}}}`
  }
  if ('InvalidRange' in r) return `{"InvalidRange":{"start_id":${r.InvalidRange.start_id},"end_id":${r.InvalidRange.end_id}}}`
  return JSON.stringify({ Error: r.Error })
}

/** The answer as a value for the MessagePack writer (RouterEvents as the event plane writes them). */
export function workerQueryResponseValue(r: WorkerQueryResponse): unknown {
  const ev = (x: RouterEvent): unknown => {
    const d = x.event.data
    const data =
      d === 'cleared'
        ? 'cleared'
        : 'stored' in d
          ? {
              stored: {
                parent_hash: d.stored.parent_hash,
                start_position: null,
                blocks: d.stored.blocks.map((b) => ({ block_hash: b.block_hash, tokens_hash: b.tokens_hash, mm_extra_info: null })),
              },
            }
          : { removed: { block_hashes: d.removed.block_hashes } }
    return { worker_id: x.worker_id, storage_tier: x.storage_tier ?? 'device', event: { event_id: x.event.event_id, data, dp_rank: x.event.dp_rank } }
  }
  if ('Events' in r) return { Events: { events: r.Events.events.map(ev), last_event_id: r.Events.last_event_id } }
  if ('TreeDump' in r) return { TreeDump: { events: r.TreeDump.events.map(ev), last_event_id: r.TreeDump.last_event_id } }
  return r
}

export interface WorkerQueryCounters {
  answered: number
  badQueries: number
  callHomeFailed: number
}

export function workerQueryHandler(ring: EventRing, workerId: bigint, counters: WorkerQueryCounters): EndpointHandler {
  return (req: IncomingRequest, done: () => void): void => {
    const q = readWorkerQuery(req.body)
    const answer: WorkerQueryResponse = typeof q === 'string' ? { Error: q } : answerWorkerQuery(ring, workerId, q)
    if (typeof q === 'string') counters.badQueries++
    ResponseStream.open(req.callHome, req.codec, () => undefined).then(
      (s) => {
        counters.answered++
        s.send(
          () => workerQueryResponseJson(answer),
          () => workerQueryResponseValue(answer),
        )
        s.end()
        done()
      },
      () => {
        counters.callHomeFailed++
        done()
      },
    )
  }
}
