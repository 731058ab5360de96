// The status page in a real browser: Debian's chromium driven by playwright-core against
// `kv-router serve --embedded-fleet 3 --api-key …`. The page shows the fleet's workers, and a
// request routed meanwhile appears on it (the decision with its candidates, the counts) without a
// reload, with nothing on the console. Then the key prompt on a phone-sized screen, the worker
// health values the probes may report (and none), and the fallback to polling.
// Chromium is required, not optional: CHROMIUM_PATH, else `chromium` on the PATH (.ci/run
// installs Debian's package).
import t from 'tap'
import { spawn } from 'node:child_process'
import type { ChildProcessWithoutNullStreams } from 'node:child_process'
import { chromium } from 'playwright-core'
import type { Browser, BrowserContext, ConsoleMessage, Page } from 'playwright-core'
import { cliArgv } from '../helpers/cli.js'
import { requireExecutable } from '../../src/deploy/services.js'

const KEY = 'status-page-key'
const KEY_ITEM = 'kv-router.api-key'
const executablePath = (() => {
  try {
    return requireExecutable('chromium', 'chromium', 'CHROMIUM_PATH')
  } catch (err) {
    throw new Error(`the status page's browser test needs Chromium (set CHROMIUM_PATH, or put chromium on the PATH): ${(err as Error).message}`)
  }
})()

function start(args: string[]): Promise<{ p: ChildProcessWithoutNullStreams; base: string; exit: Promise<number | null> }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, cliArgv(args), { env: { PATH: process.env.PATH } })
    let out = ''
    let err = ''
    const exit = new Promise<number | null>((r) => p.on('close', (code) => r(code)))
    const timer = setTimeout(() => reject(new Error(`not ready: ${out} ${err}`)), 30_000)
    p.stdout.on('data', (d: Buffer) => {
      out += d.toString()
      const m = /listening on (http:\/\/\S+)/.exec(out)
      if (m !== null) {
        clearTimeout(timer)
        resolve({ p, base: m[1] as string, exit })
      }
    })
    p.stderr.on('data', (d: Buffer) => (err += d.toString()))
    p.on('close', (code) => {
      clearTimeout(timer)
      reject(new Error(`exited ${code}: ${out} ${err}`))
    })
  })
}

const router = await start([
  'serve',
  '--http-host',
  '127.0.0.1',
  '--http-port',
  '0',
  '--embedded-fleet',
  '3',
  '--tokenizer',
  'bytes',
  '--router-block-size',
  '16',
  '--router-event-threads',
  '1',
  '--api-key',
  KEY,
])
const base = router.base
const auth = { authorization: `Bearer ${KEY}` }
// the flags a sandboxless machine without outside network needs: no background connections
const browser: Browser = await chromium.launch({
  executablePath,
  headless: true,
  args: [
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
})
t.teardown(async () => {
  await browser.close()
  router.p.kill('SIGTERM')
  await router.exit
})

interface WorkerRow {
  id_str: string
  url: string
  health?: string
}
const workers = (await (await fetch(`${base}/v1/workers`, { headers: auth })).json()) as { workers: WorkerRow[] }

async function complete(prompt: string): Promise<number> {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { ...auth, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'kv-router-model', prompt, max_tokens: 2 }),
  })
  if (r.status !== 200) throw new Error(`completion answered ${r.status}: ${await r.text()}`)
  return Number(r.headers.get('x-worker-id'))
}

/** A page that records what the console and uncaught errors say. */
async function open(ctx: BrowserContext): Promise<{ page: Page; console: ConsoleMessage[]; errors: Error[] }> {
  const page = await ctx.newPage()
  const console: ConsoleMessage[] = []
  const errors: Error[] = []
  page.on('console', (m) => {
    if (m.type() === 'error' || m.type() === 'warning') console.push(m)
  })
  page.on('pageerror', (e) => errors.push(e))
  return { page, console, errors }
}
// browser-side code as text: the tests are type-checked without the DOM's types
const keyScript = `sessionStorage.setItem(${JSON.stringify(KEY_ITEM)}, ${JSON.stringify(KEY)})`
const storedKey = `sessionStorage.getItem(${JSON.stringify(KEY_ITEM)})`

t.test('the fleet, then a request routed meanwhile appears without a reload; nothing on the console', async (t) => {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } })
  t.teardown(() => ctx.close())
  // the key as the page keeps it after it was entered once in this tab
  await ctx.addInitScript({ content: keyScript })
  const { page, console, errors } = await open(ctx)
  const res = await page.goto(`${base}/`)
  t.equal(new URL(page.url()).pathname, '/status', '/ leads to the page')
  t.equal(res?.status(), 200)
  await page.waitForSelector('body[data-state="live"]', { timeout: 15_000 })
  await page.waitForSelector('#workers tbody tr[data-worker-id]')
  const ids = await Promise.all((await page.locator('#workers tbody tr').all()).map((r) => r.getAttribute('data-worker-id')))
  t.same(ids.sort(), workers.workers.map((w) => w.id_str).sort(), 'every worker of the fleet')
  for (const w of workers.workers) {
    const row = page.locator(`#workers tbody tr[data-worker-id="${w.id_str}"]`)
    t.equal(await row.locator('td[data-label="URL"]').textContent(), w.url, `worker ${w.id_str}'s URL, with the key`)
    t.equal(await row.locator('td[data-label="Health"]').textContent(), w.health ?? '—', `worker ${w.id_str}'s health as /v1/workers says`)
    t.equal(await row.locator('td[data-label="Index"]').textContent(), 'exact')
    // the router learns engine models by default: the prior until the worker has served requests
    t.equal(await row.locator('td.speed').textContent(), '1.00 / 1.00', `worker ${w.id_str}'s speeds, the prior`)
    t.match(await row.locator('td.speed').getAttribute('title'), /^rank 0: prefill 1\.00 \(prior, 0 TTFT/)
  }
  t.ok(await page.locator('#workers th.engine').first().isVisible(), 'the engine columns are shown')
  t.equal(await page.locator('#decisions li').count(), 0, 'no decision yet')
  t.match(await page.locator('#t-routed .sub').textContent(), /^0 in all/)
  await page.evaluate('window.marker = 1')

  const prompt = 'A status page test prompt, long enough to fill a few sixteen-byte blocks of the cache.'
  const chosen = await complete(prompt)
  const item = page.locator('#decisions li').first()
  await item.waitFor({ timeout: 10_000 })
  t.match(await item.locator('.chosen-worker').textContent(), `worker ${chosen}`, 'the decision, with the worker it chose')
  const candidates = item.locator('table.candidates tbody tr')
  t.equal(await candidates.count(), 3, 'every candidate with its cost terms (the page watches, so it was explained)')
  t.match(await item.locator('tr.chosen td').first().textContent(), `→ ${chosen}`, 'the chosen one marked')
  t.equal((await item.locator('table.candidates tbody tr').first().locator('td').allTextContents()).length, 6, 'overlap, prefill, decode, cost and cached')
  // waited for through locators: the page's policy refuses the evaluated strings of waitForFunction
  await page.locator('#t-routed .sub', { hasText: /^1 in all/ }).waitFor({ timeout: 10_000 })
  // the engine's KV events reach the index: the chosen worker's cached blocks go up on the page
  await page.locator(`#workers tr[data-worker-id="${chosen}"] td[data-label="Cached blocks"]`, { hasText: /^[1-9]/ }).waitFor({ timeout: 10_000 })
  // the same prompt again: its blocks are cached where the first went
  t.equal(await complete(prompt), chosen, 'a repeated prompt goes where it is cached')
  await page.locator('#decisions li').nth(1).waitFor({ timeout: 10_000 })
  const blocks = Math.floor(Buffer.byteLength(prompt) / 16)
  t.match(await page.locator('#decisions li').first().textContent(), `${blocks}/${blocks} blocks cached (100%)`, 'the second decision shows its hit')
  t.match(await page.locator('#t-events .sub').textContent(), /^[1-9]/, 'KV events applied are counted')
  t.equal(await page.evaluate('window.marker'), 1, 'all of it without a reload')
  t.same(
    console.map((m) => m.text()),
    [],
    'no console errors or warnings',
  )
  t.same(
    errors.map((e) => e.message),
    [],
    'no uncaught errors',
  )
})

t.test('on a phone: the page asks for the key, refuses a wrong one, and fits the screen', async (t) => {
  const ctx = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true })
  t.teardown(() => ctx.close())
  const { page, console, errors } = await open(ctx)
  await page.goto(`${base}/status`)
  await page.waitForSelector('#key-panel:not([hidden])')
  t.ok(await page.locator('#main').isHidden(), 'nothing shown without the key')
  t.notMatch(await page.content(), /127\.0\.0\.1:\d+/, 'no worker URL without the key')
  await page.fill('#key-input', 'not-the-key')
  await page.click('#key-form button[type="submit"]')
  await page.waitForSelector('#key-error:not([hidden])')
  t.notMatch(await page.content(), /127\.0\.0\.1:\d+/, 'nor with a wrong one')
  await page.fill('#key-input', KEY)
  await page.click('#key-form button[type="submit"]')
  await page.waitForSelector('body[data-state="live"]', { timeout: 15_000 })
  await page.waitForSelector('#workers tbody tr[data-worker-id]')
  t.equal(await page.evaluate(storedKey), KEY, 'kept for this tab')
  t.equal(await page.locator('#workers tbody tr[data-worker-id]').count(), workers.workers.length)
  t.ok(await page.locator('#forget-key').isVisible(), 'and can be forgotten')
  const width = (await page.evaluate('document.documentElement.scrollWidth')) as number
  t.ok(width <= 390, `nothing wider than the screen (${width} px)`)
  t.equal(await page.locator('#workers thead').isVisible(), false, 'the workers as cards, not a wide table')
  // the refused requests are the only thing on the console
  t.same(
    console.map((m) => m.text()).filter((x) => !/status of 401/.test(x)),
    [],
    'nothing on the console but the two refusals',
  )
  t.same(
    errors.map((e) => e.message),
    [],
  )
  await page.click('#forget-key')
  await page.waitForSelector('#key-panel:not([hidden])')
  t.equal(await page.evaluate(storedKey), null, 'forgotten')
})

t.test('worker health: the values the probes report, and none', async (t) => {
  const snapshot = (await (await fetch(`${base}/v1/status`, { headers: auth })).json()) as { workers: Record<string, unknown>[] }
  const [a, b, c] = snapshot.workers as [Record<string, unknown>, Record<string, unknown>, Record<string, unknown>]
  a.health = 'healthy'
  b.health = 'unreachable'
  delete c.health
  const ctx = await browser.newContext()
  t.teardown(() => ctx.close())
  await ctx.addInitScript({ content: keyScript })
  await ctx.route('**/v1/status/stream*', (route) =>
    route.fulfill({ status: 200, contentType: 'text/event-stream', body: `event: status\ndata: ${JSON.stringify(snapshot)}\n\n` }),
  )
  const { page, console, errors } = await open(ctx)
  await page.goto(`${base}/status`)
  await page.waitForSelector('#workers tbody tr[data-worker-id]')
  const badge = (w: Record<string, unknown>) => page.locator(`#workers tr[data-worker-id="${w.id_str as string}"] td[data-label="Health"] .badge`)
  t.equal(await badge(a).textContent(), 'healthy')
  t.match(await badge(a).getAttribute('class'), /\bgood\b/)
  t.equal(await badge(b).textContent(), 'unreachable')
  t.match(await badge(b).getAttribute('class'), /\bbad\b/)
  t.equal(await badge(c).textContent(), '—', 'a router without the field shows a dash')
  t.match(await badge(c).getAttribute('title'), /does not report/)
  t.same(
    console.map((m) => m.text()),
    [],
  )
  t.same(
    errors.map((e) => e.message),
    [],
  )
})

t.test("learned engine models: each worker-rank's speeds and samples; no columns while learning is off", async (t) => {
  const snapshot = (await (await fetch(`${base}/v1/status`, { headers: auth })).json()) as { workers: { id_str: string; ranks: Record<string, unknown>[] }[] }
  const [a, b] = snapshot.workers as [(typeof snapshot.workers)[number], (typeof snapshot.workers)[number]]
  const model = (prefill: number, decode: number, ttft: number, source: string) => ({
    source: { prefill: source, decode: source },
    prefill: { a_ms_per_token2: 4e-7, b_ms_per_token: 0.015 / prefill, c_ms: 16.5 / prefill },
    decode: { base_ms: 5.7 / decode, rise_ms: 28 / decode },
    prefill_speed: prefill,
    decode_speed: decode,
    samples: { ttft, itl: ttft * 20 },
    spread: { ttft: 0.08, itl: null },
  })
  a.ranks = [{ ...a.ranks[0], engine_model: model(0.412, 0.95, 120, 'learned') }]
  // a worker of two dp ranks learned apart: the range of their speeds, the sum of their samples
  b.ranks = [
    { ...b.ranks[0], dp_rank: 0, engine_model: model(0.5, 1, 40, 'learned') },
    { ...b.ranks[0], dp_rank: 1, engine_model: model(0.7, 1, 60, 'learned') },
  ]
  const off = { ...snapshot, workers: snapshot.workers.map((w) => ({ ...w, ranks: w.ranks.map((r) => ({ ...r, engine_model: null })) })) }
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } })
  t.teardown(() => ctx.close())
  await ctx.addInitScript({ content: keyScript })
  let body = snapshot
  await ctx.route('**/v1/status/stream*', (route) =>
    route.fulfill({ status: 200, contentType: 'text/event-stream', body: `event: status\ndata: ${JSON.stringify(body)}\n\n` }),
  )
  const { page, console, errors } = await open(ctx)
  await page.goto(`${base}/status`)
  await page.waitForSelector('#workers tbody tr[data-worker-id]')
  const row = (id: string) => page.locator(`#workers tr[data-worker-id="${id}"]`)
  t.equal(await row(a.id_str).locator('td.speed').textContent(), '0.41 / 0.95')
  t.equal(await row(a.id_str).locator('td.samples').textContent(), '120 / 2,400')
  t.match(
    await row(a.id_str).locator('td.speed').getAttribute('title'),
    'rank 0: prefill 0.41 (learned, 120 TTFT, ±8%) · decode 0.95 (learned, 2,400 ITL, spread unknown)',
  )
  t.equal(await row(a.id_str).locator('td.speed span.muted').count(), 0, 'learned values are not greyed')
  t.equal(await row(b.id_str).locator('td.speed').textContent(), '0.50–0.70 / 1.00', 'the range over the ranks')
  t.equal(await row(b.id_str).locator('td.samples').textContent(), '100 / 2,000')
  t.equal(await page.locator('#workers th.engine:visible').count(), 2)
  // the stream ends after its one event and the page reconnects: the next snapshot, learning off
  body = off
  await page.locator('#workers th.engine').first().waitFor({ state: 'hidden', timeout: 15_000 })
  t.equal(await page.locator('#workers td.speed').count(), 0, 'no engine cells while the router learns none')
  t.equal(await page.locator('#workers thead th:visible').count(), 9)
  t.same(
    console.map((m) => m.text()),
    [],
  )
  t.same(
    errors.map((e) => e.message),
    [],
  )
})

t.test('a stream that cannot be opened: the page polls GET /v1/status instead', async (t) => {
  const ctx = await browser.newContext()
  t.teardown(() => ctx.close())
  await ctx.addInitScript({ content: keyScript })
  await ctx.route('**/v1/status/stream*', (route) => route.fulfill({ status: 502, body: 'bad gateway' }))
  const { page, errors } = await open(ctx)
  await page.goto(`${base}/status`)
  await page.locator('#conn-text', { hasText: /^polling/ }).waitFor({ timeout: 20_000 })
  await page.waitForSelector('#workers tbody tr[data-worker-id]')
  const before = await page.locator('#decisions li').count()
  await complete('a prompt routed while the page polls')
  await page.locator('#decisions li').nth(before).waitFor({ timeout: 10_000 })
  t.ok((await page.locator('#decisions li').count()) > before, 'the decision appears through polling')
  t.same(
    errors.map((e) => e.message),
    [],
  )
})
