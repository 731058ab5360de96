#!/usr/bin/env node
// The `kv-router` executable. Subcommands arrive with their issues: `serve` (the HTTP router),
// `mocker` (simulated engines) and `replay` (trace client). Until then this says so plainly
// instead of pretending.
import { readFileSync } from 'node:fs'

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }

const usage = `kv-router ${pkg.version} — KV-cache-aware request router for LLM inference fleets

usage: kv-router <command> [options]

commands:
  serve     run the router (not available yet: the HTTP service is issue #5)
  mocker    run simulated engines (not available yet: issue #7)
  replay    replay a Mooncake trace against a router (not available yet: issue #7)

options:
  -h, --help     show this help
  -v, --version  print the version
`

const [command] = process.argv.slice(2)
if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
  process.stdout.write(usage)
} else if (command === '-v' || command === '--version') {
  process.stdout.write(`${pkg.version}\n`)
} else if (command === 'serve' || command === 'mocker' || command === 'replay') {
  process.stderr.write(`kv-router ${command}: not available in this build yet; see README.md ("Status")\n`)
  process.exitCode = 2
} else {
  process.stderr.write(`kv-router: unknown command "${command}"\n\n${usage}`)
  process.exitCode = 2
}
