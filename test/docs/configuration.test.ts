// docs/configuration.md lists every option of each command once, and nothing the code does not
// take: its option tables are the rendering of the commands' own tables (`npm run docs:config`
// writes them), so a flag added, renamed or dropped in the code cannot leave the document behind.
import t from 'tap'
import type { Test } from 'tap'
import { readFileSync } from 'node:fs'
import { FLAGS } from '../../src/config.js'
import { DOCUMENTED, renderConfigurationDoc } from '../../src/cli/configuration-doc.js'
import { fromRoot } from '../helpers/paths.js'

const doc = readFileSync(fromRoot('docs', 'configuration.md'), 'utf8')

/** The rows of the table under `## name`: [flag, env column, rest]. */
function rows(name: string): string[][] {
  const start = doc.indexOf(`\n## ${name}\n`)
  if (start < 0) return []
  const end = doc.indexOf('\n## ', start + 1)
  const section = doc.slice(start, end < 0 ? undefined : end)
  return [...section.matchAll(/^\| `(--[a-z0-9-]+)` \| ([^|]*) \|(.*)$/gm)].map((m) => [m[1] as string, m[2] as string, m[3] as string])
}

function once(t: Test, flags: string[]): void {
  const seen = new Set<string>()
  for (const f of flags) {
    t.notOk(seen.has(f), `${f} is listed once`)
    seen.add(f)
  }
}

t.test("the option tables are the rendering of the commands' tables (npm run docs:config)", async (t) => {
  const rendered = renderConfigurationDoc(doc)
  const a = doc.split('\n')
  const b = rendered.split('\n')
  // line by line, so a failure names the row that differs
  for (let i = 0; i < Math.max(a.length, b.length); i++) if (a[i] !== b[i]) t.equal(a[i], b[i], `docs/configuration.md line ${i + 1}`)
  t.equal(rendered, doc, 'docs/configuration.md equals its rendering')
  t.throws(() => renderConfigurationDoc('# Configuration\n'), /no section "## serve"/, 'a section missing is an error, not a silent pass')
})

t.test('serve: every flag, its environment variables and its aliases', async (t) => {
  const r = rows('serve')
  once(
    t,
    r.map((x) => x[0] as string),
  )
  t.same(r.map((x) => x[0]).sort(), FLAGS.map((f) => f.flag).sort(), 'the same flags as src/config.ts')
  for (const f of FLAGS) {
    const row = r.find((x) => x[0] === f.flag)
    for (const env of f.env) t.match(row?.[1] ?? '', `\`${env}\``, `${f.flag} names ${env}`)
    for (const a of f.aliases ?? []) t.match(row?.[2] ?? '', `\`${a}\``, `${f.flag} names its alias ${a}`)
  }
  // and no environment variable in the column that the flag does not read
  for (const [flag, envs] of r) {
    const def = FLAGS.find((f) => f.flag === flag)
    for (const m of (envs as string).matchAll(/`([A-Z_]+)`/g)) t.ok(def?.env.includes(m[1] as string), `${flag}: ${m[1]} is one of its variables`)
  }
})

t.test('mocker, replay and cluster: every flag', async (t) => {
  for (const table of DOCUMENTED.slice(1)) {
    const m = rows(table.command).map((x) => x[0] as string)
    once(t, m)
    t.same(m.sort(), table.options.map((d) => d.flag).sort(), `${table.command}: the same flags as its table`)
  }
})
