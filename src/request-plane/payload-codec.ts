// The codec of a request's body and of its response stream's data messages, named by the
// request's `payload_codec` (lib/runtime/src/pipeline/network.rs@0498dbf3): JSON, or MessagePack
// with named fields (rmp-serde's struct maps). u64 values stay exact both ways: bigints are
// written as integers, JSON integers past 2^53 are read as decimal strings
// (src/codec/json.ts) and MessagePack 64-bit integers as bigints.
import { Packr, Unpackr } from 'msgpackr'
import { parseJsonExact, serializeJson } from '../codec/json.js'
import { KvrError } from '../errors.js'

export type PayloadCodec = 'json' | 'msgpack'

const packr = new Packr({ useRecords: false, variableMapSize: true })
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' })

export function encodePayload(value: unknown, codec: PayloadCodec): Buffer {
  return codec === 'json' ? Buffer.from(serializeJson(value), 'utf8') : packr.pack(value)
}

/** Throws KVR_ERR_FRAME_MALFORMED. */
export function decodePayload(bytes: Uint8Array, codec: PayloadCodec): unknown {
  try {
    return codec === 'json' ? parseJsonExact(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('utf8')) : unpackr.unpack(bytes)
  } catch (err) {
    throw new KvrError('KVR_ERR_FRAME_MALFORMED', `a response message is not ${codec === 'json' ? 'JSON' : 'MessagePack'}: ${(err as Error).message}`)
  }
}
