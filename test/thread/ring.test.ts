import t from 'tap'
import { RingConsumer, RingProducer, checkRingCapacity } from '../../src/thread/ring.js'
import { Rng } from '../helpers/rng.js'

function makeRing(capacity: number): { p: RingProducer; c: RingConsumer } {
  const ctrl = new Int32Array(new SharedArrayBuffer(16))
  const data = new SharedArrayBuffer(capacity)
  return { p: new RingProducer(ctrl, { write: 0, read: 1 }, data), c: new RingConsumer(ctrl, { write: 0, read: 1 }, data) }
}

function message(rng: Rng, id: number, size: number): Uint8Array {
  const m = new Uint8Array(size)
  for (let i = 0; i < size; i++) m[i] = (id * 31 + i * 7 + rng.int(1)) & 0xff
  if (size >= 4) new DataView(m.buffer).setUint32(0, id)
  return m
}

t.test('mixed sizes, wrap-around, messages larger than half and larger than the whole ring', async (t) => {
  const rng = new Rng(9)
  const { p, c } = makeRing(1024)
  const sent: Uint8Array[] = []
  const got: Uint8Array[] = []
  const queue: { m: Uint8Array; off: number }[] = []
  let fullTimes = 0
  for (let id = 0; id < 3000; id++) {
    const roll = rng.next()
    const size = roll < 0.7 ? 1 + rng.int(100) : roll < 0.9 ? 300 + rng.int(400) : 1025 + rng.int(4000)
    const m = message(rng, id, size)
    sent.push(m)
    queue.push({ m, off: 0 })
    // the producer writes what fits; the consumer reads in random small steps, like two threads
    while (queue.length > 0) {
      const head = queue[0] as { m: Uint8Array; off: number }
      head.off = p.write(head.m, head.off)
      if (head.off === head.m.length) queue.shift()
      else {
        fullTimes++
        c.read(1 + rng.int(3), (v) => got.push(v.slice()))
      }
      if (rng.next() < 0.3) c.read(1 + rng.int(3), (v) => got.push(v.slice()))
    }
  }
  while (!c.empty()) c.read(100, (v) => got.push(v.slice()))
  t.ok(fullTimes > 100, `the ring filled up (${fullTimes} times) and the producer resumed`)
  t.equal(got.length, sent.length, 'every message arrived once')
  let same = 0
  for (let i = 0; i < sent.length; i++) if (Buffer.compare(Buffer.from(sent[i] as Uint8Array), Buffer.from(got[i] as Uint8Array)) === 0) same++
  t.equal(same, sent.length, 'in order, byte for byte')
  t.equal(p.used, 0)
})

t.test('the producer never overwrites unread data', async (t) => {
  const { p, c } = makeRing(256)
  const m = new Uint8Array(60).fill(7)
  let written = 0
  while (p.write(m) === m.length) written++
  t.ok(written >= 3 && written <= 4, `${written} messages of 60 bytes fit in 256`)
  t.equal(p.write(m), 0, 'a full ring takes nothing')
  let n = 0
  c.read(1, () => n++)
  t.equal(n, 1)
  t.equal(p.write(m), m.length, 'space freed by the reader is reused')
  t.equal(
    c.read(100, () => undefined),
    written,
  )
  t.ok(c.empty())
})

t.test('an empty message writes nothing; capacity validation', async (t) => {
  const { p, c } = makeRing(64)
  t.equal(p.write(new Uint8Array(0)), 0)
  t.ok(c.empty())
  t.equal(p.write(new Uint8Array(8).fill(1), 8), 8, 'a finished message is not written again')
  t.ok(c.empty())
  for (const bad of [63, 100, 32, 2 ** 31]) t.throws(() => checkRingCapacity(bad), RangeError)
})
