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
import { LoadReports } from '../load-reports.js'
import type { LoadReportOptions } from '../load-reports.js'

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

export type DynamoLoadPublisherOptions = LoadReportOptions

/** kv_metrics for one engine on its event plane: a report when its KV blocks in use change (load-reports.ts says when). */
export class DynamoLoadPublisher {
  private readonly writer = new MsgpackWriter(64)
  private readonly reportsOf: LoadReports

  constructor(
    readonly channel: EventChannel,
    load: () => EngineLoad,
    o: DynamoLoadPublisherOptions = {},
  ) {
    this.reportsOf = new LoadReports(
      load,
      (l) => l.activeBlocks,
      (l) => {
        writeActiveLoad(this.writer.reset(), l)
        this.channel.publish(this.writer.bytes())
        return true
      },
      o,
    )
  }

  get reports(): number {
    return this.reportsOf.reports
  }

  /** The engine's state may have changed (called after every step). */
  update(): void {
    this.reportsOf.update()
  }

  async close(): Promise<void> {
    this.reportsOf.close()
    await this.channel.close()
  }
}
