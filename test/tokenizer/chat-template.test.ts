// A chat request is tokenized as the engine tokenizes it: rendered by the model's chat template
// (chat_template.jinja or tokenizer_config.json beside tokenizer.json), then encoded without
// special tokens; a completion's text gets the tokenizer's BOS. Both as vLLM does by default,
// and both overridable per request with vLLM's add_special_tokens.
import t from 'tap'
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { HfTokenizer } from '../../src/tokenizer/tokenizer.js'
import { findChatTemplate } from '../../src/tokenizer/chat-template.js'
import { tokenizedRouter } from '../http/helpers.js'
import { fromRoot } from '../helpers/paths.js'

const fixture = fromRoot('test', 'fixtures', 'tokenizer.json')
const BOS = 13
const START = 14
const END = 15
const CHATML =
  '{{ bos_token }}{% for m in messages %}{% if m.role == "bad" %}{{ raise_exception("roles must alternate") }}{% endif %}<|im_start|>{{ m.role }} ' +
  '{{ m.content }}<|im_end|>{% endfor %}{% if enable_thinking %}router{% endif %}{% if add_generation_prompt %}<|im_start|>assistant{% endif %}'

/** The fixture's word-level vocabulary with a BOS its post-processor adds and two chat markers, in a folder of its own. */
function modelDir(files: { config?: object; jinja?: string } = {}): string {
  const dir = mkdtempSync(join(tmpdir(), 'kvr-chat-'))
  const tok = JSON.parse(readFileSync(fixture, 'utf8')) as Record<string, unknown>
  const added = (id: number, content: string): object => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })
  tok.added_tokens = [...(tok.added_tokens as object[]), added(BOS, '<s>'), added(START, '<|im_start|>'), added(END, '<|im_end|>')]
  tok.post_processor = {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<s>': { id: '<s>', ids: [BOS], tokens: ['<s>'] } },
  }
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tok))
  if (files.config !== undefined) writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(files.config))
  if (files.jinja !== undefined) writeFileSync(join(dir, 'chat_template.jinja'), files.jinja)
  return join(dir, 'tokenizer.json')
}

const chat = (messages: unknown[], more: { addGenerationPrompt?: boolean; kwargs?: Record<string, unknown> } = {}) => ({
  messages,
  addGenerationPrompt: more.addGenerationPrompt ?? true,
  kwargs: more.kwargs ?? null,
  tools: null,
})

t.test('where the template is found', async (t) => {
  t.equal(findChatTemplate(modelDir()), null, 'no tokenizer_config.json')
  t.equal(findChatTemplate(modelDir({ config: { bos_token: '<s>' } })), null, 'a config without a template')
  const fromConfig = findChatTemplate(modelDir({ config: { chat_template: 'A', bos_token: { content: '<s>' }, eos_token: '</s>' } }))
  t.match(
    fromConfig,
    { text: 'A', bosToken: '<s>', eosToken: '</s>', from: /tokenizer_config\.json$/ },
    'a special token written as an object gives its content',
  )
  t.match(
    findChatTemplate(
      modelDir({
        config: {
          chat_template: [
            { name: 'tool_use', template: 'T' },
            { name: 'default', template: 'D' },
          ],
        },
      }),
    ),
    { text: 'D', from: /\(default\)$/ },
    'of named templates, the default',
  )
  t.match(
    findChatTemplate(modelDir({ config: { chat_template: 'A' }, jinja: 'J' })),
    { text: 'J', from: /chat_template\.jinja$/ },
    'chat_template.jinja before the config',
  )
})

t.test('chat rendered by the model template, completions with the BOS', async (t) => {
  const tok = await HfTokenizer.load(modelDir({ config: { chat_template: CHATML, bos_token: '<s>' } }), 1)
  t.teardown(() => tok.close())
  t.match(tok.chatTemplate, /tokenizer_config\.json$/)
  const user = [{ role: 'user', content: 'hello kv cache' }]
  t.same([...(await tok.encodeChat(chat(user), false))], [BOS, START, 9, 1, 3, 4, END, START, 10], 'the template writes the one BOS')
  t.same(
    [...(await tok.encodeChat(chat(user), true))],
    [BOS, BOS, START, 9, 1, 3, 4, END, START, 10],
    'add_special_tokens on a chat adds a second, as vLLM does',
  )
  t.same([...(await tok.encodeChat(chat(user, { addGenerationPrompt: false }), false))], [BOS, START, 9, 1, 3, 4, END])
  t.same(
    [...(await tok.encodeChat(chat(user, { kwargs: { enable_thinking: true } }), false))],
    [BOS, START, 9, 1, 3, 4, END, 5, START, 10],
    'chat_template_kwargs reach the template',
  )
  t.same([...(await tok.encode('hello world', true))], [BOS, 1, 2], 'a completion gets the BOS')
  t.same([...(await tok.encode('hello world', false))], [1, 2])
  await t.rejects(tok.encodeChat(chat([{ role: 'bad', content: 'x' }]), false), {
    code: 'KVR_ERR_INVALID_REQUEST',
    message: /chat template refused the messages: roles must alternate/,
  })
  t.same([...(await tok.encodeChat(chat(user), false))], [BOS, START, 9, 1, 3, 4, END, START, 10], 'the thread still works after a refusal')
})

t.test('a template that does not parse stops the start; none at all falls back to the fixed template', async (t) => {
  await t.rejects(HfTokenizer.load(modelDir({ jinja: '{% for %}' }), 1), {
    code: 'KVR_ERR_INVALID_OPTION',
    message: /chat template beside .* could not be read/,
  })
  const tok = await HfTokenizer.load(modelDir(), 1)
  t.teardown(() => tok.close())
  t.equal(tok.chatTemplate, null)
  // the fixed template's text: <|user|>\nhello\n<|assistant|>\n
  t.same([...(await tok.encodeChat(chat([{ role: 'user', content: 'hello' }]), false))], [11, 9, 12, 1, 11, 10, 12])
})

t.test('through the router: the tokens routed are the template tokens; the request fields reach the tokenizer', async (t) => {
  const tok = await HfTokenizer.load(modelDir({ config: { chat_template: CHATML, bos_token: '<s>' } }), 1)
  const h = await tokenizedRouter(t, tok)
  const post = (url: string, body: object) =>
    h.app.fastify.inject({ method: 'POST', url, headers: { 'content-type': 'application/json' }, payload: JSON.stringify(body) })
  const sum = async (): Promise<number> =>
    Number(
      /dynamo_component_router_input_sequence_tokens_sum\{[^}]*\} (\d+)/.exec((await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body)?.[1] ??
        Number.NaN,
    )
  const messages = [{ role: 'user', content: 'hello kv cache' }]
  t.equal((await post('/v1/chat/completions', { messages })).statusCode, 200)
  t.equal(await sum(), 9, 'nine tokens: BOS, the turn, the generation prompt')
  t.equal((await post('/v1/chat/completions', { messages, add_generation_prompt: false, chat_template_kwargs: { enable_thinking: true } })).statusCode, 200)
  t.equal(await sum(), 9 + 8)
  t.equal((await post('/v1/completions', { prompt: 'hello world' })).statusCode, 200)
  t.equal(await sum(), 17 + 3, 'BOS and two words')
  t.equal((await post('/v1/completions', { prompt: 'hello world', add_special_tokens: false })).statusCode, 200)
  t.equal(await sum(), 20 + 2)
  const refused = await post('/v1/chat/completions', { messages: [{ role: 'bad', content: 'x' }] })
  t.equal(refused.statusCode, 400)
  t.match(JSON.parse(refused.body), { error: { code: 'KVR_ERR_INVALID_REQUEST', message: /roles must alternate/ } })
  for (const content of [5, { a: 1 }, true]) {
    const r = await post('/v1/chat/completions', { messages: [{ role: 'user', content }] })
    t.equal(r.statusCode, 400, `content ${JSON.stringify(content)} is refused`)
    t.match(JSON.parse(r.body), { error: { code: 'KVR_ERR_INVALID_REQUEST' } })
  }
  const withNull = [{ role: 'assistant', content: null }, ...messages]
  t.equal((await post('/v1/chat/completions', { messages: withNull })).statusCode, 200, 'a null content (a turn of tool calls) is accepted')
  const nullTokens = (await tok.encodeChat(chat(withNull), false)).length
  for (const bad of [{ add_special_tokens: 'yes' }, { add_generation_prompt: 1 }, { chat_template_kwargs: [] }, { tools: {} }]) {
    t.equal((await post('/v1/chat/completions', { messages, ...bad })).statusCode, 400, `${Object.keys(bad)[0]} of the wrong type`)
  }
  t.equal(await sum(), 22 + nullTokens, 'nothing refused was routed; the null-content chat was')
})
