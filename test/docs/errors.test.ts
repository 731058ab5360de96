// docs/errors.md's tables are the catalogue's: every error code with its status and summary, every
// warning code with its meaning, every retired code, in the catalogue's order, so that a code added
// or changed in src/errors.ts cannot leave them behind. And the catalogue is the source's: every
// KVR_* code written anywhere in src/ or workers/ is catalogued, every catalogued code is raised or
// emitted somewhere, and no code takes a retired name (fastify's rule: a code is never reused).
import t from 'tap'
import { readdirSync, readFileSync } from 'node:fs'
import { join, relative } from 'node:path'
import { ErrorCodes, RetiredCodes, Warn, WarningCodes } from '../../src/errors.js'
import { repoRoot } from '../helpers/paths.js'

const root = `${repoRoot}/`
const doc = readFileSync(join(root, 'docs', 'errors.md'), 'utf8')

function section(title: string): string {
  const start = doc.indexOf(`\n## ${title}\n`)
  if (start < 0) return ''
  const end = doc.indexOf('\n## ', start + 1)
  return doc.slice(start, end < 0 ? undefined : end)
}

/** A code in source text: KVR_ and capitals, not a prefix written as a pattern (`KVR_ERR_EVENT_*`, `KVR_ERR_…`). */
const CODE = /\bKVR_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])/g

function sourceFiles(dir: string): string[] {
  const out: string[] = []
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name)
    if (e.isDirectory()) out.push(...sourceFiles(p))
    else if (/\.(ts|js|mjs|html)$/.test(e.name)) out.push(p)
  }
  return out
}

/** kv-router's own environment variables (docs/configuration.md): named KVR_ too, but not codes. */
const variables = new Set(
  readFileSync(join(root, 'docs', 'configuration.md'), 'utf8')
    .split('\n')
    .filter((line) => line.startsWith('|'))
    .flatMap((line) => [...line.matchAll(/\| `(KVR_[A-Z0-9_]+)` \|/g)].map((m) => m[1])),
)

/** Every code written in src/ and workers/ (src/errors.ts apart), with the files that write it. */
function codesInSource(): Map<string, string[]> {
  const found = new Map<string, string[]>()
  const catalogue = join(root, 'src', 'errors.ts')
  for (const file of [...sourceFiles(join(root, 'src')), ...sourceFiles(join(root, 'workers'))]) {
    if (file === catalogue) continue
    for (const m of readFileSync(file, 'utf8').matchAll(CODE)) {
      if (variables.has(m[0])) continue
      const files = found.get(m[0]) ?? []
      const rel = relative(root, file)
      if (!files.includes(rel)) files.push(rel)
      found.set(m[0], files)
    }
  }
  return found
}

t.test('docs/errors.md lists the error catalogue exactly', async (t) => {
  const s = section('Catalogue')
  t.ok(s.length > 0, 'the doc has its catalogue section')
  const rows = [...s.matchAll(/^\| `(KVR_ERR_[A-Z_]+)` \| (\d+) \| (.*) \|$/gm)].map((m) => [m[1], Number(m[2]), m[3]])
  const expected = Object.entries(ErrorCodes).map(([code, v]) => [code, v.status, v.summary])
  t.ok(expected.length > 20, 'the catalogue was read')
  t.same(rows, expected)
})

t.test('docs/errors.md lists the warning codes exactly', async (t) => {
  const s = section('Warnings')
  t.ok(s.length > 0, 'the doc has its warnings section')
  const rows = [...s.matchAll(/^\| `(KVR_[A-Z_]+)` \| (.*) \|$/gm)].map((m) => [m[1], m[2]])
  t.ok(rows.length >= 8, 'the warnings table was read')
  t.same(rows, Object.entries(WarningCodes))
  for (const code of Object.keys(WarningCodes)) t.equal(Warn[code as keyof typeof Warn], code, `Warn.${code} is its own name`)
})

t.test('docs/errors.md lists the retired codes exactly', async (t) => {
  const s = section('Retired codes')
  t.ok(s.length > 0, 'the doc has its retired-codes section')
  const rows = [...s.matchAll(/^\| `(KVR_[A-Z_]+)` \| (.*) \|$/gm)].map((m) => [m[1], m[2]])
  t.same(rows, Object.entries(RetiredCodes))
})

t.test('no code is reused', async (t) => {
  const errors = Object.keys(ErrorCodes)
  const warnings = Object.keys(WarningCodes)
  const retired = Object.keys(RetiredCodes)
  t.same(
    errors.filter((c) => warnings.includes(c)),
    [],
    'no code is both an error and a warning',
  )
  t.same(
    [...errors, ...warnings].filter((c) => retired.includes(c)),
    [],
    'no code in use takes a retired name',
  )
  t.ok(
    errors.every((c) => c.startsWith('KVR_ERR_')),
    'error codes start KVR_ERR_',
  )
  t.ok(
    warnings.every((c) => c.startsWith('KVR_') && !c.startsWith('KVR_ERR_')),
    'warning codes start KVR_ and not KVR_ERR_',
  )
})

t.test('every code in src/ and workers/ is catalogued, and every catalogued code is used', async (t) => {
  t.ok(variables.has('KVR_CLUSTER_PORT') && variables.has('KVR_NATS_SERVER_BIN'), 'the environment variables were read')
  const found = codesInSource()
  t.ok(found.size > 30, `codes were found in the source (${found.size})`)
  const known = new Set([...Object.keys(ErrorCodes), ...Object.keys(WarningCodes)])
  for (const [code, files] of found) {
    t.notOk(code in RetiredCodes, `${code} is retired, yet written in ${files.join(', ')}`)
    t.ok(known.has(code), `${code} (in ${files.join(', ')}) is in src/errors.ts`)
    t.match(doc, `\`${code}\``, `${code} is in docs/errors.md`)
  }
  for (const code of known) t.ok(found.has(code), `${code} is raised or emitted somewhere in src/ or workers/`)
})

t.test('the scanner finds codes and skips patterns', async (t) => {
  const text = "log.warn({ code: 'KVR_NEW_THING' }); // throws KvrError (KVR_ERR_EVENT_*) as {code:'KVR_ERR_…'}; Warn.KVR_MOCKER"
  t.same(
    [...text.matchAll(CODE)].map((m) => m[0]),
    ['KVR_NEW_THING', 'KVR_MOCKER'],
  )
})
