// The `kv-router` executable as a process: usage for no command or --help, the version, one
// line with exit 2 for a command it does not know; serve's embedded fleet next to --worker.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { runCli, waitForOutput } from '../helpers/cli.js'
import { getFreePort } from '../../src/deploy/services.js'
import { fromRoot } from '../helpers/paths.js'

const pkg = JSON.parse(readFileSync(fromRoot('package.json'), 'utf8')) as { version: string }

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

t.test('serve: the embedded fleet is numbered after the static workers, which stay', async (t) => {
  // nothing listens there: the router only needs the worker listed
  const staticUrl = `http://127.0.0.1:${await getFreePort()}`
  const c = runCli([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-event-threads',
    '1',
    '--router-block-size',
    '16',
    '--embedded-fleet',
    '2',
    '--worker',
    staticUrl,
    '--worker',
    '5=http://127.0.0.1:1',
  ])
  t.teardown(() => c.p.kill('SIGKILL'))
  const m = await waitForOutput(c, /listening on (http:\/\/\S+) .*\n/)
  t.ok(m, `ready line (${c.out()}${c.err()})`)
  t.match(m?.[0], /, 4 worker\(s\), 2 embedded simulated\)/)
  const body = (await (await fetch(`${m?.[1] ?? ''}/v1/workers`)).json()) as { workers: { id: number; url: string }[] }
  const workers = body.workers.map((w) => [w.id, w.url] as const).sort((a, b) => a[0] - b[0])
  t.same(
    workers.slice(0, 2),
    [
      [1, staticUrl],
      [5, 'http://127.0.0.1:1'],
    ],
    'both static workers are there, under their ids',
  )
  t.same(
    workers.slice(2).map(([id]) => id),
    [6, 7],
    'the embedded engines take the ids after the largest static one',
  )
  t.notOk(
    workers.slice(2).some(([, url]) => url === staticUrl || url === 'http://127.0.0.1:1'),
    'engines have their own URLs',
  )
})

t.test('serve: an embedded fleet with no worker ids left after --worker exits 2 with one line', async (t) => {
  const c = runCli([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-event-threads',
    '1',
    '--embedded-fleet',
    '1',
    '--worker',
    '18446744073709551615=http://127.0.0.1:1',
  ])
  t.teardown(() => c.p.kill('SIGKILL'))
  const started = await waitForOutput(c, /listening on/)
  t.equal(started, null, 'it does not start')
  if (started !== null) c.p.kill('SIGKILL')
  t.equal(await c.exited, 2)
  t.equal(c.err(), 'kv-router: serve: --embedded-fleet: no room for 1 worker id(s) after the largest --worker id 18446744073709551615\n')
})

t.test('serve: the listening line says when kv mode predicts caches instead of reading KV events', async (t) => {
  for (const [flags, approx] of [
    [['--no-router-kv-events'], true],
    [[], false],
  ] as const) {
    const c = runCli(['serve', '--http-host', '127.0.0.1', '--http-port', '0', '--router-event-threads', '1', ...flags])
    t.teardown(() => c.p.kill('SIGKILL'))
    const m = await waitForOutput(c, /listening on .*\n/)
    t.ok(m, `ready line (${c.err()})`)
    if (approx) t.match(m?.[0], '(mode kv approximate: no KV events, caches predicted, block size')
    else t.match(m?.[0], /\(mode kv, block size/)
    c.p.kill('SIGKILL')
    await c.exited
  }
})
