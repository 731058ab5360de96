// The checks of the addresses a worker registration names: its HTTP URL, the ZMQ endpoints of an
// engine's own KV events, and lists of NATS or etcd servers. --worker, POST /v1/workers and etcd
// records all check with these, so the three accept the same values; a value that fails is a
// KvrError(KVR_ERR_INVALID_ENDPOINT) naming the field as its source spells it.
import { KvrError } from '../errors.js'

/** An engine's own KV-event publisher (vLLM, SGLang: ZMQ + MessagePack). */
export interface EngineEventsSpec {
  /** PUB endpoint of dp rank 0, tcp://host:port; rank r publishes on port + r. */
  readonly endpoint: string
  /** Replay ROUTER endpoint of dp rank 0 (rank r: port + r), or null. */
  readonly replay: string | null
  /** Topic prefix subscribed to ('' = every topic). */
  readonly topic: string
}

/** How a source of registrations names the engine-event fields, for its error messages. */
export interface EngineEventsNames {
  readonly endpoint: string
  readonly replay: string
  readonly topic: string
  readonly dpSize: string
  /** The message when replay or topic come without the endpoint. */
  readonly alone: string
}

/** The field names of POST /v1/workers and of etcd instance records. */
export const RECORD_FIELDS: EngineEventsNames = {
  endpoint: 'kv_events_endpoint',
  replay: 'replay_endpoint',
  topic: 'kv_events_topic',
  dpSize: 'dp_size',
  alone: 'replay_endpoint and kv_events_topic need kv_events_endpoint',
}

function invalid(message: string): KvrError {
  return new KvrError('KVR_ERR_INVALID_ENDPOINT', message)
}

/**
 * The engine's own KV-event source a registration names (null or undefined fields are absent):
 * null when it names none, else its endpoints checked for every dp rank (rank r on port + r).
 * Throws KvrError(KVR_ERR_INVALID_ENDPOINT) naming the field as `names` spells it.
 */
export function engineEventsSpec(
  f: { endpoint: unknown; replay: unknown; topic: unknown },
  dpRanks: number,
  names: EngineEventsNames,
): EngineEventsSpec | null {
  const given = (v: unknown): boolean => v !== null && v !== undefined
  if (!given(f.endpoint)) {
    if (given(f.replay) || given(f.topic)) throw invalid(names.alone)
    return null
  }
  const endpoint = rankedEndpoint(f.endpoint, dpRanks, names.endpoint, names.dpSize)
  const replay = given(f.replay) ? rankedEndpoint(f.replay, dpRanks, names.replay, names.dpSize) : null
  if (given(f.topic) && typeof f.topic !== 'string') throw invalid(`${names.topic} must be a string, got ${JSON.stringify(f.topic)}`)
  return { endpoint, replay, topic: (f.topic as string | undefined) ?? '' }
}

/** A tcp://HOST:PORT endpoint whose port + every rank is a port too. */
function rankedEndpoint(v: unknown, dpRanks: number, name: string, dpName: string): string {
  const e = typeof v === 'string' ? tcpEndpoint(v) : null
  if (e !== null && e.port + dpRanks - 1 <= 65535) return v as string
  const ranks = dpRanks > 1 ? ` with PORT + ${dpName} - 1 at most 65535 (${dpName} ${dpRanks})` : ''
  // the engine's own config names where it binds, which is no address to connect to
  const bind = typeof v === 'string' && v.startsWith('tcp://*:') ? '; tcp://*:PORT is where the engine binds, give the host the router connects to' : ''
  throw invalid(`${name} must be tcp://HOST:PORT${ranks}, got ${JSON.stringify(v)}${bind}`)
}

/** Host and port of a ZMQ endpoint the router connects to (tcp://HOST:PORT, port 1–65535), or null. */
export function tcpEndpoint(text: string): { host: string; port: number } | null {
  const m = /^tcp:\/\/(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(text)
  if (m === null) return null
  const port = Number(m[2])
  return port >= 1 && port <= 65535 ? { host: m[1] as string, port } : null
}

/** Rank r's endpoint: the port plus r, as vLLM offsets its publishers per dp rank. */
export function rankEndpoint(text: string, rank: number): string {
  const e = tcpEndpoint(text)
  if (e === null) throw invalid(`not a tcp://HOST:PORT endpoint: ${JSON.stringify(text)}`)
  return `tcp://${e.host}:${e.port + rank}`
}

/**
 * An http: or https: URL the WHATWG parser takes, as fetch and undici will read it: a regex
 * would let `http://h:99999` through, to fail only at the first request.
 */
export function isHttpUrl(text: string): boolean {
  // the parser drops spaces and tabs it finds, so "exa mple" would not reach it as written
  if (/\s/.test(text)) return false
  try {
    const u = new URL(text)
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== ''
  } catch {
    return false
  }
}

/**
 * A worker's HTTP endpoint as the proxy will use it (no trailing slash), or null when it cannot be
 * one: not http(s), no host, a port out of range. A worker is never registered with a URL that
 * fails every request sent to it.
 */
export function workerUrl(text: string): string | null {
  return isHttpUrl(text) ? text.replace(/\/+$/, '') : null
}

/**
 * The servers of a --nats-url or --etcd-url value. The client libraries take a list; handed the
 * flag's text whole, they would read a comma-separated list as one server and fail.
 */
export function urlList(text: string): string[] {
  return text
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x !== '')
}
