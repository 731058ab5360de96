// One message of Dynamo's ZMQ event plane, checked before its envelope goes to a shard:
//
//   frame 0  topic: `kv-events` from a worker's own PUB; through a broker, the full subject
//            (`namespace.{ns}.component.{c}[.endpoint.{e}].kv-events`) or, from older
//            publishers, the bare topic
//   frame 1  publisher_id, u64 big-endian
//   frame 2  sequence, u64 big-endian (per publisher, from 0, +1 per message)
//   frame 3  [u8 version = 1][u32 BE length][MessagePack EventEnvelope]
//
// The envelope is a named map {topic, publisher_id, sequence, published_at, payload: bin} (other
// keys, such as published_at_ns, are passed over). Its ids must be frames 1 and 2, and its topic
// `kv-events`. The RouterEvent in its payload is decoded by the shard (src/codec/dynamo-msgpack.ts),
// not here: this module reads the few header fields in place and builds no value, since it runs
// on the main thread for every event. A message that is not all of this is refused with a reason
// (a label of kvrouter_event_plane_dropped_total), never thrown.
import { KvrError } from '../errors.js'
import { MsgpackCursor } from '../codec/msgpack-reader.js'

export const FRAME_VERSION = 1
export const FRAME_HEADER_SIZE = 5
/** The event plane's topic of KV events (Dynamo's KV_EVENT_SUBJECT). */
export const KV_EVENTS_TOPIC = 'kv-events'

/** Why a message was dropped. */
export const DROP_REASONS = [
  'frame_count',
  'topic',
  'id_frame',
  'frame_header',
  'frame_version',
  'frame_length',
  'envelope',
  'envelope_topic',
  'id_mismatch',
] as const
export type DropReason = (typeof DROP_REASONS)[number]

const enc = new TextEncoder()
const K_TOPIC = enc.encode('topic')
const K_PUBLISHER = enc.encode('publisher_id')
const K_SEQUENCE = enc.encode('sequence')
const K_PAYLOAD = enc.encode('payload')

class EnvelopeCursor extends MsgpackCursor {
  hi = 0
  lo = 0
  truncated(): KvrError {
    return new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', 'truncated envelope')
  }
  malformed(what: string): KvrError {
    return new KvrError('KVR_ERR_EVENT_MALFORMED_MSGPACK', what)
  }
  /** A MessagePack unsigned integer (as rmp_serde writes a u64) into hi/lo; false for anything else. */
  u64(): boolean {
    const b = this.buf
    const p = this.pos
    if (p >= this.end) return false
    const m = b[p] as number
    if (m <= 0x7f) {
      this.hi = 0
      this.lo = m
      this.pos = p + 1
      return true
    }
    const n = m === 0xcc ? 1 : m === 0xcd ? 2 : m === 0xce ? 4 : m === 0xcf ? 8 : 0
    if (n === 0 || p + 1 + n > this.end) return false
    if (n === 8) {
      this.hi = this.u32At(p + 1)
      this.lo = this.u32At(p + 5)
    } else {
      this.hi = 0
      this.lo = n === 1 ? (b[p + 1] as number) : n === 2 ? this.u16At(p + 1) : this.u32At(p + 1)
    }
    this.pos = p + 1 + n
    return true
  }
}

/** Which frame-0 topics a subscription takes. */
export interface TopicMatch {
  /** The ZMQ subscription prefixes to set on the socket. */
  readonly prefixes: readonly string[]
  matches(topic: Uint8Array): boolean
}

function bytesEqual(a: Uint8Array, aFrom: number, b: Uint8Array): boolean {
  if (a.length - aFrom < b.length) return false
  for (let i = 0; i < b.length; i++) if (a[aFrom + i] !== b[i]) return false
  return true
}

/** A worker's own PUB socket: frame 0 is exactly the topic (ZMQ's prefix match would also take `kv-events-x`). */
export function directTopic(topic: string = KV_EVENTS_TOPIC): TopicMatch {
  const t = enc.encode(topic)
  return { prefixes: [topic], matches: (f) => f.length === t.length && bytesEqual(f, 0, t) }
}

/**
 * A broker's XPUB: the component's subject `{prefix}.kv-events`, an endpoint's
 * `{prefix}.endpoint.{e}.kv-events` (e one percent-encoded segment, so without dots), or the bare
 * topic of publishers that put only the topic in frame 0.
 */
export function brokerTopic(namespace: string, component: string, topic: string = KV_EVENTS_TOPIC): TopicMatch {
  const prefix = `namespace.${encodeEventSegment(namespace)}.component.${encodeEventSegment(component)}.`
  const p = enc.encode(prefix)
  const tail = enc.encode(`.${encodeEventSegment(topic)}`)
  const bare = enc.encode(topic)
  const endpoint = enc.encode('endpoint.')
  return {
    prefixes: [prefix, topic],
    matches: (f) => {
      if (f.length === bare.length && bytesEqual(f, 0, bare)) return true
      if (!bytesEqual(f, 0, p) || f.length < p.length + tail.length - 1) return false
      const tailAt = f.length - tail.length
      // `{prefix}kv-events`: the tail's dot is the prefix's last byte
      if (tailAt === p.length - 1) return bytesEqual(f, tailAt + 1, bare)
      if (!bytesEqual(f, tailAt, tail) || !bytesEqual(f, p.length, endpoint)) return false
      const from = p.length + endpoint.length
      if (from >= tailAt) return false
      for (let i = from; i < tailAt; i++) if (f[i] === 0x2e) return false
      return true
    },
  }
}

/** Dynamo's encode_event_segment: every byte but [A-Za-z0-9_-] as %XX (upper-case hex). */
export function encodeEventSegment(value: string): string {
  let out = ''
  for (const b of enc.encode(value)) {
    const c = String.fromCharCode(b)
    out += /[A-Za-z0-9_-]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, '0')}`
  }
  return out
}

/** Its inverse; null when the text is not such an encoding. */
export function decodeEventSegment(value: string): string | null {
  const bytes: number[] = []
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i)
    if (c !== 0x25) {
      if (c > 0x7f) return null
      bytes.push(c)
      continue
    }
    const hex = value.slice(i + 1, i + 3)
    if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return null
    bytes.push(Number.parseInt(hex, 16))
    i += 2
  }
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(Uint8Array.from(bytes))
  } catch {
    return null
  }
}

/** One checked message, read into reused fields: its ids as u32 halves and the envelope's bytes. */
export class EventPlaneMessage {
  publisherHi = 0
  publisherLo = 0
  sequenceHi = 0
  sequenceLo = 0
  /** The EventEnvelope (frame 3 without its header), a view of the received frame. */
  envelope: Uint8Array = new Uint8Array(0)

  get publisherId(): bigint {
    return (BigInt(this.publisherHi) << 32n) | BigInt(this.publisherLo)
  }
  get sequence(): bigint {
    return (BigInt(this.sequenceHi) << 32n) | BigInt(this.sequenceLo)
  }
}

/** Checks messages against one topic match; reuse one reader (and one message) per socket loop. */
export class FrameReader {
  private readonly cur = new EnvelopeCursor(64)
  private readonly topic: Uint8Array

  constructor(
    private readonly match: TopicMatch,
    envelopeTopic: string = KV_EVENTS_TOPIC,
  ) {
    this.topic = enc.encode(envelopeTopic)
  }

  /** Reads the frames into out: null when the message is good, else why it is not. */
  read(frames: readonly Uint8Array[], out: EventPlaneMessage): DropReason | null {
    if (frames.length !== 4) return 'frame_count'
    const [f0, f1, f2, f3] = frames as [Uint8Array, Uint8Array, Uint8Array, Uint8Array]
    if (!this.match.matches(f0)) return 'topic'
    if (f1.length !== 8 || f2.length !== 8) return 'id_frame'
    if (f3.length < FRAME_HEADER_SIZE) return 'frame_header'
    if (f3[0] !== FRAME_VERSION) return 'frame_version'
    const len = (((f3[1] as number) << 24) | ((f3[2] as number) << 16) | ((f3[3] as number) << 8) | (f3[4] as number)) >>> 0
    // Dynamo's Frame::decode takes the declared length and ignores any bytes after it
    if (len > f3.length - FRAME_HEADER_SIZE) return 'frame_length'
    const env = f3.subarray(FRAME_HEADER_SIZE, FRAME_HEADER_SIZE + len)
    const why = this.envelope(env)
    if (why !== null) return why
    const c = this.cur
    if (c.hi !== readU32(f1, 0) || c.lo !== readU32(f1, 4)) return 'id_mismatch'
    out.publisherHi = c.hi
    out.publisherLo = c.lo
    if (this.seqHi !== readU32(f2, 0) || this.seqLo !== readU32(f2, 4)) return 'id_mismatch'
    out.sequenceHi = this.seqHi
    out.sequenceLo = this.seqLo
    out.envelope = env
    return null
  }

  private seqHi = 0
  private seqLo = 0

  /** The envelope's publisher_id (into cur.hi/lo), sequence and topic; a payload must be there. */
  private envelope(env: Uint8Array): DropReason | null {
    const c = this.cur
    c.reset(env)
    let pubHi = -1
    let pubLo = 0
    let seen = 0
    try {
      if (!c.mapHeader()) return 'envelope'
      const n = c.len
      for (let i = 0; i < n; i++) {
        if (!c.strHeader()) return 'envelope'
        const at = c.pos
        const klen = c.len
        if (klen > c.end - at) return 'envelope'
        c.pos = at + klen
        if (klen === K_PUBLISHER.length && c.bytesAre(at, K_PUBLISHER)) {
          if (!c.u64()) return 'envelope'
          pubHi = c.hi
          pubLo = c.lo
          seen |= 1
        } else if (klen === K_SEQUENCE.length && c.bytesAre(at, K_SEQUENCE)) {
          if (!c.u64()) return 'envelope'
          this.seqHi = c.hi
          this.seqLo = c.lo
          seen |= 2
        } else if (klen === K_TOPIC.length && c.bytesAre(at, K_TOPIC)) {
          if (!c.strHeader()) return 'envelope'
          const tAt = c.pos
          if (c.len > c.end - tAt) return 'envelope'
          c.pos = tAt + c.len
          if (c.len !== this.topic.length || !c.bytesAre(tAt, this.topic)) return 'envelope_topic'
          seen |= 4
        } else if (klen === K_PAYLOAD.length && c.bytesAre(at, K_PAYLOAD)) {
          if (!c.binHeader() || c.len > c.end - c.pos) return 'envelope'
          c.pos += c.len
          seen |= 8
        } else {
          c.skip()
        }
      }
      if (c.pos !== c.end) return 'envelope'
    } catch {
      return 'envelope'
    }
    if (seen !== 15) return 'envelope'
    c.hi = pubHi
    c.lo = pubLo
    return null
  }
}

function readU32(b: Uint8Array, at: number): number {
  return (((b[at] as number) << 24) | ((b[at + 1] as number) << 16) | ((b[at + 2] as number) << 8) | (b[at + 3] as number)) >>> 0
}
