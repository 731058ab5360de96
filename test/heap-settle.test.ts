// settleHeap moves what is alive in the young generation to the old one, and keeps it alive.
import t from 'tap'
import { getHeapSpaceStatistics } from 'node:v8'
import { settleHeap } from '../src/heap-settle.js'

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
