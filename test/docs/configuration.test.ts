// docs/configuration.md lists every option of each command once, and nothing the code does not
// take: a flag added, renamed or dropped in the code cannot leave the document behind.
import t from 'tap'
import type { Test } from 'tap'
import { readFileSync } from 'node:fs'
import { FLAGS } from '../../src/config.js'
import { SPECS } from '../../src/sim/mocker/main.js'
import { BOOL_FLAGS, VALUE_FLAGS } from '../../src/sim/replay/main.js'

const doc = readFileSync(new URL('../../docs/configuration.md', import.meta.url), 'utf8')

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

t.test('mocker and replay: every flag', async (t) => {
  const m = rows('mocker').map((x) => x[0] as string)
  once(t, m)
  t.same(m.sort(), Object.keys(SPECS).sort(), 'the same flags as src/sim/mocker/main.ts')
  const r = rows('replay').map((x) => x[0] as string)
  once(t, r)
  t.same(r.sort(), [...VALUE_FLAGS, ...BOOL_FLAGS].sort(), 'the same flags as src/sim/replay/main.ts')
})
