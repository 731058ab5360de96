// Body parsers. Everywhere: JSON with exact u64s, the bytes kept for the proxy to forward. In the
// scanner routes (/v1/route, /v1/overlap, /v1/kv-events): the raw bytes, which they scan in place.
import { isUtf8 } from 'node:buffer'
import type { FastifyInstance } from 'fastify'
import { KvrError } from '../../errors.js'
import { parseJsonExact } from '../../codec/json.js'
import { readBody } from '../body.js'
import { BODY_BYTES, headerValue } from '../request.js'
import type { RequestWithBytes } from '../request.js'

export function jsonParser(fastify: FastifyInstance, bodyLimit: number): void {
  // JSON with exact u64s everywhere (the scanner context below replaces it for its routes)
  fastify.removeContentTypeParser(['application/json', 'text/plain'])
  fastify.addContentTypeParser('application/json', (req, payload, done) => {
    // the proxy forwards these very bytes, as they came and without a copy (src/http/body.ts):
    // handed the text, undici would encode it into a buffer of its own
    readBody(payload, bodyLimit, headerValue(req, 'content-length'), (err, bytes) => {
      if (err !== null || bytes === undefined) return done(err, undefined)
      // JSON is UTF-8 (RFC 8259): bytes that are not would reach the worker as they came while
      // the router read them with replacement characters, so they are refused instead
      if (!isUtf8(bytes)) return done(new KvrError('KVR_ERR_INVALID_REQUEST', 'the body is not valid UTF-8'), undefined)
      try {
        ;(req as RequestWithBytes)[BODY_BYTES] = bytes
        done(null, bytes.length === 0 ? undefined : parseJsonExact(bytes.toString('utf8')))
      } catch (e) {
        done(new KvrError('KVR_ERR_INVALID_REQUEST', `malformed JSON: ${(e as Error).message}`), undefined)
      }
    })
  })
}

export function rawBodyParser(scope: FastifyInstance, bodyLimit: number): void {
  scope.removeContentTypeParser('application/json')
  // the scanner reads the bytes where they are: Node's own buffer of the body, not a copy
  scope.addContentTypeParser('application/json', (req, payload, done) => {
    readBody(payload, bodyLimit, headerValue(req, 'content-length'), (err, bytes) => {
      // the same rule as the JSON parser's: a request_id read with replacement characters
      // would be booked under a name its client could not release; Node's check runs at
      // gigabytes a second, a few µs on a 4,096-token body
      if (err === null && bytes !== undefined && !isUtf8(bytes)) return done(new KvrError('KVR_ERR_INVALID_REQUEST', 'the body is not valid UTF-8'), undefined)
      done(err, bytes)
    })
  })
}
