// The request plane's counts, one object shared by the client, its connections and the call-home
// listener; src/request-plane/metrics.ts exposes them.

export interface RequestPlaneCounters {
  /** Requests written to a worker. */
  requests: number
  /** Requests the worker acknowledged (accepted). */
  accepted: number
  /** Refusals `Server overloaded: …` / `Server unavailable: …`. */
  overloaded: number
  /** Other refusals (`Unknown endpoint: …`). */
  rejected: number
  ackTimeouts: number
  /** Connections to a worker that could not be opened, or were lost with requests in flight. */
  connectionErrors: number
  /** Frames or messages from a worker that did not decode, or passed the size limit. */
  malformed: number
  /** Response streams the workers dialled back. */
  streams: number
  /** Streams that ended in an error (prologue error, lost connection, no final message). */
  streamErrors: number
  /** Streams whose caller went away: `stop` sent, and `kill` when that did not end them. */
  stops: number
  kills: number
}

export function newCounters(): RequestPlaneCounters {
  return {
    requests: 0,
    accepted: 0,
    overloaded: 0,
    rejected: 0,
    ackTimeouts: 0,
    connectionErrors: 0,
    malformed: 0,
    streams: 0,
    streamErrors: 0,
    stops: 0,
    kills: 0,
  }
}
