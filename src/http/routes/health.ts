// Liveness, readiness, metrics and the model list.
import type { FastifyInstance } from 'fastify'
import { serializeJson } from '../../codec/json.js'
import type { HttpContext } from '../context.js'

export function healthRoutes(fastify: FastifyInstance, ctx: HttpContext): void {
  const { router, cfg } = ctx
  fastify.get('/health', async () => ({ status: 'ok' }))
  fastify.get('/live', async () => ({ status: 'ok' }))
  fastify.get('/ready', async (req, reply) => {
    const health = router.pool.health()
    const recovering = health.filter((h) => h !== 'exact').length
    const pending = router.pool.pendingMessages
    const conn = router.connected
    // A lost NATS or etcd connection leaves the router able to route (on an index that stops
    // learning, with the workers it last knew), and it hits every replica at once: a balancer
    // that took them all out would turn a control-plane blip into an outage. So it is `degraded`
    // here and in kvrouter_connected, not unready.
    // ?strict: Dynamo's readiness, the connections included, for a deployment that wants it
    const strict = (req.query as Record<string, unknown> | undefined)?.strict !== undefined
    const sync = router.replicas
    // routing on the local approximate index while no remote indexer answers: degraded, still ready
    const remote = router.parts.remote
    const degraded = conn.nats === false || conn.etcd === false || sync?.connected === false || remote?.exact === false
    // a replica no worker can take a request from should leave its balancer's rotation: none
    // registered, or each unreachable, misconfigured or suspended after failures
    const workers = router.registry.all()
    let healthy = 0
    for (const w of workers) if (router.health.state(w.id, router.suspension.isSuspended(w)) === 'healthy') healthy++
    // a replica that has not caught up with its peers' bookings would route on a fraction of the load
    const ready = recovering === 0 && !ctx.closing() && !(strict && degraded) && sync?.inStep !== false && healthy > 0
    return reply
      .code(ready ? 200 : 503)
      .header('content-type', 'application/json')
      .send(
        serializeJson({
          ready,
          degraded,
          shards: health.length,
          recovering_shards: recovering,
          pending_event_messages: pending,
          workers: workers.length,
          healthy_workers: healthy,
          nats: conn.nats,
          etcd: conn.etcd,
          replica_sync: sync === null ? null : { router_id: sync.routerId, in_step: sync.inStep, connected: sync.connected, peers: sync.livePeers },
          remote_index: remote === null ? null : remote.status(),
        }),
      )
  })
  fastify.get('/metrics', async (_req, reply) => {
    const text = await router.metrics.registry.metrics()
    return reply.header('content-type', router.metrics.registry.contentType).send(text)
  })
  fastify.get('/v1/models', async () => ({
    object: 'list',
    data: [{ id: cfg.modelName, object: 'model', created: 0, owned_by: 'kv-router' }],
  }))
}
