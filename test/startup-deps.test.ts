// A router without NATS or etcd (the default, and `npm start`) must not load their clients: without
// them it starts sooner and smaller (docs/operations.md, start-up). They are loaded
// where a connection is made (src/transport/nats.ts, src/transport/etcd.ts, src/sim/mocker/); the
// integration tests show those paths still work against the real services.
import t from 'tap'
import { spawn } from 'node:child_process'
import { fromRoot } from './helpers/paths.js'

const cli = fromRoot('dist', 'src', 'main.js')

// Preloaded into the process: once it prints its listening line, it reports whether either
// package is in the CommonJS module cache (both are CommonJS packages, cached there even when
// imported from ESM).
const PROBE = `
import { createRequire } from 'node:module'
const cache = createRequire('/').cache
const write = process.stdout.write.bind(process.stdout)
process.stdout.write = (chunk, ...rest) => {
  if (String(chunk).includes('listening on')) setImmediate(() => {
    const keys = Object.keys(cache)
    write('LOADED etcd3=' + keys.some((k) => k.includes('/node_modules/etcd3/')) + ' nats=' + keys.some((k) => k.includes('/node_modules/nats/')) + '\\n')
  })
  return write(chunk, ...rest)
}
`
const probeFlag = `--import=data:text/javascript,${encodeURIComponent(PROBE)}`

function loadedAtListen(args: string[]): Promise<{ etcd3: boolean; nats: boolean }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [probeFlag, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    const timer = setTimeout(() => {
      p.kill('SIGKILL')
      reject(new Error(`no report within 30 s: ${out} ${err}`))
    }, 30_000)
    p.stderr.on('data', (d: Buffer) => (err += d.toString()))
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const m = /LOADED etcd3=(true|false) nats=(true|false)/.exec(out)
      if (m === null) return
      clearTimeout(timer)
      p.kill('SIGKILL')
      resolve({ etcd3: m[1] === 'true', nats: m[2] === 'true' })
    })
    // 'close', not 'exit': a child that exits right after its report may still have output unread
    p.on('close', (code) => {
      clearTimeout(timer)
      reject(new Error(`exited ${code} before reporting: ${out} ${err}`))
    })
  })
}

t.test('the probe sees a package that was loaded', async (t) => {
  const r = await loadedAtListen(['--input-type=module', '-e', "await import('etcd3'); await import('nats'); console.log('listening on nothing')"])
  t.same(r, { etcd3: true, nats: true })
})

t.test('serve with static workers loads neither the etcd nor the NATS client', async (t) => {
  const r = await loadedAtListen([cli, 'serve', '--http-host', '127.0.0.1', '--http-port', '0', '--worker', '1=http://127.0.0.1:9'])
  t.same(r, { etcd3: false, nats: false })
})

t.test('serve with the embedded fleet (npm start) loads neither', async (t) => {
  const r = await loadedAtListen([cli, 'serve', '--http-host', '127.0.0.1', '--http-port', '0', '--embedded-fleet', '2', '--tokenizer', 'bytes'])
  t.same(r, { etcd3: false, nats: false })
})
