// A Dynamo worker's answer stream (`Annotated<LLMEngineOutput>` items) as the OpenAI answer a
// client of the router gets: server-sent events (`text_completion` or `chat.completion.chunk`
// chunks, a usage chunk when stream_options.include_usage asks, `data: [DONE]`) or one JSON
// body, in the shapes the router's HTTP proxy relays from HTTP workers, with the same
// nvext.worker_id on the first event and on the body (src/http/proxy/sse.ts).
//
// It does what Dynamo's frontend does between the worker and the client (lib/llm/src/backend.rs,
// lib/llm/src/protocols/openai/*/delta.rs): text the worker decoded is used as sent; otherwise
// the token ids are decoded here, incrementally, and the request's stop conditions applied
// (hidden stop tokens such as the model's end of sequence, stop token ids, stop strings held
// back until they can no longer match, min_tokens, max_tokens); log probabilities are shown when
// asked (src/frontend/logprobs.ts). An answer the router ends before the worker does sets
// `stopWorker`, for the caller to send the worker its stop.
//
//   const t = new EngineOutputTranslator(request, { kind, stream, includeUsage, decoder, target })
//   for each item: write(t.push(item)); if (t.stopWorker) stop the worker; if (t.done) break
//   write(t.end())        streaming: the last events and [DONE]; otherwise the JSON body
//   a WorkerError thrown by push: before t.started, answer it (or retry when err.retryable);
//   after, write(t.errorEvent(err)) and end the response
import { randomUUID } from 'node:crypto'
import { KvrError } from '../errors.js'
import type { TokenDecoder } from '../tokenizer/token-decoder.js'
import { IncrementalDetokenizer } from './detokenizer.js'
import { readEngineItem, workerError } from './engine-output.js'
import { chatLogprobs, completionLogprobs, logprobEntries } from './logprobs.js'
import type { LogprobEntry } from './logprobs.js'
import type { EngineOutput, EngineUsage, FinishReason } from './engine-output.js'
import type { PreprocessedRequest, RequestKind, RouteTarget } from './preprocessed-request.js'
import { StopSequences } from './stop-sequences.js'

export interface TranslatorOptions {
  kind: RequestKind
  stream: boolean
  /** stream_options.include_usage: a usage chunk before [DONE]. */
  includeUsage: boolean
  /** Decodes token ids the worker sends without text; null when the router has no tokenizer. */
  decoder: TokenDecoder | null
  /** The worker-rank serving the request, named in nvext.worker_id; null for none. */
  target: RouteTarget | null
  /** The answer's id; `cmpl-…` or `chatcmpl-…` with a random UUID by default. */
  id?: string
  /** Unix seconds; now by default. */
  created?: number
}

/** stream and stream_options.include_usage of an OpenAI body. */
export function streamOptions(body: Record<string, unknown>): { stream: boolean; includeUsage: boolean } {
  const so = body.stream_options
  const includeUsage = so !== null && typeof so === 'object' && (so as { include_usage?: unknown }).include_usage === true
  return { stream: body.stream === true, includeUsage }
}

/** The OpenAI finish_reason of Dynamo's: Dynamo's frontend maps eos and cancelled to stop too. */
const OPENAI_FINISH: Record<Exclude<FinishReason, 'error'>, string> = {
  eos: 'stop',
  stop: 'stop',
  cancelled: 'stop',
  length: 'length',
  content_filter: 'content_filter',
}

/** nvext.worker_id as the proxy writes it: prefill and decode on the same worker-rank. */
function workerIdJson(t: RouteTarget): string {
  const w = t.workerId.toString()
  return (
    `{"worker_id":{"prefill_worker_id":${w},"prefill_worker_id_str":"${w}","prefill_dp_rank":${t.dpRank},` +
    `"decode_worker_id":${w},"decode_worker_id_str":"${w}","decode_dp_rank":${t.dpRank}}}`
  )
}

export class EngineOutputTranslator {
  /** Whether the answer is complete: the worker finished it, or the router did. */
  done = false
  /** The router ended the answer before the worker did: the worker should be told to stop. */
  stopWorker = false
  /** Whether an event has been produced: past it, a failure is an error event, never a retry. */
  started = false

  private readonly o: TranslatorOptions
  private readonly head: string
  private readonly model: string
  private readonly promptTokens: number
  private readonly detok: IncrementalDetokenizer | null
  private readonly stops: StopSequences
  private readonly hiddenStops: ReadonlySet<number>
  private readonly minTokens: number
  private readonly maxTokens: number | null
  private generated = 0
  private tokensSeen = 0
  private workerUsage: EngineUsage | null = null
  private text = ''
  private finish: string | null = null
  /** Whether the request asked for log probabilities. */
  private readonly logprobs: boolean
  /** The answer's log probabilities so far (not streaming). */
  private entries: LogprobEntry[] = []
  /** Where the next token's text starts in the answer: completions' text_offset. */
  private tokenOffset = 0
  private readonly id: string
  private readonly created: number

  constructor(req: PreprocessedRequest, o: TranslatorOptions) {
    this.o = o
    this.model = req.model
    this.promptTokens = req.token_ids.length
    this.id = o.id ?? `${o.kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomUUID()}`
    this.created = o.created ?? Math.floor(Date.now() / 1000)
    const object = o.kind === 'chat' ? (o.stream ? 'chat.completion.chunk' : 'chat.completion') : 'text_completion'
    this.head = `{"id":${JSON.stringify(this.id)},"object":"${object}","created":${this.created},"model":${JSON.stringify(this.model)}`
    const sc = req.stop_conditions
    // skip_special_tokens is true unless asked otherwise, as in vLLM, SGLang and recent Dynamo (earlier, false: backend.rs@dc514398)
    const skipSpecial = req.output_options.skip_special_tokens ?? true
    this.detok = o.decoder === null ? null : new IncrementalDetokenizer(o.decoder, skipSpecial, req.token_ids)
    this.stops = new StopSequences(sc.stop ?? [], req.sampling_options.include_stop_str_in_output === true)
    this.hiddenStops = new Set([...(sc.stop_token_ids_hidden ?? []), ...(sc.stop_token_ids ?? [])])
    this.minTokens = sc.min_tokens ?? 0
    this.maxTokens = sc.max_tokens
    this.logprobs = req.output_options.logprobs !== null
  }

  /** Reads one stream item; returns the SSE text to send ('' when none, and always when not streaming). */
  push(item: unknown): string {
    // once the answer is complete, what a worker still sends (its reply to a stop) is not part of it
    if (this.done) return ''
    const it = readEngineItem(item)
    if (it.kind === 'error') throw it.error
    if (it.kind === 'annotation') return ''
    return this.output(it.output)
  }

  /** Streaming: the events that end the answer, through [DONE]. Otherwise: the JSON body. */
  end(): string {
    let out = ''
    if (!this.done) {
      // the worker's stream ended without a finish reason: what is held back is released, as Dynamo does
      const piece = this.release()
      this.done = true
      this.finish = 'stop'
      out = this.emit(piece, 'stop')
    }
    if (!this.o.stream) return this.body()
    if (this.o.includeUsage) out += `data: ${this.head},"choices":[],"usage":${this.usageJson()}}\n\n`
    return `${out}data: [DONE]\n\n`
  }

  /** The event that ends a stream a failure cut, as the proxy writes it for a worker that fails mid-stream. */
  errorEvent(err: KvrError): string {
    return `data: ${JSON.stringify({ error: { ...err.toJSON(), type: 'upstream_error' } })}\n\n`
  }

  /** Token counts: the worker's when it sent them, else the prompt's length and the tokens received. */
  get usage(): EngineUsage {
    return this.workerUsage ?? { promptTokens: this.promptTokens, completionTokens: this.tokensSeen, cachedTokens: null }
  }

  private output(out: EngineOutput): string {
    if (out.index !== 0) throw new KvrError('KVR_ERR_UPSTREAM', `the worker sent choice ${out.index}; the request asked for one`)
    if (out.finishReason === 'error') throw workerError('Unknown', out.errorMessage ?? 'unknown error')
    if (out.usage !== null) this.workerUsage = out.usage
    this.tokensSeen += out.tokenIds.length
    let piece: string
    let local: FinishReason | null = null
    let matched = false
    /** Tokens of this output that are part of the answer: not a hidden stop token, nor any after the end. */
    let shown = out.tokenIds.length
    if (out.text !== null) {
      // the worker decoded: it applied the stop strings too
      piece = out.text
      this.generated += out.tokenIds.length
    } else {
      if (this.detok === null && out.tokenIds.length > 0)
        throw new KvrError(
          'KVR_ERR_UPSTREAM',
          'the worker sent token ids without text, and the router has no tokenizer to decode them: start it with --tokenizer',
        )
      piece = ''
      shown = 0
      for (const id of out.tokenIds) {
        this.generated++
        // vLLM's min_tokens: no stop among the first min_tokens tokens (Dynamo's decoder lets the last of them stop)
        const gated = this.generated <= this.minTokens
        if (!gated && this.hiddenStops.has(id)) {
          local = 'stop'
          break
        }
        shown++
        const t = (this.detok as IncrementalDetokenizer).push(id)
        if (gated || !this.stops.active) piece += this.stops.flush() + t
        else {
          const step = this.stops.feed(t)
          piece += step.text
          if (step.matched !== null) {
            local = 'stop'
            matched = true
            break
          }
        }
        if (this.maxTokens !== null && this.generated >= this.maxTokens) {
          local = 'length'
          break
        }
      }
    }
    const entries = this.logprobs ? logprobEntries(out, shown, this.o.decoder) : []
    const finish = local ?? out.finishReason
    if (finish === null) return this.emit(piece, null, entries)
    if (!matched && this.detok !== null && out.text === null) piece += this.release()
    this.done = true
    this.stopWorker = local !== null && out.finishReason === null
    this.finish = OPENAI_FINISH[finish as Exclude<FinishReason, 'error'>]
    return this.emit(piece, this.finish, entries)
  }

  /** A choice's `logprobs`: null unless the request asked and the worker sent them. */
  private logprobsJson(entries: readonly LogprobEntry[]): string {
    if (!this.logprobs || entries.length === 0) return 'null'
    const offset = this.tokenOffset
    for (const e of entries) this.tokenOffset += e.token.length
    return JSON.stringify(this.o.kind === 'chat' ? chatLogprobs(entries) : completionLogprobs(entries, offset))
  }

  /** The text held back, for an answer that ends other than by a stop string: nothing can complete it now. */
  private release(): string {
    const rest = this.detok === null ? '' : this.detok.flush()
    return this.stops.active ? this.stops.feed(rest).text + this.stops.flush() : rest
  }

  /** One chunk (streaming) or more text for the body. */
  private emit(piece: string, finish: string | null, entries: readonly LogprobEntry[] = []): string {
    if (!this.o.stream) {
      this.text += piece
      for (const e of entries) this.entries.push(e)
      return ''
    }
    // a chunk for log probabilities alone too: they belong to tokens whose text is held back
    if (piece === '' && finish === null && entries.length === 0) return ''
    const first = !this.started
    this.started = true
    const fin = finish === null ? 'null' : `"${finish}"`
    let choice: string
    if (this.o.kind === 'chat') {
      const delta = first ? `{"role":"assistant","content":${JSON.stringify(piece)}}` : piece === '' ? '{}' : `{"content":${JSON.stringify(piece)}}`
      choice = `{"index":0,"delta":${delta},"logprobs":${this.logprobsJson(entries)},"finish_reason":${fin}}`
    } else choice = `{"index":0,"text":${JSON.stringify(piece)},"logprobs":${this.logprobsJson(entries)},"finish_reason":${fin}}`
    const nvext = first && this.o.target !== null ? `,"nvext":${workerIdJson(this.o.target)}` : ''
    return `data: ${this.head},"choices":[${choice}]${nvext}}\n\n`
  }

  private usageJson(): string {
    const u = this.usage
    const details = u.cachedTokens === null ? '' : `,"prompt_tokens_details":{"cached_tokens":${u.cachedTokens}}`
    return `{"prompt_tokens":${u.promptTokens},"completion_tokens":${u.completionTokens},"total_tokens":${u.promptTokens + u.completionTokens}${details}}`
  }

  private body(): string {
    const text = JSON.stringify(this.text)
    const lp = this.logprobsJson(this.entries)
    const choice =
      this.o.kind === 'chat'
        ? `{"index":0,"message":{"role":"assistant","content":${text}},"logprobs":${lp},"finish_reason":"${this.finish}"}`
        : `{"index":0,"text":${text},"logprobs":${lp},"finish_reason":"${this.finish}"}`
    const nvext = this.o.target === null ? '' : `,"nvext":${workerIdJson(this.o.target)}`
    return `${this.head},"choices":[${choice}],"usage":${this.usageJson()}${nvext}}`
  }
}
