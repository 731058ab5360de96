// `kv-router serve`'s log as a process writes it: JSON lines on stderr (not a terminal), the
// listening line still alone on stdout; a request line per proxied completion to the embedded
// engines; no secret in any output (the API key, a client's Bearer token, the credentials of the
// NATS and etcd URLs); and a level that leaves the request lines out.
import t from 'tap'
import type { Test } from 'tap'
import { runCli, waitForOutput } from '../helpers/cli.js'
import type { CliProcess } from '../helpers/cli.js'
import { logRecords } from '../helpers/log.js'
import { startEtcd, startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'

const KEY = 'k3y-that-must-not-show'

async function serve(t: Test, args: string[]): Promise<{ c: CliProcess; base: string }> {
  const c = runCli(['serve', '--http-host', '127.0.0.1', '--http-port', '0', '--router-event-threads', '1', ...args])
  t.teardown(() => {
    c.p.kill('SIGKILL')
  })
  const m = await waitForOutput(c, /^kv-router listening on (http:\/\/\S+) /m)
  if (m === null) throw new Error(`serve did not start: ${c.err()}`)
  return { c, base: m[1] as string }
}

const completion = (base: string, headers: Record<string, string>): Promise<Response> =>
  fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ prompt: 'the router logs one line per request, and no secret', max_tokens: 4, stream: true }),
  })

t.test('JSON lines on stderr with a request line per completion; no secret written', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const natsUrl = nats.url.replace('nats://', 'nats://natsuser:n4tspw@')
  const { c, base } = await serve(t, [
    '--embedded-fleet',
    '2',
    '--tokenizer',
    'bytes',
    '--router-block-size',
    '16',
    '--log-level',
    'debug',
    '--api-key',
    KEY,
    '--nats-url',
    natsUrl,
  ])
  t.match(c.out(), /^kv-router listening on http:\/\/127\.0\.0\.1:\d+ \(mode kv, .*\)\n$/, 'stdout holds the listening line alone')
  const ok = await completion(base, { authorization: `Bearer ${KEY}` })
  t.equal(ok.status, 200)
  await ok.text()
  const denied = await completion(base, { authorization: 'Bearer wr0ng-t0ken' })
  t.equal(denied.status, 401)
  await denied.text()
  await waitUntil('both request lines', () => logRecords(c.err()).filter((x) => x.msg === 'request' && x.route === '/v1/completions').length === 2)

  const records = logRecords(c.err())
  t.equal(records.length, c.err().trim().split('\n').length, 'every stderr line is a JSON record')
  const [served, refused] = records.filter((x) => x.msg === 'request' && x.route === '/v1/completions')
  t.match(served, {
    level: 'info',
    method: 'POST',
    status: 200,
    stream: true,
    dp_rank: 0,
    overlap_blocks: Number,
    ttft_ms: Number,
    duration_ms: Number,
    request_id: String,
    worker_id: /^[12]$/,
  })
  t.match(refused, { level: 'info', status: 401 })
  const cfg = records.find((x) => x.msg === 'configuration')?.config as Record<string, unknown> | undefined
  t.match(
    cfg,
    { apiKey: '[redacted]', natsUrl: /^nats:\/\/\[redacted\]@127\.0\.0\.1:\d+$/, logLevel: 'debug' },
    'the configuration at debug, without its secrets',
  )
  for (const secret of [KEY, 'n4tspw', 'natsuser', 'wr0ng-t0ken']) {
    t.notMatch(c.err(), secret, `${secret} is not on stderr`)
    t.notMatch(c.out(), secret, `${secret} is not on stdout`)
  }
})

t.test('at --log-level warn no request line is written', async (t) => {
  const { c, base } = await serve(t, ['--embedded-fleet', '1', '--tokenizer', 'bytes', '--router-block-size', '16', '--log-level=warn'])
  const r = await completion(base, {})
  t.equal(r.status, 200)
  await r.text()
  // a line would be written before the response ends
  t.same(
    logRecords(c.err()).filter((x) => x.msg === 'request'),
    [],
  )
  t.notOk(
    logRecords(c.err()).some((x) => x.level === 'info'),
    'nothing below warn',
  )
})

t.test("an etcd URL's credentials go to etcd as its user and password, and show in no line", async (t) => {
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())
  // this etcd has no authentication: the router refuses to start, and its one line says why
  const c = runCli([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-event-threads',
    '1',
    '--etcd-url',
    etcd.url.replace('http://', 'http://etcduser:3tcdpw@'),
  ])
  t.teardown(() => {
    c.p.kill('SIGKILL')
  })
  t.equal(await c.exited, 2)
  t.match(c.err(), /^kv-router: serve: cannot reach etcd at http:\/\/\[redacted\]@127\.0\.0\.1:\d+: .*authentication is not enabled/)
  t.notMatch(c.err(), '3tcdpw')
})
