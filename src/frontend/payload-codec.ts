// The request plane's payload codec: how a PreprocessedRequest goes to a worker and how the
// items of its answer come back. A request's control header names it (`payload_codec`, "json"
// when absent; lib/runtime/src/pipeline/network.rs@0498dbf3), and both directions use it:
//   json     serde_json: u64 ids as exact integers
//   msgpack  rmp_serde::to_vec_named: maps with field names, the smallest integer encodings
// MessagePack floats go as float64, which serde reads into f32 fields as it reads JSON numbers;
// float32 would round a f64 field (a guided_json schema's numbers) on the way.
import { Packr, Unpackr } from 'msgpackr'
import { KvrError } from '../errors.js'
import type { PreprocessedRequest } from './preprocessed-request.js'

export type PayloadCodec = 'json' | 'msgpack'

const packr = new Packr({ useRecords: false, variableMapSize: true })
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true })

const ROUTING_AT = '"routing":0,"router_config_override":null'

/**
 * The request as JSON, the worker id an exact integer. JSON.stringify with a replacer (what
 * serializeJson does for bigints) calls it for every prompt token, ten times the cost of the
 * plain call on a long prompt; so the routing hints, the only u64, are written apart and put in
 * place. They sit just before router_config_override (null), after every field a client
 * writes, so the last match is theirs.
 */
function requestJson(req: PreprocessedRequest): string {
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

/** The request's bytes in `codec`. */
export function encodeRequest(req: PreprocessedRequest, codec: PayloadCodec): Buffer {
  if (codec === 'json') return Buffer.from(requestJson(req), 'utf8')
  const r = req.routing
  const id = r?.backend_instance_id
  // a u64 a double holds exactly goes as a number, which msgpackr writes as rmp_serde does (the
  // smallest uint that fits); a larger one stays a bigint, written as a 64-bit integer
  if (r === undefined || id === undefined || id > BigInt(Number.MAX_SAFE_INTEGER)) return packr.pack(req)
  return packr.pack({ ...req, routing: { ...r, backend_instance_id: Number(id) } })
}

/**
 * One item of a worker's answer stream, decoded (read it with readEngineItem,
 * src/frontend/engine-output.ts). Bytes that do not decode are a KVR_ERR_UPSTREAM.
 */
export function decodeItem(bytes: Uint8Array, codec: PayloadCodec): unknown {
  try {
    if (codec === 'json') return JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8'))
    return unpackr.unpack(bytes)
  } catch (err) {
    throw new KvrError('KVR_ERR_UPSTREAM', `the worker sent a stream item that is not ${codec === 'json' ? 'JSON' : 'MessagePack'}: ${(err as Error).message}`)
  }
}
