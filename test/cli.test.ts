// The `kv-router` executable's command dispatch, as a process: usage for no command or --help,
// the version, and one line with exit 2 for a command it does not know.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { runCli } from './helpers/cli.js'

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }

t.test('an unknown command exits 2 with one line that names it', async (t) => {
  const c = runCli(['bogus'])
  t.equal(await c.exited, 2)
  t.equal(c.err(), 'kv-router: unknown command "bogus" (see kv-router --help)\n')
  t.equal(c.out(), '')
})

t.test('no command, --help, -h and help print the usage on stdout', async (t) => {
  const runs = [[], ['--help'], ['-h'], ['help']].map((args) => ({ args, c: runCli(args) }))
  for (const { args, c } of runs) {
    t.equal(await c.exited, 0, args.join(' ') || '(none)')
    t.match(c.out(), /^kv-router \S+ — KV-cache-aware request router/)
    t.match(c.out(), /\n {2}serve {5}run the router/)
    t.match(c.out(), /\n {2}replay {4}replay a Mooncake trace/)
    t.equal(c.err(), '')
  }
})

t.test('--version prints the package version', async (t) => {
  const c = runCli(['--version'])
  t.equal(await c.exited, 0)
  t.equal(c.out(), `${pkg.version}\n`)
})
