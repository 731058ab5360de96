// The streaming proxy (DESIGN §1 steps 6–7) and the booking lifecycle of one request:
//
//   route+book ──► upstream request ──► first chunk ──► ... ──► end ───────────► free
//        ▲              │ connect error / 5xx / dies       │ upstream dies      ▲
//        │              ▼ before the first chunk           ▼ after it           │
//        └── next best candidate (free the old booking)   error event, end ─────┤
//   client disconnects at any point: abort the upstream request ────────────────┘
//
// A booking is freed exactly once whatever happens (Booking.release). Nothing is written to the
// client before the first upstream chunk, so a failure up to then can still be retried on the
// next best worker of the decision's candidates table.
import type { FastifyReply, FastifyRequest } from 'fastify'
import { Agent, request as undiciRequest } from 'undici'
import type { Dispatcher } from 'undici'
import type { RouteInput, Router } from './router.js'
import type { RouteDecision } from './scheduler/scheduler.js'
import type { Candidate } from './scheduler/selector.js'
import { KvrError, isKvrError } from './shared/errors.js'
import { serializeJson } from './http/json.js'

export interface ProxyCall {
  /** Upstream path: /v1/completions or /v1/chat/completions. */
  path: string
  /** The client's body, forwarded as is. */
  body: Record<string, unknown>
  stream: boolean
  route: RouteInput
  model: string
}

class Booking {
  private freed = false
  constructor(
    private readonly router: Router,
    readonly id: string,
  ) {}

  prefillComplete(): void {
    if (!this.freed) this.router.scheduler.markPrefillComplete(this.id)
  }

  /** Frees the booking; only the first call has an effect. */
  release(): boolean {
    if (this.freed) return false
    this.freed = true
    this.router.scheduler.free(this.id)
    return true
  }
}

interface Attempt {
  decision: RouteDecision
  booking: Booking
}

export interface ProxyOptions {
  retries: number
  /** undici dispatcher; a keep-alive Agent by default. */
  dispatcher?: Dispatcher
}

export class Proxy {
  private readonly dispatcher: Dispatcher
  private readonly ownDispatcher: boolean
  private active = 0
  private idleWaiters: (() => void)[] = []
  /** Bookings released, all requests (tests check exactly-once through it). */
  releasedTotal = 0

  constructor(
    private readonly router: Router,
    private readonly options: ProxyOptions,
  ) {
    this.ownDispatcher = options.dispatcher === undefined
    this.dispatcher = options.dispatcher ?? new Agent({ connections: 1024, keepAliveTimeout: 30_000, headersTimeout: 300_000, bodyTimeout: 300_000 })
  }

  get inFlight(): number {
    return this.active
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

  async close(): Promise<void> {
    if (this.ownDispatcher) await this.dispatcher.close()
  }

  async handle(req: FastifyRequest, reply: FastifyReply, call: ProxyCall): Promise<void> {
    const ac = new AbortController()
    const onClose = (): void => {
      if (!reply.raw.writableFinished) ac.abort()
    }
    reply.raw.on('close', onClose)
    this.active++
    this.router.metrics.inflight.inc({ model: call.model })
    let status = 200
    try {
      await this.run(req, reply, call, ac.signal)
    } catch (err) {
      status = isKvrError(err) ? err.statusCode : 500
      throw err
    } finally {
      reply.raw.off('close', onClose)
      this.router.metrics.inflight.dec({ model: call.model })
      this.router.metrics.request(call.model, call.path, call.stream ? 'stream' : 'unary', reply.sent && status === 200 ? reply.statusCode : status)
      this.active--
      if (this.active === 0) for (const w of this.idleWaiters.splice(0)) w()
    }
  }

  private async book(route: RouteInput, signal: AbortSignal, explain: boolean): Promise<Attempt> {
    const id = this.router.newRequestId()
    const { decision } = await this.router.route({ ...route, id, updateStates: true, explain, signal })
    return { decision, booking: new Booking(this.router, id) }
  }

  private release(b: Booking): void {
    if (b.release()) this.releasedTotal++
  }

  private async run(req: FastifyRequest, reply: FastifyReply, call: ProxyCall, signal: AbortSignal): Promise<void> {
    const explain = this.options.retries > 0 && call.route.workerId === undefined
    let attempt = await this.book(call.route, signal, explain)
    const candidates: Candidate[] = attempt.decision.candidates === undefined ? [] : [...attempt.decision.candidates].sort((a, b) => a.logit - b.logit)
    const tried = new Set<string>()
    const payload = JSON.stringify(call.body)
    const started = performance.now()
    for (let retry = 0; ; retry++) {
      const d = attempt.decision
      tried.add(`${d.workerId}:${d.dpRank}`)
      let failure: KvrError
      try {
        const done = await this.attempt(req, reply, call, attempt, payload, signal, started)
        if (done) return
        failure = new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} failed before its first token`)
      } catch (err) {
        this.release(attempt.booking)
        if (signal.aborted) throw new KvrError('KVR_ERR_REQUEST_CANCELLED', 'the client went away')
        if (!isKvrError(err, 'KVR_ERR_UPSTREAM')) throw err
        failure = err
      }
      this.release(attempt.booking)
      this.router.metrics.upstreamErrors.inc({ phase: 'before_first_token' })
      const w = this.router.worker(d.workerId)
      if (w !== undefined) w.failures++
      const next = retry < this.options.retries ? candidates.find((c) => !tried.has(`${c.workerId}:${c.dpRank}`) && this.router.worker(c.workerId) !== undefined) : undefined
      if (next === undefined) throw failure
      this.router.metrics.retried()
      attempt = await this.book({ ...call.route, workerId: next.workerId, dpRank: next.dpRank }, signal, false)
    }
  }

  /**
   * One upstream attempt. Returns true when the response was delivered (or the stream ended,
   * with an error event if the worker died after the first chunk); false or KVR_ERR_UPSTREAM
   * when it failed before the first chunk (retryable).
   */
  private async attempt(_req: FastifyRequest, reply: FastifyReply, call: ProxyCall, a: Attempt, payload: string, signal: AbortSignal, started: number): Promise<boolean> {
    const d = a.decision
    const worker = this.router.worker(d.workerId)
    if (worker === undefined) throw new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} has no HTTP endpoint`)
    let res: Dispatcher.ResponseData
    try {
      res = await undiciRequest(worker.url + call.path, {
        method: 'POST',
        body: payload,
        headers: { 'content-type': 'application/json', accept: call.stream ? 'text/event-stream' : 'application/json', 'x-request-id': a.booking.id },
        signal,
        dispatcher: this.dispatcher,
      })
    } catch (err) {
      throw new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} (${worker.url}) did not answer: ${(err as Error).message}`)
    }
    if (res.statusCode >= 500) {
      await res.body.dump().catch(() => undefined)
      return false
    }
    const workerIdJson = { prefill_worker_id: d.workerId, prefill_dp_rank: d.dpRank, decode_worker_id: d.workerId, decode_dp_rank: d.dpRank }
    if (!call.stream || res.statusCode !== 200 || !String(res.headers['content-type'] ?? '').includes('text/event-stream')) {
      let text: string
      try {
        text = await res.body.text()
      } catch (err) {
        if (signal.aborted) throw err
        throw new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} failed while answering: ${(err as Error).message}`)
      }
      a.booking.prefillComplete()
      this.router.metrics.observeTtft((performance.now() - started) / 1000)
      this.release(a.booking)
      worker.failures = 0
      let out = text
      if (res.statusCode === 200) {
        try {
          const obj = JSON.parse(text) as Record<string, unknown>
          obj.nvext = { ...(typeof obj.nvext === 'object' && obj.nvext !== null ? obj.nvext : {}), worker_id: workerIdJson }
          const usage = obj.usage as { completion_tokens?: unknown } | undefined
          if (typeof usage?.completion_tokens === 'number') this.router.metrics.observeOutput(usage.completion_tokens)
          out = serializeJson(obj)
        } catch {
          throw new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} answered a body that is not JSON`)
        }
      }
      await reply.code(res.statusCode).header('content-type', 'application/json').header('x-worker-id', d.workerId.toString()).send(out)
      return true
    }
    return this.stream(reply, a, res, signal, started, workerIdJson)
  }

  private async stream(reply: FastifyReply, a: Attempt, res: Dispatcher.ResponseData, signal: AbortSignal, started: number, workerIdJson: object): Promise<boolean> {
    const m = this.router.metrics
    const raw = reply.raw
    let first = true
    let pending = ''
    let last = 0
    let chunks = 0
    const d = a.decision
    // 'data' events rather than `for await`: the async iterator costs promises and ticks per
    // chunk, and the proxy's tail latency under many streams follows its garbage
    const onChunk = (chunk: Buffer): void => {
      const now = performance.now()
      if (first) {
        first = false
        a.booking.prefillComplete()
        m.observeTtft((now - started) / 1000)
        reply.hijack()
        raw.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-worker-id': d.workerId.toString() })
        pending = chunk.toString('utf8')
        // the first event carries nvext.worker_id; it is rewritten once complete
        const cut = pending.indexOf('\n\n')
        if (cut < 0) return
        raw.write(injectWorkerId(pending.slice(0, cut + 2), workerIdJson))
        pending = pending.slice(cut + 2)
        chunks++
        if (pending.length > 0) raw.write(pending)
        pending = ''
        last = now
        return
      }
      if (pending.length > 0) {
        // still waiting for the end of the first event
        pending += chunk.toString('utf8')
        const cut = pending.indexOf('\n\n')
        if (cut < 0) return
        raw.write(injectWorkerId(pending.slice(0, cut + 2), workerIdJson))
        raw.write(pending.slice(cut + 2))
        pending = ''
      } else {
        raw.write(chunk)
      }
      chunks++
      m.observeItl((now - last) / 1000)
      last = now
    }
    try {
      const body = res.body
      await new Promise<void>((resolve, reject) => {
        // a throw inside an event handler would be uncaught: it fails the body instead
        // chunks already buffered still arrive after destroy(): the flag stops them
        let failed = false
        body.on('data', (chunk: Buffer) => {
          if (failed) return
          try {
            onChunk(chunk)
          } catch (err) {
            failed = true
            body.destroy(err as Error)
          }
        })
        body.once('end', resolve)
        body.once('error', reject)
        // closed without 'end' or 'error' (an abort tears the body down): not a complete stream
        body.once('close', () => (body.readableEnded ? resolve() : reject(new Error('the upstream body closed before its end'))))
      })
      if (first) {
        // ended without a single chunk: a failure before the first token
        return false
      }
      if (pending.length > 0) raw.write(pending)
      m.observeOutput(chunks)
      this.release(a.booking)
      const w = this.router.worker(d.workerId)
      if (w !== undefined) w.failures = 0
      raw.end()
      return true
    } catch (err) {
      if (first && !signal.aborted) throw new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} failed before its first token: ${(err as Error).message}`)
      this.release(a.booking)
      if (signal.aborted) {
        raw.destroy()
        return true
      }
      m.upstreamErrors.inc({ phase: 'after_first_token' })
      const e = new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} failed mid-stream: ${(err as Error).message}`)
      raw.end(`${pending}data: ${JSON.stringify({ error: { ...e.toJSON(), type: 'upstream_error' } })}\n\n`)
      return true
    }
  }
}

function injectWorkerId(event: string, workerIdJson: object): string {
  const at = event.indexOf('data:')
  if (at < 0) return event
  const json = event.slice(at + 5).trim()
  if (!json.startsWith('{')) return event
  try {
    const obj = JSON.parse(json) as Record<string, unknown>
    obj.nvext = { ...(typeof obj.nvext === 'object' && obj.nvext !== null ? obj.nvext : {}), worker_id: workerIdJson }
    return `${event.slice(0, at)}data: ${serializeJson(obj)}\n\n`
  } catch {
    return event
  }
}
