// `kv-router replay`: flag parsing (invalid flags exit 2 with one line), request selection, and
// a whole run in process against a local SSE server writing JSONL records.
import t from 'tap'
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Writable } from 'node:stream'
import { parseReplayArgs, progressLine, replayHelp, ReplayUsageError, runReplay, selectRequests } from '../../../src/sim/replay/main.js'
import type { ReplayRecord } from '../../../src/sim/replay/client.js'
import { sleep, sseScript, sseServer } from '../../fixtures/sse-server.js'
import { cliArgv } from '../../helpers/cli.js'

const dir = mkdtempSync(join(tmpdir(), 'kvr-replay-'))
const tracePath = join(dir, 'trace.jsonl')
const lines = [
  { timestamp: 0, input_length: 700, output_length: 3, hash_ids: [0, 1] },
  { timestamp: 30_000, input_length: 512, output_length: 2, hash_ids: [0] },
  { timestamp: 61_000, input_length: 100, output_length: 4, hash_ids: [5] },
  { timestamp: 90_000, input_length: 1100, output_length: 1, hash_ids: [0, 1, 2] },
]
writeFileSync(tracePath, lines.map((l) => JSON.stringify(l)).join('\n') + '\n')

function sink(tty = false): { stream: Writable & { isTTY?: boolean }; text: () => string } {
  let text = ''
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      text += chunk.toString()
      cb()
    },
  }) as Writable & { isTTY?: boolean }
  if (tty) stream.isTTY = true
  return { stream, text: () => text }
}

function run(args: string[]): Promise<{ code: number | null; stderr: string; stdout: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, cliArgv(['replay', ...args]), { env: { PATH: process.env.PATH } })
    let stderr = ''
    let stdout = ''
    p.stderr.on('data', (d: Buffer) => (stderr += d.toString()))
    p.stdout.on('data', (d: Buffer) => (stdout += d.toString()))
    p.on('close', (code) => resolve({ code, stderr, stdout }))
  })
}

t.test('parse: defaults, both flag forms, help', async (t) => {
  const a = parseReplayArgs(['--trace', 'f.jsonl', '--url=http://127.0.0.1:8000'])
  t.same(a, {
    trace: 'f.jsonl',
    url: 'http://127.0.0.1:8000',
    speedup: 1,
    limit: null,
    durationMin: null,
    maxInFlight: 2048,
    timeoutS: 600,
    model: null,
    apiKey: null,
    output: null,
    timeScale: 1,
    quiet: false,
  })
  const b = parseReplayArgs([
    '--trace=f',
    '--url',
    'https://h',
    '--speedup',
    '2.5',
    '--limit=10',
    '--duration-min',
    '0.5',
    '--max-in-flight',
    '8',
    '--timeout-s',
    '3',
    '--model',
    'm',
    '--api-key',
    'k',
    '--output',
    'o.jsonl',
    '--time-scale',
    '4',
    '--quiet',
  ])
  t.match(b, { speedup: 2.5, limit: 10, durationMin: 0.5, maxInFlight: 8, timeoutS: 3, model: 'm', apiKey: 'k', output: 'o.jsonl', timeScale: 4, quiet: true })
  t.match(parseReplayArgs(['--trace=f', '--url', 'https://h', '--timeout-s', '2147483.647']), { timeoutS: 2147483.647 }, 'the longest timer Node keeps')
  t.equal(parseReplayArgs(['--trace', 'x', '--help']), 'help')
  t.equal(parseReplayArgs(['-h']), 'help')
})

t.test('parse: every invalid flag is refused with a message naming it', async (t) => {
  const base = ['--trace', 'f', '--url', 'http://h:1']
  const cases: [string[], RegExp][] = [
    [['--url', 'http://h'], /--trace FILE is required/],
    [['--trace', 'f'], /--url URL is required/],
    [['--trace', 'f', '--url', 'h:1'], /--url must be an http\(s\) URL/],
    [['--trace', 'f', '--url', 'not a url'], /--url must be an http\(s\) URL/],
    [[...base, '--speedup', '0'], /--speedup must be a positive number, got "0"/],
    [[...base, '--speedup', 'fast'], /--speedup must be a positive number/],
    [[...base, '--speedup='], /--speedup must be a positive number/],
    [[...base, '--limit', '1.5'], /--limit must be a positive integer, got "1.5"/],
    [[...base, '--limit', '0'], /--limit must be a positive integer/],
    [[...base, '--max-in-flight', '-3'], /--max-in-flight needs a value|--max-in-flight must be/],
    [[...base, '--duration-min', '-1'], /--duration-min/],
    [[...base, '--timeout-s', 'x'], /--timeout-s must be a positive number/],
    [[...base, '--time-scale', 'NaN'], /--time-scale must be a positive number/],
    [[...base, '--speedup', '0x10'], /^--speedup must be a positive number, got "0x10"$/],
    [[...base, '--timeout-s', '0b11'], /^--timeout-s must be a positive number at most 2147483\.647 .*, got "0b11"$/],
    [[...base, '--limit', '0x10'], /^--limit must be a positive integer, got "0x10"$/],
    [['--trace', 'f', '--url', 'http://127.0.0.1:99999'], /^--url must be an http\(s\) URL/],
    [
      [...base, '--timeout-s', '2147484'],
      /^--timeout-s must be a positive number at most 2147483\.647 \(about 24\.8 days, the longest timer Node keeps\), got "2147484"$/,
    ],
    [[...base, '--bogus'], /unknown option "--bogus"/],
    [[...base, '--quiet=yes'], /--quiet takes no value/],
    [[...base, '--output'], /--output needs a value/],
    [['--trace', '--url', 'http://h'], /--trace needs a value/],
  ]
  for (const [argv, msg] of cases) t.throws(() => parseReplayArgs(argv), { name: 'ReplayUsageError', message: msg }, argv.join(' '))
})

t.test('the CLI: invalid flags and unreadable traces exit 2 with one line', async (t) => {
  const cases: [string[], RegExp][] = [
    [['--trace', tracePath, '--url', 'http://127.0.0.1:1', '--speedup', '-2'], /^kv-router: replay: --speedup must be a positive number, got "-2"\n$/],
    [['--trace', tracePath], /^kv-router: replay: --url URL is required\n$/],
    [['--trace', join(dir, 'missing.jsonl'), '--url', 'http://127.0.0.1:1'], /^kv-router: replay: --trace: cannot read .*missing\.jsonl: ENOENT\n$/],
    [['--trace', tracePath, '--url', 'http://127.0.0.1:1', '--nope'], /^kv-router: replay: unknown option "--nope"/],
    [
      ['--trace', tracePath, '--url', 'http://127.0.0.1:1', '--timeout-s', '3000000'],
      /^kv-router: replay: --timeout-s must be a positive number at most 2147483\.647 .*, got "3000000"\n$/,
    ],
  ]
  const results = await Promise.all(cases.map(([argv]) => run(argv)))
  results.forEach((r, i) => {
    t.equal(r.code, 2, `exit 2 for ${cases[i]?.[0].join(' ')}`)
    t.match(r.stderr, cases[i]?.[1] as RegExp)
    t.equal(r.stdout, '')
  })
  const bad = join(dir, 'bad.jsonl')
  writeFileSync(bad, '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n')
  const r = await run(['--trace', bad, '--url', 'http://127.0.0.1:1'])
  t.equal(r.code, 2)
  t.match(r.stderr, /^kv-router: replay: --trace: bad\.jsonl line 1: "hash_ids" has 1 block/)
  const help = await run(['--help'])
  t.equal(help.code, 0)
  t.equal(help.stdout, replayHelp)
})

t.test('selectRequests: duration first, then limit', async (t) => {
  const all = lines.map((l) => ({ ...l }))
  t.equal(selectRequests(all, null, null).length, 4)
  t.same(
    selectRequests(all, null, 1).map((r) => r.timestamp),
    [0, 30_000],
  )
  t.same(
    selectRequests(all, 1, 1.5).map((r) => r.timestamp),
    [0],
  )
  t.same(
    selectRequests(all, 3, null).map((r) => r.timestamp),
    [0, 30_000, 61_000],
  )
})

t.test('a run writes one JSONL record per request and prints the summary', async (t) => {
  const srv = await sseServer(sseScript({ worker: '42', cached: (b) => ((b.prompt as number[]).length >= 512 ? 512 : 0) }))
  t.teardown(() => srv.close())
  const out = join(dir, 'out.jsonl')
  const stdout = sink()
  const stderr = sink()
  // 90 s of trace at 1000×: 90 ms; the model comes from the missing /v1/models → the default
  const code = await runReplay(['--trace', tracePath, '--url', srv.url, '--speedup', '1000', '--output', out, '--time-scale', '2'], {
    stdout: stdout.stream,
    stderr: stderr.stream,
    signals: false,
    progressEveryMs: 20,
  })
  t.equal(code, 0)
  const recs = readFileSync(out, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as ReplayRecord)
  t.equal(recs.length, 4)
  t.same(recs.map((r) => r.id).sort(), [0, 1, 2, 3])
  for (const r of recs) {
    t.same(Object.keys(r).sort(), [
      'cached_tokens',
      'e2e_ms',
      'error',
      'id',
      'output_tokens',
      'prompt_tokens',
      'scheduled_ms',
      'sent_ms',
      'status',
      'timestamp',
      'tpot_ms',
      'ttft_ms',
      'worker',
    ])
    const src = lines[r.id]
    t.equal(r.timestamp, src?.timestamp)
    t.equal(r.prompt_tokens, src?.input_length)
    t.equal(r.output_tokens, src?.output_length)
    t.equal(r.worker, '42')
    t.equal(r.status, 200)
    t.equal(r.error, null)
    t.equal(typeof r.ttft_ms, 'number')
  }
  t.equal(recs.find((r) => r.id === 3)?.cached_tokens, 512)
  t.equal(typeof recs.find((r) => r.id === 2)?.tpot_ms, 'number', 'four chunks: a TPOT')
  t.equal(recs.find((r) => r.id === 3)?.tpot_ms, null, 'one chunk: no TPOT')
  t.equal(srv.seen[0]?.body.model, 'kv-router-model')
  t.match(stdout.text(), /requests {6}4 \(4 ok, 0 failed\)/)
  t.match(stdout.text(), /simulated: wall × 2/)
  t.match(stdout.text(), /workers {7}42:4; spread max\/min 1\.00/)
  t.match(stderr.text(), /\nreplay +\d+% {2}sent \d\/4/, 'plain progress lines when stderr is not a TTY')
  t.notMatch(stderr.text(), /\r/)
  t.match(stderr.text(), /kv-router replay: 4 request\(s\) to http:\/\/127\.0\.0\.1:\d+ at 1000× \(model kv-router-model\)/)
})

t.test('a failed request makes the exit status 1; TTY progress redraws one line; the model comes from /v1/models', async (t) => {
  let n = 0
  const ok = sseScript()
  const srv = await sseServer(async (body, res) => {
    if (n++ === 1) {
      res.writeHead(500, { 'content-type': 'text/plain' })
      res.end('boom')
      return
    }
    await ok(body, res, n)
  })
  t.teardown(() => srv.close())
  const models = await sseServer(sseScript(), ['served-model'])
  t.teardown(() => models.close())
  const stdout = sink()
  const stderr = sink(true)
  const code = await runReplay(['--trace', tracePath, '--url', srv.url, '--speedup', '1000', '--limit', '2', '--model', 'explicit'], {
    stdout: stdout.stream,
    stderr: stderr.stream,
    signals: false,
  })
  t.equal(code, 1)
  t.equal(srv.seen[0]?.body.model, 'explicit')
  t.match(stdout.text(), /error ×1 {3}HTTP 500: boom/)
  t.match(stderr.text(), /\rreplay 100% {2}sent 2\/2 {2}in flight 0 {2}done 2 {2}failed 1/)
  const quiet = sink()
  const code2 = await runReplay(['--trace', tracePath, '--url', models.url, '--limit', '1', '--quiet'], {
    stdout: sink().stream,
    stderr: quiet.stream,
    signals: false,
  })
  t.equal(code2, 0)
  t.equal(models.seen[0]?.body.model, 'served-model', 'the model named by /v1/models')
  t.equal(quiet.text(), '', '--quiet prints no progress')
  t.equal(parseReplayArgs(['--help']), 'help')
  t.throws(() => parseReplayArgs(['--x']), ReplayUsageError)
})

t.test('in process: help, unreadable traces and an unwritable --output are usage errors', async (t) => {
  const help = sink()
  t.equal(await runReplay(['--help'], { stdout: help.stream, stderr: sink().stream, signals: false }), 0)
  t.equal(help.text(), replayHelp)
  await t.rejects(runReplay(['--trace', join(dir, 'missing.jsonl'), '--url', 'http://127.0.0.1:1']), {
    name: 'ReplayUsageError',
    message: /cannot read .*ENOENT/,
  })
  await t.rejects(runReplay(['--trace', join(dir, 'bad.jsonl'), '--url', 'http://127.0.0.1:1']), { name: 'ReplayUsageError', message: /bad\.jsonl line 1/ })
  await t.rejects(
    runReplay(['--trace', tracePath, '--url', 'http://127.0.0.1:1', '--output', join(dir, 'no', 'such', 'dir.jsonl')], {
      stdout: sink().stream,
      stderr: sink().stream,
      signals: false,
    }),
    { name: 'ReplayUsageError', message: /--output: cannot write .*dir\.jsonl: ENOENT/ },
  )
})

t.test('SIGINT stops the replay: in-flight requests are aborted, the rest not sent, exit 1', async (t) => {
  const srv = await sseServer(sseScript({ ttftMs: 10_000 }))
  t.teardown(() => srv.close())
  const p = spawn(process.execPath, cliArgv(['replay', '--trace', tracePath, '--url', srv.url, '--model', 'm']), { env: { PATH: process.env.PATH } })
  let stdout = ''
  let stderr = ''
  p.stdout.on('data', (d: Buffer) => (stdout += d.toString()))
  p.stderr.on('data', (d: Buffer) => (stderr += d.toString()))
  const code = new Promise<number | null>((r) => p.on('close', r))
  while (srv.seen.length < 1) await sleep(10)
  p.kill('SIGINT')
  t.equal(await code, 1)
  t.match(stderr, /SIGINT: stopping/)
  t.match(stdout, /requests {6}4 \(0 ok, 4 failed\)/)
  t.match(stdout, /error ×3 {3}not sent: replay aborted/)
  t.match(stdout, /error ×1 {3}replay aborted/)
})

t.test('progressLine', async (t) => {
  t.equal(
    progressLine({ total: 200, sent: 150, done: 100, failed: 3, inFlight: 50, elapsedS: 12.4, scheduleS: 30 }),
    'replay  50%  sent 150/200  in flight 50  done 100  failed 3  12/30 s',
  )
  t.equal(
    progressLine({ total: 0, sent: 0, done: 0, failed: 0, inFlight: 0, elapsedS: 0, scheduleS: 0 }),
    'replay 100%  sent 0/0  in flight 0  done 0  failed 0  0/0 s',
  )
})
