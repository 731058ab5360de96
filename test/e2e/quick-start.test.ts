// The README's quick start as a user runs it: the command line of `npm start` (read from
// package.json, so the two cannot drift apart) with only the port changed, ready after at most 5
// seconds of its own CPU time (about 2 s on a loaded 2-core machine; wall time on a busy test
// machine says more about the other processes than about the start), then the README's own curl body twice: the second answer is a prefix-cache hit on the
// same worker, as the README says. SIGINT then stops it cleanly.
import t from 'tap'
import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { dirname } from 'node:path'
import { rootUrl } from '../helpers/paths.js'

const root = rootUrl

/** CPU time (user + system, all threads) a process has used so far, from /proc. */
function cpuTimeMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  // fields after the command name (which may hold spaces, inside parentheses): utime and stime are the 12th and 13th
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return ((Number(f[11]) + Number(f[12])) * 1000) / 100
}
const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as { scripts: { start: string } }
const readme = readFileSync(new URL('README.md', root), 'utf8')

t.test('npm start: ready within 5 s of CPU time, and the README curl works, with a cache hit the second time', async (t) => {
  // "node scripts/build.mjs --if-stale && dist/src/main.js serve ARGS": the executable, through its shebang, on a free port
  const command = pkg.scripts.start.split('&&').pop()?.trim() ?? ''
  const words = command.split(/\s+/)
  t.equal(words[0], 'dist/src/main.js', `npm start runs the executable: ${command}`)
  const exe = new URL(words[0] as string, root).pathname
  const args = words.slice(1)
  t.ok(args.includes('serve') && args.includes('--embedded-fleet'), 'it serves with the embedded fleet')
  const curl = readme.match(/curl -s localhost:8000\/v1\/completions -H 'content-type: application\/json' \\\n\s+-d '([^']+)'/)
  t.ok(curl !== null, 'the README has the quick-start curl')
  const body = (curl as RegExpMatchArray)[1] as string

  const started = Date.now()
  // PATH leads to this node, which the shebang's `env` finds
  const p = spawn(exe, [...args, '--http-host', '127.0.0.1', '--http-port', '0'], { env: { PATH: `${dirname(process.execPath)}:${process.env.PATH ?? ''}` } })
  const exit = new Promise<number | null>((resolve) => p.on('close', (code) => resolve(code)))
  t.teardown(() => {
    p.kill('SIGKILL')
  })
  let out = ''
  let err = ''
  p.stderr.on('data', (d: Buffer) => (err += d.toString()))
  const base = await new Promise<string>((resolve, reject) => {
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const m = out.match(/listening on (http:\/\/\S+)/)
      if (m !== null) resolve(m[1] as string)
    })
    void exit.then((code) => reject(new Error(`exited ${code}: ${out} ${err}`)))
  })
  const readyMs = Date.now() - started
  const cpuMs = cpuTimeMs(p.pid as number)
  t.ok(cpuMs < 5000, `listening after ${cpuMs} ms of CPU time (${readyMs} ms of wall time)`)
  t.ok(readyMs < 30_000, 'and not stuck')
  t.match(out, /4 embedded simulated/)

  const ask = async () => {
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body })
    t.equal(r.status, 200)
    return (await r.json()) as {
      choices: { text: string }[]
      usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens: number } }
      nvext: { worker_id: { decode_worker_id: number } }
    }
  }
  const first = await ask()
  t.equal(first.choices.length, 1)
  t.ok((first.choices[0]?.text.length ?? 0) > 0, 'an answer')
  const prompt = (JSON.parse(body) as { prompt: string }).prompt
  t.equal(first.usage.prompt_tokens, Buffer.byteLength(prompt), 'the bytes tokenizer: one token per byte')
  // the engine's KV events reach the index asynchronously: ask until the second answer hits
  let second = await ask()
  for (let i = 0; i < 20 && (second.usage.prompt_tokens_details?.cached_tokens ?? 0) === 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50))
    second = await ask()
  }
  const blocks = Math.floor(Buffer.byteLength(prompt) / 16)
  t.equal(second.usage.prompt_tokens_details?.cached_tokens, blocks * 16, `every complete 16-token block is cached (${blocks * 16}, the README says 80)`)
  t.match(readme, `cached_tokens: ${blocks * 16}`, 'the README states that figure')
  t.equal(second.nvext.worker_id.decode_worker_id, first.nvext.worker_id.decode_worker_id, 'on the same worker')

  p.kill('SIGINT')
  t.equal(await exit, 0, 'SIGINT stops it cleanly')
  t.match(out, /kv-router: SIGINT: draining/)
  t.match(out, /kv-router: stopped\n/)
})
