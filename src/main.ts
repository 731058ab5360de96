#!/usr/bin/env node
// The `kv-router` executable: `serve` (the router, src/cli/serve.ts), `mocker` (simulated
// engines), `replay` (a trace against a router) and `indexer` (a standalone KV indexer). The one
// place the process exits: each command resolves with its exit status, or throws FatalError, written here as one line with its status
// (2 for an invalid option: the line names the option and what it accepts).
import { readFileSync } from 'node:fs'
import { FatalError, fatalLine } from './runtime/fatal.js'
import { workerHeapsAtDefaults } from './runtime/v8-flags.js'

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }

const usage = `kv-router ${pkg.version} — KV-cache-aware request router for LLM inference fleets

usage: kv-router <command> [options]

commands:
  serve     run the router (kv-router serve --help for its options)
  mocker    run simulated vLLM-like engines (kv-router mocker --help for its options)
  replay    replay a Mooncake trace against a router, with TTFT, TPOT, ITL and hit-rate figures
  indexer   run a standalone KV indexer with Dynamo's HTTP API (kv-router indexer --help)

options:
  -h, --help     show this help
  -v, --version  print the version
`

// before any thread starts: the heap sizes of the shebang's flags are the main thread's alone
workerHeapsAtDefaults()

async function run(command: string | undefined, rest: string[]): Promise<number> {
  if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
    process.stdout.write(usage)
    return 0
  }
  if (command === '-v' || command === '--version') {
    process.stdout.write(`${pkg.version}\n`)
    return 0
  }
  if (command === 'serve') return (await import('./cli/serve.js')).serveMain(rest)
  if (command === 'mocker') return (await import('./sim/mocker/main.js')).mockerMain(rest)
  if (command === 'replay') return (await import('./sim/replay/main.js')).replayMain(rest)
  if (command === 'indexer') return (await import('./indexer/main.js')).indexerMain(rest)
  // one line, as for a bad option: the usage is a --help away, and 14 lines of it would bury
  // the mistake in a script's log
  throw new FatalError(`unknown command ${JSON.stringify(command)} (see kv-router --help)`)
}

const [command, ...rest] = process.argv.slice(2)
let status: number
try {
  status = await run(command, rest)
} catch (err) {
  if (!(err instanceof FatalError)) throw err
  process.stderr.write(fatalLine(err.message))
  process.exit(err.status)
}
// a command that returns has finished: servers, threads and timers it leaves do not keep the
// process up; what it wrote goes out first
process.exitCode = status
process.stdout.write('', () => process.exit(status))
