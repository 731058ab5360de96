// The one option parser every command uses (src/config/table.ts): the command line over the
// environment, which options were given and by which name, the warnings for options given where
// they do nothing, --help and the docs rows, all from one table.
import t from 'tap'
import { accepts, ConfigError, docsTable, opt, optionsHelp, parseOptions, resolveValues, withoutEffect } from '../../src/config/table.js'
import type { CommandTable } from '../../src/config/table.js'
import { parseServe, SERVE_TABLE, serveHelp, serveWithoutEffect } from '../../src/config.js'
import type { ServeConfig } from '../../src/config.js'
import { APPROXIMATE_ROWS, resolveSchedulerOptions, SCHEDULER_ROWS } from '../../src/scheduler/options.js'
import { clusterHelp, parseClusterArgs } from '../../src/cli/cluster-options.js'
import { mockerHelp } from '../../src/sim/mocker/main.js'
import { replayHelp } from '../../src/sim/replay/main.js'
import { isKvrError } from '../../src/errors.js'

const TABLE: CommandTable = {
  command: 'demo',
  options: [
    opt({ flag: '--size', key: 'size', env: ['DEMO_SIZE', 'DEMO_OLD_SIZE'], aliases: ['--sz'], kind: 'int', min: 1, max: 9, dflt: 4, help: 'a size' }),
    opt({ flag: '--mode', key: 'mode', kind: 'enum', values: ['a', 'b'], dflt: 'a', help: 'a mode' }),
    opt({ flag: '--tune', key: 'tune', kind: 'num', min: 0, dflt: 1, help: 'a knob', noEffect: { when: { mode: 'a' }, says: 'does nothing in mode a' } }),
    opt({ flag: '--limit', key: 'limit', kind: 'num', min: 0, openMin: true, nullable: true, dflt: null, help: 'a limit' }),
    opt({ flag: '--quiet', key: 'quiet', kind: 'bool', flagOnly: true, dflt: false, help: 'quiet' }),
    opt({ flag: '--on', key: 'on', kind: 'bool', dflt: true, help: 'on', doc: 'On, with a longer text.' }),
  ],
  unknown: (arg) => `unknown option ${arg}`,
}

type Demo = { size: number; mode: string; tune: number; limit: number | null; quiet: boolean; on: boolean }

function parse(argv: string[], env: NodeJS.ProcessEnv = {}): { config: Demo; given: ReadonlyMap<string, string> } {
  const p = parseOptions<Demo>(TABLE, argv, env)
  if (p === 'help') throw new Error('help')
  return p
}

t.test('defaults, the command line over the environment, and which options were given by which name', async (t) => {
  const d = parse([])
  t.same(d.config, { size: 4, mode: 'a', tune: 1, limit: null, quiet: false, on: true })
  t.equal(d.given.size, 0, 'nothing given')
  const e = parse([], { DEMO_OLD_SIZE: '7', DEMO_SIZE: '5' })
  t.equal(e.config.size, 5, 'of two variables the first listed wins')
  t.equal(e.given.get('size'), 'DEMO_SIZE')
  const c = parse(['--sz', '2', '--no-on', '--quiet', '--limit=none'], { DEMO_SIZE: 'not even a number' })
  t.equal(c.config.size, 2, 'the command line wins, and the variable is not read')
  t.equal(c.given.get('size'), '--sz', 'given by its alias')
  t.equal(c.config.on, false)
  t.equal(c.config.quiet, true)
  t.equal(c.config.limit, null)
  t.same([...c.given.keys()].sort(), ['limit', 'on', 'quiet', 'size'])
})

t.test('refusals: one line naming the option and what it takes', async (t) => {
  const refused = (argv: string[], re: RegExp, env: NodeJS.ProcessEnv = {}): void => {
    t.throws(() => parseOptions(TABLE, argv, env), re, argv.join(' '))
    try {
      parseOptions(TABLE, argv, env)
    } catch (err) {
      t.type(err, ConfigError)
    }
  }
  refused(['--size', '10'], /^--size must be an integer in \[1, 9\], got "10"$/)
  refused([], /^DEMO_SIZE \(--size\) must be an integer in \[1, 9\], got "x"$/, { DEMO_SIZE: 'x' })
  refused(['--limit', '0'], /^--limit must be a number in \(0, ∞\] or "none", got "0"$/)
  refused(['--mode', 'c'], /^--mode must be one of a\|b, got "c"$/)
  refused(['--quiet=yes'], /^--quiet takes no value$/)
  refused(['--no-quiet'], /^unknown option --no-quiet$/)
  refused(['--bogus'], /^unknown option --bogus$/)
  refused(['--size'], /^--size needs a value: an integer in \[1, 9\]$/)
  refused(['--size', '--mode', 'a'], /^--size needs a value \(.*\), got the option --mode; write --size=VALUE/)
  t.equal(parseOptions(TABLE, ['--size', 'x', '--help']), 'help', '--help wins over what comes before it')
  t.equal(accepts(TABLE.options[3] as never), 'a number in (0, ∞] or "none"')
})

t.test('"has no effect" follows what was given, not the value', async (t) => {
  const warn = (argv: string[], env: NodeJS.ProcessEnv = {}): string[] => {
    const p = parse(argv, env)
    return withoutEffect(TABLE, p.config, p.given)
  }
  t.same(warn(['--tune', '1']), ['--tune does nothing in mode a'], 'given at its default value: still said')
  t.same(warn([]), [], 'not given: nothing said')
  t.same(warn(['--tune', '5', '--mode', 'b']), [], 'in effect: nothing said')
})

t.test('serve: the warnings of Dynamo cost flags and durable-mode flags, by the name they were given', async (t) => {
  const w = (argv: string[], env: NodeJS.ProcessEnv = {}): string[] => {
    const p = parseServe(argv, env)
    if (p === 'help') throw new Error('help')
    return serveWithoutEffect(p)
  }
  t.match(w(['--router-prefill-load-scale', '1']), [/^--router-kv-overlap-score-weight \(--router-prefill-load-scale\) tunes Dynamo's cost/])
  t.match(w([], { DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT: '1' }), [/^--router-kv-overlap-score-credit tunes Dynamo's cost/], 'by env too')
  t.same(w(['--router-cost', 'dynamo', '--router-kv-overlap-score-credit', '2']), [])
  t.same(w(['--router-mode', 'round-robin', '--router-kv-overlap-score-credit', '2']), [], 'outside kv mode the cost is not used at all')
  t.same(w(['--router-snapshot-threshold', '1000000']), ['--router-snapshot-threshold has no effect without --router-durable-kv-events'])
  t.same(w([]), [])
})

t.test("the scheduler's defaults and ranges are the serve table's rows", async (t) => {
  const cfg = parseServe([], {})
  if (cfg === 'help') throw new Error('help')
  const sched = resolveSchedulerOptions()
  for (const d of SCHEDULER_ROWS) {
    t.equal(sched[d.key], cfg.config[d.key as keyof ServeConfig], `${d.key}: the same default`)
    t.ok(SERVE_TABLE.options.includes(d), `${d.flag} is a row of the serve table`)
  }
  for (const d of APPROXIMATE_ROWS) t.equal(sched.approximate[d.key], cfg.config[d.key as keyof ServeConfig], `approximate.${d.key}: the same default`)
  // the same bound refused on both sides
  t.throws(() => parseServe(['--encoder-cuda-to-cpu-ratio', '0'], {}), /must be a number in \(0, 1000000\]/)
  t.throws(() => resolveSchedulerOptions({ cudaToCpuRatio: 0 }), /options\.cudaToCpuRatio must be a number in \(0, 1000000\]/)
  t.throws(() => resolveValues([], { x: 1 }, 'demo option'), /options\.x is not a demo option/)
  try {
    resolveSchedulerOptions({ blockSize: 0 })
  } catch (err) {
    t.ok(isKvrError(err, 'KVR_ERR_INVALID_OPTION'))
  }
})

t.test('--help and the docs rows come from the table', async (t) => {
  const help = optionsHelp(TABLE)
  t.match(help, /^ {2}--size N, --sz\n {6}a size \(default 4\); an integer in \[1, 9\]; env DEMO_SIZE, DEMO_OLD_SIZE\n/)
  t.match(help, /\n {2}--on, --no-on\n/)
  t.match(help, /\n {2}--quiet\n {6}quiet\n/, 'a flag that takes no value says nothing of values')
  const rows = docsTable(TABLE).split('\n')
  t.equal(rows[2], '| `--size` | `DEMO_SIZE`, `DEMO_OLD_SIZE` | `4` | A size. alias: `--sz`. |')
  t.equal(rows[5], '| `--limit` | — | unset | A limit. |')
  t.equal(rows[7], '| `--on` | — | `true` | On, with a longer text. |')
  for (const [name, text] of [
    ['serve', serveHelp()],
    ['mocker', mockerHelp],
    ['replay', replayHelp],
    ['cluster', clusterHelp],
  ] as const) {
    t.notMatch(text, /\bEra\b/, `${name} --help names Dynamo releases, not eras`)
  }
  t.notMatch(mockerHelp, /does not read|not wired/, 'mocker --help does not say the router ignores ZMQ')
  t.match(mockerHelp, /kv-router serve reads it for a worker registered with kv-events=tcp:\/\/HOST:PORT/)
})

t.test('npm run cluster: options, their variables, and the serve arguments after --', async (t) => {
  t.match(parseClusterArgs(['--engines', '8', '--logs', '--', '--router-event-threads', '2'], { KVR_CLUSTER_PORT: '0', KVR_ENGINES: '3' }), {
    port: 0,
    engines: 8,
    replicas: 2,
    logs: true,
    serveArgs: ['--router-event-threads', '2'],
  })
  t.throws(() => parseClusterArgs(['--engines', '0'], {}), /^--engines must be an integer in \[1, 256\], got "0"$/)
  t.throws(() => parseClusterArgs(['--logs=1'], {}), /^--logs takes no value$/)
  t.equal((parseClusterArgs([], {}) as { engineProfile: string }).engineProfile, 'default')
  t.equal((parseClusterArgs([], { KVR_MOCKER_PROFILE: 'large:2,large@0.5:2' }) as { engineProfile: string }).engineProfile, 'large:2,large@0.5:2')
  t.throws(() => parseClusterArgs(['--engine-profile', 'huge'], {}), /^--engine-profile: unknown profile "huge" \(default, large, long-context\)$/)
  t.equal(parseClusterArgs(['-h'], {}), 'help')
})
