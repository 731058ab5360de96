// The one way every `kv-router` command refuses its flags: one line on stderr naming the flag
// and what it accepts, and exit status 2.

export function die(line: string): never {
  process.stderr.write(`kv-router: ${line}\n`)
  process.exit(2)
}
