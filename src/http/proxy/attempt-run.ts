// What one attempt of a proxied request sees of its run (proxy.ts's ProxyRun): the booking
// lifecycle an exchange with a worker reports to. A module of its own so that an exchange kept
// in another module (request-plane.ts) and the run need not import each other.
import type { FastifyReply } from 'fastify'
import type { Router, WorkerInfo } from '../../core/router.js'
import type { RequestKind } from '../../frontend/preprocessed-request.js'
import type { RequestPlaneClient } from '../../request-plane/client.js'
import type { RouteDecision } from '../../scheduler/scheduler.js'
import type { TokenDecoder } from '../../tokenizer/token-decoder.js'
import type { ChunkWriter } from './chunked.js'

/** A booking's side an exchange uses. */
export interface AttemptBooking {
  readonly id: string
  prefillComplete(observed: boolean): void
}

export interface Attempt {
  decision: RouteDecision
  booking: AttemptBooking
}

/** The request an attempt carries: ProxyCall's fields an exchange reads. */
export interface AttemptCall {
  stream: boolean
  kind: RequestKind
  body: Record<string, unknown> | null
  route: { tokens: ArrayLike<number> | null }
}

export interface AttemptRun {
  readonly call: AttemptCall
  readonly reply: FastifyReply
  readonly gone: { readonly aborted: boolean }
  readonly proxy: {
    readonly requestPlane: RequestPlaneClient | null
    readonly decoder: TokenDecoder | null
    readonly metrics: Router['metrics']
  }
  /** Failed before anything reached the client: retried elsewhere when `retryable`, else answered. */
  attemptFailed(a: Attempt, err: unknown, retryable?: boolean): void
  /** The first token came: the client's SSE stream begins (its writer returned). */
  streamStarted(a: Attempt, worker: WorkerInfo, now: number): ChunkWriter
  /** The worker ended the stream after `tokens` tokens. */
  streamEnded(a: Attempt, tokens: number, firstAt: number): void
  /** The stream failed after its first token: the error event to end it with, or null when the client left. */
  streamFailed(a: Attempt, err: Error): string | null
  /** A whole answer arrived. */
  wholeArrived(a: Attempt, worker: WorkerInfo, ok: boolean): void
  delivered(): void
  cut(status: number): void
}
