// The request plane's payload codec, named by a request's `payload_codec` in its control header
// ("json" when absent; lib/runtime/src/pipeline/network.rs@0498dbf3). It encodes the request's
// body and decodes its response stream's data messages, and both directions use it:
//   json     serde_json: u64 values as exact integers (bigints written as integers; integers
//            past 2^53 read as decimal strings, src/codec/json.ts)
//   msgpack  rmp_serde::to_vec_named: maps with field names, the smallest integer encodings;
//            64-bit integers read as bigints
// MessagePack floats go as float64, which serde reads into f32 fields as it reads JSON numbers;
// float32 would round a f64 field (a guided_json schema's numbers) on the way.
import { Packr, Unpackr } from 'msgpackr'
import { parseJsonExact, serializeJson } from '../codec/json.js'
import { KvrError } from '../errors.js'

export type PayloadCodec = 'json' | 'msgpack'

const packr = new Packr({ useRecords: false, variableMapSize: true })
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' })

/** Any value in `codec`. */
export function encodePayload(value: unknown, codec: PayloadCodec): Buffer {
  return codec === 'json' ? Buffer.from(serializeJson(value), 'utf8') : packr.pack(value)
}

/** A data message of a response stream. Throws KVR_ERR_FRAME_MALFORMED. */
export function decodePayload(bytes: Uint8Array, codec: PayloadCodec): unknown {
  try {
    return codec === 'json' ? parseJsonExact(utf8(bytes)) : unpackr.unpack(bytes)
  } catch (err) {
    throw new KvrError('KVR_ERR_FRAME_MALFORMED', `a response message is not ${codec === 'json' ? 'JSON' : 'MessagePack'}: ${(err as Error).message}`)
  }
}

/**
 * One item of a worker's answer stream (read it with readEngineItem, src/frontend/engine-output.ts).
 * Bytes that do not decode are the worker's fault: a KVR_ERR_UPSTREAM.
 */
export function decodeItem(bytes: Uint8Array, codec: PayloadCodec): unknown {
  try {
    return codec === 'json' ? JSON.parse(utf8(bytes)) : unpackr.unpack(bytes)
  } catch (err) {
    throw new KvrError('KVR_ERR_UPSTREAM', `the worker sent a stream item that is not ${codec === 'json' ? 'JSON' : 'MessagePack'}: ${(err as Error).message}`)
  }
}

function utf8(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8')
}

/**
 * A request whose only u64 is its routing hints' worker id, in a field just before
 * router_config_override (null), after every field a client writes: Dynamo's PreprocessedRequest
 * (src/frontend/preprocessed-request.ts).
 */
export interface RoutedRequest {
  routing?: { backend_instance_id?: bigint }
  router_config_override: null
}

const ROUTING_AT = '"routing":0,"router_config_override":null'

/**
 * The request as JSON, the worker id an exact integer. JSON.stringify with a replacer (what
 * serializeJson does for bigints) calls it for every prompt token, ten times the cost of the
 * plain call on a long prompt; so the routing hints are written apart and put in place, where
 * the last match of ROUTING_AT is theirs.
 */
function requestJson(req: RoutedRequest): string {
  const r = req.routing
  if (r?.backend_instance_id === undefined) return JSON.stringify(req)
  const text = JSON.stringify({ ...req, routing: 0 })
  const at = text.lastIndexOf(ROUTING_AT)
  // backend_instance_id is RoutingHints' first field
  const { backend_instance_id: id, ...rest } = r
  const others = JSON.stringify(rest)
  const routing = others === '{}' ? `{"backend_instance_id":${id}}` : `{"backend_instance_id":${id},${others.slice(1)}`
  return `${text.slice(0, at)}"routing":${routing},"router_config_override":null${text.slice(at + ROUTING_AT.length)}`
}

/** A routed request's bytes in `codec`. */
export function encodeRequest(req: RoutedRequest, codec: PayloadCodec): Buffer {
  if (codec === 'json') return Buffer.from(requestJson(req), 'utf8')
  const r = req.routing
  const id = r?.backend_instance_id
  // a u64 a double holds exactly goes as a number, which msgpackr writes as rmp_serde does (the
  // smallest uint that fits); a larger one stays a bigint, written as a 64-bit integer
  if (r === undefined || id === undefined || id > BigInt(Number.MAX_SAFE_INTEGER)) return packr.pack(req)
  return packr.pack({ ...req, routing: { ...r, backend_instance_id: Number(id) } })
}
