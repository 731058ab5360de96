// How an engine announces itself. Distributed mode: one etcd lease per engine, whose id is the
// worker id, and the two keys of Dynamo's record format (docs/dynamo-compatibility.md; the very prefixes
// src/transport/etcd.ts lists and watches), written under the lease and kept alive with it; the
// lease is revoked on shutdown so the router drops the worker at once instead of after the TTL.
// Embedded/HTTP mode: POST /v1/workers on a router, DELETE on shutdown.
import type { Etcd3, Lease } from 'etcd3'
import { EventEmitter } from 'node:events'
import { KvrError } from '../../errors.js'
import { cardsPrefix, instancesPrefix } from '../../transport/dynamo-names.js'
import { etcdConnection } from '../../transport/etcd.js'
import { redactSecrets } from '../../runtime/redact.js'

export interface WorkerRecord {
  url: string
  blockSize: number
  totalKvBlocks: number
  maxNumBatchedTokens: number
  modelName?: string
  /** The engine's own KV-event publisher, for a router to read over ZMQ. */
  kvEvents?: { endpoint: string; replay: string | null }
}

export interface DiscoveryPath {
  namespace: string
  component: string
  endpoint: string
}

/** The two keys and values of a worker's record. */
export function etcdRecord(path: DiscoveryPath, workerId: bigint, rec: WorkerRecord): { key: string; value: string }[] {
  const hex = workerId.toString(16)
  const card: Record<string, unknown> = {
    kv_cache_block_size: rec.blockSize,
    runtime_config: { total_kv_blocks: rec.totalKvBlocks, max_num_batched_tokens: rec.maxNumBatchedTokens, data_parallel_size: 1, data_parallel_start_rank: 0 },
  }
  if (rec.modelName !== undefined) card.display_name = rec.modelName
  const instance: Record<string, unknown> = { http_url: rec.url, device_type: 'cuda' }
  if (rec.kvEvents !== undefined) {
    instance.kv_events_endpoint = rec.kvEvents.endpoint
    if (rec.kvEvents.replay !== null) instance.replay_endpoint = rec.kvEvents.replay
  }
  return [
    { key: `${instancesPrefix(path.namespace, path.component, path.endpoint)}${hex}`, value: JSON.stringify(instance) },
    { key: `${cardsPrefix(path.namespace, path.component, path.endpoint)}${hex}`, value: JSON.stringify(card) },
  ]
}

/** One engine's lease. Emits 'lost' (Error) when etcd says the lease is gone. */
export class EtcdLease extends EventEmitter {
  private revoked = false

  constructor(
    readonly id: bigint,
    private readonly lease: Lease,
    private readonly path: DiscoveryPath,
  ) {
    super()
    lease.on('lost', (err: Error) => {
      if (!this.revoked) this.emit('lost', err)
    })
  }

  /** Writes the worker's record under the lease. */
  async register(rec: WorkerRecord): Promise<void> {
    for (const { key, value } of etcdRecord(this.path, this.id, rec)) await this.lease.put(key).value(value)
  }

  /** Writes records of another format (the Dynamo mode's, dynamo/discovery-records.ts) under the lease. */
  async putAll(records: readonly { key: string; value: string }[]): Promise<void> {
    for (const { key, value } of records) await this.lease.put(key).value(value)
  }

  async revoke(): Promise<void> {
    if (this.revoked) return
    this.revoked = true
    await this.lease.revoke()
  }
}

export interface EtcdRegistrarOptions extends DiscoveryPath {
  url: string
  /** Lease TTL in seconds (keep-alives every third of it). */
  ttlSecs?: number
  connectTimeoutMs?: number
}

/** The etcd client shared by the engines of one process. */
export class EtcdRegistrar {
  private readonly client: Etcd3
  private readonly leases: EtcdLease[] = []

  private constructor(
    private readonly o: EtcdRegistrarOptions,
    client: Etcd3,
  ) {
    this.client = client
  }

  /** Connects; an unreachable etcd is a KvrError naming the URL. */
  static async connect(o: EtcdRegistrarOptions): Promise<EtcdRegistrar> {
    // loaded on first use: a fleet without etcd (npm start's) need not load its gRPC stack
    const { Etcd3 } = await import('etcd3')
    const r = new EtcdRegistrar(o, new Etcd3({ ...etcdConnection(o.url), dialTimeout: o.connectTimeoutMs ?? 3000 }))
    try {
      await withTimeout(r.client.get('v1/instances/').exists(), o.connectTimeoutMs ?? 5000)
    } catch (err) {
      r.client.close()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot reach etcd at ${redactSecrets(o.url)}: ${redactSecrets((err as Error).message)}`, { cause: err })
    }
    return r
  }

  /** A new lease, kept alive until revoked; its id is the engine's worker id. */
  async grant(): Promise<EtcdLease> {
    const lease = this.client.lease(this.o.ttlSecs ?? 10)
    let id: string
    try {
      id = await withTimeout(lease.grant(), this.o.connectTimeoutMs ?? 5000)
    } catch (err) {
      lease.release()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot get a lease from etcd at ${redactSecrets(this.o.url)}: ${redactSecrets((err as Error).message)}`, {
        cause: err,
      })
    }
    const l = new EtcdLease(BigInt(id), lease, this.o)
    this.leases.push(l)
    return l
  }

  /** Revokes every lease still held, then closes the client. */
  async close(): Promise<void> {
    await Promise.all(this.leases.map((l) => withTimeout(l.revoke(), 3000).catch(() => undefined)))
    this.client.close()
  }
}

function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)
    p.then(
      (v) => {
        clearTimeout(t)
        resolve(v)
      },
      (e: unknown) => {
        clearTimeout(t)
        reject(e instanceof Error ? e : new Error(String(e)))
      },
    )
  })
}

export interface RouterRegistration {
  routerUrl: string
  apiKey?: string
}

function routerHeaders(o: RouterRegistration, json: boolean): Record<string, string> {
  // no content-type without a body: fastify refuses an empty application/json body
  const h: Record<string, string> = json ? { 'content-type': 'application/json' } : {}
  if (o.apiKey !== undefined) h.authorization = `Bearer ${o.apiKey}`
  return h
}

/** POST /v1/workers on a router; a refusal or an unreachable router is a KvrError. */
export async function registerWithRouter(o: RouterRegistration, workerId: bigint, rec: WorkerRecord): Promise<void> {
  const base = o.routerUrl.replace(/\/+$/, '')
  const body =
    `{"id":"${workerId}","url":${JSON.stringify(rec.url)},"block_size":${rec.blockSize},"capacity":${rec.totalKvBlocks},` +
    `"max_num_batched_tokens":${rec.maxNumBatchedTokens}}`
  let res: Response
  try {
    res = await fetch(`${base}/v1/workers`, { method: 'POST', headers: routerHeaders(o, true), body })
  } catch (err) {
    throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot reach the router at ${base}: ${(err as Error).message}`, { cause: err })
  }
  if (!res.ok)
    throw new KvrError('KVR_ERR_INVALID_OPTION', `the router at ${base} refused worker ${workerId}: ${res.status} ${(await res.text()).slice(0, 300)}`)
  await res.arrayBuffer()
}

/** DELETE /v1/workers/{id}; best effort (the router may be gone already). */
export async function deregisterFromRouter(o: RouterRegistration, workerId: bigint, timeoutMs = 2000): Promise<boolean> {
  try {
    const res = await fetch(`${o.routerUrl.replace(/\/+$/, '')}/v1/workers/${workerId}`, {
      method: 'DELETE',
      headers: routerHeaders(o, false),
      signal: AbortSignal.timeout(timeoutMs),
    })
    await res.arrayBuffer()
    return res.ok
  } catch {
    return false
  }
}
