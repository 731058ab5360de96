// The JSON messages around a request and its response stream, written and read by hand so that
// their bytes are Dynamo's (serde_json, fields in declaration order):
//
// - the request's two-part header, RequestControlMessage (egress/addressed_router.rs@00c47688,
//   network.rs@0498dbf3), whose connection_info names the call-home listener with a
//   TcpStreamConnectionInfo serialised to a JSON string (tcp.rs, `"transport":"tcp_server"`);
// - the worker's call-home handshake `{"subject","stream_type":"response"}` and prologue
//   `{"error":null}` (tcp/client.rs@5b7cf2be);
// - the control messages `"stop"`, `"kill"`, `"sentinel"` (ControlMessage, snake_case);
// - each data message, NetworkStreamWrapper `{"data"?:…,"complete_final":bool}` in the request's
//   codec, `data` left out of the last one (network.rs@7feb2b81).
import { KvrError } from '../errors.js'
import { jsonStringEnd, jsonValueEnd, skipJsonSpace } from '../codec/json-scan.js'
import type { PayloadCodec } from './payload-codec.js'
import { decodePayload } from './payload-codec.js'

export interface ControlHeader {
  /** The request's id (Dynamo's context id). */
  id: string
  codec: PayloadCodec
  /** The call-home listener's `ip:port`. */
  address: string
  /** The response stream's subject (a v4 UUID). */
  subject: string
}

/** The request's two-part header. */
export function encodeControlHeader(h: ControlHeader): Buffer {
  const info = JSON.stringify({ address: h.address, subject: h.subject, context: h.id, stream_type: 'response' })
  const msg = {
    id: h.id,
    request_type: 'single_in',
    response_type: 'many_out',
    payload_codec: h.codec,
    connection_info: { transport: 'tcp_server', info },
  }
  return Buffer.from(JSON.stringify(msg), 'utf8')
}

export type Control = 'stop' | 'kill' | 'sentinel'

export function encodeControl(c: Control): Buffer {
  return Buffer.from(JSON.stringify(c), 'utf8')
}

function malformed(what: string): KvrError {
  return new KvrError('KVR_ERR_FRAME_MALFORMED', what)
}

function jsonOf(bytes: Buffer, what: string): unknown {
  try {
    return JSON.parse(bytes.toString('utf8'))
  } catch {
    throw malformed(`${what} is not JSON`)
  }
}

/** The subject a call-home handshake names. Throws KVR_ERR_FRAME_MALFORMED. */
export function handshakeSubject(header: Buffer): string {
  const v = jsonOf(header, 'the call-home handshake') as { subject?: unknown; stream_type?: unknown } | null
  if (typeof v !== 'object' || v === null || typeof v.subject !== 'string' || v.stream_type !== 'response')
    throw malformed('the call-home handshake is not {"subject":…,"stream_type":"response"}')
  return v.subject
}

/** The prologue's error, or null for a stream that starts. Throws KVR_ERR_FRAME_MALFORMED. */
export function prologueError(header: Buffer): string | null {
  const v = jsonOf(header, 'the response prologue') as { error?: unknown } | null
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw malformed('the response prologue is not an object')
  if (v.error === null || v.error === undefined) return null
  return typeof v.error === 'string' ? v.error : JSON.stringify(v.error)
}

/** A control message's name. Throws KVR_ERR_FRAME_MALFORMED. */
export function controlOf(header: Buffer): Control {
  const v = jsonOf(header, 'a control message')
  if (v !== 'stop' && v !== 'kill' && v !== 'sentinel') throw malformed('a header-only message that is not a control message')
  return v
}

/** A data message: its item (undefined when it has none) and whether it is the last. */
export interface Wrapped<T> {
  data: T | undefined
  final: boolean
}

/** A data message decoded in the request's codec. Throws KVR_ERR_FRAME_MALFORMED. */
export function unwrapData(body: Buffer, codec: PayloadCodec): Wrapped<unknown> {
  const v = decodePayload(body, codec) as { data?: unknown; complete_final?: unknown } | null
  if (typeof v !== 'object' || v === null || Array.isArray(v) || typeof v.complete_final !== 'boolean')
    throw malformed('a data message is not {"data":…,"complete_final":bool}')
  return { data: v.data === null ? undefined : v.data, final: v.complete_final }
}

/**
 * The bytes [from, to) of a top-level member's value in the JSON object at the start of buf, or
 * null without that member. The text must already be known to be JSON.
 */
export function objectMember(buf: Buffer, key: string): [number, number] | null {
  let i = skipJsonSpace(buf, 0)
  if (buf[i] !== 0x7b) return null
  i++
  for (;;) {
    i = skipJsonSpace(buf, i)
    if (buf[i] !== 0x22) return null
    const keyEnd = jsonStringEnd(buf, i)
    const name = buf.toString('utf8', i + 1, keyEnd)
    const at = skipJsonSpace(buf, skipJsonSpace(buf, keyEnd + 1) + 1)
    const end = jsonValueEnd(buf, at)
    if (end <= at) return null
    if (name === key) return [at, end]
    i = skipJsonSpace(buf, end) + 1
  }
}

/**
 * A JSON data message with its item left as the worker's bytes (a view): for answers handed on
 * unparsed, whose u64s must stay exact. The message is checked as JSON first.
 * Throws KVR_ERR_FRAME_MALFORMED.
 */
export function unwrapJsonBytes(body: Buffer): Wrapped<Buffer> {
  const { data, final } = unwrapData(body, 'json')
  const at = data === undefined ? null : objectMember(body, 'data')
  return { data: at === null ? undefined : body.subarray(at[0], at[1]), final }
}
