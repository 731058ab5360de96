// N simulated engines in one process (`kv-router mocker --num-workers N`, the embedded fleet of
// `kv-router serve`, tests): each with its own engine, HTTP server, event ring, event
// publishers (ZMQ ones on ports offset by the engine's index) and registration. Engines of one process share one NATS connection and one etcd
// client.
//
// Start order per engine: worker id (an etcd lease, or first-worker-id + i), engine and
// publishers, HTTP server, then registration — so a router never learns of an engine that
// cannot answer yet. Shutdown runs the other way: unregister (revoke the lease / DELETE from
// the router), close the server (in-flight requests are aborted and free their blocks), stop
// the engine, flush the publishers.
import { kvEventsQueueSubject, kvEventsSubject, kvMetricsSubject } from '../../transport/dynamo-names.js'
import { ensureKvEventsStream } from '../../transport/jetstream.js'
import type { NatsConnection } from 'nats'
import type { RouterEvent } from '../../codec/events.js'
import { KvrError, Warn } from '../../errors.js'
import { log } from '../../runtime/log.js'
import { ENGINE_DEFAULTS, MockEngine } from './engine.js'
import type { EngineConfig } from './engine.js'
import { EngineServer } from './server.js'
import { CallbackPublisher, HttpEventPublisher, JetStreamEventPublisher, LoadPublisher, NatsEventPublisher, connectNats } from './publisher.js'
import type { EventPublisher } from './publisher.js'
import { EtcdRegistrar, deregisterFromRouter, registerWithRouter } from './registration.js'
import { ZmqEventPublisher, engineEndpoint, parseTcpEndpoint } from './zmq-publisher.js'
import { timingsFor } from './profiles.js'
import type { ProfileGroup } from './profiles.js'
import type { VllmEventForm, ZmqEventPublisherOptions } from './zmq-publisher.js'
import type { EtcdLease, EtcdRegistrarOptions, RouterRegistration, WorkerRecord } from './registration.js'
import { DynamoWorker, bindDynamoChannels } from './dynamo/dynamo-worker.js'
import type { DynamoModeOptions } from './dynamo/dynamo-worker.js'
import { RequestPlaneServer } from './dynamo/request-plane-server.js'
import type { EventChannel } from './dynamo/event-channel.js'

export interface FleetOptions extends Partial<Omit<EngineConfig, 'workerId'>> {
  /** Engines to start (default 1). */
  numWorkers?: number
  /** Each engine's timing profile and speed (`--engine-profile`); over `profile` and `speed`. */
  engineProfiles?: readonly ProfileGroup[] | null
  /** Worker id of the first engine when ids do not come from etcd leases (default 1). */
  firstWorkerId?: bigint
  /** Listen address (default 127.0.0.1). */
  host?: string
  /** First engine's port; engine i listens on port + i. 0 (default): free ports. */
  port?: number
  /** Host written into the engines' URLs (default: host). */
  advertiseHost?: string
  modelName?: string
  defaultMaxTokens?: number
  /** In-process event delivery (embedded fleet). */
  onEvent?: (ev: RouterEvent) => void
  /** HTTP mode: register with this router (POST /v1/workers) and post events to it. */
  routerUrl?: string
  apiKey?: string
  /** Distributed mode: events and load on NATS. */
  natsUrl?: string
  /** With natsUrl: KV events into the durable JetStream stream instead of the core subject. */
  durableKvEvents?: boolean
  /** Distributed mode: one lease per engine in etcd; lease ids are the worker ids. */
  etcdUrl?: string
  namespace?: string
  component?: string
  endpoint?: string
  leaseTtlSecs?: number
  /**
   * Also publish KV events as vLLM does, on a ZMQ PUB socket bound here (tcp://HOST:PORT);
   * engine i binds PORT + i. Independent of the other transports.
   */
  kvEventsZmq?: string
  /** With kvEventsZmq: the replay ROUTER's endpoint, engine i on its PORT + i. */
  kvEventsReplayZmq?: string
  kvEventsForm?: VllmEventForm
  kvEventsTopic?: string
  /**
   * Behave as current Dynamo workers (`--dynamo`, dynamo/): records in etcd (needs etcdUrl), KV
   * events and load on the ZMQ event plane, requests on the TCP request plane.
   */
  dynamo?: DynamoModeOptions
  /** Period of the unconditional kv_metrics report (ms, default 1000). */
  loadIntervalMs?: number
  /** Told about failures that do not stop the fleet (lost events, a lost lease). */
  onWarning?: (message: string) => void
  /** An engine's etcd lease is gone (etcd unreachable for longer than the TTL). */
  onLeaseLost?: (workerId: bigint, err: Error) => void
}

/**
 * An engine could not listen. `option` says which of the fleet's options to blame, so a CLI
 * can name its flag: the host for an address that does not resolve or is not this machine's,
 * the port otherwise (taken, or privileged).
 */
export class FleetListenError extends KvrError {
  readonly option: 'host' | 'port'
  constructor(host: string, port: number, cause: NodeJS.ErrnoException) {
    super('KVR_ERR_INVALID_OPTION', `cannot listen on ${host}:${port}: ${cause.message}`, { cause })
    this.option = cause.syscall === 'getaddrinfo' || cause.code === 'EADDRNOTAVAIL' ? 'host' : 'port'
  }
}

/** Longest wait of one shutdown step (lease revoke, unregister, flush). */
const CLOSE_STEP_MS = 2000

/** Waits for p at most ms; true when it settled successfully in time. */
function bounded(p: Promise<unknown>, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), ms)
    p.then(
      () => {
        clearTimeout(t)
        resolve(true)
      },
      () => {
        clearTimeout(t)
        resolve(false)
      },
    )
  })
}

export class MockerWorker {
  readonly engine: MockEngine
  readonly server: EngineServer
  readonly publishers: EventPublisher[]
  load: LoadPublisher | null = null
  lease: EtcdLease | null = null
  routerRegistration: RouterRegistration | null = null
  /** The engine as a Dynamo worker (`--dynamo`). */
  dynamo: DynamoWorker | null = null
  /** Its ZMQ publisher as a router reaches it, written into its etcd record (none when its events also go to NATS). */
  kvEvents: { endpoint: string; replay: string | null } | null = null

  constructor(engine: MockEngine, server: EngineServer, publishers: EventPublisher[]) {
    this.engine = engine
    this.server = server
    this.publishers = publishers
  }

  get workerId(): bigint {
    return this.engine.workerId
  }
  get url(): string {
    return this.server.url
  }
  /** KV blocks of the engine. */
  get capacity(): number {
    return this.engine.config.numGpuBlocks
  }
  get requestsServed(): number {
    return this.server.requestsServed
  }

  record(modelName?: string): WorkerRecord {
    const c = this.engine.config
    const r: WorkerRecord = { url: this.url, blockSize: c.blockSize, totalKvBlocks: c.numGpuBlocks, maxNumBatchedTokens: c.maxNumBatchedTokens }
    if (modelName !== undefined) r.modelName = modelName
    if (this.kvEvents !== null) r.kvEvents = this.kvEvents
    return r
  }

  /** Resolves once every event so far has been handed to its transports. */
  async flushEvents(): Promise<void> {
    await Promise.all(this.publishers.map((p) => p.flush()))
  }

  /** Bounded at every step: a shutdown must not hang on an etcd, NATS or router that is gone. */
  async close(): Promise<void> {
    if (this.lease !== null) await bounded(this.lease.revoke(), CLOSE_STEP_MS)
    if (this.dynamo !== null) await bounded(this.dynamo.close(), CLOSE_STEP_MS)
    if (this.routerRegistration !== null) await deregisterFromRouter(this.routerRegistration, this.workerId, CLOSE_STEP_MS)
    await this.server.close()
    this.engine.close()
    this.load?.close()
    await Promise.all(this.publishers.map((p) => bounded(p.close(), CLOSE_STEP_MS)))
  }
}

export class MockerFleet {
  readonly workers: MockerWorker[] = []
  private nats: NatsConnection | null = null
  private etcd: EtcdRegistrar | null = null
  /** ZMQ publishers bound so far, by engine; closed with their engines, or here when a start fails before. */
  private readonly zmq: ZmqEventPublisher[] = []
  /** The Dynamo mode's TCP request plane, shared by the engines; its event channels bound so far. */
  private requestPlane: RequestPlaneServer | null = null
  private readonly channels: EventChannel[] = []
  private closed = false

  private constructor(readonly options: FleetOptions) {}

  /** HOST:PORT of the Dynamo mode's TCP request plane ('' without it). */
  get requestPlaneAddress(): string {
    return this.requestPlane?.hostPort ?? ''
  }

  /** The Dynamo mode's request-plane counters (null without it). */
  get requestPlaneCounters(): RequestPlaneServer['counters'] | null {
    return this.requestPlane?.counters ?? null
  }

  get urls(): string[] {
    return this.workers.map((w) => w.url)
  }

  /** Starts every engine; on any failure, stops what was started and rethrows. */
  static async start(o: FleetOptions = {}): Promise<MockerFleet> {
    const f = new MockerFleet(o)
    try {
      await f.startAll()
    } catch (err) {
      await f.close()
      throw err
    }
    return f
  }

  private async startAll(): Promise<void> {
    const o = this.options
    const n = o.numWorkers ?? 1
    const ns = o.namespace ?? 'dynamo'
    const component = o.component ?? 'backend'
    const endpoint = o.endpoint ?? 'generate'
    const warn = o.onWarning ?? ((m: string) => log.warn({ code: Warn.KVR_MOCKER }, m))
    if (o.natsUrl !== undefined) this.nats = await connectNats(o.natsUrl)
    let durableSubject: string | null = null
    if (this.nats !== null && o.durableKvEvents === true) {
      try {
        durableSubject = kvEventsQueueSubject(await ensureKvEventsStream(await this.nats.jetstreamManager(), ns, component))
      } catch (err) {
        throw new KvrError('KVR_ERR_INVALID_OPTION', `--durable-kv-events needs JetStream on the NATS server at ${o.natsUrl}: ${(err as Error).message}`, {
          cause: err,
        })
      }
    }
    if (o.etcdUrl !== undefined) {
      const ro: EtcdRegistrarOptions = { url: o.etcdUrl, namespace: ns, component, endpoint }
      if (o.leaseTtlSecs !== undefined) ro.ttlSecs = o.leaseTtlSecs
      this.etcd = await EtcdRegistrar.connect(ro)
    }
    if (o.dynamo !== undefined) {
      if (this.etcd === null) throw new KvrError('KVR_ERR_INVALID_OPTION', 'the Dynamo mode registers in etcd: it needs an etcd URL')
      this.requestPlane = new RequestPlaneServer(warn)
      const host = o.host ?? '127.0.0.1'
      try {
        await this.requestPlane.listen(host, reachableHost(o.advertiseHost ?? host))
      } catch (err) {
        throw new FleetListenError(host, 0, err as NodeJS.ErrnoException)
      }
    }
    const first = o.firstWorkerId ?? 1n
    const timings = o.engineProfiles === undefined || o.engineProfiles === null ? null : timingsFor(o.engineProfiles, n)
    for (let i = 0; i < n; i++) {
      const lease = this.etcd === null ? null : await this.etcd.grant()
      const workerId = lease === null ? first + BigInt(i) : lease.id
      const pubs: EventPublisher[] = []
      if (o.onEvent !== undefined) pubs.push(new CallbackPublisher(o.onEvent))
      if (o.routerUrl !== undefined) {
        const ho: ConstructorParameters<typeof HttpEventPublisher>[0] = { routerUrl: o.routerUrl, onError: (m) => warn(`engine ${workerId}: ${m}`) }
        if (o.apiKey !== undefined) ho.apiKey = o.apiKey
        pubs.push(new HttpEventPublisher(ho))
      }
      if (this.nats !== null && durableSubject !== null)
        pubs.push(new JetStreamEventPublisher(this.nats, this.nats.jetstream(), durableSubject, (m) => warn(`engine ${workerId}: ${m}`)))
      else if (this.nats !== null) pubs.push(new NatsEventPublisher(this.nats, kvEventsSubject(ns, component)))
      if (o.kvEventsZmq !== undefined) {
        const zo: ZmqEventPublisherOptions = {
          endpoint: engineEndpoint(o.kvEventsZmq, i),
          replayEndpoint: o.kvEventsReplayZmq === undefined ? null : engineEndpoint(o.kvEventsReplayZmq, i),
          blockSize: o.blockSize ?? ENGINE_DEFAULTS.blockSize,
          onError: (m) => warn(`engine ${workerId}: ${m}`),
        }
        if (o.kvEventsForm !== undefined) zo.form = o.kvEventsForm
        if (o.kvEventsTopic !== undefined) zo.topic = o.kvEventsTopic
        const zp = await ZmqEventPublisher.bind(zo)
        pubs.push(zp)
        this.zmq.push(zp)
      }
      let channels: { kv: EventChannel; metrics: EventChannel } | null = null
      if (o.dynamo !== undefined) {
        const host = o.host ?? '127.0.0.1'
        channels = await bindDynamoChannels({
          bindHost: host,
          advertiseHost: reachableHost(o.advertiseHost ?? host),
          onError: (m) => warn(`engine ${workerId}: ${m}`),
          ...(o.dynamo.dropKvEvents === undefined ? {} : { dropKvEvents: o.dynamo.dropKvEvents }),
        })
        this.channels.push(channels.kv, channels.metrics)
      }
      let dynamo: DynamoWorker | null = null
      let load: LoadPublisher | null = null
      const engineOpts: ConstructorParameters<typeof MockEngine>[0] = { workerId }
      for (const k of [
        'blockSize',
        'numGpuBlocks',
        'numCpuBlocks',
        'maxNumSeqs',
        'maxNumBatchedTokens',
        'enableChunkedPrefill',
        'preemptionMode',
        'speedupRatio',
        'decodeSpeedupRatio',
        'profile',
        'speed',
      ] as const) {
        if (o[k] !== undefined) (engineOpts as unknown as Record<string, unknown>)[k] = o[k]
      }
      const timing = timings?.[i]
      if (timing !== undefined) {
        engineOpts.profile = timing.profile
        engineOpts.speed = timing.speed
      }
      if (channels !== null && lease !== null && this.requestPlane !== null) {
        const dw = new DynamoWorker({
          lease,
          requestPlane: this.requestPlane,
          path: { namespace: ns, component, endpoint },
          channels,
          modelName: o.modelName ?? 'kv-router-model',
          defaultMaxTokens: o.defaultMaxTokens ?? 16,
          mode: o.dynamo ?? {},
          ...(o.loadIntervalMs === undefined ? {} : { loadIntervalMs: o.loadIntervalMs }),
        })
        dynamo = dw
        pubs.push(dw.kvEvents)
      }
      if (pubs.length === 1) {
        const p = pubs[0] as EventPublisher
        engineOpts.onEvent = (ev, tokens) => p.publish(ev, tokens)
      } else if (pubs.length > 1) {
        engineOpts.onEvent = (ev, tokens) => {
          for (const p of pubs) p.publish(ev, tokens)
        }
      }
      engineOpts.onStep = () => {
        load?.update()
        dynamo?.load?.update()
      }
      const engine = new MockEngine(engineOpts)
      dynamo?.attach(engine)
      const host = o.host ?? '127.0.0.1'
      const port = o.port === undefined || o.port === 0 ? 0 : o.port + i
      const so: ConstructorParameters<typeof EngineServer>[0] = { engine, host, port }
      if (o.advertiseHost !== undefined) so.advertiseHost = o.advertiseHost
      if (o.modelName !== undefined) so.modelName = o.modelName
      if (o.defaultMaxTokens !== undefined) so.defaultMaxTokens = o.defaultMaxTokens
      if (dynamo !== null) {
        const d = dynamo
        so.extraStats = { key: 'dynamo', read: () => d.stats() }
      }
      const server = new EngineServer(so)
      const w = new MockerWorker(engine, server, pubs)
      w.lease = lease
      w.dynamo = dynamo
      // a router reading NATS too would take every event twice
      if (o.kvEventsZmq !== undefined && this.nats === null) {
        const reach = (e: string): string => advertised(e, o.advertiseHost ?? host)
        w.kvEvents = {
          endpoint: reach(engineEndpoint(o.kvEventsZmq, i)),
          replay: o.kvEventsReplayZmq === undefined ? null : reach(engineEndpoint(o.kvEventsReplayZmq, i)),
        }
      }
      this.workers.push(w)
      try {
        await server.listen()
      } catch (err) {
        // a bad host or a busy port is the user's option, not a bug: coded, so the CLI prints
        // one line instead of a stack trace
        throw new FleetListenError(host, port, err as NodeJS.ErrnoException)
      }
      if (this.nats !== null) {
        const lo: ConstructorParameters<typeof LoadPublisher>[3] = {}
        if (o.loadIntervalMs !== undefined) lo.intervalMs = o.loadIntervalMs
        load = new LoadPublisher(this.nats, kvMetricsSubject(ns), () => engine.load(), lo)
        w.load = load
      }
      if (lease !== null) {
        lease.on('lost', (err: Error) => {
          if (o.onLeaseLost !== undefined) o.onLeaseLost(workerId, err)
          else warn(`engine ${workerId}: lost its etcd lease: ${err.message}`)
        })
        if (dynamo !== null) await dynamo.start()
        else await lease.register(w.record(o.modelName))
      }
      if (o.routerUrl !== undefined) {
        const reg: RouterRegistration = { routerUrl: o.routerUrl }
        if (o.apiKey !== undefined) reg.apiKey = o.apiKey
        await registerWithRouter(reg, workerId, w.record(o.modelName))
        w.routerRegistration = reg
      }
    }
  }

  async flushEvents(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.flushEvents()))
    if (this.nats !== null && !this.nats.isClosed()) await this.nats.flush()
  }

  /** Unregisters and stops every engine, then the shared connections. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    await Promise.all(this.workers.map((w) => w.close()))
    // an engine that failed to start after its publisher was bound has no worker to close it
    await Promise.all(this.zmq.map((p) => bounded(p.close(), CLOSE_STEP_MS)))
    await Promise.all(this.channels.map((c) => bounded(c.close(), CLOSE_STEP_MS)))
    if (this.requestPlane !== null) await this.requestPlane.close()
    if (this.etcd !== null) await this.etcd.close()
    const nc = this.nats
    if (nc !== null && !nc.isClosed()) {
      // drain flushes what was published; bounded, as it waits for a server. While the client
      // is reconnecting, drain resolves without closing, and the reconnect loop would keep the
      // process alive: close explicitly whatever drain did.
      await bounded(nc.drain(), CLOSE_STEP_MS)
      if (!nc.isClosed()) await nc.close().catch(() => undefined)
    }
  }
}

/** Starts a fleet (see FleetOptions). */
export function startFleet(o: FleetOptions = {}): Promise<MockerFleet> {
  return MockerFleet.start(o)
}

/** A host others can dial: a wildcard address (what a socket binds, not where it is reached) becomes loopback. */
function reachableHost(host: string): string {
  return host === '0.0.0.0' || host === '::' || host === '*' ? '127.0.0.1' : host
}

/** A bound endpoint as others reach it: a wildcard host replaced by the advertised one. */
function advertised(endpoint: string, host: string): string {
  const e = parseTcpEndpoint(endpoint)
  if (e === null || (e.host !== '*' && e.host !== '0.0.0.0' && e.host !== '::' && e.host !== '[::]')) return endpoint
  const h = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host
  return `tcp://${h.includes(':') && !h.startsWith('[') ? `[${h}]` : h}:${e.port}`
}
