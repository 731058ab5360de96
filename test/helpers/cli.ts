// Runs the built `kv-router` CLI as a child process and collects its output, for process-level
// tests. The child gets only PATH, so no test's environment leaks into its configuration.
import { spawn } from 'node:child_process'
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { fileURLToPath } from 'node:url'

export const cliPath = fileURLToPath(new URL('../../dist/src/cli.js', import.meta.url))

export interface CliProcess {
  p: ChildProcessWithoutNullStreams
  out: () => string
  err: () => string
  exited: Promise<number | null>
}

export function runCli(args: string[]): CliProcess {
  const p = spawn(process.execPath, [cliPath, ...args], { env: { PATH: process.env.PATH } })
  let out = ''
  let err = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  p.stderr.on('data', (d: Buffer) => (err += d.toString()))
  return { p, out: () => out, err: () => err, exited: new Promise((r) => p.on('close', (code) => r(code))) }
}
