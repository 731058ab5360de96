// Helpers the benchmarks share: the repository root (results go under it), a child process
// awaited until its stdout shows a ready line, and the median of repetitions.
import { spawn } from 'node:child_process'
import type { ChildProcess } from 'node:child_process'
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url))
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir)
    if (up === dir) return process.cwd()
    dir = up
  }
  return dir
}

/** Starts `node ...args`; resolves once stdout matches `ready`, rejects if it exits first. */
export function child(args: string[], ready: RegExp): Promise<{ p: ChildProcess; m: RegExpMatchArray }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] })
    let out = ''
    p.stdout?.on('data', (d: Buffer) => {
      out += d.toString()
      const m = out.match(ready)
      if (m !== null) resolve({ p, m })
    })
    p.on('exit', (code) => reject(new Error(`child exited ${code}: ${out}`)))
  })
}

export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2
}
