// A Dynamo worker's answer stream to the OpenAI answer the router gives its client: SSE chunks
// and [DONE], or one JSON body, in the same shapes (keys, order, types) the router relays from
// an HTTP worker (the simulated engine's server, with the proxy's nvext.worker_id); text decoded
// on a real tokenizer, split UTF-8 included; stop strings, hidden stop tokens, min/max tokens;
// finish reasons; usage; worker errors before and after the first event.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { Tokenizer } from '@huggingface/tokenizers'
import { EngineOutputTranslator, streamOptions } from '../../src/frontend/openai-stream.js'
import { preprocessedRequest } from '../../src/frontend/preprocessed-request.js'
import type { RequestKind, RouteTarget } from '../../src/frontend/preprocessed-request.js'
import { HfDecoder } from '../../src/tokenizer/token-decoder.js'
import { injectWorkerId, workerIdObject } from '../../src/http/proxy/sse.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import type { MockerWorker } from '../../src/sim/mocker/fleet.js'
import { serializeJson } from '../../src/codec/json.js'
import { WORDS } from '../../src/sim/mocker/server.js'
import { fromRoot } from '../helpers/paths.js'

const fixture = fromRoot('test', 'fixtures', 'byte-level', 'tokenizer.json')
const decoder = HfDecoder.load(fixture)
const hf = new Tokenizer(JSON.parse(readFileSync(fixture, 'utf8')) as object, {})
const encode = (s: string): number[] => hf.encode(s, { add_special_tokens: false }).ids
const EOS = 262
const target: RouteTarget = { workerId: 2n ** 63n + 7n, dpRank: 2 }

/** One LLMEngineOutput item as a worker sends it (llm_backend.rs@07d14345 field names). */
function item(tokenIds: number[], finish: unknown = null, extra: Record<string, unknown> = {}): unknown {
  return {
    data: {
      token_ids: tokenIds,
      tokens: null,
      text: null,
      output_type: 'text',
      cum_log_probs: null,
      log_probs: null,
      top_logprobs: null,
      finish_reason: finish,
      index: 0,
      ...extra,
    },
  }
}

function translator(body: Record<string, unknown>, kind: RequestKind, prompt = encode('prompt'), t0: RouteTarget | null = target) {
  const req = preprocessedRequest(body, kind, prompt, t0, { eosTokenIds: [EOS] })
  return new EngineOutputTranslator(req, { kind, ...streamOptions(body), decoder, target: t0, id: 'x-1', created: 1700000000 })
}

/** The events of an SSE text: parsed JSON, or '[DONE]'. */
function events(text: string): (Record<string, unknown> | '[DONE]')[] {
  return text
    .split('\n\n')
    .filter((x) => x !== '')
    .map((x) => (x === 'data: [DONE]' ? '[DONE]' : (JSON.parse(x.slice(6)) as Record<string, unknown>)))
}

type Chunk = { choices: { delta?: { content?: string; role?: string }; text?: string; finish_reason: string | null }[] }

/** Keys in order and leaf types: the shape of an answer, its values aside. */
function shape(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(shape)
  if (v !== null && typeof v === 'object') return Object.entries(v).map(([k, x]) => [k, shape(x)])
  return v === null ? 'null' : typeof v
}

t.test('streamed chat: split UTF-8 never breaks, role first, usage chunk, [DONE]', async (t) => {
  const text = 'héllo 🚀 world'
  const ids = encode(text)
  const tr = translator({ model: 'm', messages: [], stream: true, stream_options: { include_usage: true } }, 'chat')
  let out = ''
  for (const id of ids) {
    out += tr.push(item([id]))
    t.equal(tr.done, false)
  }
  out += tr.push(item([EOS], 'eos'))
  t.equal(tr.done, true)
  t.equal(tr.stopWorker, false, 'the worker ended it')
  out += tr.end()
  const ev = events(out)
  t.equal(ev.at(-1), '[DONE]')
  const chunks = ev.slice(0, -2) as unknown as Chunk[]
  const content = chunks.map((c) => c.choices[0]?.delta?.content ?? '')
  for (const c of content) t.notOk(c.includes('\uFFFD'), 'no broken character')
  t.equal(content.join(''), text)
  t.equal(chunks[0]?.choices[0]?.delta?.role, 'assistant')
  t.equal(chunks.filter((c) => c.choices[0]?.delta?.role !== undefined).length, 1, 'role in the first chunk only')
  t.equal(chunks.at(-1)?.choices[0]?.finish_reason, 'stop', 'eos is stop')
  t.ok(chunks.slice(0, -1).every((c) => c.choices[0]?.finish_reason === null))
  t.ok(chunks.length < ids.length + 1, 'tokens of one character make one chunk')
  const usage = ev.at(-2) as { choices: unknown[]; usage: Record<string, number> }
  t.same(usage.choices, [])
  t.same(usage.usage, { prompt_tokens: encode('prompt').length, completion_tokens: ids.length + 1, total_tokens: encode('prompt').length + ids.length + 1 })
  t.equal((ev[0] as { object: string }).object, 'chat.completion.chunk')
  t.match(out.split('\n\n')[0], /"decode_worker_id":9223372036854775815,/, 'nvext.worker_id on the first event, u64 exact')
  t.notMatch(out.split('\n\n').slice(1).join(''), /nvext/, 'and on no other')
})

t.test('the answers have the shapes the router relays from an HTTP worker', async (t) => {
  const fleet = await MockerFleet.start({ numWorkers: 1, firstWorkerId: 5n, blockSize: 16, speedupRatio: 0, modelName: 'm1' })
  t.teardown(() => fleet.close())
  const w = fleet.workers[0] as MockerWorker
  const rank = { workerId: 5n, dpRank: 0 }
  const post = async (path: string, body: unknown): Promise<string> =>
    (await fetch(w.url + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })).text()
  // one item per mocker word (its byte tokens), so one chunk per word as the mocker streams them
  const words = WORDS.slice(0, 3).map(encode)
  const tokenCount = words.flat().length
  for (const kind of ['completions', 'chat'] as const) {
    const path = kind === 'chat' ? '/v1/chat/completions' : '/v1/completions'
    const prompt = kind === 'chat' ? { messages: [{ role: 'user', content: 'hi' }] } : { prompt: 'hi' }
    // streamed, with usage: the proxy injects nvext.worker_id into the first event
    const base = { model: 'm1', max_tokens: 3, ...prompt }
    const theirs = (await post(path, { ...base, stream: true, stream_options: { include_usage: true } })).split('\n\n')
    theirs[0] = injectWorkerId(`${theirs[0]}\n\n`, rank).slice(0, -2)
    // the worker's tokens here are bytes, more of them than the mocker's words
    const ourBase = { ...base, max_tokens: tokenCount }
    const tr = translator({ ...ourBase, stream: true, stream_options: { include_usage: true } }, kind, encode('hi'), rank)
    let ours = ''
    words.forEach((ids, i) => {
      ours += tr.push(item(ids, i === words.length - 1 ? 'length' : null, i === words.length - 1 ? usageOf(3) : {}))
    })
    ours += tr.end()
    const a = events(ours)
    const b = events(theirs.join('\n\n'))
    t.equal(a.length, b.length, `${kind}: as many events`)
    t.same(a.map(shape), b.map(shape), `${kind}: streamed events have the HTTP worker's shapes`)
    t.same(
      a.map((e) => (e === '[DONE]' ? e : (e as Chunk).choices.map((c) => c.finish_reason))),
      b.map((e) => (e === '[DONE]' ? e : (e as Chunk).choices.map((c) => c.finish_reason))),
    )
    // whole: the proxy adds nvext.worker_id to the body
    const whole = JSON.parse(await post(path, base)) as Record<string, unknown>
    whole.nvext = { worker_id: workerIdObject(rank) }
    const tw = translator(ourBase, kind, encode('hi'), rank)
    words.forEach((ids, i) => tw.push(item(ids, i === words.length - 1 ? 'length' : null, i === words.length - 1 ? usageOf(3) : {})))
    const body = tw.end()
    t.same(shape(JSON.parse(body)), shape(JSON.parse(serializeJson(whole))), `${kind}: the whole answer has the HTTP worker's shape`)
    const choice = (JSON.parse(body) as { choices: { text?: string; message?: { content: string }; finish_reason: string }[] }).choices[0]
    t.equal(choice?.text ?? choice?.message?.content, WORDS.slice(0, 3).join(''))
    t.equal(choice?.finish_reason, 'length')
  }
})

function usageOf(completion: number): Record<string, unknown> {
  return {
    completion_usage: {
      prompt_tokens: 2,
      completion_tokens: completion,
      total_tokens: 2 + completion,
      prompt_tokens_details: { audio_tokens: null, cached_tokens: 1 },
      completion_tokens_details: null,
    },
  }
}

t.test('usage: the worker counts when it sends them, cached tokens included', async (t) => {
  const tr = translator({ prompt: 'p' }, 'completions')
  tr.push(item(encode('ab')))
  tr.push(item(encode('c'), 'length', usageOf(3)))
  const body = JSON.parse(tr.end()) as { usage: unknown; object: string; id: string; created: number; model: string }
  t.same(body.usage, { prompt_tokens: 2, completion_tokens: 3, total_tokens: 5, prompt_tokens_details: { cached_tokens: 1 } })
  t.same([body.object, body.id, body.created, body.model], ['text_completion', 'x-1', 1700000000, ''])
  const streamed = translator({ prompt: 'p', stream: true }, 'completions')
  const ev = events(streamed.push(item(encode('ab'), 'stop')) + streamed.end())
  t.equal(ev.length, 2, 'no usage chunk unless asked for')
  t.equal(ev[1], '[DONE]')
})

t.test('finish reasons', async (t) => {
  const cases: [unknown, string][] = [
    ['eos', 'stop'],
    ['stop', 'stop'],
    ['length', 'length'],
    ['cancelled', 'stop'],
    ['abort', 'stop'],
    ['content_filter', 'content_filter'],
  ]
  for (const [dynamo, openai] of cases) {
    const tr = translator({ prompt: 'p' }, 'completions', encode('p'), null)
    tr.push(item(encode('ok'), dynamo))
    const body = JSON.parse(tr.end()) as { choices: { finish_reason: string; text: string }[]; nvext?: unknown }
    t.equal(body.choices[0]?.finish_reason, openai, `${String(dynamo)} → ${openai}`)
    t.equal(body.choices[0]?.text, 'ok')
    t.equal(body.nvext, undefined, 'no worker chosen: no nvext')
  }
  // a stream that ends without a finish reason ends as stop
  const tr = translator({ prompt: 'p', stream: true }, 'completions')
  const ev = events(tr.push(item(encode('ab'))) + tr.end()) as unknown as Chunk[]
  t.equal(ev[1]?.choices[0]?.finish_reason, 'stop')
})

t.test('stop strings the worker could not apply: held back, cut, or kept when asked', async (t) => {
  const answer = 'one two END three'
  const run = (body: Record<string, unknown>): { text: string; tr: EngineOutputTranslator } => {
    const tr = translator({ prompt: 'p', ...body }, 'completions')
    for (const id of encode(answer)) {
      tr.push(item([id]))
      if (tr.done) break
    }
    const out = JSON.parse(tr.end()) as { choices: { text: string; finish_reason: string }[] }
    return { text: out.choices[0]?.text ?? '', tr }
  }
  const cut = run({ stop: ['END', 'zzz'] })
  t.equal(cut.text, 'one two ')
  t.equal(cut.tr.stopWorker, true, 'the router ended the answer: the worker must stop')
  t.equal(run({ stop: ['END'], include_stop_str_in_output: true }).text, 'one two END')
  t.equal(run({ stop: ['ENDX'] }).text, answer, 'a partial match is released when the answer ends')
  t.equal(run({ stop: ['o'] }).text, '')
  t.equal(run({ stop: ['o'], min_tokens: 3 }).text, 'one tw', 'no stop within min_tokens: the first o is the first token')

  // streamed: a possible stop string is held until it is ruled out
  const tr = translator({ prompt: 'p', stream: true, stop: ['END'] }, 'completions')
  const pieces = encode('aE').map((id) => tr.push(item([id])))
  t.equal((events(pieces[0] as string)[0] as Chunk).choices[0]?.text, 'a')
  t.equal(pieces[1], '', '"E" could start END: held')
  const next = events(tr.push(item(encode('x'))))[0] as Chunk
  t.equal(next.choices[0]?.text, 'Ex', 'released once ruled out')
})

t.test('hidden stop tokens, stop token ids, max_tokens', async (t) => {
  const eos = translator({ prompt: 'p' }, 'completions')
  eos.push(item([...encode('hi'), EOS, ...encode('more')]))
  t.equal(eos.done, true)
  t.equal(eos.stopWorker, true)
  t.equal((JSON.parse(eos.end()) as Chunk).choices[0]?.text, 'hi', 'the EOS ends the answer and is not shown')
  const user = translator({ prompt: 'p', stop_token_ids: [encode('x')[0] as number] }, 'completions')
  user.push(item(encode('abxcd')))
  t.equal((JSON.parse(user.end()) as Chunk).choices[0]?.text, 'ab')
  const ignore = translator({ prompt: 'p', ignore_eos: true }, 'completions')
  ignore.push(item([...encode('hi'), EOS, ...encode('yo')], 'length'))
  t.equal((JSON.parse(ignore.end()) as Chunk).choices[0]?.text, 'hiyo', 'ignore_eos: the EOS is not a stop (and, special, not shown)')
  const max = translator({ prompt: 'p', max_tokens: 3 }, 'completions')
  max.push(item(encode('abcdef')))
  const body = JSON.parse(max.end()) as Chunk
  t.equal(body.choices[0]?.text, 'abc')
  t.equal(body.choices[0]?.finish_reason, 'length')
  t.equal(max.stopWorker, true)
  t.equal(max.push(item(encode('late'))), '', 'items after the end are ignored')
  t.equal(max.push({ event: 'error', comment: ['cancelled by the stop'] }), '', 'errors too: the answer is complete')
})

t.test('text the worker decoded is used as sent', async (t) => {
  const tr = translator({ prompt: 'p', stream: true, stop: ['o'] }, 'chat')
  const ev = events(tr.push(item([1, 2], null, { text: 'hello' })) + tr.push(item([3], 'stop', { text: '!' })) + tr.end())
  t.same(
    (ev.slice(0, 2) as unknown as Chunk[]).map((c) => c.choices[0]?.delta?.content),
    ['hello', '!'],
  )
  const none = new EngineOutputTranslator(preprocessedRequest({}, 'completions', [1], null), {
    kind: 'completions',
    stream: false,
    includeUsage: false,
    decoder: null,
    target: null,
  })
  none.push(item([], null, { text: 'fine' }))
  t.throws(() => none.push(item([5])), { code: 'KVR_ERR_UPSTREAM', message: /--tokenizer/ })
  t.match(JSON.parse(none.end()), { id: /^cmpl-[0-9a-f-]{36}$/, choices: [{ text: 'fine' }] })
})

t.test('worker errors: thrown, before or after the first event; annotations ignored', async (t) => {
  const tr = translator({ prompt: 'p', stream: true }, 'chat')
  t.equal(tr.push({ event: 'llm_metrics', comment: ['{}'] }), '')
  t.equal(tr.started, false)
  t.throws(() => tr.push({ event: 'error', comment: ['engine overloaded'], error_code: 503 }), { code: 'KVR_ERR_UPSTREAM', retryable: true })
  const mid = translator({ prompt: 'p', stream: true }, 'chat')
  t.ok(mid.push(item(encode('hi'))).startsWith('data: '))
  t.equal(mid.started, true)
  let err: unknown
  try {
    mid.push(item([], { error: 'CUDA error' }))
  } catch (e) {
    err = e
  }
  t.match(err, { code: 'KVR_ERR_UPSTREAM', message: /CUDA error/ })
  t.same(events(mid.errorEvent(err as never)), [{ error: { code: 'KVR_ERR_UPSTREAM', message: (err as Error).message, type: 'upstream_error' } }])
  t.throws(() => mid.push(item([1], null, { index: 1 })), { code: 'KVR_ERR_UPSTREAM', message: /choice 1/ })
  t.throws(() => mid.push({ data: { token_ids: 'x' } }), { code: 'KVR_ERR_UPSTREAM' })
  t.same(mid.usage, { promptTokens: encode('prompt').length, completionTokens: encode('hi').length, cachedTokens: null })
})

t.test('log probabilities, when asked, in both shapes', async (t) => {
  const ids = encode('hi🚀')
  const lps = ids.map((_, i) => -0.25 * (i + 1))
  const tops = ids.map((id, i) =>
    i === 0 ? [{ rank: 1, token_id: 111, token: null, logprob: -0.1 }] : [{ rank: 1, token_id: id, token: null, logprob: lps[i] }],
  )
  const withLp = (tokenIds: number[], from: number, finish: unknown = null) =>
    item(tokenIds, finish, { log_probs: lps.slice(from, from + tokenIds.length), top_logprobs: tops.slice(from, from + tokenIds.length) })
  // chat, streamed: one chunk per item; the rocket's held bytes still carry their log probabilities
  const chat = translator({ messages: [], stream: true, logprobs: true, top_logprobs: 1 }, 'chat')
  const ev = events(ids.map((id, i) => chat.push(withLp([id], i, i === ids.length - 1 ? 'stop' : null))).join('') + chat.end()) as unknown as {
    choices: { delta: { content?: string }; logprobs: { content: { token: string; logprob: number; bytes: number[]; top_logprobs: unknown[] }[] } }[]
  }[]
  t.equal(ev.length - 1, ids.length, 'a chunk for every token, text or not')
  const content = ev.slice(0, -1).flatMap((e) => e.choices[0]?.logprobs.content ?? [])
  t.same(
    content.map((c) => c.logprob),
    lps,
  )
  t.same(
    content[0],
    {
      token: 'h',
      logprob: -0.25,
      bytes: [104],
      top_logprobs: [
        { token: 'o', logprob: -0.1, bytes: [111] },
        { token: 'h', logprob: -0.25, bytes: [104] },
      ],
    },
    'the chosen token joins its alternatives; a token without text is decoded',
  )
  t.same(content[2]?.top_logprobs.length, 1, 'already among them: not added twice')
  // completions, whole: the answer's arrays, text offsets from the tokens' texts
  const comp = translator({ prompt: 'p', logprobs: 1 }, 'completions')
  comp.push(withLp(ids.slice(0, 2), 0))
  comp.push(withLp(ids.slice(2), 2, 'length'))
  const body = JSON.parse(comp.end()) as {
    choices: { logprobs: { tokens: string[]; token_logprobs: number[]; top_logprobs: object[]; text_offset: number[] } }[]
  }
  const lp = body.choices[0]?.logprobs
  t.same(lp?.tokens.slice(0, 2), ['h', 'i'])
  t.same(lp?.token_logprobs, lps)
  t.same(lp?.top_logprobs[0], { o: -0.1 })
  t.same(lp?.text_offset.slice(0, 3), [0, 1, 2])
  // not asked: null, whatever the worker sends
  const plain = translator({ prompt: 'p' }, 'completions')
  plain.push(withLp(ids, 0, 'stop'))
  t.equal((JSON.parse(plain.end()) as { choices: { logprobs: unknown }[] }).choices[0]?.logprobs, null)
  // a hidden stop token has no entry
  const eos = translator({ prompt: 'p', logprobs: 0 }, 'completions')
  eos.push(item([...ids.slice(0, 2), EOS], null, { log_probs: [-1, -2, -3] }))
  t.same((JSON.parse(eos.end()) as { choices: { logprobs: { token_logprobs: number[] } }[] }).choices[0]?.logprobs.token_logprobs, [-1, -2])
})
