// One engine as a current Dynamo worker (`kv-router mocker --dynamo`): its event-plane
// publishers (kv-events, kv_metrics), its endpoints on the process's TCP request plane (generate,
// worker_kv_indexer_query_dp0), and its discovery records under its etcd lease, whose id is the
// instance id and the worker id of its events. Start order: channels before the engine (its
// events go out from the first), endpoints before records (a router never learns of an endpoint
// that cannot answer); shutdown revokes the lease first (fleet.ts), then takes the endpoints down
// and cuts open response streams.
import type { EtcdLease } from '../registration.js'
import type { MockEngine } from '../engine.js'
import { EventChannel } from './event-channel.js'
import { DynamoKvEventPublisher, DynamoLoadPublisher } from './event-publishers.js'
import { KV_EVENTS_TOPIC, KV_METRICS_TOPIC } from './event-messages.js'
import { eventChannelRecord, instanceRecord, modelRecord, requestPath, workerQueryEndpoint } from './discovery-records.js'
import type { DynamoEndpointPath, EtcdRecord, EventChannelScope } from './discovery-records.js'
import { generateHandler } from './generate-endpoint.js'
import type { GenerateCounters } from './generate-endpoint.js'
import type { InflightGate, RequestPlaneServer } from './request-plane-server.js'
import type { ResponseStream } from './response-stream.js'
import { workerQueryHandler } from './worker-query-endpoint.js'
import type { WorkerQueryCounters } from './worker-query-endpoint.js'

export interface DynamoModeOptions {
  /** Where the event-channel records go: endpoint-scoped (Dynamo's current form, default) or component-scoped. */
  eventChannels?: EventChannelScope
  /** Requests in flight per engine before new ones are refused as overloaded (default 1024). */
  maxInflight?: number
  /** A fault for tests: kv-events messages with sequence numbers from `from` on, `count` of them, are not sent. */
  dropKvEvents?: { from: bigint; count: number }
}

export const DEFAULT_MAX_INFLIGHT = 1024

export interface DynamoChannelsOptions {
  bindHost: string
  advertiseHost: string
  onError?: (message: string) => void
  /** The kv-events channel's fault (DynamoModeOptions.dropKvEvents). */
  dropKvEvents?: { from: bigint; count: number }
}

/** The two publishers of an engine, bound before the engine exists. */
export async function bindDynamoChannels(o: DynamoChannelsOptions): Promise<{ kv: EventChannel; metrics: EventChannel }> {
  const base = { bindHost: o.bindHost, advertiseHost: o.advertiseHost, ...(o.onError === undefined ? {} : { onError: o.onError }) }
  const kv = await EventChannel.bind({ ...base, topic: KV_EVENTS_TOPIC, ...(o.dropKvEvents === undefined ? {} : { drop: o.dropKvEvents }) })
  try {
    return { kv, metrics: await EventChannel.bind({ ...base, topic: KV_METRICS_TOPIC }) }
  } catch (err) {
    await kv.close()
    throw err
  }
}

export interface DynamoWorkerOptions {
  lease: EtcdLease
  requestPlane: RequestPlaneServer
  path: DynamoEndpointPath
  channels: { kv: EventChannel; metrics: EventChannel }
  modelName: string
  defaultMaxTokens: number
  mode: DynamoModeOptions
  loadIntervalMs?: number
}

export class DynamoWorker {
  readonly kvEvents: DynamoKvEventPublisher
  load: DynamoLoadPublisher | null = null
  readonly gate: InflightGate
  readonly generate: GenerateCounters = { served: 0, cancelled: 0, refused: 0, callHomeFailed: 0 }
  readonly queries: WorkerQueryCounters = { answered: 0, badQueries: 0, callHomeFailed: 0 }
  private readonly open = new Set<ResponseStream>()
  private readonly paths: string[] = []
  private engine_: MockEngine | null = null

  constructor(private readonly o: DynamoWorkerOptions) {
    this.kvEvents = new DynamoKvEventPublisher(o.channels.kv)
    this.gate = { inflight: 0, maxInflight: o.mode.maxInflight ?? DEFAULT_MAX_INFLIGHT }
  }

  get instanceId(): bigint {
    return this.o.lease.id
  }

  /** The engine, created after this worker since its KV events go to this worker's publisher. */
  attach(engine: MockEngine): void {
    this.engine_ = engine
  }

  get engine(): MockEngine {
    if (this.engine_ === null) throw new Error('a Dynamo worker serves an engine attached before it starts')
    return this.engine_
  }

  /** The records this worker writes, in the order written. */
  records(): EtcdRecord[] {
    const { path, channels } = this.o
    const engine = this.engine
    const id = this.instanceId
    const hp = this.o.requestPlane.hostPort
    const c = engine.config
    const scope = this.o.mode.eventChannels ?? 'endpoint'
    return [
      eventChannelRecord(path, scope, id, { topic: channels.kv.topic, publisherId: channels.kv.publisherId, zmqEndpoint: channels.kv.endpoint }),
      eventChannelRecord(path, scope, id, {
        topic: channels.metrics.topic,
        publisherId: channels.metrics.publisherId,
        zmqEndpoint: channels.metrics.endpoint,
      }),
      instanceRecord(path, workerQueryEndpoint(0), id, hp),
      instanceRecord(path, path.endpoint, id, hp),
      modelRecord(path, id, {
        modelName: this.o.modelName,
        blockSize: c.blockSize,
        totalKvBlocks: c.numGpuBlocks,
        maxNumSeqs: c.maxNumSeqs,
        maxNumBatchedTokens: c.maxNumBatchedTokens,
      }),
    ]
  }

  /** Serves the endpoints, starts the load reports, then writes the records under the lease. */
  async start(): Promise<void> {
    const { requestPlane } = this.o
    const engine = this.engine
    const id = this.instanceId
    const gen = requestPath(id, this.o.path.endpoint)
    const query = requestPath(id, workerQueryEndpoint(0))
    requestPlane.register(gen, generateHandler(engine, this.o.defaultMaxTokens, this.generate, this.open), this.gate)
    requestPlane.register(query, workerQueryHandler(engine.ring, engine.workerId, this.queries), this.gate)
    this.paths.push(gen, query)
    this.load = new DynamoLoadPublisher(
      this.o.channels.metrics,
      () => engine.load(),
      this.o.loadIntervalMs === undefined ? {} : { intervalMs: this.o.loadIntervalMs },
    )
    await this.o.lease.putAll(this.records())
  }

  /** Its counters for /stats: requests in flight, served, cancelled, refused, unreachable frontends, queries, messages published. */
  stats(): Record<string, unknown> {
    return {
      instance_id: this.instanceId.toString(),
      inflight: this.gate.inflight,
      max_inflight: this.gate.maxInflight,
      generate: { ...this.generate },
      worker_query: { ...this.queries },
      kv_events: { publisher_id: this.o.channels.kv.publisherId.toString(), ...this.o.channels.kv.counters },
      kv_metrics: { publisher_id: this.o.channels.metrics.publisherId.toString(), ...this.o.channels.metrics.counters },
      request_plane: { ...this.o.requestPlane.counters },
    }
  }

  /** Stops serving: endpoints down, open response streams cut, load reports stopped. */
  async close(): Promise<void> {
    for (const p of this.paths) this.o.requestPlane.unregister(p)
    for (const s of [...this.open]) s.destroy()
    if (this.load !== null) await this.load.close()
    else await this.o.channels.metrics.close()
  }
}
