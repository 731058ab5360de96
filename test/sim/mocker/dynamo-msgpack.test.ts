// The Dynamo mode's MessagePack writer against the encodings rmp writes (3Hren/msgpack-rust
// rmp/src/encode: write_uint, write_sint, write_str_len, write_bin_len, write_map_len,
// write_array_len each pick the smallest form), byte for byte at every size boundary, and read
// back by msgpackr.
import t from 'tap'
import { Unpackr } from 'msgpackr'
import { MsgpackWriter } from '../../../src/sim/mocker/dynamo/msgpack-writer.js'

const hex = (h: string): string => h.replace(/\s+/g, '')
const w = new MsgpackWriter(4)
const bytes = (f: (w: MsgpackWriter) => void): string => {
  f(w.reset())
  return w.bytes().toString('hex')
}
const reader = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: 'bigint' })

t.test('unsigned integers: the smallest form', async (t) => {
  const cases: [number | bigint, string][] = [
    [0, '00'],
    [127, '7f'],
    [128, 'cc 80'],
    [255, 'cc ff'],
    [256, 'cd 01 00'],
    [65535, 'cd ff ff'],
    [65536, 'ce 00 01 00 00'],
    [0xffffffff, 'ce ff ff ff ff'],
    [0x100000000, 'cf 00 00 00 01 00 00 00 00'],
    [Number.MAX_SAFE_INTEGER, 'cf 00 1f ff ff ff ff ff ff'],
    [5n, '05'],
    [0xffffffffffffffffn, 'cf ff ff ff ff ff ff ff ff'],
  ]
  for (const [v, h] of cases) {
    t.equal(
      bytes((x) => x.uint(v)),
      hex(h),
      String(v),
    )
    t.equal(BigInt(reader.unpack(Buffer.from(hex(h), 'hex')) as number | bigint), BigInt(v), `${v} reads back`)
  }
  t.throws(() => w.uint(-1), RangeError)
  t.throws(() => w.uint(1.5), RangeError)
  t.throws(() => w.uint(1n << 64n), RangeError)
})

t.test('signed integers, floats, nil and booleans', async (t) => {
  const cases: [number, string][] = [
    [-1, 'ff'],
    [-32, 'e0'],
    [-33, 'd0 df'],
    [-128, 'd0 80'],
    [-129, 'd1 ff 7f'],
    [-32768, 'd1 80 00'],
    [-32769, 'd2 ff ff 7f ff'],
    [-2147483648, 'd2 80 00 00 00'],
    [-2147483649, 'd3 ff ff ff ff 7f ff ff ff'],
    [7, '07'],
  ]
  for (const [v, h] of cases) {
    t.equal(
      bytes((x) => x.int(v)),
      hex(h),
      String(v),
    )
    t.equal(Number(reader.unpack(Buffer.from(hex(h), 'hex')) as number), v)
  }
  t.equal(
    bytes((x) => x.float(1.5)),
    hex('cb 3f f8 00 00 00 00 00 00'),
  )
  t.equal(
    bytes((x) => x.nil().bool(true).bool(false)),
    hex('c0 c3 c2'),
  )
  t.throws(() => w.int(-0.5), RangeError)
})

t.test('strings, byte strings, maps and arrays at their size boundaries', async (t) => {
  const s31 = 'a'.repeat(31)
  const s32 = 'a'.repeat(32)
  const s256 = 'a'.repeat(256)
  const s65536 = 'a'.repeat(65536)
  t.equal(bytes((x) => x.str(s31)).slice(0, 2), 'bf')
  t.equal(bytes((x) => x.str(s32)).slice(0, 4), 'd920')
  t.equal(bytes((x) => x.str(s256)).slice(0, 6), 'da0100')
  t.equal(bytes((x) => x.str(s65536)).slice(0, 10), 'db00010000')
  t.equal(
    bytes((x) => x.str('é')),
    hex('a2 c3 a9'),
    'UTF-8 length, not characters',
  )
  t.equal(
    reader.unpack(
      Buffer.from(
        bytes((x) => x.str(s65536)),
        'hex',
      ),
    ),
    s65536,
  )
  t.equal(
    bytes((x) => x.bin(Buffer.from([1, 2]))),
    hex('c4 02 01 02'),
  )
  t.equal(bytes((x) => x.bin(Buffer.alloc(256))).slice(0, 6), 'c50100')
  t.equal(bytes((x) => x.bin(Buffer.alloc(65536))).slice(0, 10), 'c600010000')
  t.equal(
    bytes((x) => x.map(15)),
    '8f',
  )
  t.equal(
    bytes((x) => x.map(16)),
    hex('de 00 10'),
  )
  t.equal(
    bytes((x) => x.map(65536)),
    hex('df 00 01 00 00'),
  )
  t.equal(
    bytes((x) => x.array(15)),
    '9f',
  )
  t.equal(
    bytes((x) => x.array(16)),
    hex('dc 00 10'),
  )
  t.equal(
    bytes((x) => x.array(65536)),
    hex('dd 00 01 00 00'),
  )
})

t.test('value(): JSON-like values as serde would write them', async (t) => {
  const v = { a: null, b: [1, -2, 2.5, 'x', true], c: 2n ** 63n, d: new Uint8Array([9]), e: undefined }
  const h = bytes((x) => x.value(v))
  t.equal(
    h,
    hex(`84 a1 61 c0 a1 62 95 01 fe cb 40 04 00 00 00 00 00 00 a1 78 c3 a1 63 cf 80 00 00 00 00 00 00 00 a1 64 c4 01 09`),
    'undefined members left out',
  )
  t.same(reader.unpack(Buffer.from(h, 'hex')), { a: null, b: [1, -2, 2.5, 'x', true], c: 2n ** 63n, d: new Uint8Array([9]) })
  t.throws(() => w.value(() => 1), TypeError)
  t.throws(() => w.value(Symbol('s')), TypeError)
})
