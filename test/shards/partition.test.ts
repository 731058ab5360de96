import t from 'tap'
import { WorkerIdScan } from '../../src/shards/partition.js'
import { encodeEnvelope, encodeRouterEvent } from '../../src/codec/events.js'
import { chain } from '../helpers/events.js'

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
