// The ring of recent decisions: entries reused in place, read back in order after a sequence
// number, and the watch that turns explanations on.
import t from 'tap'
import { DecisionLog } from '../../src/core/decision-log.js'
import type { RouteDecision } from '../../src/scheduler/scheduler.js'

const decision = (workerId: bigint, overlapBlocks = 0): RouteDecision => ({
  requestId: `r${workerId}`,
  slot: 0,
  workerId,
  dpRank: 0,
  overlapBlocks,
  booked: true,
  waitedMs: 0,
  candidates: undefined,
})

t.test('the ring keeps the newest `capacity` decisions, in order, reusing its entries', async (t) => {
  const log = new DecisionLog(4)
  t.same(log.since(0), [], 'empty at first')
  t.equal(log.newest, 0)
  log.record(decision(1n), 4, 64, 1000)
  const first = log.since(0)[0]
  t.match(first, { seq: 1, at: 1000, workerId: 1n, blocks: 4, isl: 64, booked: true, requestId: 'r1' })
  for (let i = 2n; i <= 6n; i++) log.record(decision(i, Number(i)), 4, 64, 1000 + Number(i))
  t.equal(log.newest, 6)
  t.same(
    log.since(0).map((e) => e.seq),
    [3, 4, 5, 6],
    'the oldest two were overwritten',
  )
  t.same(
    log.since(4).map((e) => e.workerId),
    [5n, 6n],
    'only what came after the reader',
  )
  t.same(
    log.since(0, 2).map((e) => e.seq),
    [5, 6],
    'a limit keeps the newest',
  )
  t.same(log.since(6), [])
  t.same(log.since(99), [], 'a reader ahead of the ring (another process) gets nothing')
  t.ok(
    log.since(0).some((e) => e === first),
    'entries are reused, not made per decision',
  )
})

t.test('watching: a poll for a while, a stream while it is held', async (t) => {
  const log = new DecisionLog()
  t.notOk(log.watching, 'nobody at first')
  log.watch(60_000)
  t.ok(log.watching, 'a poll')
  const quiet = new DecisionLog()
  const release = quiet.hold()
  const other = quiet.hold()
  t.ok(quiet.watching)
  release()
  release()
  t.ok(quiet.watching, 'released once, however often called; the other stream still holds')
  other()
  t.notOk(quiet.watching)
  quiet.watch(-1)
  t.notOk(quiet.watching, 'a watch that is over')
  quiet.watch(1000)
  t.ok(quiet.watchingAt(performance.now() + 500))
  t.notOk(quiet.watchingAt(performance.now() + 2000), 'read against the clock it is given')
})
