// An engine's KV events on ZMQ, published the way vLLM's ZmqEventPublisher does
// (vllm/distributed/kv_events.py), so the router's ZMQ listener (src/transport/zmq.ts) can be
// tested against real sockets:
//   PUB      [topic, seq (u64, 8 bytes big-endian, from 0), payload]
//   payload  MessagePack [ts (float seconds), events, data_parallel_rank]
//   replay   a ROUTER: [identity, '', start seq] → one [identity, '', topic, seq, payload] per
//            buffered batch with seq ≥ start, then the end [identity, '', '', −1 (8×0xFF), '']
// Events come in vLLM's map form (since vLLM PR #42892) or its older array form. Block hashes
// are the mocker's sequence hashes as u64: msgpackr writes a bigint below 2^63 as int64 and one
// above as uint64, which every MessagePack reader takes as the same 64 bits. `token_ids` are
// the stored blocks' tokens, so a reader hashes the same tokens_hash the pool computed. An event
// of the host tier (`storage_tier: "host_pinned"`) has `medium: "CPU"`, as vLLM's offloading
// connector publishes the blocks it keeps in CPU memory
// (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py@030ea52e: the block's own
// hashes, parent, token ids and block size, with medium MEDIUM_CPU); every other event "GPU".
//
// A batch is what the engine emitted in one turn of the event loop (vLLM: one per step; the
// mocker may run several steps in a turn). One publisher per engine; engine i of a process binds
// port + i of the given endpoints, as vLLM offsets its endpoints per data-parallel rank.
import { Packr } from 'msgpackr'
import { Publisher, Router } from 'zeromq'
import type { RouterEvent } from '../../codec/events.js'
import { KvrError } from '../../errors.js'
import type { EventPublisher } from './publisher.js'

export type VllmEventForm = 'map' | 'array'

export interface ZmqEventPublisherOptions {
  /** Where the PUB socket binds, e.g. tcp://127.0.0.1:5557 (tcp://*:5557: every interface). */
  endpoint: string
  /** Where the replay ROUTER binds; none when null or absent. */
  replayEndpoint?: string | null
  /** Tokens per block: the events' block_size, and how many token ids each stored block carries. */
  blockSize: number
  /** Event encoding (default map). */
  form?: VllmEventForm
  /** The topic frame (default kv-events, as Dynamo configures vLLM). */
  topic?: string
  /** The batches' data_parallel_rank (default 0). */
  dataParallelRank?: number
  /** Batches the replay socket keeps (vLLM's buffer_steps, default 10000). */
  bufferSteps?: number
  /** Told about sends that failed (the process goes on). */
  onError?: (message: string) => void
}

export const DEFAULT_TOPIC = 'kv-events'
export const DEFAULT_BUFFER_STEPS = 10_000
/** vLLM's default send high-water mark: a slow subscriber loses batches beyond it, never blocks the engine. */
const SEND_HWM = 100_000
/** A replay peer that stops reading for this long is given up on (ms). */
const REPLAY_SEND_TIMEOUT_MS = 10_000

const EMPTY = Buffer.alloc(0)
const END = Buffer.alloc(8, 0xff)

const TCP_RE = /^tcp:\/\/(\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$/

/** The host and port of tcp://HOST:PORT (port 1–65535), or null. */
export function parseTcpEndpoint(endpoint: string): { host: string; port: number } | null {
  const m = TCP_RE.exec(endpoint)
  if (m === null) return null
  const port = Number(m[2])
  return port >= 1 && port <= 65535 ? { host: m[1] as string, port } : null
}

/** Engine i's endpoint: the port plus i. */
export function engineEndpoint(endpoint: string, i: number): string {
  const e = parseTcpEndpoint(endpoint)
  if (e === null) throw new KvrError('KVR_ERR_INVALID_OPTION', `a ZMQ endpoint must be tcp://HOST:PORT, got ${JSON.stringify(endpoint)}`)
  return `tcp://${e.host}:${e.port + i}`
}

function be8(seq: bigint): Buffer {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(seq)
  return b
}

interface Buffered {
  seq: bigint
  seqFrame: Buffer
  payload: Buffer
}

export class ZmqEventPublisher implements EventPublisher {
  readonly endpoint: string
  readonly replayEndpoint: string | null
  readonly topic: string
  readonly form: VllmEventForm
  /** Batches published, events in them, replay requests answered, sends that failed. */
  readonly counters = { batches: 0, events: 0, replays: 0, badReplayRequests: 0, sendErrors: 0 }
  private readonly blockSize: number
  private readonly rank: number
  private readonly pub = new Publisher({ linger: 0, sendHighWaterMark: SEND_HWM })
  private readonly router: Router | null
  // plain maps (no msgpackr records), the smallest map header as msgspec writes
  private readonly packr = new Packr({ useRecords: false, variableMapSize: true })
  private pending: unknown[] = []
  private scheduled = false
  private nextSeq = 0n
  /** The replay ring: the last `ring.length` batches, the oldest at `ringStart`. */
  private readonly ring: (Buffered | undefined)[]
  private ringStart = 0
  private ringCount = 0
  private outbox: Buffer[][] = []
  private sending: Promise<void> | null = null
  private serving: Promise<void> | null = null
  private failing = false
  private closed = false

  private constructor(private readonly o: ZmqEventPublisherOptions) {
    if (!Number.isInteger(o.blockSize) || o.blockSize < 1) throw new RangeError(`block size must be a positive integer, got ${String(o.blockSize)}`)
    const steps = o.bufferSteps ?? DEFAULT_BUFFER_STEPS
    if (!Number.isInteger(steps) || steps < 1) throw new RangeError(`buffer steps must be a positive integer, got ${String(steps)}`)
    this.endpoint = o.endpoint
    this.replayEndpoint = o.replayEndpoint ?? null
    this.topic = o.topic ?? DEFAULT_TOPIC
    this.form = o.form ?? 'map'
    this.blockSize = o.blockSize
    this.rank = o.dataParallelRank ?? 0
    this.ring = new Array<Buffered | undefined>(steps)
    // mandatory: a full peer makes the send wait instead of dropping replies silently
    this.router = this.replayEndpoint === null ? null : new Router({ linger: 0, mandatory: true, sendTimeout: REPLAY_SEND_TIMEOUT_MS })
  }

  /** Binds the sockets; a KvrError naming the endpoint when one cannot be bound. */
  static async bind(o: ZmqEventPublisherOptions): Promise<ZmqEventPublisher> {
    const p = new ZmqEventPublisher(o)
    for (const [sock, at] of [
      [p.pub, p.endpoint],
      [p.router, p.replayEndpoint],
    ] as const) {
      if (sock === null || at === null) continue
      try {
        await sock.bind(at)
      } catch (err) {
        p.closeSockets()
        throw new KvrError('KVR_ERR_INVALID_OPTION', `cannot bind a ZMQ socket to ${at}: ${(err as Error).message}`, { cause: err })
      }
    }
    if (p.router !== null) p.serving = p.serve(p.router)
    return p
  }

  /** The next batch's sequence number (= batches published). */
  get seq(): bigint {
    return this.nextSeq
  }

  publish(ev: RouterEvent, tokens?: Uint32Array): void {
    if (this.closed) return
    this.pending.push(this.convert(ev, tokens))
    if (!this.scheduled) {
      this.scheduled = true
      queueMicrotask(this.endBatch)
    }
  }

  async flush(): Promise<void> {
    this.endBatch()
    while (this.sending !== null) await this.sending
  }

  async close(): Promise<void> {
    if (this.closed) return
    await this.flush()
    this.closed = true
    this.closeSockets()
    await this.serving
  }

  private closeSockets(): void {
    this.pub.close()
    this.router?.close()
  }

  /** vLLM's BlockStored / BlockRemoved / AllBlocksCleared for one event, in the configured form. */
  private convert(ev: RouterEvent, tokens: Uint32Array | undefined): unknown {
    const d = ev.event.data
    const map = this.form === 'map'
    const medium = ev.storage_tier === 'host_pinned' ? 'CPU' : 'GPU'
    if (d === 'cleared') return map ? { type: 'AllBlocksCleared' } : ['AllBlocksCleared']
    if ('removed' in d) {
      const hashes = d.removed.block_hashes
      return map ? { type: 'BlockRemoved', block_hashes: hashes, medium } : ['BlockRemoved', hashes, medium]
    }
    const blocks = d.stored.blocks
    const bs = this.blockSize
    // an engine that allocates without its tokens cannot be published as vLLM: a bug, not a case
    if (tokens === undefined || tokens.length !== blocks.length * bs) {
      throw new Error(`a Stored event of ${blocks.length} blocks needs ${blocks.length * bs} token ids, got ${tokens === undefined ? 'none' : tokens.length}`)
    }
    const hashes = new Array<bigint>(blocks.length)
    for (let i = 0; i < blocks.length; i++) hashes[i] = (blocks[i] as (typeof blocks)[number]).block_hash
    // a plain array: msgpackr would write a typed array as an extension, not as ints
    const ids = Array.from(tokens)
    const parent = d.stored.parent_hash
    return map
      ? { type: 'BlockStored', block_hashes: hashes, parent_block_hash: parent, token_ids: ids, block_size: bs, lora_id: null, medium, lora_name: null }
      : ['BlockStored', hashes, parent, ids, bs, null, medium]
  }

  /** Packs what is pending as one batch, keeps it for replay, queues it for the PUB socket. */
  private readonly endBatch = (): void => {
    this.scheduled = false
    if (this.pending.length === 0 || this.closed) return
    const events = this.pending
    this.pending = []
    const payload = this.packr.pack([Date.now() / 1000, events, this.rank])
    const seq = this.nextSeq++
    const b: Buffered = { seq, seqFrame: be8(seq), payload }
    // in the ring before it is sent, so a subscriber that saw it live can also replay it
    const cap = this.ring.length
    this.ring[(this.ringStart + this.ringCount) % cap] = b
    if (this.ringCount < cap) this.ringCount++
    else this.ringStart = (this.ringStart + 1) % cap
    this.counters.batches++
    this.counters.events += events.length
    this.outbox.push([Buffer.from(this.topic), b.seqFrame, payload])
    this.sending ??= this.sendLoop()
  }

  // zeromq allows one send in flight per socket: batches go out one after the other
  private async sendLoop(): Promise<void> {
    try {
      while (this.outbox.length > 0 && !this.closed) {
        const frames = this.outbox
        this.outbox = []
        for (const f of frames) {
          try {
            await this.pub.send(f)
            this.failing = false
          } catch (err) {
            this.counters.sendErrors++
            if (!this.failing) this.o.onError?.(`cannot publish KV events on ${this.endpoint}: ${(err as Error).message}`)
            this.failing = true
          }
        }
      }
    } finally {
      this.sending = null
    }
  }

  /** The buffered batches with seq ≥ from, oldest first. */
  private buffered(from: bigint): Buffered[] {
    const out: Buffered[] = []
    const cap = this.ring.length
    for (let k = 0; k < this.ringCount; k++) {
      const b = this.ring[(this.ringStart + k) % cap] as Buffered
      if (b.seq >= from) out.push(b)
    }
    return out
  }

  private async serve(router: Router): Promise<void> {
    try {
      for await (const frames of router) {
        const [id, delim, start] = frames
        if (frames.length !== 3 || id === undefined || delim?.length !== 0 || start?.length !== 8) {
          this.counters.badReplayRequests++
          continue
        }
        // what is buffered now: batches published during the reply reach the peer live
        const list = this.buffered(start.readBigUInt64BE(0))
        this.counters.replays++
        try {
          for (const b of list) await router.send([id, EMPTY, this.topic, b.seqFrame, b.payload])
          await router.send([id, EMPTY, EMPTY, END, EMPTY])
        } catch (err) {
          // the peer went away or stopped reading: its reply is abandoned, the next peer served
          if (this.closed) return
          this.counters.sendErrors++
          this.o.onError?.(`replay to a peer on ${this.replayEndpoint} failed: ${(err as Error).message}`)
        }
      }
    } catch (err) {
      // the socket was closed under the loop: the publisher is stopping
      if (!this.closed) this.o.onError?.(`the replay socket on ${this.replayEndpoint} failed: ${(err as Error).message}`)
    }
  }
}
