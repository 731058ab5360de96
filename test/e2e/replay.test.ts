// The whole distributed loop as processes: a real nats-server and etcd, `kv-router serve`
// discovering engines in etcd and indexing their events from NATS, `kv-router mocker` engines
// registering and publishing, and `kv-router replay` sending the first 200 requests of the
// Mooncake trace at high speed. Zero errors; then the router's index (GET /v1/kv/dump) must
// hold, per worker, exactly the blocks each engine's pool holds (its worker query's TreeDump).
import t from 'tap'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { startEtcd, startNats } from '../../src/deploy/services.js'
import { waitUntil } from '../helpers/wait.js'
import { runCli as run } from '../helpers/cli.js'
import { fromRoot } from '../helpers/paths.js'

const trace = fromRoot('data', 'conversation_trace.jsonl')
const ENGINES = 4

/** block_hash values of the Stored events in a JSON answer, as decimal strings. */
function storedHashes(json: string): Set<string> {
  // read from the text: JSON.parse would round hashes above 2^53
  const out = new Set<string>()
  for (const m of json.matchAll(/"block_hash":(\d+)/g)) out.add(m[1] as string)
  return out
}

t.test('replay of 200 trace requests through serve + mocker over NATS and etcd', async (t) => {
  const nats = await startNats()
  t.teardown(() => nats.stop())
  const etcd = await startEtcd()
  t.teardown(() => etcd.stop())

  const router = run([
    'serve',
    '--http-host',
    '127.0.0.1',
    '--http-port',
    '0',
    '--router-block-size',
    '64',
    '--router-event-threads',
    '1',
    '--nats-url',
    nats.url,
    '--etcd-url',
    etcd.url,
  ])
  t.teardown(async () => {
    router.p.kill('SIGTERM')
    await router.exited
  })
  await waitUntil(`router listening (${router.err()})`, () => /listening on http:\/\/\S+/.test(router.out()), 20_000)
  const base = (/listening on (http:\/\/\S+)/.exec(router.out()) as RegExpExecArray)[1] as string

  const mocker = run([
    'mocker',
    '--num-workers',
    String(ENGINES),
    '--block-size',
    '64',
    '--speedup-ratio',
    '0',
    '--num-gpu-blocks-override',
    '16384',
    '--nats-url',
    nats.url,
    '--etcd-url',
    etcd.url,
  ])
  t.teardown(async () => {
    mocker.p.kill('SIGTERM')
    await mocker.exited
  })
  await waitUntil(`mocker ready (${mocker.err()})`, () => /kv-router mocker: ready \d+ engine\(s\)/.test(mocker.out()), 20_000)
  const urls = (/ready \d+ engine\(s\) ([^\n]+)/.exec(mocker.out()) as RegExpExecArray)[1]?.trim().split(/\s+/) ?? []
  t.equal(urls.length, ENGINES)
  await waitUntil(
    'the router discovered every engine',
    async () => {
      const r = (await (await fetch(`${base}/v1/workers`)).json()) as { workers: unknown[] }
      return r.workers.length === ENGINES
    },
    10_000,
  )

  const dir = mkdtempSync(join(tmpdir(), 'kvr-replay-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const output = join(dir, 'records.jsonl')
  const replay = run(['replay', '--trace', trace, '--url', base, '--limit', '200', '--speedup', '200', '--output', output, '--quiet'])
  const code = await replay.exited
  t.equal(code, 0, `replay exits 0 (${replay.err()})`)
  t.match(replay.out(), /200/, 'the summary counts the requests')
  const records = readFileSync(output, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { status: number; error: string | null; worker: string | null; cached_tokens: number; prompt_tokens: number })
  t.equal(records.length, 200, 'one record per request')
  t.equal(records.filter((r) => r.status !== 200 || r.error !== null).length, 0, 'zero errors')
  t.equal(new Set(records.map((r) => r.worker)).size, ENGINES, 'every engine served some of them')
  t.ok(records.reduce((s, r) => s + r.cached_tokens, 0) > 0, 'the conversation prefixes hit the caches')

  // the router's index against each engine's own pool, per worker (events arrive over NATS, so
  // allow them a moment to land)
  const workers = (await (await fetch(`${base}/v1/workers`)).text()).match(/"id":\d+/g)?.map((s) => s.slice(5)) ?? []
  t.equal(workers.length, ENGINES)
  let mismatch = ''
  let checks = 0
  await waitUntil(
    "the router's index to equal the engines' pools",
    async () => {
      mismatch = ''
      checks++
      for (const id of workers) {
        const engine = await Promise.all(
          urls.map(async (u) => {
            const r = await fetch(`${u}/v1/kv/query`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: `{"worker_id":${id},"start_event_id":null,"end_event_id":null}`,
            })
            return r.status === 200 ? await r.text() : null
          }),
        )
        const dump = engine.find((x) => x !== null)
        if (dump === undefined || dump === null) {
          mismatch = `no engine answers for worker ${id}`
          return false
        }
        const pool = storedHashes(dump)
        const index = storedHashes(await (await fetch(`${base}/v1/kv/dump?worker_id=${id}`)).text())
        if (pool.size === 0 || pool.size !== index.size || [...pool].some((h) => !index.has(h))) {
          mismatch = `worker ${id}: pool ${pool.size} blocks, index ${index.size}`
          return false
        }
      }
      return true
    },
    15_000,
  )
  t.equal(mismatch, '', `every worker: index and pool hold the same blocks (after ${checks} check(s))`)
})
