// Every WebAssembly module the build script knows is committed as the assembly of its .wat: a
// .wat edited without `npm run build:wasm` fails here, whichever module it is.
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { rootUrl } from './helpers/paths.js'

const root = rootUrl
const script = fileURLToPath(new URL('scripts/build-wasm.mjs', root))
const { assemble, MODULES } = (await import(script)) as {
  assemble(path: string): Promise<string>
  MODULES: { wat: string; ts: string; name: string }[]
}

t.ok(MODULES.length >= 2, 'the hash and the token scanner, at least')
for (const m of MODULES) {
  t.test(`${m.ts} is the assembly of ${m.wat}`, async (t) => {
    const wat = fileURLToPath(new URL(m.wat, root))
    t.ok(readFileSync(wat, 'utf8').includes('(module'))
    const committed = (await import(new URL(`dist/${m.ts.replace(/\.ts$/, '.js')}`, root).href)) as Record<string, string>
    t.equal(await assemble(wat), committed[m.name], `run \`npm run build:wasm\` after editing ${m.wat}`)
  })
}
