// The mocker's host (CPU) offload tier: a block the device pool evicts is kept in the host tier
// with a Stored event of tier host_pinned; the host tier's own evictions are its Removed events;
// a request whose prefix continues in the host tier loads those blocks back (a device Stored,
// counted as cached, charged as loading rather than prefill). The events rebuild, in the router's
// index, exactly what both tiers hold.
import t from 'tap'
import { BlockPool } from '../../../src/sim/mocker/block-pool.js'
import { MockEngine, type StepReport } from '../../../src/sim/mocker/engine.js'
import { HOST_LOAD_COST, stepMs } from '../../../src/sim/mocker/timing.js'
import { type RouterEvent, toDecoded } from '../../../src/codec/events.js'
import { computeSequenceHashes } from '../../../src/codec/hashing.js'
import { KvIndex } from '../../../src/index/kv-index.js'
import { Rng } from '../../helpers/rng.js'

const BS = 4

interface Prompt {
  lo: Uint32Array
  hi: Uint32Array
  n: number
  local: bigint[]
  seq: bigint[]
  tokens: Uint32Array
}

/** A prompt of n blocks named by small local hashes; its tokens are the hash repeated. */
function prompt(local: readonly number[]): Prompt {
  const lo = Uint32Array.from(local)
  const tokens = new Uint32Array(local.length * BS)
  local.forEach((v, i) => tokens.fill(v, i * BS, (i + 1) * BS))
  const l = local.map(BigInt)
  return { lo, hi: new Uint32Array(local.length), n: local.length, local: l, seq: [...computeSequenceHashes(BigUint64Array.from(l))], tokens }
}

interface Got {
  ev: RouterEvent
  tokens: Uint32Array | undefined
}

function pool(capacity: number, hostCapacity: number): { pool: BlockPool; got: Got[] } {
  const got: Got[] = []
  return { pool: new BlockPool({ capacity, blockSize: BS, workerId: 5n, hostCapacity, sink: (ev, tokens) => got.push({ ev, tokens }) }), got }
}

/** tier, kind and block hashes of an event, for compact comparisons. */
function shape(g: Got): [string, string, bigint[]] {
  const d = g.ev.event.data
  const tier = g.ev.storage_tier ?? 'device'
  if (d === 'cleared') return [tier, 'cleared', []]
  if ('removed' in d) return [tier, 'removed', d.removed.block_hashes]
  return [tier, 'stored', d.stored.blocks.map((b) => b.block_hash)]
}

t.test('an evicted block goes to the host tier: device Removed, then host Stored with its parent and tokens', async (t) => {
  const { pool: p, got } = pool(3, 4)
  const a = prompt([1, 2, 3])
  p.allocate('a', a.lo, a.hi, 3, a.tokens)
  p.release('a')
  const b = prompt([7, 8])
  p.allocate('b', b.lo, b.hi, 2, b.tokens)
  // the chain's tail is evicted first (released last-first, see block-pool.ts)
  t.same(got.map(shape), [
    ['device', 'stored', a.seq],
    ['device', 'removed', [a.seq[2], a.seq[1]]],
    ['host_pinned', 'stored', [a.seq[2]]],
    ['host_pinned', 'stored', [a.seq[1]]],
    ['device', 'stored', b.seq],
  ])
  t.same(
    got.map((g) => g.ev.event.event_id),
    [1n, 2n, 3n, 4n, 5n],
    'one sequence of event ids over both tiers',
  )
  const host = got[2] as Got
  const d = host.ev.event.data as { stored: { parent_hash: bigint | null; blocks: { block_hash: bigint; tokens_hash: bigint }[] } }
  t.equal(d.stored.parent_hash, a.seq[1], "the block's parent, as on the device")
  t.equal(d.stored.blocks[0]?.tokens_hash, 3n, 'the same local hash')
  t.same(host.tokens, Uint32Array.from([3, 3, 3, 3]), "the block's token ids")
  t.same(p.host?.cachedBlocks(), new Set([a.seq[1], a.seq[2]]))
  t.equal(p.host?.stored, 2)
  // a block without a parent keeps none
  const c = prompt([9, 10, 11])
  p.release('b')
  p.allocate('c', c.lo, c.hi, 3, c.tokens)
  const first = got.find((g) => shape(g)[0] === 'host_pinned' && shape(g)[2][0] === a.seq[0])
  t.ok(first !== undefined, "the prompt's first block went to the host tier")
  t.equal((first?.ev.event.data as { stored: { parent_hash: bigint | null } } | undefined)?.stored.parent_hash, null, 'the first block: no parent')
})

t.test("the host tier's own evictions are Removed events of its tier, least recently used first", async (t) => {
  const { pool: p, got } = pool(2, 2)
  const prompts = [prompt([1, 2]), prompt([3, 4]), prompt([5, 6])]
  let before = 0
  prompts.forEach((q, i) => {
    before = got.length
    p.allocate(i, q.lo, q.hi, 2, q.tokens)
    p.release(i)
  })
  const [a, b, c] = prompts as [Prompt, Prompt, Prompt]
  // prompt 1 evicted a's two blocks into the host; prompt 2 evicted b's, which push a's out
  t.same(got.slice(before).map(shape), [
    ['device', 'removed', [b.seq[1], b.seq[0]]],
    ['host_pinned', 'removed', [a.seq[1], a.seq[0]]],
    ['host_pinned', 'stored', [b.seq[1]]],
    ['host_pinned', 'stored', [b.seq[0]]],
    ['device', 'stored', c.seq],
  ])
  t.same(p.host?.lruOrder(), [b.seq[1], b.seq[0]])
  t.equal(p.host?.evictions, 2)
})

t.test('more blocks offloaded at once than the host holds: only what it keeps is announced', async (t) => {
  const { pool: p, got } = pool(4, 1)
  const a = prompt([1, 2, 3, 4])
  p.allocate('a', a.lo, a.hi, 4, a.tokens)
  p.release('a')
  const b = prompt([5, 6, 7, 8])
  p.allocate('b', b.lo, b.hi, 4, b.tokens)
  t.same(got.slice(1).map(shape), [
    ['device', 'removed', [a.seq[3], a.seq[2], a.seq[1], a.seq[0]]],
    ['host_pinned', 'stored', [a.seq[0]]],
    ['device', 'stored', b.seq],
  ])
  t.same(p.host?.cachedBlocks(), new Set([a.seq[0]]))
})

t.test('a prefix continued in the host tier is loaded back: device Stored, the host keeps its copy', async (t) => {
  const { pool: p, got } = pool(3, 8)
  const a = prompt([1, 2, 3])
  p.allocate('a', a.lo, a.hi, 3, a.tokens)
  p.release('a')
  const b = prompt([7, 8])
  p.allocate('b', b.lo, b.hi, 2, b.tokens)
  p.release('b')
  // the device holds a's first block; the host its second and third
  t.equal(p.prefixHits(a.lo, a.hi, 3), 1)
  const seqLo = Uint32Array.from(a.seq.map((s) => Number(s & 0xffffffffn)))
  const seqHi = Uint32Array.from(a.seq.map((s) => Number(s >> 32n)))
  t.equal(p.hostRun(seqLo, seqHi, 1, 3), 2, 'the device match continues two blocks in the host tier')
  t.equal(p.hostRun(seqLo, seqHi, 0, 3), 0, 'a run starts where it is asked to')
  const before = got.length
  const r = p.allocate('a2', a.lo, a.hi, 3, a.tokens)
  t.same([r.ok, r.hits, r.stored], [true, 1, 2])
  t.equal(p.hostLoads, 2, 'two blocks loaded from the host tier')
  const after = got.slice(before).map(shape)
  t.same(after.at(-1), ['device', 'stored', [a.seq[1], a.seq[2]]], 'the loaded blocks are announced on the device, as vLLM does')
  t.notOk(
    after.some((s) => s[0] === 'host_pinned' && s[1] === 'removed'),
    'the host keeps its copy',
  )
  t.ok(p.host?.cachedBlocks().has(a.seq[1] as bigint))
  // evicted from the device again: already in the host, no second host Stored
  p.release('a2')
  const n = got.length
  const c = prompt([20, 21, 22])
  p.allocate('c', c.lo, c.hi, 3, c.tokens)
  t.notOk(
    got.slice(n).some((g) => shape(g)[0] === 'host_pinned' && shape(g)[2].includes(a.seq[1] as bigint)),
    'a block the host holds already is not stored twice',
  )
})

t.test('no host tier: no host events, hostRun is 0, and the capacity is checked', async (t) => {
  const { pool: p, got } = pool(2, 0)
  t.equal(p.host, null)
  const a = prompt([1, 2])
  p.allocate('a', a.lo, a.hi, 2, a.tokens)
  p.release('a')
  const b = prompt([3, 4])
  p.allocate('b', b.lo, b.hi, 2, b.tokens)
  t.same(
    got.map((g) => g.ev.storage_tier),
    [undefined, undefined, undefined],
  )
  t.notOk(
    got.some((g) => 'storage_tier' in g.ev),
    'device events have no storage_tier key at all',
  )
  t.equal(p.hostRun(a.lo, a.hi, 0, 2), 0)
  t.throws(() => new BlockPool({ capacity: 2, blockSize: BS, hostCapacity: -1 }), /host tier capacity/)
  t.throws(() => new BlockPool({ capacity: 2, blockSize: BS, hostCapacity: 1.5 }), /host tier capacity/)
})

t.test('random workloads: the events rebuild both tiers in the router index, with or without a sink', async (t) => {
  for (const seed of [1, 2, 3, 4]) {
    const rng = new Rng(seed * 104729)
    const capacity = 6 + rng.int(20)
    const hostCapacity = 1 + rng.int(30)
    const index = new KvIndex()
    const p = new BlockPool({ capacity, blockSize: BS, workerId: 9n, hostCapacity, sink: (ev) => index.apply(toDecoded(ev)) })
    // the same workload without a sink numbers the same events
    const quiet = new BlockPool({ capacity, blockSize: BS, workerId: 9n, hostCapacity })
    const running: number[] = []
    let loads = 0
    for (let i = 0; i < 800; i++) {
      if (running.length > 0 && (rng.int(2) === 0 || p.freeBlocks + p.inactiveBlocks < 6)) {
        const id = running.splice(rng.int(running.length), 1)[0] as number
        p.release(id)
        quiet.release(id)
        continue
      }
      const q = prompt(Array.from({ length: 1 + rng.int(5) }, (_, k) => (k === 0 ? 1 + rng.int(4) : 1 + rng.int(6))))
      const r = p.allocate(i, q.lo, q.hi, q.n, q.tokens)
      quiet.allocate(i, q.lo, q.hi, q.n)
      if (r.ok) running.push(i)
      loads = p.hostLoads
    }
    // what the index holds per tier, from its dump replayed
    const tiers = new Map<string, Set<bigint>>([
      ['device', new Set()],
      ['host_pinned', new Set()],
    ])
    for (const ev of index.dump()) {
      const set = tiers.get(ev.storage_tier ?? 'device') as Set<bigint>
      const d = ev.event.data
      if (d === 'cleared') continue
      if ('stored' in d) for (const b of d.stored.blocks) set.add(b.block_hash)
      else for (const h of d.removed.block_hashes) set.delete(h)
    }
    t.same(tiers.get('device'), p.cachedBlocks(), `seed ${seed}: the device tier`)
    t.same(tiers.get('host_pinned'), p.host?.cachedBlocks(), `seed ${seed}: the host tier (${p.host?.used} of ${hostCapacity} blocks)`)
    t.ok((p.host?.evictions ?? 0) > 0 && loads > 0, `seed ${seed}: host evictions (${p.host?.evictions}) and loads (${loads}) happened`)
    t.equal(quiet.events, p.events, `seed ${seed}: the same events without a sink`)
  }
})

t.test('the engine: a prompt evicted to the host tier is cached on its return, loaded at a third of a prefill token', async (t) => {
  const reports: StepReport[] = []
  const e = new MockEngine({ workerId: 3n, autoStep: false, blockSize: 16, numGpuBlocks: 8, numCpuBlocks: 16, onStep: (r) => reports.push(r) })
  const tokens = (from: number): number[] => Array.from({ length: 96 }, (_, i) => from + i)
  const a = e.submit(tokens(1), 1)
  e.runUntilIdle()
  t.equal(a.cachedTokens, 0)
  // two more prompts push all of it out of the device
  for (const from of [1000, 2000]) {
    e.submit(tokens(from), 1)
    e.runUntilIdle()
  }
  t.equal(e.pool.prefixHits(a.lo, a.hi, 6), 0, 'the first prompt left the device')
  t.equal(e.pool.hostRun(a.sLo, a.sHi, 0, 6), 6, 'for the host tier')
  reports.length = 0
  const again = e.submit(tokens(1), 1)
  e.runUntilIdle()
  // vLLM-like: the last block is recomputed when the whole prompt is cached; here all 6 blocks count
  t.equal(again.cachedTokens, 96, 'its 96 tokens count as cached')
  const first = reports[0] as StepReport
  t.equal(first.loadedTokens, 96, 'loaded from the host tier')
  t.equal(first.prefillTokens, 0, 'nothing computed')
  t.equal(e.pool.hostLoads, 6)
  const c = e.config
  t.equal(first.durationMs, stepMs({ prefillTokens: 0, prefillPairs: 0, decodes: 0, kvUsage: first.kvUsage, loadedTokens: 96 }, c))
  t.ok(first.durationMs < stepMs({ prefillTokens: 96, prefillPairs: 0, decodes: 0, kvUsage: 0 }, c), 'loading costs less than computing')
  t.equal(
    stepMs({ prefillTokens: 30, prefillPairs: 0, decodes: 0, kvUsage: 0, loadedTokens: 90 }, c),
    stepMs({ prefillTokens: 60, prefillPairs: 0, decodes: 0, kvUsage: 0 }, c),
  )
  t.equal(HOST_LOAD_COST, 1 / 3)
  t.throws(() => new MockEngine({ workerId: 1n, numCpuBlocks: -1 }), /num_cpu_blocks/)
})
