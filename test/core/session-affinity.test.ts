// The session bindings themselves: live for the TTL from their last use, dropped with their
// worker, least recently used evicted past the bound.
import t from 'tap'
import { SessionAffinity } from '../../src/core/session-affinity.js'

t.test('a binding lives for the TTL from its last use', async (t) => {
  const s = new SessionAffinity(1000)
  s.bind('a', 7n, 1, 0)
  t.match(s.get('a', 999), { workerId: 7n, dpRank: 1 })
  s.bind('a', 7n, 1, 900)
  t.ok(s.get('a', 1899), 'refreshed by its use')
  t.equal(s.get('a', 1900), undefined, 'expired')
  t.equal(s.size, 0, 'and dropped')
})

t.test('expire() sweeps the expired ones; forgetWorker() a worker that left', async (t) => {
  const s = new SessionAffinity(1000)
  s.bind('a', 1n, 0, 0)
  s.bind('b', 2n, 0, 500)
  s.bind('c', 1n, 0, 600)
  t.equal(s.expire(1200), 1)
  t.equal(s.size, 2)
  s.forgetWorker(1n)
  t.same([s.get('b', 1300)?.workerId, s.get('c', 1300)], [2n, undefined])
})

t.test('past the bound the least recently used binding goes', async (t) => {
  const s = new SessionAffinity(1000, 2)
  s.bind('a', 1n, 0, 0)
  s.bind('b', 2n, 0, 1)
  s.bind('a', 1n, 0, 2)
  s.bind('c', 3n, 0, 3)
  t.equal(s.size, 2)
  t.equal(s.get('b', 4), undefined, 'b was the least recently used')
  t.ok(s.get('a', 4))
  t.equal(s.counters.evicted, 1)
})
