// Process level: `kv-router serve --etcd-url` in front of an unchanged Dynamo fleet, here a
// `kv-router mocker --dynamo` process with two engines that register only a TCP request-plane
// address in etcd (no HTTP URL) and publish KV events on the ZMQ event plane. Driven by the
// official openai client: completions and chat, streamed and not, answered over the request
// plane; a repeated prompt goes to the engine that cached it, which reports the cached tokens;
// an overloaded engine's request goes to the other, and with both full the client gets 503 with
// Retry-After; a client that leaves mid-stream stops the stream on its engine and frees the
// router's booking; a worker whose request plane refuses connections is failed over and
// suspended, and leaves with its etcd record.
import t from 'tap'
import OpenAI from 'openai'
import { Etcd3 } from 'etcd3'
import { getFreePort, startEtcd } from '../../src/deploy/services.js'
import { runCli, waitForOutput } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'
import { waitUntil } from '../helpers/wait.js'

const MODEL = 'mock-model'
const WORDS = 'the cache is warm and the router knows it.'

const etcd = await startEtcd()
t.teardown(() => etcd.stop())

const stop = (c: CliProcess) => async (): Promise<void> => {
  c.p.kill('SIGTERM')
  await c.exited
}
// one request in flight per engine: a second is refused "Server overloaded"
const mocker = runCli([
  'mocker',
  '--dynamo',
  '--etcd-url',
  etcd.url,
  '--num-workers',
  '2',
  '--block-size',
  '4',
  '--model-name',
  MODEL,
  '--dynamo-max-inflight',
  '1',
  // real time: the long streams of the overload test outlast it on a loaded machine
  '--speedup-ratio',
  '1',
])
t.teardown(stop(mocker))
const ready = await waitForOutput(mocker, /kv-router mocker: ready 2 engine\(s\) (http:\/\/\S+) (http:\/\/\S+)\n/)
if (ready === null) throw new Error(`the mocker did not start: ${mocker.err()}`)
const engineUrls = [ready[1] as string, ready[2] as string]

const router = runCli([
  'serve',
  '--etcd-url',
  etcd.url,
  '--http-host',
  '127.0.0.1',
  '--http-port',
  '0',
  '--router-block-size',
  '4',
  '--tokenizer',
  'bytes',
  '--router-event-threads',
  '1',
  '--router-session-affinity-ttl-secs',
  '60',
])
t.teardown(stop(router))
const listening = await waitForOutput(router, /listening on (http:\/\/[^ ]+)/)
if (listening === null) throw new Error(`the router did not start: ${router.err()}`)
const base = listening[1] as string
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0 })

interface EngineStats {
  worker_id: string
  dynamo: { inflight: number; generate: { served: number; cancelled: number }; request_plane: { overloaded: number; msgpack: number } }
}
const stats = async (url: string): Promise<EngineStats> => (await (await fetch(`${url}/stats`)).json()) as EngineStats
const engineOf = new Map<string, string>()
for (const u of engineUrls) engineOf.set((await stats(u)).worker_id, u)

interface Listed {
  workers: { id_str: string; url: string; request_plane: string | null; health: string; block_size: number; ranks: { in_flight: number }[] }[]
}
const workers = async (): Promise<Listed['workers']> => ((await (await fetch(`${base}/v1/workers`)).json()) as Listed).workers
const inFlight = async (): Promise<number> => (await workers()).reduce((n, w) => n + w.ranks.reduce((m, r) => m + r.in_flight, 0), 0)
await waitUntil('both engines registered from etcd', async () => (await workers()).length === 2, 15_000)

type WithNvext = { nvext: { worker_id: { decode_worker_id_str: string; decode_dp_rank: number } } }
type Usage = { usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } } }

t.test('the engines are registered from their request-plane records, never probed over HTTP', async (t) => {
  const ws = await workers()
  t.same(ws.map((w) => w.id_str).sort(), [...engineOf.keys()].sort(), 'the worker ids are the engines')
  for (const w of ws) {
    t.equal(w.url, '', 'no HTTP URL')
    t.match(w.request_plane, new RegExp(`^[0-9.]+:\\d+/${BigInt(w.id_str).toString(16)}/generate$`), 'its request-plane address, shown')
    t.equal(w.block_size, 4, "the block size from the engine's model card")
    t.equal(w.health, 'healthy')
  }
})

const PROMPT = 'You are a helpful assistant. Answer briefly and precisely. The question follows: what is a KV cache?'

t.test('completions over the request plane; a repeated prompt goes where it is cached', async (t) => {
  const a = (await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 3 })) as OpenAI.Completion & WithNvext & Usage
  t.equal(a.choices[0]?.text, 'the cache is', "the engine's words")
  t.equal(a.choices[0]?.finish_reason, 'length')
  t.equal(a.object, 'text_completion')
  t.equal(a.model, MODEL)
  t.equal(a.usage.prompt_tokens, Buffer.byteLength(PROMPT), 'each byte a token')
  t.equal(a.usage.completion_tokens, 3)
  const first = a.nvext.worker_id.decode_worker_id_str
  t.ok(engineOf.has(first), 'nvext.worker_id names an engine')
  // the engine's KV events reach the router over the ZMQ event plane; then the prompt goes where it is cached
  let cached = 0
  let same = false
  for (let i = 0; i < 40 && cached === 0; i++) {
    await new Promise((r) => setTimeout(r, 50))
    const b = (await client.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 1 })) as typeof a
    cached = b.usage.prompt_tokens_details?.cached_tokens ?? 0
    same = b.nvext.worker_id.decode_worker_id_str === first
  }
  t.equal(cached, Math.floor(Buffer.byteLength(PROMPT) / 4) * 4, 'every complete block was a hit')
  t.ok(same, 'routed to the engine holding the prefix')
  const served = (await stats(engineOf.get(first) as string)).dynamo.generate.served
  t.ok(served >= 2, `the engine served both (${served})`)
})

t.test('completions streamed, chat unary and streamed', async (t) => {
  const s = await client.completions.create({ model: MODEL, prompt: 'Stream a completion.', max_tokens: 4, stream: true })
  let text = ''
  let n = 0
  let worker: unknown
  for await (const chunk of s) {
    if (n++ === 0) worker = (chunk as unknown as Partial<WithNvext>).nvext?.worker_id.decode_worker_id_str
    text += chunk.choices[0]?.text ?? ''
  }
  t.equal(text, 'the cache is warm')
  t.equal(n, 4, 'one event per token')
  t.ok(engineOf.has(worker as string), 'the first event carries nvext.worker_id')

  const c = (await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'Hello there, how are you?' }],
    max_tokens: 2,
  })) as OpenAI.ChatCompletion & WithNvext
  t.equal(c.choices[0]?.message.content, 'the cache')
  t.equal(c.choices[0]?.message.role, 'assistant')
  t.ok(engineOf.has(c.nvext.worker_id.decode_worker_id_str))

  const cs = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'Stream to me please.' }],
    max_tokens: 5,
    stream: true,
    stream_options: { include_usage: true },
  })
  let chat = ''
  let usage: OpenAI.CompletionUsage | null | undefined
  for await (const chunk of cs) {
    chat += chunk.choices[0]?.delta?.content ?? ''
    if (chunk.usage != null) usage = chunk.usage
  }
  t.equal(chat, WORDS.split(/(?= )/).slice(0, 5).join(''))
  t.equal(usage?.completion_tokens, 5, 'the usage chunk')
  t.equal(await inFlight(), 0, 'every booking freed')
})

t.test('overload: refused by a full engine, served by the other; both full: 503 with Retry-After', async (t) => {
  // the session binds the engine its first request went to; its next requests go there first
  const session = { headers: { 'x-dynamo-session-id': 'overload' } }
  const bound = (await client.completions.create({ model: MODEL, prompt: 'Bind me.', max_tokens: 1 }, session)) as OpenAI.Completion & WithNvext
  const x = bound.nvext.worker_id.decode_worker_id_str
  const y = [...engineOf.keys()].find((id) => id !== x) as string
  // a long stream fills x's one slot
  const holdX = new AbortController()
  const long = await client.completions.create(
    { model: MODEL, prompt: 'Keep going for a long while.', max_tokens: 4000, stream: true },
    { ...session, signal: holdX.signal },
  )
  const itX = long[Symbol.asyncIterator]()
  const firstX = (await itX.next()).value as unknown as WithNvext
  t.equal(firstX.nvext.worker_id.decode_worker_id_str, x, 'the long stream is on the bound engine')
  const refusedBefore = (await stats(engineOf.get(x) as string)).dynamo.request_plane.overloaded

  const b = (await client.completions.create({ model: MODEL, prompt: 'Bind me.', max_tokens: 1 }, session)) as OpenAI.Completion & WithNvext
  t.equal(b.nvext.worker_id.decode_worker_id_str, y, 'answered by the other engine')
  t.ok((await stats(engineOf.get(x) as string)).dynamo.request_plane.overloaded > refusedBefore, 'after a refusal as overloaded')

  // a second long stream fills y (on x it is refused and goes to y)
  const holdY = new AbortController()
  const long2 = await client.completions.create({ model: MODEL, prompt: 'And another long one.', max_tokens: 4000, stream: true }, { signal: holdY.signal })
  const itY = long2[Symbol.asyncIterator]()
  t.equal(((await itY.next()).value as unknown as WithNvext).nvext.worker_id.decode_worker_id_str, y)
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-dynamo-session-id': 'overload' },
    body: JSON.stringify({ model: MODEL, prompt: 'Bind me.', max_tokens: 1 }),
  })
  t.equal(res.status, 503, 'no engine left')
  t.equal(res.headers.get('retry-after'), '1')
  t.match(((await res.json()) as { error: { message: string } }).error.message, /overloaded/)

  // the client leaves mid-stream: the engine is told to stop, the router frees the booking
  const cancelled = async (id: string): Promise<number> => (await stats(engineOf.get(id) as string)).dynamo.generate.cancelled
  const before = [await cancelled(x), await cancelled(y)]
  t.ok((await inFlight()) >= 2, 'the two streams are booked')
  holdX.abort()
  holdY.abort()
  await waitUntil(
    'both engines stopped their streams',
    async () => (await cancelled(x)) > (before[0] as number) && (await cancelled(y)) > (before[1] as number),
  )
  await waitUntil('the bookings freed', async () => (await inFlight()) === 0)
  const sx = await stats(engineOf.get(x) as string)
  t.equal(sx.dynamo.inflight, 0, "the engine's slot is free")
  // and the engines take requests again
  const again = await client.completions.create({ model: MODEL, prompt: 'Bind me.', max_tokens: 1 }, session)
  t.equal(again.choices[0]?.text, 'the')
})

t.test('a worker whose request plane refuses connections: its requests go to the others; its record gone, it is gone', async (t) => {
  const etcdClient = new Etcd3({ hosts: etcd.url })
  t.teardown(() => etcdClient.close())
  const id = 0xdead5n
  const x = id.toString(16)
  // nothing listens on the port: every connection is refused
  const port = await getFreePort()
  await etcdClient
    .put(`v1/instances/dynamo/backend/generate/${x}`)
    .value(
      `{"type":"Endpoint","component":"backend","endpoint":"generate","namespace":"dynamo","instance_id":${id},` +
        `"transport":{"tcp":"127.0.0.1:${port}/${x}/generate"}}`,
    )
  await etcdClient
    .put(`v1/mdc/dynamo/backend/generate/${x}`)
    .value(
      `{"type":"Model","namespace":"dynamo","component":"backend","endpoint":"generate","instance_id":${id},` +
        `"card_json":{"display_name":"${MODEL}","kv_cache_block_size":4,"runtime_config":{"total_kv_blocks":4096,"data_parallel_size":1}}}`,
    )
  await waitUntil('the third worker registered', async () => (await workers()).length === 3)
  // a second router, round-robin, so that one of three requests is sure to go to that worker
  // first; its requests in named MessagePack
  const msgpackBefore = (await Promise.all(engineUrls.map(stats))).reduce((n, s) => n + s.dynamo.request_plane.msgpack, 0)
  const rr = runCli([
    'serve',
    '--etcd-url',
    etcd.url,
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-mode',
    'round-robin',
    '--tokenizer',
    'bytes',
    '--request-plane-codec',
    'msgpack',
  ])
  t.teardown(stop(rr))
  const rrListening = await waitForOutput(rr, /listening on (http:\/\/[^ ]+)/)
  if (rrListening === null) throw new Error(`the second router did not start: ${rr.err()}`)
  const rrBase = rrListening[1] as string
  const rrWorkers = async (): Promise<Listed['workers']> => ((await (await fetch(`${rrBase}/v1/workers`)).json()) as Listed).workers
  await waitUntil('the second router lists three workers', async () => (await rrWorkers()).length === 3)
  const rrClient = new OpenAI({ baseURL: `${rrBase}/v1`, apiKey: 'none', maxRetries: 0 })
  for (let i = 0; i < 3; i++) {
    const r = (await rrClient.completions.create({ model: MODEL, prompt: `Round ${i}.`, max_tokens: 1 })) as OpenAI.Completion & WithNvext
    t.ok(engineOf.has(r.nvext.worker_id.decode_worker_id_str), `request ${i} answered by an engine`)
  }
  const msgpackAfter = (await Promise.all(engineUrls.map(stats))).reduce((n, s) => n + s.dynamo.request_plane.msgpack, 0)
  t.ok(msgpackAfter - msgpackBefore >= 3, `the engines took the --request-plane-codec msgpack requests as MessagePack (${msgpackAfter - msgpackBefore})`)
  const dead = (await rrWorkers()).find((w) => w.id_str === String(id))
  t.equal(dead?.health, 'suspended', 'the refusing worker is suspended after its failure')
  t.match(await (await fetch(`${rrBase}/metrics`)).text(), /^kvrouter_request_plane_total\{what="connection_errors"\} [1-9]/m, 'the refused connection counted')
  await etcdClient.delete().key(`v1/instances/dynamo/backend/generate/${x}`)
  await waitUntil('the worker gone with its record', async () => (await workers()).length === 2 && (await rrWorkers()).length === 2)
  t.equal(await inFlight(), 0, 'every booking freed')
})
