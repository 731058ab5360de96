// A minimal simulated inference engine (the full mocker of DESIGN §5 replaces it in a later
// issue): an OpenAI-compatible HTTP server that takes token ids or text (UTF-8 bytes as tokens,
// the same as `--tokenizer bytes`), keeps a BlockPool with prefix caching whose real
// Stored/Removed events go to the router (a callback in process, or POST /v1/kv-events), and
// answers with a few tokens after small delays, reporting usage.prompt_tokens_details.cached_tokens.
import { createServer } from 'node:http'
import type { IncomingMessage, Server, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { BlockPool } from './block-pool.js'
import { encodeRouterEvent } from './shared/events.js'
import type { RouterEvent } from './shared/events.js'
import { blockHashesInto } from './shared/hashing.js'
import { chatPromptText } from './tokenizer.js'
import type { ChatMessage } from './tokenizer.js'

export interface SimEngineOptions {
  workerId: bigint
  blockSize: number
  /** KV blocks in the pool. */
  capacity?: number
  host?: string
  port?: number
  /** Delay before the first token and between tokens (ms). */
  ttftMs?: number
  itlMs?: number
  /** Default output length when the request has no max_tokens. */
  defaultMaxTokens?: number
  /** In-process delivery of KV events (embedded fleet). */
  sink?: (ev: RouterEvent) => void
  /** Out of process: the router's base URL; events are POSTed to /v1/kv-events in order. */
  routerUrl?: string
  /** Bearer key for routerUrl. */
  apiKey?: string
}

const WORDS = ['the', ' cache', ' is', ' warm', ' and', ' the', ' router', ' knows', ' it', '.']

export class SimEngine {
  readonly workerId: bigint
  readonly blockSize: number
  readonly capacity: number
  private readonly pool: BlockPool
  private readonly server: Server
  private readonly o: SimEngineOptions
  private outbox: string[] = []
  private sending = false
  private nextReq = 0
  requestsServed = 0
  url = ''

  constructor(o: SimEngineOptions) {
    this.o = o
    this.workerId = o.workerId
    this.blockSize = o.blockSize
    this.capacity = o.capacity ?? 4096
    let sink: ((ev: RouterEvent) => void) | undefined = o.sink
    if (sink === undefined && o.routerUrl !== undefined) sink = (ev) => this.post(ev)
    const opts: ConstructorParameters<typeof BlockPool>[0] = { capacity: this.capacity, blockSize: o.blockSize, workerId: o.workerId, dpRank: 0 }
    if (sink !== undefined) opts.sink = sink
    this.pool = new BlockPool(opts)
    this.server = createServer((req, res) => {
      this.handle(req, res).catch((err: unknown) => {
        if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: { message: (err as Error).message } }))
      })
    })
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(this.o.port ?? 0, this.o.host ?? '127.0.0.1', resolve))
    const a = this.server.address() as AddressInfo
    this.url = `http://${this.o.host ?? '127.0.0.1'}:${a.port}`
    return this.url
  }

  async close(): Promise<void> {
    this.server.closeAllConnections()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
    await this.flushEvents()
  }

  /** Resolves once every event so far has been POSTed (out-of-process mode). */
  async flushEvents(): Promise<void> {
    while (this.sending || this.outbox.length > 0) await new Promise((r) => setTimeout(r, 5))
  }

  private post(ev: RouterEvent): void {
    this.outbox.push(encodeRouterEvent(ev))
    if (!this.sending) void this.sendLoop()
  }

  private async sendLoop(): Promise<void> {
    this.sending = true
    try {
      while (this.outbox.length > 0) {
        const batch = this.outbox.splice(0, 256)
        const headers: Record<string, string> = { 'content-type': 'application/json' }
        if (this.o.apiKey !== undefined) headers.authorization = `Bearer ${this.o.apiKey}`
        try {
          await fetch(`${this.o.routerUrl}/v1/kv-events`, { method: 'POST', headers, body: `[${batch.join(',')}]` })
        } catch {
          // the router is away: events are lost, as they would be on a NATS core subject
        }
      }
    } finally {
      this.sending = false
    }
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method === 'GET' && (req.url === '/health' || req.url === '/v1/models')) {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(req.url === '/health' ? '{"status":"ok"}' : '{"object":"list","data":[{"id":"sim","object":"model","created":0,"owned_by":"sim"}]}')
      return
    }
    const chat = req.url === '/v1/chat/completions'
    if (req.method !== 'POST' || (!chat && req.url !== '/v1/completions')) {
      res.writeHead(404, { 'content-type': 'application/json' })
      res.end('{"error":{"message":"not found"}}')
      return
    }
    const chunks: Buffer[] = []
    for await (const c of req) chunks.push(c as Buffer)
    let body: Record<string, unknown>
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>
    } catch {
      res.writeHead(400, { 'content-type': 'application/json' })
      res.end('{"error":{"message":"malformed JSON"}}')
      return
    }
    const tokens = promptTokens(body, chat)
    const bs = this.blockSize
    const n = Math.floor(tokens.length / bs)
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    blockHashesInto(tokens, bs, lo, hi)
    const reqId = `sim-${this.nextReq++}`
    const alloc = this.pool.allocate(reqId, lo, hi, n)
    const cached = alloc.hits * bs
    const maxTokens = Math.max(1, Math.min(256, typeof body.max_tokens === 'number' ? body.max_tokens : typeof body.max_completion_tokens === 'number' ? body.max_completion_tokens : (this.o.defaultMaxTokens ?? 8)))
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${this.workerId}-${reqId}`
    const created = Math.floor(Date.now() / 1000)
    const model = typeof body.model === 'string' ? body.model : 'sim'
    const usage = { prompt_tokens: tokens.length, completion_tokens: maxTokens, total_tokens: tokens.length + maxTokens, prompt_tokens_details: { cached_tokens: cached } }
    const ttft = this.o.ttftMs ?? 5
    const itl = this.o.itlMs ?? 2
    let gone = false
    res.on('close', () => {
      gone = true
    })
    try {
      await sleep(ttft)
      if (body.stream === true) {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
        for (let k = 0; k < maxTokens && !gone; k++) {
          if (k > 0) await sleep(itl)
          const word = WORDS[k % WORDS.length] as string
          const last = k === maxTokens - 1
          const choice = chat ? { index: 0, delta: k === 0 ? { role: 'assistant', content: word } : { content: word }, finish_reason: last ? 'length' : null } : { index: 0, text: word, finish_reason: last ? 'length' : null, logprobs: null }
          res.write(`data: ${JSON.stringify({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model, choices: [choice] })}\n\n`)
        }
        if (!gone) {
          const so = body.stream_options as { include_usage?: boolean } | undefined
          if (so?.include_usage === true) res.write(`data: ${JSON.stringify({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model, choices: [], usage })}\n\n`)
          res.end('data: [DONE]\n\n')
        }
      } else {
        let text = ''
        for (let k = 0; k < maxTokens; k++) text += WORDS[k % WORDS.length] as string
        await sleep(itl * (maxTokens - 1))
        const choice = chat ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'length' } : { index: 0, text, finish_reason: 'length', logprobs: null }
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ id, object: chat ? 'chat.completion' : 'text_completion', created, model, choices: [choice], usage }))
      }
      this.requestsServed++
    } finally {
      this.pool.release(reqId)
    }
  }
}

function promptTokens(body: Record<string, unknown>, chat: boolean): ArrayLike<number> {
  const nv = body.nvext as { token_data?: unknown } | undefined
  if (Array.isArray(nv?.token_data) && nv.token_data.length > 0) return nv.token_data as number[]
  if (chat) return Buffer.from(chatPromptText((body.messages ?? []) as ChatMessage[]), 'utf8')
  const p = body.prompt
  if (typeof p === 'string') return Buffer.from(p, 'utf8')
  if (Array.isArray(p)) {
    if (typeof p[0] === 'number') return p as number[]
    if (typeof p[0] === 'string') return Buffer.from(p[0] as string, 'utf8')
    if (Array.isArray(p[0])) return p[0] as number[]
  }
  return []
}

function sleep(ms: number): Promise<void> {
  return ms <= 0 ? Promise.resolve() : new Promise((r) => setTimeout(r, ms))
}

/** The embedded fleet of `npm start`: N engines in this process, events delivered in process. */
export async function startFleet(n: number, blockSize: number, deliver: (ev: RouterEvent) => void, opts: Partial<SimEngineOptions> = {}): Promise<SimEngine[]> {
  const out: SimEngine[] = []
  for (let i = 0; i < n; i++) {
    const e = new SimEngine({ ...opts, workerId: BigInt(i + 1), blockSize, sink: deliver })
    await e.listen()
    out.push(e)
  }
  return out
}
