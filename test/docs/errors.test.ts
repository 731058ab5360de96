// docs/errors.md's table of error codes is the catalogue's: every code with its status and summary,
// in its order, so that a code added or changed in src/errors.ts cannot leave it behind.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { ErrorCodes } from '../../src/errors.js'

t.test('docs/errors.md lists the catalogue exactly', async (t) => {
  const doc = readFileSync(new URL('../../docs/errors.md', import.meta.url), 'utf8')
  const start = doc.indexOf('\n## Catalogue\n')
  t.ok(start >= 0, 'the doc has its catalogue section')
  const end = doc.indexOf('\n## ', start + 1)
  const section = doc.slice(start, end < 0 ? undefined : end)
  const rows = [...section.matchAll(/^\| `(KVR_ERR_[A-Z_]+)` \| (\d+) \| (.*) \|$/gm)].map((m) => [m[1], Number(m[2]), m[3]])
  const expected = Object.entries(ErrorCodes).map(([code, v]) => [code, v.status, v.summary])
  t.ok(expected.length > 20, 'the catalogue was read')
  t.same(rows, expected)
})
