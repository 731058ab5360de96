// The router's V8 flags (src/v8-flags.ts) are passed in three places that cannot share code: the
// shebang of the `kv-router` executable, `npm start`, and the benchmarks (which import them).
// These checks keep the first two in step with the list, and check that the flags still mean
// what they did: a renamed V8 flag would be ignored with only a warning.
import t from 'tap'
import { chmodSync, readFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { ROUTER_V8_FLAGS } from '../src/v8-flags.js'

const root = new URL('..', import.meta.url)
const cli = new URL('dist/src/cli.js', root).pathname

t.test('the shebang of the source and the built executable passes exactly the flags', async (t) => {
  const expected = `#!/usr/bin/env -S node ${ROUTER_V8_FLAGS.join(' ')}`
  t.equal(readFileSync(new URL('src/cli.ts', root), 'utf8').split('\n')[0], expected)
  t.equal(readFileSync(cli, 'utf8').split('\n')[0], expected)
})

t.test('npm start passes the flags', async (t) => {
  const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { scripts: Record<string, string> }
  t.match(pkg.scripts.start, `node ${ROUTER_V8_FLAGS.join(' ')} dist/src/cli.js serve`)
})

t.test('the flags give a fixed 64 MB young generation', async (t) => {
  const r = spawnSync(process.execPath, [...ROUTER_V8_FLAGS, '-e', "const s = require('v8').getHeapSpaceStatistics().find((x) => x.space_name === 'new_space'); process.stdout.write(String(s.space_size))"], { encoding: 'utf8' })
  t.equal(r.status, 0, r.stderr)
  t.equal(r.stderr, '', 'no warning about an unknown flag')
  t.equal(Number(r.stdout), 64 * 1024 * 1024)
})

t.test('the executable runs through its shebang', async (t) => {
  chmodSync(cli, 0o755)
  const r = spawnSync(cli, ['serve', '--help'], { encoding: 'utf8', env: { ...process.env, PATH: `${process.execPath.replace(/\/node$/, '')}:${process.env.PATH ?? ''}` } })
  t.equal(r.status, 0, r.stderr)
  t.match(r.stdout, '--router-mode')
})
