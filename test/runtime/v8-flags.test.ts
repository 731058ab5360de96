// The router's V8 flags have one source, src/runtime/v8-flags.ts: the build writes them into the
// shebang of the `kv-router` executable (scripts/build.mjs), which `npm start` and the Dockerfile
// run, and the benchmarks and tests import them. These checks hold the build to the list, and check
// that the flags still mean what they did: a renamed V8 flag would be ignored with only a warning.
import t from 'tap'
import { chmodSync, readFileSync } from 'node:fs'
import { spawnSync } from 'node:child_process'
import { ROUTER_V8_FLAGS } from '../../src/runtime/v8-flags.js'
import { rootUrl } from '../helpers/paths.js'

const root = rootUrl
const cli = new URL('dist/src/main.js', root).pathname

t.test('the built executable passes exactly the flags, and the source names none', async (t) => {
  t.equal(readFileSync(cli, 'utf8').split('\n')[0], `#!/usr/bin/env -S node ${ROUTER_V8_FLAGS.join(' ')}`)
  const source = readFileSync(new URL('src/main.ts', root), 'utf8')
  t.equal(source.split('\n')[0], '#!/usr/bin/env node', 'a plain shebang, which the build replaces')
  for (const f of ROUTER_V8_FLAGS) t.notOk(source.includes(f), `src/main.ts does not repeat ${f}`)
})

t.test('npm start and the Dockerfile run the executable, not node with a copy of the flags', async (t) => {
  const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { scripts: Record<string, string>; bin: Record<string, string> }
  const start = pkg.scripts.start ?? ''
  t.match(start, /&& dist\/src\/main\.js serve /)
  t.equal(pkg.bin['kv-router'], 'dist/src/main.js')
  const dockerfile = readFileSync(new URL('Dockerfile', root), 'utf8')
  for (const text of [start, dockerfile]) for (const f of ROUTER_V8_FLAGS) t.notOk(text.includes(f), `no copy of ${f}`)
})

t.test('the flags give a fixed 64 MB young generation', async (t) => {
  const r = spawnSync(
    process.execPath,
    [
      ...ROUTER_V8_FLAGS,
      '-e',
      "const s = require('v8').getHeapSpaceStatistics().find((x) => x.space_name === 'new_space'); process.stdout.write(String(s.space_size))",
    ],
    { encoding: 'utf8' },
  )
  t.equal(r.status, 0, r.stderr)
  t.equal(r.stderr, '', 'no warning about an unknown flag')
  t.equal(Number(r.stdout), 64 * 1024 * 1024)
})

t.test('the executable runs through its shebang', async (t) => {
  chmodSync(cli, 0o755)
  const r = spawnSync(cli, ['serve', '--help'], {
    encoding: 'utf8',
    env: { ...process.env, PATH: `${process.execPath.replace(/\/node$/, '')}:${process.env.PATH ?? ''}` },
  })
  t.equal(r.status, 0, r.stderr)
  t.match(r.stdout, '--router-mode')
})

// What the scavenges promote after a full GC, in small steps with the event loop turning between
// them (V8 starts marking from a task), until 50 MB or so of dead objects are old; prints how much
// was old when the first mark-compact began, or null when none came.
const PROMOTE = `
const v8 = require('v8')
const old = (s) => s.heapSpaceStatistics.find((x) => x.spaceName === 'old_space').spaceUsedSize
gc()
const p = new v8.GCProfiler()
p.start()
const ring = []
const young = new Array(1024)
let i = 0
function step() {
  for (let k = 0; k < 10 && i < 500; k++, i++) {
    for (let j = 0; j < 32768; j++) young[j & 1023] = { j }
    const keep = new Array(3000)
    for (let j = 0; j < 3000; j++) keep[j] = { j }
    ring.push(keep)
    if (ring.length > 200) ring.shift()
  }
  if (i < 500) return setImmediate(step)
  const s = p.stop().statistics
  const base = s[0] ? old(s[0].beforeGC) : 0
  const mc = s.find((x) => x.gcType === 'MarkSweepCompact')
  const last = s.at(-1)
  const firstMarkCompactMb = mc ? (old(mc.beforeGC) - base) / 2 ** 20 : null
  process.stdout.write(JSON.stringify({ firstMarkCompactMb, grewMb: last ? (old(last.afterGC) - base) / 2 ** 20 : 0 }))
}
setImmediate(step)
`

function promote(flags: readonly string[]): { firstMarkCompactMb: number | null; grewMb: number } {
  const r = spawnSync(process.execPath, [...flags, '--expose-gc', '-e', PROMOTE], { encoding: 'utf8' })
  if (r.status !== 0) throw new Error(r.stderr)
  return JSON.parse(r.stdout) as { firstMarkCompactMb: number | null; grewMb: number }
}

t.test('the flags let the old generation take some 40 MB of promoted garbage without a mark-compact', async (t) => {
  const floor = ROUTER_V8_FLAGS.find((f) => f.startsWith('--initial-old-space-size='))
  t.ok(floor, 'the old generation has a floor')
  const withFloor = promote(ROUTER_V8_FLAGS)
  t.ok(withFloor.grewMb >= 40, `the old generation grew by ${withFloor.grewMb.toFixed(1)} MB`)
  t.equal(withFloor.firstMarkCompactMb, null, 'and was not collected')
  // the same without the floor, so that this test fails if the flag stops meaning what it did
  const without = promote(ROUTER_V8_FLAGS.filter((f) => f !== floor))
  t.not(without.firstMarkCompactMb, null, 'without the floor a mark-compact comes')
  t.ok((without.firstMarkCompactMb ?? Infinity) < 30, `after ${without.firstMarkCompactMb?.toFixed(1)} MB of promotion`)
})

// In a process started with the router's flags: the young generation (as each thread starts) and the old generation's
// first mark-compact of the main thread and of a worker thread started after
// workerHeapsAtDefaults() (or without it, `call` false), each promoting garbage as PROMOTE does.
interface ThreadHeap {
  youngMb: number
  firstMarkCompactMb: number | null
  grewMb: number
}

function threads(call: boolean): { reset: string[]; main: ThreadHeap; worker: ThreadHeap } {
  const v8Flags = new URL('dist/src/runtime/v8-flags.js', root).href
  // PROMOTE as a function of what to do with its line, run once in each thread
  const measure = `(function (done) {${PROMOTE.replace('process.stdout.write(', 'done(')}})`
  const probe = `
const v8 = require('v8')
const { Worker } = require('worker_threads')
const young = () => v8.getHeapSpaceStatistics().find((x) => x.space_name === 'new_space').space_size / 2 ** 20
const youngMb = young()
import(${JSON.stringify(v8Flags)}).then((m) => {
  const reset = ${call ? 'm.workerHeapsAtDefaults()' : '[]'}
  const inWorker = 'const { parentPort } = require("worker_threads"); const youngMb = require("v8").getHeapSpaceStatistics().find((x) => ' +
    'x.space_name === "new_space").space_size / 2 ** 20; ' + ${JSON.stringify(measure)} + '((s) => parentPort.postMessage({ youngMb, ...JSON.parse(s) }))'
  const w = new Worker(inWorker, { eval: true })
  w.on('error', (e) => { throw e })
  w.on('message', (worker) => {
    ${measure}((s) => process.stdout.write(JSON.stringify({ reset, worker, main: { youngMb, ...JSON.parse(s) } })))
  })
})
`
  const r = spawnSync(process.execPath, [...ROUTER_V8_FLAGS, '--expose-gc', '-e', probe], { encoding: 'utf8' })
  if (r.status !== 0) throw new Error(r.stderr)
  return JSON.parse(r.stdout) as ReturnType<typeof threads>
}

t.test('worker threads get V8 own heap sizes, the main thread keeps the flags', async (t) => {
  const before = threads(false)
  t.equal(before.worker.youngMb, 64, 'without the call a worker gets the 64 MB semi-space too')
  t.equal(before.worker.firstMarkCompactMb, null, 'and the old generation floor')
  const after = threads(true)
  t.same(after.reset, ['--min-semi-space-size', '--max-semi-space-size', '--initial-old-space-size'])
  t.ok(after.worker.youngMb <= 16, `a worker started after the call sizes its young generation itself (${after.worker.youngMb} MB)`)
  t.not(after.worker.firstMarkCompactMb, null, 'and collects its old generation as V8 would')
  t.ok(after.main.youngMb >= 64, `the main thread keeps its young generation (${after.main.youngMb} MB)`)
  t.equal(after.main.firstMarkCompactMb, null, 'and its old generation floor')
  t.ok(after.main.grewMb >= 40, `(${after.main.grewMb.toFixed(1)} MB promoted)`)
})

t.test('only flags set as the router sets them are given back', async (t) => {
  // a process without them: nothing to do, and V8's flags are left as they are
  const { workerHeapsAtDefaults } = await import('../../src/runtime/v8-flags.js')
  t.same(workerHeapsAtDefaults([]), [])
  t.same(workerHeapsAtDefaults(['--max-semi-space-size=32']), [], "an operator's own size stays")
})
