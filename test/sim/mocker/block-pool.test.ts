import t from 'tap'
import { BlockPool, type AllocateResult, type RequestId } from '../../../src/sim/mocker/block-pool.js'
import { EventDecoder } from '../../../src/codec/event-decoder.js'
import { encodeRouterEvent, type RouterEvent } from '../../../src/codec/events.js'
import { computeSequenceHashes } from '../../../src/codec/hashing.js'
import { APPLY_OK, KvIndex } from '../../../src/index/kv-index.js'
import { Rng } from '../../helpers/rng.js'

// A prompt is a list of local block hashes; tests name them by small integers for legibility.
interface Prompt {
  lo: Uint32Array
  hi: Uint32Array
  n: number
  local: bigint[]
  seq: bigint[]
}

function prompt(local: readonly (bigint | number)[]): Prompt {
  const l = local.map((x) => BigInt(x))
  const lo = new Uint32Array(l.length)
  const hi = new Uint32Array(l.length)
  l.forEach((v, i) => {
    lo[i] = Number(v & 0xffffffffn)
    hi[i] = Number(v >> 32n)
  })
  return { lo, hi, n: l.length, local: l, seq: [...computeSequenceHashes(BigUint64Array.from(l))] }
}

function recorder(): { events: RouterEvent[]; sink: (ev: RouterEvent) => void } {
  const events: RouterEvent[] = []
  return { events, sink: (ev) => events.push(ev) }
}

function alloc(pool: BlockPool, id: RequestId, p: Prompt, n = p.n): AllocateResult {
  return pool.allocate(id, p.lo, p.hi, n)
}

function storedOf(ev: RouterEvent | undefined): { parent_hash: bigint | null; blocks: { block_hash: bigint; tokens_hash: bigint }[] } {
  const d = ev?.event.data
  if (d === undefined || d === 'cleared' || !('stored' in d))
    throw new Error(`expected a stored event, got ${JSON.stringify(d, (_, v: unknown) => (typeof v === 'bigint' ? String(v) : v))}`)
  return d.stored
}
function removedOf(ev: RouterEvent | undefined): bigint[] {
  const d = ev?.event.data
  if (d === undefined || d === 'cleared' || !('removed' in d)) throw new Error('expected a removed event')
  return d.removed.block_hashes
}

t.test('options are validated', async (t) => {
  t.throws(() => new BlockPool({ capacity: 0, blockSize: 64 }), /capacity/)
  t.throws(() => new BlockPool({ capacity: 1.5, blockSize: 64 }), /capacity/)
  t.throws(() => new BlockPool({ capacity: 4, blockSize: 0 }), /block size/)
  t.throws(() => new BlockPool({ capacity: 4, blockSize: 64, dpRank: -1 }), /dp_rank/)
  t.throws(() => new BlockPool({ capacity: 4, blockSize: 64, workerId: -1n }), /worker id/)
  t.throws(() => new BlockPool({ capacity: 4, blockSize: 64, workerId: 1n << 64n }), /worker id/)
  const p = new BlockPool({ capacity: 4, blockSize: 64 })
  t.equal(p.capacity, 4)
  t.equal(p.blockSize, 64)
  t.equal(p.workerId, 0n)
  t.equal(p.dpRank, 0)
  const q = prompt([1, 2])
  t.throws(() => p.allocate('r', q.lo, q.hi, 3), /block count 3/)
  t.throws(() => p.allocate('r', q.lo, q.hi, -1), /block count/)
  t.throws(() => p.prefixHits(q.lo, q.hi, 3), /block count 3 is not within the 2 hashes/)
})

t.test('a fresh prompt is stored as one chained event', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 8, blockSize: 64, workerId: 18446744073709551557n, dpRank: 3, sink })
  const p = prompt([11, 12, 13, 14])
  const r = alloc(pool, 'a', p)
  t.same(r, { ok: true, hits: 0, stored: 4, evicted: 0, needed: 4, available: 8 })
  t.equal(events.length, 1)
  const ev = events[0] as RouterEvent
  t.equal(ev.worker_id, 18446744073709551557n)
  t.equal(ev.event.event_id, 1n)
  t.equal(ev.event.dp_rank, 3)
  const s = storedOf(ev)
  t.equal(s.parent_hash, null)
  t.same(
    s.blocks.map((b) => b.block_hash),
    p.seq,
    'block_hash is the chained sequence hash',
  )
  t.same(
    s.blocks.map((b) => b.tokens_hash),
    p.local,
    'tokens_hash is the local hash',
  )
  t.equal(pool.used, 4)
  t.equal(pool.activeBlocks, 4)
  t.equal(pool.inactiveBlocks, 0)
  t.equal(pool.freeBlocks, 4)
  t.equal(pool.requestBlocks('a'), 4)
  t.equal(pool.runningRequests, 1)
  t.same(pool.cachedBlocks(), new Set(p.seq))
  t.equal(pool.nextEvent, 2)
  t.equal(pool.events, 1)
  t.equal(pool.storedBlocks, 4)
  t.equal(pool.misses, 4)
})

t.test('reusing cached blocks, active or inactive, emits nothing and counts hits', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 8, blockSize: 16, sink })
  const p = prompt([1, 2, 3])
  alloc(pool, 1, p)
  const seq2 = p.seq[2] as bigint
  const lo2 = Number(seq2 & 0xffffffffn)
  const hi2 = Number(seq2 >> 32n)
  t.equal(pool.refCount(lo2, hi2), 1)
  // while request 1 runs: the blocks are active
  const r2 = alloc(pool, 2, p)
  t.same([r2.ok, r2.hits, r2.stored], [true, 3, 0])
  t.equal(events.length, 1, 'no event for reusing active blocks')
  t.equal(pool.refCount(lo2, hi2), 2)
  t.equal(pool.activeBlocks, 3)
  t.ok(pool.release(1))
  t.ok(pool.release(2))
  t.equal(pool.refCount(lo2, hi2), 0)
  t.equal(pool.activeBlocks, 0)
  t.equal(pool.inactiveBlocks, 3)
  t.ok(pool.isCached(lo2, hi2))
  // after release: the blocks are inactive, and are reused from there
  const r3 = alloc(pool, 3, p)
  t.same([r3.hits, r3.stored], [3, 0])
  t.equal(events.length, 1, 'no event for reusing inactive blocks')
  t.equal(pool.activeBlocks, 3)
  t.equal(pool.hits, 6)
  t.equal(pool.misses, 3)
  t.notOk(pool.release('nobody'), 'unknown request')
  t.equal(pool.refCount(7, 7), -1)
  t.notOk(pool.isCached(7, 7))
})

t.test('a diverging prompt stores only its new tail, under the shared parent', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 8, blockSize: 16, sink })
  const a = prompt([1, 2, 3])
  const b = prompt([1, 2, 9, 10])
  alloc(pool, 'a', a)
  const r = alloc(pool, 'b', b)
  t.same([r.hits, r.stored], [2, 2])
  t.equal(events.length, 2)
  t.equal(events[1]?.event.event_id, 2n)
  const s = storedOf(events[1])
  t.equal(s.parent_hash, b.seq[1])
  t.same(
    s.blocks.map((x) => x.block_hash),
    b.seq.slice(2),
  )
  t.same(
    s.blocks.map((x) => x.tokens_hash),
    [9n, 10n],
  )
  t.equal(pool.used, 5)
  // a prompt whose first block differs shares nothing: the chain makes later equal blocks distinct
  const c = prompt([5, 2, 3])
  const rc = alloc(pool, 'c', c)
  t.same([rc.hits, rc.stored], [0, 3])
  t.equal(storedOf(events[2]).parent_hash, null)
})

t.test('a running request can be extended; the extension chains under its last block', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 8, blockSize: 16, sink })
  const full = prompt([1, 2, 3, 4, 5])
  const r1 = alloc(pool, 'x', full, 2)
  t.same([r1.hits, r1.stored], [0, 2])
  t.same(
    storedOf(events[0]).blocks.map((b) => b.block_hash),
    full.seq.slice(0, 2),
  )
  // another request caches block 3 of the same chain meanwhile
  alloc(pool, 'y', full, 3)
  t.equal(events.length, 2)
  t.equal(storedOf(events[1]).parent_hash, full.seq[1])
  const r2 = alloc(pool, 'x', full)
  t.same([r2.ok, r2.hits, r2.stored], [true, 1, 2], 'block 3 is a hit, 4 and 5 are new')
  t.equal(pool.requestBlocks('x'), 5)
  const s = storedOf(events[2])
  t.equal(s.parent_hash, full.seq[2])
  t.same(
    s.blocks.map((b) => b.block_hash),
    full.seq.slice(3),
    'the chain continues exactly as if the prompt had been allocated whole',
  )
  // an extension that stores from its first new block chains under the held block
  const other = prompt([1, 2, 3, 4, 5, 6])
  alloc(pool, 'z', other, 5)
  const r3 = alloc(pool, 'z', other)
  t.same([r3.hits, r3.stored], [0, 1])
  t.equal(storedOf(events[3]).parent_hash, other.seq[4])
  t.same(
    storedOf(events[3]).blocks.map((b) => b.block_hash),
    [other.seq[5]],
  )
  t.throws(() => alloc(pool, 'x', full, 4), /cannot shrink/)
  t.ok(pool.release('x'))
  t.ok(pool.release('y'))
  t.ok(pool.release('z'))
  t.equal(pool.activeBlocks, 0)
})

t.test('a request with no complete block is registered and released', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 2, blockSize: 64, sink })
  const empty = prompt([])
  t.same(alloc(pool, 'e', empty), { ok: true, hits: 0, stored: 0, evicted: 0, needed: 0, available: 2 })
  t.equal(pool.requestBlocks('e'), 0)
  t.equal(pool.requestBlocks('nope'), -1)
  t.ok(pool.release('e'))
  t.equal(events.length, 0)
})

t.test('eviction follows LRU order and emits one Removed before the Stored', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 4, blockSize: 16, sink })
  const a = prompt([1, 2])
  const b = prompt([3, 4])
  const c = prompt([5, 6])
  alloc(pool, 1, a)
  pool.release(1)
  alloc(pool, 2, b)
  pool.release(2)
  // a request's tail is released first, so it is older than its head
  t.same(pool.lruOrder(), [a.seq[1], a.seq[0], b.seq[1], b.seq[0]])
  // touching a makes it the most recent
  t.equal(alloc(pool, 3, a).hits, 2)
  pool.release(3)
  t.same(pool.lruOrder(), [b.seq[1], b.seq[0], a.seq[1], a.seq[0]])
  // the query does not touch the LRU
  t.equal(pool.prefixHits(b.lo, b.hi, b.n), 2)
  t.same(pool.lruOrder(), [b.seq[1], b.seq[0], a.seq[1], a.seq[0]])
  const before = events.length
  const r = alloc(pool, 4, c)
  t.same(r, { ok: true, hits: 0, stored: 2, evicted: 2, needed: 2, available: 4 })
  t.equal(events.length, before + 2, 'one Removed and one Stored')
  t.same(removedOf(events[before]), [b.seq[1], b.seq[0]], 'the two least recently used blocks, leaf first')
  t.same(
    storedOf(events[before + 1]).blocks.map((x) => x.block_hash),
    c.seq,
  )
  t.same(
    events.map((e) => e.event.event_id),
    events.map((_, i) => BigInt(i + 1)),
    'event ids are consecutive from 1',
  )
  t.same(pool.cachedBlocks(), new Set([...a.seq, ...c.seq]))
  t.equal(pool.evictions, 2)
  t.equal(pool.prefixHits(b.lo, b.hi, b.n), 0)
  t.equal(pool.used, 4)
})

t.test('with every block active, an allocation is refused and changes nothing', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 4, blockSize: 16, sink })
  const a = prompt([1, 2, 3])
  const b = prompt([7, 8])
  alloc(pool, 'a', a)
  const cached = pool.cachedBlocks()
  const r = alloc(pool, 'b', b)
  t.same(r, { ok: false, hits: 0, stored: 0, evicted: 0, needed: 2, available: 1 })
  t.equal(pool.preemptions, 1)
  t.equal(events.length, 1, 'no event')
  t.same(pool.cachedBlocks(), cached)
  t.equal(pool.requestBlocks('b'), -1, 'the refused request holds nothing')
  t.equal(pool.used, 3)
  t.equal(pool.activeBlocks, 3)
  // inactive blocks that the prompt itself reuses are not counted as room
  pool.release('a')
  const d = prompt([1, 2, 3, 4, 5])
  const rd = alloc(pool, 'd', d)
  t.same([rd.ok, rd.hits, rd.needed, rd.available], [false, 3, 2, 1], 'the 3 hits pin 3 of the 4 blocks')
  t.same(pool.lruOrder().length, 3, 'nothing was pinned by the refused allocation')
  // a prompt longer than the whole pool can never fit
  const big = prompt([21, 22, 23, 24, 25])
  t.equal(alloc(pool, 'big', big).ok, false)
  // once there is room it goes through, evicting one inactive block
  const rb = alloc(pool, 'b', b)
  t.same([rb.ok, rb.stored, rb.evicted], [true, 2, 1])
  t.same(removedOf(events[1]), [a.seq[2]])
  t.equal(pool.preemptions, 3)
})

// --- random workloads ------------------------------------------------------------------------

/** Straightforward reference pool: Maps, an array LRU, strings for hashes. */
class ModelPool {
  private cached = new Map<bigint, number>()
  private lru: bigint[] = []
  private reqs = new Map<RequestId, bigint[]>()
  constructor(private readonly capacity: number) {}

  allocate(id: RequestId, seq: bigint[]): { ok: boolean; hits: number; evicted: bigint[] } {
    const held = this.reqs.get(id) ?? []
    const part = seq.slice(held.length)
    let hits = 0
    let prefix = true
    let needed = 0
    let pinned = 0
    for (const h of part) {
      const c = this.cached.get(h)
      if (c === undefined) {
        prefix = false
        needed++
      } else {
        if (prefix) hits++
        if (c === 0) pinned++
      }
    }
    if (needed > this.capacity - this.cached.size + this.lru.length - pinned) return { ok: false, hits, evicted: [] }
    for (const h of part) {
      const c = this.cached.get(h)
      if (c === undefined) continue
      if (c === 0) this.lru.splice(this.lru.indexOf(h), 1)
      this.cached.set(h, c + 1)
    }
    const evicted: bigint[] = []
    for (const h of part) {
      if (this.cached.has(h)) continue
      if (this.cached.size === this.capacity) {
        const v = this.lru.shift() as bigint
        this.cached.delete(v)
        evicted.push(v)
      }
      this.cached.set(h, 1)
    }
    this.reqs.set(id, seq)
    return { ok: true, hits, evicted }
  }

  release(id: RequestId): void {
    const seq = this.reqs.get(id) as bigint[]
    this.reqs.delete(id)
    for (let i = seq.length - 1; i >= 0; i--) {
      const h = seq[i] as bigint
      const c = (this.cached.get(h) as number) - 1
      this.cached.set(h, c)
      if (c === 0) this.lru.push(h)
    }
  }

  cachedSet(): Set<bigint> {
    return new Set(this.cached.keys())
  }
  lruOrder(): bigint[] {
    return [...this.lru]
  }
}

interface Worker {
  pool: BlockPool
  model: ModelPool
  events: RouterEvent[]
  running: { id: number; p: Prompt; n: number }[]
  hits: number
}

t.test('random workloads: the pool matches a reference model, and its events rebuild it in the router index', async (t) => {
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    const rng = new Rng(seed * 7919)
    const capacity = 8 + rng.int(40)
    // a few worker-ranks share one router index, ids above 2^53 included
    const specs: [bigint, number][] = [
      [1n, 0],
      [18446744073709551000n, 0],
      [18446744073709551000n, 1],
    ]
    const workers: Worker[] = specs.map(([workerId, dpRank]) => {
      const events: RouterEvent[] = []
      return {
        pool: new BlockPool({ capacity, blockSize: 16, workerId, dpRank, sink: (ev) => events.push(ev) }),
        model: new ModelPool(capacity),
        events,
        running: [],
        hits: 0,
      }
    })
    // prompts share prefixes: each new one extends a random prefix of an earlier one
    const prompts: Prompt[] = [prompt([])]
    let fresh = 1
    // every sequence hash → the local hashes of the prefix it names
    const chainOf = new Map<bigint, bigint[]>()
    const newPrompt = (): Prompt => {
      const base = rng.pick(prompts)
      const keep = rng.int(base.n + 1)
      const local = base.local.slice(0, keep)
      const add = rng.int(6) + (keep === 0 ? 1 : 0)
      // occasionally a large hash, and repeats of earlier local hashes at other positions
      for (let i = 0; i < add; i++) local.push(rng.int(10) === 0 ? BigInt(fresh++) << 40n : rng.int(8) === 0 ? BigInt(1 + rng.int(fresh)) : BigInt(fresh++))
      const p = prompt(local)
      p.seq.forEach((s, i) => chainOf.set(s, p.local.slice(0, i + 1)))
      prompts.push(p)
      return p
    }
    let nextId = 0
    let overCapacity = 0
    let modelMismatch = 0
    let refused = 0
    let evictions = 0
    for (let step = 0; step < 1500; step++) {
      const w = rng.pick(workers)
      const op = rng.int(10)
      if (op < 5 || w.running.length === 0) {
        const p = rng.int(4) === 0 ? rng.pick(prompts) : newPrompt()
        const n = p.n === 0 ? 0 : rng.int(3) === 0 ? 1 + rng.int(p.n) : p.n
        const id = nextId++
        const before = w.events.length
        const r = alloc(w.pool, id, p, n)
        const m = w.model.allocate(id, p.seq.slice(0, n))
        if (r.ok !== m.ok || r.hits !== m.hits || r.evicted !== m.evicted.length) modelMismatch++
        const evs = w.events.slice(before)
        if (r.ok) {
          w.hits += r.hits
          w.running.push({ id, p, n })
          // Removed (if any) comes first and names what the model evicted, in LRU order
          const wantEvents = (m.evicted.length > 0 ? 1 : 0) + (n - r.hits > 0 ? 1 : 0)
          if (evs.length !== wantEvents) modelMismatch++
          if (m.evicted.length > 0 && JSON.stringify(removedOf(evs[0]).map(String)) !== JSON.stringify(m.evicted.map(String))) modelMismatch++
        } else {
          refused++
          if (evs.length !== 0) modelMismatch++
        }
      } else if (op < 8) {
        // extend a running request by a fresh block or two
        const k = rng.int(w.running.length)
        const run = w.running[k] as (typeof w.running)[number]
        const more: bigint[] = []
        for (let i = 0, c = 1 + rng.int(2); i < c; i++) more.push(BigInt(fresh++))
        const p = prompt([...run.p.local.slice(0, run.n), ...more])
        p.seq.forEach((s, i) => chainOf.set(s, p.local.slice(0, i + 1)))
        prompts.push(p)
        const r = alloc(w.pool, run.id, p)
        const m = w.model.allocate(run.id, p.seq)
        if (r.ok !== m.ok || r.hits !== m.hits || r.evicted !== m.evicted.length) modelMismatch++
        if (r.ok) {
          w.hits += r.hits
          w.running[k] = { id: run.id, p, n: p.n }
        }
      } else {
        const k = rng.int(w.running.length)
        const run = w.running[k] as (typeof w.running)[number]
        w.running.splice(k, 1)
        if (!w.pool.release(run.id)) modelMismatch++
        w.model.release(run.id)
      }
      if (w.pool.used > capacity || w.pool.activeBlocks > w.pool.used) overCapacity++
    }
    // release everything still running on one worker, so both states (active, inactive) end up checked
    const first = workers[0] as Worker
    for (const run of first.running) {
      first.pool.release(run.id)
      first.model.release(run.id)
    }
    first.running = []

    t.equal(overCapacity, 0, `seed ${seed}: never above capacity`)
    t.equal(modelMismatch, 0, `seed ${seed}: every allocation and release agrees with the model`)
    for (const w of workers) {
      evictions += w.pool.evictions
      t.same(w.pool.cachedBlocks(), w.model.cachedSet(), `seed ${seed}: same cached set as the model`)
      t.same(w.pool.lruOrder(), w.model.lruOrder(), `seed ${seed}: same LRU order as the model`)
      t.equal(w.pool.hits, w.hits, `seed ${seed}: the hit counter sums the allocations' hits`)
      // the cached set is closed under prefixes, which is what keeps the router's tree exact
      let orphans = 0
      for (const s of w.pool.cachedBlocks()) {
        const chain = chainOf.get(s) as bigint[]
        const pre = prompt(chain)
        if (w.pool.prefixHits(pre.lo, pre.hi, pre.n) !== pre.n) orphans++
      }
      t.equal(orphans, 0, `seed ${seed}: every cached block's ancestors are cached`)
    }
    t.ok(refused > 0 && evictions > 0, `seed ${seed}: the workload exercised refusals (${refused}) and evictions (${evictions})`)

    // Replay every worker's events, as JSON through the byte decoder, into one fresh index.
    const index = new KvIndex()
    const decoder = new EventDecoder()
    let rejected = 0
    for (const w of workers) {
      w.events.forEach((ev, i) => {
        if (ev.event.event_id !== BigInt(i + 1)) rejected++
      })
    }
    // interleave workers' streams: order across workers must not matter
    const queues = workers.map((w) => [...w.events])
    while (queues.some((q) => q.length > 0)) {
      const q = rng.pick(queues.filter((x) => x.length > 0))
      const ev = q.shift() as RouterEvent
      if (index.apply(decoder.decodeString(encodeRouterEvent(ev))) !== APPLY_OK) rejected++
    }
    t.equal(rejected, 0, `seed ${seed}: every event applies, ids consecutive from 1`)

    const sizes = new Map(index.treeSizes().map((s) => [`${s.worker_id}:${s.dp_rank}`, s.tree_size]))
    let badOverlap = 0
    let checked = 0
    for (const w of workers) {
      const key = `${w.pool.workerId}:${w.pool.dpRank}`
      t.equal(sizes.get(key) ?? 0, w.pool.used, `seed ${seed}: tree size of ${key} is the pool's cached count`)
      const overlapOf = (local: bigint[]): number =>
        index.overlapScores(local).find((s) => s.worker_id === w.pool.workerId && s.dp_rank === w.pool.dpRank)?.overlap_blocks ?? 0
      for (const s of w.pool.cachedBlocks()) {
        const chain = chainOf.get(s) as bigint[]
        const pre = prompt(chain)
        checked++
        if (overlapOf(chain) !== w.pool.prefixHits(pre.lo, pre.hi, pre.n)) badOverlap++
      }
      // and prompts in general, cached or not
      for (const p of prompts) {
        checked++
        if (overlapOf(p.local) !== w.pool.prefixHits(p.lo, p.hi, p.n)) badOverlap++
      }
    }
    t.ok(checked > 0)
    t.equal(badOverlap, 0, `seed ${seed}: index overlap equals pool prefix hits for ${checked} prompts`)
  }
})

t.test('long prompts and long extensions', async (t) => {
  const { events, sink } = recorder()
  const pool = new BlockPool({ capacity: 1000, blockSize: 16, sink })
  const long = prompt(Array.from({ length: 300 }, (_, i) => 1000 + i))
  const r1 = alloc(pool, 'a', long, 100)
  t.same([r1.ok, r1.stored], [true, 100])
  const r2 = alloc(pool, 'a', long)
  t.same([r2.ok, r2.hits, r2.stored], [true, 0, 200])
  t.equal(storedOf(events[1]).parent_hash, long.seq[99])
  t.same(
    storedOf(events[1]).blocks.map((b) => b.block_hash),
    long.seq.slice(100),
  )
  t.equal(pool.prefixHits(long.lo, long.hi, long.n), 300)
  const r3 = alloc(pool, 'b', long)
  t.same([r3.hits, r3.stored], [300, 0])
})

t.test('without a sink no events are built, yet ids still advance', async (t) => {
  const pool = new BlockPool({ capacity: 2, blockSize: 16 })
  const a = prompt([1, 2])
  const b = prompt([3])
  alloc(pool, 1, a)
  pool.release(1)
  alloc(pool, 2, b)
  t.equal(pool.events, 3, 'stored, removed, stored')
  t.equal(pool.nextEvent, 4)
  t.equal(pool.evictions, 1)
  t.same(pool.cachedBlocks(), new Set([a.seq[0], b.seq[0]]))
})

t.test('the hash table stays exact under heavy churn', async (t) => {
  // Thousands of distinct hashes through a small pool, all equal in their low 32 bits: every
  // eviction deletes from the middle of probe clusters, and every remaining block must stay
  // findable while every evicted one must be gone.
  const pool = new BlockPool({ capacity: 16, blockSize: 16 })
  const model = new ModelPool(16)
  const rng = new Rng(99)
  let wrong = 0
  for (let i = 0; i < 3000; i++) {
    const p = prompt([(BigInt(1 + rng.int(1000)) << 32n) | 5n])
    const r = alloc(pool, i, p)
    const m = model.allocate(i, p.seq)
    if (r.hits !== m.hits || r.evicted !== m.evicted.length) wrong++
    pool.release(i)
    model.release(i)
    for (const h of m.evicted) if (pool.isCached(Number(h & 0xffffffffn), Number(h >> 32n))) wrong++
    for (const h of model.cachedSet()) if (!pool.isCached(Number(h & 0xffffffffn), Number(h >> 32n))) wrong++
  }
  t.equal(wrong, 0)
  t.same(pool.cachedBlocks(), model.cachedSet())
  t.equal(pool.used, 16)
  t.ok(pool.hits > 0 && pool.evictions > 1000, 'both reuse and eviction happened')
})
