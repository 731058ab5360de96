// The replica registry in etcd (with --router-replica-sync and --etcd-url): each router replica
// holds a lease and writes one key under it, as Dynamo processes do for their instances:
//
//   v1/kvrouter_replicas/{ns}/{component}/{router id in hex}
//     {"router_id": 4242…, "url": "http://host:8000", "host": "host", "pid": 17, "started_at": 1712…}
//
// The first lease's id is the replica's router id for its whole life. A lost lease (etcd down
// longer than its TTL) is replaced and the key written again under the same router id. Every
// replica watches the prefix: a key deleted (the replica stopped, or its lease expired) takes
// that replica's bookings away, and after a lost connection the prefix is listed again.
import type { Etcd3, Lease } from 'etcd3'
import { EventEmitter } from 'node:events'
import { hostname } from 'node:os'
import { parseJsonExact, readU64, serializeJson } from '../codec/json.js'
import { etcdConnection } from './etcd.js'
import { KvrError } from '../errors.js'
import { limited } from '../runtime/log.js'

export interface ReplicaRecord {
  routerId: string
  url: string | null
  host: string | null
  pid: number | null
  startedAt: number | null
}

export interface ReplicaRegistryOptions {
  url: string
  namespace: string
  component: string
  /** Lease TTL in seconds (default 10): how long a replica that died stays listed. */
  ttlSecs?: number
  dialTimeoutMs?: number
}

/** The etcd prefix of a component's router replicas. */
export function replicasPrefix(namespace: string, component: string): string {
  return `v1/kvrouter_replicas/${namespace}/${component}/`
}

export class ReplicaRegistry extends EventEmitter {
  /** Every replica listed, this one included, by router id (decimal). */
  readonly replicas = new Map<string, ReplicaRecord>()
  readonly routerId: bigint
  readonly counters = { puts: 0, deletes: 0, resyncs: 0, leasesLost: 0, malformed: 0 }
  private lease: Lease
  private watcher: { cancel(): Promise<void> } | null = null
  private up = true
  private closed = false
  private readonly prefix: string
  private readonly key: string
  private url: string | null = null
  private readonly startedAt = Date.now()

  private constructor(
    private readonly client: Etcd3,
    private readonly opts: ReplicaRegistryOptions,
    lease: Lease,
    routerId: bigint,
  ) {
    super()
    this.lease = lease
    this.routerId = routerId
    this.prefix = replicasPrefix(opts.namespace, opts.component)
    this.key = this.prefix + routerId.toString(16)
  }

  /** Takes a lease (its id becomes the router id), writes this replica's key and watches the others. */
  static async start(opts: ReplicaRegistryOptions): Promise<ReplicaRegistry> {
    const { Etcd3 } = await import('etcd3')
    const client = new Etcd3({ ...etcdConnection(opts.url), dialTimeout: opts.dialTimeoutMs ?? 3000 })
    let reg: ReplicaRegistry
    try {
      const lease = client.lease(opts.ttlSecs ?? 10)
      const id = BigInt(await lease.grant())
      reg = new ReplicaRegistry(client, opts, lease, id)
      await reg.write()
      reg.watchLease()
      await reg.watch(await reg.resync())
    } catch (err) {
      client.close()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `replica registry: cannot register in etcd at ${opts.url}: ${(err as Error).message}`, { cause: err })
    }
    return reg
  }

  get connected(): boolean {
    return this.up
  }

  /** The URL other replicas and operators see for this one, once it listens. */
  async setUrl(url: string): Promise<void> {
    this.url = url
    await this.write().catch(() => undefined)
  }

  private record(): string {
    return serializeJson({ router_id: this.routerId, url: this.url, host: hostname(), pid: process.pid, started_at: this.startedAt })
  }

  private async write(): Promise<void> {
    await this.lease.put(this.key).value(this.record())
  }

  private watchLease(): void {
    this.lease.on('lost', () => {
      if (this.closed) return
      this.counters.leasesLost++
      limited.warn('replica_lease_lost', { router_id: this.routerId.toString() }, "this replica's etcd lease was lost: it registers again under a new lease")
      // same router id under a fresh lease: peers keep the bookings they hold for it
      this.lease = this.client.lease(this.opts.ttlSecs ?? 10)
      this.watchLease()
      this.write().catch((err: unknown) =>
        limited.warn('replica_registry_error', { error: (err as Error).message }, 'registering this replica in etcd again failed'),
      )
    })
  }

  private parse(key: string, value: string): ReplicaRecord | null {
    const hex = key.slice(this.prefix.length)
    try {
      if (!/^[0-9a-fA-F]{1,16}$/.test(hex)) throw new Error('not a router id in hex')
      const v = parseJsonExact(value) as Record<string, unknown>
      const routerId = readU64(v['router_id'], 'router_id')
      if (routerId !== BigInt(`0x${hex}`)) throw new Error('the key and router_id disagree')
      return {
        routerId: routerId.toString(),
        url: typeof v['url'] === 'string' ? v['url'] : null,
        host: typeof v['host'] === 'string' ? v['host'] : null,
        pid: typeof v['pid'] === 'number' ? v['pid'] : null,
        startedAt: typeof v['started_at'] === 'number' ? v['started_at'] : null,
      }
    } catch (err) {
      this.counters.malformed++
      limited.warn('replica_registry_malformed', { key, error: (err as Error).message }, 'a replica record in etcd did not decode: skipped')
      return null
    }
  }

  private put(rec: ReplicaRecord): void {
    const known = this.replicas.has(rec.routerId)
    this.replicas.set(rec.routerId, rec)
    this.emit(known ? 'updated' : 'added', rec)
  }

  private remove(id: string): void {
    if (!this.replicas.delete(id)) return
    this.emit('removed', id)
  }

  /** Lists the prefix and reconciles; returns the revision listed. */
  async resync(): Promise<string> {
    const res = await this.client.getAll().prefix(this.prefix).exec()
    const seen = new Set<string>()
    for (const kv of res.kvs ?? []) {
      const rec = this.parse(kv.key.toString(), kv.value.toString())
      if (rec === null) continue
      seen.add(rec.routerId)
      this.put(rec)
    }
    for (const id of [...this.replicas.keys()]) if (!seen.has(id) && id !== this.routerId.toString()) this.remove(id)
    this.counters.resyncs++
    return res.header?.revision ?? '0'
  }

  private async watch(revision: string): Promise<void> {
    const w = await this.client
      .watch()
      .prefix(this.prefix)
      .startRevision(String(BigInt(revision) + 1n))
      .create()
    w.on('put', (kv) => {
      this.counters.puts++
      const rec = this.parse(kv.key.toString(), kv.value.toString())
      if (rec !== null) this.put(rec)
    })
    w.on('delete', (kv) => {
      this.counters.deletes++
      const hex = kv.key.toString().slice(this.prefix.length)
      if (/^[0-9a-fA-F]{1,16}$/.test(hex)) this.remove(BigInt(`0x${hex}`).toString())
    })
    w.on('disconnected', () => (this.up = false))
    w.on('connected', () => {
      if (this.up || this.closed) return
      this.up = true
      this.resync().catch(() => undefined)
    })
    w.on('error', () => undefined)
    this.watcher = w
  }

  /** Revokes the lease (peers see this replica leave at once) and closes the client. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    await this.watcher?.cancel().catch(() => undefined)
    await this.lease.revoke().catch(() => undefined)
    this.client.close()
  }
}
