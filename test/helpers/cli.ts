// Runs the built `kv-router` CLI as a child process and collects its output, for process-level
// tests. The child gets only PATH, so no test's environment leaks into its configuration.
import { spawn } from 'node:child_process'
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { ROUTER_V8_FLAGS } from '../../src/runtime/v8-flags.js'
import { fromRoot } from './paths.js'

export const cliPath = fromRoot('dist', 'src', 'main.js')

/**
 * The argv that starts the CLI the way its shebang, `npm start` and the Dockerfile do: with the
 * router's V8 flags. A test that left them out once hid a crash they caused (a worker thread given
 * them explicitly refuses them).
 */
export function cliArgv(args: string[]): string[] {
  return [...ROUTER_V8_FLAGS, cliPath, ...args]
}

export interface CliProcess {
  p: ChildProcessWithoutNullStreams
  out: () => string
  err: () => string
  exited: Promise<number | null>
}

export function runCli(args: string[]): CliProcess {
  const p = spawn(process.execPath, cliArgv(args), { env: { PATH: process.env.PATH } })
  let out = ''
  let err = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  p.stderr.on('data', (d: Buffer) => (err += d.toString()))
  return { p, out: () => out, err: () => err, exited: new Promise((r) => p.on('close', (code) => r(code))) }
}

/** Resolves with the first match of `re` in the process's stdout, or null if it exits before. */
export function waitForOutput(c: CliProcess, re: RegExp): Promise<RegExpExecArray | null> {
  return new Promise((resolve) => {
    const timer = setInterval(() => {
      const m = re.exec(c.out())
      if (m !== null) {
        clearInterval(timer)
        resolve(m)
      }
    }, 20)
    void c.exited.then(() => {
      clearInterval(timer)
      resolve(re.exec(c.out()))
    })
  })
}
