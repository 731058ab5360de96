// The streaming proxy and the booking lifecycle of one request:
//
//   route+book ──► upstream request ──► first event ──► ... ──► end ───────────► free
//        ▲              │ connect error / 5xx / dies       │ upstream dies      ▲
//        │              ▼ before the first event           ▼ after it           │
//        └── route again, tried ones excluded (free old)   error event, end ─────┤
//   client disconnects at any point: abort the upstream request ────────────────┘
//
// A booking is freed exactly once whatever happens (Booking.release). Nothing is written to the
// client before the first whole upstream event (its first token), so a failure up to then, one
// inside that event included, can still be retried on the best worker-rank not tried yet. Past
// it nothing is retried, and the prompt is let go while the stream lasts. Events reach the
// client whole, so the error event that ends a failed stream is always an event of its own.
//
// A worker reached over HTTP gets the client's body as it came (UpstreamExchange, here); one
// reached only over Dynamo's TCP request plane gets a PreprocessedRequest, and its item stream is
// translated to the same OpenAI answer (RequestPlaneExchange, request-plane.ts). Both share this
// run: its bookings, retries, first-token bookkeeping and ends.
import type { FastifyReply } from 'fastify'
import { Agent } from 'undici'
import type { Dispatcher } from 'undici'
import type { RouteInput, Router, WorkerInfo } from '../../core/router.js'
import type { CancelSignal, RouteDecision, WorkerRankRef } from '../../scheduler/scheduler.js'
import { KvrError, isKvrError } from '../../errors.js'
import { serializeJson } from '../../codec/json.js'
import { endsEvent, endsWithDone, eventEnd, injectWorkerId, lastEventEnd, workerIdObject } from './sse.js'
import { limited } from '../../runtime/log.js'
import type { Logger } from '../../runtime/log.js'
import { proxiedLine } from '../request-log.js'
import type { ProxiedRequest } from '../request-log.js'
import { ChunkWriter } from './chunked.js'
import { ClientGone } from './client-gone.js'
import { RequestPlaneExchange } from './request-plane.js'
import type { AttemptRun } from './attempt-run.js'
import type { RequestPlaneClient } from '../../request-plane/client.js'
import type { RequestKind } from '../../frontend/preprocessed-request.js'
import { tokenDecoderFor } from '../../tokenizer/token-decoder.js'
import type { TokenDecoder } from '../../tokenizer/token-decoder.js'
import { RetryableError } from '../../scheduler/rejection.js'

export interface ProxyCall {
  /** Upstream path: /v1/completions or /v1/chat/completions. */
  path: string
  /** The client's JSON body, forwarded byte for byte. */
  payload: Uint8Array
  stream: boolean
  route: RouteInput
  model: string
  /** Completions or chat: what a request-plane worker's answer is translated to. */
  kind: RequestKind
  /**
   * The client's body, parsed: a request-plane worker is sent a PreprocessedRequest built from it.
   * Let go at the first token, with the payload.
   */
  body: Record<string, unknown> | null
}

class Booking {
  private freed = false
  constructor(
    private readonly router: Router,
    readonly id: string,
  ) {}

  /** `observed`: the first token arrived just now (a stream's), so its time teaches the worker's engine model. */
  prefillComplete(observed: boolean): void {
    if (!this.freed) this.router.scheduler.markPrefillComplete(this.id, observed)
  }

  /** Frees the booking; only the first call has an effect. `outputTokens`: the tokens streamed (0 = unknown). */
  release(outputTokens = 0): boolean {
    if (this.freed) return false
    this.freed = true
    this.router.scheduler.free(this.id, outputTokens)
    return true
  }
}

interface Attempt {
  decision: RouteDecision
  booking: Booking
}

/** What a run asks of its exchange with one worker. */
interface Exchange {
  clientGone(): void
}

export interface ProxyOptions {
  retries: number
  /** undici dispatcher; a keep-alive Agent by default. */
  dispatcher?: Dispatcher
  /** Where each request's line goes (at info); none when not given. */
  logger?: Logger
  /** Dynamo's TCP request plane, for the workers reached only through it. */
  requestPlane?: RequestPlaneClient
  /**
   * The --tokenizer value: its decoder turns the token ids a request-plane worker sends without
   * text into text. Loaded on first use, so a fleet without such workers never loads it twice.
   */
  tokenizer?: string | null
}

export class UpstreamProxy {
  private readonly dispatcher: Dispatcher
  private readonly ownDispatcher: boolean
  private active = 0
  private idleWaiters: (() => void)[] = []
  /** Bookings released, all requests (tests check exactly-once through it). */
  releasedTotal = 0
  /** The logger of request lines, or null while they are not written. */
  readonly requestLog: Logger | null

  constructor(
    private readonly router: Router,
    private readonly options: ProxyOptions,
  ) {
    this.ownDispatcher = options.dispatcher === undefined
    this.dispatcher = options.dispatcher ?? new Agent({ connections: 1024, keepAliveTimeout: 30_000, headersTimeout: 300_000, bodyTimeout: 300_000 })
    this.requestLog = options.logger?.isLevelEnabled('info') === true ? options.logger : null
  }

  get inFlight(): number {
    return this.active
  }

  get retries(): number {
    return this.options.retries
  }

  /** Resolves once no request is being proxied (or after timeoutMs); true when idle. */
  async drain(timeoutMs: number): Promise<boolean> {
    if (this.active === 0) return true
    return new Promise((resolve) => {
      const t = setTimeout(() => resolve(this.active === 0), timeoutMs)
      this.idleWaiters.push(() => {
        clearTimeout(t)
        resolve(true)
      })
    })
  }

  /** Closes its own dispatcher: gracefully, or at once (`force`) when requests were cut. */
  async close(force = false): Promise<void> {
    if (!this.ownDispatcher) return
    if (force) await this.dispatcher.destroy()
    else await this.dispatcher.close()
  }

  /**
   * Proxies one request; it answers the client itself, errors included (through fastify's error
   * handler while nothing has been sent), so the route handler returns nothing for fastify to wait on.
   */
  handle(reply: FastifyReply, call: ProxyCall): void {
    new ProxyRun(this, reply, call).start()
  }

  /** A run begins: counted in flight. */
  opened(call: ProxyCall): void {
    this.active++
    this.router.metrics.proxyStarted(call.model)
  }

  /** A run is over, answered with `status` unless the response says otherwise. */
  closed(reply: FastifyReply, call: ProxyCall, status: number): void {
    this.router.metrics.proxyEnded(call.model)
    this.router.metrics.request(call.model, call.path, call.stream ? 'stream' : 'unary', reply.sent && status === 200 ? reply.statusCode : status)
    this.active--
    if (this.active === 0) for (const w of this.idleWaiters.splice(0)) w()
  }

  /**
   * Books an attempt on the run's own RouteInput, which takes the attempt's id (its Booking keeps
   * it). Not on a copy: in Node 20's V8, `{ ...route, id, updateStates, signal }` adds each
   * property after the spread on a slow path, about 0.8 µs apiece: a booking in round-robin mode
   * took about 7 µs with the copy and 2–3 without (`npm run bench:route`, "proxy booking").
   */
  async book(route: RouteInput, signal: CancelSignal): Promise<Attempt> {
    if (route.workerId !== undefined && this.router.registry.get(route.workerId)?.decisionsOnly === true)
      throw new KvrError(
        'KVR_ERR_WORKER_DECISIONS_ONLY',
        `worker ${route.workerId} is registered for routing decisions only: the router sends it no request (ask POST /v1/route and send it yourself)`,
      )
    // workers registered for decisions only are not the proxy's to send to
    if (route.exclude === undefined && this.router.registry.decisionsOnly.length > 0) route.exclude = this.router.registry.decisionsOnly
    const id = this.router.requestIds.create(true)
    route.id = id
    route.updateStates = true
    route.signal = signal
    const { decision } = await this.router.route(route)
    return { decision, booking: new Booking(this.router, id) }
  }

  /**
   * A fresh decision among the worker-ranks not tried yet, on the fleet's state as it is now;
   * when none can take the request, the reason why not. (Ranking every candidate up front for a
   * retry that rarely comes cost each request a table as long as the fleet.)
   */
  async rebook(route: RouteInput, signal: CancelSignal, tried: WorkerRankRef[]): Promise<Attempt | string> {
    // the same array throughout: each worker-rank found without a URL below joins it (and the
    // workers registered for decisions only stay out)
    const held = this.router.registry.decisionsOnly
    const exclude = held.length === 0 ? tried : [...held, ...tried]
    route.exclude = exclude
    for (;;) {
      let a: Attempt
      try {
        a = await this.book(route, signal)
      } catch (err) {
        // the client is told what happened (its worker failed) and why it was not retried; a
        // bare 503 "all busy" would hide the failure
        if (isKvrError(err, 'KVR_ERR_NO_WORKERS')) return 'no other worker is available'
        if (isKvrError(err, 'KVR_ERR_ALL_WORKERS_BUSY')) return 'every other worker is busy'
        if (isKvrError(err, 'KVR_ERR_QUEUE_FULL')) return 'the router queue is full'
        throw err
      }
      if (this.router.registry.get(a.decision.workerId) !== undefined) return a
      // a worker-rank known only from its KV events has no URL to proxy to: not an attempt
      this.release(a.booking)
      const ref = rankRef(a.decision)
      tried.push(ref)
      if (exclude !== tried) exclude.push(ref)
    }
  }

  /** Releases a booking (the exchange calls it too) and counts the first release. */
  release(b: Booking, outputTokens = 0): void {
    if (b.release(outputTokens)) this.releasedTotal++
  }

  worker(id: bigint): WorkerInfo | undefined {
    return this.router.registry.get(id)
  }

  workerFailed(id: bigint): void {
    this.router.suspension.failed(id)
  }

  workerAnswered(w: WorkerInfo): void {
    this.router.suspension.answered(w)
  }

  /** Sends one attempt's request to its worker; the exchange hears the rest. Throws if undici refuses it at once. */
  dispatch(worker: WorkerInfo, call: ProxyCall, a: Attempt, ex: UpstreamExchange): void {
    const target = upstreamTarget(worker.url)
    this.dispatcher.dispatch(
      {
        origin: target.origin,
        path: target.path + call.path,
        method: 'POST',
        body: call.payload,
        headers: { 'content-type': 'application/json', accept: call.stream ? 'text/event-stream' : 'application/json', 'x-request-id': a.booking.id },
      },
      ex,
    )
  }

  get metrics(): Router['metrics'] {
    return this.router.metrics
  }

  /** The request-plane client, or null when the proxy has none. */
  get requestPlane(): RequestPlaneClient | null {
    return this.options.requestPlane ?? null
  }

  private decoderLoaded: TokenDecoder | null | undefined = undefined

  get decoder(): TokenDecoder | null {
    if (this.decoderLoaded === undefined) this.decoderLoaded = tokenDecoderFor(this.options.tokenizer ?? null)
    return this.decoderLoaded
  }

  /** Seconds a 503 asks the client to wait. */
  get retryAfterSecs(): number {
    return this.router.scheduler.options.retryAfterSecs
  }
}

/**
 * One proxied request from booking to its end, across attempts. Plain callbacks, not a promise
 * chain: a stream keeps its run alive for its whole life, and each pending promise with its
 * reactions, closures and contexts would be held, and copied by every scavenge, as long.
 */
class ProxyRun implements ProxiedRequest, AttemptRun {
  readonly gone = new ClientGone()
  /** Retries allowed after the first attempt (none for a pinned request). */
  private readonly retries: number
  private retry = 0
  private tried: WorkerRankRef[] | undefined = undefined
  /** When the first booking was made: TTFT is counted from here. */
  started = 0
  private exchange: Exchange | null = null
  private ended = false
  private readonly onClose = (): void => this.clientClosed()
  // what the request's log line says
  decision: RouteDecision | null = null
  attempts = 0
  requestId: string
  ttftMs = -1
  errorCode: string | null = null

  constructor(
    readonly proxy: UpstreamProxy,
    readonly reply: FastifyReply,
    readonly call: ProxyCall,
  ) {
    this.retries = call.route.workerId === undefined ? proxy.retries : 0
    this.requestId = reply.request.id
  }

  get path(): string {
    return this.call.path
  }

  get model(): string {
    return this.call.model
  }

  get stream(): boolean {
    return this.call.stream
  }

  start(): void {
    const raw = this.reply.raw
    raw.on('close', this.onClose)
    this.proxy.opened(this.call)
    // a client can leave while its prompt is tokenized, before anything listened for it
    if (raw.destroyed) return this.fail(new KvrError('KVR_ERR_REQUEST_CANCELLED', 'the client went away'))
    this.proxy.book(this.call.route, this.gone).then(
      (a) => {
        this.started = performance.now()
        this.attemptGuarded(a)
      },
      (err: unknown) => this.fail(err),
    )
  }

  /** attempt(), where a throw would otherwise escape a promise callback with the booking held. */
  private attemptGuarded(a: Attempt): void {
    try {
      this.attempt(a)
    } catch (err) {
      this.attemptFailed(a, err)
    }
  }

  clientClosed(): void {
    if (this.reply.raw.writableFinished) return
    try {
      this.gone.abort()
      this.exchange?.clientGone()
    } catch (err) {
      // thrown from a 'close' listener it would take the process down
      this.reply.log.error({ err }, 'cleaning up after a client disconnect failed')
    }
  }

  /** One upstream attempt on booking `a`. */
  private attempt(a: Attempt): void {
    const d = a.decision
    this.decision = d
    this.requestId = a.booking.id
    this.attempts++
    const worker = this.proxy.worker(d.workerId)
    if (worker === undefined) return this.attemptFailed(a, new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} has no HTTP endpoint`))
    if (worker.url === '' && worker.requestPlane != null) {
      const rp = new RequestPlaneExchange(this, a, worker)
      this.exchange = rp
      return rp.start()
    }
    const ex = new UpstreamExchange(this, a, worker)
    this.exchange = ex
    try {
      this.proxy.dispatch(worker, this.call, a, ex)
    } catch (err) {
      if (ex.settle()) this.attemptFailed(a, new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} (${worker.url}) did not answer: ${errorText(err)}`))
    }
  }

  /**
   * A stream's first token arrived from `worker`: prefill is done, the worker answered, TTFT is
   * counted, nothing is retried from here on (the prompt is let go), and the client's SSE headers
   * go out. Returns the writer of the client's stream; `now` is when the token came.
   */
  streamStarted(a: Attempt, worker: WorkerInfo, now: number): ChunkWriter {
    const call = this.call
    call.payload = NO_BYTES
    call.route.tokens = NO_TOKENS
    call.body = null
    a.booking.prefillComplete(true)
    this.proxy.workerAnswered(worker)
    this.ttftMs = now - this.started
    const m = this.proxy.metrics
    m.observeTtft(this.ttftMs / 1000)
    const ttftObjective = call.route.ttftObjectiveMs
    if (ttftObjective !== undefined) m.objectiveResult('ttft', this.ttftMs <= ttftObjective)
    this.reply.hijack()
    const raw = this.reply.raw
    raw.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'x-worker-id': a.decision.workerId.toString(),
    })
    return new ChunkWriter(raw)
  }

  /**
   * A stream its worker ended: the booking is freed with the tokens it streamed, and the output
   * length and TPOT (end − first token) / (tokens − 1) are counted.
   */
  streamEnded(a: Attempt, tokens: number, firstAt: number): void {
    this.proxy.release(a.booking, tokens)
    const m = this.proxy.metrics
    m.observeOutput(tokens)
    const tpotObjective = this.call.route.tpotObjectiveMs
    if (tpotObjective !== undefined && tokens > 1) m.objectiveResult('tpot', (performance.now() - firstAt) / (tokens - 1) <= tpotObjective)
  }

  /**
   * A stream failed after its first token: the booking is freed, and unless the client left
   * (null: cut with 499) the failure is counted and logged, and the error event that ends the
   * client's stream returned (status 502 for cut()).
   */
  streamFailed(a: Attempt, err: Error): string | null {
    this.proxy.release(a.booking)
    if (this.gone.aborted) return null
    const d = a.decision
    this.proxy.metrics.upstreamErrors.inc({ phase: 'after_first_token' })
    const e = new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} failed mid-stream: ${err.message}`)
    this.errorCode = e.code
    limited.warn(
      'upstream_failed',
      {
        code: e.code,
        phase: 'after_first_token',
        worker_id: d.workerId.toString(),
        dp_rank: d.dpRank,
        request_id: a.booking.id,
        retried: false,
        error: e.message,
      },
      'a worker failed mid-stream',
    )
    return `data: ${JSON.stringify({ error: { ...e.toJSON(), type: 'upstream_error' } })}\n\n`
  }

  /**
   * A whole (non-streamed) answer arrived from `worker`: its arrival is its TTFT, the booking is
   * freed, and the body gets nvext.worker_id (`body` null: not JSON, a KVR_ERR_UPSTREAM).
   */
  wholeArrived(a: Attempt, worker: WorkerInfo, ok: boolean): void {
    const m = this.proxy.metrics
    a.booking.prefillComplete(false)
    const ttftMs = performance.now() - this.started
    m.observeTtft(ttftMs / 1000)
    // a whole answer's TTFT is its arrival; it has no TPOT
    const ttftObjective = this.call.route.ttftObjectiveMs
    if (ttftObjective !== undefined && ok) m.objectiveResult('ttft', ttftMs <= ttftObjective)
    this.proxy.release(a.booking)
    this.proxy.workerAnswered(worker)
  }

  /** The response was delivered, or the stream ended as its worker ended it. */
  delivered(): void {
    this.exchange = null
    this.end(200)
  }

  /**
   * A stream cut after its first token, by its worker (502: the client got an error event) or by
   * the client (499). Counted as such: a 200 would hide the failure from an error rate.
   */
  cut(status: number): void {
    this.exchange = null
    this.end(status)
  }

  /** The worker answered 5xx, or ended its stream without a byte: retryable. */
  notDelivered(a: Attempt, detail?: string): void {
    const why = detail === undefined ? '' : `: ${detail}`
    this.retryAfter(a, new KvrError('KVR_ERR_UPSTREAM', `worker ${a.decision.workerId} failed before its first token${why}`))
  }

  /**
   * The attempt failed before anything reached the client; `retryable` (a worker's failure, by
   * default KVR_ERR_UPSTREAM's) sends it to another worker.
   */
  attemptFailed(a: Attempt, err: unknown, retryable = isKvrError(err, 'KVR_ERR_UPSTREAM')): void {
    this.exchange = null
    this.proxy.release(a.booking)
    if (this.gone.aborted) return this.fail(new KvrError('KVR_ERR_REQUEST_CANCELLED', 'the client went away'))
    if (!retryable || !isKvrError(err)) return this.fail(err)
    this.retryAfter(a, err)
  }

  /** After a failure before the first token: the next attempt, or the failure when none is left. */
  private retryAfter(a: Attempt, failure: KvrError): void {
    this.exchange = null
    const p = this.proxy
    p.release(a.booking)
    p.metrics.upstreamErrors.inc({ phase: 'before_first_token' })
    const d = a.decision
    p.workerFailed(d.workerId)
    const tried = (this.tried ??= [])
    tried.push(rankRef(d))
    const last = this.retry >= this.retries
    limited.warn(
      'upstream_failed',
      {
        code: failure.code,
        phase: 'before_first_token',
        worker_id: d.workerId.toString(),
        dp_rank: d.dpRank,
        request_id: a.booking.id,
        retried: !last,
        error: failure.message,
      },
      'a worker failed before its first token',
    )
    if (this.retry++ >= this.retries) {
      // the client learns it was retried, and where: the last worker's error alone reads as if
      // only that one had been tried
      if (tried.length > 1)
        return this.fail(
          this.lastFailure(failure, `${failure.message} (the last of ${tried.length} attempts, on workers ${tried.map((x) => x.workerId).join(', ')})`),
        )
      return this.fail(this.lastFailure(failure, failure.message))
    }
    p.rebook(this.call.route, this.gone, this.tried).then(
      (next) => {
        if (typeof next === 'string') return this.fail(this.lastFailure(failure, `${failure.message}; not retried: ${next}`))
        p.metrics.retried()
        this.attemptGuarded(next)
      },
      (err: unknown) => this.fail(err),
    )
  }

  /**
   * The error a client gets when no worker is left to try: an overloaded worker's is a 503 with
   * Retry-After (the fleet is busy, not broken); any other keeps its code.
   */
  private lastFailure(failure: KvrError, message: string): KvrError {
    if (failure.code === 'KVR_ERR_WORKER_OVERLOADED') return new RetryableError('KVR_ERR_WORKER_OVERLOADED', message, this.proxy.retryAfterSecs)
    return message === failure.message ? failure : new KvrError(failure.code, message)
  }

  /** Ends the run with an error: the client gets it as any route's error, unless something was sent already. */
  private fail(err: unknown): void {
    if (this.ended) return
    const code = (err as { code?: unknown } | null)?.code
    if (code === 'KVR_ERR_ALL_WORKERS_BUSY' || code === 'KVR_ERR_QUEUE_FULL') {
      this.proxy.metrics.rejected(this.call.model, this.call.path)
      limited.warn(
        'requests_rejected',
        { code, route: this.call.path, error: (err as Error).message },
        'a request was refused: every worker is busy or the queue is full',
      )
    }
    this.errorCode = isKvrError(err) ? err.code : 'internal'
    this.end(isKvrError(err) ? err.statusCode : 500)
    const reply = this.reply
    if (reply.sent || reply.raw.headersSent) return
    void reply.send(err instanceof Error ? err : new Error(String(err)))
  }

  private end(status: number): void {
    if (this.ended) return
    this.ended = true
    this.reply.raw.off('close', this.onClose)
    this.proxy.closed(this.reply, this.call, status)
    const l = this.proxy.requestLog
    if (l !== null) proxiedLine(l, this, status, this.reply.elapsedTime)
  }
}

const NO_TOKENS: ArrayLike<number> = Object.freeze([])
const NO_BYTES = new Uint8Array(0)

/** The message of whatever was thrown: a dispatcher may throw something that is not an Error. */
function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err)
}
/**
 * Longest event held back until it is whole: the first for its worker id, any other so that a
 * worker dying inside it leaves no half of it on the client's wire (one token's event is a few
 * hundred bytes).
 */
const EVENT_HOLD_LIMIT = 256 * 1024

/** Origin and path prefix of a worker URL, parsed once per URL. */
const targets = new Map<string, { origin: string; path: string }>()

/** The identity of a tried worker-rank, without holding on to the decision it came from. */
function rankRef(d: RouteDecision): WorkerRankRef {
  return { workerId: d.workerId, dpRank: d.dpRank }
}

function upstreamTarget(url: string): { origin: string; path: string } {
  let t = targets.get(url)
  if (t === undefined) {
    const u = new URL(url)
    t = { origin: u.origin, path: u.pathname.replace(/\/+$/, '') }
    if (targets.size > 4096) targets.clear()
    targets.set(url, t)
  }
  return t
}

const enum Mode {
  /** Headers not seen yet. */
  Waiting,
  /** A non-streamed answer, collected whole. */
  Whole,
  /** An SSE stream, forwarded chunk by chunk. */
  Stream,
}

/**
 * One request to one worker, driven by undici's dispatcher callbacks rather than its Readable
 * body: a streamed chunk goes from the parser straight to the client's socket, without a
 * Readable's buffering, ticks and listeners per chunk. A client that reads slower than the worker
 * writes pauses the upstream parser until the client's socket drains, so a slow reader cannot
 * make the router buffer a whole response.
 */
class UpstreamExchange implements Dispatcher.DispatchHandler {
  private mode = Mode.Waiting
  private status = 0
  private contentType = ''
  private abortUpstream: ((err?: Error) => void) | null = null
  private resumeUpstream: (() => void) | null = null
  /** A non-streamed answer's chunks. */
  private parts: Buffer[] | null = null
  /** The client's side of a stream, once its first event and headers are out. */
  private out: ChunkWriter | null = null
  /** No whole event has come yet: nothing was sent, and a failure is retried. */
  private first = true
  /**
   * The bytes after the last event end that came, until their event ends (kept as bytes: a chunk
   * may end inside a character). An event goes to the client whole or not at all: a worker that
   * dies inside one would otherwise leave half of it on the wire, the error event glued to it.
   */
  private held: Buffer | null = null
  /** The client's stream ends inside an event: one too long to hold went out as it came. */
  private open = false
  /** A chunk ending in the `data: [DONE]` event, held to go out with the end of the body. */
  private tail: Buffer | null = null
  private last = 0
  /** When the first token went out (performance.now()): a stream's TPOT is counted from it. */
  private firstAt = 0
  private chunks = 0
  private settled = false
  /** Made when a slow client first fills its socket, not for every stream. */
  private onDrain: (() => void) | null = null

  constructor(
    private readonly run: ProxyRun,
    private readonly a: Attempt,
    private readonly worker: WorkerInfo,
  ) {}

  /**
   * The client went away: the upstream request is aborted (undici then calls onError). Before
   * undici has a connection for it there is nothing to abort yet: the attempt ends here, so its
   * booking is freed now rather than when a slow connect finishes, and onConnect aborts the
   * request the moment it would be sent.
   */
  clientGone(): void {
    if (this.settled) return
    if (this.abortUpstream === null) {
      if (this.settle()) this.run.attemptFailed(this.a, new KvrError('KVR_ERR_REQUEST_CANCELLED', 'the client went away'))
      return
    }
    try {
      this.abortUpstream(new Error('the client went away'))
    } catch (err) {
      // a dispatcher that cannot abort will not call onError either: settle here, so the
      // booking is released all the same
      this.onError(err instanceof Error ? err : new Error(errorText(err)))
    }
  }

  /** Marks the exchange over; false when it already was (each outcome is reported once). */
  settle(): boolean {
    if (this.settled) return false
    this.settled = true
    if (this.onDrain !== null) this.out?.offDrained(this.onDrain)
    return true
  }

  onConnect(abort: (err?: Error) => void): void {
    this.abortUpstream = abort
    if (!this.run.gone.aborted) return
    // the client left before this: never send the request (the attempt may have ended already)
    if (!this.settled) return this.clientGone()
    try {
      abort(new Error('the client went away'))
    } catch {
      // the attempt is over and its booking freed; a dispatcher that cannot abort sends a
      // request nobody waits for, which its worker answers into the void
    }
  }

  onHeaders(statusCode: number, headers: Buffer[] | string[] | null, resume: () => void): boolean {
    if (statusCode < 200) return true
    this.status = statusCode
    if (headers !== null) {
      for (let i = 0; i + 1 < headers.length; i += 2) {
        const name = headers[i] as Buffer | string
        if (name.length === 12 && name.toString().toLowerCase() === 'content-type') this.contentType = (headers[i + 1] as Buffer | string).toString()
      }
    }
    if (statusCode >= 500) return this.failedAtHeaders()
    if (this.run.call.stream && statusCode === 200 && this.contentType.includes('text/event-stream')) {
      this.mode = Mode.Stream
      this.resumeUpstream = resume
    } else this.mode = Mode.Whole
    return true
  }

  /**
   * A 5xx is retryable from its status line on: the retry goes out now, not when the body ends,
   * which for a worker that never finishes it would be undici's bodyTimeout (300 s) later. The
   * body is not read (the client's error names the worker, not what it said), so the request is
   * aborted: its connection cannot serve another request before that body is read whole anyway.
   */
  private failedAtHeaders(): true {
    if (!this.settle()) return true
    try {
      this.abortUpstream?.(new Error(`worker answered ${this.status}`))
    } catch {
      // a dispatcher that cannot abort: the retry goes on all the same, and the body, read on
      // (not paused), is dropped as it comes
    }
    this.run.notDelivered(this.a, `it answered ${this.status}`)
    return true
  }

  onData(chunk: Buffer): boolean {
    if (this.mode === Mode.Whole) (this.parts ??= []).push(chunk)
    else if (this.mode === Mode.Stream) {
      try {
        if (!this.forward(chunk)) {
          // the client's socket is full: hold the worker until it drains
          ;(this.out as ChunkWriter).onceDrained((this.onDrain ??= () => this.resumeUpstream?.()))
          return false
        }
      } catch (err) {
        this.abortUpstream?.(err as Error)
      }
    }
    return true
  }

  /** Writes one upstream chunk to the client; false when the client's socket is full. */
  private forward(chunk: Buffer): boolean {
    const out = this.out
    if (out === null) return this.firstEvent(chunk)
    let b = chunk
    // The common read ends exactly where an event does and goes out as it came: a look at its
    // last bytes, no string, no copy. Only a read that ends inside an event is cut.
    if (this.held !== null || !endsEvent(chunk)) {
      const whole = this.wholeEvents(chunk)
      if (whole === null) return true
      b = whole
    } else this.open = false
    const now = performance.now()
    this.run.proxy.metrics.observeItl((now - this.last) / 1000)
    this.last = now
    this.chunks++
    return this.send(out, b)
  }

  /**
   * The bytes held, then `chunk`, up to the last event end in them; what follows is held until its
   * event ends. null when no event ends yet.
   */
  private wholeEvents(chunk: Buffer): Buffer | null {
    // past an event too long to hold, the stream goes out as it comes until an event ends a read
    if (this.open) return chunk
    const held = this.held
    const bytes = held === null ? chunk : Buffer.concat([held, chunk])
    const cut = lastEventEnd(bytes)
    if (cut === bytes.length) {
      this.held = null
      return bytes
    }
    if (bytes.length - cut >= EVENT_HOLD_LIMIT) {
      // no end of event in sight (not SSE after all, or an event of this size): holding on would
      // buffer the stream whole, so it goes out as it is, and an error after it ends it first
      this.held = null
      this.open = true
      return bytes
    }
    this.held = cut === 0 ? bytes : bytes.subarray(cut)
    return cut === 0 ? null : bytes.subarray(0, cut)
  }

  /** Writes whole events; false when the client's socket is full. */
  private send(out: ChunkWriter, b: Buffer): boolean {
    if (this.tail !== null) {
      // data after [DONE]: whatever the worker sends goes on, in order
      out.write(this.tail)
      this.tail = null
    }
    if (endsWithDone(b)) {
      // the end of the body usually follows in the same read: both then go out in one write
      // (onComplete); if it does not, the event goes out on its own once this read is parsed
      this.tail = b
      process.nextTick(flushTail, this)
      return true
    }
    return out.write(b)
  }

  /** Sends a held [DONE] chunk on its own (the end of the body did not come with it). */
  flushTail(): void {
    const t = this.tail
    if (t === null || this.settled) return
    this.tail = null
    ;(this.out as ChunkWriter).write(t)
  }

  /** The first event carries nvext.worker_id: it is held until complete, then rewritten. */
  private firstEvent(chunk: Buffer): boolean {
    const bytes = this.held === null ? chunk : Buffer.concat([this.held, chunk])
    let cut = eventEnd(bytes)
    let event: Buffer
    if (cut >= 0) {
      // the event ends in ASCII line ends, so it holds whole characters only
      event = Buffer.from(injectWorkerId(bytes.toString('utf8', 0, cut), this.a.decision))
    } else if (bytes.length < EVENT_HOLD_LIMIT) {
      this.held = bytes
      return true
    } else {
      // no end of event in sight (not SSE after all, or an event of this size): waiting longer
      // would hold the stream back and buffer it whole, so it goes out as it is
      cut = bytes.length
      event = bytes
      this.open = true
    }
    this.held = null
    const ok = this.startStream(event)
    if (cut === bytes.length) return ok
    const rest = this.wholeEvents(bytes.subarray(cut))
    return rest === null ? ok : this.send(this.out as ChunkWriter, rest) && ok
  }

  /**
   * Sends the first event, with the client's headers: the first token, which marks prefill done
   * and past which nothing is retried. Not before: a worker that fails before its first event is
   * whole (inside it included) has delivered no token, and its request goes to another worker.
   */
  private startStream(event: Buffer): boolean {
    const now = performance.now()
    this.first = false
    this.firstAt = now
    this.last = now
    this.chunks++
    const out = this.run.streamStarted(this.a, this.worker, now)
    this.out = out
    return out.begin(event)
  }

  onComplete(): void {
    if (!this.settle()) return
    const run = this.run
    if (this.mode === Mode.Stream) {
      const held = this.held
      this.held = null
      // ended without a single byte: a failure before the first token
      if (this.first && held === null) return run.notDelivered(this.a)
      // each event a token: engines stream one per event (a final usage event adds one, within the estimate's noise)
      run.streamEnded(this.a, this.chunks, this.firstAt)
      // A body that ends, cleanly, inside an event goes out as the worker sent it, as a client
      // reading the worker would get it (an SSE client drops an unfinished last event). Only
      // when the worker fails does the router add an event of its own.
      if (this.first) this.startStream(held as Buffer)
      else if (held !== null) {
        if (this.tail !== null) (this.out as ChunkWriter).write(this.tail)
        this.tail = held
      }
      ;(this.out as ChunkWriter).end(this.tail)
      this.tail = null
      return run.delivered()
    }
    this.whole()
      .then(
        () => run.delivered(),
        (err: unknown) => run.attemptFailed(this.a, err),
      )
      .catch((err: unknown) => run.reply.log.error({ err }, 'finishing a proxied request failed'))
  }

  /** A non-streamed answer: nvext.worker_id added, booking released on arrival. */
  private async whole(): Promise<void> {
    const run = this.run
    const d = this.a.decision
    const m = run.proxy.metrics
    const text = this.parts === null ? '' : Buffer.concat(this.parts).toString('utf8')
    run.wholeArrived(this.a, this.worker, this.status === 200)
    let out = text
    if (this.status === 200) {
      try {
        const obj = JSON.parse(text) as Record<string, unknown>
        obj.nvext = { ...(typeof obj.nvext === 'object' && obj.nvext !== null ? obj.nvext : {}), worker_id: workerIdObject(this.a.decision) }
        const usage = obj.usage as { completion_tokens?: unknown } | undefined
        if (typeof usage?.completion_tokens === 'number') m.observeOutput(usage.completion_tokens)
        out = serializeJson(obj)
      } catch {
        throw new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} answered a body that is not JSON`)
      }
    }
    await run.reply.code(this.status).header('content-type', 'application/json').header('x-worker-id', d.workerId.toString()).send(out)
  }

  onError(err: Error): void {
    if (!this.settle()) return
    const run = this.run
    const d = this.a.decision
    if (this.mode !== Mode.Stream || this.first) {
      // nothing was sent: a first event not yet whole is dropped with the attempt
      if (run.gone.aborted) return run.attemptFailed(this.a, err)
      const what = this.mode === Mode.Waiting ? `(${this.worker.url}) did not answer` : 'failed before its first token'
      return run.attemptFailed(this.a, new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} ${what}: ${err.message}`))
    }
    const raw = run.reply.raw
    const event = run.streamFailed(this.a, err)
    if (event === null) {
      raw.destroy()
      return run.cut(499)
    }
    // the error is an event of its own: the unfinished event is dropped, and one too long to
    // hold, already out in part, is ended first (a client then fails to read that one, not the error)
    this.held = null
    if (this.tail !== null) (this.out as ChunkWriter).write(this.tail)
    this.tail = null
    raw.end(this.open ? `\n\n${event}` : event)
    run.cut(502)
  }
}

function flushTail(ex: UpstreamExchange): void {
  ex.flushTail()
}
