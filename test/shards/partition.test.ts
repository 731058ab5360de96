import t from 'tap'
import { WorkerIdScan } from '../../src/shards/partition.js'
import { encodeEnvelope, encodeRouterEvent } from '../../src/codec/events.js'
import { chain } from '../helpers/events.js'
import { encodeEnvelopeMsgpack, encodeRouterEventMsgpack, pack } from '../../support/dynamo-msgpack.js'

t.test('finds the worker id without decoding', async (t) => {
  const s = new WorkerIdScan()
  const big = 2n ** 63n + 5n
  t.ok(s.scan(Buffer.from(encodeRouterEvent(chain(big, null, [1])))))
  t.equal((BigInt(s.hi) << 32n) | BigInt(s.lo), big)
  t.ok(s.scan(Buffer.from('{ "worker_id" : "18446744073709551615", "event": {}}')))
  t.equal(s.lo, 0xffffffff)
  t.equal(s.hi, 0xffffffff)
  const env = encodeEnvelope({ publisher_id: 42n, sequence: 1n, published_at: 0n, payload: chain(42, null, [1]) })
  t.ok(s.scan(Buffer.from(env)), 'envelopes are placed by publisher_id')
  t.equal(s.lo, 42)
})

t.test('no worker id, or not a number: not found', async (t) => {
  const s = new WorkerIdScan()
  for (const m of ['{}', '{"worker_id":null}', '{"worker_id" 5}', '{"worker_id":-1}', '{"worker_id":18446744073709551616}']) {
    t.notOk(s.scan(Buffer.from(m)), m)
  }
})

const u64Of = (s: WorkerIdScan): bigint => (BigInt(s.hi) << 32n) | BigInt(s.lo)

t.test('MessagePack: the worker id of every integer width, bare or inside the envelope', async (t) => {
  const s = new WorkerIdScan()
  // fixint, u8, u16, u32, u64 (above 2^53 too), as the shortest form is picked
  for (const id of [0n, 127n, 128n, 255n, 256n, 65535n, 65536n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 53n + 1n, 2n ** 64n - 1n]) {
    for (const form of ['named', 'positional'] as const) {
      const bare = encodeRouterEventMsgpack(chain(id, null, [1]), form)
      t.ok(s.scan(bare), `${id} ${form}`)
      t.equal(u64Of(s), id)
      // a publisher id unlike the worker's: the RouterEvent's own id wins
      for (const envForm of ['named', 'positional'] as const) {
        t.ok(s.scan(encodeEnvelopeMsgpack({ publisher_id: 2n ** 62n + 9n, sequence: 70000, payload: bare }, envForm)))
        t.equal(u64Of(s), id, `${id}: ${form} in a ${envForm} envelope`)
      }
    }
  }
})

t.test('MessagePack: signed widths, publisher fallback, and what is no id', async (t) => {
  const s = new WorkerIdScan()
  const key = [0xa9, ...Buffer.from('worker_id')]
  const named = (...value: number[]) => new Uint8Array([0x82, ...key, ...value, 0xa5, ...Buffer.from('event'), 0x80])
  t.ok(s.scan(named(0xd0, 0x05)))
  t.equal(u64Of(s), 5n)
  t.ok(s.scan(named(0xd1, 0x01, 0x00)))
  t.equal(u64Of(s), 256n)
  t.ok(s.scan(named(0xd2, 0x7f, 0xff, 0xff, 0xff)))
  t.equal(u64Of(s), 2n ** 31n - 1n)
  t.ok(s.scan(named(0xd3, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)))
  t.equal(u64Of(s), 2n ** 63n - 1n)
  for (const bad of [[0xff], [0xd0, 0x80], [0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], [0xc0], [0xa1, 0x31], [0xcb, 0, 0, 0, 0, 0, 0, 0, 0]]) {
    t.notOk(s.scan(named(...bad)), Buffer.from(bad).toString('hex'))
  }
  t.notOk(s.scan(new Uint8Array([0x81, ...key, 0xcf, 1, 2])), 'a u64 cut short')
  t.notOk(s.scan(pack({ event: { event_id: 1, data: 'cleared' } })), 'no key')
  t.notOk(s.scan(pack([])), 'an empty array')
  t.notOk(s.scan(pack(['x', 1])), 'an array not led by an integer')
  // an envelope whose payload names no worker is placed by its publisher
  t.ok(s.scan(pack({ publisher_id: 2n ** 60n, sequence: 1, payload: pack({ event: {} }) })))
  t.equal(u64Of(s), 2n ** 60n)
  t.ok(s.scan(pack([2n ** 60n, 1, 2, 'kv-events', pack(['x'])])))
  t.equal(u64Of(s), 2n ** 60n)
  t.ok(s.scan(pack([2n ** 60n, 1, 2, 'kv-events'])), 'a positional envelope without its payload')
  t.equal(u64Of(s), 2n ** 60n)
  t.ok(s.scan(pack([7, 'device', 'worker', [1, 'cleared', 0]])))
  t.equal(u64Of(s), 7n)
  t.ok(s.scan(pack([7])))
  t.equal(u64Of(s), 7n)
  // topics in str8 and str16, bin16 and bin32 payloads are stepped over too
  for (const [blocks, topic] of [
    [30, 't'.repeat(40)],
    [100, 't'.repeat(300)],
    [10_000, 'kv-events'],
  ] as const) {
    const long = encodeRouterEventMsgpack(
      chain(
        99,
        null,
        Array.from({ length: blocks }, (_, i) => i),
      ),
      'positional',
    )
    t.ok(s.scan(encodeEnvelopeMsgpack({ publisher_id: 1, sequence: 2, topic, payload: long }, 'positional')))
    t.equal(u64Of(s), 99n, `${blocks} blocks, a topic of ${topic.length}`)
  }
  t.ok(s.scan(pack([5, 1, 2, 3, pack([6])])), 'a topic that is no string: the publisher')
  t.equal(u64Of(s), 5n)
})
