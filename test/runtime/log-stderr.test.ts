// The log's reader may fall behind or stop (a collector that stalls, a pipe nobody drains): the
// router must go on answering, keep what it can and count what it drops. Real processes and real
// pipes: the parent stops reading the child's stderr, as a stuck collector would.
import t from 'tap'
import { spawn } from 'node:child_process'
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { cliArgv } from '../helpers/cli.js'
import { waitUntil } from '../helpers/wait.js'
import { fromRoot } from '../helpers/paths.js'

/** Counts the child's stderr lines that match `re` once reading starts again. */
function lineCounter(p: ChildProcessWithoutNullStreams, re: RegExp): { count: () => number; bytes: () => number } {
  let n = 0
  let bytes = 0
  let rest = ''
  p.stderr.on('data', (d: Buffer) => {
    bytes += d.length
    const text = rest + d.toString()
    const lines = text.split('\n')
    rest = lines.pop() ?? ''
    for (const l of lines) if (re.test(l)) n++
  })
  return { count: () => n, bytes: () => bytes }
}

t.test('a reader that stops reading stderr stalls nothing, and loses no line it comes back for', async (t) => {
  const p = spawn(
    process.execPath,
    cliArgv([
      'serve',
      '--http-host',
      '127.0.0.1',
      '--http-port',
      '0',
      '--router-event-threads',
      '1',
      '--worker',
      '1=http://127.0.0.1:9',
      '--router-health-probe-interval-secs',
      '0',
    ]),
    { env: { PATH: process.env.PATH } },
  )
  t.teardown(() => {
    p.kill('SIGKILL')
  })
  let out = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  await waitUntil('listening', () => /listening on \S+/.test(out), 10_000)
  const base = (/listening on (\S+)/.exec(out) as RegExpExecArray)[1] as string
  // the reader stops: the pipe (64 KiB) fills within a few hundred request lines
  p.stderr.pause()
  const body = JSON.stringify({ token_ids: Array.from({ length: 64 }, (_, i) => i) })
  const n = 2000
  let ok = 0
  for (let i = 0; i < n; i++) {
    const r = await fetch(`${base}/v1/route`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: AbortSignal.timeout(5000) })
    await r.arrayBuffer()
    if (r.status === 200) ok++
  }
  t.equal(ok, n, 'every request answered while nobody read the log')
  // the reader comes back: every request line is there, none dropped
  const lines = lineCounter(p, /"msg":"request"/)
  p.stderr.resume()
  await waitUntil('the request lines read', () => lines.count() >= n, 10_000)
  t.ok(lines.bytes() > 64 * 1024, `more than a pipe's worth was held (${lines.bytes()} bytes)`)
  const metrics = await (await fetch(`${base}/metrics`)).text()
  t.match(metrics, /^kvrouter_log_lines_dropped_total 0$/m)
  t.equal(lines.count(), n, 'one line per request')
})

t.test('past the buffer, lines are dropped and counted; what was kept goes out at exit', async (t) => {
  const logModule = fromRoot('dist', 'src', 'runtime', 'log.js')
  // 24,000 lines of about 1 KiB, 100 a turn: more than the 16 MiB held for a reader that reads nothing
  const script = `
    import { configureLog, log, logLinesDropped } from ${JSON.stringify(logModule)}
    import { writeSync } from 'node:fs'
    configureLog({ level: 'info', format: 'json' })
    const pad = 'x'.repeat(1000)
    for (let i = 0; i < 24000; i++) {
      log.info({ i, pad }, 'filler')
      if (i % 100 === 99) await new Promise((r) => setImmediate(r))
    }
    writeSync(1, 'dropped ' + logLinesDropped() + '\\n')
    process.stdin.once('data', () => process.exit(0))
  `
  const p = spawn(process.execPath, ['--input-type=module', '-e', script], { env: { PATH: process.env.PATH } })
  t.teardown(() => {
    p.kill('SIGKILL')
  })
  p.stderr.pause()
  let out = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  await waitUntil('the child wrote its lines', () => /dropped \d+\n/.test(out), 30_000)
  const dropped = Number((/dropped (\d+)/.exec(out) as RegExpExecArray)[1])
  t.ok(dropped > 0, `lines dropped: ${dropped}`)
  t.ok(dropped < 24000, 'not all of them')
  const lines = lineCounter(p, /"msg":"filler"/)
  const exited = new Promise<number | null>((r) => p.once('exit', r))
  p.stderr.resume()
  p.stdin.write('go\n')
  t.equal(await exited, 0)
  await waitUntil('stderr read to its end', () => p.stderr.readableEnded, 5000)
  t.equal(lines.count() + dropped, 24000, `${lines.count()} read and ${dropped} dropped: every line accounted for`)
})

t.test('a reader that goes away (EPIPE) leaves the process running', async (t) => {
  const logModule = fromRoot('dist', 'src', 'runtime', 'log.js')
  const script = `
    import { configureLog, log, logLinesDropped } from ${JSON.stringify(logModule)}
    import { writeSync } from 'node:fs'
    configureLog({ level: 'info', format: 'json' })
    process.stdin.once('data', async () => {
      for (let i = 0; i < 2000; i++) {
        log.info({ i }, 'into a closed pipe')
        if (i % 100 === 99) await new Promise((r) => setImmediate(r))
      }
      writeSync(1, 'alive, dropped ' + logLinesDropped() + '\\n')
      process.exit(0)
    })
  `
  const p = spawn(process.execPath, ['--input-type=module', '-e', script], { env: { PATH: process.env.PATH } })
  t.teardown(() => {
    p.kill('SIGKILL')
  })
  let out = ''
  p.stdout.on('data', (d: Buffer) => (out += d.toString()))
  const exited = new Promise<number | null>((r) => p.once('exit', r))
  p.stderr.destroy()
  p.stdin.write('go\n')
  t.equal(await exited, 0, 'exits as it meant to')
  t.equal(out, 'alive, dropped 2000\n', 'every line counted as dropped')
})
