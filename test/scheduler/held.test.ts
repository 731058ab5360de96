// Workers held out of routing (unreachable, misconfigured): never candidates unless a request is
// pinned to them, in every mode; ranks they register later are held too; none left: 503
// NO_WORKERS, and waiters no worker is left for are refused; let back, they take waiters.
import t from 'tap'
import { isKvrError } from '../../src/errors.js'
import type { RouterMode } from '../../src/scheduler/options.js'
import { makeScheduler } from './fixtures.js'

t.test('a held worker takes no request in any mode, unless pinned to it', async (t) => {
  for (const mode of ['kv', 'round-robin', 'random', 'least-loaded', 'power-of-two', 'device-aware-weighted'] as RouterMode[]) {
    const { s } = makeScheduler({ mode, blockSize: 16 }, 3)
    s.setHeld(2n, true)
    const seen = new Set<bigint>()
    for (let i = 0; i < 60; i++) {
      const d = s.tryRoute({ id: `r${i}`, isl: 32 })
      if (d !== null) seen.add(d.workerId)
      s.free(`r${i}`)
    }
    t.same([...seen].sort(), [1n, 3n], `${mode}: workers 1 and 3 only`)
    t.equal(s.tryRoute({ id: 'pinned', isl: 32, workerId: 2n })?.workerId, 2n, `${mode}: a request pinned to it goes there`)
  }
})

t.test('none left: NO_WORKERS; let back: routed again', async (t) => {
  const { s, slots } = makeScheduler({ blockSize: 16 }, 2)
  s.setHeld(1n, true)
  s.setHeld(2n, true)
  t.ok(s.isHeld(slots[0] as number))
  try {
    s.tryRoute({ id: 'a', isl: 16 })
    t.fail('routed')
  } catch (e) {
    t.ok(isKvrError(e, 'KVR_ERR_NO_WORKERS'))
    t.match((e as Error).message, /each of the 2 registered is unreachable or misconfigured/)
  }
  s.setHeld(2n, false)
  t.equal(s.tryRoute({ id: 'b', isl: 16 })?.workerId, 2n)
  // ranks registered while held are held too; removing a worker forgets it
  s.addWorkerRank(1n, 1)
  t.ok(s.isHeld(s.slotOf(1n, 1)))
  s.removeWorker(1n)
  s.setHeld(1n, false)
  s.addWorkerRank(1n, 0)
  t.notOk(s.isHeld(s.slotOf(1n, 0)), 'registered again after being let go: not held')
})

t.test('waiters: refused when every worker is held, dispatched to a worker let back', async (t) => {
  // two workers, busy above 100 unstarted prefill tokens each
  const { s } = makeScheduler({ blockSize: 16, queueThreshold: 1 }, 2, { maxNumBatchedTokens: 100 })
  s.tryRoute({ id: 'b1', isl: 200, workerId: 1n })
  s.tryRoute({ id: 'b2', isl: 200, workerId: 2n })
  const waiting = s.schedule({ id: 'w', isl: 16 })
  t.ok(s.isWaiting('w'))
  s.setHeld(1n, true)
  t.ok(s.isWaiting('w'), 'one worker left: it still waits')
  s.markPrefillComplete('b1')
  t.ok(s.isWaiting('w'), 'the held worker freed up, and takes no waiter')
  s.setHeld(1n, false)
  t.equal((await waiting).workerId, 1n, 'let back, it takes the waiter')
  s.tryRoute({ id: 'b3', isl: 200, workerId: 1n })
  const settled = s.schedule({ id: 'w2', isl: 16 }).then(
    () => 'routed',
    (e: unknown) => (isKvrError(e, 'KVR_ERR_NO_WORKERS') ? 'refused' : String(e)),
  )
  t.ok(s.isWaiting('w2'))
  s.setHeld(2n, true)
  s.setHeld(1n, true)
  t.equal(await settled, 'refused', 'no worker left for it')
})
