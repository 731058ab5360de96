// The index's binary snapshot part (src/index/snapshot-format.ts, KvIndex.writeSnapshotPart and
// loadSnapshotPart): a part loaded into an empty index gives the same index (the same answers,
// tree sizes, last event ids, nodes, detached subtrees, and the same part written again), which
// then goes on exactly as the original under the same events; a part loaded for some of its
// worker-ranks, or into an index that holds others, equals replaying their dumps; and a part or
// a snapshot that is damaged anywhere is refused before anything is applied.
import t, { type Test } from 'tap'
import { crc32 } from 'node:zlib'
import { KvIndex, REJECT_REASON_NAMES, RejectReason } from '../../src/index/kv-index.js'
import { toDecoded, type RouterEvent } from '../../src/codec/events.js'
import {
  HEADER,
  PART_HEAD,
  SnapshotPart,
  TABLE_ROW,
  UP_DETACHED,
  UP_REF_MASK,
  assembleSnapshot,
  checkPart,
  readSnapshot,
  sealPart,
} from '../../src/index/snapshot-format.js'
import { isKvrError } from '../../src/errors.js'
import { Rng } from '../helpers/rng.js'
import { EventStream, WORKERS, randomQuery } from '../helpers/random-events.js'
import { chain, removed } from '../helpers/events.js'
import { dumpPaths } from '../helpers/dump-paths.js'

const status = (r: number): string => (r === 0 ? 'ok' : (REJECT_REASON_NAMES[r - 1] as string))

function sizes(ix: KvIndex, withIds = true): string {
  return ix
    .treeSizes()
    .map((s) => `${s.worker_id}:${s.dp_rank}=${s.tree_size}${withIds ? `@${s.last_event_id ?? '-'}` : ''}`)
    .sort()
    .join(' ')
}

function answers(ix: KvIndex, queries: bigint[][]): string {
  return queries
    .map((q) =>
      [false, true]
        .map((early) =>
          ix
            .overlapScores(q, early)
            .map((s) => `${s.worker_id}:${s.dp_rank}=${s.overlap_blocks}/${s.tree_size}`)
            .sort()
            .join(','),
        )
        .join('|'),
    )
    .join('\n')
}

function build(seed: number, steps: number): { ix: KvIndex; stream: EventStream } {
  const stream = new EventStream(new Rng(seed), WORKERS, 40)
  const ix = new KvIndex({ initialBlocks: 16 })
  for (let i = 0; i < steps; i++) step(ix, stream.next())
  return { ix, stream }
}

function step(ix: KvIndex, s: { ev?: RouterEvent; forget?: bigint }): string {
  if (s.ev !== undefined) return status(ix.apply(toDecoded(s.ev)))
  if (s.forget !== undefined) ix.removeWorker(Number(s.forget & 0xffffffffn), Number(s.forget >> 32n))
  return 'forget'
}

function loaded(part: Uint8Array, into = new KvIndex({ initialBlocks: 16 }), take?: (lo: number, hi: number, rank: number) => boolean): KvIndex {
  const p = checkPart(part)
  const marks = new Uint8Array(p.workers)
  for (let i = 0; i < p.workers; i++) marks[i] = take === undefined || take(p.workerIdLo(i), p.workerIdHi(i), p.workerRank(i)) ? 1 : 0
  into.loadSnapshotPart(p, marks)
  return into
}

function detachedNodes(part: Uint8Array): number {
  const p = new SnapshotPart(part)
  let n = 0
  for (let i = 0; i < p.nodes; i++) if (((p.up[i] as number) & UP_REF_MASK) === UP_DETACHED) n++
  return n
}

function sameIndex(t: Test, got: KvIndex, want: KvIndex, queries: bigint[][], what: string): void {
  t.equal(sizes(got), sizes(want), `${what}: every worker-rank, its tree size and last event id`)
  t.equal(got.liveEntries, want.liveEntries, `${what}: entries`)
  t.equal(got.liveNodes, want.liveNodes, `${what}: nodes`)
  t.equal(dumpPaths(got.dump()), dumpPaths(want.dump()), `${what}: every block on its path`)
  t.equal(answers(got, queries), answers(want, queries), `${what}: find_matches`)
}

for (const seed of [11, 12, 13]) {
  t.test(`seed ${seed}: a part loaded into an empty index is the same index, and goes on as it`, async (t) => {
    const rng = new Rng(seed * 7)
    const queries = Array.from({ length: 40 }, () => randomQuery(rng))
    const { ix, stream } = build(seed, 1500)
    let detached = 0
    for (let round = 0; round < 4; round++) {
      const part = ix.writeSnapshotPart()
      detached += detachedNodes(part)
      const copy = loaded(part)
      sameIndex(t, copy, ix, queries, `round ${round}`)
      t.equal(Buffer.compare(Buffer.from(copy.writeSnapshotPart()), Buffer.from(part)), 0, `round ${round}: the copy writes the same part, byte for byte`)
      // the same events from here give the same statuses and the same index
      const diverged: string[] = []
      for (let i = 0; i < 300; i++) {
        const s = stream.next()
        const a = step(ix, s)
        const b = step(copy, s)
        if (a !== b) diverged.push(`${i}: ${a} vs ${b}`)
      }
      t.same(diverged, [], `round ${round}: 300 more events apply alike`)
      sameIndex(t, copy, ix, queries, `round ${round}, 300 events later`)
    }
    t.ok(detached > 0, `the streams cut subtrees off the tree (${detached} detached tops written)`)
  })
}

t.test('worker-ranks registered without blocks, and the last event ids, survive', async (t) => {
  const ix = new KvIndex()
  ix.ensureWorker(5, 0, 3)
  ix.apply(toDecoded({ ...chain(6, null, [1, 2]), event: { ...chain(6, null, [1, 2]).event, event_id: 2n ** 63n + 5n } }))
  const copy = loaded(ix.writeSnapshotPart())
  t.equal(sizes(copy), `5:3=0@- 6:0=2@${2n ** 63n + 5n}`)
  const last = { lo: 0, hi: 0 }
  t.ok(copy.lastEventId(6, 0, 0, last))
  t.same(last, { lo: 5, hi: 0x80000000 }, 'lossless u64 halves')
})

t.test('a part loaded for some of its worker-ranks equals replaying their dumps', async (t) => {
  const rng = new Rng(99)
  const queries = Array.from({ length: 40 }, () => randomQuery(rng))
  const { ix } = build(21, 1200)
  const part = ix.writeSnapshotPart()
  const rank0 = (_lo: number, _hi: number, rank: number): boolean => rank === 0
  const got = loaded(part, undefined, rank0)
  const want = new KvIndex()
  for (const ev of ix.dump()) if (ev.event.dp_rank === 0) want.apply(toDecoded(ev))
  t.equal(
    sizes(got, false)
      .split(' ')
      .filter((s) => !s.endsWith('=0'))
      .join(' '),
    sizes(want, false),
    'tree sizes of the ranks taken',
  )
  t.equal(dumpPaths(got.dump()), dumpPaths(want.dump()), 'every block on its path')
  t.equal(answers(got, queries), answers(want, queries), 'find_matches')
  t.equal(got.liveEntries, want.liveEntries)
  t.ok(got.liveNodes - 1 <= got.liveEntries, 'no node without an entry')
})

t.test('into an index that holds other workers, a part replaces its worker-ranks and leaves the others', async (t) => {
  const rng = new Rng(5)
  const queries = Array.from({ length: 40 }, () => randomQuery(rng))
  const { ix } = build(31, 1000)
  const part = ix.writeSnapshotPart()
  // the target holds a worker of its own, and stale blocks of one the part names
  const mine: RouterEvent[] = [chain(424242, null, [1, 2, 3, 4]), chain(424242, 2, [5, 6]), chain(WORKERS[0] as bigint, null, [1, 2, 9])]
  const target = new KvIndex()
  for (const ev of mine) target.apply(toDecoded(ev))
  loaded(part, target)
  const want = new KvIndex()
  for (const ev of [...mine, ...ix.dump()]) want.apply(toDecoded(ev))
  // the dump's ranks replace the stale ones: the replay clears them the way a tree dump does
  const replayed = new KvIndex()
  for (const ev of mine.slice(0, 2)) replayed.apply(toDecoded(ev))
  for (const ev of ix.dump()) replayed.apply(toDecoded(ev))
  t.equal(dumpPaths(target.dump()), dumpPaths(replayed.dump()), 'every block on its path')
  t.equal(answers(target, queries), answers(replayed, queries), 'find_matches')
  t.equal(
    sizes(target, false),
    sizes(replayed, false)
      .split(' ')
      .concat(
        sizes(ix, false)
          .split(' ')
          .filter((s) => s.endsWith('=0')),
      )
      .sort()
      .join(' '),
  )
  t.not(dumpPaths(target.dump()), dumpPaths(want.dump()), 'the stale blocks are gone')
})

t.test('past the cap, entries are refused as capacity and no node is left empty', async (t) => {
  const { ix } = build(41, 800)
  const part = ix.writeSnapshotPart()
  const small = new KvIndex({ maxBlocks: 10 })
  const p = checkPart(part)
  const added = small.loadSnapshotPart(p, new Uint8Array(p.workers).fill(1))
  t.equal(added, 10)
  t.equal(small.liveEntries, 10)
  t.equal(small.rejectedByReason[RejectReason.Capacity], p.entries - 10, 'each refused entry counted')
  t.ok(small.liveNodes - 1 <= small.liveEntries, 'no node without an entry')
  t.equal(
    dumpPaths(small.dump())
      .split(/\s+/)
      .filter((x) => x.includes('=')).length,
    10,
    'its dump holds the 10',
  )
})

// ---- refusals ----

function refused(t: Test, fn: () => unknown, re: RegExp, what: string): void {
  try {
    fn()
    t.fail(`${what}: accepted`)
  } catch (err) {
    t.ok(isKvrError(err, 'KVR_ERR_SNAPSHOT_INVALID'), `${what}: KVR_ERR_SNAPSHOT_INVALID`)
    t.match((err as Error).message, re, what)
  }
}

t.test('a damaged part is refused whole', async (t) => {
  const ix = new KvIndex()
  ix.apply(toDecoded(chain(1, null, [1, 2, 3])))
  ix.apply(toDecoded(chain(2, 1, [4])))
  ix.apply(toDecoded(removed(1, [200])))
  const part = ix.writeSnapshotPart()
  t.doesNotThrow(() => checkPart(part))
  for (let at = 0; at < part.length; at += 7) {
    const bad = part.slice()
    bad[at] = (bad[at] as number) ^ 0x10
    t.throws(() => checkPart(bad), { code: 'KVR_ERR_SNAPSHOT_INVALID' }, `a bit flipped at byte ${at}`)
  }
  refused(t, () => checkPart(part.slice(0, part.length - 4)), /says it holds|truncated/, 'truncated')
  refused(t, () => checkPart(part.slice(0, 8)), /truncated/, 'truncated in its head')
  // damaged and sealed again (a writer's bug, not a transfer's): the references are checked too
  const edit = (fn: (p: SnapshotPart) => void): Uint8Array => {
    const p = new SnapshotPart(part.slice())
    fn(p)
    return sealPart(p)
  }
  refused(t, () => checkPart(edit((p) => (p.up[0] = 3))), /does not come before it/, 'a parent after its child')
  refused(t, () => checkPart(edit((p) => (p.up[1] = (p.up[1] as number) | 0x40000000))), /unknown flags/, 'a reserved bit')
  refused(t, () => checkPart(edit((p) => (p.count[0] = 0))), /no entry/, 'a node without an entry')
  refused(t, () => checkPart(edit((p) => (p.count[0] = (p.count[0] as number) + 1))), /hold \d+ entries, its head says/, 'counts that do not add up')
  refused(t, () => checkPart(edit((p) => (p.owner[0] = 9))), /names worker-rank 9 of 2/, 'an entry of no worker-rank')
  refused(
    t,
    () =>
      checkPart(
        edit((p) => {
          p.worker[6] = p.worker[0] as number
          p.worker[7] = p.worker[1] as number
        }),
      ),
    /twice/,
    'a worker-rank twice',
  )
})

t.test('a snapshot is refused when truncated, longer than it says, of another version or corrupt', async (t) => {
  const a = new KvIndex()
  a.apply(toDecoded(chain(1, null, [1, 2])))
  const b = new KvIndex()
  b.apply(toDecoded(chain(2, null, [3])))
  const snap = assembleSnapshot([a.writeSnapshotPart(), new KvIndex().writeSnapshotPart(), b.writeSnapshotPart()])
  const parts = readSnapshot(snap)
  t.same(
    parts.map((p) => [p.workers, p.nodes, p.entries]),
    [
      [1, 2, 2],
      [0, 0, 0],
      [1, 1, 1],
    ],
  )
  for (const p of parts) t.equal(p.offset % 8, 0, 'parts 8-aligned')
  for (const p of parts) t.doesNotThrow(() => checkPart(snap.subarray(p.offset, p.offset + p.length)))
  for (const n of [0, 5, HEADER.bytes - 1, HEADER.bytes + 3, snap.length - 1])
    refused(t, () => readSnapshot(snap.subarray(0, n)), n < 8 ? /not a kv-router binary snapshot/ : /truncated/, `truncated to ${n} bytes`)
  refused(t, () => readSnapshot(Buffer.concat([snap, Buffer.alloc(8)])), /header says/, 'bytes past its end')
  // every byte counts: the padding between parts and after the last is zero
  const padded = parts.map((p) => p.offset + p.length).filter((end) => end % 8 !== 0)
  t.ok(padded.length > 0, 'a part ends before an 8-byte boundary')
  for (const end of padded) {
    const c = snap.slice()
    c[end] = 1
    refused(t, () => readSnapshot(c), /between its parts, is not zero/, `a byte of padding at ${end} set`)
  }
  const patch = (at: number, v: number): Uint8Array => {
    const c = snap.slice()
    new DataView(c.buffer).setUint32(at, v, true)
    return c
  }
  refused(t, () => readSnapshot(patch(HEADER.version, 3)), /version 3; this router reads versions 1 and 2/, 'version 3')
  refused(t, () => readSnapshot(patch(HEADER.bytes + TABLE_ROW.length, 24)), /checksum of its header/, 'a part table changed')
  // changed and sealed again: a reserved field is refused, not ignored
  const resealed = patch(HEADER.bytes + TABLE_ROW.reserved, 1)
  new DataView(resealed.buffer).setUint32(
    HEADER.crc,
    crc32(resealed.subarray(HEADER.bytes, HEADER.bytes + TABLE_ROW.bytes * parts.length), crc32(resealed.subarray(0, HEADER.crc))),
    true,
  )
  refused(t, () => readSnapshot(resealed), /unknown fields/, 'a reserved field set')
  const flipped = snap.slice()
  flipped[3] = 0x41
  refused(t, () => readSnapshot(flipped), /not a kv-router binary snapshot/, 'another magic')
  refused(t, () => readSnapshot(Buffer.from('[{"worker_id":1}]')), /not a kv-router binary snapshot/, 'JSON')
  // a part's bytes damaged: the header still reads, the part's own checksum refuses it
  const p0 = parts[0] as { offset: number }
  const damaged = snap.slice()
  damaged[p0.offset + PART_HEAD.bytes + 1] = (damaged[p0.offset + PART_HEAD.bytes + 1] as number) ^ 1
  const again = readSnapshot(damaged)[0] as { offset: number; length: number }
  refused(t, () => checkPart(damaged.subarray(again.offset, again.offset + again.length)), /checksum does not match/, 'a part damaged')
})
