// One attempt of a proxied request on a worker reached over Dynamo's TCP request plane: the
// OpenAI body becomes a PreprocessedRequest (the prompt's token ids the router computed, and the
// worker-rank it chose as routing hints), sent with the router's RequestPlaneClient; the worker's
// Annotated<LLMEngineOutput> items become the OpenAI answer the HTTP proxy would relay: SSE
// events, nvext.worker_id on the first, or one JSON body (src/frontend/openai-stream.ts).
//
// The run (proxy.ts) keeps the booking lifecycle. Before the first event reaches the client, a
// refusal (overload, an unknown endpoint), a lost connection, a missing acknowledgement or a
// worker's retryable error sends the request to another worker; the request's own fault (a bad
// field, a worker's InvalidArgument) is answered. After it, a failure ends the stream with an
// error event. A client that leaves aborts the stream, which sends the worker "stop". The answer
// ends early when its stop conditions say so, and the worker is told to stop then too.
import { KvrError, isKvrError } from '../../errors.js'
import type { WorkerInfo } from '../../core/worker-registry.js'
import { EngineOutputTranslator, streamOptions } from '../../frontend/openai-stream.js'
import { WorkerError } from '../../frontend/engine-output.js'
import { preprocessedRequest } from '../../frontend/preprocessed-request.js'
import { encodeRequest } from '../../request-plane/payload-codec.js'
import type { ResponseStream } from '../../request-plane/response-stream.js'
import type { ChunkWriter } from './chunked.js'
import type { Attempt, AttemptRun } from './attempt-run.js'

/** Request-plane failures another worker may not have: the attempt is retried elsewhere. */
const RETRYABLE = new Set(['KVR_ERR_WORKER_OVERLOADED', 'KVR_ERR_WORKER_REJECTED', 'KVR_ERR_ACK_TIMEOUT', 'KVR_ERR_RESPONSE_STREAM', 'KVR_ERR_UPSTREAM'])

export class RequestPlaneExchange {
  private readonly abort = new AbortController()
  private settled = false
  private translator: EngineOutputTranslator | null = null
  /** The client's stream, once its first event is out. */
  private out: ChunkWriter | null = null
  private firstAt = 0
  private last = 0
  /** Ends a wait for the client's socket to drain: the client left instead. */
  private unblock: (() => void) | null = null

  constructor(
    private readonly run: AttemptRun,
    private readonly a: Attempt,
    private readonly worker: WorkerInfo,
  ) {}

  /** Builds and sends the request; everything after is heard from its response stream. */
  start(): void {
    const run = this.run
    const call = run.call
    const client = run.proxy.requestPlane
    const d = this.a.decision
    let bytes: Buffer
    try {
      if (client === null) throw new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} is reached over the request plane, and the proxy has none`)
      if (call.body === null) throw new KvrError('KVR_ERR_UPSTREAM', 'the request body was let go before its attempt')
      const tokens = call.route.tokens
      if (tokens === null || tokens.length === 0)
        throw new KvrError(
          'KVR_ERR_NO_TOKENIZER',
          `worker ${d.workerId} is reached over Dynamo's request plane, which takes token ids: start the router with --tokenizer, or send token ids`,
        )
      const decoder = run.proxy.decoder
      const target = { workerId: d.workerId, dpRank: d.dpRank }
      const o: { model?: string; eosTokenIds?: readonly number[] } = {}
      if (this.worker.model != null) o.model = this.worker.model
      if (decoder !== null) o.eosTokenIds = decoder.eosTokenIds
      const req = preprocessedRequest(call.body, call.kind, tokens, target, o)
      const { stream, includeUsage } = streamOptions(call.body)
      this.translator = new EngineOutputTranslator(req, { kind: call.kind, stream, includeUsage, decoder, target })
      bytes = encodeRequest(req, (client as NonNullable<typeof client>).codec)
    } catch (err) {
      // the request's own fault, or the router's: not the worker's, so not retried
      this.settled = true
      return run.attemptFailed(this.a, err, false)
    }
    const address = this.worker.requestPlane as string
    ;(client as NonNullable<typeof client>)
      .request(address, bytes, { encoded: true, requestId: this.a.booking.id, signal: this.abort.signal })
      .then(
        (s) => this.read(s),
        (err: unknown) => this.failed(err),
      )
      .catch((err: unknown) => run.reply.log.error({ err }, 'a request-plane exchange failed'))
  }

  /** The client went away: the worker is told to stop, and the attempt ends here. */
  clientGone(): void {
    this.abort.abort()
    this.unblock?.()
    if (!this.settle()) return
    if (this.out === null) return this.run.attemptFailed(this.a, new KvrError('KVR_ERR_REQUEST_CANCELLED', 'the client went away'), false)
    this.run.streamFailed(this.a, new Error('the client went away'))
    this.run.reply.raw.destroy()
    this.run.cut(499)
  }

  private settle(): boolean {
    if (this.settled) return false
    this.settled = true
    return true
  }

  private async read(s: ResponseStream<unknown>): Promise<void> {
    const t = this.translator as EngineOutputTranslator
    try {
      for await (const item of s) {
        if (this.settled) break
        const text = t.push(item)
        if (text !== '' && !(await this.send(text))) break
        if (t.done) break
      }
    } catch (err) {
      return this.failed(err)
    } finally {
      // the answer ended before the worker's stream (stop conditions, or the client left): stop it
      if (!this.abort.signal.aborted) this.abort.abort()
    }
    if (!this.settle()) return
    this.finish(t.end())
  }

  /** Writes one piece of the SSE stream, its first with the headers; false once the client is gone. */
  private async send(text: string): Promise<boolean> {
    const run = this.run
    const now = performance.now()
    let out = this.out
    let ok: boolean
    if (out === null) {
      this.firstAt = now
      out = this.out = run.streamStarted(this.a, this.worker, now)
      ok = out.begin(Buffer.from(text))
    } else {
      run.proxy.metrics.observeItl((now - this.last) / 1000)
      ok = out.write(Buffer.from(text))
    }
    this.last = now
    // a slow client holds the worker's stream (its reads pause): nothing is buffered past it
    if (!ok)
      await new Promise<void>((resolve) => {
        this.unblock = resolve
        ;(out as ChunkWriter).onceDrained(resolve)
      })
    this.unblock = null
    return !this.settled
  }

  /** The worker's stream ended: the rest of the answer goes out. */
  private finish(rest: string): void {
    const run = this.run
    const t = this.translator as EngineOutputTranslator
    const tokens = t.usage.completionTokens
    if (!run.call.stream) {
      run.wholeArrived(this.a, this.worker, true)
      run.proxy.metrics.observeOutput(tokens)
      void run.reply
        .code(200)
        .header('content-type', 'application/json')
        .header('x-worker-id', this.a.decision.workerId.toString())
        .send(rest)
        .then(
          () => run.delivered(),
          (err: unknown) => run.reply.log.error({ err }, 'finishing a request-plane answer failed'),
        )
      return
    }
    if (this.out === null) {
      // every event of the answer is in its end (the worker's text came whole at the finish)
      this.firstAt = performance.now()
      this.out = run.streamStarted(this.a, this.worker, this.firstAt)
      this.out.begin(Buffer.from(rest))
      this.out.end(null)
    } else this.out.end(Buffer.from(rest))
    run.streamEnded(this.a, tokens, this.firstAt)
    run.delivered()
  }

  /** The request or its stream failed. */
  private failed(err: unknown): void {
    if (!this.settle()) return
    const run = this.run
    const d = this.a.decision
    if (this.out === null) {
      if (run.gone.aborted) return run.attemptFailed(this.a, err, false)
      if (err instanceof WorkerError) return run.attemptFailed(this.a, err, err.retryable)
      const retryable = isKvrError(err) && RETRYABLE.has(err.code)
      const e = isKvrError(err) ? err : new KvrError('KVR_ERR_UPSTREAM', `worker ${d.workerId} failed: ${(err as Error).message}`)
      return run.attemptFailed(this.a, retryable ? withWorker(e, d.workerId) : e, retryable)
    }
    const event = run.streamFailed(this.a, err instanceof Error ? err : new Error(String(err)))
    const raw = run.reply.raw
    if (event === null) {
      raw.destroy()
      return run.cut(499)
    }
    this.out.end(Buffer.from(event))
    run.cut(502)
  }
}

/** The error with the worker named, as the HTTP proxy's errors name theirs. */
function withWorker(e: KvrError, workerId: bigint): KvrError {
  return e.message.includes(String(workerId)) ? e : new KvrError(e.code, `worker ${workerId}: ${e.message}`)
}
