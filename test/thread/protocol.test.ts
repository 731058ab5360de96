import t from 'tap'
import { readFileSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import * as R from '../../src/thread/records.js'
import { isShardMessage, type ShardMessage } from '../../src/thread/messages.js'
import * as P from '../../src/thread/protocol.js'
import { REJECT_REASON_COUNT } from '../../src/index/kv-index.js'
import { repoRoot } from '../helpers/paths.js'

const ROOT = repoRoot

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
  for (let w = P.C.received; w < P.C.end; w++) counters.push(w)
  const all = [...Object.values(mainHot), ...Object.values(mainQueries), ...Object.values(shardBatch), ...Object.values(shardBeat), ...counters]
  t.equal(new Set(all).size, all.length, 'no two words share a position')
  for (const w of all) t.ok(w >= 0 && w < P.QRING_BASE, `word ${w} lies before the query ring`)
  t.equal(P.E_BASE, P.QRING_BASE + P.QRING_SIZE, 'the engine counters follow the query ring')
  t.ok(P.E.end <= P.CTRL_WORDS)
  t.equal(P.E.skipped + P.ENGINE_SKIP_NAMES.length, P.E.duplicateStores, 'a skip word per reason')
  t.equal(P.E.malformed + P.ENGINE_MALFORMED_NAMES.length, P.E.end, 'a malformed word per reason')
  t.ok(P.C.rejected + 3 * REJECT_REASON_COUNT <= P.C.misplaced, 'the rejection counters of three event kinds fit between C.rejected and C.misplaced')
  t.ok(P.C.misplaced < P.C.end)
})

t.test('words written by different threads, or at different rates, sit on different cache lines', async (t) => {
  const groups = [mainHot, mainQueries, shardBatch, shardBeat, { counters: P.C.received, countersEnd: P.C.end - 1 }]
  const seen = new Map<number, number>()
  groups.forEach((g, i) => {
    for (const [name, w] of Object.entries(g)) {
      const s = stretch(w)
      const owner = seen.get(s)
      t.ok(owner === undefined || owner === i, `${name} (word ${w}) shares its 128-byte stretch only with its own group`)
      seen.set(s, i)
    }
  })
  t.ok(stretch(P.QRING_BASE) > stretch(P.C.end - 1), 'the query ring starts on a stretch of its own')
  t.ok(stretch(P.E_BASE) > stretch(P.QRING_BASE + P.QRING_SIZE - 1), 'the engine counters on a stretch of their own')
})

// ---- the ring records (src/thread/records.ts) ----

const kinds = Object.entries(R.RECORD_KINDS)

/** Duplicate opcodes among record kinds, as "op: a, b". */
function duplicateOps(ks: readonly [string, { op: number }][]): string[] {
  const byOp = new Map<number, string[]>()
  for (const [name, k] of ks) byOp.set(k.op, [...(byOp.get(k.op) ?? []), name])
  return [...byOp].filter(([, names]) => names.length > 1).map(([op, names]) => `${op}: ${names.join(', ')}`)
}

/** Fields of a record kind that overlap another or lie outside its fixed part. */
function badFields(k: { length: number; fields: Record<string, R.Field> }): string[] {
  const bad: string[] = []
  const fs = Object.entries(k.fields).sort(([, a], [, b]) => a.at - b.at)
  fs.forEach(([name, f], i) => {
    if (f.at < 0 || f.at + f.size > k.length) bad.push(`${name} [${f.at}, ${f.at + f.size}) outside [0, ${k.length})`)
    if (f.size === 4 && f.at % 4 !== 0) bad.push(`${name} at ${f.at} is not 4-aligned`)
    const next = fs[i + 1]
    if (next !== undefined && f.at + f.size > next[1].at) bad.push(`${name} [${f.at}, ${f.at + f.size}) overlaps ${next[0]} at ${next[1].at}`)
  })
  return bad
}

t.test('every record kind has its own opcode, and every event message is told from a record', async (t) => {
  t.same(duplicateOps(kinds), [], 'no two kinds share an opcode')
  t.same(duplicateOps([...kinds, ['planted', { op: R.RESET_RANK.op }]]), [`${R.RESET_RANK.op}: RESET_RANK, planted`], 'a duplicate is found')
  for (const [name, k] of kinds) {
    t.ok(Number.isInteger(k.op) && k.op >= 1 && k.op <= 255, `${name}: opcode ${k.op} is a nonzero byte`)
    const rec = R.newRecord(k)
    t.equal(R.recordOp(rec), k.op, `${name}: a new record reads back as its kind`)
    t.equal(rec.length, k.length)
  }
  t.equal(R.recordOp(new TextEncoder().encode('{"worker_id":1}')), 0, 'JSON is an event')
  t.equal(R.recordOp(Uint8Array.of(0x82, 0)), 0, 'MessagePack is an event')
})

t.test("each record kind's fields lie inside its fixed part and do not overlap", async (t) => {
  for (const [name, k] of kinds) {
    t.same(badFields(k), [], name)
    t.equal(k.fields.marker?.at, R.RECORD_MARKER_AT, `${name} starts with the marker`)
    t.equal(k.fields.op?.at, R.RECORD_OP_AT, `${name}: then the opcode`)
    for (const [f, spec] of Object.entries(k.fields)) t.equal((k.at as Record<string, number>)[f], spec.at, `${name}.at.${f}`)
  }
  const overlapping = { length: 12, fields: { a: { at: 4, size: 4 as const }, b: { at: 6, size: 1 as const } } }
  t.same(badFields(overlapping), ['a [4, 8) overlaps b at 6'], 'an overlap is found')
  t.same(badFields({ length: 8, fields: { a: { at: 8, size: 4 as const } } }), ['a [8, 12) outside [0, 8)'], 'a field past the end is found')
})

t.test('u32 fields read back what was written, little endian', async (t) => {
  const rec = new Uint8Array(8)
  R.writeU32(rec, 4, 0xdeadbeef)
  t.same([...rec.subarray(4)], [0xef, 0xbe, 0xad, 0xde])
  t.equal(R.readU32(rec, 4), 0xdeadbeef)
  const out = new Uint32Array(2)
  R.writeU32s(rec, 0, Uint32Array.of(1, 0xffffffff), 2)
  R.readU32s(rec, 0, out, 2)
  t.same([...out], [1, 0xffffffff])
})

// Offsets into a record written as numbers outside the table: on a buffer or DataView method, a
// u32 helper, or an index into a byte array.
const LITERAL_OFFSET = [
  /\.(?:get|set)(?:Big)?(?:Ui|I)nt(?:8|16|32|64)\(\s*\d+/g,
  /\.(?:get|set)Float(?:32|64)\(\s*\d+/g,
  /\.(?:read|write)(?:Big)?U?Int(?:8|16|32|64)(?:LE|BE)?\(\s*\d+/g,
  /\b(?:readU32s?|writeU32s?|u32|u64|readU64|writeU64)\(\s*[^,()]+,\s*\d+/g,
  /\b(?:bytes|rec|record|b|buf|buffer|msg|payload|v|view|data|head)\[\d+\]/g,
]
/** Numeric offsets that are not record offsets, per file: the first byte of an event message (JSON or MessagePack). */
const ALLOWED: Record<string, string[]> = { 'src/shards/partition.ts': ['msg[0]'] }

function literalOffsets(file: string, text: string): string[] {
  // comments may quote offsets; code may not
  const code = text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '')
  const found: string[] = []
  const lines = code.split('\n')
  lines.forEach((line, i) => {
    for (const re of LITERAL_OFFSET) {
      for (const m of line.matchAll(re)) if (!(ALLOWED[file] ?? []).includes(m[0])) found.push(`${file}:${i + 1}: ${m[0]}`)
    }
  })
  return found
}

function sources(dir: string): string[] {
  const out: string[] = []
  for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
    const p = `${dir}/${e.name}`
    if (e.isDirectory()) out.push(...sources(p))
    else if (e.name.endsWith('.ts')) out.push(p)
  }
  return out
}

t.test('no record offset is written as a number outside the table', async (t) => {
  const files = [...sources('src/shards'), ...sources('workers/shard')]
  t.ok(files.length >= 10, `${files.length} files scanned`)
  const found = files.flatMap((f) => literalOffsets(f, readFileSync(join(ROOT, f), 'utf8')))
  t.same(found, [], 'use the names of src/thread/records.ts')
  // the scan sees what it must
  const planted = [
    'v.getUint32(12, true)',
    'rec.setBigUint64(24, x, true)',
    'buf.readUInt32LE(16)',
    'readU32(bytes, 4)',
    'writeU32(rec, 16, ticket)',
    'if (bytes[2] === 1) x()',
    'rec[1] = op',
    'const flag = b[2] as number',
  ]
  for (const p of planted) t.equal(literalOffsets('x.ts', p).length, 1, `found: ${p}`)
  for (const ok of ['readU32(bytes, at.rank)', 'rec[PARK.at.flag] = 1', '// bytes[2] in a comment', 'ws[0]', 'msg[RECORD_MARKER_AT]'])
    t.same(literalOffsets('x.ts', ok), [], `not an offset: ${ok}`)
})

// ---- the shard's messages (src/thread/messages.ts) ----

t.test('a shard message is told from comlink traffic by its kind', async (t) => {
  const msgs: ShardMessage[] = [
    { kind: 'misplacedEvent', bytes: new Uint8Array(1), lo: 1, hi: 0 },
    { kind: 'logSample', what: 'events_malformed', fields: {} },
    { kind: 'engineNote', lo: 1, hi: 0, rank: 0, eventBlockSize: 32, routerBlockSize: 16 },
    { kind: 'gap', lo: 1, hi: 0, rank: 0, fromLo: 2, fromHi: 0, toLo: 5, toHi: 0, ticket: 1 },
  ]
  for (const m of msgs) t.ok(isShardMessage(m), m.kind)
  for (const m of [null, 1, 'gap', { id: 'x', type: 'RAW', value: 1 }, { kind: 'other' }, { gap: {} }]) t.notOk(isShardMessage(m), JSON.stringify(m))
})
