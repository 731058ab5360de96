// The Dynamo mode's TCP request plane on its own (no etcd): what it does with bad input. A frame
// it cannot read closes the connection after a `Read error: …` reply; a request it takes but
// cannot decode is acknowledged (as Dynamo acknowledges before decoding) and counted; a frontend
// that cannot be dialled back frees the request; nothing takes the process down.
import t from 'tap'
import { createServer } from 'node:net'
import type { AddressInfo } from 'node:net'
import { MockEngine } from '../../../src/sim/mocker/engine.js'
import { generateHandler } from '../../../src/sim/mocker/dynamo/generate-endpoint.js'
import type { GenerateCounters } from '../../../src/sim/mocker/dynamo/generate-endpoint.js'
import { RequestPlaneServer } from '../../../src/sim/mocker/dynamo/request-plane-server.js'
import type { ResponseStream } from '../../../src/sim/mocker/dynamo/response-stream.js'
import { workerQueryHandler } from '../../../src/sim/mocker/dynamo/worker-query-endpoint.js'
import { RequestConnection, requestFrame, requestPayload, twoPart } from '../../helpers/dynamo-frontend.js'
import { waitUntil } from '../../helpers/wait.js'

async function freePortThatRefuses(): Promise<string> {
  const s = createServer()
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r))
  const port = (s.address() as AddressInfo).port
  await new Promise<void>((r) => s.close(() => r()))
  return `127.0.0.1:${port}`
}

t.test('bad input on the request plane', async (t) => {
  const warnings: string[] = []
  const rps = new RequestPlaneServer((m) => warnings.push(m))
  const hp = await rps.listen('127.0.0.1', '127.0.0.1')
  t.teardown(() => rps.close())
  const engine = new MockEngine({ workerId: 5n, blockSize: 4, numGpuBlocks: 64, speedupRatio: 1 })
  t.teardown(() => engine.close())
  const counters: GenerateCounters = { served: 0, cancelled: 0, refused: 0, callHomeFailed: 0 }
  const open = new Set<ResponseStream>()
  const gate = { inflight: 0, maxInflight: 4 }
  rps.register('5/generate', generateHandler(engine, 16, counters, open), gate)
  const queries = { answered: 0, badQueries: 0, callHomeFailed: 0 }
  rps.register('5/worker_kv_indexer_query_dp0', workerQueryHandler(engine.ring, 5n, queries), gate)

  await t.test('a request taken but undecodable: ACK, counted, no stream', async (t) => {
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    const bodies: Buffer[] = [
      Buffer.from('not two-part'),
      twoPart(Buffer.from('[1]'), Buffer.from('{}')),
      twoPart(Buffer.from('{"id":"a"}'), Buffer.from('{}')),
      twoPart(Buffer.from('{"id":"a","payload_codec":"cbor","connection_info":{"transport":"tcp_server","info":"{}"}}'), Buffer.from('{}')),
      twoPart(Buffer.from('{"id":"a","connection_info":{"transport":"tcp_server","info":"nope"}}'), Buffer.from('{}')),
      twoPart(
        Buffer.from(
          JSON.stringify({
            id: 'a',
            connection_info: { transport: 'tcp_server', info: JSON.stringify({ address: 'h:1', subject: 's', context: 'b', stream_type: 'response' }) },
          }),
        ),
        Buffer.from('{}'),
      ),
      twoPart(
        Buffer.from(
          JSON.stringify({
            id: 'a',
            connection_info: { transport: 'tcp_server', info: JSON.stringify({ address: 'h:1', subject: 's', context: 'a', stream_type: 'request' }) },
          }),
        ),
        Buffer.from('{}'),
      ),
      twoPart(
        Buffer.from(
          JSON.stringify({
            id: 'a',
            connection_info: { transport: 'tcp_server', info: JSON.stringify({ address: 'h:1', subject: 's', context: 'a', stream_type: 'response' }) },
          }),
        ),
        Buffer.from('{not json'),
      ),
    ]
    for (const b of bodies) conn.send(requestFrame('5/generate', {}, b))
    await waitUntil('every reply', () => conn.replies.length === bodies.length)
    for (const r of conn.replies) t.same(r, Buffer.from([0, 0, 0, 0]), 'acknowledged')
    t.equal(rps.counters.badRequests, bodies.length, 'each counted')
    t.equal(gate.inflight, 0, 'none in flight')
    t.match(warnings.join('\n'), /undecodable request/)
    t.match(warnings.join('\n'), /unknown payload_codec "cbor"/)
    t.match(warnings.join('\n'), /context "b" is not the request id "a"/)
    t.match(warnings.join('\n'), /stream_type must be "response"/)
  })

  await t.test('an unreadable frame closes the connection after a Read error reply', async (t) => {
    for (const bad of [
      // headers that are not JSON
      Buffer.concat([Buffer.from([0, 1]), Buffer.from('x'), Buffer.from([0, 2]), Buffer.from('{x'), Buffer.from([0, 0, 0, 0])]),
      // a payload above 32 MiB
      Buffer.concat([Buffer.from([0, 1]), Buffer.from('x'), Buffer.from([0, 0]), Buffer.from([0x02, 0x00, 0x00, 0x01])]),
    ]) {
      const conn = await RequestConnection.open(hp)
      t.teardown(() => conn.close())
      const closed = new Promise<void>((r) => conn.socket.once('close', () => r()))
      conn.send(bad)
      await closed
      t.match(conn.replies[0]?.subarray(4).toString(), /^Read error: /)
    }
    t.equal(rps.counters.badFrames, 2)
  })

  await t.test('a frontend that cannot be dialled: the request is dropped and its blocks freed', async (t) => {
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    const gone = await freePortThatRefuses()
    const r = requestPayload(gone, Buffer.from(JSON.stringify({ token_ids: [1, 2, 3, 4, 5], stop_conditions: { max_tokens: 200 } })), null)
    conn.send(requestFrame('5/generate', {}, r.payload))
    const q = requestPayload(gone, Buffer.from('{"worker_id":5,"start_event_id":null,"end_event_id":null}'), null)
    conn.send(requestFrame('5/worker_kv_indexer_query_dp0', {}, q.payload))
    await waitUntil('both given up', () => counters.callHomeFailed === 1 && queries.callHomeFailed === 1)
    await waitUntil('freed', () => gate.inflight === 0 && engine.activeBlocks === 0 && engine.runningCount === 0)
    t.equal(counters.served, 0)
  })
})
