// POST /v1/kv-events: one RouterEvent or an array, validated whole, then handed to the shards.
import type { FastifyInstance } from 'fastify'
import { KvrError } from '../../errors.js'
import { splitEvents } from '../../codec/event-array.js'
import { parseRouterEvent } from '../../codec/events.js'
import { rawBodyParser } from '../plugins/parsers.js'
import { limited } from '../../runtime/log.js'
import type { HttpContext } from '../context.js'

export async function kvEventRoutes(fastify: FastifyInstance, ctx: HttpContext): Promise<void> {
  const { router, cfg } = ctx
  await fastify.register(async (scope) => {
    rawBodyParser(scope, cfg.bodyLimit)
    scope.post('/v1/kv-events', async (req, reply) => {
      // a sender that outruns the shards is told to wait, before anything of its batch is taken,
      // rather than grow the backlog without bound
      if (router.pool.backlogFull) {
        router.metrics.eventsRefused(1)
        reply.header('retry-after', '1')
        const err = new KvrError(
          'KVR_ERR_EVENT_BACKLOG',
          `${router.pool.pendingMessages} event messages (${router.pool.pendingBytes} bytes) wait for the indexer shards`,
        )
        limited.warn(
          'http_events_refused',
          { code: err.code, error: err.message, client: req.ip },
          'a POST /v1/kv-events batch was refused: the backlog is full',
        )
        throw err
      }
      const buf = req.body as Buffer
      let parts: Uint8Array[]
      // validate the whole batch first, so a bad event refuses the batch and nothing half-applies
      const ids: bigint[] = []
      try {
        parts = splitEvents(buf)
        for (let i = 0; i < parts.length; i++) {
          // a 16 MiB batch is about 250,000 events, all decoded here before any is taken: other
          // requests get a turn every few thousand
          if ((i & 4095) === 4095) await new Promise<void>((resolve) => setImmediate(resolve))
          try {
            ids.push(parseRouterEvent(parts[i] as Uint8Array).worker_id)
          } catch (err) {
            const e = err as KvrError
            throw new KvrError(e.code ?? 'KVR_ERR_EVENT_MALFORMED_JSON', parts.length > 1 ? `event ${i}: ${e.message}` : e.message)
          }
        }
      } catch (err) {
        router.metrics.eventsRefused(1)
        const e = err as { code?: unknown; message?: unknown }
        limited.warn(
          'http_events_refused',
          { code: e.code, error: String(e.message), client: req.ip },
          'a POST /v1/kv-events batch was refused whole: an event in it does not decode',
        )
        throw err
      }
      let backpressure = false
      for (let i = 0; i < parts.length; i++) if (!router.ingest(parts[i] as Uint8Array, ids[i])) backpressure = true
      router.metrics.eventsReceived(parts.length)
      return reply.code(202).send({ accepted: parts.length, backpressure })
    })
  })
}
