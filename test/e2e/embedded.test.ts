// The embedded default in one process: the router with a fleet of simulated engines whose KV
// events go straight to the shard pool (what `npm start` runs), and one engine that posts its
// events over HTTP instead (what `kv-router mocker --router-url` does).
import t from 'tap'
import type { AddressInfo } from 'node:net'
import { MockerFleet, type MockerWorker } from '../../src/sim/mocker/fleet.js'
import { BytesTokenizer } from '../../src/tokenizer/tokenizer.js'
import { harness, until } from '../http/helpers.js'

const h = await harness(['--router-block-size', '8'], new BytesTokenizer())
const mocker = await MockerFleet.start({ numWorkers: 4, firstWorkerId: 1n, blockSize: 8, speedupRatio: 20, onEvent: (ev) => h.router.ingestEvent(ev) })
const fleet = mocker.workers
for (const e of fleet) await h.router.addWorker({ id: e.workerId, url: e.url, capacity: e.capacity })
await h.app.fastify.listen({ host: '127.0.0.1', port: 0 })
const base = `http://127.0.0.1:${(h.app.fastify.server.address() as AddressInfo).port}`
t.teardown(async () => {
  await mocker.close()
  await h.close()
})

interface Completion {
  choices: { text?: string; message?: { content: string } }[]
  usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } }
  nvext: { worker_id: { decode_worker_id: number } }
}

async function complete(body: object, url = '/v1/completions'): Promise<Completion> {
  const r = await fetch(base + url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
  t.equal(r.status, 200)
  return (await r.json()) as Completion
}

t.test('a repeated prompt goes to the worker that cached it, and hits', async (t) => {
  const prompt = 'System: you are terse. User: explain prefix caching in one line, please.'
  const a = await complete({ prompt, max_tokens: 2 })
  t.equal(a.usage.prompt_tokens_details.cached_tokens, 0)
  await h.router.pool.flush()
  const b = await complete({ prompt, max_tokens: 2 })
  t.equal(b.nvext.worker_id.decode_worker_id, a.nvext.worker_id.decode_worker_id)
  t.equal(b.usage.prompt_tokens_details.cached_tokens, Math.floor(Buffer.byteLength(prompt) / 8) * 8)
  const chat = await complete({ messages: [{ role: 'user', content: prompt }], max_tokens: 3 }, '/v1/chat/completions')
  t.equal(chat.choices[0]?.message?.content, 'the cache is')
  const tokens = await complete({ prompt: [[1, 2, 3, 4, 5, 6, 7, 8, 9]], max_tokens: 1 })
  t.equal(tokens.usage.prompt_tokens, 9)
  const td = await complete({ prompt: 'ignored text', nvext: { token_data: [5, 6, 7, 8, 9, 10, 11, 12] }, max_tokens: 1 })
  t.equal(td.usage.prompt_tokens, 8, 'nvext.token_data is the prompt')
})

t.test('streaming with usage; the engine answers 404 and 400 itself', async (t) => {
  // the usage chunk comes when stream_options asks for it, through the router, and only then
  const ask = (so: object | undefined): Promise<string> =>
    fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, stream: true, ...(so === undefined ? {} : { stream_options: so }) }),
    }).then((r) => r.text())
  const text = await ask({ include_usage: true })
  t.match(text, '"role":"assistant"')
  t.match(text, '"usage":{"prompt_tokens"')
  t.match(text, 'data: [DONE]')
  const plain = await ask(undefined)
  t.match(plain, '"role":"assistant"')
  t.notMatch(plain, '"usage"')
  t.match(plain, 'data: [DONE]')
  const e = fleet[0] as MockerWorker
  t.equal((await fetch(`${e.url}/nothing`, { method: 'POST' })).status, 404)
  t.equal((await fetch(`${e.url}/v1/completions`, { method: 'POST', body: '{bad' })).status, 400)
  t.equal((await fetch(`${e.url}/health`)).status, 200)
  t.match(await (await fetch(`${e.url}/v1/models`)).text(), '"id":"kv-router-model"')
  // which engine served the requests above is the router's choice; the fleet served them all
  t.ok(fleet.reduce((n, w) => n + w.requestsServed, 0) >= 2, 'the engines count the requests they served')
})

t.test('an engine posting its events over HTTP', async (t) => {
  // registers itself through POST /v1/workers, as `kv-router mocker --router-url` does
  const remoteFleet = await MockerFleet.start({ firstWorkerId: 77n, blockSize: 8, speedupRatio: 0, routerUrl: base })
  const remote = remoteFleet.workers[0] as MockerWorker
  t.equal(h.router.registry.get(77n)?.url, remote.url)
  t.equal(h.router.registry.get(77n)?.capacity, 16384)
  const prompt = 'a prompt for the remote engine only, long enough for several blocks'
  const a = await complete({ prompt, max_tokens: 1, nvext: { backend_instance_id: 77 } })
  t.equal(a.nvext.worker_id.decode_worker_id, 77)
  await remote.flushEvents()
  await h.router.pool.flush()
  const ov = await fetch(`${base}/v1/overlap`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token_ids: [...Buffer.from(prompt)] }),
  })
  t.match(await ov.text(), `{"worker_id":77,"worker_id_str":"77","dp_rank":0,"overlap_blocks":${Math.floor(Buffer.byteLength(prompt) / 8)}`)
  const w = (await (await fetch(`${base}/v1/workers`)).json()) as { workers: { id: number; url: string; health: string; ranks: { in_flight: number }[] }[] }
  const me = w.workers.find((x) => x.id === 77)
  t.equal(me?.url, remote.url)
  t.equal(me?.health, 'healthy')
  t.equal(me?.ranks[0]?.in_flight, 0)
  // closing the fleet unregisters it (DELETE /v1/workers/77)
  await remoteFleet.close()
  await until(() => h.router.registry.all().length === 4)
  t.equal(h.router.registry.get(77n), undefined)
})
