// The request-plane client against a worker written in the test from Dynamo's source
// (test/helpers/dynamo-tcp-worker.ts), over real loopback sockets: a round trip, refusals, the
// ACK timeout, stop and kill when the caller goes away, pipelined acknowledgements in order,
// and input from a worker that does not decode (counted; the router goes on).
import t from 'tap'
import type { Test } from 'tap'
import { createConnection } from 'node:net'
import { Packr } from 'msgpackr'
import { RequestPlaneClient } from '../../src/request-plane/client.js'
import type { RequestPlaneClientOptions } from '../../src/request-plane/client.js'
import { startTestWorker, twoPart } from '../helpers/dynamo-tcp-worker.js'
import type { CallHome, TestWorker, WorkerRequest } from '../helpers/dynamo-tcp-worker.js'
import { until } from '../http/helpers.js'

type OnRequest = Parameters<typeof startTestWorker>[0]

async function setup(t: Test, onRequest: OnRequest, opts: RequestPlaneClientOptions = {}): Promise<{ client: RequestPlaneClient; worker: TestWorker }> {
  const worker = await startTestWorker(onRequest)
  const client = new RequestPlaneClient({ listener: { host: '127.0.0.1' }, ...opts })
  t.teardown(async () => {
    await client.close()
    await worker.close()
  })
  return { client, worker }
}

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = []
  for await (const x of it) out.push(x)
  return out
}

t.test('a round trip: frame, acknowledgement, dial-back, prologue, items, final, sentinel', async (t) => {
  let home: CallHome | null = null
  const { client, worker } = await setup(t, (_req, ack, dial) => {
    ack()
    void dial().then((h) => {
      home = h
      h.data({ token_ids: [1, 2], text: 'a' })
      h.data({ token_ids: [3], text: 'b' })
      h.finish()
    })
  })
  const stream = await client.request(`127.0.0.1:${worker.port}/1f/generate`, { model: 'm', token_ids: [5, 6, 7] }, { requestId: 'req-1' })
  t.same(await collect(stream), [
    { token_ids: [1, 2], text: 'a' },
    { token_ids: [3], text: 'b' },
  ])
  const req = worker.requests[0] as WorkerRequest
  t.equal(req.path, '1f/generate', 'the path after host:port')
  t.same(req.headers, { 'request-id': 'req-1', 'x-endpoint-path': '1f/generate' })
  t.match(req.control, { id: 'req-1', request_type: 'single_in', response_type: 'many_out', payload_codec: 'json' })
  t.equal(req.control.connection_info.transport, 'tcp_server')
  const info = JSON.parse(req.control.connection_info.info) as Record<string, string>
  t.match(info, { address: /^127\.0\.0\.1:\d+$/, context: 'req-1', stream_type: 'response' })
  t.match(info.subject, /^[0-9a-f-]{36}$/)
  t.same(JSON.parse(req.body.toString()), { model: 'm', token_ids: [5, 6, 7] })
  // the worker waits for the frontend to close the response connection after its sentinel
  await until(() => (home as CallHome | null)?.closedByFrontend === true)
  t.match(client.counters, { requests: 1, accepted: 1, streams: 1, streamErrors: 0 })
  t.equal((await client.responseListener()).pending, 0, 'nothing left waiting')
})

t.test('a MessagePack request: body and items in named MessagePack', async (t) => {
  const packr = new Packr({ useRecords: false })
  const { client, worker } = await setup(t, (_req, ack, dial) => {
    ack()
    void dial().then((h) => {
      h.send(twoPart(null, packr.pack({ data: { n: 1 }, complete_final: false })))
      h.send(twoPart(null, packr.pack({ complete_final: true })))
      h.send(twoPart('"sentinel"', null))
    })
  })
  const stream = await client.request(`127.0.0.1:${worker.port}/generate`, { worker_id: 2n ** 63n }, { codec: 'msgpack' })
  t.same(await collect(stream), [{ n: 1 }])
  t.equal(worker.requests[0]?.control.payload_codec, 'msgpack')
  t.same(new Packr({ useRecords: false, int64AsType: 'bigint' }).unpack(worker.requests[0]?.body as Buffer), { worker_id: 2n ** 63n })
})

t.test('refusals: overloaded and unavailable are 503s to fail over; others are rejections', async (t) => {
  const answers = ['Server overloaded: 1500 in flight', 'Server unavailable: draining', 'Unknown endpoint: 1f/nope']
  const { client, worker } = await setup(t, (_req, ack) => ack(answers.shift()))
  const addr = `127.0.0.1:${worker.port}/1f/generate`
  await t.rejects(client.request(addr, {}), { code: 'KVR_ERR_WORKER_OVERLOADED', statusCode: 503, message: /1500 in flight/ })
  await t.rejects(client.request(addr, {}), { code: 'KVR_ERR_WORKER_OVERLOADED', statusCode: 503 })
  await t.rejects(client.request(addr, {}), { code: 'KVR_ERR_WORKER_REJECTED', message: /Unknown endpoint/ })
  t.match(client.counters, { requests: 3, accepted: 0, overloaded: 2, rejected: 1 })
  t.equal((await client.responseListener()).pending, 0, 'no stream waits for a refused request')
  t.equal(worker.connections, 1, 'one connection carried them all')
})

t.test('a request not acknowledged in time fails alone; its connection is retired', async (t) => {
  let n = 0
  const { client, worker } = await setup(
    t,
    (_req, ack, dial) => {
      // the first request is never acknowledged; later ones are, on a new connection
      if (n++ === 0) return
      ack()
      void dial().then((h) => h.finish())
    },
    { ackTimeoutMs: 300 },
  )
  const addr = `127.0.0.1:${worker.port}/generate`
  const started = performance.now()
  await t.rejects(client.request(addr, {}), { code: 'KVR_ERR_ACK_TIMEOUT', statusCode: 503 })
  t.ok(performance.now() - started >= 290, 'not before the timeout')
  t.equal(client.counters.ackTimeouts, 1)
  t.same(await collect(await client.request(addr, {})), [], 'the next request goes through')
  t.equal(worker.connections, 2, 'on a fresh connection')
})

t.test('a worker that accepts but never dials back times out', async (t) => {
  const { client, worker } = await setup(t, (_req, ack) => ack(), { ackTimeoutMs: 300 })
  const stream = await client.request(`127.0.0.1:${worker.port}/generate`, {})
  await t.rejects(collect(stream), { code: 'KVR_ERR_ACK_TIMEOUT' })
  t.equal((await client.responseListener()).pending, 0)
})

t.test('the caller going away sends "stop", then "kill" when the stream does not end', async (t) => {
  const homes: CallHome[] = []
  const { client, worker } = await setup(
    t,
    (req, ack, dial) => {
      ack()
      void dial().then((h) => {
        homes.push(h)
        h.data({ i: 0 })
        // the second worker obeys "stop": it ends its stream
        if (JSON.parse(req.body.toString()).obey === true) {
          const timer = setInterval(() => {
            if (!h.received.includes('"stop"')) return
            clearInterval(timer)
            h.send(twoPart(null, '{"complete_final":true}'))
            h.send(twoPart('"sentinel"', null))
          }, 10)
        }
      })
    },
    { killAfterMs: 200 },
  )
  const addr = `127.0.0.1:${worker.port}/generate`
  const ac = new AbortController()
  const stream = await client.request(addr, { obey: false }, { signal: ac.signal })
  t.same((await stream.next()).value, { i: 0 })
  ac.abort()
  await t.rejects(stream.next(), { code: 'KVR_ERR_REQUEST_CANCELLED' })
  await until(() => homes[0]?.received.length === 2)
  t.same(homes[0]?.received, ['"stop"', '"kill"'], 'stop, and kill after the wait')
  await until(() => homes[0]?.closedByFrontend === true)
  // one that ends when told: stop only
  const s2 = await client.request(addr, { obey: true })
  for await (const item of s2) {
    t.same(item, { i: 0 })
    break
  }
  await until(() => homes[1]?.closedByFrontend === true)
  t.same(homes[1]?.received, ['"stop"'])
  t.match(client.counters, { stops: 2, kills: 1, streamErrors: 0 })
})

t.test('pipelined requests are acknowledged in order on one connection', async (t) => {
  const pending: { req: WorkerRequest; ack: (text?: string | Buffer) => void; dial: () => Promise<CallHome> }[] = []
  const { client, worker } = await setup(t, (req, ack, dial) => pending.push({ req, ack, dial }), { connectionsPerWorker: 1 })
  const addr = `127.0.0.1:${worker.port}/generate`
  const results = Array.from({ length: 6 }, (_, i) =>
    client.request(addr, { i }).then(
      async (s) => ({ i, items: await collect(s) }),
      (err: { code: string }) => ({ i, err: err.code }),
    ),
  )
  await until(() => pending.length === 6)
  t.same(
    pending.map((p) => JSON.parse(p.req.body.toString()).i),
    [0, 1, 2, 3, 4, 5],
    'written in order',
  )
  // every odd one refused; each accepted one streams its own index back
  for (const p of pending) {
    const i = JSON.parse(p.req.body.toString()).i as number
    if (i % 2 === 1) p.ack('Server overloaded: odd')
    else {
      p.ack()
      void p.dial().then((h) => {
        h.data(i)
        h.finish()
      })
    }
  }
  t.same(await Promise.all(results), [
    { i: 0, items: [0] },
    { i: 1, err: 'KVR_ERR_WORKER_OVERLOADED' },
    { i: 2, items: [2] },
    { i: 3, err: 'KVR_ERR_WORKER_OVERLOADED' },
    { i: 4, items: [4] },
    { i: 5, err: 'KVR_ERR_WORKER_OVERLOADED' },
  ])
  t.equal(worker.connections, 1)
})

t.test('errors on the response stream: a prologue error, no final message', async (t) => {
  const { client, worker } = await setup(t, (req, ack, dial) => {
    ack()
    const kind = JSON.parse(req.body.toString()).kind as string
    if (kind === 'prologue') void dial('{"error":"engine is dead"}')
    else
      void dial().then((h) => {
        h.data(1)
        if (kind === 'sentinel') h.send(twoPart('"sentinel"', null))
        else h.socket.end()
      })
  })
  const addr = `127.0.0.1:${worker.port}/generate`
  await t.rejects(collect(await client.request(addr, { kind: 'prologue' })), { code: 'KVR_ERR_RESPONSE_STREAM', message: /engine is dead/ })
  await t.rejects(collect(await client.request(addr, { kind: 'sentinel' })), { code: 'KVR_ERR_RESPONSE_STREAM', message: /without its final message/ })
  await t.rejects(collect(await client.request(addr, { kind: 'close' })), { code: 'KVR_ERR_RESPONSE_STREAM', message: /closed before/ })
  t.equal(client.counters.streamErrors, 3)
})

t.test('input from a worker that does not decode is counted and dropped; the router goes on', async (t) => {
  const { client, worker } = await setup(
    t,
    (req, ack, dial) => {
      const kind = JSON.parse(req.body.toString()).kind as string
      if (kind === 'huge-ack') {
        // an acknowledgement that declares 4 GiB
        ack(Buffer.from('ffffffff', 'hex'))
        return
      }
      ack()
      void dial().then((h) => {
        if (kind === 'garbage') h.send(Buffer.from('this is not a two-part message at all, not even close'))
        else if (kind === 'checksum') h.send(twoPart(null, '{"data":1,"complete_final":false}', 12345n))
        else if (kind === 'not-wrapper') h.send(twoPart(null, '[1,2,3]'))
        else if (kind === 'worker-stop') h.send(twoPart('"stop"', null))
        else {
          h.data('fine')
          h.finish()
        }
      })
    },
    { ackTimeoutMs: 1000 },
  )
  const addr = `127.0.0.1:${worker.port}/generate`
  for (const kind of ['garbage', 'checksum', 'not-wrapper', 'worker-stop'])
    await t.rejects(collect(await client.request(addr, { kind })), { code: /KVR_ERR_FRAME_(MALFORMED|TOO_LARGE)/ }, kind)
  t.equal(client.counters.malformed, 4)
  await t.rejects(client.request(addr, { kind: 'huge-ack' }), { code: 'KVR_ERR_FRAME_TOO_LARGE' }, 'an acknowledgement past the limit')
  t.equal(client.counters.malformed, 5)
  // a stranger dials the listener: a handshake for no request, then garbage without one
  const listener = await client.responseListener()
  const port = Number(listener.address.split(':')[1])
  for (const bytes of [twoPart('{"subject":"nobody","stream_type":"response"}', null), Buffer.from('x'.repeat(40))]) {
    const s = createConnection({ host: '127.0.0.1', port })
    s.on('error', () => undefined)
    s.write(bytes)
    await new Promise((r) => s.on('close', r))
  }
  t.equal(client.counters.malformed, 7, 'both counted, both connections dropped')
  t.same(await collect(await client.request(addr, { kind: 'ok' })), ['fine'], 'the router still serves requests')
})

t.test('a slow reader pauses the response connection and loses nothing', async (t) => {
  const { client, worker } = await setup(t, (_req, ack, dial) => {
    ack()
    void dial().then((h) => {
      for (let i = 0; i < 300; i++) h.data(i)
      h.finish()
    })
  })
  const stream = await client.request(`127.0.0.1:${worker.port}/generate`, {})
  const got: unknown[] = []
  for await (const item of stream) {
    got.push(item)
    // slower than the worker writes: the unread items pass the high-water mark
    if (got.length % 50 === 0) await new Promise((r) => setTimeout(r, 20))
  }
  t.same(
    got,
    Array.from({ length: 300 }, (_, i) => i),
  )
  t.equal(client.counters.streamErrors, 0)
})
