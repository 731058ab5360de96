// The one catalogue of kv-router's codes. Every error that crosses a module boundary is a
// KvrError carrying one of the error codes, and every warning line in the log carries one of the
// warning codes, so HTTP answers, logs, metrics and tests all speak the same names. A code is
// never reused (fastify's rule): one taken out goes to RetiredCodes and no new code takes its
// name. Shard threads use it too, which is why it imports nothing.

export const ErrorCodes = {
  // configuration and flags
  KVR_ERR_INVALID_OPTION: { status: 400, summary: 'an option has an invalid value' },
  KVR_ERR_INVALID_ENDPOINT: { status: 400, summary: "an engine's KV-event endpoint is not tcp://HOST:PORT, or its ports do not fit its dp ranks" },
  KVR_ERR_PRIORITY_DENIED: { status: 500, summary: 'the system refused the scheduling priority asked for (--nice)' },
  // hashing and prompts
  KVR_ERR_TOKEN_OUT_OF_RANGE: { status: 400, summary: 'a token id is not an integer in [0, 2^32)' },
  KVR_ERR_INVALID_BLOCK_SIZE: { status: 400, summary: 'block size must be an integer in [1, 65536]' },
  // event protocol
  KVR_ERR_EVENT_MALFORMED_JSON: { status: 400, summary: 'the event is not well-formed JSON' },
  KVR_ERR_EVENT_MALFORMED_MSGPACK: { status: 400, summary: 'the event or engine event batch is not well-formed MessagePack' },
  KVR_ERR_EVENT_INVALID_NUMBER: { status: 400, summary: 'a numeric field is not an unsigned integer in range' },
  KVR_ERR_EVENT_WRONG_TYPE: { status: 400, summary: 'a field has the wrong type' },
  KVR_ERR_EVENT_MISSING_FIELD: { status: 400, summary: 'a required field is missing' },
  KVR_ERR_EVENT_UNKNOWN_VARIANT: { status: 400, summary: 'the event data names an unknown variant' },
  KVR_ERR_EVENT_BACKLOG: { status: 503, summary: 'the events waiting for the indexer shards fill the backlog; retry later' },
  // index
  KVR_ERR_TOO_MANY_WORKERS: { status: 503, summary: 'more worker-ranks than one index can hold' },
  KVR_ERR_SHARD_RESTARTED: { status: 503, summary: 'an indexer shard restarted while the operation ran' },
  KVR_ERR_SNAPSHOT_INVALID: { status: 500, summary: 'an index snapshot is truncated, corrupt, or in a format or version this router does not read' },
  // workers and scheduling
  KVR_ERR_UNKNOWN_WORKER: { status: 404, summary: 'no such worker is registered' },
  KVR_ERR_UNKNOWN_GROUP: { status: 404, summary: "the indexer has no registration for the request's model_name and routing_group" },
  KVR_ERR_INDEXER_CONFLICT: {
    status: 409,
    summary: 'the indexer registration conflicts with one it holds (the same instance and dp rank, or another block size for the group)',
  },
  KVR_ERR_WORKER_DECISIONS_ONLY: { status: 409, summary: 'the worker is registered for routing decisions only; the router sends it no request' },
  KVR_ERR_NO_WORKERS: { status: 503, summary: 'no worker is available for the request' },
  KVR_ERR_ALL_WORKERS_BUSY: { status: 503, summary: 'all workers are busy, please retry later' },
  KVR_ERR_QUEUE_FULL: { status: 503, summary: 'the router queue holds its maximum of pending requests' },
  KVR_ERR_OBJECTIVE_UNMET: {
    status: 503,
    summary: "no worker is predicted to meet the request's latency objectives and its priority is below 0 (sheddable); retry later",
  },
  KVR_ERR_DUPLICATE_REQUEST: { status: 409, summary: 'a request with this id is already booked' },
  KVR_ERR_UNKNOWN_REQUEST: { status: 404, summary: 'no booked request has this id' },
  KVR_ERR_REQUEST_CANCELLED: { status: 499, summary: 'the request was cancelled while it waited' },
  // HTTP edge
  KVR_ERR_INVALID_REQUEST: { status: 400, summary: 'the request body or parameters are invalid' },
  KVR_ERR_EMPTY_PROMPT: { status: 400, summary: 'the prompt is empty' },
  KVR_ERR_NO_TOKENIZER: { status: 400, summary: 'a text prompt needs a tokenizer (--tokenizer)' },
  KVR_ERR_UNAUTHORIZED: { status: 401, summary: 'missing or wrong API key' },
  KVR_ERR_NOT_FOUND: { status: 404, summary: 'no such route' },
  KVR_ERR_BODY_TOO_LARGE: { status: 413, summary: 'the request body is larger than the configured limit' },
  KVR_ERR_URI_TOO_LONG: { status: 414, summary: 'a path parameter is longer than the router accepts' },
  KVR_ERR_HEADERS_TOO_LARGE: { status: 431, summary: 'the request headers are larger than the server accepts' },
  KVR_ERR_REQUEST_TIMEOUT: { status: 408, summary: 'the request did not arrive in time' },
  KVR_ERR_MALFORMED_HTTP: { status: 400, summary: 'the request is not well-formed HTTP/1.1' },
  KVR_ERR_UNSUPPORTED_MEDIA_TYPE: { status: 415, summary: 'the request body must be application/json' },
  KVR_ERR_UPSTREAM: { status: 502, summary: 'the worker failed to answer' },
  KVR_ERR_SHUTTING_DOWN: { status: 503, summary: 'the router is shutting down' },
  // Dynamo's TCP request plane
  KVR_ERR_INSTANCE_ADDRESS: { status: 400, summary: "a worker's request-plane address is not host:port/endpoint-path" },
  KVR_ERR_FRAME_TOO_LARGE: { status: 502, summary: 'a request-plane frame is larger than the size limit' },
  KVR_ERR_FRAME_MALFORMED: { status: 502, summary: 'a request-plane frame or response stream message is not well-formed' },
  KVR_ERR_WORKER_OVERLOADED: { status: 503, summary: 'the worker refused the request as overloaded or unavailable; retry later' },
  KVR_ERR_WORKER_REJECTED: { status: 502, summary: 'the worker refused the request (an unknown endpoint, a bad frame)' },
  KVR_ERR_ACK_TIMEOUT: { status: 503, summary: 'the worker did not acknowledge the request in time' },
  KVR_ERR_RESPONSE_STREAM: { status: 502, summary: "the worker's response stream failed: an error prologue, a lost connection or no final message" },
} as const

export type ErrorCode = keyof typeof ErrorCodes

/** Codes of the warnings the router writes to its log (a line's `code`); none is an HTTP answer. */
export const WarningCodes = {
  KVR_BLOCK_SIZE_MISMATCH: "a worker announces, or its engine publishes KV events of, a block size other than the router's",
  KVR_WORKER_NO_EVENTS: 'a registered worker sends no KV events, or events arrive for ids that are not registered',
  KVR_WORKER_UNREACHABLE: 'a worker stopped answering its health probes and is out of routing',
  KVR_WORKER_NOT_REGISTERED: 'a worker discovered in etcd could not be registered',
  KVR_KV_EVENTS_INVALID: 'a worker from etcd names KV event endpoints the router cannot use; it is registered without them',
  KVR_INDEX_DEGRADED: "a worker-rank's cached blocks could not be recovered; its index may miss blocks",
  KVR_DURABLE: 'durable mode (JetStream) met a problem it works around: a snapshot, a consumer or the stream',
  KVR_MOCKER: 'a simulated engine (kv-router mocker) could not publish its KV events or lost its etcd lease',
} as const

export type WarningCode = keyof typeof WarningCodes

/** Each warning code as a constant, for a log line's `code`. */
export const Warn = Object.fromEntries(Object.keys(WarningCodes).map((c) => [c, c])) as { readonly [C in WarningCode]: C }

/**
 * Codes taken out of the catalogue, with why. They are never reused: a new error or warning code
 * takes another name (test/docs/errors.test.ts holds it).
 */
export const RetiredCodes = {
  KVR_ERR_EVENT_TOO_LARGE: 'never raised: an oversized body is KVR_ERR_BODY_TOO_LARGE, whatever it holds',
  KVR_ERR_INDEX_CAPACITY: 'never raised: a store beyond --router-max-index-blocks is rejected in its shard and counted, not answered',
} as const

export class KvrError extends Error {
  readonly code: ErrorCode
  readonly statusCode: number

  constructor(code: ErrorCode, message?: string, options?: { cause?: unknown }) {
    super(message ?? ErrorCodes[code].summary, options)
    this.name = 'KvrError'
    this.code = code
    this.statusCode = ErrorCodes[code].status
  }

  toJSON(): { code: ErrorCode; message: string } {
    return { code: this.code, message: this.message }
  }
}

export function isKvrError(err: unknown, code?: ErrorCode): err is KvrError {
  return err instanceof KvrError && (code === undefined || err.code === code)
}
