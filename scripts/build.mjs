#!/usr/bin/env node
// Builds dist/ and makes dist/src/main.js the `kv-router` executable: its shebang passes the
// router's V8 flags, read from src/runtime/v8-flags.ts (the one list of them; see there why each).
//   node scripts/build.mjs             compile (incrementally) and write the shebang
//   node scripts/build.mjs --if-stale  the same, only when a source is newer than the last build:
//                                      `npm start` runs it, so a start after no edit costs a few ms
import { spawnSync } from 'node:child_process'
import { chmodSync, copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = fileURLToPath(new URL('../', import.meta.url))
const stamp = join(root, 'dist', '.built')
const main = join(root, 'dist', 'src', 'main.js')

/** The newest modification time (ms) of the files the build reads. */
function newestSource() {
  let newest = 0
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name)
      if (e.isDirectory()) walk(p)
      else if (e.name.endsWith('.ts') || e.name.endsWith('.html')) newest = Math.max(newest, statSync(p).mtimeMs)
    }
  }
  // what the router is built from: a test or benchmark edited since needs no rebuild to start it
  for (const dir of ['src', 'workers']) if (existsSync(join(root, dir))) walk(join(root, dir))
  for (const f of ['tsconfig.json', 'package.json', 'scripts/build.mjs']) newest = Math.max(newest, statSync(join(root, f)).mtimeMs)
  return newest
}

if (process.argv.includes('--if-stale') && existsSync(stamp) && existsSync(main) && statSync(stamp).mtimeMs >= newestSource()) process.exit(0)

const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc')
const r = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.json'), '--incremental'], { stdio: 'inherit' })
if (r.status !== 0) process.exit(r.status ?? 1)

// files the code reads beside itself (the status page), which tsc does not copy
const copyAssets = (dir) => {
  for (const e of readdirSync(join(root, dir), { withFileTypes: true })) {
    const rel = join(dir, e.name)
    if (e.isDirectory()) copyAssets(rel)
    else if (e.name.endsWith('.html')) {
      mkdirSync(join(root, 'dist', dir), { recursive: true })
      copyFileSync(join(root, rel), join(root, 'dist', rel))
    }
  }
}
copyAssets('src')

// tsc leaves the output of a deleted or renamed source behind, and the suite runs the compiled
// tests: a stale dist/test/x.test.js would still run (and pass) after test/x.test.ts is gone
const prune = (dir) => {
  if (!existsSync(join(root, 'dist', dir))) return
  for (const e of readdirSync(join(root, 'dist', dir), { withFileTypes: true })) {
    const rel = join(dir, e.name)
    if (e.isDirectory()) prune(rel)
    else if (/\.(js|js\.map|d\.ts)$/.test(e.name) && !existsSync(join(root, rel.replace(/\.(js|js\.map|d\.ts)$/, '.ts')))) rmSync(join(root, 'dist', rel))
  }
}
for (const dir of ['src', 'workers', 'bench', 'test', 'support']) prune(dir)

const { ROUTER_V8_FLAGS } = await import(pathToFileURL(join(root, 'dist', 'src', 'runtime', 'v8-flags.js')).href)
const text = readFileSync(main, 'utf8')
// src/main.ts starts with a plain node shebang, so the line count (and the source map) stay as they are
const body = text.startsWith('#!') ? text.slice(text.indexOf('\n') + 1) : text
writeFileSync(main, `#!/usr/bin/env -S node ${ROUTER_V8_FLAGS.join(' ')}\n${body}`)
chmodSync(main, 0o755)
writeFileSync(stamp, `${new Date().toISOString()}\n`)
