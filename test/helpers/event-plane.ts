// A Dynamo event-plane publisher for tests: a real ZMQ socket bound on a free loopback port that
// sends the 4-frame messages a worker's EventPublisher sends ([topic, publisher_id, sequence,
// frame]), numbering its messages from 0. It is an XPUB, which sends as a PUB does and also
// reports subscriptions, so a test can wait until the router's SUB has subscribed instead of
// losing its first messages to ZMQ's slow joiner. Also: etcd records of both generations.
import { XPublisher } from 'zeromq'
import type { Etcd3, Lease } from 'etcd3'
import type { RouterEvent } from '../../src/codec/events.js'
import { getFreePort } from '../../src/deploy/services.js'
import { encodeEnvelopeMsgpack, encodeRouterEventMsgpack } from '../../support/dynamo-msgpack.js'

export interface PlanePublisher {
  readonly endpoint: string
  readonly publisherId: bigint
  /** The sequence number the next publish takes. */
  sequence: bigint
  /** One RouterEvent, enveloped and framed; frame 0 is `topic` (default `kv-events`). */
  publish(ev: RouterEvent, opts?: { topic?: string; envelopeTopic?: string }): Promise<void>
  send(frames: (Buffer | Uint8Array)[]): Promise<void>
  /** Resolves once a subscriber subscribed to a prefix of `topic`. */
  subscribed(): Promise<string>
  close(): void
}

export function u64be(v: bigint): Buffer {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(v)
  return b
}

/** Frame 3: [version 1][u32 BE length][envelope]. */
export function frameOf(envelope: Uint8Array): Buffer {
  const head = Buffer.alloc(5)
  head[0] = 1
  head.writeUInt32BE(envelope.length, 1)
  return Buffer.concat([head, envelope])
}

/** The four frames of one RouterEvent from a publisher. */
export function messageOf(ev: RouterEvent, publisherId: bigint, sequence: bigint, topic = 'kv-events', envelopeTopic = 'kv-events'): Buffer[] {
  const envelope = encodeEnvelopeMsgpack({ publisher_id: publisherId, sequence, topic: envelopeTopic, payload: encodeRouterEventMsgpack(ev) })
  return [Buffer.from(topic), u64be(publisherId), u64be(sequence), frameOf(envelope)]
}

export async function planePublisher(publisherId: bigint): Promise<PlanePublisher> {
  const port = await getFreePort()
  const sock = new XPublisher({ linger: 0 })
  const endpoint = `tcp://127.0.0.1:${port}`
  await sock.bind(endpoint)
  const p: PlanePublisher = {
    endpoint,
    publisherId,
    sequence: 0n,
    async publish(ev, opts = {}) {
      await sock.send(messageOf(ev, publisherId, p.sequence, opts.topic, opts.envelopeTopic))
      p.sequence++
    },
    async send(frames) {
      await sock.send(frames)
    },
    async subscribed() {
      for (;;) {
        const [m] = await sock.receive()
        // [1, prefix…] subscribes; [0, prefix…] unsubscribes
        if (m !== undefined && m[0] === 1) return m.subarray(1).toString()
      }
    },
    close: () => sock.close(),
  }
  return p
}

/** Dynamo's percent-encoding of a key or subject segment (as the test writes it by hand). */
const seg = (s: string): string => s.replace(/[^A-Za-z0-9_-]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`)

/**
 * A Gen-B endpoint-scoped channel and its EventSource, as a worker registers them under its
 * lease (key and value shapes: lib/runtime/src/discovery/kv_store.rs@020f5c17 event_channel_key,
 * event_source_key; lib/runtime/src/discovery/mod.rs DiscoveryInstance, EventScope).
 */
export async function putGenB(
  lease: Lease | Etcd3,
  o: { ns: string; component: string; endpoint: string; publisherId: bigint; zmq: string; workerId: bigint; dpRank: number },
): Promise<{ channelKey: string; sourceKey: string }> {
  const hex = o.publisherId.toString(16)
  const path = `namespace/${seg(o.ns)}/component/${seg(o.component)}/endpoint/${seg(o.endpoint)}/topic/kv-events/${hex}`
  const scope = `{"kind":"endpoint","endpoint":{"namespace":"${o.ns}","component":"${o.component}","name":"${o.endpoint}"}}`
  const channelKey = `v1/event_channels/${path}`
  const sourceKey = `v1/event_sources/${path}`
  await lease
    .put(channelKey)
    .value(
      `{"type":"EventChannel","scope":${scope},"topic":"kv-events","instance_id":${o.publisherId},"transport":{"kind":"Zmq","config":{"endpoint":"${o.zmq}"}}}`,
    )
  await lease
    .put(sourceKey)
    .value(
      `{"type":"EventSource","scope":${scope},"topic":"kv-events","publisher_id":${o.publisherId},"metadata":{"kv_state_endpoint":` +
        `{"namespace":"${o.ns}","component":"${o.component}","name":"${o.endpoint}"},"worker":{"worker_id":${o.workerId},"dp_rank":${o.dpRank}},` +
        `"publisher_id":${o.publisherId}}}`,
    )
  return { channelKey, sourceKey }
}

/** A Gen-A component-scoped channel (key `v1/event_channels/{ns}/{component}/{topic}/{id:x}`). */
export async function putGenA(lease: Lease | Etcd3, o: { ns: string; component: string; instanceId: bigint; zmq: string }): Promise<string> {
  const key = `v1/event_channels/${o.ns}/${o.component}/kv-events/${o.instanceId.toString(16)}`
  await lease
    .put(key)
    .value(
      `{"type":"EventChannel","namespace":"${o.ns}","component":"${o.component}","topic":"kv-events","instance_id":${o.instanceId},` +
        `"transport":{"kind":"Zmq","config":{"endpoint":"${o.zmq}"}}}`,
    )
  return key
}
