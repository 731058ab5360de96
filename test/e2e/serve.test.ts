// Process level: `kv-router serve` and a `kv-router mocker` process (simulated engines that
// register over POST /v1/workers and post their KV events to /v1/kv-events), driven by the
// official openai client: completions, chat, streaming, prefix-cache hits; then SIGTERM drains
// an in-flight stream before the router exits.
import t from 'tap'
import { spawn } from 'node:child_process'
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import OpenAI from 'openai'
import { cliArgv } from '../helpers/cli.js'

const KEY = 'e2e-key'

function start(
  args: string[],
  ready: RegExp,
): Promise<{ p: ChildProcessWithoutNullStreams; out: () => string; match: RegExpMatchArray; exit: Promise<number | null> }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, cliArgv(args), { env: { PATH: process.env.PATH } })
    let out = ''
    let err = ''
    const exit = new Promise<number | null>((r) => p.on('close', (code) => r(code)))
    const timer = setTimeout(() => reject(new Error(`not ready: ${out} ${err}`)), 20_000)
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const m = out.match(ready)
      if (m !== null) {
        clearTimeout(timer)
        resolve({ p, out: () => out, match: m, exit })
      }
    })
    p.stderr.on('data', (d: Buffer) => (err += d.toString()))
    p.on('close', (code) => {
      clearTimeout(timer)
      reject(new Error(`exited ${code}: ${out} ${err}`))
    })
  })
}

const router = await start(
  [
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-block-size',
    '16',
    '--tokenizer',
    'bytes',
    '--api-key',
    KEY,
    '--router-event-threads',
    '1',
    '--model-name',
    'sim-model',
    '--shutdown-timeout-secs',
    '10',
  ],
  /listening on (http:\/\/[^ ]+)/,
)
const base = router.match[1] as string
const mocker = await start(
  ['mocker', '--router-url', base, '--num-workers', '2', '--block-size', '16', '--api-key', KEY],
  /kv-router mocker: ready 2 engine\(s\) http:\/\/\S+ http:\/\/\S+\n/,
)
t.teardown(async () => {
  mocker.p.kill('SIGTERM')
  router.p.kill('SIGKILL')
  await mocker.exit
})

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 })
const PROMPT = 'You are a helpful assistant. Answer briefly and precisely. The question follows: what is a KV cache?'

t.test('models', async (t) => {
  const models = await client.models.list()
  t.equal(models.data[0]?.id, 'sim-model')
})

t.test('completions: text prompt, nvext.worker_id, and a prefix-cache hit the second time', async (t) => {
  const a = (await client.completions.create({ model: 'sim-model', prompt: PROMPT, max_tokens: 3 })) as OpenAI.Completion & {
    nvext: { worker_id: { decode_worker_id: number } }
    usage: { prompt_tokens_details: { cached_tokens: number } }
  }
  t.equal(a.choices[0]?.text, 'the cache is')
  t.equal(a.usage?.prompt_tokens, Buffer.byteLength(PROMPT))
  t.ok([1000, 1001].includes(a.nvext.worker_id.decode_worker_id))
  // the engine's Stored events reach the router over HTTP; the same prompt then goes where it is cached
  let cached = 0
  let same = false
  for (let i = 0; i < 20 && cached === 0; i++) {
    await new Promise((r) => setTimeout(r, 50))
    const b = (await client.completions.create({ model: 'sim-model', prompt: PROMPT, max_tokens: 1 })) as typeof a
    cached = b.usage.prompt_tokens_details.cached_tokens
    same = b.nvext.worker_id.decode_worker_id === a.nvext.worker_id.decode_worker_id
  }
  t.equal(cached, Math.floor(Buffer.byteLength(PROMPT) / 16) * 16, 'every complete block was a hit')
  t.ok(same, 'routed to the worker holding the prefix')
  const tokenPrompt = await client.completions.create({ model: 'sim-model', prompt: Array.from({ length: 40 }, (_, i) => i + 1), max_tokens: 2 })
  t.equal(tokenPrompt.usage?.prompt_tokens, 40, 'token-id prompts go through unchanged')
})

t.test('chat: unary and streaming', async (t) => {
  const c = await client.chat.completions.create({ model: 'sim-model', messages: [{ role: 'user', content: 'Hello there, how are you?' }], max_tokens: 2 })
  t.equal(c.choices[0]?.message.content, 'the cache')
  const stream = await client.chat.completions.create({
    model: 'sim-model',
    messages: [{ role: 'user', content: 'Stream to me please.' }],
    max_tokens: 4,
    stream: true,
    stream_options: { include_usage: true },
  })
  let text = ''
  let n = 0
  let worker: unknown
  for await (const chunk of stream) {
    if (n === 0) worker = (chunk as unknown as { nvext?: { worker_id?: unknown } }).nvext?.worker_id
    n++
    text += chunk.choices[0]?.delta?.content ?? ''
  }
  t.equal(n, 5, 'four tokens, then the usage chunk it asked for')
  t.equal(text, 'the cache is warm')
  t.ok(worker !== undefined, 'the first chunk carries nvext.worker_id')
  const cs = await client.completions.create({ model: 'sim-model', prompt: 'streamed completion prompt', max_tokens: 3, stream: true })
  let ctext = ''
  for await (const chunk of cs) ctext += chunk.choices[0]?.text ?? ''
  t.equal(ctext, 'the cache is')
})

t.test('wrong API key is refused, metrics are served', async (t) => {
  const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'nope', maxRetries: 0 })
  const err = await bad.completions.create({ model: 'sim-model', prompt: 'x', max_tokens: 1 }).catch((e: unknown) => e)
  t.equal((err as { status?: number }).status, 401)
  const m = await (await fetch(`${base}/metrics`)).text()
  t.match(m, /dynamo_component_router_requests_total\{[^}]*\} [1-9]/)
  t.match(m, /kvrouter_http_events_received_total [1-9]/)
})

t.test('SIGTERM drains the in-flight stream, then the router exits 0', async (t) => {
  const stream = await client.completions.create({ model: 'sim-model', prompt: 'a long answer please', max_tokens: 15, stream: true })
  const it = stream[Symbol.asyncIterator]()
  const first = await it.next()
  t.equal(first.done, false)
  router.p.kill('SIGTERM')
  let n = 1
  for (;;) {
    const r = await it.next()
    if (r.done === true) break
    n++
  }
  t.equal(n, 15, 'every token of the in-flight stream arrived (no usage chunk: not asked for)')
  t.equal(await router.exit, 0)
  t.match(router.out(), /SIGTERM: draining 1 in-flight request/)
  t.match(router.out(), /stopped\n/)
})
