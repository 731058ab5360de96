// The repository stands alone and speaks to its users: no tracked file reads or links a path
// beside the repository, and none keeps a development log (numbered work periods, who found
// what). History lives in git.
import t from 'tap'
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { repoRoot } from '../helpers/paths.js'

const root = `${repoRoot}/`
const self = 'test/docs/standalone.test.ts'
const files = execFileSync('git', ['ls-files'], { cwd: root, encoding: 'utf8' })
  .split('\n')
  .filter((f) => f !== '' && f !== self && f !== '.ci/run' && !f.startsWith('data/') && !/\.(json|wasm|png|svg)$/.test(f))

// built from parts, so that this file does not match itself
const outside = new RegExp(['\\.\\.', 'shared'].join('/'))
const narrative = new RegExp([`[Ss]essions? [0-9]+`, `found by (an?|the) [a-z-]+ review`, `work period`].join('|'))

t.test('no path outside the repository, no work log', async (t) => {
  t.ok(files.length > 100, `${files.length} tracked files read`)
  const problems: string[] = []
  for (const f of files) {
    let text: string
    try {
      text = readFileSync(join(root, f), 'utf8')
    } catch {
      continue // a file deleted in the working tree and not yet in git's index
    }
    const lines = text.split('\n')
    lines.forEach((line, i) => {
      if (outside.test(line)) problems.push(`${f}:${i + 1} reaches outside the repository: ${line.trim()}`)
      if (narrative.test(line)) problems.push(`${f}:${i + 1} keeps history: ${line.trim()}`)
    })
  }
  t.same(problems, [])
})

t.test("the README is the user's page", async (t) => {
  const lines = readFileSync(join(root, 'README.md'), 'utf8').split('\n').length
  t.ok(lines <= 300, `README.md has ${lines} lines (at most 300; details go to docs/)`)
})
