// The indexer's registrations: engines' ZMQ streams grouped by (model_name, routing_group), each
// group with its block size, all in one shard pool. Every registration (instance_id, dp_rank,
// model_name, routing_group) is one worker of the pool under an internal id derived from those
// four values, so a group's query keeps only its own workers' answers: the pool's trees are
// per worker-rank, and a worker of another group can neither add to nor take from a group's
// overlaps, which is what separate trees per group would give. The internal id is a hash of the
// registration, so two indexers give the same registration the same id and a snapshot of one
// loads into the other as it is.
import { KvrError } from '../errors.js'
import { tcpEndpoint } from '../core/endpoints.js'
import { saltSeed, seededBlockHashesInto, xxh3_64 } from '../codec/hashing.js'
import { u64FromParts, u64Hi, u64Lo } from '../codec/u64.js'
import { EngineIntake } from '../transport/engine-intake.js'
import type { ShardPool, OverlapResult } from '../shards/pool.js'
import type { ZmqCounters } from '../transport/zmq.js'
import { zeroZmqCounters } from '../transport/zmq.js'

export const DEFAULT_ROUTING_GROUP = 'default'

export interface Registration {
  readonly instanceId: bigint
  readonly dpRank: number
  readonly modelName: string
  readonly routingGroup: string
  readonly blockSize: number
  readonly endpoint: string
  readonly replayEndpoint: string | null
  /** The pool's worker id of this registration. */
  readonly internalId: bigint
}

interface Group {
  readonly modelName: string
  readonly routingGroup: string
  readonly blockSize: number
  /** internal id → registration */
  readonly members: Map<bigint, Registration>
}

/** Dynamo's per-instance summary (tokens; cpu and disk cumulative through the tiers before them). */
export interface InstanceSummary {
  longest_matched: number
  gpu: number
  dp: Record<string, number>
  cpu: number
  disk: number
}

export interface ScoreResponse {
  scores: Record<string, Record<string, number>>
  frequencies: number[]
  instances: Record<string, InstanceSummary>
}

const groupKey = (model: string, group: string): string => `${model}\u0000${group}`

/** The pool's worker id of a registration: the same in every indexer. */
export function internalIdOf(modelName: string, routingGroup: string, instanceId: bigint, dpRank: number): bigint {
  return xxh3_64(`kvr-indexer\u0000${modelName}\u0000${routingGroup}\u0000${instanceId}\u0000${dpRank}`, 0n)
}

/** A ZMQ endpoint the listener can connect: tcp://HOST:PORT. */
export function checkEndpoint(field: string, text: string): void {
  if (tcpEndpoint(text) === null) throw new KvrError('KVR_ERR_INVALID_ENDPOINT', `${field} must be tcp://HOST:PORT, got ${JSON.stringify(text)}`)
}

export class IndexerRegistry {
  private readonly groups = new Map<string, Group>()
  private readonly byInternal = new Map<bigint, Registration>()
  /** One engine intake per block size: an intake decodes its engines' batches at its size. */
  private readonly intakes = new Map<number, EngineIntake>()
  private readonly retired: ZmqCounters = zeroZmqCounters()
  readonly peers = new Set<string>()

  constructor(private readonly pool: ShardPool) {}

  private intake(blockSize: number): EngineIntake {
    let i = this.intakes.get(blockSize)
    if (i === undefined) this.intakes.set(blockSize, (i = new EngineIntake(blockSize, this.pool)))
    return i
  }

  get groupCount(): number {
    return this.groups.size
  }

  get workerCount(): number {
    return this.byInternal.size
  }

  /** 409 on a group of another block size or a registration already there; listeners start at once. */
  async register(r: Omit<Registration, 'internalId'>): Promise<Registration> {
    checkEndpoint('endpoint', r.endpoint)
    if (r.replayEndpoint !== null) checkEndpoint('replay_endpoint', r.replayEndpoint)
    const key = groupKey(r.modelName, r.routingGroup)
    const g = this.groups.get(key)
    if (g !== undefined && g.blockSize !== r.blockSize) {
      throw new KvrError(
        'KVR_ERR_INDEXER_CONFLICT',
        `block_size mismatch for model=${r.modelName} routing_group=${r.routingGroup}: existing=${g.blockSize}, requested=${r.blockSize}`,
      )
    }
    const internalId = internalIdOf(r.modelName, r.routingGroup, r.instanceId, r.dpRank)
    if (this.byInternal.has(internalId)) {
      throw new KvrError('KVR_ERR_INDEXER_CONFLICT', `instance ${r.instanceId} dp_rank ${r.dpRank} already registered`)
    }
    const reg: Registration = { ...r, internalId }
    const group = g ?? { modelName: r.modelName, routingGroup: r.routingGroup, blockSize: r.blockSize, members: new Map() }
    this.groups.set(key, group)
    group.members.set(internalId, reg)
    this.byInternal.set(internalId, reg)
    await this.pool.ensureWorker(internalId, 0)
    await this.intake(r.blockSize).start(internalId, 1, { endpoint: r.endpoint, replay: r.replayEndpoint, topic: '' })
    return reg
  }

  /**
   * Dynamo's unregister: one rank (dp_rank given), every rank of the instance in a group
   * (routing_group given), or in every group of the model. 404 when nothing matched.
   */
  async unregister(instanceId: bigint, modelName: string, routingGroup: string | null, dpRank: number | null): Promise<number> {
    const gone = [...this.byInternal.values()].filter(
      (r) =>
        r.instanceId === instanceId &&
        r.modelName === modelName &&
        (routingGroup === null || r.routingGroup === routingGroup) &&
        (dpRank === null || r.dpRank === dpRank),
    )
    if (gone.length === 0) {
      const what = dpRank === null ? `instance ${instanceId}` : `instance ${instanceId} dp_rank ${dpRank}`
      throw new KvrError('KVR_ERR_UNKNOWN_WORKER', `${what} not found`)
    }
    for (const r of gone) await this.remove(r)
    return gone.length
  }

  private async remove(r: Registration): Promise<void> {
    this.byInternal.delete(r.internalId)
    const key = groupKey(r.modelName, r.routingGroup)
    const g = this.groups.get(key)
    g?.members.delete(r.internalId)
    const intake = this.intakes.get(r.blockSize)
    if (intake !== undefined) await intake.stop(r.internalId)
    await this.pool.removeWorker(r.internalId)
  }

  /** Registrations, optionally of one model and/or group. */
  list(modelName: string | null, routingGroup: string | null): Registration[] {
    return [...this.byInternal.values()].filter(
      (r) => (modelName === null || r.modelName === modelName) && (routingGroup === null || r.routingGroup === routingGroup),
    )
  }

  /** The group's block size, or a 404 naming it. */
  group(modelName: string, routingGroup: string): Group {
    const g = this.groups.get(groupKey(modelName, routingGroup))
    if (g === undefined) throw new KvrError('KVR_ERR_UNKNOWN_GROUP', `no indexer for model=${modelName} routing_group=${routingGroup}`)
    return g
  }

  /** Every group, for /dump. */
  allGroups(): Group[] {
    return [...this.groups.values()]
  }

  registrationOf(internalId: bigint): Registration | undefined {
    return this.byInternal.get(internalId)
  }

  /** Overlaps of a prompt's tokens in a group, hashed at its block size with the request's salt. */
  async queryTokens(g: Group, tokens: ArrayLike<number>, loraName: string | null, cacheSalt: string | null): Promise<ScoreResponse> {
    const n = Math.floor(tokens.length / g.blockSize)
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    seededBlockHashesInto(tokens, g.blockSize, saltSeed(loraName, cacheSalt), lo, hi)
    return this.answer(g, await this.pool.query(lo, hi, n))
  }

  /** Overlaps of local block hashes (u64) in a group. */
  async queryHashes(g: Group, hashes: readonly bigint[]): Promise<ScoreResponse> {
    const n = hashes.length
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    for (let i = 0; i < n; i++) {
      lo[i] = u64Lo(hashes[i] as bigint)
      hi[i] = u64Hi(hashes[i] as bigint)
    }
    return this.answer(g, await this.pool.query(lo, hi, n))
  }

  /** Dynamo's answer from the pool's, the group's workers only; blocks become tokens. */
  private answer(g: Group, r: OverlapResult): ScoreResponse {
    const bs = g.blockSize
    const scores: Record<string, Record<string, number>> = {}
    const instances: Record<string, InstanceSummary> = {}
    const depths: number[] = []
    for (let i = 0; i < r.count; i++) {
      const reg = g.members.get(u64FromParts(r.workerIdLo[i] as number, r.workerIdHi[i] as number))
      if (reg === undefined) continue
      const gpuBlocks = r.overlap[i] as number
      // without lower tiers in the index, a worker's host and disk matches are its device match
      const cpuBlocks = Math.max(gpuBlocks, r.overlapHost?.[i] ?? gpuBlocks)
      const diskBlocks = Math.max(cpuBlocks, r.overlapDisk?.[i] ?? cpuBlocks)
      if (diskBlocks === 0) continue
      // a batch naming no rank is stored under the listener's rank 0: the registration names it
      const rank = String((r.dpRank[i] as number) === 0 ? reg.dpRank : (r.dpRank[i] as number))
      const id = reg.instanceId.toString()
      if (gpuBlocks > 0) {
        ;(scores[id] ??= {})[rank] = gpuBlocks * bs
        depths.push(gpuBlocks)
      }
      const s = (instances[id] ??= { longest_matched: 0, gpu: 0, dp: {}, cpu: 0, disk: 0 })
      s.dp[rank] = gpuBlocks * bs
      s.gpu = Math.max(s.gpu, gpuBlocks * bs)
      s.cpu = Math.max(s.cpu, cpuBlocks * bs)
      s.disk = Math.max(s.disk, diskBlocks * bs)
      s.longest_matched = Math.max(s.gpu, s.cpu, s.disk)
    }
    // frequencies[d]: worker-ranks holding the prompt's block d, down to the deepest match
    const deepest = depths.reduce((m, d) => Math.max(m, d), 0)
    const frequencies = new Array<number>(deepest).fill(0)
    for (const d of depths) for (let k = 0; k < d; k++) frequencies[k] = (frequencies[k] as number) + 1
    return { scores, frequencies, instances }
  }

  /** The listeners' counters, over every intake. */
  zmqCounters(): ZmqCounters {
    const sum = { ...this.retired }
    for (const i of this.intakes.values()) {
      const c = i.counters()
      for (const k of Object.keys(sum) as (keyof ZmqCounters)[]) sum[k] += c[k]
    }
    return sum
  }

  async close(): Promise<void> {
    await Promise.all([...this.intakes.values()].map((i) => i.close()))
  }
}
