// The parts of a router and how they are wired, without transports or the route path: the
// shard pool's hooks, the scheduler, worker health and its probes, event sources, recovery of
// missed events, session bindings and the metrics; and worker membership (registration, removal,
// the rebuild of a restarted shard). src/core/router.ts connects the transports to it and routes
// through src/core/route-path.ts.
import type { ServeConfig } from '../config.js'
import type { ShardPool } from '../shards/pool.js'
import { Scheduler } from '../scheduler/scheduler.js'
import { schedulerOptionsOf } from '../scheduler/options.js'
import type { ApproxSink } from '../scheduler/approximate.js'
import type { DeviceType } from '../scheduler/worker-ranks.js'
import { encodeRouterEvent } from '../codec/events.js'
import type { RouterEvent } from '../codec/events.js'
import { KvrError } from '../errors.js'
import { RouterMetrics } from '../metrics/registry.js'
import { registerSchedulerMetrics } from '../scheduler/metrics.js'
import { registerShardMetrics } from '../shards/metrics.js'
import { registerEngineMetrics, registerHealthMetrics, registerWorkerMetrics } from './metrics.js'
import { IndexRecovery } from '../shards/recovery.js'
import { EngineIntake } from '../transport/engine-intake.js'
import { RemoteIndexer } from '../transport/remote-indexer.js'
import { RequestPlaneClient } from '../request-plane/client.js'
import { registerRequestPlaneMetrics } from '../request-plane/metrics.js'
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

/**
 * What the index knows of a worker-rank: `exact` from its events; `recovering` while missed events
 * are fetched; `degraded` when some could not be; `no-events` while it has sent none since it
 * registered (routed on predictions); `predicted` in approximate mode.
 */
export type RankIndexState = 'exact' | 'recovering' | 'degraded' | 'no-events' | 'predicted'

export class RouterParts {
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
  /** Per worker, per rank, the id of the last predicted event. */
  private approxEventIds = new Map<bigint, bigint[]>()
  private stopped = false
  /** Recovery of missed KV events, or null in approximate mode or with --no-router-event-recovery. */
  readonly recovery: IndexRecovery | null
  /** Engines' own KV events (ZMQ), for the workers registered with a kv-events endpoint. */
  readonly engines: EngineIntake
  /** Session bindings, or null without --router-session-affinity-ttl-secs. */
  readonly sessions: SessionAffinity | null
  /** The workers that have sent no KV event since they registered (KV-events mode). */
  readonly eventSources: EventSources
  /** The shared remote index the route path asks first (`--indexer-url`), or null. */
  readonly remote: RemoteIndexer | null
  /** Dynamo's TCP request plane, for workers whose instance record names one; its listener starts on first use. */
  readonly requestPlane: RequestPlaneClient
  private readonly checkTimer: NodeJS.Timeout

  constructor(config: ServeConfig, pool: ShardPool) {
    this.config = config
    this.pool = pool
    this.requestPlane = new RequestPlaneClient({ codec: config.requestPlaneCodec })
    const approx = !config.kvEvents
    // in KV-events mode, for the workers that send none (yet)
    const sink: ApproxSink | undefined = approx || config.mode === 'kv' ? this.approxSink() : undefined
    this.scheduler = new Scheduler(schedulerOptionsOf(config, approx), sink === undefined ? {} : { approxSink: sink })
    this.recovery =
      config.kvEvents && config.eventRecovery
        ? new IndexRecovery(pool, {
            urlOf: (id) => this.queryTarget(id),
            requestPlane: this.requestPlane,
            onAnswers: (id) => this.eventSources.evented(id),
          })
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
    registerWorkerMetrics(reg, this.registry, this.suspension, this.eventSources, this.sessions, config.modelName)
    registerHealthMetrics(reg, this.registry, this.health, this.suspension, this.probes)
    registerEngineMetrics(reg, this.scheduler)
    registerRequestPlaneMetrics(reg, this.requestPlane)
    this.remote =
      config.indexerUrl === null
        ? null
        : new RemoteIndexer({
            urls: config.indexerUrl
              .split(',')
              .map((u) => u.trim())
              .filter((u) => u !== ''),
            timeoutMs: config.indexerTimeoutMs,
            modelName: config.modelName,
            blockSize: config.blockSize,
            registry: reg,
          })
  }

  // ---- workers ----

  /** Where a worker's query goes: its request-plane address when it has one, else its HTTP URL. */
  private queryTarget(id: bigint): string | undefined {
    const w = this.registry.get(id)
    if (w === undefined) return undefined
    return w.requestPlane == null ? w.url : `tcp://${w.requestPlane.replace(/^tcp:\/\//, '')}`
  }

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
      requestPlane: reg.requestPlane ?? null,
      model: reg.model ?? null,
      decisionsOnly: reg.decisionsOnly === true,
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
          `worker ${reg.id} rank ${r} does not fit: its index shard holds its maximum of ${this.pool.maxWorkerRanksPerShard} worker-ranks, all of ` +
            `registered workers`,
        )
      }
    }
    // The scheduler learns the ranks and the table the URL in one synchronous step: with an await
    // between them a request could be routed to a rank whose worker has no URL yet, and the
    // proxy would count that as a failed attempt.
    const old = this.registry.get(reg.id)
    if (info.blockSize !== this.config.blockSize && old?.blockSize !== info.blockSize) this.warnBlockSize(info)
    // before the scheduler learns the ranks: a misconfigured worker never takes a request
    // a worker reached only over the request plane answers no HTTP probe: its health comes from
    // discovery (its lease) and from its requests' failures
    const probed = !info.decisionsOnly && info.url !== ''
    this.health.registered(reg.id, info.url, info.blockSize, probed)
    if (old !== undefined && old.dpRanks > dpRanks) for (let r = dpRanks; r < old.dpRanks; r++) this.scheduler.removeWorkerRank(reg.id, r)
    for (let r = 0; r < dpRanks; r++) {
      const rankInfo: { device: DeviceType; totalKvBlocks: number; maxNumBatchedTokens?: number } = { device: info.device, totalKvBlocks: info.capacity }
      if (info.maxNumBatchedTokens !== undefined) rankInfo.maxNumBatchedTokens = info.maxNumBatchedTokens
      this.scheduler.addWorkerRank(reg.id, r, rankInfo)
    }
    this.registry.set(info)
    this.suspension.forget(reg.id)
    // the shared indexer reads the engine's events in the router's stead
    if (info.kvEvents !== null) this.remote?.addWorker({ id: reg.id, dpRanks, kvEvents: info.kvEvents })
    else if (old?.kvEvents != null) this.remote?.removeWorker(reg.id)
    // the router may have no way to reach a worker registered for decisions only
    if (probed) this.probes?.watch(reg.id, info.url)
    else this.probes?.unwatch(reg.id)
    const eventPlane = this.config.etcdUrl !== null && this.config.eventPlane === 'zmq'
    const hasSource = this.config.natsUrl !== null || eventPlane || info.kvEvents !== null || reg.eventsInProcess === true
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
    if (old === undefined || old.url !== info.url || old.requestPlane !== info.requestPlane || old.dpRanks !== dpRanks || old.kvEvents !== null)
      void this.recovery?.workerAdded(reg.id, dpRanks)
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
        `index shard ${shard} restarted: the cached blocks of worker(s) ${lost.join(', ')} are forgotten until their next KV events (they do not ` +
          `answer the worker query${this.recovery === null ? ', or --no-router-event-recovery' : ''})`,
      )
    this.pool.markRebuilt(shard)
  }

  private async removeWorkerNow(id: bigint): Promise<boolean> {
    this.recovery?.workerRemoved(id)
    this.eventSources.removed(id)
    this.approxEventIds.delete(id)
    this.remote?.removeWorker(id)
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
      `KV events arrive for worker id(s) ${[...unknown].join(', ')}, which are not registered, while registered worker(s) ${silent.join(', ')} ` +
        `have sent none: if they are the same engines, register each with its engine's id (--worker ID=URL, or "id" in POST /v1/workers)`,
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
    // written into the shard's ring straight from the tracker's arrays (a PREDICTED record)
    return this.pool.predictedSink(eventId)
  }

  /** True from the start of closing: nothing new starts. */
  get closed(): boolean {
    return this.stopped
  }

  /** The first step of closing: nothing new starts, the timers and probes stop. */
  async stop(): Promise<void> {
    if (this.stopped) return
    this.stopped = true
    clearInterval(this.checkTimer)
    await this.probes?.close()
  }

  /** The last step of closing, after the transports: the scheduler, the engines' listeners, recovery, the pool. */
  async close(): Promise<void> {
    await this.stop()
    this.scheduler.close()
    this.metrics.close()
    await this.engines.close()
    await this.remote?.close()
    // before the pool: holds behind queries in flight are let go, so the shards can drain
    this.recovery?.close()
    await this.requestPlane.close()
    await this.pool.close()
  }
}
