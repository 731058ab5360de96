// One item of a Dynamo worker's answer stream, `Annotated<LLMEngineOutput>`, read and checked.
//
//   Annotated       {data?, id?, event?, comment?, error?, error_code?}     event "error" = failure
//   LLMEngineOutput {token_ids, tokens, text, finish_reason, index, completion_usage?, …}
//   finish_reason   "eos" | "length" | "stop" | "cancelled" (alias "abort") | "content_filter"
//                   | {"error": message}
//
// Sources: lib/runtime/src/protocols/annotated.rs (@031f90c2: comment only; @9503e1bd: +error_code;
// newest: +error, a DynamoError), lib/llm/src/protocols/common/llm_backend.rs@07d14345,
// lib/llm/src/protocols/common.rs@0ab24416 (FinishReason), lib/runtime/src/error.rs@0b436c83
// (DynamoError: error_type, class, reason, message, diagnostic?, public?, caused_by?).
//
// A worker's failure becomes a WorkerError: a KvrError with a catalogue code (the request's own
// fault, a cancellation, or the worker's) and whether another worker could serve the request.
import { KvrError } from '../errors.js'
import type { ErrorCode } from '../errors.js'

export type FinishReason = 'eos' | 'length' | 'stop' | 'cancelled' | 'content_filter' | 'error'

export interface EngineUsage {
  promptTokens: number
  completionTokens: number
  /** prompt_tokens_details.cached_tokens; null when the worker did not say. */
  cachedTokens: number | null
}

/** The parts of an LLMEngineOutput the answer is built from. */
export interface EngineOutput {
  tokenIds: number[]
  /** The worker's own decoded text; null when the router must decode token_ids. */
  text: string | null
  finishReason: FinishReason | null
  /** The message of `finish_reason: {"error": …}`. */
  errorMessage: string | null
  /** The choice (n > 1); 0 when absent. */
  index: number
  usage: EngineUsage | null
  /** Per token: the worker's text of it (`tokens`), null where it sent none. */
  tokens: (string | null)[] | null
  /** Per token: its log probability (`log_probs`); null when the worker sent none. */
  logProbs: number[] | null
  /** Per token: the most likely alternatives (`top_logprobs`). */
  topLogprobs: TopLogprob[][] | null
}

/** llm_backend.rs's TopLogprob {rank, token_id, token, logprob, bytes?}, the parts an answer shows. */
export interface TopLogprob {
  tokenId: number
  token: string | null
  logprob: number
}

export type EngineItem =
  | { kind: 'output'; output: EngineOutput }
  | { kind: 'error'; error: WorkerError }
  /** An annotation (event other than "error", e.g. metrics): no part of the answer. */
  | { kind: 'annotation'; event: string | null }

export class WorkerError extends KvrError {
  constructor(
    code: ErrorCode,
    message: string,
    /** Dynamo's error class (`InvalidRequest`, `Unavailable`, …) or `Unknown`. */
    readonly errorClass: string,
    /** Whether the request could go to another worker (the worker was unavailable or full). */
    readonly retryable: boolean,
  ) {
    super(code, message)
    this.name = 'WorkerError'
  }
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v)

function malformed(what: string): KvrError {
  return new KvrError('KVR_ERR_UPSTREAM', `the worker sent a stream item that is not an Annotated<LLMEngineOutput>: ${what}`)
}

const isU32 = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= 0xffffffff

/** Reads one stream item (parsed JSON or MessagePack); a malformed one throws KVR_ERR_UPSTREAM. */
export function readEngineItem(item: unknown): EngineItem {
  if (!isObject(item)) throw malformed('not an object')
  const event = item.event
  if (event !== undefined && event !== null && typeof event !== 'string') throw malformed('event is not a string')
  if (event === 'error') return { kind: 'error', error: annotatedError(item) }
  if (typeof event === 'string' || item.data === undefined || item.data === null) return { kind: 'annotation', event: event ?? null }
  return { kind: 'output', output: readOutput(item.data) }
}

function readOutput(d: unknown): EngineOutput {
  if (!isObject(d)) throw malformed('data is not an object')
  const ids = d.token_ids ?? []
  if (!Array.isArray(ids) || !ids.every(isU32)) throw malformed('token_ids is not a list of u32 token ids')
  const text = d.text ?? null
  if (text !== null && typeof text !== 'string') throw malformed('text is not a string')
  const index = d.index ?? 0
  if (!isU32(index)) throw malformed('index is not a u32')
  let finishReason: FinishReason | null = null
  let errorMessage: string | null = null
  const f = d.finish_reason ?? null
  if (typeof f === 'string') {
    if (f === 'abort') finishReason = 'cancelled'
    else if (f === 'eos' || f === 'length' || f === 'stop' || f === 'cancelled' || f === 'content_filter') finishReason = f
    else throw malformed(`unknown finish_reason ${JSON.stringify(f)}`)
  } else if (isObject(f) && typeof f.error === 'string') {
    finishReason = 'error'
    errorMessage = f.error
  } else if (f !== null) throw malformed('finish_reason is neither a string nor {"error": …}')
  return {
    tokenIds: ids as number[],
    text,
    finishReason,
    errorMessage,
    index,
    usage: readUsage(d.completion_usage),
    tokens: readTokens(d.tokens),
    logProbs: readLogProbs(d.log_probs),
    topLogprobs: readTopLogprobs(d.top_logprobs),
  }
}

function readTokens(v: unknown): (string | null)[] | null {
  if (v === undefined || v === null) return null
  if (!Array.isArray(v) || !v.every((x) => x === null || typeof x === 'string')) throw malformed('tokens is not a list of strings or nulls')
  return v as (string | null)[]
}

function readLogProbs(v: unknown): number[] | null {
  if (v === undefined || v === null) return null
  if (!Array.isArray(v) || !v.every((x) => typeof x === 'number')) throw malformed('log_probs is not a list of numbers')
  return v as number[]
}

function readTopLogprobs(v: unknown): TopLogprob[][] | null {
  if (v === undefined || v === null) return null
  if (!Array.isArray(v)) throw malformed('top_logprobs is not a list')
  return v.map((position) => {
    if (!Array.isArray(position)) throw malformed('top_logprobs is not a list of lists')
    return position.map((e): TopLogprob => {
      if (!isObject(e) || !isU32(e.token_id) || typeof e.logprob !== 'number' || (e.token != null && typeof e.token !== 'string'))
        throw malformed('a top_logprobs entry lacks token_id or logprob')
      return { tokenId: e.token_id, token: (e.token as string | null | undefined) ?? null, logprob: e.logprob }
    })
  })
}

function readUsage(u: unknown): EngineUsage | null {
  if (u === undefined || u === null) return null
  if (!isObject(u) || !isU32(u.prompt_tokens) || !isU32(u.completion_tokens)) throw malformed('completion_usage lacks prompt_tokens or completion_tokens')
  const details = u.prompt_tokens_details
  const cached = isObject(details) && isU32(details.cached_tokens) ? details.cached_tokens : null
  return { promptTokens: u.prompt_tokens, completionTokens: u.completion_tokens, cachedTokens: cached }
}

/** Classes whose requests belong to the client's fault: 400, not the worker's 502. */
const INVALID = new Set(['InvalidArgument', 'InvalidRequest', 'PayloadTooLarge', 'UnsupportedMedia', 'BackendInvalidArgument'])
const CANCELLED = new Set(['Cancelled', 'BackendCancelled'])
/** Classes that say this worker could not take the request, where another might. */
const RETRYABLE = new Set([
  'CannotConnect',
  'Disconnected',
  'Unavailable',
  'WorkerUnavailable',
  'ResourceExhausted',
  'WorkerOverloaded',
  'CapacityExhausted',
  'BackendCannotConnect',
  'BackendDisconnected',
  'BackendEngineShutdown',
])

/** A DynamoError's class name: `class`, else the legacy `error_type`; `{"Backend": X}` reads `BackendX`. */
function className(v: unknown): string | null {
  if (typeof v === 'string') return v
  if (isObject(v) && typeof v.Backend === 'string') return `Backend${v.Backend}`
  return null
}

/** The error a worker's failure is answered with, by Dynamo's class name. */
export function workerError(errorClass: string, message: string): WorkerError {
  const code: ErrorCode = INVALID.has(errorClass) ? 'KVR_ERR_INVALID_REQUEST' : CANCELLED.has(errorClass) ? 'KVR_ERR_REQUEST_CANCELLED' : 'KVR_ERR_UPSTREAM'
  return new WorkerError(code, `the worker failed the request (${errorClass}): ${message}`, errorClass, RETRYABLE.has(errorClass))
}

const UNCLASSIFIED = new Set(['Unknown', 'Internal'])

/**
 * A DynamoError's class. The legacy error_type first: it keeps the transport detail
 * (CannotConnect) that class folds into Unavailable. An unclassified error takes the first
 * classified one of its caused_by chain, as Dynamo's own error-chain matching does.
 */
function errorClassOf(e: Record<string, unknown>): string {
  let cur: unknown = e
  for (let depth = 0; depth < 8 && isObject(cur); depth++, cur = cur.caused_by) {
    const cls = className(cur.error_type) ?? className(cur.class)
    if (cls !== null && !UNCLASSIFIED.has(cls)) return cls
  }
  return className(e.error_type) ?? className(e.class) ?? 'Unknown'
}

function annotatedError(item: Record<string, unknown>): WorkerError {
  const e = item.error
  const comments = Array.isArray(item.comment) ? item.comment.filter((c): c is string => typeof c === 'string') : []
  const fallback = comments.length > 0 ? comments.join(', ') : 'unknown error'
  if (isObject(e)) {
    const cls = errorClassOf(e)
    const text = [e.diagnostic, e.message, e.reason].find((m): m is string => typeof m === 'string' && m.length > 0)
    return workerError(cls, text ?? fallback)
  }
  if (typeof e === 'string' && e.length > 0) return workerError('Unknown', e)
  const status = item.error_code
  if (typeof status === 'number') {
    if (status === 499) return workerError('Cancelled', fallback)
    if (status >= 400 && status < 500) return workerError('InvalidRequest', fallback)
    if (status === 503 || status === 529) return workerError('Unavailable', fallback)
  }
  return workerError('Unknown', fallback)
}
