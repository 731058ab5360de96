// `kv-router mocker --dynamo` against a real etcd, real ZMQ and TCP sockets, with the test playing
// the Dynamo frontend by hand (test/helpers/dynamo-frontend.ts): the records each engine writes
// under its lease (keys and JSON compared with goldens transcribed from Dynamo's source), its KV
// events on the event plane, a full request (ACK, handshake, prologue, items, final marker,
// sentinel) in both payload codecs, stop and kill, overload refusals, the worker query's answers,
// the flags, and the lease revoked at shutdown.
import t from 'tap'
import { Etcd3 } from 'etcd3'
import { Unpackr, pack } from 'msgpackr'
import { Subscriber } from 'zeromq'
import { startEtcd } from '../../../src/deploy/services.js'
import { parseJsonExact } from '../../../src/codec/json.js'
import { OUTPUT_TOKEN_BASE } from '../../../src/sim/mocker/engine.js'
import { WORDS } from '../../../src/sim/mocker/server.js'
import { MockerFleet } from '../../../src/sim/mocker/fleet.js'
import type { MockerWorker } from '../../../src/sim/mocker/fleet.js'
import { MockerArgError, parseMockerArgs } from '../../../src/sim/mocker/main.js'
import { CallHomeServer, RequestConnection, requestFrame, requestPayload } from '../../helpers/dynamo-frontend.js'
import type { CallHome } from '../../helpers/dynamo-frontend.js'
import { waitUntil } from '../../helpers/wait.js'
import { runCli } from '../../helpers/cli.js'

const BS = 4
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' })

t.test('mocker --dynamo: records, event plane, request plane, worker query', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const fleet = await MockerFleet.start({
    numWorkers: 2,
    blockSize: BS,
    numGpuBlocks: 4096,
    maxNumBatchedTokens: 4096,
    speedupRatio: 20,
    etcdUrl: etcd.url,
    modelName: 'mock-model',
    loadIntervalMs: 100,
    dynamo: { maxInflight: 2 },
  })
  let closed = false
  t.teardown(() => (closed ? undefined : fleet.close()))
  const [w0, w1] = fleet.workers as [MockerWorker, MockerWorker]
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const fe = new CallHomeServer()
  await fe.listen()
  t.teardown(() => fe.close())
  const hp = fleet.requestPlaneAddress
  t.match(hp, /^127\.0\.0\.1:\d+$/, 'one request-plane listener for the process')

  await t.test('records under each lease, as Dynamo writes them', async (t) => {
    const all = await client.getAll().prefix('v1/').strings()
    t.equal(Object.keys(all).length, 10, 'five records per engine')
    for (const w of [w0, w1]) {
      const d = w.dynamo
      if (d === null) throw new Error('no Dynamo worker')
      const id = w.workerId
      const x = id.toString(16)
      t.equal(d.instanceId, id, 'instance id = lease id = worker id')
      const kv = d.kvEvents.channel
      const metrics = (d.load as NonNullable<typeof d.load>).channel
      t.match(kv.endpoint, /^tcp:\/\/127\.0\.0\.1:\d+$/)
      t.not(kv.endpoint, metrics.endpoint, 'one PUB socket per publisher')
      // DiscoveryInstance is #[serde(tag = "type")]; Endpoint wraps Instance {component, endpoint,
      // namespace, instance_id, transport} (lib/runtime/src/discovery/mod.rs@5f4d5bb8,
      // lib/runtime/src/component.rs@1d1f3409); TransportType snake_case, the TCP address
      // "host:port/{instance_id:x}/{endpoint}" (lib/runtime/src/component/endpoint.rs stored copy
      // 57614190630, build_transport_type; the same path is the routing key of
      // ingress/shared_tcp_endpoint.rs@19854ec1); keys v1/instances|mdc/{ns}/{comp}/{endpoint}/{id:x}
      // (lib/runtime/src/discovery/kv_store.rs@020f5c17)
      const golden: Record<string, string> = {
        [`v1/instances/dynamo/backend/generate/${x}`]:
          `{"type":"Endpoint","component":"backend","endpoint":"generate","namespace":"dynamo","instance_id":${id},` +
          `"transport":{"tcp":"${hp}/${x}/generate"}}`,
        [`v1/instances/dynamo/backend/worker_kv_indexer_query_dp0/${x}`]:
          `{"type":"Endpoint","component":"backend","endpoint":"worker_kv_indexer_query_dp0","namespace":"dynamo","instance_id":${id},` +
          `"transport":{"tcp":"${hp}/${x}/worker_kv_indexer_query_dp0"}}`,
        // DiscoveryInstance::Model {namespace, component, endpoint, instance_id, card_json,
        // model_suffix (skipped when None)} (discovery/mod.rs@5f4d5bb8); the card's display_name,
        // kv_cache_block_size and runtime_config (ModelRuntimeConfig {total_kv_blocks, max_num_seqs,
        // max_num_batched_tokens, data_parallel_size}, lib/llm/src/local_model/runtime_config.rs@59bcf4dd;
        // data_parallel_start_rank and enable_local_indexer in later versions, which routers read
        // before they query a worker)
        [`v1/mdc/dynamo/backend/generate/${x}`]:
          `{"type":"Model","namespace":"dynamo","component":"backend","endpoint":"generate","instance_id":${id},"card_json":` +
          `{"display_name":"mock-model","kv_cache_block_size":${BS},"runtime_config":{"total_kv_blocks":4096,"max_num_seqs":256,` +
          `"max_num_batched_tokens":4096,"data_parallel_size":1,"data_parallel_start_rank":0,"enable_local_indexer":true}}}`,
        // endpoint-scoped EventChannel: EventScope #[serde(tag = "kind", rename_all = "snake_case")],
        // EventTransport #[serde(tag = "kind", content = "config")], instance_id = publisher_id;
        // key v1/event_channels/namespace/{ns}/component/{c}/endpoint/{e}/topic/{t}/{publisher_id:x}
        // (lib/runtime/src/discovery/mod.rs@020f5c17, kv_store.rs@020f5c17)
        [`v1/event_channels/namespace/dynamo/component/backend/endpoint/generate/topic/kv-events/${kv.publisherId.toString(16)}`]:
          `{"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace":"dynamo","component":"backend","name":"generate"}},` +
          `"topic":"kv-events","instance_id":${kv.publisherId},"transport":{"kind":"Zmq","config":{"endpoint":"${kv.endpoint}"}}}`,
        [`v1/event_channels/namespace/dynamo/component/backend/endpoint/generate/topic/kv_metrics/${metrics.publisherId.toString(16)}`]:
          `{"type":"EventChannel","scope":{"kind":"endpoint","endpoint":{"namespace":"dynamo","component":"backend","name":"generate"}},` +
          `"topic":"kv_metrics","instance_id":${metrics.publisherId},"transport":{"kind":"Zmq","config":{"endpoint":"${metrics.endpoint}"}}}`,
      }
      for (const [k, v] of Object.entries(golden)) t.equal(all[k], v, k)
      const leased = await client.getAll().prefix('v1/').keys()
      t.ok(leased.length >= 5)
      const lease = await client.get(`v1/instances/dynamo/backend/generate/${x}`).exec()
      t.equal(BigInt(lease.kvs[0]?.lease ?? '0'), id, 'written under the lease whose id it names')
    }
  })

  const generate = (w: MockerWorker, conn: RequestConnection, tokens: number[], maxTokens: number, codec: 'json' | 'msgpack' | null = null) => {
    const body = { model: 'mock-model', token_ids: tokens, stop_conditions: { max_tokens: maxTokens }, sampling_options: {}, eos_token_ids: [] }
    const enc = codec === 'msgpack' ? pack(body) : Buffer.from(JSON.stringify(body))
    const r = requestPayload(fe.address, enc, codec)
    conn.send(requestFrame(`${w.workerId.toString(16)}/generate`, { 'request-id': r.id }, r.payload))
    return r
  }
  const streamOf = async (subject: string): Promise<CallHome> => {
    await waitUntil(`the call-home of ${subject}`, () => fe.bySubject(subject) !== undefined)
    return fe.bySubject(subject) as CallHome
  }
  const headerText = (m: { header: Buffer } | undefined) => m?.header.toString('utf8')

  await t.test('KV events of a served request arrive on the event plane in order', async (t) => {
    const d = w0.dynamo as NonNullable<MockerWorker['dynamo']>
    const sub = new Subscriber({ linger: 0 })
    t.teardown(() => sub.close())
    sub.connect(d.kvEvents.channel.endpoint)
    sub.subscribe('kv-events')
    const got: Buffer[][] = []
    void (async () => {
      try {
        for await (const f of sub) got.push(f)
      } catch {
        // closed
      }
    })()
    // the subscription takes effect after a while: requests on the engine itself until one arrives
    let n = 0
    await waitUntil('a first event', async () => {
      w0.engine.submit([9000 + n++, 1, 2, 3, 4], 1)
      await new Promise((r) => setTimeout(r, 20))
      return got.length > 0
    })
    await waitUntil('the engine idle', () => w0.engine.runningCount === 0 && w0.engine.waitingCount === 0)
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    const r = generate(w0, conn, [1, 2, 3, 4, 5, 6, 7, 8, 9], 8)
    const s = await streamOf(r.subject)
    await waitUntil('the stream end', () => s.ended)
    const newest = w0.engine.ring.newestId
    await waitUntil('every event', () => lastEventId(got) === newest)
    const first = ((got[0] as Buffer[])[2] as Buffer).readBigUInt64BE(0)
    for (let i = 0; i < got.length; i++) {
      const [topic, pid, seq, frame] = got[i] as [Buffer, Buffer, Buffer, Buffer]
      t.equal(topic.toString(), 'kv-events')
      t.equal(pid.readBigUInt64BE(0), d.kvEvents.channel.publisherId)
      t.equal(seq.readBigUInt64BE(0), first + BigInt(i), 'sequences without gaps')
      const env = unpackr.unpack(frame.subarray(5)) as { payload: Uint8Array; topic: string }
      t.equal(env.topic, 'kv-events')
      const ev = unpackr.unpack(env.payload) as { worker_id: bigint | number; storage_tier: string; event: { event_id: bigint | number; data: unknown } }
      t.equal(BigInt(ev.worker_id), w0.workerId, 'worker_id = the lease id')
      const id = BigInt(ev.event.event_id)
      const ringEv = w0.engine.ring.range(id, id)[0]
      t.ok(ringEv !== undefined)
      const data = ev.event.data as { stored?: { blocks: { block_hash: bigint | number }[] }; removed?: unknown }
      const rd = ringEv?.event.data
      if (rd !== undefined && rd !== 'cleared' && 'stored' in rd)
        t.same(
          data.stored?.blocks.map((b) => BigInt(b.block_hash)),
          rd.stored.blocks.map((b) => b.block_hash),
          `event ${id}: the pool's stored blocks`,
        )
      else t.ok(data.removed !== undefined, `event ${id}: removed`)
    }
  })

  await t.test('a full request: ACK, handshake, prologue, items, final marker, sentinel (JSON and MessagePack)', async (t) => {
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    for (const codec of [null, 'msgpack'] as const) {
      const r = generate(w1, conn, [11, 12, 13, 14, 15, 16, 17], 5, codec)
      await waitUntil('the ACK', () => conn.replies.length > 0)
      t.same(conn.replies.shift(), Buffer.from([0, 0, 0, 0]), 'ACK: u32 0')
      const s = await streamOf(r.subject)
      await waitUntil('the stream end', () => s.ended)
      const m = s.messages
      t.equal(m.length, 1 + 1 + 5 + 1 + 1, 'handshake, prologue, 5 items, final, sentinel')
      // CallHomeHandshake {subject, stream_type} and the prologue ResponseStreamPrologue {error},
      // header-only JSON (lib/runtime/src/pipeline/network/tcp/client.rs@5b7cf2be)
      t.equal(headerText(m[0]), `{"subject":"${r.subject}","stream_type":"response"}`)
      t.equal(m[0]?.body.length, 0)
      t.equal(headerText(m[1]), '{"error":null}')
      for (let k = 0; k < 5; k++) {
        const item = m[2 + k] as { header: Buffer; body: Buffer }
        t.equal(item.header.length, 0, 'items are body-only')
        const last = k === 4
        // NetworkStreamWrapper {data, complete_final} around Annotated<LLMEngineOutput>
        // (protocols/annotated.rs@031f90c2; protocols/common/llm_backend.rs@07d14345); the last
        // with completion_usage, an OpenAI CompletionUsage, after index (LLMEngineOutput's last
        // field, skipped when None: llm_backend.rs@2441f5b6): 7 prompt tokens, the second
        // request's first block (4 tokens) cached
        const tok = OUTPUT_TOKEN_BASE + k
        const cached = codec === null ? 0 : 4
        const usage = `,"completion_usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":${cached}}}`
        if (codec === null) {
          t.equal(
            item.body.toString(),
            `{"data":{"data":{"token_ids":[${tok}],"tokens":null,"text":${JSON.stringify(WORDS[k])},"cum_log_probs":null,"log_probs":null,` +
              `"top_logprobs":null,"finish_reason":${last ? '"length"' : 'null'},"index":null${last ? usage : ''}}},"complete_final":false}`,
          )
        } else {
          t.same(unpackr.unpack(item.body), {
            data: {
              data: {
                token_ids: [tok],
                tokens: null,
                text: WORDS[k],
                cum_log_probs: null,
                log_probs: null,
                top_logprobs: null,
                finish_reason: last ? 'length' : null,
                index: null,
                ...(last
                  ? { completion_usage: { prompt_tokens: 7, completion_tokens: 5, total_tokens: 12, prompt_tokens_details: { cached_tokens: cached } } }
                  : {}),
              },
            },
            complete_final: false,
          })
        }
      }
      const fin = m[7] as { header: Buffer; body: Buffer }
      if (codec === null) t.equal(fin.body.toString(), '{"data":null,"complete_final":true}', 'the clean end (push_handler)')
      else t.same(unpackr.unpack(fin.body), { data: null, complete_final: true })
      t.equal(headerText(m[8]), '"sentinel"', 'ControlMessage::Sentinel, snake_case')
      t.equal(m[8]?.body.length, 0)
    }
    // a request the engine cannot take fails in the prologue, then the sentinel (no items, no final)
    for (const [tokens, why] of [
      [[1, 'x', 3], /^\{"error":"token_ids\[1\] is x; token ids are integers/],
      [[], /^\{"error":"the prompt is empty"\}$/],
    ] as const) {
      const r = generate(w1, conn, tokens as unknown as number[], 3)
      const s = await streamOf(r.subject)
      await waitUntil('the stream end', () => s.ended)
      t.equal(s.messages.length, 3, 'handshake, prologue, sentinel')
      t.match(headerText(s.messages[1]), why)
      t.equal(headerText(s.messages[2]), '"sentinel"')
    }
    await waitUntil('blocks released', () => w1.engine.activeBlocks === 0)
    t.equal(w1.dynamo?.gate.inflight, 0, 'nothing left in flight')
    t.equal(w1.dynamo?.generate.refused, 2)
  })

  await t.test('stop and kill from the frontend end the request and free its blocks', async (t) => {
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    for (const word of ['stop', 'kill'] as const) {
      const r = generate(w1, conn, [21, 22, 23, 24, 25, 26, 27, 28], 3000)
      const s = await streamOf(r.subject)
      await waitUntil('3 items', () => s.messages.length >= 5)
      t.ok(w1.engine.activeBlocks > 0, 'the request holds blocks')
      s.control(word)
      await waitUntil('the stream end', () => s.ended)
      const last = s.messages.at(-1)
      t.equal(headerText(last), '"sentinel"', `${word}: the stream closes with the sentinel`)
      const items = s.messages.slice(2, -1).filter((m) => m.body.length > 0)
      const finals = items.filter((m) => m.body.toString() === '{"data":null,"complete_final":true}')
      t.equal(finals.length, word === 'stop' ? 1 : 0, `${word}: ${word === 'stop' ? 'ends cleanly' : 'cuts the writer'}`)
      t.ok(items.length < 3000, `${word}: generation stopped early (${items.length} items)`)
      await waitUntil('blocks freed', () => w1.engine.activeBlocks === 0 && w1.engine.runningCount === 0)
    }
    t.equal(w1.dynamo?.generate.cancelled, 2)
    t.equal(w1.dynamo?.gate.inflight, 0)
  })

  await t.test('over the in-flight limit: Server overloaded, and unknown endpoints', async (t) => {
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    const rs = [0, 1, 2].map((i) => generate(w1, conn, [31 + i, 32, 33, 34, 35], 3000))
    await waitUntil('3 replies', () => conn.replies.length >= 3)
    t.same(conn.replies[0], Buffer.from([0, 0, 0, 0]))
    t.same(conn.replies[1], Buffer.from([0, 0, 0, 0]))
    const refusal = conn.replies[2] as Buffer
    t.equal(refusal.readUInt32BE(0), refusal.length - 4, 'u32 BE length, then the text')
    t.match(refusal.subarray(4).toString(), /^Server overloaded: 2 requests in flight/, 'the limit is 2 per engine')
    t.equal(w0.dynamo?.gate.inflight, 0, 'another engine is not affected')
    const other = generate(w0, conn, [41, 42, 43, 44], 2)
    await waitUntil('4 replies', () => conn.replies.length >= 4)
    t.same(conn.replies[3], Buffer.from([0, 0, 0, 0]), "the other engine's request is taken")
    await waitUntil('its end', () => fe.bySubject(other.subject)?.ended === true)
    const bad = requestPayload(fe.address, Buffer.from('{}'), null)
    conn.send(requestFrame('ffff/generate', {}, bad.payload))
    await waitUntil('5 replies', () => conn.replies.length >= 5)
    t.equal(conn.replies[4]?.subarray(4).toString(), 'Unknown endpoint: ffff/generate')
    for (const r of rs.slice(0, 2)) (await streamOf(r.subject)).control('kill')
    await waitUntil('freed', () => w1.dynamo?.gate.inflight === 0 && w1.engine.activeBlocks === 0)
    t.equal(fleet.requestPlaneCounters?.overloaded, 1)
    t.equal(fleet.requestPlaneCounters?.unknownEndpoint, 1)
    const stats = (await (await fetch(`${w1.url}/stats`)).json()) as { dynamo: { request_plane: { overloaded: number }; generate: { cancelled: number } } }
    t.equal(stats.dynamo.request_plane.overloaded, 1, '/stats counts the refusal')
    t.equal(stats.dynamo.generate.cancelled, 4, '/stats counts the cancelled requests')
  })

  await t.test('the worker query answers from the event ring', async (t) => {
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    const ring = w1.engine.ring
    const newest = ring.newestId
    t.ok(newest > 3n, 'the engine has events')
    const ask = async (q: Record<string, unknown>, codec: 'json' | 'msgpack' | null = null): Promise<{ text: string; value: unknown }> => {
      const body = codec === 'msgpack' ? pack(q) : Buffer.from(JSON.stringify(q, (_k, v: unknown) => (typeof v === 'bigint' ? Number(v) : v)))
      const r = requestPayload(fe.address, body, codec)
      conn.send(requestFrame(`${w1.workerId.toString(16)}/worker_kv_indexer_query_dp0`, {}, r.payload))
      const s = await streamOf(r.subject)
      await waitUntil('the answer', () => s.ended)
      t.equal(s.messages.length, 5, 'handshake, prologue, one item, final, sentinel')
      const item = s.messages[2]?.body as Buffer
      if (codec === 'msgpack') return { text: '', value: (unpackr.unpack(item) as { data: unknown }).data }
      const text = item.toString()
      t.ok(text.startsWith('{"data":{"') && text.endsWith('},"complete_final":false}'), 'not Annotated: the response itself in data')
      return { text: text.slice(8, -24), value: (parseJsonExact(text) as { data: unknown }).data }
    }
    const wid = w1.workerId
    // WorkerKvQueryResponse, externally tagged; Events/TreeDump carry last_event_id
    // (lib/kv-router/src/indexer.rs, stored copy 70140925883); which is sent when:
    // LocalKvIndexer::get_events_in_id_range (lib/kv-router/src/indexer/local.rs, stored copy 51766346333)
    const dump = await ask({ worker_id: wid.toString(), dp_rank: 0, start_event_id: null, end_event_id: null })
    const td = (dump.value as { TreeDump: { events: unknown[]; last_event_id: bigint | number } }).TreeDump
    t.equal(BigInt(td.last_event_id), newest, 'start null: a tree dump up to the newest event')
    t.equal(td.events.length, ring.treeDump().length)
    t.match(dump.text, /^\{"TreeDump":\{"events":\[/)

    const ev = await ask({ worker_id: wid.toString(), dp_rank: 0, start_event_id: 2, end_event_id: 3 })
    const evs = (ev.value as { Events: { events: { event: { event_id: bigint | number } }[]; last_event_id: bigint | number } }).Events
    t.same(
      evs.events.map((e) => BigInt(e.event.event_id)),
      Array.from({ length: Number(newest) - 1 }, (_, i) => BigInt(i + 2)),
      'Events from the start through the newest buffered event',
    )
    t.equal(BigInt(evs.last_event_id), newest)
    const e2 = ring.range(2n, 2n)[0]
    if (e2 !== undefined && e2.event.data !== 'cleared' && 'stored' in e2.event.data) {
      const st = e2.event.data.stored
      const blocksJson = st.blocks.map((b) => `{"block_hash":${b.block_hash},"tokens_hash":${b.tokens_hash},"mm_extra_info":null}`).join(',')
      // RouterEvent in serde_json: worker_id, storage_tier, event {event_id, data, dp_rank}
      t.ok(
        ev.text.includes(
          `{"worker_id":${wid},"storage_tier":"device","event":{"event_id":2,"data":{"stored":{"parent_hash":${st.parent_hash ?? 'null'},` +
            `"start_position":null,"blocks":[${blocksJson}]}},` +
            `"dp_rank":0}}`,
        ),
        'event 2 as serde_json writes it',
      )
    }
    const mp = await ask({ worker_id: wid, dp_rank: 0, start_event_id: newest, end_event_id: null }, 'msgpack')
    t.same(
      (mp.value as { Events: { last_event_id: bigint | number } }).Events.last_event_id,
      newest <= 0xffffffffn ? Number(newest) : newest,
      'MessagePack query',
    )
    const tooNew = await ask({ worker_id: wid.toString(), dp_rank: 0, start_event_id: Number(newest) + 5, end_event_id: null })
    t.equal(
      tooNew.text,
      `{"TooNew":{"requested_start":${newest + 5n},"requested_end":${newest},"newest_available":${newest}}}`,
      'TooNew: requested_end defaults to the newest',
    )
    const inv = await ask({ worker_id: wid.toString(), dp_rank: 0, start_event_id: 5, end_event_id: 2 })
    t.equal(inv.text, '{"InvalidRange":{"start_id":5,"end_id":2}}')
    const wrong = await ask({ worker_id: '1', dp_rank: 0, start_event_id: 1, end_event_id: null })
    t.match(wrong.text, /^\{"Error":"worker 1 rank 0 is not served here/)
  })

  await t.test('shutdown revokes the leases: the records go at once, open streams are cut', async (t) => {
    const conn = await RequestConnection.open(hp)
    t.teardown(() => conn.close())
    const r = generate(w0, conn, [51, 52, 53, 54, 55], 3000)
    const s = await streamOf(r.subject)
    await waitUntil('2 items', () => s.messages.length >= 4)
    await fleet.close()
    closed = true
    await waitUntil('the cut stream', () => s.ended)
    t.not(headerText(s.messages.at(-1)), '"sentinel"', 'cut, not ended: the frontend sees the stream break')
    const left = await client.getAll().prefix('v1/').keys()
    t.same(left, [], 'no record left')
  })
})

function lastEventId(got: Buffer[][]): bigint {
  const last = got.at(-1)
  if (last === undefined) return -1n
  const env = unpackr.unpack((last[3] as Buffer).subarray(5)) as { payload: Uint8Array }
  const ev = unpackr.unpack(env.payload) as { event: { event_id: bigint | number } }
  return BigInt(ev.event.event_id)
}

t.test('--dynamo flags', async (t) => {
  const cli = parseMockerArgs(['--dynamo', '--etcd-url', 'http://127.0.0.1:2379', '--dynamo-event-channels', 'component', '--dynamo-max-inflight', '7'])
  if (cli === 'help') throw new Error('help')
  t.same(cli.fleet.dynamo, { eventChannels: 'component', maxInflight: 7 })
  t.notOk('dynamoMode' in cli.fleet, 'the flag becomes the fleet option, nothing else')
  const fault = parseMockerArgs(['--dynamo', '--etcd-url', 'http://127.0.0.1:2379', '--dynamo-drop-kv-events', '20:3'])
  if (fault === 'help') throw new Error('help')
  t.same(fault.fleet.dynamo, { dropKvEvents: { from: 20n, count: 3 } })
  const plain = parseMockerArgs(['--dynamo', '--etcd-url', 'http://127.0.0.1:2379'])
  if (plain === 'help') throw new Error('help')
  t.same(plain.fleet.dynamo, {})
  for (const [args, msg] of [
    [['--dynamo'], /--dynamo needs --etcd-url/],
    [['--dynamo', '--etcd-url', 'http://h:1', '--nats-url', 'nats://h:2'], /cannot be combined with --nats-url/],
    [['--dynamo-event-channels', 'endpoint'], /only used with --dynamo/],
    [['--dynamo-max-inflight', '3'], /only used with --dynamo/],
    [['--dynamo-drop-kv-events', '1:1'], /only used with --dynamo/],
    [['--dynamo', '--etcd-url', 'http://h:1', '--dynamo-drop-kv-events', '5'], /--dynamo-drop-kv-events must be FROM:COUNT/],
    [['--dynamo', '--etcd-url', 'http://h:1', '--dynamo-drop-kv-events', '5:0'], /--dynamo-drop-kv-events must be FROM:COUNT/],
    [['--dynamo', '--etcd-url', 'http://h:1', '--dynamo-event-channels', 'namespace'], /--dynamo-event-channels/],
    [['--dynamo=yes'], /--dynamo takes no value/],
  ] as const) {
    t.throws(() => parseMockerArgs([...args]), { constructor: MockerArgError, message: msg }, args.join(' '))
  }
})

t.test('--dynamo-event-channels component: the earlier, component-scoped records', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const fleet = await MockerFleet.start({
    numWorkers: 1,
    blockSize: BS,
    numGpuBlocks: 64,
    speedupRatio: 0,
    etcdUrl: etcd.url,
    dynamo: { eventChannels: 'component' },
  })
  t.teardown(() => fleet.close())
  const w = fleet.workers[0] as MockerWorker
  const d = w.dynamo as NonNullable<MockerWorker['dynamo']>
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const all = await client.getAll().prefix('v1/event_channels/').strings()
  const x = w.workerId.toString(16)
  // Gen-A: key v1/event_channels/{ns}/{component}/{topic}/{instance_id:x} (kv_store.rs, stored copy
  // 55160189784, event_channel_key); value {"type":"EventChannel", namespace, component, topic,
  // instance_id, transport} (lib/runtime/src/discovery/mod.rs, stored copy 2716126320)
  t.same(all, {
    [`v1/event_channels/dynamo/backend/kv-events/${x}`]:
      `{"type":"EventChannel","namespace":"dynamo","component":"backend","topic":"kv-events","instance_id":${w.workerId},` +
      `"transport":{"kind":"Zmq","config":{"endpoint":"${d.kvEvents.channel.endpoint}"}}}`,
    [`v1/event_channels/dynamo/backend/kv_metrics/${x}`]:
      `{"type":"EventChannel","namespace":"dynamo","component":"backend","topic":"kv_metrics","instance_id":${w.workerId},` +
      `"transport":{"kind":"Zmq","config":{"endpoint":"${d.load?.channel.endpoint}"}}}`,
  })
})

t.test('kv-router mocker --dynamo as a process: ready line, records, SIGTERM revokes', async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  const pr = runCli(['mocker', '--dynamo', '--etcd-url', etcd.url, '--num-workers', '2', '--block-size', '4', '--speedup-ratio', '0'])
  t.teardown(() => pr.p.kill('SIGKILL'))
  await waitUntil(`the ready line (${pr.err()})`, () => /kv-router mocker: ready 2 engine\(s\)/.test(pr.out()), 20_000)
  t.match(pr.err(), /registration and events: Dynamo \(etcd .*, ZMQ event plane, TCP request plane 127\.0\.0\.1:\d+\)/)
  const client = new Etcd3({ hosts: etcd.url })
  t.teardown(() => client.close())
  const keys = await client.getAll().prefix('v1/instances/dynamo/backend/').keys()
  t.equal(keys.filter((k) => k.includes('/generate/')).length, 2, 'two generate instances')
  t.equal(keys.filter((k) => k.includes('/worker_kv_indexer_query_dp0/')).length, 2, 'two worker query instances')
  pr.p.kill('SIGTERM')
  t.equal(await pr.exited, 0)
  t.same(await client.getAll().prefix('v1/').keys(), [], 'the leases are revoked on SIGTERM')
})
