// One ZMQ SUB socket of the event plane: connected to a worker's PUB (direct mode) or a broker's
// XPUB, subscribed to the topic prefixes its TopicMatch names, and read in one loop that checks
// every message (src/event-plane/frame.ts) and hands the good ones to its sink in order. A bad
// message is counted by the sink and skipped: nothing a publisher sends ends the loop. While
// the sink is backed up, the loop waits, and ZMQ holds the rest (up to the high-water mark,
// 100,000 messages as Dynamo's SUBs do; beyond, the publisher drops, which the sequence
// numbers then show as a gap). The socket reconnects by itself, with backoff.
import { Subscriber } from 'zeromq'
import { limited } from '../runtime/log.js'
import { EventPlaneMessage, FrameReader } from './frame.js'
import type { DropReason, TopicMatch } from './frame.js'

export interface SubscriberSink {
  /** A checked message; a promise when the next must wait for it. */
  message(from: PlaneSubscriber, m: EventPlaneMessage): Promise<void> | null
  dropped(from: PlaneSubscriber, why: DropReason): void
}

/** Dynamo's SUB high-water mark. */
export const RECEIVE_HWM = 100_000

export class PlaneSubscriber {
  private readonly sock = new Subscriber({
    receiveHighWaterMark: RECEIVE_HWM,
    linger: 0,
    reconnectInterval: 100,
    reconnectMaxInterval: 5000,
  })
  private readonly reader: FrameReader
  private readonly msg = new EventPlaneMessage()
  private closed = false
  private readonly loop: Promise<void>
  /** The publisher of the last message read (direct mode: a new one on the same socket is a restart). */
  lastPublisherHi = -1
  lastPublisherLo = -1

  constructor(
    readonly endpoint: string,
    readonly broker: boolean,
    match: TopicMatch,
    private readonly sink: SubscriberSink,
  ) {
    this.reader = new FrameReader(match)
    this.sock.connect(endpoint)
    for (const p of match.prefixes) this.sock.subscribe(p)
    this.loop = this.receive()
  }

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.sock) {
        const why = this.reader.read(frames, this.msg)
        if (why !== null) {
          this.sink.dropped(this, why)
          continue
        }
        const wait = this.sink.message(this, this.msg)
        if (wait !== null) await wait
        if (this.closed) return
      }
    } catch (err) {
      // the socket was closed under the loop (the subscriber is stopping), or failed: said, never thrown
      if (!this.closed)
        limited.warn(
          'event_plane_socket_error',
          { endpoint: this.endpoint, error: (err as Error).message },
          'an event-plane SUB socket failed: its publisher is not read until its record changes',
        )
    }
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    this.sock.close()
    await this.loop.catch(() => undefined)
  }
}
