// The OpenAI-compatible HTTP face of one simulated engine (node:http, no framework: it must
// carry thousands of SSE chunks per second on two cores next to a router and a load generator).
//
//   POST /v1/completions        prompt: token ids, [token ids], text (UTF-8 bytes are the
//   POST /v1/chat/completions   tokens) or nvext.token_data; messages → chatPromptText
//                               max_tokens (max_completion_tokens), stream
//   POST /v1/kv/query           Dynamo's worker query, over HTTP (event-ring.ts)
//   GET  /health, /v1/models, /stats
//
// Every answer carries usage with prompt_tokens_details.cached_tokens (the engine's prefix hit
// when the prefill was scheduled); a stream ends with a usage chunk before [DONE] when the request
// asks for one (stream_options.include_usage, as vLLM and OpenAI do: a client that reads
// choices[0] of every chunk would fail on it otherwise). Chunk
// text is built from per-request prefixes and per-word suffixes made once, so a token costs one
// string concatenation and one write. A client that disconnects aborts its request, which
// frees its blocks at once.
import { createServer } from 'node:http'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { KvrError, isKvrError } from '../../errors.js'
import type { ErrorCode } from '../../errors.js'
import { parseJsonExact, readU64 } from '../../codec/json.js'
import { chatPromptText } from '../../tokenizer/tokenizer.js'
import type { ChatMessage } from '../../tokenizer/tokenizer.js'
import type { EngineRequest, MockEngine, RequestListener } from './engine.js'
import { OUTPUT_TOKEN_CYCLE } from './engine.js'
import { encodeKvQueryResponse } from './event-ring.js'
import type { KvQueryResponse } from './event-ring.js'

/** The text of output token k is WORDS[k mod 10] (the engine generates OUTPUT_TOKEN_BASE + k mod 10). */
export const WORDS: readonly string[] = ['the', ' cache', ' is', ' warm', ' and', ' the', ' router', ' knows', ' it', '.']
if (WORDS.length !== OUTPUT_TOKEN_CYCLE) throw new Error('one word per output token of the cycle')

/** The route of the worker query (Dynamo's `worker_kv_indexer_query` endpoint). */
export const KV_QUERY_PATH = '/v1/kv/query'

export interface EngineServerOptions {
  engine: MockEngine
  host?: string
  /** 0 (default) picks a free port. */
  port?: number
  /** Host written into the engine's URL; the listen host by default. */
  advertiseHost?: string
  modelName?: string
  /** Output length when a request names none (OpenAI's default for completions). */
  defaultMaxTokens?: number
  maxBodyBytes?: number
  /** More of /stats, under `extra`'s key (the Dynamo mode's counters). */
  extraStats?: { key: string; read: () => unknown }
}

/** `host` as it goes into a URL: an IPv6 address in brackets. */
export function urlHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host
}

const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' }
const JSON_HEADERS = { 'content-type': 'application/json' }

// Suffixes of one streamed chunk, after the per-request prefix: [chat][first][last][word].
function suffixes(chat: boolean): string[][][] {
  const out: string[][][] = []
  for (const first of [false, true]) {
    const byLast: string[][] = []
    for (const last of [false, true]) {
      const fin = last ? '"length"' : 'null'
      byLast.push(
        WORDS.map((w) =>
          chat
            ? `${first ? '"role":"assistant",' : ''}"content":${JSON.stringify(w)}},"logprobs":null,"finish_reason":${fin}}]}\n\n`
            : `${JSON.stringify(w)},"logprobs":null,"finish_reason":${fin}}]}\n\n`,
        ),
      )
    }
    out.push(byLast)
  }
  return out
}
const SUFFIX = [suffixes(false), suffixes(true)] as const

/** Text of the first n output tokens. */
export function outputText(n: number): string {
  const cycle = WORDS.join('')
  let s = cycle.repeat(Math.floor(n / WORDS.length))
  for (let k = 0; k < n % WORDS.length; k++) s += WORDS[k] as string
  return s
}

function errorBody(code: ErrorCode, message: string): string {
  return JSON.stringify({ error: { code, message } })
}

/** One HTTP completion in flight: the engine's listener, writing to the response. */
class Completion implements RequestListener {
  /** `{"id":…,"object":…,"created":…,"model":…` without the closing brace. */
  private readonly base: string
  private readonly chunkHead: string
  private started = false
  done = false

  constructor(
    private readonly res: ServerResponse,
    private readonly chat: boolean,
    private readonly stream: boolean,
    private readonly includeUsage: boolean,
    id: string,
    model: string,
    private readonly onDone: () => void,
  ) {
    const object = chat ? (stream ? 'chat.completion.chunk' : 'chat.completion') : 'text_completion'
    this.base = `{"id":"${id}","object":"${object}","created":${Math.floor(Date.now() / 1000)},"model":${JSON.stringify(model)}`
    this.chunkHead = stream ? `data: ${this.base},"choices":[{"index":0,${chat ? '"delta":{' : '"text":'}` : ''
  }

  private chunk(r: EngineRequest, last: boolean): string {
    const k = r.outputTokens - 1
    return this.chunkHead + ((SUFFIX[this.chat ? 1 : 0][k === 0 ? 1 : 0] as string[][])[last ? 1 : 0] as string[])[k % WORDS.length]
  }

  private usage(r: EngineRequest): string {
    const cached = Math.max(0, r.cachedTokens)
    return (
      `"usage":{"prompt_tokens":${r.isl},"completion_tokens":${r.outputTokens},"total_tokens":${r.isl + r.outputTokens},` +
      `"prompt_tokens_details":{"cached_tokens":${cached}}}`
    )
  }

  onToken(r: EngineRequest): void {
    if (!this.stream) return
    if (!this.started) {
      this.started = true
      this.res.writeHead(200, SSE_HEADERS)
    }
    this.res.write(this.chunk(r, false))
  }

  onFinish(r: EngineRequest): void {
    this.done = true
    this.onDone()
    if (this.stream) {
      if (!this.started) this.res.writeHead(200, SSE_HEADERS)
      this.res.end(
        this.includeUsage
          ? `${this.chunk(r, true)}data: ${this.base},"choices":[],${this.usage(r)}}\n\ndata: [DONE]\n\n`
          : `${this.chunk(r, true)}data: [DONE]\n\n`,
      )
      return
    }
    const text = JSON.stringify(outputText(r.outputTokens))
    const choice = this.chat
      ? `{"index":0,"message":{"role":"assistant","content":${text}},"logprobs":null,"finish_reason":"length"}`
      : `{"index":0,"text":${text},"logprobs":null,"finish_reason":"length"}`
    this.res.writeHead(200, JSON_HEADERS)
    this.res.end(`${this.base},"choices":[${choice}],${this.usage(r)}}`)
  }
}

/** Prompt token ids of a completions or chat body. */
export function promptTokens(body: Record<string, unknown>, chat: boolean): ArrayLike<number> {
  const nv = body.nvext as { token_data?: unknown } | undefined
  if (nv !== null && typeof nv === 'object' && Array.isArray(nv.token_data) && nv.token_data.length > 0) return nv.token_data as number[]
  if (chat) {
    if (!Array.isArray(body.messages)) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'messages must be an array')
    return Buffer.from(chatPromptText(body.messages as ChatMessage[]), 'utf8')
  }
  const p = body.prompt
  if (typeof p === 'string') return Buffer.from(p, 'utf8')
  if (Array.isArray(p)) {
    if (p.length === 0 || typeof p[0] === 'number') return p as number[]
    if (typeof p[0] === 'string') return Buffer.from(p[0] as string, 'utf8')
    if (Array.isArray(p[0])) return p[0] as number[]
  }
  throw new KvrError('KVR_ERR_INVALID_REQUEST', 'prompt must be a string, an array of token ids, or an array of either')
}

export class EngineServer {
  readonly engine: MockEngine
  private readonly server: Server
  private readonly o: EngineServerOptions
  private readonly modelName: string
  private nextId = 0
  /** Completions answered in full. */
  requestsServed = 0
  url = ''

  constructor(o: EngineServerOptions) {
    this.o = o
    this.engine = o.engine
    this.modelName = o.modelName ?? 'kv-router-model'
    this.server = createServer({ noDelay: true, keepAliveTimeout: 65_000 }, (req, res) => this.handle(req, res))
    // the router keeps connections open for long streams and reuses them
    this.server.headersTimeout = 70_000
    this.server.requestTimeout = 0
  }

  async listen(): Promise<string> {
    const host = this.o.host ?? '127.0.0.1'
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject)
      this.server.listen(this.o.port ?? 0, host, () => {
        this.server.off('error', reject)
        resolve()
      })
    })
    const a = this.server.address() as AddressInfo
    const adv = this.o.advertiseHost ?? host
    this.url = `http://${urlHost(adv)}:${a.port}`
    return this.url
  }

  /** Stops listening and cuts every connection (in-flight requests are aborted). */
  async close(): Promise<void> {
    if (!this.server.listening) return
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()))
    this.server.closeAllConnections()
    await closed
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const url = req.url ?? '/'
    if (req.method === 'GET') {
      if (url === '/health') return this.send(res, 200, `{"status":"ok","worker_id":${this.engine.workerId}}`)
      if (url === '/v1/models')
        return this.send(
          res,
          200,
          `{"object":"list","data":[{"id":${JSON.stringify(this.modelName)},"object":"model","created":0,"owned_by":"kv-router-mocker"}]}`,
        )
      if (url === '/stats') return this.send(res, 200, this.statsJson())
    } else if (req.method === 'POST') {
      if (url === '/v1/completions' || url === '/v1/chat/completions' || url === KV_QUERY_PATH) {
        this.readBody(req, res, (text) => (url === KV_QUERY_PATH ? this.query(text, res) : this.completion(text, url !== '/v1/completions', res)))
        return
      }
    }
    this.send(res, 404, errorBody('KVR_ERR_NOT_FOUND', `no route ${req.method ?? ''} ${url}`))
  }

  private send(res: ServerResponse, status: number, body: string): void {
    res.writeHead(status, JSON_HEADERS)
    res.end(body)
  }

  private readBody(req: IncomingMessage, res: ServerResponse, then: (text: string) => void): void {
    const limit = this.o.maxBodyBytes ?? 64 * 1024 * 1024
    const chunks: Buffer[] = []
    let size = 0
    let over = false
    req.on('data', (c: Buffer) => {
      if (over) return
      size += c.length
      if (size > limit) {
        over = true
        res.setHeader('connection', 'close')
        this.send(res, 413, errorBody('KVR_ERR_BODY_TOO_LARGE', `the body is larger than ${limit} bytes`))
        return
      }
      chunks.push(c)
    })
    req.on('end', () => {
      if (!over) then(chunks.length === 1 ? (chunks[0] as Buffer).toString('utf8') : Buffer.concat(chunks).toString('utf8'))
    })
    req.on('error', () => undefined)
  }

  private completion(text: string, chat: boolean, res: ServerResponse): void {
    let r: EngineRequest
    let c: Completion
    try {
      let body: unknown
      try {
        body = JSON.parse(text)
      } catch {
        throw new KvrError('KVR_ERR_INVALID_REQUEST', 'the body is not valid JSON')
      }
      if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'the body must be a JSON object')
      const b = body as Record<string, unknown>
      const tokens = promptTokens(b, chat)
      const mt = b.max_tokens ?? b.max_completion_tokens
      const maxTokens = mt === undefined || mt === null ? (this.o.defaultMaxTokens ?? 16) : mt
      if (typeof maxTokens !== 'number' || !Number.isInteger(maxTokens) || maxTokens < 1)
        throw new KvrError('KVR_ERR_INVALID_REQUEST', `max_tokens must be a positive integer, got ${JSON.stringify(mt)}`)
      const model = typeof b.model === 'string' ? b.model : this.modelName
      const id = `${chat ? 'chatcmpl' : 'cmpl'}-${this.engine.workerId}-${this.nextId++}`
      const so = b.stream_options
      const includeUsage = so !== null && typeof so === 'object' && (so as { include_usage?: unknown }).include_usage === true
      c = new Completion(res, chat, b.stream === true, includeUsage, id, model, () => this.requestsServed++)
      r = this.engine.submit(tokens, maxTokens, c)
    } catch (err) {
      if (!isKvrError(err)) throw err
      this.send(res, err.statusCode, errorBody(err.code, err.message))
      return
    }
    // a client that goes away (or a connection cut) aborts the request and frees its blocks
    res.on('close', () => {
      if (!c.done) this.engine.abort(r)
    })
  }

  private query(text: string, res: ServerResponse): void {
    let answer: KvQueryResponse
    try {
      const body = parseJsonExact(text) as Record<string, unknown>
      if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new KvrError('KVR_ERR_INVALID_REQUEST', 'the body must be a JSON object')
      const opt = (v: unknown, f: string): bigint | null => (v === undefined || v === null ? null : readU64(v, f))
      if (body.dp_rank !== undefined && body.dp_rank !== null && body.dp_rank !== 0)
        throw new KvrError('KVR_ERR_INVALID_REQUEST', `dp_rank ${JSON.stringify(body.dp_rank)}: this engine serves rank 0 only`)
      answer = this.engine.ring.query(
        {
          worker_id: readU64(body.worker_id, 'worker_id'),
          start_event_id: opt(body.start_event_id, 'start_event_id'),
          end_event_id: opt(body.end_event_id, 'end_event_id'),
        },
        this.engine.workerId,
      )
    } catch (err) {
      const message = err instanceof SyntaxError ? 'the body is not valid JSON' : (err as Error).message
      this.send(res, 400, encodeKvQueryResponse({ Error: message }))
      return
    }
    this.send(res, 'Error' in answer ? 404 : 200, encodeKvQueryResponse(answer))
  }

  private statsJson(): string {
    const e = this.engine
    const l = e.load()
    const s = e.stats
    return JSON.stringify({
      worker_id: e.workerId.toString(),
      url: this.url,
      config: { ...e.config, workerId: undefined },
      load: { active_blocks: l.activeBlocks, total_blocks: l.totalBlocks, waiting: l.waiting, running: l.running, prefix_hit_rate: l.prefixHitRate },
      pool: {
        used: e.pool.used,
        active: e.pool.activeBlocks,
        inactive: e.pool.inactiveBlocks,
        free: e.pool.freeBlocks,
        evictions: e.pool.evictions,
        stored_blocks: e.pool.storedBlocks,
        ...(e.pool.host === null
          ? {}
          : {
              host: {
                used: e.pool.host.used,
                capacity: e.pool.host.capacity,
                stored: e.pool.host.stored,
                evictions: e.pool.host.evictions,
                loads: e.pool.hostLoads,
              },
            }),
      },
      events: { newest_id: Number(e.ring.newestId), oldest_id: Number(e.ring.oldestId) },
      stats: { ...s, requests_served: this.requestsServed },
      ...(this.o.extraStats === undefined ? {} : { [this.o.extraStats.key]: this.o.extraStats.read() }),
    })
  }
}
