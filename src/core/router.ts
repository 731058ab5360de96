// A router: its parts (src/core/router-parts.ts), the transports that feed them (NATS, etcd,
// JetStream, replica sync) and the route path (src/core/route-path.ts). Router.start wires them
// in the order they depend on each other; a Router is complete when constructed.
import type { ServeConfig } from '../config.js'
import { ShardPool } from '../shards/pool.js'
import type { OverlapResult, ShardPoolOptions } from '../shards/pool.js'
import type { RouteDecision } from '../scheduler/scheduler.js'
import type { RouterEvent } from '../codec/events.js'
import { registerTransportMetrics } from '../transport/metrics.js'
import { NatsIntake, type WorkerLoad } from '../transport/nats.js'
import { EtcdDiscovery, type DiscoveredWorker } from '../transport/etcd.js'
import { ReplicaRegistry } from '../transport/replica-registry.js'
import type { ReplicaRecord, ReplicaRegistryOptions } from '../transport/replica-registry.js'
import { ReplicaSync } from '../transport/replica-sync.js'
import type { ReplicaSyncOptions } from '../transport/replica-sync.js'
import { registerReplicaMetrics } from '../transport/replica-metrics.js'
import { DurableKvEvents } from '../transport/durable.js'
import { ChannelDiscovery } from '../event-plane/discovery.js'
import { EventPlaneIntake } from '../event-plane/intake.js'
import { registerEventPlaneMetrics } from '../event-plane/metrics.js'
import { randomInstanceId } from './instance-id.js'
import { RouterParts } from './router-parts.js'
import type { RankIndexState } from './router-parts.js'
import { RoutePath } from './route-path.js'
import type { RouteInput } from './route-path.js'
import type { WorkerInfo, WorkerRegistration } from './worker-registry.js'
import { log } from '../runtime/log.js'

export type { WorkerInfo, WorkerRegistration } from './worker-registry.js'
export type { RankIndexState } from './router-parts.js'
export type { RouteInput } from './route-path.js'

/** What tests may set beyond the configuration. */
export interface RouterDeps {
  /** The instance id of a replica without an etcd registry (random otherwise). */
  routerId?: bigint
  /** Replica-sync timings (heartbeat, silence, grace). */
  replica?: Pick<ReplicaSyncOptions, 'heartbeatMs' | 'silenceMs' | 'catchUpGraceMs' | 'queueCapacity'>
  /** The replica registry's lease TTL. */
  registry?: Pick<ReplicaRegistryOptions, 'ttlSecs'>
}

/** The transports a router reads from and shares with, each null when not configured. */
type Links = Pick<Router, 'instanceId' | 'nats' | 'discovery' | 'replicas' | 'replicaRegistry' | 'durable' | 'eventPlane' | 'eventChannels'>

/** Closes what started, newest first, ignoring failures: a start that failed half-way. */
async function closeAll(links: Partial<Links>): Promise<void> {
  await links.replicas?.close().catch(() => undefined)
  await links.replicaRegistry?.close().catch(() => undefined)
  await links.durable?.close().catch(() => undefined)
  await links.eventPlane?.close().catch(() => undefined)
  await links.eventChannels?.close().catch(() => undefined)
  await links.nats?.close().catch(() => undefined)
  await links.discovery?.close().catch(() => undefined)
}

/**
 * KV events from NATS and workers from etcd, when configured, in the order they depend on each
 * other; the workers etcd lists at start are registered before it returns.
 */
async function connect(parts: RouterParts, deps: RouterDeps, started: { -readonly [K in keyof Links]?: Links[K] }): Promise<Links> {
  const c = parts.config
  const [ns, component, endpoint] = c.endpoint !== null ? (c.endpoint.split('.') as [string, string, string]) : [c.namespace, c.component, 'generate']
  // first: the registry's lease names this replica to everything that follows
  let replicaRegistry: ReplicaRegistry | null = null
  if (c.replicaSync && c.etcdUrl !== null) {
    replicaRegistry = started.replicaRegistry = await ReplicaRegistry.start({ url: c.etcdUrl, namespace: ns, component, ...deps.registry })
  }
  const instanceId = replicaRegistry?.routerId ?? deps.routerId ?? randomInstanceId()
  let nats: NatsIntake | null = null
  let durable: DurableKvEvents | null = null
  let discovery: EtcdDiscovery | null = null
  if (c.natsUrl !== null) {
    const n = (nats = started.nats = await NatsIntake.start({ url: c.natsUrl, namespace: ns, component, pool: parts.pool, kvEvents: c.indexerUrl === null }))
    // workers' own load (kv_metrics) feeds load shedding, as Dynamo's worker monitor does
    n.on('load', (l: WorkerLoad) => void parts.scheduler.reportLoad(l.workerId, l.dpRank, l.activeBlocks, l.totalBlocks))
    // before etcd's workers register, so that their recoveries land after the snapshot
    if (c.durableKvEvents) {
      durable = started.durable = await DurableKvEvents.start({
        nc: n.connection,
        namespace: ns,
        component,
        pool: parts.pool,
        instanceId,
        snapshotThreshold: c.snapshotThreshold,
        snapshotFormat: c.snapshotFormat,
        resetStates: c.resetStates,
        discovered: () => (discovery === null ? null : new Set(parts.registry.all().map((w) => w.id))),
        removeWorker: (id) => parts.removeWorker(id),
      })
    }
  }
  if (c.etcdUrl !== null) {
    const d = (discovery = started.discovery = await EtcdDiscovery.start({ url: c.etcdUrl, namespace: ns, component, endpoint }))
    const add = (w: DiscoveredWorker): Promise<unknown> => {
      const reg: WorkerRegistration = {
        id: w.workerId,
        url: w.url,
        device: w.deviceType,
        dpRanks: w.dpSize,
        source: 'etcd',
        kvEvents: w.kvEvents,
        requestPlane: w.requestPlane,
        model: w.model,
      }
      if (w.blockSize !== null) reg.blockSize = w.blockSize
      if (w.totalKvBlocks !== null) reg.capacity = w.totalKvBlocks
      if (w.maxNumBatchedTokens !== null) reg.maxNumBatchedTokens = w.maxNumBatchedTokens
      // a registration the index cannot hold is refused, not dropped unseen
      return parts
        .addWorker(reg)
        .catch((err: unknown) =>
          log.warn(
            { code: 'KVR_WORKER_NOT_REGISTERED' },
            `worker ${w.workerId} from etcd was not registered: ${err instanceof Error ? err.message : String(err)}`,
          ),
        )
    }
    d.on('added', (w: DiscoveredWorker) => void add(w))
    d.on('updated', (w: DiscoveredWorker) => void add(w))
    d.on('removed', (id: bigint) => void parts.removeWorker(id).catch(() => undefined))
    // the workers etcd lists at start are registered before the router says it is up, so its
    // first answers and its start-up line count them
    await Promise.all([...d.workers.values()].map(add))
  }
  // after the workers: a publisher's first events name workers etcd listed
  let eventChannels: ChannelDiscovery | null = null
  let eventPlane: EventPlaneIntake | null = null
  if (c.etcdUrl !== null && c.eventPlane === 'zmq' && c.kvEvents && c.indexerUrl === null) {
    eventChannels = started.eventChannels = await ChannelDiscovery.start(c.etcdUrl)
    eventPlane = started.eventPlane = EventPlaneIntake.start({
      discovery: eventChannels,
      namespace: ns,
      component,
      pool: parts.pool,
      hooks: {
        gap: (workerId, dpRank) => void parts.recovery?.rankLost(workerId, dpRank),
        restart: (workerId, dpRank) => parts.pool.resetWorkerRank(workerId, dpRank),
      },
    })
  }
  // after the workers: peers' bookings name worker-ranks, and those of unknown workers are dropped
  const replicas =
    c.replicaSync && c.natsUrl !== null ? (started.replicas = await startReplicaSync(parts, deps, c.natsUrl, ns, component, instanceId, replicaRegistry)) : null
  return { instanceId, nats, discovery, replicas, replicaRegistry, durable, eventPlane, eventChannels }
}

async function startReplicaSync(
  parts: RouterParts,
  deps: RouterDeps,
  natsUrl: string,
  namespace: string,
  component: string,
  routerId: bigint,
  reg: ReplicaRegistry | null,
): Promise<ReplicaSync> {
  const c = parts.config
  const sessions = parts.sessions
  const known = (): { id: string; url: string | null; host: string | null }[] =>
    [...(reg?.replicas.values() ?? [])].map((r) => ({ id: r.routerId, url: r.url, host: r.host }))
  const sync = await ReplicaSync.start({
    natsUrl,
    namespace,
    component,
    routerId,
    scheduler: parts.scheduler,
    blockSize: c.blockSize,
    catchUpTimeoutMs: c.replicaCatchUpSecs * 1000,
    spread: c.replicaSpread,
    // a peer's binding is held for this replica's own TTL (bindings expire in the order made);
    // one a catch-up brings, for the time it has left
    onSessionBinding:
      sessions === null
        ? undefined
        : (session, workerId, dpRank, ttlMs, caughtUp) => sessions.bind(session, workerId, dpRank, performance.now(), caughtUp ? ttlMs : undefined),
    sessionBindings: sessions === null ? undefined : () => sessions.live(performance.now()),
    isBound: (session) => sessions?.get(session, performance.now()) !== undefined,
    knownPeers: known(),
    ...deps.replica,
  })
  if (reg !== null) {
    const seen = (r: ReplicaRecord): void => sync.registered(r.routerId, r.url, r.host)
    reg.on('added', seen)
    reg.on('updated', seen)
    reg.on('removed', (id: string) => sync.deregistered(id))
    // registrations that came while NATS connected
    for (const p of known()) sync.registered(p.id, p.url, p.host)
  }
  return sync
}

export class Router {
  readonly parts: RouterParts
  /**
   * This replica's instance id: its router id in replica sync and its durable consumer's name. The
   * etcd lease id when replicas register in etcd, else drawn at random (src/core/instance-id.ts).
   */
  readonly instanceId: bigint
  /** KV-event intake from NATS (`--nats-url`), or null in embedded mode. */
  readonly nats: NatsIntake | null
  /** Worker discovery through etcd (`--etcd-url`), or null. */
  readonly discovery: EtcdDiscovery | null
  /** Bookings shared with the other replicas (`--router-replica-sync`), or null. */
  readonly replicas: ReplicaSync | null
  /** This replica's registration among the others in etcd (replica sync with `--etcd-url`), or null. */
  readonly replicaRegistry: ReplicaRegistry | null
  /** KV events from the JetStream stream (`--router-durable-kv-events`), or null. */
  readonly durable: DurableKvEvents | null
  /** KV events from Dynamo's ZMQ event plane (`--etcd-url` with `--event-plane zmq`), or null. */
  readonly eventPlane: EventPlaneIntake | null
  /** The etcd records of the event plane's publishers that feed it, or null. */
  readonly eventChannels: ChannelDiscovery | null
  private readonly path: RoutePath

  private constructor(parts: RouterParts, links: Links) {
    this.parts = parts
    this.instanceId = links.instanceId
    this.nats = links.nats
    this.discovery = links.discovery
    this.replicas = links.replicas
    this.replicaRegistry = links.replicaRegistry
    this.durable = links.durable
    this.eventPlane = links.eventPlane
    this.eventChannels = links.eventChannels
    this.path = new RoutePath(parts, links.replicas)
    const reg = parts.metrics.registry
    registerTransportMetrics(reg, this)
    registerReplicaMetrics(reg, this)
    registerEventPlaneMetrics(reg, this)
  }

  static async start(config: ServeConfig, deps: RouterDeps = {}): Promise<Router> {
    const po: ShardPoolOptions = {}
    if (config.eventThreads > 0) po.shards = config.eventThreads
    po.maxBlocksPerShard = config.maxIndexBlocks
    if (config.shardSpinUs !== null) po.shardSpinUs = config.shardSpinUs
    if (config.querySpinUs !== null) po.querySpinUs = config.querySpinUs
    const pool = await ShardPool.start(po)
    const parts = new RouterParts(config, pool)
    const started: { -readonly [K in keyof Links]?: Links[K] } = {}
    try {
      for (const w of config.workers) await parts.addWorker({ id: w.id, url: w.url, kvEvents: w.kvEvents, decisionsOnly: w.decisionsOnly })
      return new Router(parts, await connect(parts, deps, started))
    } catch (err) {
      await parts.stop()
      await closeAll(started)
      await parts.close()
      throw err
    }
  }

  // ---- the parts, as the HTTP routes and the tests reach them ----

  get config(): ServeConfig {
    return this.parts.config
  }
  get pool(): ShardPool {
    return this.parts.pool
  }
  get scheduler(): RouterParts['scheduler'] {
    return this.parts.scheduler
  }
  get metrics(): RouterParts['metrics'] {
    return this.parts.metrics
  }
  get registry(): RouterParts['registry'] {
    return this.parts.registry
  }
  get suspension(): RouterParts['suspension'] {
    return this.parts.suspension
  }
  get health(): RouterParts['health'] {
    return this.parts.health
  }
  get probes(): RouterParts['probes'] {
    return this.parts.probes
  }
  get requestIds(): RouterParts['requestIds'] {
    return this.parts.requestIds
  }
  get decisions(): RouterParts['decisions'] {
    return this.parts.decisions
  }
  get recovery(): RouterParts['recovery'] {
    return this.parts.recovery
  }
  get engines(): RouterParts['engines'] {
    return this.parts.engines
  }
  get sessions(): RouterParts['sessions'] {
    return this.parts.sessions
  }
  get eventSources(): RouterParts['eventSources'] {
    return this.parts.eventSources
  }
  /** Workers known only from KV events dropped to make room for a registration. */
  get evictedUnregistered(): number {
    return this.parts.evictedUnregistered
  }

  /** The URL this replica serves at, for its peers and the registry (once it listens). */
  async advertise(url: string): Promise<void> {
    this.replicas?.setUrl(url)
    await this.replicaRegistry?.setUrl(url)
  }

  /** False while a configured NATS or etcd connection is down. */
  get connected(): { nats: boolean | null; etcd: boolean | null } {
    return { nats: this.nats === null ? null : this.nats.connected, etcd: this.discovery === null ? null : this.discovery.connected }
  }

  /** Registers or updates a worker; membership changes of one worker apply in the order asked. */
  addWorker(reg: WorkerRegistration): Promise<WorkerInfo> {
    return this.parts.addWorker(reg)
  }

  /** Drops a worker from routing and from the index (see RouterParts.removeWorker). */
  removeWorker(id: bigint): Promise<boolean> {
    return this.parts.removeWorker(id)
  }

  checkEventSources(): Promise<void> {
    return this.parts.checkEventSources()
  }

  indexStateOf(workerId: bigint, dpRank: number): RankIndexState {
    return this.parts.indexStateOf(workerId, dpRank)
  }

  /** One raw RouterEvent JSON message to its shard; false = backpressure (nothing is lost). */
  ingest(bytes: Uint8Array, workerId?: bigint): boolean {
    return this.parts.ingest(bytes, workerId)
  }

  ingestEvent(ev: RouterEvent): boolean {
    return this.parts.ingestEvent(ev)
  }

  /** Slot of (worker, rank) in the scheduler, -1 when not registered there. */
  slotOf(lo: number, hi: number, rank: number): number {
    return this.path.slotOf(lo, hi, rank)
  }

  /** Routes one prompt (see RoutePath.route). */
  route(input: RouteInput): Promise<{ decision: RouteDecision; overlap: OverlapResult; blocks: number; isl: number }> {
    return this.path.route(input)
  }

  async close(): Promise<void> {
    if (this.parts.closed) return
    await this.parts.stop()
    // first: peers drop this replica's bookings at its goodbye, and its last frees go out
    await closeAll(this)
    await this.parts.close()
  }
}
