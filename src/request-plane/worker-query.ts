// Dynamo's worker query (gap recovery, docs/dynamo-compatibility.md): a worker that keeps a local
// indexer answers `worker_kv_indexer_query_dp{rank}` on its component with the KV events a router
// missed, or a dump of what it caches. The request, WorkerKvQueryRequest, is
// `{worker_id, dp_rank, start_event_id, end_event_id}` (the v3 fields left to their serde
// defaults); the answer is the stream's first item, not wrapped in Annotated
// (recovery/worker_query_transport.rs@5c97a400). Answer generations read here, externally tagged:
//
//   {"Events":[RouterEvent…]}  {"TreeDump":[…]}                       (v1)
//   {"Events":{"events":[…],"last_event_id":u64}}  same for TreeDump   (v2)
//   {"TooNew":{"requested_start","requested_end","newest_available"}}
//   {"InvalidRange":{"start_id","end_id"}}  {"Error":"msg"}
//
// Any other variant (v3's Status, StateAgentRecovery, TreeDumpFailed, or later ones) is ignored
// and reported as such, for the caller to count. The events are handed on as the worker's bytes:
// the shard's decoder validates each one and u64s stay exact.
import { parseJsonExact, readU64 } from '../codec/json.js'
import { isKvrError } from '../errors.js'
import type { InstanceAddress } from './address.js'
import { parseInstanceAddress, siblingEndpoint } from './address.js'
import type { RequestPlaneClient } from './client.js'
import { objectMember } from './control-message.js'

export type WorkerQueryAnswer =
  | { kind: 'Events' | 'TreeDump'; events: Uint8Array; lastEventId: bigint | null }
  | { kind: 'TooNew'; newest: bigint }
  /** `final` when asking again cannot help; `ignored` names a variant this router does not read. */
  | { kind: 'refused'; why: string; final: boolean; ignored?: string }

export interface WorkerQuery {
  workerId: bigint
  dpRank: number
  /** null: a tree dump. */
  start: bigint | null
  end: bigint | null
}

/** The endpoint a worker serves the query for one dp rank on. */
export function workerQueryEndpoint(dpRank: number): string {
  return `worker_kv_indexer_query_dp${dpRank}`
}

/** The request as JSON text, u64s exact. */
export function workerQueryJson(q: WorkerQuery): string {
  return `{"worker_id":${q.workerId},"dp_rank":${q.dpRank},"start_event_id":${q.start ?? 'null'},"end_event_id":${q.end ?? 'null'}}`
}

function refused(why: string, ignored?: string): WorkerQueryAnswer {
  return ignored === undefined ? { kind: 'refused', why, final: true } : { kind: 'refused', why, final: true, ignored }
}

/** One answer (the JSON bytes of a WorkerKvQueryResponse). Never throws. */
export function parseWorkerQueryAnswer(bytes: Buffer): WorkerQueryAnswer {
  let v: unknown
  try {
    v = parseJsonExact(bytes.toString('utf8'))
  } catch {
    return refused('the answer is not JSON')
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return refused('the answer is not an object')
  const keys = Object.keys(v)
  const tag = keys[0]
  if (keys.length !== 1 || tag === undefined) return refused('the answer is not one variant')
  const inner = (v as Record<string, unknown>)[tag]
  if (tag === 'TooNew') {
    try {
      return { kind: 'TooNew', newest: readU64((inner as { newest_available?: unknown } | null)?.newest_available, 'newest_available') }
    } catch {
      return refused('TooNew without its newest_available')
    }
  }
  if (tag === 'Events' || tag === 'TreeDump') {
    const at = objectMember(bytes, tag)
    if (at === null) return refused(`${tag} could not be read`)
    if (Array.isArray(inner)) return { kind: tag, events: bytes.subarray(at[0], at[1]), lastEventId: null }
    const o = inner as { events?: unknown; last_event_id?: unknown } | null
    if (typeof o !== 'object' || o === null || !Array.isArray(o.events)) return refused(`${tag} is not an array nor {events, last_event_id}`)
    const value = bytes.subarray(at[0], at[1])
    const ev = objectMember(value, 'events')
    if (ev === null) return refused(`${tag}.events could not be read`)
    let lastEventId: bigint | null = null
    try {
      if (o.last_event_id !== undefined && o.last_event_id !== null) lastEventId = readU64(o.last_event_id, 'last_event_id')
    } catch {
      return refused(`${tag}.last_event_id is not a u64`)
    }
    return { kind: tag, events: value.subarray(ev[0], ev[1]), lastEventId }
  }
  if (tag === 'InvalidRange') {
    const r = inner as { start_id?: unknown; end_id?: unknown } | null
    return refused(`the worker answered InvalidRange (${String(r?.start_id)}..${String(r?.end_id)})`)
  }
  if (tag === 'Error') return refused(`the worker said: ${typeof inner === 'string' ? inner : JSON.stringify(inner)}`)
  return refused(`the worker answered ${tag.slice(0, 64)}, which this router does not read`, tag.slice(0, 64))
}

/**
 * Asks a worker over the request plane. `address` is any of the worker process's endpoint
 * addresses (its `generate` instance's `transport.tcp`): the query endpoint is its sibling.
 * Never rejects: a transport failure is a refusal, final when the worker does not serve the
 * endpoint or its answer does not decode.
 */
export async function queryWorkerOverTcp(
  client: RequestPlaneClient,
  address: string | InstanceAddress,
  q: WorkerQuery,
  signal?: AbortSignal,
): Promise<WorkerQueryAnswer> {
  let a: InstanceAddress
  try {
    a = siblingEndpoint(typeof address === 'string' ? parseInstanceAddress(address) : address, workerQueryEndpoint(q.dpRank))
  } catch (err) {
    return refused((err as Error).message)
  }
  const payload = { worker_id: q.workerId, dp_rank: q.dpRank, start_event_id: q.start, end_event_id: q.end }
  try {
    const stream = await client.request<Buffer>(a, payload, { codec: 'json', raw: true, ...(signal === undefined ? {} : { signal }) })
    const first = await stream.next()
    // one answer is read; whatever else the worker would send is not wanted
    await stream.return()
    if (first.done === true) return refused('the worker ended its answer stream without an answer')
    return parseWorkerQueryAnswer(first.value)
  } catch (err) {
    const final = isKvrError(err, 'KVR_ERR_WORKER_REJECTED') || isKvrError(err, 'KVR_ERR_FRAME_MALFORMED') || isKvrError(err, 'KVR_ERR_INSTANCE_ADDRESS')
    return { kind: 'refused', why: (err as Error).message, final }
  }
}
