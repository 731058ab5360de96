// How a command ends on an error it can name in one line: it throws FatalError, and src/main.ts
// (the one place the process exits) writes `kv-router: LINE` on stderr and exits with its status.
// Code that holds output (the log's batch) registers a hook that writes it out first, so the
// fatal line comes last.
import { redactSecrets } from './redact.js'

/** A failure the CLI reports as one line (credentials in it redacted) and an exit status, 2 unless said. */
export class FatalError extends Error {
  override name = 'FatalError'
  constructor(
    line: string,
    readonly status = 2,
  ) {
    super(line)
  }
}

/**
 * A command's parsed arguments, or null once its --help is written to stdout: an argument error
 * (`isArgError`) ends the command with one line naming it.
 */
export function commandArgs<T>(command: string, parse: () => T | 'help', isArgError: (err: unknown) => boolean, help: () => string): T | null {
  let parsed: T | 'help'
  try {
    parsed = parse()
  } catch (err) {
    if (isArgError(err)) throw new FatalError(`${command}: ${(err as Error).message}`)
    throw err
  }
  if (parsed !== 'help') return parsed
  process.stdout.write(help())
  return null
}

const hooks: (() => void)[] = []

/** Runs `f` before the fatal line is written. */
export function beforeFatalLine(f: () => void): void {
  hooks.push(f)
}

/** The line to write for a fatal error, after every hook has run. */
export function fatalLine(message: string): string {
  for (const f of hooks) f()
  return `kv-router: ${redactSecrets(message)}\n`
}
