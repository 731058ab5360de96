// Dynamo's KV event types as plain objects with bigint u64s, for the API edges:
// tests, dumps, HTTP ingest and the simulated engines. The shards never build these objects;
// they decode bytes straight into a DecodedEvent (event-decoder.ts).
import { DecodedEvent, EventDecoder, EventKind, StorageTier } from './event-decoder.js'
import { KvrError } from '../errors.js'
import { isU64, u64FromParts } from './u64.js'

export interface StoredBlock {
  block_hash: bigint
  tokens_hash: bigint
}

export type KvCacheEventData = { stored: { parent_hash: bigint | null; blocks: StoredBlock[] } } | { removed: { block_hashes: bigint[] } } | 'cleared'

export interface KvCacheEvent {
  event_id: bigint
  data: KvCacheEventData
  dp_rank: number
}

export type StorageTierName = 'device' | 'host_pinned' | 'disk' | 'external'

export interface RouterEvent {
  worker_id: bigint
  event: KvCacheEvent
  storage_tier?: StorageTierName
}

/** Dynamo's event-plane envelope; the payload is the JSON of a RouterEvent. */
export interface EventEnvelope {
  publisher_id: bigint
  sequence: bigint
  published_at: bigint
  payload: RouterEvent
}

const tierNames: StorageTierName[] = ['device', 'host_pinned', 'disk', 'external']

let sharedDecoder: EventDecoder | undefined

/** Decodes a RouterEvent (raw or enveloped) from JSON text or bytes; throws a KvrError. */
export function parseRouterEvent(input: string | Uint8Array): RouterEvent {
  sharedDecoder ??= new EventDecoder()
  const d = typeof input === 'string' ? sharedDecoder.decodeString(input) : sharedDecoder.decode(input)
  return toRouterEvent(d)
}

export function toRouterEvent(d: DecodedEvent): RouterEvent {
  let data: KvCacheEventData
  if (d.kind === EventKind.Stored) {
    const blocks: StoredBlock[] = []
    for (let i = 0; i < d.count; i++) {
      blocks.push({
        block_hash: u64FromParts(d.blockLo[i] as number, d.blockHi[i] as number),
        tokens_hash: u64FromParts(d.tokensLo[i] as number, d.tokensHi[i] as number),
      })
    }
    data = { stored: { parent_hash: d.hasParent ? u64FromParts(d.parentLo, d.parentHi) : null, blocks } }
  } else if (d.kind === EventKind.Removed) {
    const block_hashes: bigint[] = []
    for (let i = 0; i < d.count; i++) block_hashes.push(u64FromParts(d.blockLo[i] as number, d.blockHi[i] as number))
    data = { removed: { block_hashes } }
  } else {
    data = 'cleared'
  }
  const ev: RouterEvent = {
    worker_id: u64FromParts(d.workerLo, d.workerHi),
    event: { event_id: u64FromParts(d.eventIdLo, d.eventIdHi), data, dp_rank: d.dpRank },
  }
  if (d.tier !== StorageTier.Device) ev.storage_tier = tierNames[d.tier] as StorageTierName
  return ev
}

function u64Text(v: bigint, field: string): string {
  if (typeof v !== 'bigint' || !isU64(v)) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must be a u64 bigint`)
  return v.toString()
}

/** JSON text of a RouterEvent, with u64 values written as exact integers (serde's layout). */
export function encodeRouterEvent(ev: RouterEvent): string {
  const e = ev.event
  let data: string
  if (e.data === 'cleared') {
    data = '"cleared"'
  } else if ('stored' in e.data) {
    const s = e.data.stored
    const blocks = s.blocks
      .map(
        (b, i) =>
          `{"block_hash":${u64Text(b.block_hash, `blocks[${i}].block_hash`)},"tokens_hash":${u64Text(b.tokens_hash, `blocks[${i}].tokens_hash`)},` +
          `"mm_extra_info":null}`,
      )
      .join(',')
    const parent = s.parent_hash === null ? 'null' : u64Text(s.parent_hash, 'parent_hash')
    data = `{"stored":{"parent_hash":${parent},"blocks":[${blocks}]}}`
  } else {
    data = `{"removed":{"block_hashes":[${e.data.removed.block_hashes.map((h, i) => u64Text(h, `block_hashes[${i}]`)).join(',')}]}}`
  }
  if (!Number.isInteger(e.dp_rank) || e.dp_rank < 0 || e.dp_rank > 0xffffffff) {
    throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', 'field "dp_rank" must be a u32')
  }
  const tier = ev.storage_tier === undefined ? '' : `,"storage_tier":"${ev.storage_tier}"`
  return (
    `{"worker_id":${u64Text(ev.worker_id, 'worker_id')},"event":{"event_id":${u64Text(e.event_id, 'event_id')},"data":${data},"dp_rank":` +
    `${e.dp_rank}}${tier}}`
  )
}

/** The envelope form, payload as a JSON array of byte values (as Dynamo's event plane sends it). */
export function encodeEnvelope(env: EventEnvelope): string {
  const payload = Buffer.from(encodeRouterEvent(env.payload), 'utf8')
  return (
    `{"publisher_id":${u64Text(env.publisher_id, 'publisher_id')},"sequence":${u64Text(env.sequence, 'sequence')},"published_at":` +
    `${u64Text(env.published_at, 'published_at')},"payload":[${payload.join(',')}]}`
  )
}

function setHalves(v: bigint, field: string): void {
  if (typeof v !== 'bigint' || !isU64(v)) throw new KvrError('KVR_ERR_EVENT_INVALID_NUMBER', `field "${field}" must be a u64`)
  halves[0] = v
}
const halves = new BigUint64Array(1)
const halfWords = new Uint32Array(halves.buffer)

/** Fills a DecodedEvent from an event object (the index applies DecodedEvents only). */
export function toDecoded(ev: RouterEvent, out: DecodedEvent = new DecodedEvent()): DecodedEvent {
  out.reset()
  setHalves(ev.worker_id, 'worker_id')
  out.workerLo = halfWords[0] as number
  out.workerHi = halfWords[1] as number
  setHalves(ev.event.event_id, 'event_id')
  out.eventIdLo = halfWords[0] as number
  out.eventIdHi = halfWords[1] as number
  out.dpRank = ev.event.dp_rank >>> 0
  out.tier = ev.storage_tier === undefined ? StorageTier.Device : tierNames.indexOf(ev.storage_tier)
  const data = ev.event.data
  if (data === 'cleared') {
    out.kind = EventKind.Cleared
  } else if ('stored' in data) {
    out.kind = EventKind.Stored
    const s = data.stored
    if (s.parent_hash !== null) {
      setHalves(s.parent_hash, 'parent_hash')
      out.hasParent = true
      out.parentLo = halfWords[0] as number
      out.parentHi = halfWords[1] as number
    }
    out.ensure(s.blocks.length)
    s.blocks.forEach((b, i) => {
      setHalves(b.block_hash, 'block_hash')
      out.blockLo[i] = halfWords[0] as number
      out.blockHi[i] = halfWords[1] as number
      setHalves(b.tokens_hash, 'tokens_hash')
      out.tokensLo[i] = halfWords[0] as number
      out.tokensHi[i] = halfWords[1] as number
    })
    out.count = s.blocks.length
  } else {
    out.kind = EventKind.Removed
    const hs = data.removed.block_hashes
    out.ensure(hs.length)
    hs.forEach((h, i) => {
      setHalves(h, 'block_hashes[]')
      out.blockLo[i] = halfWords[0] as number
      out.blockHi[i] = halfWords[1] as number
    })
    out.count = hs.length
  }
  return out
}
