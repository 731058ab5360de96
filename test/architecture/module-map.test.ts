// docs/architecture.md's module map names every source file of src/ and workers/ by its path,
// and names none that does not exist: a file added, moved or removed fails here with the exact
// paths to add to the map or take out of it.
import t from 'tap'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { repoRoot } from '../helpers/paths.js'

const root = `${repoRoot}/`
const DOC = 'docs/architecture.md'
const HEADING = '## Module map'

/** The text of a markdown section, up to the next heading of its level. */
function section(markdown: string, heading: string): string {
  const at = markdown.indexOf(`\n${heading}\n`)
  if (at < 0) throw new Error(`${DOC} has no "${heading}" section`)
  const rest = markdown.slice(at + heading.length + 2)
  const end = rest.search(/\n## /)
  return end < 0 ? rest : rest.slice(0, end)
}

/** Repository paths under src/ or workers/ named in backticks. */
function named(text: string): Set<string> {
  return new Set([...text.matchAll(/`((?:src|workers)\/[^`\s*]+)`/g)].map((m) => m[1] as string))
}

function sources(dir: string, out: string[]): string[] {
  for (const e of readdirSync(join(root, dir), { withFileTypes: true })) {
    const rel = `${dir}/${e.name}`
    if (e.isDirectory()) sources(rel, out)
    else if (e.name.endsWith('.ts')) out.push(rel)
  }
  return out
}

/** What the map lacks and what it names in vain, as one message per kind. */
function compare(map: ReadonlySet<string>, files: readonly string[], exists: (path: string) => boolean): { missing: string[]; stale: string[] } {
  return {
    missing: files.filter((f) => !map.has(f)).sort(),
    stale: [...map].filter((p) => !exists(p)).sort(),
  }
}

const map = named(section(readFileSync(join(root, DOC), 'utf8'), HEADING))
const files = [...sources('src', []), ...sources('workers', [])]

t.test(`${DOC}'s module map names every .ts file of src/ and workers/`, async (t) => {
  t.ok(files.length > 100, `${files.length} files`)
  const { missing } = compare(map, files, (p) => existsSync(join(root, p)))
  t.same(missing, [], missing.length === 0 ? 'every file is named' : `add to the map in ${DOC} § Module map:\n${missing.join('\n')}`)
})

t.test(`${DOC}'s module map names no path that does not exist`, async (t) => {
  t.ok(map.size > 100, `${map.size} paths named`)
  const { stale } = compare(map, files, (p) => existsSync(join(root, p)))
  t.same(stale, [], stale.length === 0 ? 'every name is a file' : `take out of the map in ${DOC} § Module map (or correct):\n${stale.join('\n')}`)
})

t.test('a file left out and a name with no file are both found', async (t) => {
  const doc = `x\n${HEADING}\n\n| a | \`src/a.ts\`, \`src/gone.ts\` (\`workers/*.ts\` is no name) |\n\n## Next\n\`src/b.ts\`\n`
  const m = named(section(doc, HEADING))
  t.same([...m], ['src/a.ts', 'src/gone.ts'], 'only the section, only whole paths')
  t.same(
    compare(m, ['src/a.ts', 'src/b.ts'], (p) => p !== 'src/gone.ts'),
    { missing: ['src/b.ts'], stale: ['src/gone.ts'] },
  )
})
