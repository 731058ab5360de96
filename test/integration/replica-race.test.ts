// The race of synced replicas: two replicas routing at the same moment cannot see each other's
// booking and may pick the same worker. Two in-process replicas over a real nats-server route a
// request each at once, wave after wave (bookings held for four waves, prompts of varying
// length), with the replica spread off and on. The race counter counts each collision on both
// sides; the spread makes replicas facing the same state choose apart wherever one router would
// have put the two requests on different workers.
import t from 'tap'
import { connect } from 'nats'
import { startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { BS, routerConfig, WORKERS } from '../helpers/replica-sync.js'
import { Router } from '../../src/core/router.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { kvEventsSubject } from '../../src/transport/dynamo-names.js'
import type { Candidate } from '../../src/scheduler/selector.js'

const WAVES = 60
const HOLD = 4

const nats = await startNats({ jetstream: false })
t.teardown(() => nats.stop())
const pub = await connect({ servers: nats.url })
t.teardown(() => pub.close())

async function replica(routerId: bigint, spread: boolean): Promise<Router> {
  const cfg = routerConfig(nats.url, ['--router-replica-sync', spread ? '--router-replica-spread' : '--no-router-replica-spread'])
  return Router.start(cfg, { routerId, replica: { heartbeatMs: 100, silenceMs: 5000 } })
}

/**
 * Where one router would have put B's request after A's: B's costs at its decision, A's pick
 * loaded with what B's request adds there (its cost less the worker's load before).
 */
function oneRouter(base: Map<bigint, number>, candidates: Candidate[], aPick: bigint): bigint {
  let best: Candidate | null = null
  let bestCost = Infinity
  for (const c of candidates) {
    const cost = c.logit + (c.workerId === aPick ? c.logit - (base.get(c.workerId) ?? 0) : 0)
    if (cost < bestCost || (cost === bestCost && best?.workerId === aPick)) {
      best = c
      bestCost = cost
    }
  }
  return best?.workerId ?? -1n
}

/** Runs the waves; returns [waves where both chose one worker, of them those one router would have split, races counted by A + B]. */
async function run(spread: boolean, idBase: bigint): Promise<[number, number, number]> {
  const a = await replica(idBase + 1n, spread)
  const b = await replica(idBase + 2n, spread)
  try {
    await waitUntil(
      'in step and peered',
      () => a.replicas?.inStep === true && b.replicas?.inStep === true && a.replicas.livePeers === 1 && b.replicas.livePeers === 1,
      10_000,
    )
    // a cleared event for each worker, again until both routers have one
    let last = 0
    await waitUntil('workers exact', () => {
      if (Date.now() - last > 200) {
        last = Date.now()
        for (let w = 1; w <= WORKERS; w++)
          pub.publish(kvEventsSubject('dynamo', 'backend'), encodeRouterEvent({ worker_id: BigInt(w), event: { event_id: 1n, dp_rank: 0, data: 'cleared' } }))
      }
      return a.eventSources.size === 0 && b.eventSources.size === 0
    })
    let collisions = 0
    let avoidable = 0
    const held: [Router, string][][] = []
    for (let wave = 0; wave < WAVES; wave++) {
      // cold prompts of 2 to 7 blocks, of independent lengths on the two replicas
      const tokens = (salt: number): number[] =>
        Array.from({ length: (2 + ((wave * (5 + salt * 2) + salt) % 6)) * BS }, (_, i) => 100_000 + wave * 1000 + salt * 500 + i)
      // both decide before either hears of the other: the race
      const base = new Map(b.scheduler.stats().slots.map((x) => [x.workerId, x.prefillTokens / BS + x.activeBlocks]))
      const [da, db] = await Promise.all([a.route({ tokens: tokens(1) }), b.route({ tokens: tokens(2), explain: true })])
      if (da.decision.workerId === db.decision.workerId) {
        collisions++
        if (oneRouter(base, db.decision.candidates ?? [], da.decision.workerId) !== da.decision.workerId) avoidable++
      }
      held.push([
        [a, da.decision.requestId as string],
        [b, db.decision.requestId as string],
      ])
      if (held.length > HOLD) for (const [r, id] of held.shift() ?? []) r.scheduler.free(id)
      const want = (wave + 1) * 2
      await waitUntil('synced', () => adds(a) + adds(b) === want && a.scheduler.sequences.remoteSize === b.scheduler.sequences.remoteSize, 2000, 1)
      await new Promise((r) => setTimeout(r, 5))
    }
    return [collisions, avoidable, (a.replicas?.counters.races ?? 0) + (b.replicas?.counters.races ?? 0)]
  } finally {
    await a.close()
    await b.close()
  }
}

const adds = (r: Router): number => r.replicas?.counters.received.get('add:applied') ?? 0

t.test('the race is counted, and the spread makes replicas choose apart where one router would', async (t) => {
  const [before, avoidableBefore, racesBefore] = await run(false, 100n)
  const [after, avoidableAfter, racesAfter] = await run(true, 200n)
  t.comment(
    `${WAVES} waves of 2 simultaneous requests on ${WORKERS} workers: same worker ${before} times without the spread (${avoidableBefore} of them ` +
      `split by one router; races counted ${racesBefore}), ` +
      `${after} with it (${avoidableAfter} split by one router; races counted ${racesAfter})`,
  )
  t.ok(before > WAVES / 2, 'without the spread both take the cheapest worker, most of the time')
  t.ok(avoidableBefore > 10, 'often where one router would have split them')
  t.ok(racesBefore >= before, 'each collision is counted as a race')
  t.ok(after < before, 'the spread collides less')
  // a loaded machine can stretch a decision past a peer's booking: counted, but rare
  t.ok(avoidableAfter * 4 <= avoidableBefore, 'and seldom where one router would have split them')
})
