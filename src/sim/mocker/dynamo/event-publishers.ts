// What an engine publishes on its Dynamo event plane: its KV events (one RouterEvent per message
// on topic kv-events, as the worker's publisher sends them) and its load (ActiveLoad on topic
// kv_metrics). Each has its own channel: a Dynamo worker creates one EventPublisher per topic,
// each with its own socket, publisher id and discovery record.
import type { RouterEvent } from '../../../codec/events.js'
import type { EngineLoad } from '../engine.js'
import type { EventPublisher } from '../publisher.js'
import type { EventChannel } from './event-channel.js'
import { writeActiveLoad, writeRouterEvent } from './event-messages.js'
import { MsgpackWriter } from './msgpack-writer.js'

export class DynamoKvEventPublisher implements EventPublisher {
  private readonly writer = new MsgpackWriter()

  constructor(readonly channel: EventChannel) {}

  publish(ev: RouterEvent): void {
    writeRouterEvent(this.writer.reset(), ev)
    this.channel.publish(this.writer.bytes())
  }

  flush(): Promise<void> {
    return this.channel.flush()
  }

  close(): Promise<void> {
    return this.channel.close()
  }
}

export interface DynamoLoadPublisherOptions {
  /** Unconditional report period (ms, default 1000). */
  intervalMs?: number
  /** Reports on change are at least this far apart (ms, default 100). */
  minGapMs?: number
}

/**
 * kv_metrics for one engine: a report when its KV blocks in use change (at most one per
 * minGapMs), and one every intervalMs regardless, so a router that starts late learns the load.
 */
export class DynamoLoadPublisher {
  private readonly writer = new MsgpackWriter(64)
  private last = -1
  private lastAt = -Infinity
  private pending: NodeJS.Timeout | null = null
  private readonly heartbeat: NodeJS.Timeout
  private readonly minGap: number
  private closed = false
  reports = 0

  constructor(
    readonly channel: EventChannel,
    private readonly load: () => EngineLoad,
    o: DynamoLoadPublisherOptions = {},
  ) {
    this.minGap = o.minGapMs ?? 100
    this.heartbeat = setInterval(() => this.send(), o.intervalMs ?? 1000)
    this.heartbeat.unref()
    this.send()
  }

  /** The engine's state may have changed (called after every step). */
  update(): void {
    if (this.closed || this.pending !== null) return
    if (this.load().activeBlocks === this.last) return
    const wait = this.lastAt + this.minGap - performance.now()
    if (wait <= 0) this.send()
    else {
      this.pending = setTimeout(() => {
        this.pending = null
        this.send()
      }, wait)
      this.pending.unref()
    }
  }

  private send(): void {
    if (this.closed) return
    const l = this.load()
    this.last = l.activeBlocks
    this.lastAt = performance.now()
    this.reports++
    writeActiveLoad(this.writer.reset(), l)
    this.channel.publish(this.writer.bytes())
  }

  async close(): Promise<void> {
    this.closed = true
    clearInterval(this.heartbeat)
    if (this.pending !== null) clearTimeout(this.pending)
    await this.channel.close()
  }
}
