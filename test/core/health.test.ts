// The health state machine (src/core/health.ts): probes in a row make a worker unreachable and
// one answer brings it back; another block size makes it misconfigured in kv mode only, until it
// registers with the router's; the held set and its callbacks follow every transition.
import t from 'tap'
import { WorkerHealth } from '../../src/core/health.js'
import type { ProbeResult, WorkerHealthOptions } from '../../src/core/health.js'

const OK: ProbeResult = { outcome: 'ok', detail: null, path: '/health' }
const REFUSED: ProbeResult = { outcome: 'failed', detail: 'GET /health: connect ECONNREFUSED 127.0.0.1:9', path: '/health' }
const SLOW: ProbeResult = { outcome: 'timeout', detail: 'GET /health: no answer in 1 s', path: '/health' }

function make(o: Partial<WorkerHealthOptions> = {}): { h: WorkerHealth; calls: [bigint, boolean][]; clock: { now: number } } {
  const calls: [bigint, boolean][] = []
  const clock = { now: 1000 }
  const h = new WorkerHealth({
    blockSize: 16,
    kvMode: true,
    failuresToUnreachable: 2,
    now: () => clock.now,
    onHeld: (id, held) => calls.push([id, held]),
    ...o,
  })
  return { h, calls, clock }
}

t.test('N failed probes in a row: unreachable and held; one answer: back', async (t) => {
  const { h, calls, clock } = make({ failuresToUnreachable: 3 })
  h.registered(1n, 'http://a:1', 16)
  t.equal(h.state(1n, false), 'healthy')
  t.equal(h.probe(1n), null, 'no probe record before the first probe ends')
  t.same(h.probed(1n, 'http://a:1', REFUSED), { changed: null, confirm: true }, 'a first failure asks to confirm soon')
  t.same(h.probed(1n, 'http://a:1', OK), { changed: null, confirm: false }, 'an answer in between resets the count')
  t.same(h.probed(1n, 'http://a:1', REFUSED), { changed: null, confirm: true })
  t.same(h.probed(1n, 'http://a:1', SLOW), { changed: null, confirm: true }, 'a timeout counts as a failure')
  t.equal(h.state(1n, false), 'healthy', 'still healthy below the threshold')
  t.same(calls, [])
  clock.now = 1500
  t.same(h.probed(1n, 'http://a:1', REFUSED), { changed: 'unreachable', confirm: false })
  t.equal(h.state(1n, false), 'unreachable')
  t.equal(h.state(1n, true), 'unreachable', 'unreachable before suspended')
  t.ok(h.isHeld(1n))
  t.same(calls, [[1n, true]])
  t.match(h.reason(1n), /^3 health probe\(s\) in a row failed, the last: GET \/health: connect ECONNREFUSED/)
  t.same(h.probe(1n), { path: '/health', consecutive_failures: 3, last_ok_ms_ago: 500, last_probe_ms_ago: 0, last_error: REFUSED.detail })
  t.same(h.probed(1n, 'http://a:1', REFUSED), { changed: null, confirm: false }, 'once unreachable, probes keep their interval')
  t.same(calls, [[1n, true]], 'held once')
  clock.now = 2000
  t.same(h.probed(1n, 'http://a:1', { outcome: 'ok', detail: null, path: '/v1/models' }), { changed: 'recovered', confirm: false })
  t.equal(h.state(1n, false), 'healthy')
  t.equal(h.state(1n, true), 'suspended', 'the proxy may still have it suspended')
  t.notOk(h.isHeld(1n))
  t.same(calls, [
    [1n, true],
    [1n, false],
  ])
  t.equal(h.reason(1n), null)
  t.same(h.probe(1n), { path: '/v1/models', consecutive_failures: 0, last_ok_ms_ago: 0, last_probe_ms_ago: 0, last_error: null })
})

t.test('a probe of an address the worker left, or of a worker gone, changes nothing', async (t) => {
  const { h, calls } = make({ failuresToUnreachable: 1 })
  h.registered(1n, 'http://a:1', 16)
  t.same(h.probed(1n, 'http://old:1', REFUSED), { changed: null, confirm: false })
  t.same(h.probed(2n, 'http://a:1', REFUSED), { changed: null, confirm: false })
  t.equal(h.state(1n, false), 'healthy')
  t.same(calls, [])
  // unreachable, then registered again: the same URL keeps it so, a new one starts afresh
  h.probed(1n, 'http://a:1', REFUSED)
  h.registered(1n, 'http://a:1', 16)
  t.equal(h.state(1n, false), 'unreachable', 'registered again at the same URL: still unreachable until a probe answers')
  h.registered(1n, 'http://b:1', 16)
  t.equal(h.state(1n, false), 'healthy', 'at a new URL: a new record')
  t.same(calls, [
    [1n, true],
    [1n, false],
  ])
  h.probed(1n, 'http://b:1', REFUSED)
  h.removed(1n)
  t.notOk(h.isHeld(1n))
  t.same(calls.at(-1), [1n, false], 'a worker removed is let go')
  t.equal(h.state(1n, false), 'healthy', 'nothing is kept of it')
  h.removed(1n)
  t.equal(calls.length, 4, 'removed twice: told once')
})

t.test('another block size: misconfigured in kv mode until registered with the right one', async (t) => {
  const { h, calls } = make()
  h.registered(1n, 'http://a:1', 32)
  t.equal(h.state(1n, false), 'misconfigured')
  t.equal(h.state(1n, true), 'misconfigured', 'before suspended')
  t.equal(h.reason(1n), "block size 32, the router's is 16: its KV blocks can never match; register it again with block size 16")
  t.ok(h.isHeld(1n))
  // probes still run, and unreachable does not hide the mismatch
  h.probed(1n, 'http://a:1', REFUSED)
  h.probed(1n, 'http://a:1', REFUSED)
  t.equal(h.state(1n, false), 'misconfigured')
  h.probed(1n, 'http://a:1', OK)
  h.registered(1n, 'http://a:1', 16)
  t.equal(h.state(1n, false), 'healthy', 'registered again with the right size')
  t.notOk(h.isHeld(1n))
  t.same(calls, [
    [1n, true],
    [1n, false],
  ])
  // fixed while unreachable: it stays out, now for the other reason
  h.registered(2n, 'http://b:1', 8)
  h.probed(2n, 'http://b:1', REFUSED)
  h.probed(2n, 'http://b:1', REFUSED)
  h.registered(2n, 'http://b:1', 16)
  t.equal(h.state(2n, false), 'unreachable')
  t.ok(h.isHeld(2n))
})

t.test('outside kv mode the block size does not decide where requests go', async (t) => {
  const { h, calls } = make({ kvMode: false })
  h.registered(1n, 'http://a:1', 32)
  t.equal(h.state(1n, false), 'healthy')
  h.engineBlockSize(1n, 0, 64)
  t.equal(h.state(1n, false), 'healthy')
  t.same(calls, [])
})

t.test("an engine's events of another block size: misconfigured until the engine is read afresh", async (t) => {
  const { h, calls } = make()
  h.engineBlockSize(9n, 0, 32)
  t.same(calls, [], 'a worker not registered is not tracked')
  h.registered(1n, 'http://a:1', 16)
  h.engineBlockSize(1n, 1, 32)
  t.equal(h.state(1n, false), 'misconfigured')
  t.equal(h.reason(1n), "rank 1 publishes KV events of block size 32, the router's is 16: they are not applied; restart the engine with block size 16")
  h.registered(1n, 'http://a:1', 16)
  t.equal(h.state(1n, false), 'misconfigured', 'registering again does not change what the engine publishes')
  h.engineReset(1n)
  t.equal(h.state(1n, false), 'healthy')
  h.engineReset(1n)
  t.same(calls, [
    [1n, true],
    [1n, false],
  ])
  // per rank: a restarted rank clears its own mismatch only
  h.engineBlockSize(1n, 0, 32)
  h.engineBlockSize(1n, 1, 32)
  h.engineReset(1n, 0)
  t.equal(h.state(1n, false), 'misconfigured', 'rank 1 still publishes another size')
  t.match(h.reason(1n), /^rank 1 /)
  h.engineReset(1n, 1)
  t.equal(h.state(1n, false), 'healthy')
})
