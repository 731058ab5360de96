// A Dynamo worker's stream items, Annotated<LLMEngineOutput>, as Dynamo's structs serialize
// them (JSON and rmp_serde MessagePack), read into what the answer is built from; every form of
// failure a worker reports becomes a catalogue error; malformed items are refused.
import t from 'tap'
import { Packr } from 'msgpackr'
import { readEngineItem } from '../../src/frontend/engine-output.js'
import type { EngineItem, WorkerError } from '../../src/frontend/engine-output.js'
import { decodeItem } from '../../src/request-plane/payload-codec.js'

// Transcribed by hand from lib/llm/src/protocols/common/llm_backend.rs@07d14345: LLMEngineOutput's
// fields in order (token_ids, tokens, text, output_type (serde default "text", rename_all lowercase),
// content_parts (skipped when None), cum_log_probs, log_probs, top_logprobs, finish_reason, stop_reason
// (skipped when None), index, then the skip-when-None extras), as its constructors length(), error(…),
// cancelled() build them; FinishReason from lib/llm/src/protocols/common.rs@0ab24416 (unit variants
// renamed eos/length/stop/cancelled (alias abort)/content_filter; Error(String) externally tagged
// {"error": …}); Annotated::from_data from lib/runtime/src/protocols/annotated.rs@031f90c2 (every field
// skipped when None).
const NULLS = '"tokens":null,"text":null,"output_type":"text","cum_log_probs":null,"log_probs":null,"top_logprobs":null'
const LENGTH = `{"data":{"token_ids":[],${NULLS},"finish_reason":"length","index":null}}`
const ERROR = `{"data":{"token_ids":[],${NULLS},"finish_reason":{"error":"engine crashed"},"index":null}}`
const CANCELLED = `{"data":{"token_ids":[],${NULLS},"finish_reason":"cancelled","index":null}}`
const TOKENS = `{"data":{"token_ids":[104,105],${NULLS},"finish_reason":null,"index":0}}`
// completion_usage: dynamo_protocols CompletionUsage {prompt_tokens, completion_tokens, total_tokens,
// prompt_tokens_details: {audio_tokens, cached_tokens}, completion_tokens_details}
const USAGE =
  `{"data":{"token_ids":[33],${NULLS},"finish_reason":"eos","index":0,"completion_usage":{"prompt_tokens":12,"completion_tokens":3,` +
  `"total_tokens":15,"prompt_tokens_details":{"audio_tokens":null,"cached_tokens":8},"completion_tokens_details":null}}}`
// an engine that decodes: text and tokens set
const TEXT =
  '{"data":{"token_ids":[7],"tokens":["hi"],"text":"hi","output_type":"text","cum_log_probs":null,"log_probs":null,' +
  '"top_logprobs":null,"finish_reason":"stop","index":0}}'

const read = (json: string): EngineItem => readEngineItem(JSON.parse(json))
const output = (item: EngineItem) => {
  if (item.kind !== 'output') throw new Error(`not an output: ${item.kind}`)
  return item.output
}

t.test('LLMEngineOutput items as Dynamo writes them', async (t) => {
  const none = { usage: null, tokens: null, logProbs: null, topLogprobs: null }
  t.same(output(read(TOKENS)), { tokenIds: [104, 105], text: null, finishReason: null, errorMessage: null, index: 0, ...none })
  t.equal(output(read(LENGTH)).finishReason, 'length')
  t.equal(output(read(LENGTH)).index, 0, 'index null is choice 0')
  t.equal(output(read(CANCELLED)).finishReason, 'cancelled')
  t.equal(output(read(CANCELLED.replace('"cancelled"', '"abort"'))).finishReason, 'cancelled', 'serde alias abort')
  for (const f of ['eos', 'stop', 'content_filter']) t.equal(output(read(LENGTH.replace('"length"', `"${f}"`))).finishReason, f)
  t.same(output(read(ERROR)), { tokenIds: [], text: null, finishReason: 'error', errorMessage: 'engine crashed', index: 0, ...none })
  t.same(output(read(USAGE)).usage, { promptTokens: 12, completionTokens: 3, cachedTokens: 8 })
  t.equal(output(read(TEXT)).text, 'hi')
  t.same(output(read(TEXT)).tokens, ['hi'])
  // log probabilities: log_probs per token, top_logprobs as TopLogprob {rank, token_id, token, logprob, bytes?} (llm_backend.rs@07d14345)
  const lp = output(
    read(
      TOKENS.replace('"log_probs":null', '"log_probs":[-0.5,-1.25]').replace(
        '"top_logprobs":null',
        '"top_logprobs":[[{"rank":1,"token_id":104,"token":"h","logprob":-0.5,"bytes":[104]}],[{"rank":1,"token_id":9,"token":null,"logprob":-1}]]',
      ),
    ),
  )
  t.same(lp.logProbs, [-0.5, -1.25])
  t.same(lp.topLogprobs, [[{ tokenId: 104, token: 'h', logprob: -0.5 }], [{ tokenId: 9, token: null, logprob: -1 }]])
})

t.test('the same items in MessagePack (rmp_serde named maps) and JSON bytes', async (t) => {
  // what rmp_serde::to_vec_named writes for TOKENS: a 9-key map, nils, a fixarray of fixints
  const parts: [string, string][] = [
    ['81', ''],
    ['a4', 'data'],
    ['89', ''],
    ['a9', 'token_ids'],
    ['926869', ''],
    ['a6', 'tokens'],
    ['c0', ''],
    ['a4', 'text'],
    ['c0', ''],
    ['ab', 'output_type'],
    ['a4', 'text'],
    ['ad', 'cum_log_probs'],
    ['c0', ''],
    ['a9', 'log_probs'],
    ['c0', ''],
    ['ac', 'top_logprobs'],
    ['c0', ''],
    ['ad', 'finish_reason'],
    ['c0', ''],
    ['a5', 'index'],
    ['00', ''],
  ]
  const golden = Buffer.concat(parts.map(([hex, text]) => Buffer.concat([Buffer.from(hex, 'hex'), Buffer.from(text, 'latin1')])))
  t.same(readEngineItem(decodeItem(golden, 'msgpack')), read(TOKENS))
  t.same(readEngineItem(decodeItem(Buffer.from(USAGE), 'json')), read(USAGE))
  // a stream item sliced out of a larger buffer (a frame) decodes from its own bytes
  const framed = Buffer.concat([Buffer.from('xx'), Buffer.from(LENGTH), Buffer.from('yy')])
  t.same(readEngineItem(decodeItem(framed.subarray(2, framed.length - 2), 'json')), read(LENGTH))
  t.throws(() => decodeItem(Buffer.from('{not json'), 'json'), { code: 'KVR_ERR_UPSTREAM', message: /not JSON/ })
  t.throws(() => decodeItem(Buffer.from([0x92, 0x01]), 'msgpack'), { code: 'KVR_ERR_UPSTREAM', message: /not MessagePack/ })
  t.same(readEngineItem(new Packr({ useRecords: false }).unpack(new Packr({ useRecords: false }).pack(JSON.parse(ERROR)))), read(ERROR))
})

t.test('annotations are not part of the answer', async (t) => {
  // Annotated::from_annotation: event = name, comment = [JSON of the value] (annotated.rs@031f90c2)
  t.same(read('{"event":"llm_metrics","comment":["{\\"input_tokens\\":3}"]}'), { kind: 'annotation', event: 'llm_metrics' })
  t.same(read('{}'), { kind: 'annotation', event: null })
  t.same(read('{"id":"1","data":null}'), { kind: 'annotation', event: null })
})

function failure(json: string): WorkerError {
  const item = read(json)
  if (item.kind !== 'error') throw new Error(`not an error: ${item.kind}`)
  return item.error
}

t.test('errors in every generation of Annotated map to the catalogue', async (t) => {
  // annotated.rs@031f90c2 Annotated::from_error: {"event":"error","comment":[message]}
  let e = failure('{"event":"error","comment":["worker crashed"]}')
  t.match(e, { code: 'KVR_ERR_UPSTREAM', statusCode: 502, errorClass: 'Unknown', retryable: false, message: /worker crashed/ })
  t.match(failure('{"event":"error","comment":["a","b"]}').message, /a, b$/, 'comments joined as Annotated::ok joins them')
  t.match(failure('{"event":"error"}').message, /unknown error$/)
  // annotated.rs@9503e1bd Annotated::from_error_with_code: + "error_code": u16
  e = failure('{"event":"error","comment":["prompt too long"],"error_code":400}')
  t.match(e, { code: 'KVR_ERR_INVALID_REQUEST', statusCode: 400 })
  t.match(failure('{"event":"error","comment":["overloaded"],"error_code":503}'), { code: 'KVR_ERR_UPSTREAM', retryable: true })
  t.match(failure('{"event":"error","comment":["gone"],"error_code":499}'), { code: 'KVR_ERR_REQUEST_CANCELLED', statusCode: 499 })
  t.match(failure('{"event":"error","comment":["x"],"error_code":500}'), { code: 'KVR_ERR_UPSTREAM', retryable: false })
  // newest annotated.rs: + "error": DynamoError, serialized per lib/runtime/src/error.rs@0b436c83
  // (error_type (legacy wire class), class, reason, message, diagnostic?, public?, caused_by?).
  // The builder with error_type InvalidArgument and message "bad request" (test legacy_builder_derives_semantic_defaults):
  e = failure(
    '{"event":"error","error":{"error_type":"InvalidArgument","class":"InvalidRequest","reason":"request.invalid_argument",' +
      '"message":"bad request","diagnostic":"bad request"}}',
  )
  t.match(e, { code: 'KVR_ERR_INVALID_REQUEST', errorClass: 'InvalidArgument', retryable: false, message: /\(InvalidArgument\): bad request$/ })
  // the legacy JSON error.rs's test legacy_json_derives_semantic_defaults reads
  t.match(failure('{"event":"error","error":{"error_type":"InvalidArgument","message":"bad request"}}'), { code: 'KVR_ERR_INVALID_REQUEST' })
  // test legacy_unknown_preserves_nested_classification_across_the_wire: the cause's class counts
  e = failure(
    '{"event":"error","error":{"error_type":"Unknown","message":"generate failed","caused_by":{"error_type":"InvalidArgument","message":"bad request"}}}',
  )
  t.match(e, { code: 'KVR_ERR_INVALID_REQUEST', errorClass: 'InvalidArgument', message: /generate failed/ })
  // test public_fields_fail_closed_at_consumer_boundaries's serialized form
  e = failure(
    '{"event":"error","error":{"error_type":"Unknown","message":"private details","class":"Internal","reason":"runtime.invalid_error",' +
      '"diagnostic":"private details"}}',
  )
  t.match(e, { code: 'KVR_ERR_UPSTREAM', errorClass: 'Unknown', retryable: false })
  // error_class_deserialization_preserves_backend: {"Backend": "…"}
  t.match(failure('{"event":"error","error":{"error_type":{"Backend":"EngineShutdown"},"message":"engine down"}}'), {
    code: 'KVR_ERR_UPSTREAM',
    errorClass: 'BackendEngineShutdown',
    retryable: true,
  })
  t.match(failure('{"event":"error","error":{"class":"Cancelled","reason":"request.cancelled"}}'), {
    code: 'KVR_ERR_REQUEST_CANCELLED',
    message: /request\.cancelled/,
  })
  t.match(failure('{"event":"error","error":{"error_type":"WorkerOverloaded","class":"CapacityExhausted","message":"full"}}'), { retryable: true })
  t.match(failure('{"event":"error","error":"plain text"}'), { code: 'KVR_ERR_UPSTREAM', message: /plain text/ })
})

t.test('malformed items are refused with KVR_ERR_UPSTREAM', async (t) => {
  const bad: [unknown, RegExp][] = [
    [[], /not an object/],
    [{ event: 5 }, /event is not a string/],
    [{ data: 'x' }, /data is not an object/],
    [{ data: { token_ids: [-1] } }, /token_ids/],
    [{ data: { token_ids: 'abc' } }, /token_ids/],
    [{ data: { token_ids: [], text: 5 } }, /text is not a string/],
    [{ data: { token_ids: [], index: -1 } }, /index/],
    [{ data: { token_ids: [], finish_reason: 'done' } }, /unknown finish_reason "done"/],
    [{ data: { token_ids: [], finish_reason: { oops: 1 } } }, /finish_reason is neither/],
    [{ data: { token_ids: [], completion_usage: { prompt_tokens: 'x' } } }, /completion_usage/],
    [{ data: { token_ids: [], tokens: [1] } }, /tokens is not a list of strings/],
    [{ data: { token_ids: [], log_probs: ['x'] } }, /log_probs/],
    [{ data: { token_ids: [], top_logprobs: 'x' } }, /top_logprobs is not a list/],
    [{ data: { token_ids: [], top_logprobs: ['x'] } }, /not a list of lists/],
    [{ data: { token_ids: [], top_logprobs: [[{ token_id: 1 }]] } }, /lacks token_id or logprob/],
  ]
  for (const [item, re] of bad) t.throws(() => readEngineItem(item), { code: 'KVR_ERR_UPSTREAM', message: re })
  t.same(output(readEngineItem({ data: {} })).tokenIds, [], 'token_ids absent: none')
})
