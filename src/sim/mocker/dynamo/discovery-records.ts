// The etcd records of a current Dynamo worker, written under the worker's lease (whose id is the
// instance id and the worker id of its KV events). Keys and values as the KV-store discovery
// writes them (lib/runtime/src/discovery/kv_store.rs@020f5c17; the DiscoveryInstance enum,
// `#[serde(tag = "type")]`, in lib/runtime/src/discovery/mod.rs@5f4d5bb8):
//
//   v1/instances/{ns}/{comp}/{endpoint}/{id:x}
//     {"type":"Endpoint","component","endpoint","namespace","instance_id",
//      "transport":{"tcp":"HOST:PORT/{id:x}/{endpoint}"}}
//     for `generate` and for `worker_kv_indexer_query_dp0` (the worker query, same TCP server)
//   v1/mdc/{ns}/{comp}/{endpoint}/{id:x}
//     {"type":"Model","namespace","component","endpoint","instance_id","card_json":{…}}
//   event channels, endpoint-scoped (default, Dynamo since PR #11841):
//     v1/event_channels/namespace/{ns}/component/{comp}/endpoint/{endpoint}/topic/{topic}/{publisher_id:x}
//     {"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace","component","name"}},
//      "topic","instance_id":publisher_id,"transport":{"kind":"Zmq","config":{"endpoint":"tcp://…"}}}
//   or component-scoped (the earlier form, `--dynamo-event-channels component`):
//     v1/event_channels/{ns}/{comp}/{topic}/{id:x}
//     {"type":"EventChannel","namespace","component","topic","instance_id":id,"transport":{…}}
//
// u64 ids are written as exact JSON integers (an etcd lease id may exceed 2^53).

/** The worker query endpoint of data-parallel rank r (lib/llm/src/kv_router.rs). */
export function workerQueryEndpoint(dpRank: number): string {
  return `worker_kv_indexer_query_dp${dpRank}`
}

export type EventChannelScope = 'endpoint' | 'component'

export interface DynamoEndpointPath {
  namespace: string
  component: string
  /** The generate endpoint's name. */
  endpoint: string
}

export interface EtcdRecord {
  key: string
  value: string
}

const j = JSON.stringify

/**
 * A key segment of the endpoint-scoped event-channel keys: every byte outside [A-Za-z0-9_-]
 * becomes %XX (Dynamo's encode_event_segment).
 */
export function encodeEventSegment(s: string): string {
  let out = ''
  for (const b of Buffer.from(s, 'utf8')) {
    const c = String.fromCharCode(b)
    out += /[A-Za-z0-9_-]/.test(c) ? c : `%${b.toString(16).toUpperCase().padStart(2, '0')}`
  }
  return out
}

/** The path a TCP request frame names for an endpoint of an instance: `{id:x}/{endpoint}`. */
export function requestPath(instanceId: bigint, endpoint: string): string {
  return `${instanceId.toString(16)}/${endpoint}`
}

/** An endpoint instance served on the TCP request plane at `hostPort`. */
export function instanceRecord(p: DynamoEndpointPath, endpoint: string, instanceId: bigint, hostPort: string): EtcdRecord {
  const hex = instanceId.toString(16)
  return {
    key: `v1/instances/${p.namespace}/${p.component}/${endpoint}/${hex}`,
    value:
      `{"type":"Endpoint","component":${j(p.component)},"endpoint":${j(endpoint)},"namespace":${j(p.namespace)},"instance_id":${instanceId},` +
      `"transport":{"tcp":${j(`${hostPort}/${requestPath(instanceId, endpoint)}`)}}}`,
  }
}

export interface ModelCardFacts {
  modelName: string
  blockSize: number
  totalKvBlocks: number
  maxNumSeqs: number
  maxNumBatchedTokens: number
}

/**
 * The model card of the generate endpoint. The fields a router reads: display_name, the block
 * size, and the runtime config (capacity, batch limits, data-parallel layout, and
 * enable_local_indexer, which routers check before they use the worker query).
 */
export function modelRecord(p: DynamoEndpointPath, instanceId: bigint, card: ModelCardFacts): EtcdRecord {
  const hex = instanceId.toString(16)
  const cardJson =
    `{"display_name":${j(card.modelName)},"kv_cache_block_size":${card.blockSize},"runtime_config":{"total_kv_blocks":${card.totalKvBlocks},` +
    `"max_num_seqs":${card.maxNumSeqs},"max_num_batched_tokens":${card.maxNumBatchedTokens},"data_parallel_size":1,"data_parallel_start_rank":0,` +
    `"enable_local_indexer":true}}`
  return {
    key: `v1/mdc/${p.namespace}/${p.component}/${p.endpoint}/${hex}`,
    value:
      `{"type":"Model","namespace":${j(p.namespace)},"component":${j(p.component)},"endpoint":${j(p.endpoint)},"instance_id":${instanceId},` +
      `"card_json":${cardJson}}`,
  }
}

export interface EventChannelFacts {
  topic: string
  publisherId: bigint
  /** tcp://HOST:PORT of the PUB socket. */
  zmqEndpoint: string
}

/** The discovery record of one event-plane publisher. */
export function eventChannelRecord(p: DynamoEndpointPath, scope: EventChannelScope, instanceId: bigint, ch: EventChannelFacts): EtcdRecord {
  const transport = `{"kind":"Zmq","config":{"endpoint":${j(ch.zmqEndpoint)}}}`
  if (scope === 'component') {
    return {
      key: `v1/event_channels/${p.namespace}/${p.component}/${ch.topic}/${instanceId.toString(16)}`,
      value:
        `{"type":"EventChannel","namespace":${j(p.namespace)},"component":${j(p.component)},"topic":${j(ch.topic)},"instance_id":${instanceId},` +
        `"transport":${transport}}`,
    }
  }
  const seg = encodeEventSegment
  return {
    key:
      `v1/event_channels/namespace/${seg(p.namespace)}/component/${seg(p.component)}/endpoint/${seg(p.endpoint)}/topic/${seg(ch.topic)}/` +
      ch.publisherId.toString(16),
    value:
      `{"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace":${j(p.namespace)},"component":${j(p.component)},"name":${j(p.endpoint)}}},` +
      `"topic":${j(ch.topic)},"instance_id":${ch.publisherId},"transport":${transport}}`,
  }
}
