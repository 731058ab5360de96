// An OpenAI body as Dynamo's PreprocessedRequest: the JSON has the keys, order, nulls and
// omissions serde derives for Dynamo's structs, u64 ids exact; the MessagePack is
// rmp_serde::to_vec_named's bytes; OpenAI fields map as Dynamo's preprocessor maps them; bad
// fields are a 400 naming the field.
import t from 'tap'
import { Unpackr } from 'msgpackr'
import { parseJsonExact } from '../../src/codec/json.js'
import { preprocessedRequest } from '../../src/frontend/preprocessed-request.js'
import { encodeRequest } from '../../src/request-plane/payload-codec.js'

/** Every object's keys in order, nested: serde writes a struct's fields in declaration order. */
function keyPaths(v: unknown, at = ''): string[] {
  if (Array.isArray(v)) return v.flatMap((x, i) => keyPaths(x, `${at}[${i}]`))
  if (v === null || typeof v !== 'object') return []
  return Object.entries(v).flatMap(([k, x]) => [`${at}.${k}`, ...keyPaths(x, `${at}.${k}`)])
}

t.test('a completions body: serde JSON, keys in order, u64 worker id exact', async (t) => {
  const body = {
    model: 'qwen',
    prompt: 'ignored: the router tokenized it',
    max_tokens: 16,
    stop: ['\n\n'],
    temperature: 0.5,
    top_k: 0,
    seed: 7,
    min_tokens: 2,
    logprobs: 2,
    skip_special_tokens: false,
    cache_salt: 'tenant-a',
    nvext: { annotations: ['request_id'], agent_hints: { priority: 3, osl: 100 } },
  }
  const req = preprocessedRequest(body, 'completions', [1, 2, 3], { workerId: 2n ** 63n + 5n, dpRank: 1 }, { eosTokenIds: [262] })
  // Transcribed by hand from lib/llm/src/protocols/common/preprocessor.rs@000a36a7 (PreprocessedRequest:
  // model, token_ids; generate_request, prompt_embeds, multi_modal_data, mm_routing_info skipped when None;
  // stop_conditions, sampling_options, output_options, eos_token_ids, mdc_sum (Option without
  // skip_serializing_if: null), annotations, routing (skipped when None), router_config_override (null);
  // RoutingHints: every field skip_serializing_if None, cache_namespace renamed "cache_salt") and
  // lib/llm/src/protocols/common.rs@0ab24416 (StopConditions, SamplingOptions, OutputOptions: no
  // skip_serializing_if, every field written; top_k 0 canonicalized to -1 and priority_jump =
  // max(priority, 0) as f64 per lib/llm/src/protocols/openai.rs@06f182c0 and the preprocessor).
  const golden =
    '{"model":"qwen","token_ids":[1,2,3],' +
    '"stop_conditions":{"max_tokens":16,"stop":["\\n\\n"],"stop_token_ids":null,"stop_token_ids_hidden":[262],"min_tokens":2,' +
    '"ignore_eos":null,"max_thinking_tokens":null},' +
    '"sampling_options":{"n":null,"best_of":null,"presence_penalty":null,"frequency_penalty":null,"repetition_penalty":null,' +
    '"temperature":0.5,"top_p":null,"top_k":-1,"min_p":null,"use_beam_search":null,"length_penalty":null,"seed":7,' +
    '"include_stop_str_in_output":null,"guided_decoding":null},' +
    '"output_options":{"logprobs":2,"prompt_logprobs":null,"skip_special_tokens":false,"formatted_prompt":null,"return_tokens_as_token_ids":null},' +
    '"eos_token_ids":[262],"mdc_sum":null,"annotations":["request_id"],' +
    '"routing":{"backend_instance_id":9223372036854775813,"dp_rank":1,"expected_output_tokens":100,"cache_salt":"tenant-a",' +
    '"priority_jump":3.0,"priority":3},' +
    '"router_config_override":null}'
  const json = encodeRequest(req, 'json').toString('utf8')
  // serde_json writes the f64 priority_jump 3 as 3.0: the same number
  t.same(parseJsonExact(json), parseJsonExact(golden))
  t.same(keyPaths(parseJsonExact(json)), keyPaths(parseJsonExact(golden)), 'every key in serde order')
  t.match(json, /"backend_instance_id":9223372036854775813,/, 'the u64 worker id is an exact JSON integer')
  t.notMatch(json, /cache_namespace/, 'RoutingHints.cache_namespace is renamed cache_salt (test routing_hints_cache_namespace_serializes_as_cache_salt)')
})

t.test('MessagePack: rmp_serde named-map bytes', async (t) => {
  const req = preprocessedRequest({ prompt: 'x' }, 'completions', [1, 2, 3], { workerId: 7n, dpRank: 0 }, { model: 'm' })
  // Transcribed by hand from the same structs (preprocessor.rs@000a36a7, common.rs@0ab24416) as
  // rmp_serde::to_vec_named writes them: fixmap headers (0x80 | fields), fixstr keys (0xa0 | length),
  // nil 0xc0, empty fixarray 0x90, positive fixints; u64 7 as fixint like any uint.
  const parts: [string, string][] = [
    ['8a', ''],
    ['a5', 'model'],
    ['a1', 'm'],
    ['a9', 'token_ids'],
    ['93010203', ''],
    ['af', 'stop_conditions'],
    ['87', ''],
    ['aa', 'max_tokens'],
    ['c0', ''],
    ['a4', 'stop'],
    ['c0', ''],
    ['ae', 'stop_token_ids'],
    ['c0', ''],
    ['b5', 'stop_token_ids_hidden'],
    ['90', ''],
    ['aa', 'min_tokens'],
    ['c0', ''],
    ['aa', 'ignore_eos'],
    ['c0', ''],
    ['b3', 'max_thinking_tokens'],
    ['c0', ''],
    ['b0', 'sampling_options'],
    ['8e', ''],
    ['a1', 'n'],
    ['c0', ''],
    ['a7', 'best_of'],
    ['c0', ''],
    ['b0', 'presence_penalty'],
    ['c0', ''],
    ['b1', 'frequency_penalty'],
    ['c0', ''],
    ['b2', 'repetition_penalty'],
    ['c0', ''],
    ['ab', 'temperature'],
    ['c0', ''],
    ['a5', 'top_p'],
    ['c0', ''],
    ['a5', 'top_k'],
    ['c0', ''],
    ['a5', 'min_p'],
    ['c0', ''],
    ['af', 'use_beam_search'],
    ['c0', ''],
    ['ae', 'length_penalty'],
    ['c0', ''],
    ['a4', 'seed'],
    ['c0', ''],
    ['ba', 'include_stop_str_in_output'],
    ['c0', ''],
    ['af', 'guided_decoding'],
    ['c0', ''],
    ['ae', 'output_options'],
    ['85', ''],
    ['a8', 'logprobs'],
    ['c0', ''],
    ['af', 'prompt_logprobs'],
    ['c0', ''],
    ['b3', 'skip_special_tokens'],
    ['c0', ''],
    ['b0', 'formatted_prompt'],
    ['c0', ''],
    ['ba', 'return_tokens_as_token_ids'],
    ['c0', ''],
    ['ad', 'eos_token_ids'],
    ['90', ''],
    ['a7', 'mdc_sum'],
    ['c0', ''],
    ['ab', 'annotations'],
    ['90', ''],
    ['a7', 'routing'],
    ['82', ''],
    ['b3', 'backend_instance_id'],
    ['07', ''],
    ['a7', 'dp_rank'],
    ['00', ''],
    ['b6', 'router_config_override'],
    ['c0', ''],
  ]
  const golden = Buffer.concat(parts.map(([hex, text]) => Buffer.concat([Buffer.from(hex, 'hex'), Buffer.from(text, 'latin1')])))
  t.equal(encodeRequest(req, 'msgpack').toString('hex'), golden.toString('hex'))
})

t.test('MessagePack: a worker id past 2^53 stays exact', async (t) => {
  const id = 2n ** 64n - 2n
  const req = preprocessedRequest({}, 'chat', [5], { workerId: id, dpRank: 3 })
  const back = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' }).unpack(encodeRequest(req, 'msgpack')) as {
    routing: { backend_instance_id: bigint; dp_rank: number }
  }
  t.equal(back.routing.backend_instance_id, id)
  t.equal(back.routing.dp_rank, 3)
})

t.test('OpenAI fields map as Dynamo maps them', async (t) => {
  const chat = preprocessedRequest(
    {
      model: 'm',
      messages: [],
      max_tokens: 5,
      max_completion_tokens: 9,
      stop: 'END',
      stop_token_ids: [77],
      presence_penalty: 0.5,
      frequency_penalty: -0.5,
      repetition_penalty: 1.1,
      top_p: 0.9,
      top_k: 40,
      min_p: 0.05,
      n: 1,
      include_stop_str_in_output: true,
      logprobs: true,
      top_logprobs: 3,
      guided_regex: '[0-9]+',
      guided_decoding_backend: 'xgrammar',
      nvext: { agent_hints: { latency_sensitivity: 1.5 }, request_timestamp_ms: 1700000000000.5 },
    },
    'chat',
    [1],
    null,
    { eosTokenIds: [2, 3], loraName: 'adapter-a', mdcSum: 'abc' },
  )
  t.equal(chat.stop_conditions.max_tokens, 9, 'chat: max_completion_tokens wins over max_tokens')
  t.same(chat.stop_conditions.stop, ['END'], 'a single stop string becomes a list')
  t.same(chat.stop_conditions.stop_token_ids, [77])
  t.same(chat.stop_conditions.stop_token_ids_hidden, [2, 3], 'the model EOS ids are hidden stop tokens')
  t.same(chat.eos_token_ids, [2, 3])
  t.equal(chat.sampling_options.top_k, 40)
  t.equal(chat.sampling_options.n, 1)
  t.equal(chat.sampling_options.include_stop_str_in_output, true)
  t.same(chat.sampling_options.guided_decoding, { regex: '[0-9]+', backend: 'xgrammar' })
  t.equal(chat.output_options.logprobs, 3, 'chat: logprobs true with top_logprobs 3')
  t.equal(chat.mdc_sum, 'abc')
  t.same(chat.routing, { lora_name: 'adapter-a', priority_jump: 1.5 }, 'no worker chosen: no backend_instance_id')
  t.equal(chat.request_timestamp_ms, 1700000000000.5)
  t.same(Object.keys(chat).slice(-3), ['routing', 'router_config_override', 'request_timestamp_ms'], 'struct order')

  const noLogprobs = preprocessedRequest({ logprobs: false, top_logprobs: 3 }, 'chat', [1], null)
  t.equal(noLogprobs.output_options.logprobs, null)
  t.equal(noLogprobs.routing, undefined, 'no hints at all: routing is left out')
  t.equal(preprocessedRequest({ max_tokens: 4 }, 'completions', [1], null).stop_conditions.max_tokens, 4)
  t.equal(preprocessedRequest({ nvext: { greed_sampling: true }, temperature: 1, top_p: 0.5 }, 'completions', [1], null).sampling_options.temperature, null)

  // StopConditions::apply_ignore_eos (common.rs@0ab24416): ignoring the EOS drops every stop; no eos_token_ids either
  const ignore = preprocessedRequest({ ignore_eos: true, stop: ['x'], stop_token_ids: [1] }, 'completions', [1], null, { eosTokenIds: [2] })
  t.same(ignore.stop_conditions, {
    max_tokens: null,
    stop: null,
    stop_token_ids: null,
    stop_token_ids_hidden: null,
    min_tokens: null,
    ignore_eos: true,
    max_thinking_tokens: null,
  })
  t.same(ignore.eos_token_ids, [])
})

t.test('bad fields are a 400 naming the field', async (t) => {
  const bad: [Record<string, unknown>, RegExp][] = [
    [{ max_tokens: -1 }, /max_tokens must be an integer/],
    [{ max_tokens: 1.5 }, /max_tokens/],
    [{ temperature: 'hot' }, /temperature must be a number/],
    [{ temperature: 9 }, /temperature must be a number in \[0, 2\]/],
    [{ stop: [1] }, /stop must be a list of strings/],
    [{ n: 2 }, /n must be 1/],
    [{ best_of: 3 }, /best_of must be 1/],
    [{ ignore_eos: 'yes' }, /ignore_eos must be true or false/],
    [{ stop_token_ids: [-1] }, /stop_token_ids must be a list of token ids/],
    [{ nvext: [] }, /nvext must be an object/],
    [{ nvext: { annotations: 'a' } }, /annotations must be a list of strings/],
    [{ nvext: { agent_hints: { priority: 2 ** 40 } } }, /priority must be an integer in \[-2147483648, 2147483647\]/],
    [{ top_k: 2 ** 31 }, /top_k must be an integer in/],
    [{ seed: 1.5 }, /seed must be an integer/],
    [{ guided_json: {}, guided_regex: 'x' }, /only one of guided_json/],
    [{ model: 5 }, /model must be a string/],
  ]
  for (const [body, re] of bad) t.throws(() => preprocessedRequest(body, 'completions', [1], null), { code: 'KVR_ERR_INVALID_REQUEST', message: re })
  t.throws(() => preprocessedRequest({}, 'completions', [], null), { code: 'KVR_ERR_EMPTY_PROMPT' })
})

t.test('JSON: the routing hints are put in place whatever the client wrote', async (t) => {
  // client text that looks like the routing key, before it (guided_json) and after it (cache_salt)
  const body = {
    guided_json: { routing: 0, router_config_override: null },
    cache_salt: '"routing":0,"router_config_override":null',
    stop: ['"routing":0'],
    temperature: 0.7,
  }
  const req = preprocessedRequest(body, 'completions', Uint32Array.from([9, 8]), { workerId: 2n ** 64n - 1n, dpRank: 0 })
  const back = parseJsonExact(encodeRequest(req, 'json').toString('utf8')) as Record<string, unknown>
  t.same(back.routing, { backend_instance_id: '18446744073709551615', dp_rank: 0, cache_salt: body.cache_salt })
  t.same((back.sampling_options as { guided_decoding: unknown }).guided_decoding, { json: body.guided_json })
  t.same(back.token_ids, [9, 8])
  t.same(Object.keys(back).slice(-3), ['annotations', 'routing', 'router_config_override'])
  // hints built by hand with the worker id alone, and none at all
  const alone = { ...req, routing: { backend_instance_id: 12n } }
  t.same((JSON.parse(encodeRequest(alone, 'json').toString('utf8')) as { routing: unknown }).routing, { backend_instance_id: 12 })
  const none = preprocessedRequest({}, 'completions', [1], null)
  t.equal(encodeRequest(none, 'json').toString('utf8'), JSON.stringify(none))
  // MessagePack floats are float64: f32 fields read them as serde reads JSON numbers
  const mp = new Unpackr({ useRecords: false, mapsAsObjects: true }).unpack(encodeRequest(req, 'msgpack')) as { sampling_options: { temperature: number } }
  t.equal(mp.sampling_options.temperature, 0.7)
  t.equal(encodeRequest(req, 'msgpack').includes(Buffer.from('cb3fe6666666666666', 'hex')), true, '0.7 as float64 (0xcb)')
})
