// The `generate` endpoint of a Dynamo worker, served by the mocker's engine: the same engine,
// timing and output tokens as its OpenAI HTTP server (server.ts), another front door.
//
// Request body: PreprocessedRequest (lib/llm/src/protocols/common/preprocessor.rs@000a36a7); read
// here: token_ids, stop_conditions.max_tokens (the server's default when absent or null). Every
// other field has a default and is ignored, as the engine always generates max_tokens tokens.
// Stream items: Annotated<LLMEngineOutput> (protocols/annotated.rs@031f90c2,
// protocols/common/llm_backend.rs@07d14345), one per generated token, with the token's text (the
// word the mocker's HTTP server writes for it, server.ts), so a frontend needs no tokenizer:
//   {"data":{"token_ids":[t],"tokens":null,"text":"…","cum_log_probs":null,"log_probs":null,
//            "top_logprobs":null,"finish_reason":null|"length","index":null}}
// The last adds completion_usage (an OpenAI CompletionUsage; LLMEngineOutput's last field, left
// out when None: llm_backend.rs@2441f5b6) with the engine's prefix hit as
// prompt_tokens_details.cached_tokens.
// A request the engine refuses (an empty prompt, more KV than it has) fails in the prologue.
// `stop` or `kill` from the frontend aborts the request, which frees its blocks at once.
import { isKvrError } from '../../../errors.js'
import type { EngineRequest, MockEngine, RequestListener } from '../engine.js'
import { OUTPUT_TOKEN_BASE } from '../engine.js'
import { WORDS } from '../server.js'
import type { EndpointHandler, IncomingRequest } from './request-plane-server.js'
import { ResponseStream } from './response-stream.js'

/** The text of an output token: its word, as the HTTP server writes it. */
const wordOf = (token: number): string => WORDS[(token - OUTPUT_TOKEN_BASE) % WORDS.length] ?? ''

function usageValue(x: EngineRequest): Record<string, unknown> {
  return {
    prompt_tokens: x.isl,
    completion_tokens: x.outputTokens,
    total_tokens: x.isl + x.outputTokens,
    prompt_tokens_details: { cached_tokens: Math.max(0, x.cachedTokens) },
  }
}

function itemValue(token: number, last: EngineRequest | null): { data: Record<string, unknown> } {
  const data: Record<string, unknown> = {
    token_ids: [token],
    tokens: null,
    text: wordOf(token),
    cum_log_probs: null,
    log_probs: null,
    top_logprobs: null,
    finish_reason: last === null ? null : 'length',
    index: null,
  }
  if (last !== null) data.completion_usage = usageValue(last)
  return { data }
}

/** Sends the item of output token `token` (`last`: the request it ends), in the stream's codec. */
function emit(s: ResponseStream, token: number, last: EngineRequest | null): void {
  // no bigint in an item: JSON.stringify writes it as serde_json would
  if (s.codec === 'json') s.sendJson(JSON.stringify(itemValue(token, last)))
  else s.sendValue(itemValue(token, last))
}

/** The prompt and output length of a PreprocessedRequest, or the reason it has none. */
export function readPreprocessed(body: unknown, defaultMaxTokens: number): { tokens: number[]; maxTokens: number } | string {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return 'the request body must be a PreprocessedRequest object'
  const b = body as Record<string, unknown>
  const ids = b.token_ids
  if (!Array.isArray(ids)) return 'token_ids must be an array of token ids'
  for (let i = 0; i < ids.length; i++) {
    const v: unknown = ids[i]
    if (typeof v !== 'number' || v >>> 0 !== v) return `token_ids[${i}] is ${String(v)}; token ids are integers in [0, 4294967295]`
  }
  const sc = b.stop_conditions as Record<string, unknown> | null | undefined
  const mt = sc?.max_tokens
  const maxTokens = mt === undefined || mt === null ? defaultMaxTokens : typeof mt === 'bigint' ? Number(mt) : mt
  if (typeof maxTokens !== 'number' || !Number.isInteger(maxTokens) || maxTokens < 1)
    return `stop_conditions.max_tokens must be a positive integer, got ${String(mt)}`
  return { tokens: ids as number[], maxTokens }
}

export interface GenerateCounters {
  served: number
  cancelled: number
  refused: number
  callHomeFailed: number
}

/** `open`: the streams not yet ended, for a shutdown to cut. */
export function generateHandler(engine: MockEngine, defaultMaxTokens: number, counters: GenerateCounters, open: Set<ResponseStream>): EndpointHandler {
  return (req: IncomingRequest, done: () => void): void => {
    const parsed = readPreprocessed(req.body, defaultMaxTokens)
    let r: EngineRequest | null = null
    let stream: ResponseStream | null = null
    const listener: RequestListener = {
      onToken(x: EngineRequest): void {
        if (stream !== null) emit(stream, x.tokens[x.isl + x.outputTokens - 1] as number, null)
      },
      onFinish(x: EngineRequest): void {
        counters.served++
        if (stream !== null) {
          emit(stream, x.tokens[x.isl + x.outputTokens - 1] as number, x)
          stream.end()
        }
        done()
      },
    }
    let refusal: string | null = typeof parsed === 'string' ? parsed : null
    if (typeof parsed !== 'string') {
      try {
        r = engine.submit(parsed.tokens, parsed.maxTokens, listener)
      } catch (err) {
        if (!isKvrError(err)) throw err
        refusal = err.message
      }
    }
    if (refusal !== null) counters.refused++
    // the engine starts at once; tokens made before the stream is open are sent when it is
    const pending = r
    ResponseStream.open(
      req.callHome,
      req.codec,
      () => {
        if (pending !== null && engine.abort(pending)) {
          counters.cancelled++
          stream?.end()
          done()
        }
      },
      refusal,
    ).then(
      (s) => {
        stream = s
        open.add(s)
        s.onEnd = () => open.delete(s)
        if (refusal !== null) {
          s.end(false)
          done()
          return
        }
        const x = pending as EngineRequest
        // tokens generated while the connection was being made, in order
        const k = x.outputTokens
        for (let i = 0; i < k; i++) {
          emit(s, x.tokens[x.isl + i] as number, x.state === 'finished' && i === k - 1 ? x : null)
        }
        if (x.state === 'finished') s.end()
        else if (x.state === 'aborted') s.end()
      },
      () => {
        // the frontend cannot be reached: nobody reads the output, the blocks are freed
        counters.callHomeFailed++
        if (pending !== null) engine.abort(pending)
        done()
      },
    )
  }
}
