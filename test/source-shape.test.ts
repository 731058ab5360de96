// Limits a reader relies on: no code line wider than the formatter's 160 columns (biome wraps
// code, not strings or comments), and no module under src/ so long that it does several jobs
// (the index is one data structure and may be longer).
import t from 'tap'
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { repoRoot } from './helpers/paths.js'

const root = `${repoRoot}/`
const WIDTH = 160
const MAX_MODULE_LINES = 950
const LONG_MODULES = new Set(['src/index/kv-index.ts'])

const tracked = execFileSync('git', ['ls-files', '--cached', '--others', '--exclude-standard'], { cwd: root, encoding: 'utf8' })
  .split('\n')
  .filter((f) => f !== '')
const code = tracked.filter((f) => /\.(ts|mjs|js|html|wat|sh)$/.test(f) || f === '.ci/run' || f === 'Dockerfile').filter((f) => !f.endsWith('-wasm.ts'))

function read(f: string): string | null {
  try {
    return readFileSync(join(root, f), 'utf8')
  } catch {
    return null // deleted in the working tree, not yet in git's index
  }
}

t.test(`no code line is wider than ${WIDTH} characters`, async (t) => {
  t.ok(code.length > 100, `${code.length} code files read`)
  const wide: string[] = []
  for (const f of code) {
    const text = read(f)
    if (text === null) continue
    text.split('\n').forEach((line, i) => {
      if (line.length > WIDTH) wide.push(`${f}:${i + 1} has ${line.length} characters`)
    })
  }
  t.same(wide, [])
})

t.test(`no module under src/ is over ${MAX_MODULE_LINES} lines`, async (t) => {
  const long: string[] = []
  for (const f of code.filter((f) => f.startsWith('src/') && f.endsWith('.ts') && !LONG_MODULES.has(f))) {
    const text = read(f)
    if (text === null) continue
    const lines = text.split('\n').length
    if (lines > MAX_MODULE_LINES) long.push(`${f} has ${lines} lines`)
  }
  t.same(long, [])
})
