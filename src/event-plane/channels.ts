// Dynamo's etcd records of event-plane publishers, in both generations, and which of them a router
// reads (docs/dynamo-compatibility.md, "ZMQ event plane"):
//
//   Gen-A  v1/event_channels/{ns}/{component}/{topic}/{instance_id:x}
//          {"type":"EventChannel","namespace","component","topic","instance_id","transport"}
//   Gen-B  v1/event_channels/namespace/{ns}[/component/{c}[/endpoint/{e}]]/topic/{topic}/{publisher_id:x}
//          {"type":"EventChannel","scope":{"kind":"namespace"|"component"|"endpoint",…},"topic","instance_id","transport"}
//          segments percent-encoded (every byte but [A-Za-z0-9_-] as %XX)
//   source v1/event_sources/… (Gen-B key layout)
//          {"type":"EventSource","scope","topic","publisher_id","metadata":{"worker":{"worker_id","dp_rank"},…}}
//
// transport is {"kind":"Zmq","config":{"endpoint"}} (a worker's own PUB), {"kind":"ZmqBroker",
// "config":{"xsub_endpoints","xpub_endpoints"}} (a broker, registered under component
// `zmq_broker`) or {"kind":"Nats",…} (read from NATS, not here). Ids come from the key's hex, so
// ids above 2^53 stay exact. A record that is none of this is refused with the reason.
import { parseJsonExact, readU64 } from '../codec/json.js'
import { decodeEventSegment } from './frame.js'

export const EVENT_CHANNELS_PREFIX = 'v1/event_channels/'
export const EVENT_SOURCES_PREFIX = 'v1/event_sources/'
/** The component Dynamo's ZMQ brokers register their channels under. */
export const BROKER_COMPONENT = 'zmq_broker'

/** Where a channel's or source's events belong. */
export interface EventScopeRef {
  readonly namespace: string
  /** null for a namespace-scoped record. */
  readonly component: string | null
  /** null unless endpoint-scoped. */
  readonly endpoint: string | null
}

export type ChannelTransport =
  | { readonly kind: 'zmq'; readonly endpoint: string }
  | { readonly kind: 'broker'; readonly xpub: readonly string[] }
  | { readonly kind: 'nats' }

export interface EventChannelRecord {
  readonly generation: 'A' | 'B'
  readonly scope: EventScopeRef
  readonly topic: string
  /** Gen-B: the publisher's id; Gen-A: the process's discovery id. */
  readonly instanceId: bigint
  readonly transport: ChannelTransport
}

export interface EventSourceRecord {
  readonly scope: EventScopeRef
  readonly topic: string
  readonly publisherId: bigint
  /** The worker-rank whose KV events this publisher sends, when the metadata says. */
  readonly workerId: bigint | null
  readonly dpRank: number | null
}

export type Parsed<T> = { ok: true; value: T } | { ok: false; why: string }

const HEX = /^[0-9a-fA-F]{1,16}$/

interface KeyParts {
  generation: 'A' | 'B'
  scope: EventScopeRef
  topic: string
  id: bigint
}

/** The scope, topic and id a key names, below its bucket prefix. */
export function parseRecordKey(rest: string): KeyParts | null {
  const p = rest.split('/')
  const id = p[p.length - 1] ?? ''
  if (!HEX.test(id)) return null
  if (p.length === 4 && p[0] !== 'namespace') {
    const [ns, component, topic] = p as [string, string, string]
    if (ns === '' || component === '' || topic === '') return null
    return { generation: 'A', scope: { namespace: ns, component, endpoint: null }, topic, id: BigInt(`0x${id}`) }
  }
  const d = (i: number): string | null => decodeEventSegment(p[i] ?? '')
  let scope: EventScopeRef
  let topicAt: number
  if (p.length === 5 && p[0] === 'namespace' && p[2] === 'topic') {
    const ns = d(1)
    if (ns === null) return null
    scope = { namespace: ns, component: null, endpoint: null }
    topicAt = 3
  } else if (p.length === 7 && p[0] === 'namespace' && p[2] === 'component' && p[4] === 'topic') {
    const [ns, c] = [d(1), d(3)]
    if (ns === null || c === null) return null
    scope = { namespace: ns, component: c, endpoint: null }
    topicAt = 5
  } else if (p.length === 9 && p[0] === 'namespace' && p[2] === 'component' && p[4] === 'endpoint' && p[6] === 'topic') {
    const [ns, c, e] = [d(1), d(3), d(5)]
    if (ns === null || c === null || e === null) return null
    scope = { namespace: ns, component: c, endpoint: e }
    topicAt = 7
  } else return null
  const topic = d(topicAt)
  if (topic === null) return null
  return { generation: 'B', scope, topic, id: BigInt(`0x${id}`) }
}

function str(v: unknown): string | null {
  return typeof v === 'string' && v !== '' ? v : null
}

function obj(v: unknown): Record<string, unknown> | null {
  return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null
}

function parseValue(text: string): Record<string, unknown> | null {
  try {
    return obj(parseJsonExact(text))
  } catch {
    return null
  }
}

/** A Gen-B `scope` object. */
function scopeOf(v: unknown): EventScopeRef | null {
  const s = obj(v)
  if (s === null) return null
  switch (s['kind']) {
    case 'namespace': {
      const name = str(s['name'])
      return name === null ? null : { namespace: name, component: null, endpoint: null }
    }
    case 'component': {
      const [ns, c] = [str(s['namespace']), str(s['component'])]
      return ns === null || c === null ? null : { namespace: ns, component: c, endpoint: null }
    }
    case 'endpoint': {
      const e = obj(s['endpoint'])
      if (e === null) return null
      const [ns, c, name] = [str(e['namespace']), str(e['component']), str(e['name'])]
      return ns === null || c === null || name === null ? null : { namespace: ns, component: c, endpoint: name }
    }
    default:
      return null
  }
}

function sameScope(a: EventScopeRef, b: EventScopeRef): boolean {
  return a.namespace === b.namespace && a.component === b.component && a.endpoint === b.endpoint
}

function transportOf(v: unknown): ChannelTransport | null {
  const t = obj(v)
  const config = obj(t?.['config'])
  if (t === null || config === null) return null
  if (t['kind'] === 'Zmq') {
    const endpoint = str(config['endpoint'])
    return endpoint === null || !/^(tcp|ipc|inproc):\/\/./.test(endpoint) ? null : { kind: 'zmq', endpoint }
  }
  if (t['kind'] === 'ZmqBroker') {
    const xpub = config['xpub_endpoints']
    if (!Array.isArray(xpub) || xpub.length === 0 || !xpub.every((e) => typeof e === 'string' && /^(tcp|ipc|inproc):\/\/./.test(e))) return null
    return { kind: 'broker', xpub: xpub as string[] }
  }
  if (t['kind'] === 'Nats') return { kind: 'nats' }
  return null
}

/** An EventChannel record (`rest` is its key below v1/event_channels/). */
export function parseChannel(rest: string, text: string): Parsed<EventChannelRecord> {
  const key = parseRecordKey(rest)
  if (key === null) return { ok: false, why: 'the key is not an event channel key' }
  const v = parseValue(text)
  if (v === null) return { ok: false, why: 'the value is not a JSON object' }
  if (v['type'] !== 'EventChannel') return { ok: false, why: 'the value is not of type EventChannel' }
  let scope: EventScopeRef | null
  if (key.generation === 'A') {
    const [ns, c] = [str(v['namespace']), str(v['component'])]
    scope = ns === null || c === null ? null : { namespace: ns, component: c, endpoint: null }
  } else scope = scopeOf(v['scope'])
  if (scope === null) return { ok: false, why: 'the value has no valid scope' }
  if (!sameScope(scope, key.scope) || v['topic'] !== key.topic) return { ok: false, why: 'the value names another scope or topic than its key' }
  const transport = transportOf(v['transport'])
  if (transport === null) return { ok: false, why: 'the value has no valid transport' }
  return { ok: true, value: { generation: key.generation, scope, topic: key.topic, instanceId: key.id, transport } }
}

/** An EventSource record (`rest` is its key below v1/event_sources/). */
export function parseSource(rest: string, text: string): Parsed<EventSourceRecord> {
  const key = parseRecordKey(rest)
  if (key === null || key.generation !== 'B') return { ok: false, why: 'the key is not an event source key' }
  const v = parseValue(text)
  if (v === null) return { ok: false, why: 'the value is not a JSON object' }
  if (v['type'] !== 'EventSource') return { ok: false, why: 'the value is not of type EventSource' }
  const scope = scopeOf(v['scope'])
  if (scope === null || !sameScope(scope, key.scope) || v['topic'] !== key.topic)
    return { ok: false, why: 'the value names another scope or topic than its key' }
  const worker = obj(obj(v['metadata'])?.['worker'])
  let workerId: bigint | null = null
  let dpRank: number | null = null
  if (worker !== null) {
    try {
      workerId = readU64(worker['worker_id'], 'worker_id')
    } catch {
      workerId = null
    }
    const r = worker['dp_rank']
    dpRank = typeof r === 'number' && Number.isInteger(r) && r >= 0 && r <= 0xffffffff ? r : workerId === null ? null : 0
  }
  return { ok: true, value: { scope, topic: key.topic, publisherId: key.id, workerId, dpRank } }
}

/** Whether a channel is a worker publisher of this router's KV events: its namespace and component, the topic, any endpoint. */
export function isWorkerChannel(c: EventChannelRecord | EventSourceRecord, namespace: string, component: string, topic: string): boolean {
  return c.scope.namespace === namespace && c.scope.component === component && c.topic === topic
}

/** Whether a channel is a ZMQ broker's (any namespace: brokers serve every one). */
export function isBrokerChannel(c: EventChannelRecord): boolean {
  return c.scope.component === BROKER_COMPONENT && c.transport.kind === 'broker'
}
