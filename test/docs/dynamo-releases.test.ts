// Dynamo's history is told by its releases ("Dynamo 1.2 and later"), never by a private
// vocabulary of eras ("Era B", "Era C's …") that a user cannot look up: no such wording in the
// README, in docs/, or in src/ (comments and --help text included).
import t from 'tap'
import { readdirSync, readFileSync } from 'node:fs'
import { join, relative } from 'node:path'
import { repoRoot } from '../helpers/paths.js'

const root = `${repoRoot}/`
const ERA = /\beras?\b/i

function files(dir: string, ext: RegExp): string[] {
  const out: string[] = []
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name)
    if (e.isDirectory()) out.push(...files(p, ext))
    else if (ext.test(e.name)) out.push(p)
  }
  return out
}

/** Each line of `text` that speaks of eras, as `file:line: text`. */
function eraLines(file: string, text: string): string[] {
  return text.split('\n').flatMap((line, i) => (ERA.test(line) ? [`${relative(root, file)}:${i + 1}: ${line.trim()}`] : []))
}

t.test('the pattern finds era wording and nothing else', async (t) => {
  t.ok(ERA.test("implements Dynamo's Era B router"))
  t.ok(ERA.test("Era C's storage_tier"))
  t.ok(ERA.test('the knobs of era c'))
  t.notOk(ERA.test('the router of Dynamo 1.2 and later, its federated mode'))
  t.notOk(ERA.test('a general operation'))
})

t.test('no era wording in README.md, docs/ or src/', async (t) => {
  const all = [join(root, 'README.md'), ...files(join(root, 'docs'), /\.md$/), ...files(join(root, 'src'), /\.(ts|js|mjs|html|json)$/)]
  t.ok(all.length > 100, `the files were read (${all.length})`)
  const found = all.flatMap((f) => eraLines(f, readFileSync(f, 'utf8')))
  t.same(found, [], 'name Dynamo releases instead')
})
