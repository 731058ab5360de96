// A worker endpoint's request-plane address, as its instance record's `transport.tcp` gives it:
// `host:port/{endpoint}` (older releases) or `host:port/{instance_id:x}/{endpoint}` (newer, one
// TCP server shared by every endpoint of a process), optionally with a `tcp://` prefix. The part
// after the first `/` is the endpoint path the worker's server dispatches on, sent as the frame's
// path and its `x-endpoint-path` header (egress/tcp_client.rs@c0150325 parse_address;
// ingress/shared_tcp_endpoint.rs@19854ec1 registers `{instance_id:x}/{endpoint}`).
import { KvrError } from '../errors.js'

export interface InstanceAddress {
  host: string
  port: number
  /** `host:port` (IPv6 hosts in brackets): the pool's key. */
  hostPort: string
  endpointPath: string
}

function bad(address: string, why: string): KvrError {
  return new KvrError('KVR_ERR_INSTANCE_ADDRESS', `request-plane address ${JSON.stringify(address)}: ${why}`)
}

export function parseInstanceAddress(address: string): InstanceAddress {
  const rest = address.startsWith('tcp://') ? address.slice(6) : address
  const slash = rest.indexOf('/')
  if (slash < 0) throw bad(address, 'no endpoint path after host:port')
  const hostPort = rest.slice(0, slash)
  const endpointPath = rest.slice(slash + 1)
  if (endpointPath === '' || endpointPath.endsWith('/')) throw bad(address, 'an empty endpoint name')
  const m = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/.exec(hostPort)
  const port = m === null ? NaN : Number(m[2])
  if (m === null || port < 1 || port > 65535) throw bad(address, 'not host:port before the path')
  const host = (m[1] as string).replace(/^\[(.*)\]$/, '$1')
  return { host, port, hostPort, endpointPath }
}

/**
 * The address of another endpoint of the same worker process: its last path segment replaced
 * (`{id:x}/generate` → `{id:x}/worker_kv_indexer_query_dp0`). Every endpoint of a process is
 * served by its one TCP server, so only the path differs.
 */
export function siblingEndpoint(a: InstanceAddress, endpoint: string): InstanceAddress {
  const slash = a.endpointPath.lastIndexOf('/')
  return { ...a, endpointPath: slash < 0 ? endpoint : `${a.endpointPath.slice(0, slash + 1)}${endpoint}` }
}
