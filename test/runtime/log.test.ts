// The logger (src/runtime/log.ts): what --log-level and DYN_LOG take, level filtering, the JSON
// and pretty formats, secrets kept out of every line, the rate limiter's counts; and the lines the
// shards' counters become (src/shards/log-watch.ts) and those of stale bookings.
import t from 'tap'
import { parseServeConfig } from '../../src/config.js'
import type { ServeConfig } from '../../src/config.js'
import { LogLimiter, addSecret, createLogger, parseLogLevel, prettyLine, redactSecrets } from '../../src/runtime/log.js'
import { ShardLogWatch } from '../../src/shards/log-watch.js'
import type { ShardCountersSource } from '../../src/shards/log-watch.js'
import { ActiveSequences, booking } from '../../src/scheduler/active-sequences.js'
import { Capture, captureProcessLog, captured } from '../helpers/log.js'

const serve = (argv: string[], env: NodeJS.ProcessEnv = {}): ServeConfig => parseServeConfig(argv, env) as ServeConfig

t.test('--log-level and DYN_LOG: levels, Dynamo filter directives, the command line first', async (t) => {
  for (const [text, level] of [
    ['debug', 'debug'],
    ['WARN', 'warn'],
    [' error ', 'error'],
    ['trace', 'trace'],
    ['off', 'silent'],
    ['silent', 'silent'],
    ['fatal', 'fatal'],
    ['info,dynamo_runtime=debug', 'info'],
    ['dynamo_llm::kv_router=trace,warn', 'warn'],
    ['dynamo_runtime=debug', 'info'],
  ] as const)
    t.equal(parseLogLevel(text), level, JSON.stringify(text))
  for (const text of ['', 'bogus', 'info,debug', 'warning', ' , ']) t.equal(parseLogLevel(text), null, `${JSON.stringify(text)} is refused`)
  t.equal(serve([]).logLevel, 'info', 'info by default')
  t.equal(serve([]).logFormat, 'auto')
  t.equal(serve([], { DYN_LOG: 'debug' }).logLevel, 'debug')
  t.equal(serve(['--log-level', 'error'], { DYN_LOG: 'bogus' }).logLevel, 'error', 'the command line wins, the variable is not read')
  t.equal(serve(['--log-format=json'], { DYN_ROUTER_LOG_FORMAT: 'pretty' }).logFormat, 'json')
  t.equal(serve([], { DYN_ROUTER_LOG_FORMAT: 'pretty' }).logFormat, 'pretty')
  t.throws(() => serve([], { DYN_LOG: 'verbose' }), /DYN_LOG \(--log-level\) must be one of error\|warn\|info\|debug\|trace\|off/)
  t.throws(() => serve(['--log-format', 'xml']), /--log-format must be one of auto\|json\|pretty/)
})

t.test('levels: lines below the level are not written; silent writes nothing', async (t) => {
  const { logger, capture } = captured('warn')
  logger.debug('d')
  logger.info('i')
  logger.warn({ code: 'KVR_X' }, 'w')
  logger.error('e')
  t.same(
    capture.records.map((x) => [x.level, x.msg]),
    [
      ['warn', 'w'],
      ['error', 'e'],
    ],
  )
  t.equal(capture.records[0]?.code, 'KVR_X')
  t.match(capture.records[0]?.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'ISO time')
  const quiet = captured('silent')
  quiet.logger.error('e')
  t.equal(quiet.capture.text, '')
})

t.test('formats: JSON lines, or one short line for people; auto follows the destination', async (t) => {
  const json = new Capture()
  createLogger({ format: 'json', destination: json }).info({ worker_id: '7', n: 3 }, 'hello')
  t.match(JSON.parse(json.text), { level: 'info', msg: 'hello', worker_id: '7', n: 3 })
  const pretty = new Capture()
  createLogger({ format: 'pretty', destination: pretty }).warn({ worker_id: '7', why: 'two words' }, 'hello')
  t.match(pretty.text, /^\d\d:\d\d:\d\d\.\d{3} WARN {2}hello worker_id=7 why="two words"\n$/)
  t.notOk(pretty.text.includes('\u001b['), 'no colours off a terminal')
  const tty = Object.assign(new Capture(), { isTTY: true })
  createLogger({ destination: tty }).info('on a terminal')
  t.match(tty.text, /^\d\d:\d\d:\d\d\.\d{3} .*INFO.* on a terminal\n$/, 'auto: pretty on a terminal')
  const pipe = new Capture()
  createLogger({ destination: pipe }).info('in a pipe')
  t.equal(JSON.parse(pipe.text).msg, 'in a pipe', 'auto: JSON elsewhere')
  const err = prettyLine(
    JSON.stringify({ level: 'error', time: '2025-01-02T03:04:05.678Z', msg: 'failed', err: { message: 'boom', stack: 'Error: boom\n    at x' } }),
    false,
  )
  t.equal(err, '03:04:05.678 ERROR failed err=boom\n    Error: boom\n        at x\n', "an error's stack under its line")
})

t.test('secrets: the API key, URL credentials and Bearer tokens never reach a line', async (t) => {
  addSecret('sekrit-key-123')
  const { logger, capture } = captured('trace')
  logger.info(
    { url: 'nats://alice:pa55word@10.0.0.1:4222', token: 'nats://s3cr3tt0ken@10.0.0.2:4222', header: 'Bearer sekrit-key-123' },
    'said sekrit-key-123 to http://bob:hunter2@etcd:2379',
  )
  logger.warn({ authorization: 'Bearer abc.def', apiKey: 'whatever', config: { apiKey: 'nested' } }, 'authorization: bearer xyz789')
  logger.error({ err: new Error('connect to http://carol:opensesame@host:80 failed', { cause: new Error('Bearer qwerty') }) }, 'failed')
  logger.error(new Error('etcd at http://dave:letmein@h:2379 refused'))
  const text = capture.text
  for (const s of ['pa55word', 's3cr3tt0ken', 'sekrit-key-123', 'hunter2', 'abc.def', 'xyz789', 'whatever', 'nested', 'opensesame', 'qwerty', 'letmein'])
    t.notMatch(text, s, `${s} is not written`)
  t.match(text, 'nats://[redacted]@10.0.0.1:4222', 'the rest of a URL stays')
  t.equal(capture.records.length, 4)
  t.equal(redactSecrets('http://h:1/path?q=a@b'), 'http://h:1/path?q=a@b', 'an @ after the host is no credential')
  t.equal(redactSecrets('nats://a:b@h1:4222,nats://c:d@h2:4222'), 'nats://[redacted]@h1:4222,nats://[redacted]@h2:4222')
})

t.test('the limiter: the first line at once, one more at the end of the period with the rest counted', async (t) => {
  const { logger, capture } = captured('info')
  const lim = new LogLimiter(logger, 200)
  for (let i = 0; i < 25; i++) lim.warn('upstream_failed', { i }, 'a worker failed')
  t.same(
    capture.records.map((x) => [x.class, x.i, x.suppressed]),
    [['upstream_failed', 0, 0]],
    'one line now',
  )
  lim.info('other', {}, 'another class is not held back')
  t.equal(capture.records.length, 2)
  await new Promise((r) => setTimeout(r, 300))
  const lines = capture.records.filter((x) => x.class === 'upstream_failed')
  t.same(
    lines.map((x) => [x.i, x.suppressed]),
    [
      [0, 0],
      [24, 23],
    ],
    'the last one, with the 23 between them counted',
  )
  t.equal(
    lines.reduce((n, x) => n + 1 + (x.suppressed as number), 0),
    25,
    'every occurrence is a line or counted in one',
  )
  // a quiet period later: the next one goes out at once, nothing held
  await new Promise((r) => setTimeout(r, 250))
  lim.warn('upstream_failed', { i: 25 }, 'a worker failed')
  t.match(capture.records.at(-1), { class: 'upstream_failed', i: 25, suppressed: 0 }, 'at once')
  // lines standing for several occurrences
  lim.warn('events_malformed', { count: 5 }, 'malformed', 5)
  lim.warn('events_malformed', { count: 7 }, 'malformed', 7)
  lim.warn('events_malformed', { count: 2 }, 'malformed', 2)
  lim.flush()
  t.same(
    capture.records.filter((x) => x.class === 'events_malformed').map((x) => [x.count, x.suppressed]),
    [
      [5, 0],
      [2, 7],
    ],
    'counts add up: 5 + 2 + 7',
  )
  // a level that is off: nothing written, nothing held
  const quiet = captured('error')
  const q = new LogLimiter(quiet.logger, 50)
  q.warn('x', {}, 'x')
  q.flush()
  t.equal(quiet.capture.text, '')
})

t.test("the shards' counters: a line per class that grew, with how many and the latest sample", async (t) => {
  const capture = captureProcessLog('info', 60_000)
  const shard = {
    shard: 0,
    malformed: 0,
    gaps: 0,
    rejected: { parent_block_not_found: 0, capacity: 0 },
    engine: { malformed: { malformed_msgpack: 0 }, skipped: { attention_kind: 0 } },
  }
  const src: ShardCountersSource & { dropped: number; rejectedAtIntake: number } = { counters: () => [shard], dropped: 0, rejectedAtIntake: 2 }
  const w = new ShardLogWatch(src, 3_600_000)
  t.teardown(() => w.close())
  w.poll()
  t.equal(capture.text, '', 'what was counted before the watch began is not news')
  shard.malformed = 3
  src.rejectedAtIntake = 3
  shard.rejected.parent_block_not_found = 4
  shard.rejected.capacity = 1
  shard.gaps = 2
  src.dropped = 6
  shard.engine.malformed.malformed_msgpack = 1
  shard.engine.skipped.attention_kind = 9
  w.sample({ what: 'events_malformed', code: 'KVR_ERR_EVENT_MISSING_FIELD', error: 'missing field event_id at byte 17', bytes: 40 })
  w.sample({ what: 'events_rejected', reason: 'capacity', lo: 5, hi: 1, dp_rank: 0, idLo: 9, idHi: 0 })
  w.poll()
  const by = (cls: string): Record<string, unknown> | undefined => capture.records.find((x) => x.class === cls)
  t.match(by('events_malformed'), {
    level: 'warn',
    count: 4,
    suppressed: 0,
    last: { code: 'KVR_ERR_EVENT_MISSING_FIELD', error: 'missing field event_id at byte 17' },
  })
  t.match(by('events_rejected'), {
    level: 'warn',
    count: 5,
    reasons: { parent_block_not_found: 4, capacity: 1 },
    last: { reason: 'capacity', worker_id: String(2n ** 32n + 5n), event_id: '9' },
  })
  t.match(by('event_gaps'), { level: 'warn', count: 2 })
  t.match(by('events_dropped'), { level: 'warn', count: 6 })
  t.match(by('engine_batches_malformed'), { level: 'warn', count: 1, reasons: { malformed_msgpack: 1 } })
  t.match(by('engine_events_skipped'), { level: 'info', count: 9, reasons: { attention_kind: 9 } })
  t.equal(capture.records.length, 6)
  // a shard restarted: its counters start over, and what it counts again is new
  shard.malformed = 1
  w.poll()
  t.equal(capture.records.length, 6, 'held back: within the period of its class')
  const lim = (await import('../../src/runtime/log.js')).limited
  lim.flush()
  t.match(capture.records.at(-1), { class: 'events_malformed', count: 1, suppressed: 0 })
})

t.test('bookings that outlive the stale limit are freed with a line', async (t) => {
  const capture = captureProcessLog('info')
  const s = new ActiveSequences(100)
  s.ensureSlots(1)
  s.add('a', booking({ slot: 0, prefillTokens: 10 }), 0)
  s.add('b', booking({ slot: 0, prefillTokens: 10 }), 50)
  t.equal(s.expireStale(120), 1)
  t.match(capture.records, [{ level: 'warn', class: 'bookings_expired', count: 1, own: 1, peers: 0, stale_secs: 0.1 }])
})
