// The request plane's payload codec: how a PreprocessedRequest goes to a worker and how the
// items of its answer come back. A request's control header names it (`payload_codec`, "json"
// when absent; lib/runtime/src/pipeline/network.rs@0498dbf3), and both directions use it:
//   json     serde_json: u64 ids as exact integers (src/codec/json.ts)
//   msgpack  rmp_serde::to_vec_named: maps with field names, the smallest integer encodings
// MessagePack floats go as float64, which serde reads into f32 fields as it reads JSON numbers;
// float32 would round a f64 field (a guided_json schema's numbers) on the way.
import { Packr, Unpackr } from 'msgpackr'
import { serializeJson } from '../codec/json.js'
import { KvrError } from '../errors.js'
import type { PreprocessedRequest } from './preprocessed-request.js'

export type PayloadCodec = 'json' | 'msgpack'

const packr = new Packr({ useRecords: false, variableMapSize: true })
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true })

/** bigints a double holds exactly become numbers, which msgpackr writes as rmp_serde does: the smallest uint that fits. */
function compactIds(v: unknown): unknown {
  if (typeof v === 'bigint') return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= 0n ? Number(v) : v
  if (Array.isArray(v)) return v.map(compactIds)
  if (v !== null && typeof v === 'object') {
    const out: Record<string, unknown> = {}
    for (const [k, x] of Object.entries(v)) out[k] = compactIds(x)
    return out
  }
  return v
}

/** The request's bytes in `codec`. */
export function encodeRequest(req: PreprocessedRequest, codec: PayloadCodec): Buffer {
  if (codec === 'json') return Buffer.from(serializeJson(req), 'utf8')
  return packr.pack(compactIds(req))
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
