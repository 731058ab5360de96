#!/usr/bin/env node
// The `kv-router` executable: `serve` (the router, src/cli/serve.ts), `mocker` (simulated
// engines) and `replay` (a trace against a router). Invalid options exit with status 2 and one
// line naming the option and what it accepts.
import { readFileSync } from 'node:fs'
import { die } from './cli/flags.js'
import { workerHeapsAtDefaults } from './runtime/v8-flags.js'

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }

const usage = `kv-router ${pkg.version} — KV-cache-aware request router for LLM inference fleets

usage: kv-router <command> [options]

commands:
  serve     run the router (kv-router serve --help for its options)
  mocker    run simulated vLLM-like engines (kv-router mocker --help for its options)
  replay    replay a Mooncake trace against a router, with TTFT, TPOT, ITL and hit-rate figures

options:
  -h, --help     show this help
  -v, --version  print the version
`

// before any thread starts: the heap sizes of the shebang's flags are the main thread's alone
workerHeapsAtDefaults()

const [command, ...rest] = process.argv.slice(2)
if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
  process.stdout.write(usage)
} else if (command === '-v' || command === '--version') {
  process.stdout.write(`${pkg.version}\n`)
} else if (command === 'serve') {
  await (await import('./cli/serve.js')).serveMain(rest)
} else if (command === 'mocker') {
  await (await import('./sim/mocker/main.js')).mockerMain(rest)
} else if (command === 'replay') {
  await (await import('./sim/replay/main.js')).replayMain(rest)
} else {
  // one line, as for a bad option: the usage is a --help away, and 14 lines of it would bury
  // the mistake in a script's log
  die(`unknown command ${JSON.stringify(command)} (see kv-router --help)`)
}
