// Text prompts: a Hugging Face tokenizer.json loaded from disk and run on piscina threads, the
// bytes tokenizer, and the chat template both the router and the simulated engine use.
import t from 'tap'
import { writeFileSync, mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { BytesTokenizer, HfTokenizer, chatPromptText, loadTokenizer } from '../../src/tokenizer/tokenizer.js'
import { harness, tokenizedRouter, upstream } from '../http/helpers.js'
import { runCli, waitForOutput } from '../helpers/cli.js'
import { logRecords } from '../helpers/log.js'
import { fromRoot } from '../helpers/paths.js'

const fixture = fromRoot('test', 'fixtures', 'tokenizer.json')

t.test('hf tokenizer.json off the event loop', async (t) => {
  const tok = await HfTokenizer.load(fixture, 1)
  t.teardown(() => tok.close())
  t.same([...(await tok.encode('Hello world KV cache router', true))], [1, 2, 3, 4, 5])
  t.same([...(await tok.encode('hello unknownword', true))], [1, 0], 'unknown words map to [UNK]')
  const many = await Promise.all(Array.from({ length: 20 }, () => tok.encode('kv cache', true)))
  t.ok(many.every((x) => x.length === 2 && x[0] === 3 && x[1] === 4))
})

t.test('bad tokenizer files fail at load with a clear message', async (t) => {
  await t.rejects(HfTokenizer.load('/nonexistent.json'), { code: 'KVR_ERR_INVALID_OPTION', message: /no such file/ })
  const dir = mkdtempSync(join(tmpdir(), 'kvr-tok-'))
  writeFileSync(join(dir, 'bad.json'), '{ not json')
  await t.rejects(HfTokenizer.load(join(dir, 'bad.json')), { message: /not a JSON tokenizer file/ })
  writeFileSync(join(dir, 'weird.json'), '{"model":{"type":"NoSuchModel"}}')
  await t.rejects(HfTokenizer.load(join(dir, 'weird.json')), { message: /could not be loaded/ })
  t.equal(await loadTokenizer(null), null)
  t.equal((await loadTokenizer('bytes'))?.kind, 'bytes')
})

t.test('bytes tokenizer and chat template', async (t) => {
  const b = new BytesTokenizer()
  t.same([...(await b.encode('hé'))], [104, 195, 169])
  t.equal(
    chatPromptText([
      { role: 'system', content: 'be brief' },
      { role: 'user', content: [{ type: 'text', text: 'hi' }, { type: 'image' }] },
    ]),
    '<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n',
  )
  t.equal(chatPromptText([{ role: 'user', content: null }]), '<|user|>\n\n<|assistant|>\n')
  await b.close()
})

t.test('text prompts through the router use the tokenizer', async (t) => {
  const tok = await HfTokenizer.load(fixture, 1)
  const h = await tokenizedRouter(t, tok)
  const r = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ prompt: 'hello world kv cache router' }),
  })
  t.equal(r.statusCode, 200)
  t.match(r.body, '"prompt":"hello world kv cache router"', 'the text is forwarded as sent')
  const c = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/chat/completions',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ messages: [{ role: 'user', content: 'hello' }] }),
  })
  t.equal(c.statusCode, 200)
  const pinned = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({
      prompt: ['kv cache'],
      nvext: {
        backend_instance_id: 1,
        agent_hints: { priority: 3 },
        router_config_override: { overlap_score_weight: 0.5, router_temperature: 0.1, assume_kv_reuse: false, track_prefill_tokens: true },
      },
    }),
  })
  t.equal(pinned.statusCode, 200)
  const m = await h.app.fastify.inject({ method: 'GET', url: '/metrics' })
  // 5 + 2 tokens of text, plus the chat template's tokens
  t.match(m.body, /dynamo_component_router_input_sequence_tokens_count\{[^}]*\} 3/)
  t.match(m.body, /dynamo_component_router_input_sequence_tokens_sum\{[^}]*\} (\d+)/)
})

t.test('process: `serve --tokenizer tokenizer.json` as the shebang starts it tokenizes on its threads', async (t) => {
  // the tokenizer's threads once got the process's V8 flags handed to them explicitly, which a
  // worker refuses: the router then died at startup, and only when started as users start it
  const s = await upstream((req, body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    // the router's health probes are GETs without a body
    res.end(req.method === 'GET' ? '{}' : JSON.stringify({ echo: JSON.parse(body) as unknown }))
  })
  const c = runCli([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-event-threads',
    '1',
    '--router-block-size',
    '2',
    '--tokenizer',
    fixture,
    '--worker',
    `1=${s.url}`,
  ])
  t.teardown(async () => {
    c.p.kill('SIGKILL')
    await c.exited
    await s.close()
  })
  const base = (await waitForOutput(c, /listening on (http:\/\/\S+)/))?.[1]
  if (base === undefined) return t.fail(`the router exited: ${c.err()}`)
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'hello world kv cache router' }),
  })
  t.equal(r.status, 200)
  t.match(await r.text(), '"prompt":"hello world kv cache router"')
  const m = await (await fetch(`${base}/metrics`)).text()
  t.match(m, /dynamo_component_router_input_sequence_tokens_sum\{[^}]*\} 5\n/, 'five tokens, as the fixture splits the text')
  // the fixture's folder has no chat template: chat would hash tokens no engine sees, and the log says so
  t.ok(
    logRecords(c.err()).some((x) => x.level === 'warn' && /^no chat template beside .*tokenizer\.json .*will not match cached prefixes/.test(x.msg)),
    'a warning in the log',
  )
})

t.test('non-kv mode accepts text without a tokenizer', async (t) => {
  const h = await harness(['--router-mode', 'round-robin'])
  const s = await upstream((_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('{"ok":true}')
  })
  t.teardown(async () => {
    await h.close()
    await s.close()
  })
  await h.router.addWorker({ id: 1n, url: s.url })
  const r = await h.app.fastify.inject({
    method: 'POST',
    url: '/v1/completions',
    headers: { 'content-type': 'application/json' },
    payload: JSON.stringify({ prompt: 'plain text' }),
  })
  t.equal(r.statusCode, 200)
  t.match(r.body, '"ok":true')
})
