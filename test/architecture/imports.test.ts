// Imports flow one way: every relative import in src/, workers/, support/, bench/, test/ and
// scripts/ goes to its own row of docs/architecture.md's import-direction table or a row below it.
// The table is read from the document, so the rule and its description cannot drift apart; a
// failure names the file and line of each import that runs upwards.
import t from 'tap'
import { readdirSync, readFileSync } from 'node:fs'
import { join, posix } from 'node:path'
import { repoRoot } from '../helpers/paths.js'

const root = `${repoRoot}/`
const DOC = 'docs/architecture.md'
const HEADING = '## Import direction'
/** Where the code is; each file must fall in a row of the table. */
const TREES = ['src', 'workers', 'support', 'bench', 'test', 'scripts']
const CODE = /\.(?:ts|mts|mjs|js)$/

interface Row {
  name: string
  /** Row index: 0 is the top. */
  rank: number
  /** Paths: a directory ends with '/', anything else is one file. */
  paths: string[]
  /** Paths this row may not import even though they are below it. */
  never: string[]
}

const paths = (cell: string): string[] => [...cell.matchAll(/`([^`]+)`/g)].map((m) => m[1] as string)

/** The rows of the table under `heading` in a markdown text, top first. */
function readTable(markdown: string, heading = HEADING): Row[] {
  const at = markdown.indexOf(`\n${heading}\n`)
  if (at < 0) throw new Error(`no "${heading}" section`)
  const rest = markdown.slice(at + heading.length + 2)
  const end = rest.search(/\n## /)
  const lines = (end < 0 ? rest : rest.slice(0, end)).split('\n').filter((l) => l.startsWith('|'))
  const rows: Row[] = []
  for (const line of lines.slice(2)) {
    const cells = line.split('|').slice(1, -1)
    const [name, modules, never] = cells.map((c) => c.trim())
    if (name === undefined || modules === undefined) throw new Error(`a row without modules: ${line}`)
    rows.push({ name, rank: rows.length, paths: paths(modules), never: paths(never ?? '') })
  }
  return rows
}

/** The row a repository path belongs to: the one naming the longest path that holds it. */
function rowOf(rows: readonly Row[], file: string): Row | undefined {
  let best: Row | undefined
  let bestLength = -1
  for (const row of rows)
    for (const p of row.paths)
      if ((p.endsWith('/') ? file.startsWith(p) : file === p || file === p.replace(/\.ts$/, '')) && p.length > bestLength) {
        best = row
        bestLength = p.length
      }
  return best
}

/** A relative import: where it goes (a repository path) and the line it is on. */
interface Import {
  target: string
  line: number
}

/** Every relative import, export-from, side-effect import, dynamic import and require of a source text. */
function importsOf(file: string, text: string): Import[] {
  const out: Import[] = []
  const specifier = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+|\brequire\s*\(\s*)(['"])(\.\.?\/[^'"]+)\1/g
  for (const m of text.matchAll(specifier)) {
    const spec = m[2] as string
    const line = text.slice(0, m.index).split('\n').length
    let target = posix.normalize(posix.join(posix.dirname(file), spec))
    // compiled output stands for its source
    if (target.startsWith('dist/')) target = target.slice('dist/'.length)
    out.push({ target: target.replace(/\.js$/, '.ts'), line })
  }
  return out
}

/** `file:line: what` for each import that runs upwards or to a forbidden place, and each file in no row. */
function violations(rows: readonly Row[], files: ReadonlyMap<string, string>): string[] {
  const out: string[] = []
  for (const [file, text] of files) {
    const from = rowOf(rows, file)
    if (from === undefined) {
      out.push(`${file}: in no row of the table in ${DOC}`)
      continue
    }
    for (const { target, line } of importsOf(file, text)) {
      const to = rowOf(rows, target)
      // outside the code (package.json, deploy/ files, data): not a layer
      if (to === undefined) continue
      const forbidden = from.never.find((p) => (p.endsWith('/') ? target.startsWith(p) : target === p))
      if (forbidden !== undefined) out.push(`${file}:${line}: imports ${target}, and ${from.name} never import ${forbidden}`)
      else if (to.rank < from.rank) out.push(`${file}:${line}: imports ${target}: ${from.name} → ${to.name}, a row above`)
    }
  }
  return out
}

function walk(dir: string, out: Map<string, string>): void {
  for (const e of readdirSync(join(root, dir), { withFileTypes: true })) {
    const rel = `${dir}/${e.name}`
    if (e.isDirectory()) walk(rel, out)
    else if (CODE.test(e.name)) out.set(rel, readFileSync(join(root, rel), 'utf8'))
  }
}

const rows = readTable(readFileSync(join(root, DOC), 'utf8'))

t.test(`the table in ${DOC}`, async (t) => {
  t.ok(rows.length >= 10, `${rows.length} rows`)
  for (const tree of TREES)
    t.ok(
      rows.some((r) => r.paths.some((p) => p.startsWith(`${tree}/`))),
      `${tree}/ is in the table`,
    )
  t.ok(rowOf(rows, 'src/errors.ts')?.rank === rows.length - 1, 'the errors are at the bottom')
  const order = ['src/main.ts', 'src/cli/x.ts', 'src/app.ts', 'src/http/x.ts', 'src/core/x.ts', 'src/transport/x.ts', 'src/thread/x.ts', 'src/codec/x.ts']
  const ranks = order.map((f) => rowOf(rows, f)?.rank ?? -1)
  t.same(
    ranks,
    [...ranks].sort((a, b) => a - b),
    `${order.join(' → ')} run downwards`,
  )
  t.ok((rowOf(rows, 'src/sim/x.ts')?.rank ?? 99) < (rowOf(rows, 'src/app.ts')?.rank ?? -1), 'the simulators are above the router')
})

t.test('every relative import runs downwards', async (t) => {
  const files = new Map<string, string>()
  for (const tree of TREES) walk(tree, files)
  const imports = [...files].reduce((n, [file, text]) => n + importsOf(file, text).length, 0)
  t.ok(files.size > 200 && imports > 1000, `${files.size} files, ${imports} relative imports`)
  const found = violations(rows, files)
  t.same(found, [], found.length === 0 ? 'none runs upwards' : `${found.length} run upwards:\n${found.join('\n')}`)
})

t.test('the check fails on a planted violation', async (t) => {
  const planted = new Map([
    // the wire formats reaching up into the core, over two lines
    ['src/codec/planted.ts', "// a codec\nimport {\n  Router,\n} from '../core/router.js'\n"],
    // the router reaching into the simulators
    ['src/core/planted.ts', "import { x } from '../errors.js'\nexport { MockerFleet } from '../sim/mocker/fleet.js'\n"],
    // a test importing a benchmark, and a benchmark a test helper
    ['test/planted.test.ts', "const m = await import('../bench/proxy.js')\n"],
    ['bench/planted.ts', "import { waitUntil } from '../test/helpers/wait.js'\n"],
    // what is allowed: downwards, sideways in a row, and into compiled output of a lower row
    ['src/http/fine.ts', "import { Router } from '../core/router.js'\nimport { a } from './x.js'\nimport '../codec/u64.js'\n"],
    ['test/fine.test.ts', "import { startNats } from '../src/deploy/services.js'\nimport { u } from '../dist/src/codec/u64.js'\n"],
    // compiled output counts as its source
    ['src/index/planted.ts', "import { x } from '../../dist/src/shards/pool.js'\n"],
    ['lib/stray.ts', ''],
  ])
  t.same(violations(rows, planted), [
    'src/codec/planted.ts:4: imports src/core/router.ts: wire formats → router core, a row above',
    'src/core/planted.ts:2: imports src/sim/mocker/fleet.ts: router core → commands and simulators, a row above',
    'test/planted.test.ts:1: imports bench/proxy.ts, and tests never import bench/',
    'bench/planted.ts:1: imports test/helpers/wait.ts: benchmarks → tests, a row above',
    'src/index/planted.ts:1: imports src/shards/pool.ts: thread protocol, index → scheduler, shards, tokenizer, a row above',
    `lib/stray.ts: in no row of the table in ${DOC}`,
  ])
})

t.test('the table is read from the document', async (t) => {
  const doc = [
    '# x',
    '',
    HEADING,
    '',
    'text',
    '',
    '| layer | modules | never imports |',
    '|---|---|---|',
    '| top | `a/` | `c/` |',
    '| bottom | `b/`, `c/` | |',
    '',
    '## next',
    '| not | `d/` | |',
    '',
  ].join('\n')
  const table = readTable(doc)
  t.same(
    table.map((r) => [r.name, r.paths, r.never]),
    [
      ['top', ['a/'], ['c/']],
      ['bottom', ['b/', 'c/'], []],
    ],
  )
  t.throws(() => readTable('# nothing'), /no "## Import direction" section/)
})
