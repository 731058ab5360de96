// Writing messages into the shards' event rings. A full ring never drops a message: it is
// queued here, counted, and written as the shard frees space (write() returns false meanwhile,
// as a stream's write() does, so an intake can pause); 'drain' is emitted per shard once its
// queue is written.
import { PRODUCER_WAIT, RING_READ } from '../thread/protocol.js'
import { type Pending, type Shard, ringDoorbell } from './shard.js'

const WRITTEN: Pending = { bytes: new Uint8Array(0), offset: 0 }
// Buffer#slice shares memory (and small Buffers share a pool), so a queued message must be
// copied with Uint8Array's slice, whatever the caller passed.
const u8slice = Uint8Array.prototype.slice
function copyBytes(msg: Uint8Array): Uint8Array {
  return u8slice.call(msg, 0)
}

export class EventWriter {
  /** Bytes of the messages queued behind full rings, all shards. */
  queuedBytes = 0

  constructor(
    /** The pool's shards, as lifecycle.ts replaces them. */
    private readonly shards: readonly Shard[],
    private readonly onDrain: (shard: number) => void,
  ) {}

  /** Writes one message (a record or an event) to a shard; false when it is queued behind a full ring. */
  write(sh: Shard, msg: Uint8Array): boolean {
    sh.enqueued = (sh.enqueued + 1) | 0
    if (sh.pendingHead === sh.pending.length) {
      const off = sh.producer.write(msg, 0)
      if (off > 0) ringDoorbell(sh)
      if (off === msg.length) return true
      // the whole message, so a restart can write it again from its start
      sh.pending.push({ bytes: copyBytes(msg), offset: off })
    } else {
      sh.pending.push({ bytes: copyBytes(msg), offset: 0 })
    }
    this.queuedBytes += msg.length
    sh.ringFull++
    this.waitForSpace(sh)
    return false
  }

  /** Messages queued behind full rings, all shards. */
  get pendingMessages(): number {
    let n = 0
    for (const sh of this.shards) n += sh.pending.length - sh.pendingHead
    return n
  }

  /** Drops what a shard that died during close had queued (reported as lost by the caller). */
  discard(sh: Shard): void {
    for (let i = sh.pendingHead; i < sh.pending.length; i++) this.queuedBytes -= (sh.pending[i] as Pending).bytes.length
    sh.pending.length = 0
    sh.pendingHead = 0
  }

  /** Writes queued messages as the shard frees ring space; emits 'drain' when none are left. */
  waitForSpace(sh: Shard): void {
    if (sh.waitingForSpace) return
    sh.waitingForSpace = true
    void this.drain(sh)
  }

  private async drain(sh: Shard): Promise<void> {
    while (sh.pendingHead < sh.pending.length) {
      // a restarted shard's replacement takes the queue over with a loop of its own
      if (this.shards[sh.index] !== sh) return
      const p = sh.pending[sh.pendingHead] as Pending
      p.offset = sh.producer.write(p.bytes, p.offset)
      ringDoorbell(sh)
      if (p.offset === p.bytes.length) {
        this.queuedBytes -= p.bytes.length
        sh.pending[sh.pendingHead++] = WRITTEN
        if (sh.pendingHead > 1024 && sh.pendingHead * 2 > sh.pending.length) {
          sh.pending.splice(0, sh.pendingHead)
          sh.pendingHead = 0
        }
        continue
      }
      // wait until half the ring is free (the shard wakes us then, see workers/shard/main.ts), so
      // that one wake refills half a ring; the check after announcing the wait catches a
      // shard that got there in between
      Atomics.store(sh.ctrl, PRODUCER_WAIT, 1)
      const read = Atomics.load(sh.ctrl, RING_READ)
      if (sh.producer.used > sh.producer.capacity / 2) {
        const r = Atomics.waitAsync(sh.ctrl, RING_READ, read, 50)
        if (r.async) {
          sh.ringWaits++
          await r.value
        }
        if (this.shards[sh.index] !== sh) return
      }
      Atomics.store(sh.ctrl, PRODUCER_WAIT, 0)
    }
    sh.pending.length = 0
    sh.pendingHead = 0
    sh.waitingForSpace = false
    this.onDrain(sh.index)
  }
}
