// The trace replay engine: sends each request of a Mooncake trace to an OpenAI-compatible
// completions endpoint at its trace time (scaled by `speedup`), as an open-loop load generator,
// and measures what each streamed response looked like from the client's side.
//
// Open loop matters: a closed-loop client (send the next request when one finishes) slows down
// exactly when the fleet does and hides queueing, which is what a router is judged on. So the
// schedule is kept against a monotonic clock and never waits for responses; the only brake is
// `maxInFlight`, a safety cap against exhausting sockets or memory when the target stalls.
// How late each request actually left is recorded (`sent_ms − scheduled_ms`), so a client that
// could not keep up shows in the results instead of silently lowering the load.
//
// Timing is taken where the client sees the bytes, once per network read: events that arrive
// in one read arrived together, and an engine that falls behind its schedule (the simulated one
// runs overdue steps back to back) delivers several tokens per read. So a stream gives two
// figures: TTFT, send → the read with the first content event; TPOT, (read with the last
// content event − read with the first) / (content events − 1), the mean time per output token
// after the first; and ITL samples, one per read that carried content after the first: the gap
// since the previous such read, however many tokens it brought.
import { performance } from 'node:perf_hooks'
import { Agent, request } from 'undici'
import type { Dispatcher } from 'undici'
import { expandTokens } from './trace.js'
import type { TraceRequest } from './trace.js'
import { MAX_TIMER_MS } from '../../runtime/timers.js'

export interface ReplayRecord {
  /** Index of the request in the replayed list (trace order, 0-based). */
  id: number
  /** The trace's arrival time, ms. */
  timestamp: number
  /** When it was due, ms after the start of the replay (wall clock). */
  scheduled_ms: number
  /** When it was actually sent, ms after the start (wall clock). */
  sent_ms: number
  /** Send → first content chunk, wall ms; null when none arrived. */
  ttft_ms: number | null
  /** TPOT: (last content chunk − first) / (content chunks − 1), wall ms; null with fewer than two chunks. */
  tpot_ms: number | null
  /** Send → end of the response, wall ms; null when it never ended (network error, timeout). */
  e2e_ms: number | null
  /** usage.completion_tokens, else the number of content chunks. */
  output_tokens: number
  /** usage.prompt_tokens, else the trace's input_length. */
  prompt_tokens: number
  /** usage.prompt_tokens_details.cached_tokens, else 0. */
  cached_tokens: number
  /** The worker that served it (x-worker-id header, else nvext.worker_id.decode_worker_id). */
  worker: string | null
  /** HTTP status; 0 when no response arrived. */
  status: number
  /** Why the request failed; null when it succeeded. */
  error: string | null
}

export interface ReplayOptions {
  /** Base URL of the router (or any OpenAI-compatible server); /v1/completions is appended. */
  url: string
  requests: readonly TraceRequest[]
  /** Trace time runs this many times faster (default 1). */
  speedup?: number
  /** At most this many requests outstanding; later ones wait for a slot (default 2048). */
  maxInFlight?: number
  model?: string
  apiKey?: string
  /** Per-request deadline, ms (default 600,000). */
  timeoutMs?: number
  /** Called once per finished request, in completion order. */
  onRecord?: (r: ReplayRecord) => void
  /** Stops sending; requests in flight are aborted and recorded as failed. */
  signal?: AbortSignal
}

export interface ReplayProgress {
  total: number
  sent: number
  done: number
  failed: number
  inFlight: number
  /** Wall seconds since the start. */
  elapsedS: number
  /** Wall seconds the schedule spans (last request's due time). */
  scheduleS: number
}

export interface ReplayResult {
  /** One per request, in id order. */
  records: ReplayRecord[]
  /**
   * ITL samples of every successful request, wall ms: for each network read that carried content
   * after a stream's first, the time since the previous one (see the top of the file).
   */
  itlGaps: Float64Array
  /** Start to last completion, wall ms. */
  wallMs: number
}

/** A growable Float64Array: millions of gaps without millions of boxed numbers. */
class Samples {
  private buf = new Float64Array(1 << 16)
  length = 0
  push(v: number): void {
    if (this.length === this.buf.length) {
      const next = new Float64Array(this.buf.length * 2)
      next.set(this.buf)
      this.buf = next
    }
    this.buf[this.length++] = v
  }
  toArray(): Float64Array {
    return this.buf.slice(0, this.length)
  }
}

/** Bodies built ahead of a burst at most (a few MB of JSON for the longest prompts). */
const PREPARE_AHEAD = 64

const WORKER_RE = /"decode_worker_id"\s*:\s*"?(\d+)/

/** The JSON body of a trace request: token ids as the prompt, streamed, usage included. */
export function requestBody(req: TraceRequest, model: string): string {
  const tokens = expandTokens(req)
  // Array.prototype.join over the typed array: no intermediate number[] for 10^4–10^5 tokens
  const prompt = Array.prototype.join.call(tokens, ',')
  return (
    `{"model":${JSON.stringify(model)},"prompt":[${prompt}],"max_tokens":${req.output_length},"ignore_eos":true,"stream":true,` +
    `"stream_options":{"include_usage":true}}`
  )
}

interface Usage {
  prompt_tokens?: number
  completion_tokens?: number
  prompt_tokens_details?: { cached_tokens?: number } | null
}

interface StreamEvent {
  choices?: { text?: unknown; delta?: { content?: unknown } }[]
  usage?: Usage | null
  error?: { message?: unknown } | string
}

/** A replay in progress: poll `progress()`, await `done`. */
export class ReplayRun {
  readonly done: Promise<ReplayResult>
  private readonly o: Required<Pick<ReplayOptions, 'speedup' | 'maxInFlight' | 'timeoutMs'>> & ReplayOptions
  private readonly agent: Agent
  private readonly records: ReplayRecord[]
  private readonly gaps = new Samples()
  private readonly endpoint: string
  private readonly headers: Record<string, string>
  private readonly aborts = new Set<AbortController>()
  private readonly prepared = new Map<number, string | Error>()
  private start = 0
  private sent = 0
  private finished = 0
  private failed = 0
  private inFlight = 0
  private slotWaiter: (() => void) | null = null
  private allDone: (() => void) | null = null

  constructor(options: ReplayOptions) {
    this.o = { speedup: 1, maxInFlight: 2048, timeoutMs: 600_000, ...options }
    if (!(this.o.speedup > 0) || !Number.isFinite(this.o.speedup)) throw new RangeError(`speedup must be a positive number, got ${this.o.speedup}`)
    if (!(this.o.timeoutMs > 0) || this.o.timeoutMs > MAX_TIMER_MS)
      throw new RangeError(`timeoutMs must be in (0, ${MAX_TIMER_MS}], Node's timer range, got ${this.o.timeoutMs}`)
    if (!Number.isInteger(this.o.maxInFlight) || this.o.maxInFlight < 1)
      throw new RangeError(`maxInFlight must be a positive integer, got ${this.o.maxInFlight}`)
    this.endpoint = `${this.o.url.replace(/\/+$/, '')}/v1/completions`
    this.headers = { 'content-type': 'application/json', accept: 'text/event-stream' }
    if (this.o.apiKey !== undefined) this.headers.authorization = `Bearer ${this.o.apiKey}`
    // One connection per outstanding stream (HTTP/1.1 cannot multiplex); the request deadline
    // is ours, so undici's own header/body timeouts are off.
    this.agent = new Agent({
      connections: this.o.maxInFlight,
      pipelining: 1,
      headersTimeout: 0,
      bodyTimeout: 0,
      keepAliveTimeout: 30_000,
      connect: { timeout: 10_000 },
    })
    this.records = new Array<ReplayRecord>(this.o.requests.length)
    this.done = this.run().finally(() => this.agent.close().catch(() => undefined))
  }

  progress(): ReplayProgress {
    const reqs = this.o.requests
    const last = reqs.length === 0 ? 0 : ((reqs[reqs.length - 1] as TraceRequest).timestamp - (reqs[0] as TraceRequest).timestamp) / this.o.speedup
    return {
      total: reqs.length,
      sent: this.sent,
      done: this.finished,
      failed: this.failed,
      inFlight: this.inFlight,
      elapsedS: this.start === 0 ? 0 : (performance.now() - this.start) / 1000,
      scheduleS: last / 1000,
    }
  }

  private async run(): Promise<ReplayResult> {
    const reqs = this.o.requests
    const model = this.o.model ?? 'kv-router-model'
    const signal = this.o.signal
    // a function, not a property test: the flag changes across the awaits below
    const aborted = (): boolean => signal?.aborted === true
    const onAbort = (): void => {
      for (const c of this.aborts) c.abort(new Error('replay aborted'))
    }
    signal?.addEventListener('abort', onAbort)
    this.start = performance.now()
    const t0 = reqs.length === 0 ? 0 : (reqs[0] as TraceRequest).timestamp
    const allDone = new Promise<void>((resolve) => (this.allDone = resolve))
    try {
      for (let i = 0; i < reqs.length; i++) {
        if (aborted()) break
        const req = reqs[i] as TraceRequest
        const due = (req.timestamp - t0) / this.o.speedup
        if (due - (performance.now() - this.start) > 0) {
          // Idle until the next arrival: build the bodies of every request due at that same
          // instant now, so a burst (the Mooncake traces arrive in batches) leaves back to back
          // instead of paying ~2 ms of token expansion and JSON per request on the critical path.
          for (let j = i; j < reqs.length && j < i + PREPARE_AHEAD && (reqs[j] as TraceRequest).timestamp === req.timestamp; j++) {
            if (!this.prepared.has(j)) this.prepared.set(j, this.body(reqs[j] as TraceRequest, model))
          }
          const wait = due - (performance.now() - this.start)
          if (wait > 0) await sleep(wait, signal)
        }
        while (this.inFlight >= this.o.maxInFlight) await new Promise<void>((r) => (this.slotWaiter = r))
        if (aborted()) break
        this.launch(i, req, due, model)
      }
      // requests never sent (aborted) are recorded as failed so every id has a record
      for (let i = 0; i < reqs.length; i++) {
        if (this.records[i] === undefined && i >= this.sent) {
          const req = reqs[i] as TraceRequest
          this.finish(
            { ...emptyRecord(i, req, (req.timestamp - t0) / this.o.speedup, performance.now() - this.start), error: 'not sent: replay aborted' },
            false,
          )
        }
      }
      if (this.finished < reqs.length) await allDone
    } finally {
      signal?.removeEventListener('abort', onAbort)
    }
    return { records: this.records, itlGaps: this.gaps.toArray(), wallMs: performance.now() - this.start }
  }

  private finish(rec: ReplayRecord, counted: boolean): void {
    this.records[rec.id] = rec
    this.finished++
    if (rec.error !== null) this.failed++
    if (counted) {
      this.inFlight--
      const w = this.slotWaiter
      this.slotWaiter = null
      w?.()
    }
    this.o.onRecord?.(rec)
    if (this.finished === this.o.requests.length) this.allDone?.()
  }

  /** The request's body, or the Error that makes it unsendable. */
  private body(req: TraceRequest, model: string): string | Error {
    try {
      return requestBody(req, model)
    } catch (err) {
      return err as Error
    }
  }

  private launch(id: number, req: TraceRequest, due: number, model: string): void {
    this.sent++
    this.inFlight++
    const body = this.prepared.get(id) ?? this.body(req, model)
    this.prepared.delete(id)
    if (body instanceof Error) {
      this.finish({ ...emptyRecord(id, req, due, performance.now() - this.start), error: `invalid trace request: ${body.message}` }, true)
      return
    }
    void this.send(id, req, due, body).then((rec) => this.finish(rec, true))
  }

  private async send(id: number, req: TraceRequest, due: number, body: string): Promise<ReplayRecord> {
    const sentAt = performance.now()
    const rec = emptyRecord(id, req, due, sentAt - this.start)
    const ac = new AbortController()
    this.aborts.add(ac)
    const timer = setTimeout(() => ac.abort(new Error(`timed out after ${this.o.timeoutMs / 1000} s`)), this.o.timeoutMs)
    let firstAt = -1
    let lastAt = -1
    let chunks = 0
    const gaps: number[] = []
    let usage: Usage | null = null
    let sawDone = false
    try {
      const res: Dispatcher.ResponseData = await request(this.endpoint, {
        method: 'POST',
        body,
        headers: this.headers,
        dispatcher: this.agent,
        signal: ac.signal,
      })
      rec.status = res.statusCode
      const hdr = res.headers['x-worker-id']
      if (typeof hdr === 'string' && hdr !== '') rec.worker = hdr
      if (res.statusCode !== 200) {
        const text = await res.body.text().catch(() => '')
        rec.error = `HTTP ${res.statusCode}: ${errorMessage(text)}`
        rec.e2e_ms = performance.now() - sentAt
        return rec
      }
      const decoder = new TextDecoder()
      let buf = ''
      for await (const chunk of res.body) {
        const now = performance.now()
        let content = false
        buf += decoder.decode(chunk as Buffer, { stream: true })
        let cut: number
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const event = buf.slice(0, cut)
          buf = buf.slice(cut + 2)
          const data = sseData(event)
          if (data === null) continue
          if (data === '[DONE]') {
            sawDone = true
            continue
          }
          let ev: StreamEvent
          try {
            ev = JSON.parse(data) as StreamEvent
          } catch {
            throw new Error(`malformed stream event: ${data.slice(0, 120)}`)
          }
          if (ev.error !== undefined)
            throw new Error(`stream error: ${typeof ev.error === 'string' ? ev.error : String(ev.error.message ?? JSON.stringify(ev.error))}`)
          if (rec.worker === null) {
            const m = WORKER_RE.exec(data)
            if (m !== null) rec.worker = m[1] as string
          }
          if (ev.usage !== undefined && ev.usage !== null) usage = ev.usage
          const c = ev.choices?.[0]
          if (c !== undefined && (typeof c.text === 'string' || (typeof c.delta?.content === 'string' && c.delta.content !== ''))) {
            // set at once: an error later in the same read still leaves the first token's time
            if (firstAt < 0) firstAt = now
            content = true
            chunks++
          }
        }
        if (content) {
          if (lastAt >= 0) gaps.push(now - lastAt)
          lastAt = now
        }
      }
      rec.e2e_ms = performance.now() - sentAt
      if (!sawDone) throw new Error('the stream ended without data: [DONE]')
      if (chunks === 0) throw new Error('the stream carried no content')
      rec.ttft_ms = firstAt - sentAt
      if (chunks > 1) rec.tpot_ms = (lastAt - firstAt) / (chunks - 1)
      const u = usage as Usage | null
      rec.output_tokens = typeof u?.completion_tokens === 'number' ? u.completion_tokens : chunks
      if (typeof u?.prompt_tokens === 'number') rec.prompt_tokens = u.prompt_tokens
      const cached = u?.prompt_tokens_details?.cached_tokens
      if (typeof cached === 'number') rec.cached_tokens = cached
      for (const g of gaps) this.gaps.push(g)
      return rec
    } catch (err) {
      const reason = ac.signal.aborted ? (ac.signal.reason as Error) : (err as Error)
      rec.error = reason?.message ?? String(reason)
      if (firstAt >= 0) rec.ttft_ms = firstAt - sentAt
      return rec
    } finally {
      clearTimeout(timer)
      this.aborts.delete(ac)
    }
  }
}

function emptyRecord(id: number, req: TraceRequest, due: number, sent: number): ReplayRecord {
  return {
    id,
    timestamp: req.timestamp,
    scheduled_ms: due,
    sent_ms: sent,
    ttft_ms: null,
    tpot_ms: null,
    e2e_ms: null,
    output_tokens: 0,
    prompt_tokens: req.input_length,
    cached_tokens: 0,
    worker: null,
    status: 0,
    error: null,
  }
}

/** The data of one SSE event (its `data:` lines joined), or null when it has none. */
function sseData(event: string): string | null {
  let out: string | null = null
  for (const raw of event.split('\n')) {
    const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw
    if (!line.startsWith('data:')) continue
    const v = line.slice(line.charCodeAt(5) === 32 ? 6 : 5)
    out = out === null ? v : `${out}\n${v}`
  }
  return out
}

function errorMessage(text: string): string {
  try {
    const o = JSON.parse(text) as { error?: { code?: string; message?: string }; message?: string }
    const m = o.error?.message ?? o.message
    if (typeof m === 'string') return o.error?.code !== undefined ? `${o.error.code}: ${m}` : m
  } catch {
    // not JSON: the raw text is the message
  }
  return text.length > 200 ? `${text.slice(0, 200)}…` : text
}

/**
 * Resolves after ms, or at once when the signal aborts (the caller checks which). A trace
 * slowed down by a small --speedup can put its next arrival beyond Node's timer range, so a
 * long wait is a chain of timers of at most MAX_TIMER_MS each.
 */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  const end = performance.now() + ms
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout
    const done = (): void => {
      clearTimeout(timer)
      signal?.removeEventListener('abort', done)
      resolve()
    }
    const arm = (): void => {
      const left = end - performance.now()
      timer = left > MAX_TIMER_MS ? setTimeout(arm, MAX_TIMER_MS) : setTimeout(done, left)
    }
    arm()
    signal?.addEventListener('abort', done)
  })
}

/** Starts a replay; `run.done` resolves with every record once the last request has ended. */
export function startReplay(options: ReplayOptions): ReplayRun {
  return new ReplayRun(options)
}

/** Replays and waits for the end. */
export function replayTrace(options: ReplayOptions): Promise<ReplayResult> {
  return new ReplayRun(options).done
}
