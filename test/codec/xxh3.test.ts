// The WebAssembly XXH3 against the native xxHash binding (kept as a test oracle only): every
// length class, several seeds, whole prompts, memory growth, and the committed module matching
// its source.
import t from 'tap'
import { xxh3 } from '@node-rs/xxhash'
import { promptHashesInto, sequenceHashesInto, xxh3_64 } from '../../src/codec/hashing.js'
import { Rng } from '../helpers/rng.js'

const rng = new Rng(20261122)

function bytes(n: number): Uint8Array {
  const b = new Uint8Array(n)
  for (let i = 0; i < n; i++) b[i] = rng.int(256)
  return b
}

t.test('every length 0..2100 and lengths beyond several 1 KiB stripes-blocks, four seeds', async (t) => {
  const seeds = [0n, 1337n, 0xffffffffffffffffn, 0x9e3779b185ebca87n]
  const lengths = [...Array.from({ length: 2101 }, (_, i) => i), 4095, 4096, 4097, 65536 + 13, 200_000]
  let mismatches = 0
  let checked = 0
  for (const seed of seeds) {
    for (const len of lengths) {
      const b = bytes(len)
      if (xxh3_64(b, seed) !== xxh3.xxh64(Buffer.from(b), seed)) mismatches++
      checked++
    }
  }
  t.equal(mismatches, 0, `${checked} inputs agree with the native binding`)
  t.equal(xxh3_64('test data'), xxh3.xxh64('test data', 1337n), 'strings hash as their UTF-8 bytes')
})

t.test('a prompt at a time: local and sequence hashes as the per-block reference', async (t) => {
  for (const bs of [1, 3, 16, 64, 128, 1024]) {
    const count = bs * (1 + rng.int(40)) + rng.int(bs)
    const tokens = new Uint32Array(count)
    for (let i = 0; i < count; i++) tokens[i] = rng.int(2 ** 32)
    const n = Math.floor(count / bs)
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    const sLo = new Uint32Array(n)
    const sHi = new Uint32Array(n)
    t.equal(promptHashesInto(tokens, bs, lo, hi, sLo, sHi), n)
    const asArray = Array.from(tokens)
    const lo2 = new Uint32Array(n)
    const hi2 = new Uint32Array(n)
    promptHashesInto(asArray, bs, lo2, hi2)
    t.same(lo2, lo, `block size ${bs}: a plain array hashes as the typed array`)
    t.same(hi2, hi)
    let prev = 0n
    let bad = 0
    for (let b = 0; b < n; b++) {
      const block = Buffer.from(tokens.buffer, b * bs * 4, bs * 4)
      const local = xxh3.xxh64(block, 1337n)
      if (BigInt(lo[b] as number) + (BigInt(hi[b] as number) << 32n) !== local) bad++
      const pair = Buffer.alloc(16)
      pair.writeBigUInt64LE(prev, 0)
      pair.writeBigUInt64LE(local, 8)
      const seq = b === 0 ? local : xxh3.xxh64(pair, 1337n)
      if (BigInt(sLo[b] as number) + (BigInt(sHi[b] as number) << 32n) !== seq) bad++
      prev = seq
    }
    t.equal(bad, 0, `block size ${bs}, ${n} blocks`)
    const cLo = new Uint32Array(n)
    const cHi = new Uint32Array(n)
    sequenceHashesInto(lo, hi, n, cLo, cHi)
    t.same(cLo, sLo, 'sequenceHashesInto gives the same chain')
    t.same(cHi, sHi)
  }
})

t.test('a prompt far larger than the module memory grows it and still hashes right', async (t) => {
  const bs = 64
  const tokens = new Uint32Array(bs * 20_000)
  for (let i = 0; i < tokens.length; i++) tokens[i] = i * 2654435761
  const lo = new Uint32Array(20_000)
  const hi = new Uint32Array(20_000)
  promptHashesInto(tokens, bs, lo, hi)
  const last = xxh3.xxh64(Buffer.from(tokens.buffer, (20_000 - 1) * bs * 4, bs * 4), 1337n)
  t.equal(BigInt(lo[19_999] as number) + (BigInt(hi[19_999] as number) << 32n), last)
})
