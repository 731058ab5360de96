import t from 'tap'
import * as P from '../../src/thread/protocol.js'
import { REJECT_REASON_COUNT } from '../../src/index/kv-index.js'

// Who writes each control word, and how often. The layout keeps words that different threads
// write often on separate 128-byte stretches; this test fails if a new word lands in the wrong
// group or two words share a position.
const mainHot = { RING_WRITE: P.RING_WRITE, PRODUCER_WAIT: P.PRODUCER_WAIT }
const mainQueries = { QRING_WRITE: P.QRING_WRITE, DOORBELL: P.DOORBELL, CONTROL_POSTED: P.CONTROL_POSTED }
const shardBatch = { RING_READ: P.RING_READ, QRING_READ: P.QRING_READ, SLEEPING: P.SLEEPING, STATE: P.STATE }
const shardBeat = { HEARTBEAT: P.HEARTBEAT }
const stretch = (w: number): number => Math.floor(w / 32)

t.test('every control word has its own position inside the block', async (t) => {
  const counters: number[] = []
  for (let w = P.C_RECEIVED; w < P.C_END; w++) counters.push(w)
  const all = [...Object.values(mainHot), ...Object.values(mainQueries), ...Object.values(shardBatch), ...Object.values(shardBeat), ...counters]
  t.equal(new Set(all).size, all.length, 'no two words share a position')
  for (const w of all) t.ok(w >= 0 && w < P.QRING_BASE, `word ${w} lies before the query ring`)
  t.equal(P.E_BASE, P.QRING_BASE + P.QRING_SIZE, 'the engine counters follow the query ring')
  t.ok(P.E_END <= P.CTRL_WORDS)
  t.equal(P.E_SKIPPED + P.ENGINE_SKIP_NAMES.length, P.E_DUPLICATE_STORES, 'a skip word per reason')
  t.equal(P.E_MALFORMED + P.ENGINE_MALFORMED_NAMES.length, P.E_END, 'a malformed word per reason')
  t.ok(P.C_REJECTED + 3 * REJECT_REASON_COUNT <= P.C_MISPLACED, 'the rejection counters of three event kinds fit between C_REJECTED and C_MISPLACED')
  t.ok(P.C_MISPLACED < P.C_END)
})

t.test('words written by different threads, or at different rates, sit on different cache lines', async (t) => {
  const groups = [mainHot, mainQueries, shardBatch, shardBeat, { counters: P.C_RECEIVED, countersEnd: P.C_END - 1 }]
  const seen = new Map<number, number>()
  groups.forEach((g, i) => {
    for (const [name, w] of Object.entries(g)) {
      const s = stretch(w)
      const owner = seen.get(s)
      t.ok(owner === undefined || owner === i, `${name} (word ${w}) shares its 128-byte stretch only with its own group`)
      seen.set(s, i)
    }
  })
  t.ok(stretch(P.QRING_BASE) > stretch(P.C_END - 1), 'the query ring starts on a stretch of its own')
  t.ok(stretch(P.E_BASE) > stretch(P.QRING_BASE + P.QRING_SIZE - 1), 'the engine counters on a stretch of their own')
})
