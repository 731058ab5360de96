// Draining: once shutdown() begins, new connections are refused and new requests on open ones get
// 503 with `connection: close`; open requests finish, up to a deadline.
import { Server as NetServer } from 'node:net'
import type { Socket } from 'node:net'
import type { FastifyInstance } from 'fastify'
import { KvrError } from '../../errors.js'
import { responseUnderWay, sendError } from '../error-handler.js'
import type { UpstreamProxy } from '../proxy/proxy.js'

export interface ShutdownResult {
  /** Nothing had to be cut. */
  drained: boolean
  /** Proxied requests still in flight at the deadline, whose clients were cut off. */
  cut: number
}

export interface Drain {
  readonly closing: () => boolean
  /** Stops accepting, drains every open request (proxied, or still arriving) up to timeoutMs, then cuts what is left and closes. */
  readonly shutdown: (timeoutMs: number) => Promise<ShutdownResult>
}

export function drainOnShutdown(fastify: FastifyInstance, proxy: UpstreamProxy): Drain {
  // The connections open, for the shutdown's sweep: one listener per connection, nothing per request.
  const sockets = new Set<Socket>()
  fastify.server.on('connection', (s: Socket) => {
    sockets.add(s)
    s.once('close', () => sockets.delete(s))
  })
  let closing = false
  // callback style: an async hook costs every request a promise and a microtask turn
  fastify.addHook('onRequest', (_req, reply, done) => {
    if (!closing) return done()
    // answered here, so the lifecycle does not go on (no done())
    reply.header('connection', 'close')
    void sendError(reply, new KvrError('KVR_ERR_SHUTTING_DOWN'))
  })

  /**
   * Closes the connections that carry nothing: no response being written (`_httpMessage`, Node's
   * own link from a socket to its response, is cleared only once the last byte is handed to the
   * OS), nothing buffered, and nothing read since the last sweep (no request's headers arriving).
   * Node's closeIdleConnections is not used: it destroys a connection as soon as end() was called,
   * cutting a response still being written to a slow reader (of a 20 MB answer, 3.9 MB arrived).
   */
  const lastRead = new WeakMap<Socket, number>()
  const sweep = (): void => {
    for (const s of sockets) {
      if (responseUnderWay(s) || s.writableLength > 0) continue
      const read = s.bytesRead
      if (lastRead.get(s) === read) s.destroySoon()
      else lastRead.set(s, read)
    }
  }

  const shutdown = async (timeoutMs: number): Promise<ShutdownResult> => {
    closing = true
    let cut = false
    let cutRequests = 0
    // The listener closes at once, so new connections are refused: a balancer that fails over on
    // a refused connection moves on now, not after the drain. net.Server's close,
    // not http.Server's: the latter also runs closeIdleConnections (see sweep). A request on a
    // connection already open gets 503 with `connection: close` from the onRequest hook above.
    const drained = new Promise<void>((resolve) => fastify.server.once('close', () => resolve()))
    NetServer.prototype.close.call(fastify.server)
    // A keep-alive connection whose last response ends during the drain turns idle and would stay
    // open for fastify's keep-alive timeout (72 s): swept until none is left. A connection still
    // uploading a body has its response assigned, so that request is drained like a proxied one.
    sweep()
    const sweeping = setInterval(sweep, 25)
    // Whatever is still open at the deadline is cut: a stream that never ends, a body that never
    // finishes uploading. A cut client connection is a client disconnect to the proxy: its
    // upstream request is aborted and its booking freed.
    const deadline = setTimeout(() => {
      cut = true
      cutRequests = proxy.inFlight
      fastify.server.closeAllConnections()
    }, timeoutMs)
    try {
      await drained
    } finally {
      clearInterval(sweeping)
      clearTimeout(deadline)
    }
    await fastify.close()
    // the runs of cut connections end as their upstream aborts settle
    const idle = await proxy.drain(1000)
    await proxy.close(cut || !idle)
    return { drained: !cut && idle, cut: cutRequests }
  }
  return { closing: () => closing, shutdown }
}
