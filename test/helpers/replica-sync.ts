// Replica-sync test fixtures: router replicas in this process over one real nats-server, with
// WORKERS static workers each, made exact by a first KV event.
import type { Test } from 'tap'
import type { NatsConnection } from 'nats'
import { waitUntil } from './wait.js'
import { parseServeConfig } from '../../src/config.js'
import type { ServeConfig } from '../../src/config.js'
import { Router } from '../../src/core/router.js'
import type { RouterDeps } from '../../src/core/router.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { kvEventsSubject } from '../../src/transport/dynamo-names.js'
import { replicaSubjects } from '../../src/transport/replica-sync.js'

export const BS = 16
export const WORKERS = 4
export const subjects = replicaSubjects('dynamo', 'backend')

/** A router replica with WORKERS static workers, closed at the test's end. */
/**
 * The serve configuration of a test router over NATS with WORKERS static workers, `extra` after.
 * No health probes: nothing listens at the workers' addresses, and probes would take them out of
 * routing.
 */
export function routerConfig(natsUrl: string, extra: string[] = []): ServeConfig {
  const args = ['--router-event-threads', '1', '--no-router-event-recovery', '--router-health-probe-interval-secs', '0', '--router-block-size', String(BS)]
  args.push('--router-queue-threshold', 'none', '--nats-url', natsUrl, ...extra)
  for (let w = 1; w <= WORKERS; w++) args.push('--worker', `${w}=http://127.0.0.1:${9000 + w}`)
  const cfg = parseServeConfig(args, {})
  if (cfg === 'help') throw new Error('help')
  return cfg
}

export async function startReplica(t: Test, natsUrl: string, routerId: bigint, extra: string[] = [], deps: RouterDeps = {}): Promise<Router> {
  const cfg = routerConfig(natsUrl, ['--router-replica-sync', '--router-replica-catch-up-secs', '5', ...extra])
  const r = await Router.start(cfg, { routerId, replica: { heartbeatMs: 100, silenceMs: 1500 }, ...deps })
  t.teardown(() => r.close())
  return r
}

/**
 * Makes every worker exact on every router: a cleared event each on NATS, again until every
 * router has one (a router just started may not have subscribed yet).
 */
export async function makeExact(pub: NatsConnection, ...routers: Router[]): Promise<void> {
  let last = 0
  await waitUntil('workers exact', () => {
    if (Date.now() - last > 200) {
      last = Date.now()
      for (let w = 1; w <= WORKERS; w++)
        pub.publish(kvEventsSubject('dynamo', 'backend'), encodeRouterEvent({ worker_id: BigInt(w), event: { event_id: 1n, dp_rank: 0, data: 'cleared' } }))
    }
    return routers.every((r) => r.eventSources.size === 0)
  })
}

export const inStep = (r: Router): Promise<void> => waitUntil('in step', () => r.replicas?.inStep === true, 8000)

/** Tokens of a prompt: `prefix` shared blocks then `own` blocks of its own. */
export function prompt(prefix: number, own: number, seed: number): number[] {
  const out: number[] = []
  for (let i = 0; i < prefix * BS; i++) out.push(1000 + i)
  for (let i = 0; i < own * BS; i++) out.push(50_000 + seed * 997 + i)
  return out
}

export const slotLoad = (r: Router, worker: bigint): { inFlight: number; prefill: number; blocks: number } => {
  const s = r.scheduler.stats().slots.find((x) => x.workerId === worker)
  return { inFlight: s?.inFlight ?? -1, prefill: s?.prefillTokens ?? -1, blocks: s?.activeBlocks ?? -1 }
}
