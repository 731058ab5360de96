// Every relative link in the README and docs/ leads to a file of the repository, and every
// `#anchor` to a heading of that file: a moved or renamed document cannot leave dead links.
import t from 'tap'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative } from 'node:path'
import { repoRoot } from '../helpers/paths.js'

const root = `${repoRoot}/`
const docs = [
  'README.md',
  'data/README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
]

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens. */
function anchor(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-')
}

function anchors(file: string): Set<string> {
  const text = readFileSync(file, 'utf8').replace(/```[\s\S]*?```/g, '')
  return new Set([...text.matchAll(/^#{1,6} (.+)$/gm)].map((m) => anchor(m[1] as string)))
}

t.test('relative links resolve', async (t) => {
  let links = 0
  for (const doc of docs) {
    const text = readFileSync(join(root, doc), 'utf8').replace(/```[\s\S]*?```/g, '')
    for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      const target = m[1] as string
      if (/^[a-z]+:/.test(target)) continue
      links++
      const [path, hash] = target.split('#') as [string, string | undefined]
      const file = path === '' ? join(root, doc) : join(root, dirname(doc), path)
      t.ok(existsSync(file), `${doc}: ${target} (${relative(root, file)})`)
      if (hash !== undefined && existsSync(file) && file.endsWith('.md'))
        t.ok(anchors(file).has(hash), `${doc}: #${hash} is a heading of ${relative(root, file)}`)
    }
  }
  t.ok(links > 10, `${links} links checked`)
})

t.test('source paths the documents name exist', async (t) => {
  let paths = 0
  for (const doc of docs) {
    const text = readFileSync(join(root, doc), 'utf8')
    for (const m of text.matchAll(/`((?:src|workers|test|scripts)\/[A-Za-z0-9_./-]+\.(?:ts|mjs|wat))`/g)) {
      paths++
      t.ok(existsSync(join(root, m[1] as string)), `${doc}: ${m[1]}`)
    }
  }
  t.ok(paths > 10, `${paths} paths checked`)
})
