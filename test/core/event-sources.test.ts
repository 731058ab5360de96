// The no-events state of a worker: predicted until its first event, warned about once, and reset
// in the index (every rank) when its events begin.
import t from 'tap'
import { EventSources, SILENT_AFTER_MS } from '../../src/core/event-sources.js'
import type { WorkerInfo } from '../../src/core/worker-registry.js'

function info(id: bigint, dpRanks = 1, kvEvents: WorkerInfo['kvEvents'] = null): WorkerInfo {
  return {
    id,
    url: 'http://w',
    blockSize: 16,
    capacity: 0,
    device: 'gpu',
    dpRanks,
    maxNumBatchedTokens: undefined,
    registeredAt: 0,
    decisionsOnly: false,
    failures: 0,
    suspendedUntil: 0,
    source: 'static',
    kvEvents,
  }
}

function setup() {
  const log: string[] = []
  const warnings: string[] = []
  let now = 0
  const s = new EventSources({
    setPredicted: (id, on) => void log.push(`predict ${id} ${on}`),
    watch: (id, on) => void log.push(`watch ${id} ${on}`),
    resetRank: (id, r) => void log.push(`reset ${id}:${r}`),
    warn: (m) => void warnings.push(m),
    now: () => now,
  })
  return { s, log, warnings, advance: (ms: number) => void (now += ms) }
}

t.test('a worker with no event source: predicted, watched, warned once; its first event resets every rank', async (t) => {
  const { s, log, warnings } = setup()
  s.registered(info(7n, 2), false, false)
  t.same(log, ['predict 7 true', 'watch 7 true'])
  t.ok(s.has(7n))
  t.equal(s.ranks, 2)
  t.equal(warnings.length, 1)
  t.match(warnings[0], /worker 7 has no KV event source/)
  // registered again (a model card, a new rank): still waiting, no second warning or watch
  log.length = 0
  s.registered(info(7n, 3), false, false)
  t.same(log, ['predict 7 true'], 'its new ranks predicted too')
  t.equal(s.ranks, 3)
  t.equal(warnings.length, 1, 'warned once')
  log.length = 0
  s.evented(7n)
  t.same(log, ['watch 7 false', 'predict 7 false', 'reset 7:0', 'reset 7:1', 'reset 7:2'])
  t.notOk(s.has(7n))
  t.equal(s.firstEventsTotal, 1)
  log.length = 0
  s.evented(7n)
  s.registered(info(7n, 3), true, false)
  t.same(log, [], 'once evented, a second event or a re-registration changes nothing')
})

t.test('a worker whose events came before it registered is exact at once', async (t) => {
  const { s, log, warnings } = setup()
  s.registered(info(8n), true, false)
  t.same(log, [])
  t.notOk(s.has(8n))
  t.equal(warnings.length, 0)
})

t.test('a worker with a source that stays silent after requests is warned about once, after SILENT_AFTER_MS', async (t) => {
  const { s, warnings, advance } = setup()
  s.registered(info(9n), false, true)
  s.registered(info(10n, 1, { endpoint: 'tcp://127.0.0.1:5557', replay: null, topic: '' }), false, true)
  t.equal(warnings.length, 0, 'a worker with a source is not warned about at registration')
  advance(SILENT_AFTER_MS * 2)
  s.check()
  t.equal(warnings.length, 0, 'not routed to yet: an idle engine sends nothing')
  s.routed(9n)
  advance(SILENT_AFTER_MS - 1)
  s.check()
  t.equal(warnings.length, 0)
  advance(1)
  s.routed(9n)
  s.check()
  s.check()
  t.equal(warnings.length, 1)
  t.match(warnings[0], /worker 9 was sent requests 30 s ago and has published no KV events/)
  s.removed(9n)
  t.notOk(s.has(9n))
  t.equal(s.size, 1)
})
