// The router queue: waiting only when every candidate is busy, policy order,
// priority, the bound, cancellation and dispatch triggers.
import t from 'tap'
import { isKvrError, type KvrError } from '../../src/errors.js'
import { PendingQueue } from '../../src/scheduler/pending-queue.js'
import { policyKey, priorityJump } from '../../src/scheduler/queue-policy.js'
import { RetryableError } from '../../src/scheduler/rejection.js'
import type { RouteDecision, Scheduler, ScheduleRequest } from '../../src/scheduler/scheduler.js'
import { makeScheduler, overlaps } from './fixtures.js'

// One worker that is busy above 100 unstarted prefill tokens (threshold 1 × 100).
function busyFleet(opts: Record<string, unknown> = {}, workers = 1) {
  const f = makeScheduler({ blockSize: 16, queueThreshold: 1, ...opts }, workers, { maxNumBatchedTokens: 100 })
  f.s.tryRoute({ id: 'blocker', isl: 200, workerId: 1n })
  return f
}

/** Completes prefill of whichever booked request still has prefill, until all of `ids` ran. */
async function runAll(s: Scheduler, ids: string[], pending: Promise<RouteDecision>[]): Promise<string[]> {
  const order: string[] = []
  pending.forEach((p) => p.then((d) => order.push(d.requestId as string)))
  s.markPrefillComplete('blocker')
  for (let guard = 0; guard < 100 && ids.some((id) => s.isWaiting(id)); guard++) {
    for (const id of ids) if ((s.sequences.requestInfo(id)?.prefillTokens ?? 0) > 0) s.markPrefillComplete(id)
  }
  await Promise.all(pending)
  return order
}

function enqueueAt(s: Scheduler, clock: { ms: number }, ms: number, req: ScheduleRequest): Promise<RouteDecision> {
  clock.ms = ms
  return s.schedule(req)
}

t.test('policy keys: fcfs, lcfs, wspt', async (t) => {
  t.equal(priorityJump(undefined), 0)
  t.equal(priorityJump(-3), 0, 'negative priority clamps to 0')
  t.equal(priorityJump(Number.NaN), 0)
  t.equal(priorityJump(2.5), 2.5)
  t.equal(policyKey('fcfs', 2, 10, 0), -8)
  t.equal(policyKey('lcfs', 2, 10, 0), 12)
  t.equal(policyKey('wspt', 0, 10, 1024 - 60 * 16), 1 / 64, 'isl 1024, 60 cached blocks of 16 → 1/64')
  t.equal(policyKey('wspt', 3, 0, 0), 4, 'new tokens floor at 1')
})

t.test('fcfs: earlier arrival first, priority (seconds) jumps ahead', async (t) => {
  const { s, clock } = busyFleet({ queuePolicy: 'fcfs' })
  const p = [
    enqueueAt(s, clock, 0, { id: 'a', isl: 200 }),
    enqueueAt(s, clock, 1000, { id: 'b', isl: 200 }),
    enqueueAt(s, clock, 2000, { id: 'c', isl: 200, priority: 5 }),
    enqueueAt(s, clock, 3000, { id: 'd', isl: 200, priority: -4 }),
  ]
  t.equal(s.stats().queueDepth, 4)
  t.same(await runAll(s, ['a', 'b', 'c', 'd'], p), ['c', 'a', 'b', 'd'])
  t.equal(s.stats().queueDepth, 0)
})

t.test('lcfs: latest arrival first, priority still jumps', async (t) => {
  const { s, clock } = busyFleet({ queuePolicy: 'lcfs' })
  const p = [
    enqueueAt(s, clock, 0, { id: 'a', isl: 200, priority: 2.5 }),
    enqueueAt(s, clock, 1000, { id: 'b', isl: 200 }),
    enqueueAt(s, clock, 2000, { id: 'c', isl: 200 }),
  ]
  t.same(await runAll(s, ['a', 'b', 'c'], p), ['a', 'c', 'b'], 'a: 2.5 + 0 beats c: 2 and b: 1')
})

t.test('wspt: least new work first, weighted by priority; equal keys in arrival order', async (t) => {
  const { s, clock } = busyFleet({ queuePolicy: 'wspt' })
  const p = [
    enqueueAt(s, clock, 0, { id: 'a', isl: 1000 }),
    enqueueAt(s, clock, 1, { id: 'b', isl: 300 }),
    enqueueAt(s, clock, 2, { id: 'c', isl: 2000, priority: 1 }),
    enqueueAt(s, clock, 3, { id: 'd', isl: 1024, overlapBlocks: overlaps({ 0: 60 }) }),
  ]
  t.same(await runAll(s, ['a', 'b', 'c', 'd'], p), ['d', 'b', 'a', 'c'])
})

t.test('wait only when every candidate is busy', async (t) => {
  const { s } = busyFleet({}, 2)
  const d = await s.schedule({ id: 'x', isl: 500 })
  t.equal(d.workerId, 2n, 'the idle worker takes it at once')
  t.equal(d.waitedMs, 0)
  const p = s.schedule({ id: 'y', isl: 50 })
  t.ok(s.isWaiting('y'), 'both workers busy now')
  const q = await s.schedule({ id: 'z', isl: 50, updateStates: false })
  t.equal(q.booked, false, 'query-only requests never wait')
  s.free('x')
  t.equal((await p).workerId, 2n, 'dispatched on free')
})

t.test('no queue when the threshold is unset', async (t) => {
  const { s } = makeScheduler({ queueThreshold: null }, 1, { maxNumBatchedTokens: 1 })
  for (let i = 0; i < 5; i++) t.equal((await s.schedule({ id: `r${i}`, isl: 1000 })).workerId, 1n)
  t.equal(s.stats().queuedTotal, 0)
})

t.test('threshold 0 queues as soon as every worker has any unstarted prefill', async (t) => {
  const { s } = makeScheduler({ queueThreshold: 0 }, 1)
  t.ok(s.tryRoute({ id: 'a', isl: 1 }))
  t.equal(s.tryRoute({ id: 'b', isl: 1 }), null)
})

t.test('the bound refuses at once with 503 and Retry-After', async (t) => {
  const { s } = busyFleet({ queueMaxPending: 2, retryAfterSecs: 3 })
  const a = s.schedule({ id: 'a', isl: 10 })
  const b = s.schedule({ id: 'b', isl: 10 })
  const err = await s.schedule({ id: 'c', isl: 10 }).catch((e: unknown) => e)
  t.ok(err instanceof RetryableError)
  t.ok(isKvrError(err, 'KVR_ERR_QUEUE_FULL'))
  t.equal((err as RetryableError).statusCode, 503)
  t.equal((err as RetryableError).retryAfterSecs, 3)
  t.match((err as Error).message, /maximum of 2 pending requests/)
  t.equal(s.stats().queueFullTotal, 1)
  t.notOk(s.isWaiting('c'))
  s.free('blocker')
  await Promise.all([a, b])
})

t.test('a cancelled waiting request is gone', async (t) => {
  const { s } = busyFleet()
  const a = s.schedule({ id: 'a', isl: 10 })
  const b = s.schedule({ id: 'b', isl: 10 })
  t.ok(s.cancel('a'))
  const err = await a.catch((e: unknown) => e)
  t.ok(isKvrError(err, 'KVR_ERR_REQUEST_CANCELLED'))
  t.equal((err as KvrError).statusCode, 499)
  t.notOk(s.isWaiting('a'))
  t.equal(s.stats().queueDepth, 1)
  t.notOk(s.cancel('a'), 'cancelling twice does nothing')
  s.free('blocker')
  t.equal((await b).requestId, 'b')
  t.notOk(s.sequences.has('a'), 'never booked')
  t.equal(s.stats().cancelledTotal, 1)
})

t.test('an aborted signal removes the waiter; aborted before routing = refused', async (t) => {
  const { s } = busyFleet()
  const ac = new AbortController()
  const p = s.schedule({ id: 'a', isl: 10, signal: ac.signal })
  t.ok(s.isWaiting('a'))
  ac.abort()
  t.ok(isKvrError(await p.catch((e: unknown) => e), 'KVR_ERR_REQUEST_CANCELLED'))
  t.equal(s.stats().queueDepth, 0)
  const err = await s.schedule({ id: 'b', isl: 10, signal: ac.signal }).catch((e: unknown) => e)
  t.ok(isKvrError(err, 'KVR_ERR_REQUEST_CANCELLED'))
  // a dispatched request's signal no longer cancels it from the queue side
  const ac2 = new AbortController()
  const q = s.schedule({ id: 'c', isl: 10, signal: ac2.signal })
  s.free('blocker')
  await q
  ac2.abort()
  t.ok(s.sequences.has('c'), 'booked requests are freed by the HTTP layer, not by the stale listener')
})

t.test('cancel of a booked request frees it', async (t) => {
  const { s } = busyFleet()
  t.ok(s.cancel('blocker'))
  t.equal(s.sequences.inFlight[0], 0)
  t.notOk(s.cancel('blocker'))
})

t.test('periodic recheck dispatches after stale bookings expire; waits are measured', async (t) => {
  const { s, clock } = busyFleet({ staleRequestSecs: 10 })
  clock.ms = 1000
  const p = s.schedule({ id: 'a', isl: 10 })
  clock.ms = 5000
  s.recheck()
  t.ok(s.isWaiting('a'), 'the blocker is not stale yet')
  clock.ms = 10_000
  s.recheck()
  const d = await p
  t.equal(d.waitedMs, 9000)
  const st = s.stats()
  t.equal(st.staleExpiredTotal, 1)
  t.equal(st.waitCount, 1)
  t.equal(st.waitSumMs, 9000)
  t.equal(st.waitMaxMs, 9000)
  t.same(s.takeWaitSamples(), [9000])
  t.same(s.takeWaitSamples(), [], 'drained')
})

t.test('a new worker drains the queue; a removed pin rejects its waiter', async (t) => {
  const { s } = busyFleet()
  const p = s.schedule({ id: 'a', isl: 10 })
  const pinned = s.schedule({ id: 'b', isl: 10, workerId: 1n, priority: 100 })
  t.same(s.removeWorkerRank(1n, 0), ['blocker'], 'dropping the worker frees its bookings')
  t.same(s.removeWorkerRank(1n, 0), [])
  s.addWorkerRank(2n, 0, { maxNumBatchedTokens: 100 })
  t.ok(isKvrError(await pinned.catch((e: unknown) => e), 'KVR_ERR_UNKNOWN_WORKER'))
  t.equal((await p).workerId, 2n)
})

t.test('duplicates, missing ids and bad prompts are refused', async (t) => {
  const { s } = busyFleet()
  const p = s.schedule({ id: 'a', isl: 10 })
  await t.rejects(s.schedule({ id: 'a', isl: 10 }), { code: 'KVR_ERR_DUPLICATE_REQUEST' })
  await t.rejects(s.schedule({ id: 'blocker', isl: 10 }), { code: 'KVR_ERR_DUPLICATE_REQUEST' })
  await t.rejects(s.schedule({ isl: 10 }), /request\.id must be a non-empty string/)
  await t.rejects(s.schedule({ id: 'n', isl: -1 }), /request\.isl must be a number in \[0, 2\^32\)/)
  await t.rejects(s.schedule({ id: 'n', isl: 1e300 }), /request\.isl must be a number in \[0, 2\^32\)/)
  await t.rejects(s.schedule({ id: 'n', isl: 2 ** 32 }), { code: 'KVR_ERR_INVALID_OPTION' })
  await t.rejects(s.schedule({ id: 'n', isl: Number.NaN }), { code: 'KVR_ERR_INVALID_OPTION' })
  s.close()
  t.ok(isKvrError(await p.catch((e: unknown) => e), 'KVR_ERR_REQUEST_CANCELLED'), 'close() refuses waiters')
})

t.test('no workers → NO_WORKERS', async (t) => {
  const { s } = makeScheduler({}, 0)
  await t.rejects(s.schedule({ id: 'a', isl: 1 }), { code: 'KVR_ERR_NO_WORKERS' })
  t.equal(s.free('a'), false)
  t.equal(s.markPrefillComplete('a'), false)
})

t.test('timers are created and cleared', async (t) => {
  const { s } = makeScheduler({ queueRecheckMs: 50 }, 1, {}, { timers: true })
  s.close()
  t.doesNotThrow(() => s.close(), 'closed twice without error')
})

t.test('PendingQueue: order, ties, arbitrary removal, growth', async (t) => {
  const q = new PendingQueue()
  t.equal(q.pop(), -1)
  t.equal(q.peek(), -1)
  const keys = [5, 1, 9, 5, 3, 9, 7, 0, 2, 8]
  for (let h = 0; h < 200; h++) q.push(h, keys[h % keys.length] as number)
  t.equal(q.size, 200)
  t.equal(q.keyOf(2), 9)
  t.ok(q.remove(2))
  t.notOk(q.remove(2))
  t.notOk(q.has(100_000))
  t.ok(q.remove(199))
  const out: number[] = []
  while (q.size > 0) out.push(q.pop())
  t.equal(out.length, 198)
  for (let i = 1; i < out.length; i++) {
    const a = out[i - 1] as number
    const b = out[i] as number
    const ka = keys[a % keys.length] as number
    const kb = keys[b % keys.length] as number
    t.ok(ka > kb || (ka === kb && a < b), 'higher key first, then arrival')
  }
  // removal from the middle keeps the heap valid (move up and move down cases)
  for (let h = 0; h < 50; h++) q.push(h, 50 - h)
  for (let h = 10; h < 40; h += 3) q.remove(h)
  let last = Infinity
  while (q.size > 0) {
    const h = q.pop()
    t.ok(50 - h <= last)
    last = 50 - h
  }
})

t.test('a pinned waiter waits for its own worker, and does not hold back requests that can run elsewhere', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: 1 }, 2, { maxNumBatchedTokens: 100 })
  s.tryRoute({ id: 'busy1', isl: 200, workerId: 1n })
  s.tryRoute({ id: 'busy2', isl: 200, workerId: 2n })
  const pinned = s.schedule({ id: 'p', isl: 10, workerId: 1n, priority: 100 })
  const free = s.schedule({ id: 'u', isl: 10 })
  t.ok(s.isWaiting('p') && s.isWaiting('u'))
  s.free('busy2') // worker 2 is free, worker 1 still busy
  t.ok(s.isWaiting('p'), 'not sent to its still-busy worker')
  t.equal(s.sequences.slotOfRequest('p'), -1)
  t.equal((await free).workerId, 2n, 'the request behind it runs on the free worker')
  s.markPrefillComplete('busy1')
  const d = await pinned
  t.equal(d.workerId, 1n)
  t.ok(d.waitedMs >= 0)
  t.equal(s.stats().queueDepth, 0)
})

t.test('a pinned waiter keeps its place among equal keys when it is put back', async (t) => {
  const { s, clock } = makeScheduler({ blockSize: 16, queueThreshold: 1 }, 2, { maxNumBatchedTokens: 100 })
  s.tryRoute({ id: 'busy1', isl: 200, workerId: 1n })
  s.tryRoute({ id: 'busy2', isl: 200, workerId: 2n })
  const order: string[] = []
  const p = ['a', 'b', 'c'].map((id) => s.schedule({ id, isl: 200, workerId: 1n }).then((d) => order.push(d.requestId as string)))
  clock.ms = 0
  s.free('busy2') // drains, finds all three blocked, puts them back
  s.free('busy2')
  for (const id of ['busy1', 'a', 'b', 'c']) {
    s.markPrefillComplete(id)
    await Promise.resolve()
  }
  await Promise.all(p)
  t.same(order, ['a', 'b', 'c'])
})

t.test('removing a worker refuses the waiters pinned to it at once', async (t) => {
  const { s } = busyFleet({}, 2)
  s.tryRoute({ id: 'blocker2', isl: 200, workerId: 2n })
  const pinnedRank = s.schedule({ id: 'pr', isl: 10, workerId: 1n, dpRank: 0 })
  const pinned = s.schedule({ id: 'p', isl: 10, workerId: 1n })
  const other = s.schedule({ id: 'o', isl: 10 })
  t.same(s.removeWorker(1n), ['blocker'])
  t.ok(isKvrError(await pinned.catch((e: unknown) => e), 'KVR_ERR_UNKNOWN_WORKER'))
  t.ok(isKvrError(await pinnedRank.catch((e: unknown) => e), 'KVR_ERR_UNKNOWN_WORKER'))
  t.notOk(s.isWaiting('p'))
  t.ok(s.isWaiting('o'), 'worker 2 is still busy')
  s.free('blocker2')
  t.equal((await other).workerId, 2n)
})

t.test('stale bookings expired while booking let waiters run at once', async (t) => {
  const { s, clock } = makeScheduler({ blockSize: 16, queueThreshold: 1, staleRequestSecs: 10 }, 2, { maxNumBatchedTokens: 100 })
  s.tryRoute({ id: 'old', isl: 200, workerId: 1n })
  clock.ms = 5000
  s.tryRoute({ id: 'busy2', isl: 200, workerId: 2n })
  const waiting = s.schedule({ id: 'w', isl: 10, workerId: 1n })
  t.ok(s.isWaiting('w'))
  clock.ms = 10_000
  s.markPrefillComplete('busy2')
  // 'w' is pinned to worker 1, still booked with 'old'; the next booking expires 'old'
  t.ok(s.isWaiting('w'))
  s.tryRoute({ id: 'x', isl: 10, workerId: 2n })
  t.notOk(s.sequences.has('old'), 'expired lazily by the booking')
  t.equal((await waiting).workerId, 1n, 'dispatched without waiting for the periodic recheck')
})

t.test('a retry that excludes the idle worker waits for the busy one like a pinned request, and others go ahead', async (t) => {
  // two workers; worker 2 is busy; worker 1 is idle but is the one the retry has tried
  const { s, slots } = makeScheduler({ blockSize: 16, queueThreshold: 1 }, 2, { maxNumBatchedTokens: 100 })
  s.tryRoute({ id: 'blocker', isl: 200, workerId: 2n })
  // make worker 1 look busy too, so the retry and a plain request both queue
  s.tryRoute({ id: 'blocker1', isl: 200, workerId: 1n })
  let retried: RouteDecision | undefined
  let plain: RouteDecision | undefined
  void s.schedule({ id: 'retry', isl: 50, exclude: [{ workerId: 1n, dpRank: 0 }] }).then((d) => (retried = d))
  void s.schedule({ id: 'plain', isl: 50 }).then((d) => (plain = d))
  t.ok(s.isWaiting('retry') && s.isWaiting('plain'), 'both wait: every worker is busy')
  t.ok(s.free('blocker1'), 'worker 1 is free again')
  await new Promise((r) => setImmediate(r))
  t.equal(plain?.workerId, 1n, 'the plain request behind it went to worker 1')
  t.equal(retried, undefined, 'the retry keeps waiting: its only worker is still busy')
  t.ok(s.isWaiting('retry'))
  t.equal(s.sequences.prefillTokens[slots[1] as number], 200, 'worker 2 got nothing more')
  s.recheck()
  await new Promise((r) => setImmediate(r))
  t.equal(retried, undefined, 'a recheck does not push it onto the busy worker either')
  s.markPrefillComplete('blocker')
  await new Promise((r) => setImmediate(r))
  t.equal(retried?.workerId, 2n, 'it runs once worker 2 has room')
})

t.test('a waiting retry whose last untried worker is removed is refused, not left waiting', async (t) => {
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: 1 }, 2, { maxNumBatchedTokens: 100 })
  s.tryRoute({ id: 'blocker', isl: 200, workerId: 2n })
  s.tryRoute({ id: 'blocker1', isl: 200, workerId: 1n })
  const p = s.schedule({ id: 'retry', isl: 50, exclude: [{ workerId: 1n, dpRank: 0 }] })
  t.ok(s.isWaiting('retry'))
  s.removeWorker(2n)
  await t.rejects(p, { code: 'KVR_ERR_NO_WORKERS' })
  t.notOk(s.isWaiting('retry'))
})

t.test('a worker registered into the slot of a tried one is not excluded by it', async (t) => {
  // worker 1 was tried and worker 2 is busy, so the retry waits; then worker 1 goes away and
  // worker 3 arrives in the slot it freed
  const { s, slots } = makeScheduler({ blockSize: 16, queueThreshold: 1 }, 2, { maxNumBatchedTokens: 100 })
  s.tryRoute({ id: 'blocker', isl: 200, workerId: 2n })
  s.tryRoute({ id: 'blocker1', isl: 200, workerId: 1n })
  let retried: RouteDecision | undefined
  const p = s.schedule({ id: 'retry', isl: 50, exclude: [{ workerId: 1n, dpRank: 0 }] }).then((d) => (retried = d))
  s.removeWorker(1n)
  t.ok(s.isWaiting('retry'), 'worker 2 is untried and still registered: it waits')
  const slot3 = s.addWorkerRank(3n, 0, { maxNumBatchedTokens: 100 })
  t.equal(slot3, slots[0], 'the new worker took the freed slot')
  await p
  t.equal(retried?.workerId, 3n, 'it runs on the new worker at once')
  t.equal(retried?.slot, slots[0])
  // and the tried worker, back under a new slot, is still excluded
  const again = s.addWorkerRank(1n, 0, { maxNumBatchedTokens: 100 })
  t.not(again, slots[0])
  const d = s.tryRoute({
    id: 'r2',
    isl: 10,
    exclude: [
      { workerId: 3n, dpRank: 0 },
      { workerId: 2n, dpRank: 0 },
    ],
  })
  t.equal(d?.workerId, 1n, 'only worker 1 is left untried')
  t.throws(
    () =>
      s.tryRoute({
        id: 'r3',
        isl: 10,
        exclude: [
          { workerId: 1n, dpRank: 0 },
          { workerId: 3n, dpRank: 0 },
          { workerId: 2n, dpRank: 0 },
        ],
      }),
    { code: 'KVR_ERR_NO_WORKERS' },
  )
})
