// KV events from an engine's own ZMQ publisher (vLLM, SGLang): one SUB socket per worker-rank on
// the engine's PUB endpoint, and a DEALER on its replay ROUTER to fetch what was missed.
//
// Wire (vLLM's vllm/distributed/kv_events.py, SGLang's kv_events.py, late 2026):
//   live     [topic, seq (u64, 8 bytes big-endian), payload (a MessagePack batch)]
//   replay   request [empty delimiter, start seq (8 bytes BE)]; one reply per buffered batch,
//            [empty, seq, payload] or, since vLLM PR #45177, [empty, topic, seq, payload]; the end
//            is seq = −1 (eight 0xFF bytes) with an empty payload
// Each publisher numbers its batches from 0. What this listener makes of the numbers:
//   seq = last + 1   applied
//   seq > last + 1   a gap: live batches are held while the missing ones are replayed from
//                    last + 1, then applied in order; a replay that does not reach the held
//                    batches (SGLang's replay drops at its high-water mark), or no replay socket,
//                    leaves the worker-rank `degraded` until the engine restarts
//   seq ≤ last       a batch a replay already applied, arriving late on the live socket (the
//                    two sockets are read independently): skipped; otherwise the engine
//                    restarted (a new publisher counts from 0 again): the worker-rank is
//                    cleared, then the batch applied
// At start the whole replay buffer is fetched, so a router that starts after its engines knows
// what they cached. Sockets reconnect by themselves (ZMQ), with backoff; one engine that is down
// or sends garbage never holds up another's listener.
import { Dealer, Subscriber } from 'zeromq'
import { limited } from '../runtime/log.js'

export type ZmqRankState = 'exact' | 'recovering' | 'degraded'

export interface ZmqSource {
  readonly workerId: bigint
  readonly dpRank: number
  /** The engine's PUB endpoint, e.g. tcp://10.0.0.5:5557. */
  readonly endpoint: string
  /** The engine's replay ROUTER endpoint, or null when it has none. */
  readonly replay: string | null
  /** Topic prefix to subscribe to ('' = every topic). */
  readonly topic: string
}

/** Where a listener's batches go, in the order of their sequence numbers. */
export interface ZmqSink {
  batch(source: ZmqSource, seq: bigint, payload: Uint8Array): void
  /** The engine restarted: what the index holds of this worker-rank is stale. */
  restarted(source: ZmqSource): void
  state(source: ZmqSource, state: ZmqRankState): void
}

/** Frames and batches dropped, by reason; gaps, replays and restarts. */
export interface ZmqCounters {
  batches: number
  bytes: number
  badFrames: number
  gaps: number
  replays: number
  replayedBatches: number
  replaysIncomplete: number
  restarts: number
  /** Live batches a replay had already applied, skipped. */
  duplicates: number
  /** Batches the sink threw on (it decodes them: a malformed batch must not stop the listener). */
  sinkErrors: number
}

/** Counters at zero, fresh. */
export function zeroZmqCounters(): ZmqCounters {
  return { batches: 0, bytes: 0, badFrames: 0, gaps: 0, replays: 0, replayedBatches: 0, replaysIncomplete: 0, restarts: 0, duplicates: 0, sinkErrors: 0 }
}

export interface ZmqListenerOptions {
  /** How long a replay may take before it counts as failed (ms). */
  replayTimeoutMs?: number
  /** Live batches held during a replay, at most; beyond, the oldest are dropped (a gap the replay cannot fill). */
  maxHeld?: number
}

const END = 0xffffffffffffffffn
/** Bytes of a batch compared to tell its publisher (its timestamp is among them). */
const HEAD_BYTES = 32
/** Replayed batches whose fingerprints are kept, to know them when they come late on the live socket. */
const REPLAYED_KEPT = 256

/** The length and first HEAD_BYTES of a batch, as one number (FNV-1a). */
function fingerprint(payload: Uint8Array): number {
  let h = (0x811c9dc5 ^ payload.length) >>> 0
  const n = Math.min(HEAD_BYTES, payload.length)
  for (let i = 0; i < n; i++) h = Math.imul(h ^ (payload[i] as number), 0x01000193) >>> 0
  return h
}

function seqOf(frame: Buffer | undefined): bigint | null {
  return frame !== undefined && frame.length === 8 ? frame.readBigUInt64BE(0) : null
}

export class ZmqListener {
  readonly counters: ZmqCounters = zeroZmqCounters()
  private readonly sub = new Subscriber({ reconnectInterval: 100, reconnectMaxInterval: 5000, linger: 0 })
  private dealer: Dealer | null = null
  /** The last sequence number applied, null before the first. */
  private last: bigint | null = null
  /**
   * The fingerprint of the last batch applied: a replay from a gap asks for that batch again,
   * and other bytes under its number mean another publisher (the engine restarted and counted
   * past the old number before this socket reconnected), not a gap.
   */
  private lastPrint: number | null = null
  private held: { seq: bigint; payload: Buffer }[] = []
  /** Sequence numbers and fingerprints of the last batches a replay applied (slot seq % REPLAYED_KEPT). */
  private replayedSeq: BigInt64Array | null = null
  private replayedPrint: Uint32Array | null = null
  private replaying = false
  private closed = false
  private rankState: ZmqRankState = 'exact'
  private readonly replayTimeoutMs: number
  private readonly maxHeld: number
  private readonly loop: Promise<void>

  private constructor(
    readonly source: ZmqSource,
    private readonly sink: ZmqSink,
    opts: ZmqListenerOptions,
  ) {
    this.replayTimeoutMs = opts.replayTimeoutMs ?? 5000
    this.maxHeld = opts.maxHeld ?? 100_000
    this.sub.connect(source.endpoint)
    this.sub.subscribe(source.topic)
    this.loop = this.receive()
  }

  /** Listens to one worker-rank's publisher; the first replay (when it has one) starts at once. */
  static start(source: ZmqSource, sink: ZmqSink, opts: ZmqListenerOptions = {}): ZmqListener {
    const l = new ZmqListener(source, sink, opts)
    if (source.replay !== null) void l.replayFrom(0n)
    return l
  }

  get state(): ZmqRankState {
    return this.rankState
  }

  /** Who a log line is about. */
  private who(): Record<string, unknown> {
    return { worker_id: this.source.workerId.toString(), dp_rank: this.source.dpRank, endpoint: this.source.endpoint }
  }

  private setState(s: ZmqRankState): void {
    if (s === this.rankState) return
    this.rankState = s
    this.sink.state(this.source, s)
  }

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.sub) {
        const seq = frames.length === 3 ? seqOf(frames[1]) : null
        if (seq === null) {
          this.counters.badFrames++
          limited.warn('zmq_bad_frame', { ...this.who(), frames: frames.length }, "an engine's KV-event message is not [topic, seq, payload]: skipped")
          continue
        }
        this.live(seq, frames[2] as Buffer)
      }
    } catch (err) {
      // the socket was closed under the loop: the listener is stopping
      if (!this.closed) throw err
    }
  }

  private live(seq: bigint, payload: Buffer): void {
    if (this.replaying) {
      this.held.push({ seq, payload })
      if (this.held.length > this.maxHeld) this.held.shift()
      return
    }
    const last = this.last
    if (last !== null && seq <= last) {
      if (this.replayedAlready(seq, payload)) {
        this.counters.duplicates++
        return
      }
      this.counters.restarts++
      limited.info(
        'zmq_engine_restart',
        { ...this.who(), seq: seq.toString(), last: last.toString() },
        "an engine rank's batch numbers started over: it restarted, and its worker-rank is reset",
      )
      this.sink.restarted(this.source)
      this.last = null
      this.replayedSeq?.fill(-1n)
      // a clean start: what the new publisher reports from its first batch on is all there is
      if (seq !== 0n && this.source.replay !== null) {
        this.held.push({ seq, payload })
        void this.replayFrom(0n)
        return
      }
      this.setState(seq === 0n ? 'exact' : 'degraded')
    } else if (last !== null && seq > last + 1n) {
      this.counters.gaps++
      limited.info(
        'zmq_gap',
        { ...this.who(), from: (last + 1n).toString(), to: (seq - 1n).toString(), replay: this.source.replay !== null },
        this.source.replay !== null
          ? "batches of an engine rank's KV events never arrived: they are replayed"
          : "batches of an engine rank's KV events never arrived, and it has no replay socket: its rank is degraded",
      )
      if (this.source.replay !== null) {
        this.held.push({ seq, payload })
        void this.replayFrom(last + 1n, true)
        return
      }
      this.setState('degraded')
    }
    this.apply(seq, payload)
  }

  private apply(seq: bigint, payload: Uint8Array): void {
    this.last = seq
    this.lastPrint = fingerprint(payload)
    this.counters.batches++
    this.counters.bytes += payload.length
    try {
      this.sink.batch(this.source, seq, payload)
    } catch (err) {
      this.counters.sinkErrors++
      limited.warn('zmq_sink_error', { ...this.who(), error: (err as Error).message }, "an engine's KV-event batch could not be handed to its shard")
    }
  }

  /** Fetches the batches from `from` on through the replay socket, then applies what was held. */
  private async replayFrom(from: bigint, verify = false): Promise<void> {
    if (this.replaying || this.closed) return
    this.replaying = true
    this.counters.replays++
    this.setState('recovering')
    let complete = false
    try {
      complete = await this.requestReplay(from, verify)
      if (!complete && this.restartSeen) {
        // the batch before the gap is not the one applied: a new publisher, read from its start
        this.restartSeen = false
        this.counters.restarts++
        limited.info(
          'zmq_engine_restart',
          this.who(),
          "an engine rank's replay does not hold the last batch applied: it restarted, and its worker-rank is reset",
        )
        this.sink.restarted(this.source)
        this.last = null
        this.lastPrint = null
        this.replayedSeq?.fill(-1n)
        complete = await this.requestReplay(0n, false)
      }
    } catch {
      // timed out or failed: a fresh socket for the next try, so no late reply of this one is read then
      this.dealer?.close()
      this.dealer = null
      complete = false
    }
    this.replaying = false
    if (this.closed) return
    // live batches that arrived meanwhile, in order, past what the replay applied
    const held = this.held
    this.held = []
    held.sort((a, b) => (a.seq < b.seq ? -1 : a.seq > b.seq ? 1 : 0))
    let missing = !complete
    for (const h of held) {
      if (this.last !== null && h.seq <= this.last) continue
      if (this.last !== null && h.seq > this.last + 1n) missing = true
      this.apply(h.seq, h.payload)
    }
    if (missing) {
      this.counters.replaysIncomplete++
      limited.warn(
        'zmq_replay_incomplete',
        this.who(),
        "an engine rank's replay did not bring back every missing batch: its rank is degraded until the engine restarts",
      )
      this.setState('degraded')
    } else this.setState('exact')
  }

  /** Set by requestReplay when the batch it was to verify came back with other bytes. */
  private restartSeen = false

  /**
   * True when the replay reached its end marker and left no hole before it. With `verify`, the
   * replay starts one batch earlier, at the last one applied, and stops (false, restartSeen)
   * when that one is not the same.
   */
  private async requestReplay(from: bigint, verify: boolean): Promise<boolean> {
    const check = verify && this.last !== null && this.last === from - 1n && from > 0n
    if (check) from -= 1n
    let d = this.dealer
    if (d === null) {
      d = this.dealer = new Dealer({ linger: 0, receiveTimeout: this.replayTimeoutMs })
      d.connect(this.source.replay as string)
    }
    const start = Buffer.alloc(8)
    start.writeBigUInt64BE(from)
    await d.send([Buffer.alloc(0), start])
    // the batch to verify may be gone from the engine's buffer: not a hole
    let expect = check ? from + 1n : from
    let hole = false
    for (;;) {
      const frames = await d.receive()
      // [empty, seq, payload] or [empty, topic, seq, payload]
      const body = frames[0]?.length === 0 ? frames.slice(1) : frames
      const seq = body.length === 2 ? seqOf(body[0]) : body.length === 3 ? seqOf(body[1]) : null
      if (seq === null) {
        this.counters.badFrames++
        limited.warn('zmq_bad_frame', { ...this.who(), frames: frames.length, replay: true }, "an engine's replay message is not [seq, payload]: skipped")
        continue
      }
      if (seq === END) return !hole
      const payload = body[body.length - 1] as Buffer
      if (check && seq === from && this.last === from) {
        if (fingerprint(payload) !== this.lastPrint) {
          this.restartSeen = true
          await this.drainReplay(d)
          return false
        }
        expect = seq + 1n
        continue
      }
      if (this.last !== null && seq <= this.last) continue
      if (seq > expect) hole = true
      expect = seq + 1n
      this.counters.replayedBatches++
      this.apply(seq, payload)
      this.noteReplayed(seq)
    }
  }

  /** Keeps the batch just applied from a replay (its fingerprint is lastPrint). */
  private noteReplayed(seq: bigint): void {
    if (this.replayedSeq === null) {
      this.replayedSeq = new BigInt64Array(REPLAYED_KEPT).fill(-1n)
      this.replayedPrint = new Uint32Array(REPLAYED_KEPT)
    }
    const slot = Number(seq % BigInt(REPLAYED_KEPT))
    this.replayedSeq[slot] = BigInt.asIntN(64, seq)
    ;(this.replayedPrint as Uint32Array)[slot] = this.lastPrint as number
  }

  /** True when a replay applied this very batch (same number, same bytes): the live copy is late. */
  private replayedAlready(seq: bigint, payload: Uint8Array): boolean {
    const seqs = this.replayedSeq
    if (seqs === null) return false
    const slot = Number(seq % BigInt(REPLAYED_KEPT))
    return seqs[slot] === BigInt.asIntN(64, seq) && (this.replayedPrint as Uint32Array)[slot] === fingerprint(payload)
  }

  /** Reads the rest of a replay that is not used, up to its end marker. */
  private async drainReplay(d: Dealer): Promise<void> {
    for (;;) {
      const frames = await d.receive()
      const body = frames[0]?.length === 0 ? frames.slice(1) : frames
      const seq = body.length === 2 ? seqOf(body[0]) : body.length === 3 ? seqOf(body[1]) : null
      if (seq === END) return
    }
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    this.sub.close()
    this.dealer?.close()
    await this.loop.catch(() => undefined)
  }
}
