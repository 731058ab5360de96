// The index's open-addressing table under churn, against a Map: every live slot stays findable
// under its hash, removed ones vanish, and removals that empty a cell (instead of leaving a
// tombstone) never cut another key's probe chain. Small tables and few hash values force long
// chains, wrap-around and collisions. Seeded, so failures reproduce.
import t from 'tap'
import { SlotTable } from '../../src/index/slot-table.js'
import { Rng } from '../helpers/rng.js'

function findAll(table: SlotTable, hash: number): number[] {
  const out: number[] = []
  for (let s = table.first(hash); s !== -1; s = table.next()) out.push(s)
  return out
}

for (const seed of [1, 2, 3, 4]) {
  t.test(`random inserts and removes match a Map (seed ${seed})`, async (t) => {
    const r = new Rng(seed)
    const table = new SlotTable(16)
    // slot → hash; few distinct hashes so many slots share a home and a fingerprint
    const live = new Map<number, number>()
    const hashOf = (): number => (r.int(40) * 0x9e3779b1) | 0
    let nextSlot = 0
    let mismatches = 0
    let rebuilds = 0
    for (let step = 0; step < 20_000; step++) {
      if (live.size === 0 || r.next() < 0.55) {
        const slot = nextSlot++
        const h = hashOf()
        table.insert(h, slot)
        live.set(slot, h)
      } else {
        const keys = [...live.keys()]
        const slot = keys[r.int(keys.length)] as number
        if (!table.remove(live.get(slot) as number, slot)) mismatches++
        live.delete(slot)
      }
      if (table.needsRebuild) {
        rebuilds++
        table.reset(live.size)
        for (const [slot, h] of live) table.insert(h, slot)
      }
      if (step % 97 === 0) {
        for (const [slot, h] of live) if (!findAll(table, h).includes(slot)) mismatches++
      }
    }
    t.equal(mismatches, 0, 'every live slot found under its hash, every removal found its cell')
    t.equal(table.live, live.size, 'live count')
    t.ok(rebuilds > 0, 'the run crossed rebuilds')
    const all = [...table.liveSlots()].sort((a, b) => a - b)
    t.same(
      all,
      [...live.keys()].sort((a, b) => a - b),
      'liveSlots lists exactly the live slots',
    )
  })
}

t.test('removing the cell before an empty one empties it and the tombstones before it', async (t) => {
  const table = new SlotTable(64)
  // same hash: a run of consecutive cells
  const h = 12345
  for (let s = 0; s < 4; s++) table.insert(h, s)
  table.remove(h, 1) // middle: tombstone
  table.remove(h, 2) // middle: tombstone
  t.same(findAll(table, h), [0, 3], 'the chain still reaches past the tombstones')
  table.remove(h, 3) // last: it and the two tombstones before it become empty
  t.same(findAll(table, h), [0], 'only the first remains')
  // with tombstones gone, three inserts after the first cell do not count as more used cells
  for (let s = 10; s < 13; s++) table.insert(h, s)
  t.same(findAll(table, h), [0, 10, 11, 12])
  t.equal(table.live, 4)
})

t.test("peekHome names the slot in a hash's home cell, and -1 for an empty cell or a tombstone", async (t) => {
  const table = new SlotTable(64)
  const h = 0x12345678 | 0
  t.equal(table.peekHome(h), -1, 'empty')
  table.insert(h, 7)
  t.equal(table.peekHome(h), 7, 'the first key at its home')
  // a second key with the same hash lands one cell on: the home cell still names the first
  table.insert(h, 9)
  t.equal(table.peekHome(h), 7)
  // the largest slot with every fingerprint bit set is still told apart from the sentinels
  const top = 0xfc000000 | 0
  const t2 = new SlotTable(64)
  t2.insert(top, (1 << 26) - 3)
  t.equal(t2.peekHome(top), (1 << 26) - 3)
  t.ok(table.remove(h, 7))
  t.equal(table.peekHome(h), -1, 'a tombstone (the cell after it is still in use)')
  t.same(findAll(table, h), [9], 'and the probe still finds the second key')
})
