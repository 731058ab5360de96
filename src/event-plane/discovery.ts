// The event plane's publishers as etcd lists them: every record under v1/event_channels/ and
// v1/event_sources/ (src/event-plane/channels.ts), listed at start and then watched from the listed
// revision. Records come and go with their publishers' leases. After a lost connection the watch
// resumes and a full re-list reconciles anything missed. Who reads them (src/event-plane/intake.ts)
// is told after every change and reads the current records.
import type { Etcd3, IKeyValue } from 'etcd3'
import { EventEmitter } from 'node:events'
import { etcdConnection } from '../transport/etcd.js'
import { KvrError } from '../errors.js'
import { limited } from '../runtime/log.js'
import { EVENT_CHANNELS_PREFIX, EVENT_SOURCES_PREFIX, parseChannel, parseSource } from './channels.js'
import type { EventChannelRecord, EventSourceRecord } from './channels.js'

export interface ChannelDiscoveryCounters {
  puts: number
  deletes: number
  resyncs: number
  disconnects: number
  /** Records under the prefixes that are not valid (each warned about, rate-limited). */
  malformed: number
}

export class ChannelDiscovery extends EventEmitter {
  /** Current channel records by key. */
  readonly channels = new Map<string, EventChannelRecord>()
  /** Current source records by key. */
  readonly sources = new Map<string, EventSourceRecord>()
  readonly counters: ChannelDiscoveryCounters = { puts: 0, deletes: 0, resyncs: 0, disconnects: 0, malformed: 0 }
  private watchers: { cancel(): Promise<void> }[] = []
  private up = true
  private closed = false

  private constructor(private readonly client: Etcd3) {
    super()
  }

  static async start(url: string, dialTimeoutMs = 3000): Promise<ChannelDiscovery> {
    const { Etcd3 } = await import('etcd3')
    const d = new ChannelDiscovery(new Etcd3({ ...etcdConnection(url), dialTimeout: dialTimeoutMs }))
    try {
      await d.watch(await d.resync())
    } catch (err) {
      d.client.close()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot reach etcd at ${url}: ${(err as Error).message}`, { cause: err })
    }
    return d
  }

  get connected(): boolean {
    return this.up
  }

  /** Takes one record in (true when it changed what is known). */
  private put(kv: IKeyValue): boolean {
    const key = kv.key.toString()
    const text = kv.value.toString()
    const channel = key.startsWith(EVENT_CHANNELS_PREFIX)
    const r = channel ? parseChannel(key.slice(EVENT_CHANNELS_PREFIX.length), text) : parseSource(key.slice(EVENT_SOURCES_PREFIX.length), text)
    if (!r.ok) {
      this.counters.malformed++
      limited.warn('event_plane_record_malformed', { key, why: r.why }, 'an etcd record of an event-plane publisher is not valid: skipped')
      return this.remove(key)
    }
    if (channel) this.channels.set(key, r.value as EventChannelRecord)
    else this.sources.set(key, r.value as EventSourceRecord)
    return true
  }

  private remove(key: string): boolean {
    return this.channels.delete(key) || this.sources.delete(key)
  }

  /** Lists both prefixes and replaces what is known; returns the revision the listing reflects. */
  async resync(): Promise<string> {
    const [ch, src] = await Promise.all([this.client.getAll().prefix(EVENT_CHANNELS_PREFIX).exec(), this.client.getAll().prefix(EVENT_SOURCES_PREFIX).exec()])
    this.channels.clear()
    this.sources.clear()
    for (const kv of [...(ch.kvs ?? []), ...(src.kvs ?? [])]) this.put(kv)
    this.counters.resyncs++
    this.emit('change')
    const a = BigInt(ch.header?.revision ?? 0)
    const b = BigInt(src.header?.revision ?? 0)
    return String(a > b ? a : b)
  }

  private async watch(revision: string): Promise<void> {
    const next = String(BigInt(revision) + 1n)
    for (const prefix of [EVENT_CHANNELS_PREFIX, EVENT_SOURCES_PREFIX]) {
      const w = await this.client.watch().prefix(prefix).startRevision(next).create()
      w.on('put', (kv) => {
        this.counters.puts++
        if (this.put(kv)) this.emit('change')
      })
      w.on('delete', (kv) => {
        this.counters.deletes++
        if (this.remove(kv.key.toString())) this.emit('change')
      })
      w.on('disconnected', () => {
        if (this.up) {
          this.counters.disconnects++
          limited.warn(
            'event_plane_etcd_disconnected',
            {},
            'the etcd watch of event-plane publishers lost its connection: publishers that come or go meanwhile are seen when it is back',
          )
        }
        this.up = false
      })
      w.on('connected', () => {
        if (this.up || this.closed) return
        this.up = true
        this.resync().catch((err: unknown) =>
          limited.warn('event_plane_etcd_error', { error: (err as Error).message }, 'listing the event-plane publishers in etcd again failed'),
        )
      })
      w.on('error', (err: Error) =>
        limited.warn('event_plane_etcd_error', { error: err.message }, 'the etcd watch of event-plane publishers reported an error'),
      )
      this.watchers.push(w)
    }
  }

  async close(): Promise<void> {
    this.closed = true
    await Promise.all(this.watchers.map((w) => w.cancel().catch(() => undefined)))
    this.client.close()
  }
}
