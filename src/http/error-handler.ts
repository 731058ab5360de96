// Every error leaves as `{"error":{"code":"KVR_ERR_…","message":"…"}}` with the catalogue's
// status. fastify's own errors (bad JSON, body too large, schema) are mapped onto the catalogue;
// the all-busy 503 also carries Dynamo's body fields and every retryable 503 a
// Retry-After header.
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { STATUS_CODES } from 'node:http'
import type { Socket } from 'node:net'
import { ErrorCodes, KvrError, isKvrError } from '../errors.js'
import type { ErrorCode } from '../errors.js'
import { RetryableError } from '../scheduler/rejection.js'

export function toKvrError(err: unknown): KvrError {
  if (isKvrError(err)) return err
  const e = err as FastifyError & { validation?: unknown; validationContext?: string }
  if (e !== null && typeof e === 'object') {
    if (e.validation !== undefined) {
      // Ajv's message for a field the schema does not have leaves out which field it was
      const first = (Array.isArray(e.validation) ? e.validation[0] : undefined) as { keyword?: string; params?: { additionalProperty?: unknown } } | undefined
      const extra = first?.keyword === 'additionalProperties' ? ` (${JSON.stringify(first.params?.additionalProperty)})` : ''
      return new KvrError('KVR_ERR_INVALID_REQUEST', `${e.message}${extra}`)
    }
    switch (e.code) {
      case 'FST_ERR_CTP_BODY_TOO_LARGE':
        return new KvrError('KVR_ERR_BODY_TOO_LARGE', e.message)
      case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
        return new KvrError('KVR_ERR_UNSUPPORTED_MEDIA_TYPE', e.message)
      case 'FST_ERR_CTP_EMPTY_JSON_BODY':
        return new KvrError('KVR_ERR_INVALID_REQUEST', 'the body is empty; a JSON object is required')
      case 'FST_ERR_CTP_INVALID_JSON_BODY':
        return new KvrError('KVR_ERR_INVALID_REQUEST', `malformed JSON: ${e.message}`)
      case 'FST_ERR_BAD_URL':
        return new KvrError('KVR_ERR_INVALID_REQUEST', `the path is not valid percent-encoded UTF-8: ${e.message}`)
      case 'FST_ERR_MAX_PARAM_LENGTH':
        return new KvrError('KVR_ERR_URI_TOO_LONG', e.message)
      default:
        break
    }
    if (e instanceof SyntaxError) return new KvrError('KVR_ERR_INVALID_REQUEST', `malformed JSON: ${e.message}`)
    if (typeof e.statusCode === 'number' && e.statusCode === 413) return new KvrError('KVR_ERR_BODY_TOO_LARGE', e.message)
    if (typeof e.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) return new KvrError('KVR_ERR_INVALID_REQUEST', e.message)
  }
  return new KvrError('KVR_ERR_UPSTREAM', 'internal error', { cause: err })
}

export function errorBody(e: KvrError): string {
  const body: Record<string, unknown> = { error: e.toJSON() }
  if (e.code === 'KVR_ERR_ALL_WORKERS_BUSY') {
    // Dynamo's fields, so clients written against it keep working
    ;(body.error as Record<string, unknown>).type = 'service_unavailable'
    body.message = e.message
    body.type = 'service_unavailable'
    body.code = 503
  }
  return JSON.stringify(body)
}

export function sendError(reply: FastifyReply, err: unknown): FastifyReply {
  const e = toKvrError(err)
  const internal = e.code === 'KVR_ERR_UPSTREAM' && e.message === 'internal error'
  if (internal) reply.log.error({ err: (e as { cause?: unknown }).cause }, 'internal error')
  if (err instanceof RetryableError) reply.header('retry-after', String(err.retryAfterSecs))
  return reply
    .code(internal ? 500 : e.statusCode)
    .header('content-type', 'application/json; charset=utf-8')
    .send(errorBody(e))
}

export function errorHandler(err: unknown, _req: FastifyRequest, reply: FastifyReply): void {
  if (reply.sent || reply.raw.headersSent) return
  void sendError(reply, err)
}

export function statusOf(code: ErrorCode): number {
  return ErrorCodes[code].status
}

/**
 * Errors Node's HTTP parser raises before any route runs (bad framing, a Content-Length that is
 * not a number or disagrees with Transfer-Encoding, oversized headers, a request that never
 * finishes). fastify's default answers them in its own JSON shape; clients of the router read one
 * shape only, so they get the catalogue's here too.
 */
export function clientErrorHandler(this: FastifyInstance, err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return
  const e =
    err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? new KvrError('KVR_ERR_REQUEST_TIMEOUT')
      : err.code === 'HPE_HEADER_OVERFLOW'
        ? new KvrError('KVR_ERR_HEADERS_TOO_LARGE')
        : new KvrError('KVR_ERR_MALFORMED_HTTP', `the request is not well-formed HTTP/1.1 (${err.code ?? 'parse error'})`)
  this.log.trace({ err }, 'client error')
  // a response already under way on this connection (bytes after a request that is being answered)
  // must not get a status line written into its middle: the connection is only closed
  if (socket.writable && !responseUnderWay(socket)) {
    const body = errorBody(e)
    socket.write(
      `HTTP/1.1 ${e.statusCode} ${STATUS_CODES[e.statusCode] ?? ''}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nContent-Type: ` +
        `application/json; charset=utf-8\r\nConnection: close\r\n\r\n${body}`,
    )
  }
  socket.destroy(err)
}

/**
 * Whether a connection has a response attached that is not yet handed whole to the OS. Node's
 * `_httpMessage` link is not documented, so it is read in this one place; the shutdown test of a
 * slow reader fails if a Node release drops it.
 */
export function responseUnderWay(socket: Socket): boolean {
  return (socket as Socket & { _httpMessage?: unknown })._httpMessage != null
}
