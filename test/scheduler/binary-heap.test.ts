// BinaryHeap against a model: a plain array of the handles in the heap, whose first element in
// (primary, secondary, tie) order must be what peek() and pop() give. Few distinct key values,
// so ties on one key or on both are common.
import t from 'tap'
import { BinaryHeap } from '../../src/scheduler/binary-heap.js'
import type { TieBreak } from '../../src/scheduler/binary-heap.js'
import { Xoshiro128 } from '../../src/scheduler/rng.js'

class Model {
  readonly in: number[] = []
  readonly p = new Map<number, number>()
  readonly s = new Map<number, number>()

  constructor(private readonly tie: TieBreak<unknown>) {}

  before(a: number, b: number): boolean {
    const pa = this.p.get(a) as number
    const pb = this.p.get(b) as number
    if (pa !== pb) return pa < pb
    const sa = this.s.get(a) as number
    const sb = this.s.get(b) as number
    if (sa !== sb) return sa < sb
    return this.tie(null, a, b)
  }

  first(): number {
    let best = -1
    for (const h of this.in) if (best < 0 || this.before(h, best)) best = h
    return best
  }

  take(h: number): void {
    this.in.splice(this.in.indexOf(h), 1)
  }
}

/** Pops everything, returning the handles in order. */
function drain<O>(heap: BinaryHeap<O>): number[] {
  const out: number[] = []
  while (heap.size > 0) out.push(heap.pop())
  return out
}

const byHandle: TieBreak<unknown> = (_owner, a, b) => a < b

t.test('empty heap', async (t) => {
  const heap = new BinaryHeap({ capacity: 0 })
  t.equal(heap.size, 0)
  t.equal(heap.peek(), -1)
  t.equal(heap.pop(), -1)
  t.notOk(heap.has(0))
  t.notOk(heap.has(-1))
  t.notOk(heap.has(1e9))
  t.notOk(heap.remove(0))
  t.notOk(heap.remove(1e9))
  heap.heapify()
  heap.clear()
  t.equal(heap.size, 0)
})

t.test('random operations against a sorted-array model', async (t) => {
  for (let seed = 1; seed <= 16; seed++) {
    const rng = new Xoshiro128(seed)
    // a quarter of the runs without positions: no has() or remove(), the rest must agree all the same
    const indexed = seed % 4 !== 0
    const heap = new BinaryHeap({ capacity: 1 + rng.int(8), tie: byHandle, indexed })
    const model = new Model(byHandle)
    // handles spread up to 5,000 so that the position and key arrays grow many times
    const span = seed % 2 === 0 ? 64 : 5000
    let popped = -1
    let mismatches = 0
    for (let step = 0; step < 4000; step++) {
      const r = rng.next()
      if (r < 0.45) {
        const h = rng.int(span)
        if (model.in.includes(h)) continue
        const p = rng.int(6) - 3
        const s = rng.int(4)
        heap.push(h, p, s)
        model.in.push(h)
        model.p.set(h, p)
        model.s.set(h, s)
      } else if (r < 0.7) {
        const want = model.first()
        const got = heap.pop()
        if (got !== want) mismatches++
        if (want >= 0) model.take(want)
        popped = got
      } else if (r < 0.9) {
        if (!indexed) continue
        // an arbitrary handle, in the heap or not
        const h = rng.next() < 0.7 && model.in.length > 0 ? (model.in[rng.int(model.in.length)] as number) : rng.int(span)
        const present = model.in.includes(h)
        if (heap.remove(h) !== present) mismatches++
        if (present) model.take(h)
      } else if (popped >= 0 && !model.in.includes(popped)) {
        heap.reinsert(popped)
        model.in.push(popped)
        popped = -1
      }
      if (heap.size !== model.in.length || heap.peek() !== model.first()) mismatches++
    }
    if (indexed) for (let h = 0; h < span; h++) if (heap.has(h) !== model.in.includes(h)) mismatches++
    const rest = drain(heap)
    const expected: number[] = []
    while (model.in.length > 0) {
      const h = model.first()
      expected.push(h)
      model.take(h)
    }
    t.same(rest, expected, `seed ${seed}: the rest drains in model order`)
    t.equal(mismatches, 0, `seed ${seed}: every pop, peek, size and remove agreed with the model`)
  }
})

t.test('a heap without positions refuses has() and remove()', async (t) => {
  const heap = new BinaryHeap({ indexed: false })
  heap.push(3, 1, 0)
  t.throws(() => heap.has(3), /indexed/)
  t.throws(() => heap.remove(3), /indexed/)
  t.equal(heap.pop(), 3)
})

t.test('ties: the secondary key, then the tie-break, then any order', async (t) => {
  // the tie-break reads the owner it is given
  const owner = { rank: [0, 1, 2, 3, 4, 5].map((h) => -h) }
  const heap = new BinaryHeap<typeof owner>({ capacity: 4, tie: (o, a, b) => (o.rank[a] as number) < (o.rank[b] as number), owner })
  // primary ties broken by the secondary key; full ties by the tie-break (higher handle first)
  for (const [h, p, s] of [
    [0, 1, 5],
    [1, 1, 2],
    [2, 0, 9],
    [3, 1, 2],
    [4, 1, 2],
    [5, 1, 7],
  ] as const) {
    heap.push(h, p, s)
  }
  t.same(drain(heap), [2, 4, 3, 1, 0, 5])
  // -0 and 0 are one key
  heap.push(1, 0, 1)
  heap.push(2, -0, 0)
  t.equal(heap.pop(), 2)
  t.equal(heap.pop(), 1)
  // without a tie-break, handles equal on both keys come out in some order, all of them
  const plain = new BinaryHeap()
  for (let h = 0; h < 100; h++) plain.push(h, h % 3, 0)
  const out = drain(plain)
  t.same(
    out.map((h) => h % 3),
    Array.from({ length: 100 }, (_, i) => (i < 34 ? 0 : i < 67 ? 1 : 2)),
  )
  t.same(
    [...out].sort((a, b) => a - b),
    Array.from({ length: 100 }, (_, i) => i),
  )
})

t.test('reinsert: a popped handle goes back with the keys it left with', async (t) => {
  const heap = new BinaryHeap({ capacity: 2, tie: byHandle })
  for (let h = 0; h < 10; h++) heap.push(h, 5, h)
  const h = heap.pop()
  t.equal(h, 0)
  t.equal(heap.primaryOf(h), 5, 'keys stay readable after the handle left')
  t.equal(heap.secondaryOf(h), 0)
  heap.push(10, 5, 0.5)
  heap.reinsert(h)
  t.same(drain(heap), [0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9])
})

t.test('removing every handle in random order keeps the heap valid', async (t) => {
  const rng = new Xoshiro128(99)
  const heap = new BinaryHeap({ capacity: 1, tie: byHandle })
  const n = 3000
  const keys = Array.from({ length: n }, () => rng.int(50))
  for (let h = 0; h < n; h++) heap.push(h, keys[h] as number, 0)
  const order = Array.from({ length: n }, (_, i) => i)
  for (let i = n - 1; i > 0; i--) {
    const j = rng.int(i + 1)
    ;[order[i], order[j]] = [order[j] as number, order[i] as number]
  }
  let bad = 0
  const left = new Set(order)
  for (let k = 0; k < n; k++) {
    const h = order[k] as number
    if (!heap.remove(h) || heap.has(h) || heap.remove(h)) bad++
    left.delete(h)
    // the top is still the smallest of what is left
    if (k % 97 === 0 && left.size > 0) {
      let best = -1
      for (const x of left) if (best < 0 || (keys[x] as number) < (keys[best] as number) || (keys[x] === keys[best] && x < best)) best = x
      if (heap.peek() !== best) bad++
    }
  }
  t.equal(bad, 0)
  t.equal(heap.size, 0)
  t.equal(heap.peek(), -1)
})

t.test('growth: sparse and large handles, starting from capacity 1', async (t) => {
  const heap = new BinaryHeap({ capacity: 1 })
  const handles = [0, 7, 1000, 3, 65_536, 12, 200_000, 1]
  handles.forEach((h, i) => heap.push(h, -i, 0))
  t.equal(heap.size, handles.length)
  for (const h of handles) t.ok(heap.has(h))
  t.notOk(heap.has(2))
  t.notOk(heap.has(199_999))
  t.equal(heap.primaryOf(200_000), -6)
  t.same(drain(heap), [...handles].reverse())
  for (const h of handles) t.notOk(heap.has(h), 'positions are cleared when handles leave')
})

t.test('heapify: bulk loading orders like one push at a time', async (t) => {
  // odd sizes on a heap without positions, as the expiry heap's rebuild uses it
  for (const n of [0, 1, 2, 3, 7, 8, 100, 101, 4096, 4097]) {
    const rng = new Xoshiro128(n + 1)
    const bulk = new BinaryHeap({ capacity: 1, tie: byHandle, indexed: n % 2 === 0 })
    const one = new BinaryHeap({ capacity: 1, tie: byHandle })
    for (let h = 0; h < n; h++) {
      const p = rng.int(20)
      const s = rng.next() < 0.5 ? 0 : rng.int(3)
      bulk.append(h, p, s)
      one.push(h, p, s)
    }
    bulk.heapify()
    t.equal(bulk.size, n)
    if (n % 2 === 0) {
      let has = true
      for (let h = 0; h < n; h++) has &&= bulk.has(h)
      t.ok(has, `n=${n}: every appended handle is in`)
    }
    t.same(drain(bulk), drain(one), `n=${n}`)
  }
})

t.test('clear: empties the heap and forgets positions; the heap is reusable', async (t) => {
  for (const indexed of [true, false]) {
    const heap = new BinaryHeap({ capacity: 4, tie: byHandle, indexed })
    for (let h = 0; h < 50; h++) heap.push(h, 50 - h, 0)
    heap.clear()
    t.equal(heap.size, 0)
    t.equal(heap.peek(), -1)
    if (indexed) {
      let anyLeft = false
      for (let h = 0; h < 50; h++) anyLeft ||= heap.has(h)
      t.notOk(anyLeft, 'no handle is still in')
      t.notOk(heap.remove(10))
    }
    // a rebuild: clear, bulk load, heapify
    for (let h = 40; h >= 0; h -= 2) heap.append(h, h % 5, h)
    heap.heapify()
    heap.push(1, 0, 100)
    t.same(drain(heap), [0, 10, 20, 30, 40, 1, 6, 16, 26, 36, 2, 12, 22, 32, 8, 18, 28, 38, 4, 14, 24, 34], `indexed: ${indexed}`)
  }
})
