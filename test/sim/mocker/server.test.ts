// One engine's OpenAI-compatible HTTP server: unary and streamed completions and chat, usage
// with cached tokens, the final usage chunk, client disconnects freeing blocks, errors; and
// the step loop keeping time against a monotonic clock (no drift over many short steps).
import t from 'tap'
import { MockerFleet, type MockerWorker } from '../../../src/sim/mocker/fleet.js'
import { MockEngine, type EngineRequest } from '../../../src/sim/mocker/engine.js'
import { EngineServer, outputText, promptTokens } from '../../../src/sim/mocker/server.js'
import { chatPromptText } from '../../../src/tokenizer/tokenizer.js'
import { waitUntil } from '../../helpers/wait.js'

const fleet = await MockerFleet.start({ numWorkers: 2, firstWorkerId: 5n, blockSize: 16, speedupRatio: 0, modelName: 'm1' })
t.teardown(() => fleet.close())
const w = fleet.workers[0] as MockerWorker
const base = w.url

interface Usage {
  prompt_tokens: number
  completion_tokens: number
  total_tokens: number
  prompt_tokens_details: { cached_tokens: number }
}

async function post(path: string, body: unknown, url = base): Promise<{ status: number; text: string }> {
  const r = await fetch(url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  })
  return { status: r.status, text: await r.text() }
}

function sse(text: string): (Record<string, unknown> | '[DONE]')[] {
  t.ok(text.endsWith('data: [DONE]\n\n'), 'the stream ends with [DONE]')
  return text
    .split('\n\n')
    .filter((x) => x !== '')
    .map((x) => {
      t.ok(x.startsWith('data: '))
      const d = x.slice(6)
      return d === '[DONE]' ? '[DONE]' : (JSON.parse(d) as Record<string, unknown>)
    })
}

t.test('unary completion: text, usage, and the cached prefix the second time', async (t) => {
  const prompt = Array.from({ length: 100 }, (_, i) => i + 1)
  const a = await post('/v1/completions', { model: 'x', prompt, max_tokens: 5 })
  t.equal(a.status, 200)
  const ja = JSON.parse(a.text) as { id: string; object: string; model: string; choices: { text: string; finish_reason: string }[]; usage: Usage }
  t.equal(ja.object, 'text_completion')
  t.equal(ja.model, 'x')
  t.match(ja.id, /^cmpl-5-/)
  t.same(ja.choices[0], { index: 0, text: 'the cache is warm and', logprobs: null, finish_reason: 'length' })
  t.same(ja.usage, { prompt_tokens: 100, completion_tokens: 5, total_tokens: 105, prompt_tokens_details: { cached_tokens: 0 } })
  const b = JSON.parse((await post('/v1/completions', { prompt: [prompt], max_tokens: 2 })).text) as { model: string; usage: Usage }
  t.equal(b.usage.prompt_tokens_details.cached_tokens, 96, 'six full blocks of 16 were cached')
  t.equal(b.model, 'm1', "the engine's model name when the request names none")
  // text prompts are UTF-8 bytes; no max_tokens means 16
  const c = JSON.parse((await post('/v1/completions', { prompt: 'héllo' })).text) as { usage: Usage; choices: { text: string }[] }
  t.equal(c.usage.prompt_tokens, 6)
  t.equal(c.usage.completion_tokens, 16)
  t.equal(c.choices[0]?.text, outputText(16))
  t.equal(outputText(12), 'the cache is warm and the router knows it.the cache')
  t.ok(w.requestsServed >= 3)
})

t.test('chat: unary and streamed, messages through the shared chat template', async (t) => {
  const messages = [
    { role: 'system', content: 'be brief' },
    { role: 'user', content: [{ type: 'text', text: 'hello' }] },
  ]
  const u = JSON.parse((await post('/v1/chat/completions', { messages, max_completion_tokens: 3 })).text) as {
    object: string
    choices: { message: { role: string; content: string } }[]
    usage: Usage
  }
  t.equal(u.object, 'chat.completion')
  t.same(u.choices[0]?.message, { role: 'assistant', content: 'the cache is' })
  t.equal(u.usage.prompt_tokens, Buffer.byteLength(chatPromptText(messages)))
  const s = await post('/v1/chat/completions', { messages, max_tokens: 3, stream: true, stream_options: { include_usage: true } })
  const chunks = sse(s.text)
  t.equal(chunks.length, 5, 'three tokens, the usage chunk, [DONE]')
  const [c0, c1, c2, cu] = chunks as Record<string, unknown>[]
  t.match(c0, { object: 'chat.completion.chunk', choices: [{ index: 0, delta: { role: 'assistant', content: 'the' }, finish_reason: null }] })
  t.same((c1?.choices as object[] | undefined)?.[0], { index: 0, delta: { content: ' cache' }, logprobs: null, finish_reason: null })
  t.same((c2?.choices as object[] | undefined)?.[0], { index: 0, delta: { content: ' is' }, logprobs: null, finish_reason: 'length' })
  t.same(cu?.choices, [])
  t.match(cu?.usage, { completion_tokens: 3, prompt_tokens_details: { cached_tokens: Math.floor(u.usage.prompt_tokens / 16) * 16 } })
  t.equal(chunks[4], '[DONE]')
  t.equal(new Set((chunks.slice(0, 4) as Record<string, unknown>[]).map((c) => c.id)).size, 1, 'one id for the whole stream')
})

t.test('streamed completion with one token: token, usage, done', async (t) => {
  const chunks = sse((await post('/v1/completions', { prompt: [1, 2, 3], max_tokens: 1, stream: true, stream_options: { include_usage: true } })).text)
  t.equal(chunks.length, 3)
  t.match(chunks[0], { object: 'text_completion', choices: [{ text: 'the', finish_reason: 'length' }] })
  t.match(chunks[1], { choices: [], usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } })
})

t.test('a stream carries the usage chunk only when stream_options.include_usage asks for it', async (t) => {
  for (const so of [undefined, null, {}, { include_usage: false }, { include_usage: 'true' }]) {
    const chunks = sse(
      (await post('/v1/completions', { prompt: [1, 2, 3], max_tokens: 2, stream: true, ...(so === undefined ? {} : { stream_options: so }) })).text,
    )
    t.equal(chunks.length, 3, `stream_options ${JSON.stringify(so)}: two tokens, [DONE]`)
    t.match(chunks[1], { choices: [{ text: ' cache', finish_reason: 'length' }] })
    t.equal(chunks[2], '[DONE]')
    t.notOk(
      chunks.some((c) => typeof c === 'object' && c !== null && 'usage' in c),
      'no usage anywhere',
    )
  }
})

t.test('prompt forms and errors', async (t) => {
  t.same(promptTokens({ prompt: [[4, 5]] }, false), [4, 5])
  t.same(Array.from(promptTokens({ prompt: ['ab'] }, false)), [97, 98])
  t.same(promptTokens({ prompt: 'ignored', nvext: { token_data: [9, 9] } }, false), [9, 9])
  t.throws(() => promptTokens({ prompt: 5 }, false), /prompt must be/)
  t.throws(() => promptTokens({}, true), /messages must be an array/)
  const err = async (path: string, body: unknown, status: number, code: string): Promise<void> => {
    const r = await post(path, body)
    t.equal(r.status, status, `${JSON.stringify(body).slice(0, 60)} → ${status}`)
    t.equal((JSON.parse(r.text) as { error: { code: string } }).error.code, code)
  }
  await err('/v1/completions', '{bad', 400, 'KVR_ERR_INVALID_REQUEST')
  await err('/v1/completions', '[1]', 400, 'KVR_ERR_INVALID_REQUEST')
  await err('/v1/completions', { prompt: [1], max_tokens: 0 }, 400, 'KVR_ERR_INVALID_REQUEST')
  await err('/v1/completions', { prompt: [1], max_tokens: 1.5 }, 400, 'KVR_ERR_INVALID_REQUEST')
  await err('/v1/completions', { prompt: [], max_tokens: 1 }, 400, 'KVR_ERR_EMPTY_PROMPT')
  await err('/v1/completions', { prompt: [1, -1] }, 400, 'KVR_ERR_TOKEN_OUT_OF_RANGE')
  await err('/v1/completions', { prompt: [1], max_tokens: 16384 * 16 }, 400, 'KVR_ERR_INVALID_REQUEST')
  await err('/nothing', {}, 404, 'KVR_ERR_NOT_FOUND')
  t.equal((await fetch(`${base}/v1/completions`)).status, 404, 'GET of a POST route')
  const health = await fetch(`${base}/health`)
  t.same(await health.json(), { status: 'ok', worker_id: 5 })
  t.match(await (await fetch(`${base}/v1/models`)).json(), { object: 'list', data: [{ id: 'm1' }] })
  const stats = (await (await fetch(`${base}/stats`)).json()) as Record<string, Record<string, unknown>>
  t.equal(stats.worker_id, '5')
  t.match(stats.config, {
    blockSize: 16,
    numGpuBlocks: 16384,
    maxNumSeqs: 256,
    maxNumBatchedTokens: 8192,
    enableChunkedPrefill: true,
    preemptionMode: 'lifo',
    speedupRatio: 0,
  })
  t.ok((stats.stats?.finished as number) > 0)

  const small = new MockEngine({ workerId: 1n, speedupRatio: 0 })
  const srv = new EngineServer({ engine: small, maxBodyBytes: 100 })
  const url = await srv.listen()
  const big = await post('/v1/completions', { prompt: Array.from({ length: 100 }, () => 1) }, url)
  t.equal(big.status, 413)
  t.match(big.text, 'KVR_ERR_BODY_TOO_LARGE')
  await srv.close()
  await srv.close()
  small.close()
})

t.test('a client that goes away aborts its request and frees its blocks', async (t) => {
  const f = await MockerFleet.start({ firstWorkerId: 9n, blockSize: 16, speedupRatio: 1 })
  t.teardown(() => f.close())
  const e = (f.workers[0] as MockerWorker).engine
  const ac = new AbortController()
  const r = await fetch(`${f.urls[0]}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt: Array.from({ length: 300 }, (_, i) => i), max_tokens: 5000, stream: true }),
    signal: ac.signal,
  })
  const reader = (r.body as ReadableStream<Uint8Array>).getReader()
  const first = await reader.read()
  t.match(Buffer.from(first.value as Uint8Array).toString(), /^data: \{"id":"cmpl-9-0"/)
  t.ok(e.pool.activeBlocks > 0, 'the request holds blocks while it streams')
  ac.abort()
  await waitUntil('the request aborted', () => e.stats.aborted === 1, 5000)
  t.equal(e.pool.activeBlocks, 0)
  t.equal(e.partialBlockCount, 0)
  t.equal(e.runningCount, 0)
  // unary requests too, while still waiting for their answer
  const ac2 = new AbortController()
  const p = fetch(`${f.urls[0]}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: [1, 2, 3], max_tokens: 5000 }), signal: ac2.signal }).catch(
    (err: unknown) => err,
  )
  await waitUntil('the second request running', () => e.runningCount === 1, 5000)
  ac2.abort()
  t.ok((await p) instanceof Error)
  await waitUntil('the second request aborted', () => e.stats.aborted === 2, 5000)
  t.equal(e.pool.activeBlocks, 0)
})

t.test('many concurrent streams', async (t) => {
  const n = 64
  const bodies = Array.from({ length: n }, (_, i) => ({ prompt: Array.from({ length: 50 + i }, (_, j) => 1000 * i + j), max_tokens: 20, stream: true }))
  const texts = await Promise.all(bodies.map((b, i) => post('/v1/completions', b, fleet.urls[i % 2])))
  let tokens = 0
  for (const r of texts) tokens += r.text.split('"text":').length - 1
  t.equal(tokens, n * 20)
  for (const x of fleet.workers) t.equal(x.engine.pool.activeBlocks, 0)
})

t.test('the step loop keeps time: no drift over hundreds of short steps', async (t) => {
  // ≈2 ms decode steps: a loop that slept "duration" after each late timer would drift by the
  // timer lateness (≥ 1 ms here) on every step, i.e. by 50% or more
  const e = new MockEngine({ workerId: 3n, speedupRatio: 1, decodeSpeedupRatio: 2.87 })
  t.teardown(() => e.close())
  let done: (r: EngineRequest) => void = () => undefined
  const finished = new Promise<EngineRequest>((r) => (done = r))
  const t0 = performance.now()
  const r = e.submit(
    Array.from({ length: 64 }, (_, i) => i),
    300,
    { onToken: () => undefined, onFinish: (x) => done(x) },
  )
  await finished
  const elapsed = performance.now() - t0
  const modelled = e.stats.busyMs
  t.equal(r.outputTokens, 300)
  t.ok(modelled > 500 && modelled < 700, `modelled ${modelled.toFixed(1)} ms`)
  t.ok(elapsed >= modelled - 1, `not faster than modelled (${elapsed.toFixed(1)} ms)`)
  // a loop that drifts by its timer lateness takes ≥ 1 ms more per step (≥ +300 ms): the bound
  // leaves room for a loaded machine's late timers without letting that through
  t.ok(elapsed <= modelled * 1.35 + 40, `within 35% + 40 ms of the modelled ${modelled.toFixed(1)} ms (took ${elapsed.toFixed(1)} ms)`)
  t.ok(r.firstTokenAt - r.arrivedAt < 60, 'first token after the prefill step (17.5 ms modelled)')
})

t.test("a step longer than Node's timer range waits, instead of waking every millisecond", async (t) => {
  const warnings: string[] = []
  const onWarning = (w: Error): void => void warnings.push(w.name)
  process.on('warning', onWarning)
  t.teardown(() => void process.off('warning', onWarning))
  // the loop reads the clock once per wake: counting reads counts wakes
  let reads = 0
  const now = (): number => {
    reads++
    return performance.now()
  }
  // a 64-token prefill is ≈17.5 ms modelled; at 1e-9 it lasts ≈1.75·10^10 ms, past 2^31 − 1
  const e = new MockEngine({ workerId: 4n, speedupRatio: 1e-9, now })
  t.teardown(() => e.close())
  const r = e.submit(
    Array.from({ length: 64 }, (_, i) => i),
    1,
  )
  await waitUntil('the prefill step started', () => r.computed > 0, 2000)
  const before = reads
  await new Promise((resolve) => setTimeout(resolve, 200))
  t.ok(reads - before <= 2, `the loop woke ${reads - before} time(s) in 200 ms`)
  t.equal(r.outputTokens, 0, 'the step is not over')
  t.same(
    warnings.filter((w) => w === 'TimeoutOverflowWarning'),
    [],
    'no timer overflowed',
  )
})
