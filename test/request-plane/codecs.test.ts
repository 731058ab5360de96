// The request plane's codecs against golden bytes transcribed by hand from Dynamo's source (the
// comment beside each names the file and commit), decoded from streams cut at every byte, and
// their limits; the control header; addresses; the worker query's answers of each generation.
import t from 'tap'
import { AckDecoder, encodeAck, encodeRequestFrame, RequestFrameDecoder } from '../../src/request-plane/tcp-frame.js'
import { encodeTwoPart, TwoPartDecoder } from '../../src/request-plane/two-part.js'
import type { TwoPartMessage } from '../../src/request-plane/two-part.js'
import { encodeControl, encodeControlHeader, unwrapData, unwrapJsonBytes } from '../../src/request-plane/control-message.js'
import { parseInstanceAddress, siblingEndpoint } from '../../src/request-plane/address.js'
import { parseWorkerQueryAnswer, workerQueryJson } from '../../src/request-plane/worker-query.js'
import { encodePayload, decodePayload } from '../../src/request-plane/payload-codec.js'
import { isKvrError } from '../../src/errors.js'
import { instanceTcpAddress, toWorker } from '../../src/transport/etcd.js'

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex')
const txt = (s: string): Buffer => Buffer.from(s, 'utf8')

/** Feeds bytes one at a time. */
function bytewise(b: Buffer, push: (chunk: Buffer) => void): void {
  for (let i = 0; i < b.length; i++) push(b.subarray(i, i + 1))
}

// lib/runtime/src/pipeline/network/codec.rs@2a26d793, TcpRequestMessage::encode: u16 BE path
// length, path, u16 BE headers length, headers as serde_json of HashMap<String,String>, u32 BE
// payload length, payload. Path "7b/generate" is 11 bytes, the headers object 52, the payload 2.
const REQUEST_GOLDEN = Buffer.concat([
  hex('000b'),
  txt('7b/generate'),
  hex('0034'),
  txt('{"request-id":"r-1","x-endpoint-path":"7b/generate"}'),
  hex('00000002'),
  txt('hi'),
])

t.test('the request frame is Dynamo’s bytes, and decodes from a stream cut anywhere', async (t) => {
  const frame = encodeRequestFrame('7b/generate', { 'request-id': 'r-1', 'x-endpoint-path': '7b/generate' }, txt('hi'))
  t.same([...frame], [...REQUEST_GOLDEN])
  const d = new RequestFrameDecoder()
  const got: ReturnType<RequestFrameDecoder['push']> = []
  bytewise(Buffer.concat([REQUEST_GOLDEN, REQUEST_GOLDEN]), (c) => got.push(...d.push(c)))
  t.equal(got.length, 2)
  t.equal(got[1]?.path, '7b/generate')
  t.same(got[1]?.headers, { 'request-id': 'r-1', 'x-endpoint-path': '7b/generate' })
  t.equal(got[1]?.payload.toString(), 'hi')
  t.throws(() => encodeRequestFrame('p', {}, Buffer.alloc(100), 64), { code: 'KVR_ERR_FRAME_TOO_LARGE' })
  t.throws(() => encodeRequestFrame('x'.repeat(70_000), {}, Buffer.alloc(0)), { code: 'KVR_ERR_FRAME_TOO_LARGE' })
  // a declared length past the limit is refused before its bytes arrive
  t.throws(() => new RequestFrameDecoder(64).push(Buffer.concat([hex('0001'), txt('p'), hex('0002'), txt('{}'), hex('00001000')])), {
    code: 'KVR_ERR_FRAME_TOO_LARGE',
  })
  t.throws(() => new RequestFrameDecoder().push(Buffer.concat([hex('0001'), txt('p'), hex('0002'), txt('[]'), hex('00000000')])), {
    code: 'KVR_ERR_FRAME_MALFORMED',
  })
})

t.test('acknowledgements: empty is accepted, text a refusal; limits', async (t) => {
  // codec.rs@2a26d793, TcpResponseMessage::encode: u32 BE length, data
  const golden = Buffer.concat([hex('00000000'), hex('00000018'), txt('Server overloaded: busy!')])
  t.same([...Buffer.concat([encodeAck(), encodeAck('Server overloaded: busy!')])], [...golden])
  const d = new AckDecoder()
  const acks: string[] = []
  bytewise(golden, (c) => d.push(c, (a) => acks.push(a.toString())))
  t.same(acks, ['', 'Server overloaded: busy!'])
  t.throws(() => new AckDecoder(16).push(hex('00000100'), () => undefined), { code: 'KVR_ERR_FRAME_TOO_LARGE' })
})

t.test('the two-part message is Dynamo’s bytes; its checksum is checked when not zero', async (t) => {
  // lib/runtime/src/pipeline/network/codec/two_part.rs@5b7cf2be, TwoPartCodec::encode: u64 BE
  // header length, u64 BE body length, u64 BE xxh3_64(header ‖ body), header, body. The checksum
  // values are XXH3-64 with seed 0 from an independent implementation (@node-rs/xxhash); that of
  // no bytes, 2d06800538d394c2, is xxHash's published value.
  const golden = Buffer.concat([hex('0000000000000007 0000000000000003 283fe4e674a57b49'), txt('{"a":1}'), txt('xyz')])
  t.same([...encodeTwoPart(txt('{"a":1}'), txt('xyz'))], [...golden])
  t.same([...encodeTwoPart(Buffer.alloc(0), Buffer.alloc(0))], [...hex('0000000000000000 0000000000000000 2d06800538d394c2')])
  // a header-only control message, ControlMessage::Sentinel as serde_json writes it
  const sentinel = Buffer.concat([hex('000000000000000a 0000000000000000 3993296f71e74889'), txt('"sentinel"')])
  t.same([...encodeTwoPart(encodeControl('sentinel'), Buffer.alloc(0))], [...sentinel])
  // release builds write a zero checksum (two_part.rs@5448e69a): not checked
  const zero = Buffer.concat([hex('0000000000000000 0000000000000017 0000000000000000'), txt('{"complete_final":true}')])
  const d = new TwoPartDecoder()
  const got: TwoPartMessage[] = []
  bytewise(Buffer.concat([golden, sentinel, zero]), (c) => d.push(c, (m) => got.push({ header: Buffer.from(m.header), body: Buffer.from(m.body) })))
  t.same(
    got.map((m) => [m.header.toString(), m.body.toString()]),
    [
      ['{"a":1}', 'xyz'],
      ['"sentinel"', ''],
      ['', '{"complete_final":true}'],
    ],
  )
  t.equal(d.buffered, 0)
  const bad = Buffer.from(golden)
  bad.writeUInt8(bad.readUInt8(bad.length - 1) ^ 0xff, bad.length - 1)
  t.throws(() => new TwoPartDecoder().push(bad, () => undefined), { code: 'KVR_ERR_FRAME_MALFORMED' }, 'a checksum that does not match')
  t.throws(() => new TwoPartDecoder(1024).push(hex('0000000000000400 0000000000000000 0000000000000000'), () => undefined), { code: 'KVR_ERR_FRAME_TOO_LARGE' })
  t.throws(() => new TwoPartDecoder().push(hex('ffffffffffffffff 0000000000000000 0000000000000000'), () => undefined), { code: 'KVR_ERR_FRAME_TOO_LARGE' })
  t.throws(() => encodeTwoPart(Buffer.alloc(1000), Buffer.alloc(1), 1024), { code: 'KVR_ERR_FRAME_TOO_LARGE' })
})

t.test('the request control header and the data messages', async (t) => {
  // RequestControlMessage (egress/addressed_router.rs@00c47688, payload_codec from network.rs@0498dbf3) with a
  // TcpStreamConnectionInfo {address, subject, context, stream_type} written to a JSON string under
  // transport "tcp_server" (pipeline/network/tcp.rs, the stored copies with call-home streams)
  t.equal(
    encodeControlHeader({ id: 'r-1', codec: 'json', address: '127.0.0.1:4000', subject: 's-1' }).toString(),
    '{"id":"r-1","request_type":"single_in","response_type":"many_out","payload_codec":"json",' +
      '"connection_info":{"transport":"tcp_server","info":"{\\"address\\":\\"127.0.0.1:4000\\",\\"subject\\":\\"s-1\\",' +
      '\\"context\\":\\"r-1\\",\\"stream_type\\":\\"response\\"}"}}',
  )
  // NetworkStreamWrapper (network.rs@7feb2b81): data skipped when None
  t.same(unwrapData(txt('{"data":{"x":[1,2]},"complete_final":false}'), 'json'), { data: { x: [1, 2] }, final: false })
  t.same(unwrapData(txt('{"complete_final":true}'), 'json'), { data: undefined, final: true })
  const raw = unwrapJsonBytes(txt('{ "data" : {"Events":[{"worker_id":18446744073709551615}]} , "complete_final":false}'))
  t.equal(raw.data?.toString(), '{"Events":[{"worker_id":18446744073709551615}]}', 'the item as the worker wrote it')
  t.equal(unwrapJsonBytes(txt('{"complete_final":true}')).data, undefined)
  t.throws(() => unwrapData(txt('{"data":1}'), 'json'), { code: 'KVR_ERR_FRAME_MALFORMED' })
  t.throws(() => unwrapData(txt('{"data":'), 'json'), { code: 'KVR_ERR_FRAME_MALFORMED' })
  // named MessagePack (rmp-serde struct maps): fixmap 2, "data" 1, "complete_final" true
  const mp = Buffer.concat([hex('82 a4'), txt('data'), hex('01 ae'), txt('complete_final'), hex('c3')])
  t.same(unwrapData(mp, 'msgpack'), { data: 1, final: true })
  t.same(decodePayload(encodePayload({ worker_id: 18446744073709551615n }, 'msgpack'), 'msgpack'), { worker_id: 18446744073709551615n })
  t.equal(encodePayload({ worker_id: 18446744073709551615n }, 'json').toString(), '{"worker_id":18446744073709551615}')
})

t.test('instance addresses in both forms', async (t) => {
  t.same(parseInstanceAddress('10.0.0.5:9000/generate'), { host: '10.0.0.5', port: 9000, hostPort: '10.0.0.5:9000', endpointPath: 'generate' })
  const a = parseInstanceAddress('tcp://worker-1.svc:9000/1f2e/generate')
  t.same(a, { host: 'worker-1.svc', port: 9000, hostPort: 'worker-1.svc:9000', endpointPath: '1f2e/generate' })
  t.equal(siblingEndpoint(a, 'worker_kv_indexer_query_dp1').endpointPath, '1f2e/worker_kv_indexer_query_dp1')
  t.equal(siblingEndpoint(parseInstanceAddress('h:1/generate'), 'q').endpointPath, 'q')
  t.equal(parseInstanceAddress('[::1]:9000/generate').host, '::1')
  // an etcd instance record's transport (TransportType, snake_case: lib/runtime/src/component.rs@01207e79)
  t.equal(instanceTcpAddress({ transport: { tcp: '10.0.0.5:9000/1f2e/generate' } }), '10.0.0.5:9000/1f2e/generate')
  t.equal(instanceTcpAddress({ transport: { tcp: 'tcp://10.0.0.5:9000/generate' } }), '10.0.0.5:9000/generate')
  t.equal(instanceTcpAddress({ transport: { nats_tcp: 'subject' } }), null)
  t.equal(instanceTcpAddress({ http_url: 'http://h:1' }), null)
  t.throws(() => instanceTcpAddress({ transport: { tcp: 5 } }), { code: 'KVR_ERR_INSTANCE_ADDRESS' })
  t.throws(() => instanceTcpAddress({ transport: { tcp: 'h:1' } }), { code: 'KVR_ERR_INSTANCE_ADDRESS' })
  t.equal(toWorker(1n, { instance: { http_url: 'http://h:1', transport: { tcp: 'h:2/1/generate' } } })?.requestPlane, 'h:2/1/generate')
  const why: string[] = []
  const w = toWorker(1n, { instance: { http_url: 'http://h:1', transport: { tcp: 'h:2' } } }, undefined, (m) => why.push(m))
  t.equal(w?.requestPlane, null, 'an unreadable one is left out')
  t.match(why, [/no endpoint path/], 'and told, to be counted')
  for (const bad of ['10.0.0.5:9000', '10.0.0.5/generate', '10.0.0.5:0/g', '10.0.0.5:70000/g', 'h:1/', 'h:1/a/', ':1/g'])
    t.throws(() => parseInstanceAddress(bad), { code: 'KVR_ERR_INSTANCE_ADDRESS' }, bad)
})

t.test('the worker query: its request, and answers of every generation', async (t) => {
  t.equal(
    workerQueryJson({ workerId: 18446744073709551615n, dpRank: 1, start: 5n, end: null }),
    '{"worker_id":18446744073709551615,"dp_rank":1,"start_event_id":5,"end_event_id":null}',
  )
  const ev = '[{"worker_id":18446744073709551615,"event":{"event_id":3,"data":"cleared","dp_rank":0}}]'
  // v1 (lib/kv-router/src/indexer.rs, stored copy 51877232490): bare arrays
  const v1 = parseWorkerQueryAnswer(txt(`{"Events":${ev}}`))
  t.match(v1, { kind: 'Events', lastEventId: null })
  t.equal(v1.kind === 'Events' ? Buffer.from(v1.events).toString() : '', ev)
  t.match(parseWorkerQueryAnswer(txt('{"TreeDump":[]}')), { kind: 'TreeDump', lastEventId: null })
  // v2 (indexer.rs, stored copy 70140925883): {events, last_event_id}
  const v2 = parseWorkerQueryAnswer(txt(`{"TreeDump":{"events":${ev},"last_event_id":18446744073709551614}}`))
  t.match(v2, { kind: 'TreeDump', lastEventId: 18446744073709551614n })
  t.equal(v2.kind === 'TreeDump' ? Buffer.from(v2.events).toString() : '', ev)
  t.match(parseWorkerQueryAnswer(txt('{"Events":{"events":[],"last_event_id":4}}')), { kind: 'Events', lastEventId: 4n })
  t.same(parseWorkerQueryAnswer(txt('{"TooNew":{"requested_start":9,"requested_end":null,"newest_available":3}}')), { kind: 'TooNew', newest: 3n })
  t.match(parseWorkerQueryAnswer(txt('{"InvalidRange":{"start_id":5,"end_id":2}}')), { kind: 'refused', final: true, why: /InvalidRange \(5\.\.2\)/ })
  t.match(parseWorkerQueryAnswer(txt('{"Error":"no buffer"}')), { kind: 'refused', final: true, why: /no buffer/ })
  // v3 (indexer.rs, stored copy 57864009053) and later: ignored, and named so the caller counts it
  const v3 = parseWorkerQueryAnswer(txt('{"TreeDumpFailed":{"reason":"x"}}'))
  t.match(v3, { kind: 'refused', final: true, ignored: 'TreeDumpFailed' })
  t.match(parseWorkerQueryAnswer(txt('"Status"')), { kind: 'refused' })
  for (const bad of ['nope', '{"Events":5}', '{"Events":{"events":7}}', '{"Events":{"events":[],"last_event_id":-1}}', '{"TooNew":{}}', '{}'])
    t.match(parseWorkerQueryAnswer(txt(bad)), { kind: 'refused', final: true }, bad)
  t.notOk(isKvrError(v3))
})
