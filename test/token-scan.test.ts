// The WebAssembly token-id scanner on its own: exact ids for valid arrays, null (the JS scanner
// takes over) for everything else, and the committed module equal to its .wat.
import t from 'tap'
import { fileURLToPath } from 'node:url'
import { scanPlainTokens, scannedEnd } from '../src/shared/token-scan.js'
import { TOKEN_SCAN_WASM_BASE64 } from '../src/shared/token-scan-wasm.js'

const bytes = (s: string): Uint8Array => new Uint8Array(Buffer.from(s))

t.test('valid arrays: the ids JSON.parse reads, and the offset past "]"', async (t) => {
  let x = 0x2545f491
  const next = (): number => {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    return x >>> 0
  }
  const spaces = ['', ' ', '\n', '\t', '\r\n  ']
  for (let round = 0; round < 300; round++) {
    const ids = Array.from({ length: 1 + (next() % 500) }, () => (next() % 7 === 0 ? 4294967295 : Math.floor((next() / 4294967296) * 10 ** (1 + (next() % 10)))) % 4294967296)
    const sep = (): string => spaces[next() % spaces.length] as string
    const text = `[${ids.map((v) => `${v}${sep()}`).join(`,${sep()}`)}]  , "x": 1}`
    const got = scanPlainTokens(bytes(text), 1)
    t.same(got === null ? null : [...got], ids)
    t.equal(scannedEnd, text.indexOf(']') + 1)
  }
})

t.test('anything else is left to the JS scanner', async (t) => {
  for (const bad of ['01]', '4294967296]', '99999999999]', '12345678901234567890]', '1.5]', '1e3]', '-1]', '"1"]', 'null]', '1,]', '1 2]', '1,2', '1,2}', ']', '', '1;2]']) {
    t.equal(scanPlainTokens(bytes(`[${bad}`), 1), null, bad)
  }
  t.same([...(scanPlainTokens(bytes('[0,4294967295]'), 1) as Uint32Array)], [0, 4294967295], 'the edges')
})

t.test('large inputs grow the module memory', async (t) => {
  const ids = Array.from({ length: 300_000 }, (_, i) => (i * 2654435761) % 4294967296)
  const got = scanPlainTokens(bytes(`[${ids.join(',')}]`), 1)
  t.equal(got?.length, ids.length)
  t.equal(got?.[299_999], ids[299_999])
})

t.test('the committed module is the assembly of token-scan.wat', async (t) => {
  const script = fileURLToPath(new URL('../scripts/build-wasm.mjs', import.meta.url))
  const { assemble } = (await import(script)) as { assemble(path: string): Promise<string> }
  const wat = fileURLToPath(new URL('../src/shared/token-scan.wat', import.meta.url))
  t.equal(await assemble(wat), TOKEN_SCAN_WASM_BASE64, 'run `npm run build:wasm` after editing src/shared/token-scan.wat')
})
