// The ZMQ listener against a publisher on real sockets that frames and replays as vLLM does:
// PUB [topic, seq, payload], ROUTER replay from a ring, the −1 end marker. The publisher can
// leave batches off the live socket (a gap), drop them from its ring too (an incomplete replay),
// restart its numbering, and send malformed frames.
import t from 'tap'
import type { Test } from 'tap'
import { Publisher, Router } from 'zeromq'
import { ZmqListener } from '../../src/transport/zmq.js'
import type { ZmqRankState, ZmqSink, ZmqSource } from '../../src/transport/zmq.js'

const TOPIC = 'kv-events'

function be8(n: bigint): Buffer {
  const b = Buffer.alloc(8)
  b.writeBigUInt64BE(BigInt.asUintN(64, n))
  return b
}

/** A vLLM-like publisher: every batch goes into the replay ring; `live` decides whether it is also published. */
class Engine {
  readonly pub = new Publisher({ linger: 0 })
  readonly router = new Router({ linger: 0 })
  ring: { seq: bigint; payload: Buffer }[] = []
  next = 0n
  /** Changes with each restart: a new process's batches are other bytes under the same numbers. */
  generation = 0
  /** Replies carry the topic frame (vLLM since PR #45177) or not (older vLLM, SGLang). */
  topicInReplies = true
  /** Ring entries the replay leaves out (SGLang's high-water-mark drops). */
  dropFromReplay = new Set<bigint>()
  private serving: Promise<void> | null = null

  async start(t: Test): Promise<{ endpoint: string; replay: string }> {
    await this.pub.bind('tcp://127.0.0.1:*')
    await this.router.bind('tcp://127.0.0.1:*')
    this.serving = this.serve()
    t.teardown(async () => {
      this.pub.close()
      this.router.close()
      await this.serving?.catch(() => undefined)
    })
    return { endpoint: this.pub.lastEndpoint as string, replay: this.router.lastEndpoint as string }
  }

  async publish(live = true): Promise<bigint> {
    const seq = this.next++
    const payload = Buffer.from(this.generation === 0 ? `batch ${seq}` : `batch ${seq} of generation ${this.generation}`)
    this.ring.push({ seq, payload })
    if (live) await this.pub.send([TOPIC, be8(seq), payload])
    return seq
  }

  /** Publishes a batch of the ring again on the live socket: its live copy, late. */
  async resend(seq: bigint): Promise<void> {
    const e = this.ring.find((b) => b.seq === seq)
    if (e === undefined) throw new Error(`batch ${seq} is not in the ring`)
    await this.pub.send([TOPIC, be8(seq), e.payload])
  }

  restart(): void {
    this.next = 0n
    this.ring = []
    this.generation++
  }

  private async serve(): Promise<void> {
    for await (const [id, , start] of this.router) {
      const from = (start as Buffer).readBigUInt64BE(0)
      for (const e of this.ring) {
        if (e.seq < from || this.dropFromReplay.has(e.seq)) continue
        await this.router.send(
          this.topicInReplies ? [id as Buffer, Buffer.alloc(0), TOPIC, be8(e.seq), e.payload] : [id as Buffer, Buffer.alloc(0), be8(e.seq), e.payload],
        )
      }
      await this.router.send(
        this.topicInReplies
          ? [id as Buffer, Buffer.alloc(0), Buffer.alloc(0), be8(-1n), Buffer.alloc(0)]
          : [id as Buffer, Buffer.alloc(0), be8(-1n), Buffer.alloc(0)],
      )
    }
  }
}

class Recorder implements ZmqSink {
  seqs: bigint[] = []
  /** A batch to refuse by throwing, as a sink does with one it cannot decode. */
  throwOn: bigint | null = null
  restarts = 0
  states: ZmqRankState[] = []
  batch(_s: ZmqSource, seq: bigint, payload: Uint8Array): void {
    if (seq === this.throwOn) throw new Error('undecodable')
    if (!new RegExp(`^batch ${seq}( |$)`).test(Buffer.from(payload).toString())) throw new Error(`payload of ${seq} is ${Buffer.from(payload).toString()}`)
    this.seqs.push(seq)
  }
  restarted(): void {
    this.restarts++
    this.seqs.push(-1n)
  }
  state(_s: ZmqSource, s: ZmqRankState): void {
    this.states.push(s)
  }
}

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms
  while (!cond()) {
    if (Date.now() > end) throw new Error('timed out')
    await new Promise((r) => setTimeout(r, 10))
  }
}

/** Publishes until the listener has seen a live batch: a SUB joins a PUB asynchronously. */
async function joined(e: Engine, r: Recorder): Promise<void> {
  const end = Date.now() + 5000
  for (;;) {
    const target = await e.publish()
    await new Promise((res) => setTimeout(res, 20))
    if (r.seqs.includes(target)) return
    if (Date.now() > end) throw new Error('the listener never joined')
  }
}

/** An engine, and a listener on it that has seen live batches. */
async function following(t: Test, withReplay = true, engine = new Engine()): Promise<{ e: Engine; r: Recorder; l: ZmqListener }> {
  const { endpoint, replay } = await engine.start(t)
  const r = new Recorder()
  const l = ZmqListener.start({ workerId: 1n, dpRank: 0, endpoint, replay: withReplay ? replay : null, topic: TOPIC }, r)
  t.teardown(() => l.close())
  await joined(engine, r)
  return { e: engine, r, l }
}

const range = (a: number, b: number): bigint[] => Array.from({ length: b - a + 1 }, (_, i) => BigInt(a + i))

t.test('a listener that starts late replays what the engine buffered, then follows live', async (t) => {
  const e = new Engine()
  const { endpoint, replay } = await e.start(t)
  for (let i = 0; i < 5; i++) await e.publish()
  const r = new Recorder()
  const l = ZmqListener.start({ workerId: 1n, dpRank: 0, endpoint, replay, topic: TOPIC }, r)
  t.teardown(() => l.close())
  await until(() => r.seqs.length >= 5)
  t.same(r.seqs, range(0, 4), 'the buffered batches, in order')
  await joined(e, r)
  t.same(r.seqs, range(0, r.seqs.length - 1), 'then live ones, none twice, none missing')
  t.equal(l.state, 'exact')
  t.equal(l.counters.replays, 1)
})

t.test('a gap is filled by a replay; replies without the topic frame too', async (t) => {
  for (const topicInReplies of [true, false]) {
    const e = new Engine()
    e.topicInReplies = topicInReplies
    const { endpoint, replay } = await e.start(t)
    const r = new Recorder()
    const l = ZmqListener.start({ workerId: 1n, dpRank: 0, endpoint, replay, topic: TOPIC }, r)
    t.teardown(() => l.close())
    await e.publish()
    await joined(e, r)
    await e.publish(false)
    await e.publish(false)
    const last = await e.publish()
    await until(() => r.seqs.includes(last))
    t.same(r.seqs, range(0, Number(last)), `every batch once, in order (topic frame ${topicInReplies})`)
    t.equal(l.counters.gaps, 1)
    t.equal(l.state, 'exact')
    t.same(r.states.slice(-2), ['recovering', 'exact'])
  }
})

t.test('an incomplete replay leaves the worker-rank degraded until the engine restarts', async (t) => {
  const { e, r, l } = await following(t)
  const lost = await e.publish(false)
  e.dropFromReplay.add(lost)
  await e.publish(false)
  const last = await e.publish()
  await until(() => r.seqs.includes(last))
  t.notOk(r.seqs.includes(lost), 'the dropped batch never came')
  t.equal(l.state, 'degraded')
  t.equal(l.counters.replaysIncomplete, 1)
  // the engine restarts: numbering from 0 again, the rank is cleared and exact again
  e.restart()
  const first = await e.publish()
  t.equal(first, 0n)
  await until(() => l.counters.restarts === 1 && r.seqs.at(-1) === 0n)
  t.equal(r.seqs.at(-2), -1n, "cleared before the new engine's first batch")
  t.equal(l.state, 'exact')
})

t.test('an engine that restarted and counted past the last batch before the socket saw it: a restart, not a gap', async (t) => {
  const { e, r, l } = await following(t)
  const last = r.seqs.at(-1) as bigint
  e.restart()
  // the new process publishes past the old number while the listener is not connected to it
  for (let i = 0n; i <= last + 2n; i++) await e.publish(false)
  const live = await e.publish()
  await until(() => r.seqs.at(-1) === live && l.state === 'exact')
  t.equal(l.counters.restarts, 1, 'seen as a restart')
  const from = r.seqs.lastIndexOf(-1n)
  t.ok(from >= 0, 'reset')
  t.same(r.seqs.slice(from + 1), range(0, Number(live)), 'then every batch of the new engine, from its first')
})

t.test('a replayed batch whose live copy comes late is skipped, not taken for a restart', async (t) => {
  const { e, r, l } = await following(t)
  const replayed = l.counters.replayedBatches
  const missed = await e.publish(false)
  const next = await e.publish()
  await until(() => r.seqs.includes(next) && l.state === 'exact')
  t.equal(l.counters.replayedBatches, replayed + 2, 'the missed batch and the next came by the replay')
  // the live socket delivers it after all, after the replay applied it and the batch past it
  await e.resend(missed)
  const after = await e.publish()
  await until(() => r.seqs.includes(after))
  t.equal(l.counters.duplicates, 1, 'counted as a duplicate')
  t.equal(l.counters.restarts, 0, 'not a restart')
  t.notOk(r.seqs.includes(-1n), 'nothing reset')
  t.same(
    r.seqs,
    [...r.seqs].sort((a, b) => (a < b ? -1 : 1)),
    'each batch once, in order',
  )
  t.equal(new Set(r.seqs).size, r.seqs.length)
  // a batch under an old number with other bytes is still a restart
  e.restart()
  const fresh = await e.publish()
  await until(() => r.seqs.at(-1) === fresh)
  t.equal(l.counters.restarts, 1)
  t.equal(l.counters.duplicates, 1)
})

t.test('without a replay socket a gap is counted and the rank degraded', async (t) => {
  const { e, r, l } = await following(t, false)
  await e.publish(false)
  const last = await e.publish()
  await until(() => r.seqs.includes(last))
  t.equal(l.counters.gaps, 1)
  t.equal(l.state, 'degraded')
})

t.test('malformed frames are counted and dropped; the listener goes on', async (t) => {
  const { e, r, l } = await following(t)
  await e.pub.send([TOPIC, Buffer.from('short')])
  await e.pub.send([TOPIC, Buffer.alloc(7), Buffer.from('x')])
  await e.pub.send([TOPIC, be8(99n), Buffer.from('x'), Buffer.from('extra')])
  // a batch the sink cannot take (it throws) is counted and the listener goes on
  const poison = await e.publish()
  r.throwOn = poison
  const last = await e.publish()
  await until(() => r.seqs.includes(last))
  t.equal(l.counters.badFrames, 3)
  t.equal(l.counters.sinkErrors, 1)
  t.notOk(r.seqs.includes(poison))
  t.same(
    r.seqs,
    range(0, Number(last)).filter((x) => x !== poison),
  )
  t.equal(l.state, 'exact', 'no gap: the poisoned batch was taken')
})

t.test('a publisher that is not there holds nothing up, and is picked up when it comes', async (t) => {
  const e = new Engine()
  const r = new Recorder()
  // a port nobody listens on yet: bind the engine later on the same port
  const probe = new Publisher()
  await probe.bind('tcp://127.0.0.1:*')
  const endpoint = probe.lastEndpoint as string
  probe.close()
  await new Promise((res) => setTimeout(res, 50))
  const l = ZmqListener.start({ workerId: 1n, dpRank: 0, endpoint, replay: null, topic: TOPIC }, r)
  t.teardown(() => l.close())
  await new Promise((res) => setTimeout(res, 200))
  await e.pub.bind(endpoint)
  t.teardown(() => e.pub.close())
  await joined(e, r)
  t.ok(r.seqs.length > 0, 'batches arrive once the engine is up')
})
