// One publisher of a Dynamo worker's event plane, in its default direct-ZMQ mode
// (lib/runtime/src/transports/event_plane/mod.rs@0e8f3009, zmq_transport.rs@0a8ea9dd): a PUB
// socket bound on an ephemeral port, advertised in discovery as tcp://HOST:PORT, and one
// 4-frame message per event:
//
//   [topic][publisher_id u64 BE][sequence u64 BE, from 0][u8 1][u32 BE len][envelope]
//
// publisher_id is random per publisher and kept within 2^53 − 1 (Dynamo masks it so the id stays
// exact in the JSON of its discovery record). A slow subscriber loses messages beyond the send
// high-water mark (100,000, as Dynamo sets it) rather than blocking the engine.
import { randomBytes } from 'node:crypto'
import { Publisher } from 'zeromq'
import { KvrError } from '../../../errors.js'
import { eventFrame } from './event-messages.js'
import { MsgpackWriter } from './msgpack-writer.js'

const SEND_HWM = 100_000

/** A random publisher id in [1, 2^53 − 1]. */
export function randomPublisherId(): bigint {
  const v = randomBytes(8).readBigUInt64BE(0) & 0x1fffffffffffffn
  return v === 0n ? 1n : v
}

function be8(v: bigint): Buffer {
  const b = Buffer.allocUnsafe(8)
  b.writeBigUInt64BE(v)
  return b
}

export interface EventChannelOptions {
  topic: string
  /** Address the PUB socket binds (default 127.0.0.1). */
  bindHost?: string
  /** Host written into the advertised endpoint (default: bindHost). */
  advertiseHost?: string
  publisherId?: bigint
  /** Told about failed sends (once per run of failures). */
  onError?: (message: string) => void
  /**
   * A fault for tests of a subscriber's recovery: messages numbered `from` to `from + count - 1`
   * are not sent, their numbers spent, as a subscriber past its high-water mark loses them.
   */
  drop?: { from: bigint; count: number }
}

export class EventChannel {
  readonly topic: string
  readonly publisherId: bigint
  /** tcp://HOST:PORT as subscribers reach it; set by bind(). */
  endpoint = ''
  /** Messages handed to the socket, sends that failed, and messages the `drop` fault kept back. */
  readonly counters = { sent: 0, sendErrors: 0, dropped: 0 }
  private readonly pub = new Publisher({ linger: 0, sendHighWaterMark: SEND_HWM, sendTimeout: 0 })
  private readonly topicFrame: Buffer
  private readonly idFrame: Buffer
  private readonly writer = new MsgpackWriter()
  private nextSeq = 0n
  private outbox: Buffer[][] = []
  private sending: Promise<void> | null = null
  private failing = false
  private closed = false

  private constructor(private readonly o: EventChannelOptions) {
    this.topic = o.topic
    this.publisherId = o.publisherId ?? randomPublisherId()
    this.topicFrame = Buffer.from(o.topic, 'utf8')
    this.idFrame = be8(this.publisherId)
  }

  /** Binds on an ephemeral port; a KvrError when the socket cannot be bound. */
  static async bind(o: EventChannelOptions): Promise<EventChannel> {
    const c = new EventChannel(o)
    const host = o.bindHost ?? '127.0.0.1'
    const at = `tcp://${host.includes(':') ? `[${host}]` : host}:0`
    try {
      await c.pub.bind(at)
    } catch (err) {
      c.pub.close()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot bind the event-plane PUB socket to ${at}: ${(err as Error).message}`, { cause: err })
    }
    const port = /:(\d+)$/.exec(c.pub.lastEndpoint ?? '')?.[1]
    const adv = o.advertiseHost ?? host
    c.endpoint = `tcp://${adv.includes(':') ? `[${adv}]` : adv}:${port}`
    return c
  }

  /** The sequence number the next message gets (= messages published). */
  get sequence(): bigint {
    return this.nextSeq
  }

  /** Wraps `payload` (named MessagePack of the topic's type) in an envelope and sends it. */
  publish(payload: Uint8Array): void {
    if (this.closed) return
    const seq = this.nextSeq++
    const d = this.o.drop
    if (d !== undefined && seq >= d.from && seq < d.from + BigInt(d.count)) {
      this.counters.dropped++
      return
    }
    const frame = eventFrame(this.writer, { publisherId: this.publisherId, sequence: seq, publishedAt: Date.now(), topic: this.topic }, payload)
    this.outbox.push([this.topicFrame, this.idFrame, be8(seq), frame])
    this.sending ??= this.sendLoop()
  }

  async flush(): Promise<void> {
    while (this.sending !== null) await this.sending
  }

  async close(): Promise<void> {
    if (this.closed) return
    await this.flush()
    this.closed = true
    this.pub.close()
  }

  // zeromq allows one send in flight per socket: messages go out one after the other
  private async sendLoop(): Promise<void> {
    try {
      while (this.outbox.length > 0 && !this.closed) {
        const batch = this.outbox
        this.outbox = []
        for (const frames of batch) {
          try {
            await this.pub.send(frames)
            this.counters.sent++
            this.failing = false
          } catch (err) {
            this.counters.sendErrors++
            if (!this.failing) this.o.onError?.(`cannot publish on ${this.topic} at ${this.endpoint}: ${(err as Error).message}`)
            this.failing = true
          }
        }
      }
    } finally {
      this.sending = null
    }
  }
}
