// The router core, without HTTP: the shard pool (index), the scheduler and the static worker
// registry, and the one route path every API uses: token ids → local block hashes → overlap
// query over the shards → sequence hashes → schedule. Per-request buffers come from a small free
// list so a steady stream of requests allocates only the pool's merged answer.
import type { ServeConfig } from '../config.js'
import { ShardPool } from '../shards/pool.js'
import type { OverlapResult, ShardPoolOptions } from '../shards/pool.js'
import { Scheduler } from '../scheduler/scheduler.js'
import { schedulerOptionsOf } from '../scheduler/options.js'
import type { CancelSignal, RouteDecision, RouterConfigOverride, WorkerRankRef } from '../scheduler/scheduler.js'
import type { ApproxSink } from '../scheduler/approximate.js'
import type { DeviceType } from '../scheduler/worker-ranks.js'
import { promptHashesInto, sequenceHashesInto } from '../codec/hashing.js'
import { encodeRouterEvent } from '../codec/events.js'
import type { RouterEvent, StoredBlock } from '../codec/events.js'
import { KvrError } from '../errors.js'
import { u64FromParts } from '../codec/u64.js'
import { RouterMetrics } from '../metrics/registry.js'
import { registerSchedulerMetrics } from '../scheduler/metrics.js'
import { registerShardMetrics } from '../shards/metrics.js'
import { registerTransportMetrics } from '../transport/metrics.js'
import { registerHealthMetrics, registerWorkerMetrics } from './metrics.js'
import { IndexRecovery } from '../shards/recovery.js'
import { EngineIntake } from '../transport/engine-intake.js'
import { NatsIntake, type WorkerLoad } from '../transport/nats.js'
import { EtcdDiscovery, type DiscoveredWorker } from '../transport/etcd.js'
import { ReplicaRegistry } from '../transport/replica-registry.js'
import type { ReplicaRecord, ReplicaRegistryOptions } from '../transport/replica-registry.js'
import { ReplicaSync } from '../transport/replica-sync.js'
import type { ReplicaSyncOptions } from '../transport/replica-sync.js'
import { registerReplicaMetrics } from '../transport/replica-metrics.js'
import { DurableKvEvents } from '../transport/durable.js'
import { randomInstanceId } from './instance-id.js'
import { EventSources } from './event-sources.js'
import { RequestIds } from './request-ids.js'
import { SessionAffinity } from './session-affinity.js'
import { DecisionLog } from './decision-log.js'
import { Suspension } from './suspension.js'
import { WorkerHealth } from './health.js'
import type { ProbeResult } from './health.js'
import { HealthProbes } from './health-probes.js'
import { WorkerRegistry } from './worker-registry.js'
import type { WorkerInfo, WorkerRegistration } from './worker-registry.js'
import { log } from '../runtime/log.js'

export type { WorkerInfo, WorkerRegistration } from './worker-registry.js'

/**
 * What the index knows of a worker-rank: `exact` from its events; `recovering` while missed events
 * are fetched; `degraded` when some could not be; `no-events` while it has sent none since it
 * registered (routed on predictions); `predicted` in approximate mode.
 */
export type RankIndexState = 'exact' | 'recovering' | 'degraded' | 'no-events' | 'predicted'

export interface RouteInput {
  /** Token ids of the prompt (validated while hashing), or null when blocks are given. */
  tokens: ArrayLike<number> | null
  /** Local block hashes given directly (u64 halves), instead of tokens. */
  blockLo?: Uint32Array
  blockHi?: Uint32Array
  blockCount?: number
  /** Prompt length in tokens; defaults to tokens.length (or blocks × block size). */
  isl?: number
  id?: string
  workerId?: bigint
  dpRank?: number
  priority?: number
  overrides?: RouterConfigOverride
  updateStates?: boolean
  explain?: boolean
  /** X-Dynamo-Session-ID: the session the request belongs to (session affinity). */
  sessionId?: string
  /** Worker-ranks not to choose: the attempts a retry has tried (see ScheduleRequest.exclude). */
  exclude?: readonly WorkerRankRef[]
  signal?: CancelSignal
}

/** What tests may set beyond the configuration. */
export interface RouterDeps {
  /** The instance id of a replica without an etcd registry (random otherwise). */
  routerId?: bigint
  /** Replica-sync timings (heartbeat, silence, grace). */
  replica?: Pick<ReplicaSyncOptions, 'heartbeatMs' | 'silenceMs' | 'catchUpGraceMs' | 'queueCapacity'>
  /** The replica registry's lease TTL. */
  registry?: Pick<ReplicaRegistryOptions, 'ttlSecs'>
}

interface Scratch {
  lo: Uint32Array
  hi: Uint32Array
  sLo: Uint32Array
  sHi: Uint32Array
}

const EMPTY_RESULT: OverlapResult = {
  count: 0,
  workerIdLo: new Uint32Array(0),
  workerIdHi: new Uint32Array(0),
  dpRank: new Uint32Array(0),
  overlap: new Uint32Array(0),
  treeSize: new Uint32Array(0),
  recoveringShards: [],
}

export class Router {
  readonly config: ServeConfig
  readonly pool: ShardPool
  readonly scheduler: Scheduler
  readonly metrics: RouterMetrics
  readonly registry = new WorkerRegistry()
  readonly suspension = new Suspension(this.registry)
  /** Which workers can take requests: probes, block sizes (src/core/health.ts). */
  readonly health: WorkerHealth
  /** The health probes, or null with --router-health-probe-interval-secs 0. */
  readonly probes: HealthProbes | null
  readonly requestIds = new RequestIds()
  /** The last decisions, for the status page. */
  readonly decisions = new DecisionLog()
  private readonly scratch: Scratch[] = []
  /** (worker id as a safe number, dp rank) → slot, rebuilt when registrations change. */
  private slotCache = new Map<number, number>()
  private slotCacheVersion = -1
  /** Per worker, per rank, the id of the last predicted event. */
  private approxEventIds = new Map<bigint, bigint[]>()
  private closed = false
  /** KV-event intake from NATS (`--nats-url`), or null in embedded mode. */
  nats: NatsIntake | null = null
  /** Worker discovery through etcd (`--etcd-url`), or null. */
  discovery: EtcdDiscovery | null = null
  /** Bookings shared with the other replicas (`--router-replica-sync`), or null. */
  replicas: ReplicaSync | null = null
  /** This replica's registration among the others in etcd (replica sync with `--etcd-url`), or null. */
  replicaRegistry: ReplicaRegistry | null = null
  /**
   * This replica's instance id: its router id in replica sync and its durable consumer's name. The
   * etcd lease id when replicas register in etcd, else drawn at random (src/core/instance-id.ts).
   */
  instanceId: bigint
  /** KV events from the JetStream stream (`--router-durable-kv-events`), or null. */
  durable: DurableKvEvents | null = null
  /** Recovery of missed KV events, or null in approximate mode or with --no-router-event-recovery. */
  readonly recovery: IndexRecovery | null
  /** Engines' own KV events (ZMQ), for the workers registered with a kv-events endpoint. */
  readonly engines: EngineIntake
  /** Session bindings, or null without --router-session-affinity-ttl-secs. */
  readonly sessions: SessionAffinity | null
  /** The workers that have sent no KV event since they registered (KV-events mode). */
  readonly eventSources: EventSources
  private readonly checkTimer: NodeJS.Timeout

  private constructor(
    config: ServeConfig,
    pool: ShardPool,
    private readonly deps: RouterDeps,
  ) {
    this.config = config
    this.pool = pool
    this.instanceId = deps.routerId ?? randomInstanceId()
    const approx = !config.kvEvents
    // in KV-events mode, for the workers that send none (yet)
    const sink: ApproxSink | undefined = approx || config.mode === 'kv' ? this.approxSink() : undefined
    this.scheduler = new Scheduler(schedulerOptionsOf(config, approx), sink === undefined ? {} : { approxSink: sink })
    this.recovery =
      config.kvEvents && config.eventRecovery
        ? new IndexRecovery(pool, { urlOf: (id) => this.registry.get(id)?.url, onAnswers: (id) => this.eventSources.evented(id) })
        : null
    this.engines = new EngineIntake(config.blockSize, pool)
    this.eventSources = new EventSources({
      setPredicted: (id, on) => this.scheduler.setPredicted(id, on),
      watch: (id, on) => (on ? pool.watchFirstEvent(id) : pool.unwatch(id)),
      resetRank: (id, rank) => pool.resetWorkerRank(id, rank),
      warn: (message) => log.warn({ code: 'KVR_WORKER_NO_EVENTS' }, message),
      now: () => performance.now(),
    })
    pool.on('firstEvent', (id: bigint) => this.eventSources.evented(id))
    this.sessions = config.sessionAffinityTtlSecs > 0 ? new SessionAffinity(config.sessionAffinityTtlSecs * 1000) : null
    this.health = new WorkerHealth({
      blockSize: config.blockSize,
      kvMode: config.mode === 'kv',
      failuresToUnreachable: config.healthProbeFailures,
      onHeld: (id, held) => this.scheduler.setHeld(id, held),
    })
    this.engines.blockSizes = {
      mismatch: (id, rank, size) => this.health.engineBlockSize(id, rank, size),
      reset: (id, rank) => this.health.engineReset(id, rank),
    }
    this.probes =
      config.healthProbeIntervalSecs > 0
        ? new HealthProbes({
            intervalMs: config.healthProbeIntervalSecs * 1000,
            timeoutMs: config.healthProbeTimeoutSecs * 1000,
            result: (id, url, r) => this.probed(id, url, r),
          })
        : null
    this.checkTimer = setInterval(() => {
      this.sessions?.expire(performance.now())
      void this.checkEventSources()
    }, 5000)
    this.checkTimer.unref()
    pool.on('shardRestarted', (shard: number) => void this.rebuildShard(shard))
    this.metrics = new RouterMetrics(config)
    const reg = this.metrics.registry
    registerSchedulerMetrics(reg, this.scheduler)
    registerShardMetrics(reg, pool, this.recovery)
    registerTransportMetrics(reg, this)
    registerWorkerMetrics(reg, this.registry, this.suspension, this.eventSources, this.sessions, config.modelName)
    registerReplicaMetrics(reg, this)
    registerHealthMetrics(reg, this.registry, this.health, this.suspension, this.probes)
  }

  static async start(config: ServeConfig, deps: RouterDeps = {}): Promise<Router> {
    const po: ShardPoolOptions = {}
    if (config.eventThreads > 0) po.shards = config.eventThreads
    po.maxBlocksPerShard = config.maxIndexBlocks
    if (config.shardSpinUs !== null) po.shardSpinUs = config.shardSpinUs
    if (config.querySpinUs !== null) po.querySpinUs = config.querySpinUs
    const pool = await ShardPool.start(po)
    const r = new Router(config, pool, deps)
    try {
      for (const w of config.workers) await r.addWorker({ id: w.id, url: w.url, kvEvents: w.kvEvents })
      await r.connect()
    } catch (err) {
      await r.close()
      throw err
    }
    return r
  }

  /** KV events from NATS and workers from etcd, when configured. */
  private async connect(): Promise<void> {
    const c = this.config
    const [ns, component, endpoint] = c.endpoint !== null ? (c.endpoint.split('.') as [string, string, string]) : [c.namespace, c.component, 'generate']
    // first: the registry's lease names this replica to everything that follows
    if (c.replicaSync && c.etcdUrl !== null) {
      this.replicaRegistry = await ReplicaRegistry.start({ url: c.etcdUrl, namespace: ns, component, ...this.deps.registry })
      this.instanceId = this.replicaRegistry.routerId
    }
    if (c.natsUrl !== null) {
      this.nats = await NatsIntake.start({ url: c.natsUrl, namespace: ns, component, pool: this.pool })
      // workers' own load (kv_metrics) feeds load shedding, as Dynamo's worker monitor does
      this.nats.on('load', (l: WorkerLoad) => void this.scheduler.reportLoad(l.workerId, l.dpRank, l.activeBlocks, l.totalBlocks))
      // before etcd's workers register, so that their recoveries land after the snapshot
      if (c.durableKvEvents) {
        this.durable = await DurableKvEvents.start({
          nc: this.nats.connection,
          namespace: ns,
          component,
          pool: this.pool,
          instanceId: this.instanceId,
          snapshotThreshold: c.snapshotThreshold,
          resetStates: c.resetStates,
          discovered: () => (this.discovery === null ? null : new Set(this.registry.all().map((w) => w.id))),
          removeWorker: (id) => this.removeWorker(id),
        })
      }
    }
    if (c.etcdUrl !== null) {
      const d = await EtcdDiscovery.start({ url: c.etcdUrl, namespace: ns, component, endpoint })
      this.discovery = d
      const add = (w: DiscoveredWorker): Promise<unknown> => {
        const reg: WorkerRegistration = { id: w.workerId, url: w.url, device: w.deviceType, dpRanks: w.dpSize, source: 'etcd', kvEvents: w.kvEvents }
        if (w.blockSize !== null) reg.blockSize = w.blockSize
        if (w.totalKvBlocks !== null) reg.capacity = w.totalKvBlocks
        if (w.maxNumBatchedTokens !== null) reg.maxNumBatchedTokens = w.maxNumBatchedTokens
        // a registration the index cannot hold is refused, not dropped unseen
        return this.addWorker(reg).catch((err: unknown) =>
          log.warn(
            { code: 'KVR_WORKER_NOT_REGISTERED' },
            `worker ${w.workerId} from etcd was not registered: ${err instanceof Error ? err.message : String(err)}`,
          ),
        )
      }
      d.on('added', (w: DiscoveredWorker) => void add(w))
      d.on('updated', (w: DiscoveredWorker) => void add(w))
      d.on('removed', (id: bigint) => void this.removeWorker(id).catch(() => undefined))
      // the workers etcd lists at start are registered before the router says it is up, so its
      // first answers and its start-up line count them
      await Promise.all([...d.workers.values()].map(add))
    }
    // after the workers: peers' bookings name worker-ranks, and those of unknown workers are dropped
    if (c.replicaSync && c.natsUrl !== null) await this.startReplicaSync(c.natsUrl, ns, component)
  }

  private async startReplicaSync(natsUrl: string, namespace: string, component: string): Promise<void> {
    const c = this.config
    const reg = this.replicaRegistry
    const known = (): { id: string; url: string | null; host: string | null }[] =>
      [...(reg?.replicas.values() ?? [])].map((r) => ({ id: r.routerId, url: r.url, host: r.host }))
    const sync = await ReplicaSync.start({
      natsUrl,
      namespace,
      component,
      routerId: this.instanceId,
      scheduler: this.scheduler,
      blockSize: c.blockSize,
      catchUpTimeoutMs: c.replicaCatchUpSecs * 1000,
      spread: c.replicaSpread,
      // a peer's binding is held for this replica's own TTL (bindings expire in the order made);
      // one a catch-up brings, for the time it has left
      onSessionBinding:
        this.sessions === null
          ? undefined
          : (session, workerId, dpRank, ttlMs, caughtUp) => this.sessions?.bind(session, workerId, dpRank, performance.now(), caughtUp ? ttlMs : undefined),
      sessionBindings: this.sessions === null ? undefined : () => this.sessions?.live(performance.now()) ?? [],
      isBound: (session) => this.sessions?.get(session, performance.now()) !== undefined,
      knownPeers: known(),
      ...this.deps.replica,
    })
    this.replicas = sync
    if (reg !== null) {
      const seen = (r: ReplicaRecord): void => sync.registered(r.routerId, r.url, r.host)
      reg.on('added', seen)
      reg.on('updated', seen)
      reg.on('removed', (id: string) => sync.deregistered(id))
      // registrations that came while NATS connected
      for (const p of known()) sync.registered(p.id, p.url, p.host)
    }
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

  // ---- workers ----

  /** Registers or updates a worker; membership changes of one worker apply in the order asked. */
  addWorker(reg: WorkerRegistration): Promise<WorkerInfo> {
    return this.registry.inOrder(reg.id, () => this.addWorkerNow(reg))
  }

  /**
   * Drops a worker from routing and from the index. A worker known only from its KV events (sent
   * before it registered, or never registered) holds worker-rank slots and blocks too, and this is
   * the way to free them; false when the id is neither registered nor in the index.
   */
  removeWorker(id: bigint): Promise<boolean> {
    return this.registry.inOrder(id, () => this.removeWorkerNow(id))
  }

  private async addWorkerNow(reg: WorkerRegistration): Promise<WorkerInfo> {
    const dpRanks = reg.dpRanks ?? 1
    const info: WorkerInfo = {
      id: reg.id,
      url: reg.url.replace(/\/+$/, ''),
      blockSize: reg.blockSize ?? this.config.blockSize,
      capacity: reg.capacity ?? 0,
      device: reg.device ?? 'gpu',
      dpRanks,
      maxNumBatchedTokens: reg.maxNumBatchedTokens,
      registeredAt: Date.now(),
      failures: 0,
      suspendedUntil: 0,
      source: reg.source ?? 'static',
      kvEvents: reg.kvEvents ?? null,
    }
    // a worker the index knew nothing of leaves nothing in it when its registration is refused
    const known = this.registry.has(reg.id) || (await this.pool.indexedRanks(reg.id)) > 0
    for (let r = 0; r < dpRanks; r++) {
      // A full table of worker-ranks refuses the registration: answered 201, the worker would
      // have every KV event dropped as too_many_workers and never get a hit. Ranks known only
      // from KV events give way to it first: events with made-up worker ids could otherwise fill
      // the table and keep every real worker out.
      if (!(await this.pool.ensureWorker(reg.id, r)) && !((await this.evictUnregistered(reg.id)) && (await this.pool.ensureWorker(reg.id, r)))) {
        if (!known) await this.pool.removeWorker(reg.id)
        throw new KvrError(
          'KVR_ERR_TOO_MANY_WORKERS',
          `worker ${reg.id} rank ${r} does not fit: its index shard holds its maximum of ${this.pool.maxWorkerRanksPerShard} worker-ranks, all of registered workers`,
        )
      }
    }
    // The scheduler learns the ranks and the table the URL in one synchronous step: with an await
    // between them a request could be routed to a rank whose worker has no URL yet, and the
    // proxy would count that as a failed attempt.
    const old = this.registry.get(reg.id)
    if (info.blockSize !== this.config.blockSize && old?.blockSize !== info.blockSize) this.warnBlockSize(info)
    // before the scheduler learns the ranks: a misconfigured worker never takes a request
    this.health.registered(reg.id, info.url, info.blockSize)
    if (old !== undefined && old.dpRanks > dpRanks) for (let r = dpRanks; r < old.dpRanks; r++) this.scheduler.removeWorkerRank(reg.id, r)
    for (let r = 0; r < dpRanks; r++) {
      const rankInfo: { device: DeviceType; totalKvBlocks: number; maxNumBatchedTokens?: number } = { device: info.device, totalKvBlocks: info.capacity }
      if (info.maxNumBatchedTokens !== undefined) rankInfo.maxNumBatchedTokens = info.maxNumBatchedTokens
      this.scheduler.addWorkerRank(reg.id, r, rankInfo)
    }
    this.registry.set(info)
    this.suspension.forget(reg.id)
    this.probes?.watch(reg.id, info.url)
    const hasSource = this.config.natsUrl !== null || info.kvEvents !== null || reg.eventsInProcess === true
    if (this.config.kvEvents) this.eventSources.registered(info, known, hasSource)
    // An engine's own events come with their own recovery (the replay socket); in approximate
    // mode the index holds the scheduler's predictions, not events.
    if (info.kvEvents !== null && this.config.kvEvents) {
      this.recovery?.workerRemoved(reg.id)
      await this.engines.start(reg.id, dpRanks, info.kvEvents)
      return info
    }
    await this.engines.stop(reg.id)
    // an engine no longer read: what its events put in the index is dropped, and the worker is
    // predicted until other events of it come
    if (old !== undefined && old.kvEvents !== null && this.config.kvEvents) {
      for (let r = 0; r < old.dpRanks; r++) this.pool.resetWorkerRank(reg.id, r)
      this.eventSources.registered(info, false, hasSource)
    }
    // a new worker, or one now elsewhere: what it has cached is fetched (a model card arriving
    // for a worker already known changes neither)
    if (old === undefined || old.url !== info.url || old.dpRanks !== dpRanks || old.kvEvents !== null) void this.recovery?.workerAdded(reg.id, dpRanks)
    return info
  }

  private warnBlockSize(w: WorkerInfo): void {
    const bs = this.config.blockSize
    const out = this.config.mode === 'kv' ? `; it is misconfigured, out of routing until it registers with block size ${bs}` : ''
    log.warn(
      { code: 'KVR_BLOCK_SIZE_MISMATCH', worker_id: w.id.toString() },
      `worker ${w.id} announces block size ${w.blockSize}, the router hashes with ${bs}: its blocks will never match${out}`,
    )
  }

  /** A health probe ended; returns whether the next should come sooner (see HealthProbes). */
  private probed(id: bigint, url: string, r: ProbeResult): boolean {
    const effect = this.health.probed(id, url, r)
    const w = this.registry.get(id)
    if (effect.changed === 'unreachable' && w !== undefined)
      log.warn(
        { code: 'KVR_WORKER_UNREACHABLE', worker_id: id.toString() },
        `worker ${id} (${w.url}) is unreachable: ${this.health.reason(id) ?? ''}; out of routing until a probe is answered`,
      )
    // its request failures were the outage: it starts afresh
    if (effect.changed === 'recovered' && w !== undefined) {
      log.info({ worker_id: id.toString() }, `worker ${id} (${w.url}) answers its health probes again: back in routing`)
      this.suspension.answered(w)
    }
    return effect.confirm
  }

  /**
   * Drops the worker, known only from its KV events, that holds the fewest blocks in the shard
   * of `forId`, to make room for a registration; false when every rank there is registered.
   */
  private async evictUnregistered(forId: bigint): Promise<boolean> {
    let victim: { id: bigint; blocks: number } | null = null
    const blocks = new Map<bigint, number>()
    for (const t of await this.pool.shardTreeSizes(forId)) {
      // a worker whose registration is under way holds slots before it is in the table
      if (t.worker_id === forId || this.registry.has(t.worker_id) || this.registry.changing(t.worker_id)) continue
      blocks.set(t.worker_id, (blocks.get(t.worker_id) ?? 0) + t.tree_size)
    }
    for (const [id, n] of blocks) if (victim === null || n < victim.blocks) victim = { id, blocks: n }
    if (victim === null) return false
    await this.pool.removeWorker(victim.id)
    this.evictedUnregistered++
    return true
  }

  /** Workers known only from KV events dropped to make room for a registration. */
  evictedUnregistered = 0

  /**
   * A shard thread that died comes back empty (ShardPool), and its answers are marked not exact.
   * Its registered workers are put back in it and rebuilt from their dumps where they answer the
   * worker query. A worker that cannot be rebuilt so is marked `degraded` (its cached blocks are
   * forgotten until its next events refill them) and a warning says so; then the shard is exact
   * again for every other worker, and /ready with it: a shard that stayed `recovering` for good
   * would keep the replica out of its balancer until restarted. In approximate mode the shards
   * hold nothing.
   */
  private async rebuildShard(shard: number): Promise<void> {
    if (this.closed) return
    if (!this.config.kvEvents) return this.pool.markRebuilt(shard)
    const restarts = this.pool.counters()[shard]?.restarts
    const workers = this.registry.all().filter((w) => this.pool.shardOf(w.id) === shard)
    const lost: bigint[] = []
    await Promise.all(
      workers.map(async (w) => {
        for (let r = 0; r < w.dpRanks; r++) await this.pool.ensureWorker(w.id, r).catch(() => false)
        // its predictions went with the shard: predicted afresh
        if (this.eventSources.has(w.id)) {
          this.scheduler.setPredicted(w.id, false)
          this.scheduler.setPredicted(w.id, true)
          return
        }
        // an engine read over ZMQ is rebuilt from its replay buffer: its listeners start over
        if (w.kvEvents !== null && this.engines.has(w.id)) {
          await this.engines.stop(w.id)
          await this.engines.start(w.id, w.dpRanks, w.kvEvents)
          return
        }
        const ok = this.recovery === null ? false : await this.recovery.rebuildWorker(w.id, w.dpRanks)
        if (!ok) {
          lost.push(w.id)
          this.recovery?.markLost(w.id, w.dpRanks)
        }
      }),
    )
    // not after a newer restart, whose own rebuild decides
    if (this.closed || this.pool.counters()[shard]?.restarts !== restarts) return
    if (lost.length > 0)
      log.warn(
        { code: 'KVR_INDEX_DEGRADED', shard },
        `index shard ${shard} restarted: the cached blocks of worker(s) ${lost.join(', ')} are forgotten until their next KV events (they do not answer the worker query${this.recovery === null ? ', or --no-router-event-recovery' : ''})`,
      )
    this.pool.markRebuilt(shard)
  }

  private async removeWorkerNow(id: bigint): Promise<boolean> {
    this.recovery?.workerRemoved(id)
    this.eventSources.removed(id)
    this.approxEventIds.delete(id)
    await this.engines.stop(id)
    this.strangers.delete(id)
    this.sessions?.forgetWorker(id)
    this.suspension.forget(id)
    this.probes?.unwatch(id)
    const registered = this.registry.delete(id)
    if (registered) this.scheduler.removeWorker(id)
    // after the scheduler: a worker let back into routing first could take waiters
    this.health.removed(id)
    if (!registered && (await this.pool.indexedRanks(id)) === 0) return false
    await this.pool.removeWorker(id)
    return true
  }

  /** Unregistered ids whose events were named in a warning. */
  private readonly strangers = new Set<bigint>()

  /**
   * The periodic check of the workers without events; and when events arrive for ids nobody
   * registered while registered workers stay silent, the likely cause (ids that do not agree)
   * is said once per id.
   */
  async checkEventSources(): Promise<void> {
    this.eventSources.check()
    if (this.eventSources.size === 0 || this.closed) return
    const unknown = new Set<bigint>()
    for (const t of await this.pool.treeSizes().catch(() => []))
      if (!this.registry.has(t.worker_id) && !this.strangers.has(t.worker_id)) unknown.add(t.worker_id)
    if (unknown.size === 0 || this.closed) return
    for (const id of unknown) this.strangers.add(id)
    const silent = this.registry
      .all()
      .filter((w) => this.eventSources.has(w.id))
      .map((w) => `${w.id} (${w.url})`)
    log.warn(
      { code: 'KVR_WORKER_NO_EVENTS' },
      `KV events arrive for worker id(s) ${[...unknown].join(', ')}, which are not registered, while registered worker(s) ${silent.join(', ')} have sent none: if they are the same engines, register each with its engine's id (--worker ID=URL, or "id" in POST /v1/workers)`,
    )
  }

  /** What the index knows of a registered worker-rank (the shard's own state aside). */
  indexStateOf(workerId: bigint, dpRank: number): RankIndexState {
    if (!this.config.kvEvents) return 'predicted'
    const a = this.recovery?.stateOf(workerId, dpRank) ?? 'exact'
    const b = this.engines.stateOf(workerId, dpRank) ?? 'exact'
    // what its event source is doing says more than that nothing came of it yet
    if (a === 'degraded' || b === 'degraded') return 'degraded'
    if (a === 'recovering' || b === 'recovering') return 'recovering'
    return this.eventSources.has(workerId) ? 'no-events' : 'exact'
  }

  // ---- events ----

  /** One raw RouterEvent JSON message to its shard; false = backpressure (nothing is lost). */
  ingest(bytes: Uint8Array, workerId?: bigint): boolean {
    return this.pool.push(bytes, workerId)
  }

  ingestEvent(ev: RouterEvent): boolean {
    return this.pool.push(Buffer.from(encodeRouterEvent(ev)), ev.worker_id)
  }

  // ---- routing ----

  private takeScratch(n: number): Scratch {
    const s = this.scratch.pop()
    if (s !== undefined && s.lo.length >= n) return s
    const c = Math.max(64, 1 << Math.ceil(Math.log2(Math.max(1, n))))
    return { lo: new Uint32Array(c), hi: new Uint32Array(c), sLo: new Uint32Array(c), sHi: new Uint32Array(c) }
  }

  private giveScratch(s: Scratch): void {
    if (this.scratch.length < 256) this.scratch.push(s)
  }

  /** Slot of (worker, rank) in the scheduler, -1 when not registered there. */
  slotOf(lo: number, hi: number, rank: number): number {
    const w = this.scheduler.workers
    if (this.slotCacheVersion !== w.version) {
      this.slotCache.clear()
      this.slotCacheVersion = w.version
    }
    if (hi >= 0x200000 || rank > 0x7ff) return w.slotOf(u64FromParts(lo, hi), rank)
    // hi < 2^21 and rank < 2^11: hi·2^32 + lo fits 53 bits; the rank goes into a float's spare range
    const key = (hi * 4294967296 + lo) * 2048 + rank
    let slot = this.slotCache.get(key)
    if (slot === undefined) {
      slot = w.slotOf(u64FromParts(lo, hi), rank)
      if (Number.isSafeInteger(key)) this.slotCache.set(key, slot)
    }
    return slot
  }

  /**
   * Routes one prompt. Timings go to the overhead histograms. Throws KvrError
   * (TOKEN_OUT_OF_RANGE, UNKNOWN_WORKER, NO_WORKERS, ALL_WORKERS_BUSY, QUEUE_FULL, …).
   */
  async route(input: RouteInput): Promise<{ decision: RouteDecision; overlap: OverlapResult; blocks: number; isl: number }> {
    if (this.closed) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the router is shutting down')
    const t0 = performance.now()
    const bs = this.config.blockSize
    let n: number
    let sc: Scratch
    let isl: number
    if (input.tokens !== null) {
      const tokens = input.tokens
      sc = this.takeScratch(Math.floor(tokens.length / bs))
      try {
        n = promptHashesInto(tokens, bs, sc.lo, sc.hi, sc.sLo, sc.sHi)
      } catch (err) {
        this.giveScratch(sc)
        throw err
      }
      isl = input.isl ?? tokens.length
    } else {
      const lo = input.blockLo as Uint32Array
      const hi = input.blockHi as Uint32Array
      n = input.blockCount ?? lo.length
      sc = this.takeScratch(n)
      sc.lo.set(lo.subarray(0, n))
      sc.hi.set(hi.subarray(0, n))
      isl = input.isl ?? n * bs
      sequenceHashesInto(sc.lo, sc.hi, n, sc.sLo, sc.sHi)
    }
    try {
      const t1 = performance.now()
      // The non-kv modes need no overlap; kv mode asks the shards (in approximate mode they hold
      // the synthetic events of the scheduler's predictions).
      const kv = this.config.mode === 'kv'
      const overlap = kv && n > 0 ? await this.pool.query(sc.lo, sc.hi, n) : EMPTY_RESULT
      const t2 = performance.now()
      const w = this.scheduler.workers
      // the status page shows each candidate's cost terms, built only while someone watches
      const explain = input.explain === true || this.decisions.watchingAt(t2)
      let dense: Float64Array | undefined
      let trees: Float64Array | undefined
      if (overlap.count > 0) {
        dense = new Float64Array(w.slotCapacity)
        if (explain) trees = new Float64Array(w.slotCapacity)
        for (let i = 0; i < overlap.count; i++) {
          const slot = this.slotOf(overlap.workerIdLo[i] as number, overlap.workerIdHi[i] as number, overlap.dpRank[i] as number)
          if (slot < 0) continue
          dense[slot] = overlap.overlap[i] as number
          if (trees !== undefined) trees[slot] = overlap.treeSize[i] as number
        }
      }
      const t3 = performance.now()
      const update = input.updateStates !== false
      const id = update ? (input.id ?? this.requestIds.create()) : input.id
      const req: Parameters<Scheduler['schedule']>[0] = {
        isl,
        seqLo: sc.sLo,
        seqHi: sc.sHi,
        blockCount: n,
        localLo: sc.lo,
        localHi: sc.hi,
        updateStates: update,
      }
      if (id !== undefined) req.id = id
      if (dense !== undefined) req.overlapBlocks = dense
      if (trees !== undefined) req.treeSizes = trees
      if (input.priority !== undefined) req.priority = input.priority
      if (input.workerId !== undefined) req.workerId = input.workerId
      if (input.dpRank !== undefined) req.dpRank = input.dpRank
      const session = this.sessions !== null && input.sessionId !== undefined && input.workerId === undefined ? input.sessionId : undefined
      if (session !== undefined) this.pinToSession(session, input.exclude, req)
      if (input.overrides !== undefined) req.overrides = input.overrides
      if (explain) req.explain = true
      const exclude = this.suspension.any && input.workerId === undefined ? this.suspension.exclusions(input.exclude, this.health.held) : input.exclude
      if (exclude !== undefined) req.exclude = exclude
      if (input.signal !== undefined) req.signal = input.signal
      const decision = await this.scheduler.schedule(req)
      if (update && this.eventSources.size !== 0) this.eventSources.routed(decision.workerId)
      if (session !== undefined && update) {
        ;(this.sessions as SessionAffinity).bind(session, decision.workerId, decision.dpRank, performance.now())
        // the session's next turn may reach another replica
        this.replicas?.shareSessionBinding(session, decision.workerId, decision.dpRank, this.config.sessionAffinityTtlSecs * 1000)
      }
      const t4 = performance.now()
      this.metrics.observeOverhead(t1 - t0, t2 - t1, t4 - t3, t4 - t0)
      this.metrics.observeDecision(decision, n, isl)
      this.decisions.record(decision, n, isl, t4)
      return { decision, overlap, blocks: n, isl }
    } finally {
      this.giveScratch(sc)
    }
  }

  /** Pins the request to its session's worker-rank when that binding is live and the rank can take it. */
  private pinToSession(session: string, exclude: readonly WorkerRankRef[] | undefined, req: { workerId?: bigint; dpRank?: number }): void {
    const sessions = this.sessions as SessionAffinity
    const b = sessions.get(session, performance.now())
    if (b === undefined) {
      sessions.counters.bound++
      return
    }
    const w = this.registry.get(b.workerId)
    const slot = this.scheduler.workers.slotOf(b.workerId, b.dpRank)
    const tried = exclude?.some((x) => x.workerId === b.workerId && x.dpRank === b.dpRank) === true
    if (w === undefined || slot < 0 || tried || this.suspension.isSuspended(w) || this.health.isHeld(w.id) || this.scheduler.isBusy(slot)) {
      sessions.counters.broken++
      return
    }
    sessions.counters.hits++
    req.workerId = b.workerId
    req.dpRank = b.dpRank
  }

  // ---- approximate mode: the scheduler's predicted blocks become synthetic events ----

  private approxSink(): ApproxSink {
    // numbered per worker-rank, as the shards check ids for gaps
    const eventId = (w: bigint, rank: number): bigint => {
      let ids = this.approxEventIds.get(w)
      if (ids === undefined) this.approxEventIds.set(w, (ids = []))
      const id = (ids[rank] ?? 0n) + 1n
      ids[rank] = id
      return id
    }
    const push = (ev: RouterEvent): void => void this.pool.pushPredicted(Buffer.from(encodeRouterEvent(ev)), ev.worker_id)
    return {
      stored: (workerId, dpRank, localLo, localHi, seqLo, seqHi, n) => {
        const blocks: StoredBlock[] = []
        for (let i = 0; i < n; i++)
          blocks.push({
            block_hash: u64FromParts(seqLo[i] as number, seqHi[i] as number),
            tokens_hash: u64FromParts(localLo[i] as number, localHi[i] as number),
          })
        push({ worker_id: workerId, event: { event_id: eventId(workerId, dpRank), dp_rank: dpRank, data: { stored: { parent_hash: null, blocks } } } })
      },
      removed: (workerId, dpRank, seqLo, seqHi, n) => {
        const hashes: bigint[] = []
        for (let i = 0; i < n; i++) hashes.push(u64FromParts(seqLo[i] as number, seqHi[i] as number))
        push({ worker_id: workerId, event: { event_id: eventId(workerId, dpRank), dp_rank: dpRank, data: { removed: { block_hashes: hashes } } } })
      },
    }
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    clearInterval(this.checkTimer)
    await this.probes?.close()
    // first: peers drop this replica's bookings at its goodbye, and its last frees go out
    await this.replicas?.close().catch(() => undefined)
    await this.replicaRegistry?.close().catch(() => undefined)
    await this.durable?.close().catch(() => undefined)
    await this.nats?.close().catch(() => undefined)
    await this.discovery?.close().catch(() => undefined)
    this.scheduler.close()
    this.metrics.close()
    await this.engines.close()
    // before the pool: holds behind queries in flight are let go, so the shards can drain
    this.recovery?.close()
    await this.pool.close()
  }
}
