// bench:e2e refuses an engine profile list the mocker would refuse, and modes it does not know,
// before it starts anything.
import t from 'tap'
import { spawnSync } from 'node:child_process'
import { join } from 'node:path'
import { repoRoot } from '../lib/common.js'

const E2E = join(repoRoot(), 'dist', 'bench', 'e2e.js')

t.test('--engine-profile: a bad list exits 2 with the reason', async (t) => {
  for (const [args, want] of [
    [['--engine-profile', 'huge'], /^bench:e2e: --engine-profile: unknown profile "huge" \(default, large, long-context\)\n$/],
    [['--workers', '4', '--engine-profile', 'large:3'], /^bench:e2e: --engine-profile: the counts add up to 3 engine\(s\), but there are 4\n$/],
  ] as const) {
    const r = spawnSync(process.execPath, [E2E, ...args], { encoding: 'utf8', timeout: 30_000 })
    t.equal(r.status, 2, args.join(' '))
    t.match(r.stderr, want)
  }
})

t.test('--modes: kv-static is a mode, a misspelt one is refused', async (t) => {
  const r = spawnSync(process.execPath, [E2E, '--modes', 'kv,kv-statik'], { encoding: 'utf8', timeout: 30_000 })
  t.equal(r.status, 2)
  t.match(r.stderr, /^bench:e2e: --modes: unknown mode "kv-statik" \(one of kv, kv-static, kv-dynamo, /)
})
