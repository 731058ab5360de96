// settleHeap moves what is alive in the young generation to the old one, and keeps it alive.
import t from 'tap'
import { getHeapSpaceStatistics } from 'node:v8'
import { settleHeap } from '../../src/runtime/heap-settle.js'

const used = (space: string): number => getHeapSpaceStatistics().find((s) => s.space_name === space)?.space_used_size ?? NaN

t.test('young survivors move to the old generation', async (t) => {
  const keep: { i: number; pair: number[] }[] = []
  for (let i = 0; i < 100_000; i++) keep.push({ i, pair: [i, i + 1] })
  const youngBefore = used('new_space')
  const oldBefore = used('old_space')
  const ms = settleHeap()
  t.type(ms, 'number', 'a full GC could be run')
  t.ok((ms as number) >= 0)
  t.ok(used('new_space') < youngBefore / 4, `young generation emptied (${youngBefore} -> ${used('new_space')} bytes)`)
  t.ok(used('old_space') > oldBefore, 'the survivors are in the old generation')
  t.equal(keep.length, 100_000)
  t.equal(keep[99_999]?.pair[1], 100_000, 'and still alive')
  t.type(settleHeap(), 'number', 'a second call works as well')
})

// Why a tick must be queued while the GC runs, and what a GC on an empty queue costs every
// nextTick after it: src/runtime/heap-settle.ts. The GC is replaced by one that
// counts the tick records alive at the moment it runs (fullGc takes globalThis.gc when there is one).
t.test('the full GC runs while a tick record is alive', async (t) => {
  const { createHook } = await import('node:async_hooks')
  const queued = new Set<number>()
  const hook = createHook({
    init(id, type) {
      if (type === 'TickObject') queued.add(id)
    },
    before(id) {
      queued.delete(id)
    },
  })
  // let ticks queued before the hook existed run, so that what is counted is settleHeap's own
  await new Promise((r) => setImmediate(r))
  const g = globalThis as { gc?: unknown }
  const realGc = g.gc
  let aliveAtGc = -1
  g.gc = () => {
    aliveAtGc = queued.size
  }
  hook.enable()
  try {
    try {
      t.type(settleHeap(), 'number')
    } finally {
      if (realGc === undefined) delete g.gc
      else g.gc = realGc
    }
    t.ok(aliveAtGc >= 1, `${aliveAtGc} tick record(s) alive while the GC ran`)
    await new Promise((r) => setImmediate(r))
    t.equal(queued.size, 0, 'and the held tick has run since')
  } finally {
    hook.disable()
  }
})
