// An OpenAI completions or chat body as Dynamo's `PreprocessedRequest`: what Dynamo's frontend
// sends a worker's `generate` endpoint once it has tokenized the prompt, and what the router
// sends when it plays that frontend. The prompt arrives tokenized (the router tokenizes and
// renders chat templates before routing); this module maps the remaining fields the way
// Dynamo's preprocessor does and checks their types, so a bad field is a clear 400 here rather
// than a worker's error later.
//
// Field names, order and serde attributes (sources cited in the golden test,
// test/frontend/preprocessed-request.test.ts):
//   lib/llm/src/protocols/common/preprocessor.rs@000a36a7  PreprocessedRequest, RoutingHints
//   lib/llm/src/protocols/common.rs@0ab24416               StopConditions, SamplingOptions, OutputOptions
//   lib/llm/src/protocols/openai.rs@06f182c0               OpenAI fields → stop/sampling/output options
// StopConditions, SamplingOptions and OutputOptions have no skip_serializing_if: every field is
// written, null when unset, as Dynamo's frontend writes them; the Option fields of
// PreprocessedRequest and RoutingHints that have one are left out. Objects are built in the
// structs' field order, so the JSON has serde's key order.
import { KvrError } from '../errors.js'

/** The worker-rank the router chose. */
export interface RouteTarget {
  workerId: bigint
  dpRank: number
}

export interface StopConditions {
  max_tokens: number | null
  stop: string[] | null
  stop_token_ids: number[] | null
  stop_token_ids_hidden: number[] | null
  min_tokens: number | null
  ignore_eos: boolean | null
  max_thinking_tokens: number | null
}

export interface GuidedDecodingOptions {
  json?: unknown
  regex?: string
  choice?: string[]
  grammar?: string
  backend?: string
  whitespace_pattern?: string
}

export interface SamplingOptions {
  n: number | null
  best_of: number | null
  presence_penalty: number | null
  frequency_penalty: number | null
  repetition_penalty: number | null
  temperature: number | null
  top_p: number | null
  top_k: number | null
  min_p: number | null
  use_beam_search: boolean | null
  length_penalty: number | null
  seed: number | null
  include_stop_str_in_output: boolean | null
  guided_decoding: GuidedDecodingOptions | null
}

export interface OutputOptions {
  logprobs: number | null
  prompt_logprobs: number | null
  skip_special_tokens: boolean | null
  formatted_prompt: boolean | null
  return_tokens_as_token_ids: boolean | null
}

export interface RoutingHints {
  backend_instance_id?: bigint
  dp_rank?: number
  expected_output_tokens?: number
  lora_name?: string
  cache_salt?: string
  priority_jump?: number
  priority?: number
}

export interface PreprocessedRequest {
  model: string
  token_ids: number[]
  stop_conditions: StopConditions
  sampling_options: SamplingOptions
  output_options: OutputOptions
  eos_token_ids: number[]
  mdc_sum: string | null
  annotations: string[]
  routing?: RoutingHints
  router_config_override: null
  request_timestamp_ms?: number
}

export type RequestKind = 'completions' | 'chat'

export interface PreprocessOptions {
  /** The model name when the body names none. */
  model?: string
  /** The model's end-of-sequence ids (src/tokenizer/token-decoder.ts): hidden stop tokens, unless ignore_eos. */
  eosTokenIds?: readonly number[]
  /** The LoRA adapter the model name stands for, when it is one. */
  loraName?: string
  /** The model deployment card's checksum, when the worker's card is known. */
  mdcSum?: string
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v)

function invalid(field: string, what: string, v: unknown): KvrError {
  return new KvrError('KVR_ERR_INVALID_REQUEST', `${field} must be ${what}, got ${JSON.stringify(v) ?? String(v)}`)
}

function optUint(body: Record<string, unknown>, field: string, max = 0xffffffff): number | null {
  const v = body[field]
  if (v === undefined || v === null) return null
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > max) throw invalid(field, `an integer in [0, ${max}]`, v)
  return v
}

const I32: [number, number] = [-0x80000000, 0x7fffffff]

function optInt(body: Record<string, unknown>, field: string, [min, max] = [-Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER]): number | null {
  const v = body[field]
  if (v === undefined || v === null) return null
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min || v > max) throw invalid(field, `an integer in [${min}, ${max}]`, v)
  return v
}

function optNumber(body: Record<string, unknown>, field: string, min: number, max: number): number | null {
  const v = body[field]
  if (v === undefined || v === null) return null
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) throw invalid(field, `a number in [${min}, ${max}]`, v)
  return v
}

function optBool(body: Record<string, unknown>, field: string): boolean | null {
  const v = body[field]
  if (v === undefined || v === null) return null
  if (typeof v !== 'boolean') throw invalid(field, 'true or false', v)
  return v
}

function optString(body: Record<string, unknown>, field: string): string | null {
  const v = body[field]
  if (v === undefined || v === null) return null
  if (typeof v !== 'string') throw invalid(field, 'a string', v)
  return v
}

function optStrings(body: Record<string, unknown>, field: string): string[] | null {
  const v = body[field]
  if (v === undefined || v === null) return null
  if (!Array.isArray(v) || !v.every((s) => typeof s === 'string')) throw invalid(field, 'a list of strings', v)
  return v as string[]
}

function optTokenIds(body: Record<string, unknown>, field: string): number[] | null {
  const v = body[field]
  if (v === undefined || v === null) return null
  if (!Array.isArray(v) || !v.every((x) => typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= 0xffffffff))
    throw invalid(field, 'a list of token ids', v)
  return v as number[]
}

/** OpenAI's `stop`: one string or a list of them. */
function stopStrings(body: Record<string, unknown>): string[] | null {
  const v = body.stop
  if (typeof v === 'string') return [v]
  return optStrings(body, 'stop')
}

function stopConditions(body: Record<string, unknown>, nv: Record<string, unknown>, kind: RequestKind, eos: readonly number[]): StopConditions {
  // chat: max_completion_tokens, the newer name, wins over the deprecated max_tokens
  const max = (kind === 'chat' ? optUint(body, 'max_completion_tokens') : null) ?? optUint(body, 'max_tokens')
  const ignoreEos = optBool(body, 'ignore_eos') ?? optBool(nv, 'ignore_eos')
  const userStopIds = optTokenIds(body, 'stop_token_ids')
  const sc: StopConditions = {
    max_tokens: max,
    stop: stopStrings(body),
    stop_token_ids: userStopIds,
    // the model's end-of-sequence ids stop the answer without showing in it
    stop_token_ids_hidden: [...eos],
    min_tokens: optUint(body, 'min_tokens'),
    ignore_eos: ignoreEos,
    max_thinking_tokens: optUint(body, 'thinking_token_budget') ?? optUint(nv, 'max_thinking_tokens'),
  }
  // Dynamo's StopConditions::apply_ignore_eos: a request that ignores the end of sequence has no stops at all
  if (ignoreEos === true) {
    sc.stop = null
    sc.stop_token_ids = null
    sc.stop_token_ids_hidden = null
  }
  return sc
}

function guidedDecoding(body: Record<string, unknown>): GuidedDecodingOptions | null {
  const json = body.guided_json ?? null
  const regex = optString(body, 'guided_regex')
  const choice = optStrings(body, 'guided_choice')
  const grammar = optString(body, 'guided_grammar')
  const backend = optString(body, 'guided_decoding_backend')
  const ws = optString(body, 'guided_whitespace_pattern')
  const set = [json !== null, regex !== null, choice !== null && choice.length > 0, grammar !== null, ws !== null].filter(Boolean).length
  // Dynamo's GuidedDecodingOptions::from_optional: none set is no guided decoding, a backend alone included
  if (set === 0) return null
  if (set > 1)
    throw new KvrError('KVR_ERR_INVALID_REQUEST', 'only one of guided_json, guided_regex, guided_choice, guided_grammar, guided_whitespace_pattern may be set')
  // the struct's field order, which is serde's key order
  const g: GuidedDecodingOptions = {}
  if (json !== null) g.json = json
  if (regex !== null) g.regex = regex
  if (choice !== null) g.choice = choice
  if (grammar !== null) g.grammar = grammar
  if (backend !== null) g.backend = backend
  if (ws !== null) g.whitespace_pattern = ws
  return g
}

function samplingOptions(body: Record<string, unknown>, nv: Record<string, unknown>): SamplingOptions {
  const n = optUint(body, 'n', 255)
  const bestOf = optUint(body, 'best_of', 255)
  // one choice per request: the answer the router builds carries choice 0 only
  if (n !== null && n !== 1) throw invalid('n', '1 (several choices per request are not supported)', n)
  if (bestOf !== null && bestOf !== 1) throw invalid('best_of', '1 (several choices per request are not supported)', bestOf)
  const greedy = nv.greed_sampling === true
  const topK = optInt(body, 'top_k', I32)
  return {
    n,
    best_of: bestOf,
    presence_penalty: optNumber(body, 'presence_penalty', -2, 2),
    frequency_penalty: optNumber(body, 'frequency_penalty', -2, 2),
    repetition_penalty: optNumber(body, 'repetition_penalty', 0, Number.MAX_VALUE),
    temperature: greedy ? null : optNumber(body, 'temperature', 0, 2),
    top_p: greedy ? null : optNumber(body, 'top_p', 0, 1),
    // Dynamo sends "all tokens" as -1 whatever the client wrote (0 or -1)
    top_k: topK === 0 ? -1 : topK,
    min_p: optNumber(body, 'min_p', 0, 1),
    use_beam_search: null,
    length_penalty: null,
    seed: optInt(body, 'seed'),
    include_stop_str_in_output: optBool(body, 'include_stop_str_in_output'),
    guided_decoding: guidedDecoding(body),
  }
}

function outputOptions(body: Record<string, unknown>, kind: RequestKind): OutputOptions {
  let logprobs: number | null
  if (kind === 'chat') {
    // chat: logprobs is a switch, top_logprobs the count
    const on = optBool(body, 'logprobs')
    const top = optUint(body, 'top_logprobs', 20)
    logprobs = on === true ? (top ?? 0) : null
  } else logprobs = optUint(body, 'logprobs', 20)
  return {
    logprobs,
    prompt_logprobs: null,
    skip_special_tokens: optBool(body, 'skip_special_tokens'),
    formatted_prompt: null,
    return_tokens_as_token_ids: optBool(body, 'return_tokens_as_token_ids'),
  }
}

function routingHints(body: Record<string, unknown>, nv: Record<string, unknown>, target: RouteTarget | null, o: PreprocessOptions): RoutingHints | undefined {
  const r: RoutingHints = {}
  if (target !== null) {
    r.backend_instance_id = target.workerId
    r.dp_rank = target.dpRank
  }
  const hints = nv.agent_hints
  if (hints !== undefined && hints !== null && !isObject(hints)) throw invalid('nvext.agent_hints', 'an object', hints)
  const h = (hints ?? {}) as Record<string, unknown>
  const osl = optUint(h, 'osl')
  if (osl !== null) r.expected_output_tokens = osl
  if (o.loraName !== undefined) r.lora_name = o.loraName
  const salt = optString(body, 'cache_salt')
  if (salt !== null) r.cache_salt = salt
  const priority = optInt(h, 'priority', I32)
  const sensitivity = optNumber(h, 'latency_sensitivity', -Number.MAX_VALUE, Number.MAX_VALUE)
  // Dynamo's preprocessor: a priority moves the request ahead by that many seconds (never back)
  if (priority !== null) r.priority_jump = Math.max(priority, 0)
  else if (sensitivity !== null) r.priority_jump = sensitivity
  if (priority !== null) r.priority = priority
  return Object.keys(r).length === 0 ? undefined : r
}

/**
 * The PreprocessedRequest for an OpenAI body whose prompt tokenized to `tokenIds`, for the
 * worker-rank `target` (null: no routing hints of the router's own). Invalid fields throw
 * KVR_ERR_INVALID_REQUEST.
 */
export function preprocessedRequest(
  body: Record<string, unknown>,
  kind: RequestKind,
  tokenIds: ArrayLike<number>,
  target: RouteTarget | null,
  o: PreprocessOptions = {},
): PreprocessedRequest {
  if (tokenIds.length === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'prompt is empty')
  const nvRaw = body.nvext
  if (nvRaw !== undefined && nvRaw !== null && !isObject(nvRaw)) throw invalid('nvext', 'an object', nvRaw)
  const nv = (nvRaw ?? {}) as Record<string, unknown>
  const model = optString(body, 'model') ?? o.model ?? ''
  const stop = stopConditions(body, nv, kind, o.eosTokenIds ?? [])
  const routing = routingHints(body, nv, target, o)
  const ts = optNumber(nv, 'request_timestamp_ms', 0, Number.MAX_VALUE)
  const req: PreprocessedRequest = {
    model,
    token_ids: Array.from(tokenIds),
    stop_conditions: stop,
    sampling_options: samplingOptions(body, nv),
    output_options: outputOptions(body, kind),
    // the worker learns the model's end-of-sequence ids unless the request ignores them
    eos_token_ids: stop.ignore_eos === true ? [] : [...(o.eosTokenIds ?? [])],
    mdc_sum: o.mdcSum ?? null,
    annotations: optStrings(nv, 'annotations') ?? [],
    ...(routing === undefined ? {} : { routing }),
    router_config_override: null,
    ...(ts === null ? {} : { request_timestamp_ms: ts }),
  }
  return req
}
