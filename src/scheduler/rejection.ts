// 503 answers that tell the client when to come back. The codes stay in the one catalogue
// (src/errors.ts); this subclass only carries the Retry-After value for the HTTP layer.
import { KvrError } from '../errors.js'

/** The exact message Dynamo answers when every worker is busy. */
export const ALL_WORKERS_BUSY_MESSAGE = 'Service temporarily unavailable: All workers are busy, please retry later'

export class RetryableError extends KvrError {
  /** Seconds for the Retry-After header. */
  readonly retryAfterSecs: number

  constructor(
    code: 'KVR_ERR_ALL_WORKERS_BUSY' | 'KVR_ERR_QUEUE_FULL' | 'KVR_ERR_OBJECTIVE_UNMET' | 'KVR_ERR_WORKER_OVERLOADED',
    message: string,
    retryAfterSecs: number,
  ) {
    super(code, message)
    this.retryAfterSecs = retryAfterSecs
  }
}

export function allWorkersBusy(retryAfterSecs: number): RetryableError {
  return new RetryableError('KVR_ERR_ALL_WORKERS_BUSY', ALL_WORKERS_BUSY_MESSAGE, retryAfterSecs)
}

export function queueFull(maxPending: number, retryAfterSecs: number): RetryableError {
  return new RetryableError(
    'KVR_ERR_QUEUE_FULL',
    `the router queue holds its maximum of ${maxPending} pending requests (--router-queue-max-pending); retry later`,
    retryAfterSecs,
  )
}

/** A sheddable request (priority < 0) that no candidate is predicted to serve within its latency objectives. */
export function objectiveUnmet(ttftMs: number, tpotMs: number, retryAfterSecs: number): RetryableError {
  const what = [ttftMs > 0 ? `TTFT ${ttftMs} ms` : '', tpotMs > 0 ? `TPOT ${tpotMs} ms` : ''].filter((x) => x !== '').join(' and ')
  return new RetryableError(
    'KVR_ERR_OBJECTIVE_UNMET',
    `no worker is predicted to meet the request's objectives (${what}), and its priority is below 0 (sheddable); retry later`,
    retryAfterSecs,
  )
}
