// Dynamo's MessagePack KV events as a Dynamo worker writes them, for tests and benchmarks. The
// writer picks the shortest form of every integer, string, bin, array and map header, as
// rmp_serde does; `named` is rmp_serde::to_vec_named (structs as maps keyed by field name,
// Dynamo's event-plane codec), `positional` is rmp_serde::to_vec (structs as arrays). A current
// worker's RouterEvent carries `residency_domain: "worker"` and `start_position: nil`; the
// envelope is `{publisher_id, sequence, published_at, topic, payload: bin}`.
import type { KvCacheEventData, RouterEvent } from '../src/codec/events.js'

export type MsgpackForm = 'named' | 'positional'

/** A value the writer takes: u64 as bigint or number, `Uint8Array` as bin, objects as maps. */
export type Mp = bigint | number | string | null | boolean | Uint8Array | Mp[] | { [key: string]: Mp }

export class MsgpackWriter {
  private buf = new Uint8Array(256)
  private len = 0

  bytes(): Uint8Array {
    return this.buf.slice(0, this.len)
  }

  private room(n: number): void {
    if (this.len + n <= this.buf.length) return
    let cap = this.buf.length * 2
    while (cap < this.len + n) cap *= 2
    const b = new Uint8Array(cap)
    b.set(this.buf.subarray(0, this.len))
    this.buf = b
  }

  byte(b: number): this {
    this.room(1)
    this.buf[this.len++] = b
    return this
  }

  raw(bytes: Uint8Array): this {
    this.room(bytes.length)
    this.buf.set(bytes, this.len)
    this.len += bytes.length
    return this
  }

  private be(v: bigint, width: number): void {
    for (let i = width - 1; i >= 0; i--) this.byte(Number((v >> BigInt(8 * i)) & 0xffn))
  }

  /** Non-negative integers in the shortest of fixint, u8, u16, u32, u64. */
  uint(v: bigint | number): this {
    const n = BigInt(v)
    if (n < 0n || n >= 2n ** 64n) throw new RangeError(`not a u64: ${n}`)
    if (n < 0x80n) return this.byte(Number(n))
    if (n < 0x100n) this.byte(0xcc).be(n, 1)
    else if (n < 0x10000n) this.byte(0xcd).be(n, 2)
    else if (n < 0x100000000n) this.byte(0xce).be(n, 4)
    else this.byte(0xcf).be(n, 8)
    return this
  }

  str(s: string): this {
    const b = new TextEncoder().encode(s)
    if (b.length < 32) this.byte(0xa0 | b.length)
    else if (b.length < 0x100) this.byte(0xd9).byte(b.length)
    else this.byte(0xda).be(BigInt(b.length), 2)
    return this.raw(b)
  }

  bin(b: Uint8Array): this {
    if (b.length < 0x100) this.byte(0xc4).byte(b.length)
    else if (b.length < 0x10000) this.byte(0xc5).be(BigInt(b.length), 2)
    else this.byte(0xc6).be(BigInt(b.length), 4)
    return this.raw(b)
  }

  arrayHeader(n: number): this {
    if (n < 16) return this.byte(0x90 | n)
    if (n < 0x10000) this.byte(0xdc).be(BigInt(n), 2)
    else this.byte(0xdd).be(BigInt(n), 4)
    return this
  }

  mapHeader(n: number): this {
    if (n < 16) return this.byte(0x80 | n)
    if (n < 0x10000) this.byte(0xde).be(BigInt(n), 2)
    else this.byte(0xdf).be(BigInt(n), 4)
    return this
  }

  value(v: Mp): this {
    if (v === null) return this.byte(0xc0)
    if (typeof v === 'boolean') return this.byte(v ? 0xc3 : 0xc2)
    if (typeof v === 'bigint' || typeof v === 'number') return this.uint(v)
    if (typeof v === 'string') return this.str(v)
    if (v instanceof Uint8Array) return this.bin(v)
    if (Array.isArray(v)) {
      this.arrayHeader(v.length)
      for (const x of v) this.value(x)
      return this
    }
    const keys = Object.keys(v)
    this.mapHeader(keys.length)
    for (const k of keys) this.str(k).value(v[k] as Mp)
    return this
  }
}

export function pack(v: Mp): Uint8Array {
  return new MsgpackWriter().value(v).bytes()
}

/** A struct in either form: a map of its fields, or their values in order. */
function struct(form: MsgpackForm, fields: [string, Mp][]): Mp {
  return form === 'named' ? Object.fromEntries(fields) : fields.map(([, v]) => v)
}

function data(form: MsgpackForm, d: KvCacheEventData): Mp {
  if (d === 'cleared') return 'cleared'
  if ('stored' in d) {
    const s = d.stored
    const blocks = s.blocks.map((b) =>
      struct(form, [
        ['block_hash', b.block_hash],
        ['tokens_hash', b.tokens_hash],
        ['mm_extra_info', null],
      ]),
    )
    return {
      stored: struct(form, [
        ['parent_hash', s.parent_hash],
        ['start_position', null],
        ['blocks', blocks],
      ]),
    }
  }
  return { removed: struct(form, [['block_hashes', d.removed.block_hashes]]) }
}

/** The RouterEvent as a current Dynamo worker's value tree, in either form. */
export function routerEventValue(ev: RouterEvent, form: MsgpackForm = 'named'): Mp {
  return struct(form, [
    ['worker_id', ev.worker_id],
    ['storage_tier', ev.storage_tier ?? 'device'],
    ['residency_domain', 'worker'],
    [
      'event',
      struct(form, [
        ['event_id', ev.event.event_id],
        ['data', data(form, ev.event.data)],
        ['dp_rank', ev.event.dp_rank],
      ]),
    ],
  ])
}

export function encodeRouterEventMsgpack(ev: RouterEvent, form: MsgpackForm = 'named'): Uint8Array {
  return pack(routerEventValue(ev, form))
}

export interface MsgpackEnvelope {
  publisher_id: bigint | number
  sequence: bigint | number
  published_at?: bigint | number
  topic?: string
  payload: Uint8Array
}

/** The event-plane envelope around payload bytes (a RouterEvent already encoded). */
export function encodeEnvelopeMsgpack(env: MsgpackEnvelope, form: MsgpackForm = 'named'): Uint8Array {
  return pack(
    struct(form, [
      ['publisher_id', env.publisher_id],
      ['sequence', env.sequence],
      ['published_at', env.published_at ?? 1_700_000_000_000],
      ['topic', env.topic ?? 'kv-events'],
      ['payload', env.payload],
    ]),
  )
}
