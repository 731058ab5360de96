// The proxy forwards whole SSE events only (found by review, session 21): a worker whose socket
// dies inside an event must not leave half an event on the client's wire with the router's error
// event glued to it (the openai client then throws a SyntaxError instead of an APIError); one that
// dies inside its first event delivered no token and is retried; a 5xx is retried at its status
// line, not when its body ends; and dynamo_frontend_requests_total counts a stream cut mid-way by
// the worker as 502 and by the client as 499, not as 200.
import t from 'tap'
import type { Test } from 'tap'
import type { ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { chunk, harness, sse, tokens, until, workerFleet } from './helpers.js'
import type { Handler } from './helpers.js'

const h = await harness(['--router-block-size', '4', '--proxy-retries', '2'])
await h.app.fastify.listen({ host: '127.0.0.1', port: 0 })
const base = `http://127.0.0.1:${(h.app.fastify.server.address() as AddressInfo).port}`
t.teardown(() => h.close())

/** Scripted workers 100, 101, ...: each test removes them with t.teardown, so one that fails leaves none behind. */
const fleet = (handlers: Handler[]) => workerFleet(h, handlers)
const booked = (): number => h.router.scheduler.stats().bookedRequests

const post = (body: unknown, signal?: AbortSignal) =>
  fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal })

/** Sum of a metric's samples whose labels include all of `labels`. */
async function metric(name: string, labels: Record<string, string> = {}): Promise<number> {
  const body = (await h.app.fastify.inject({ method: 'GET', url: '/metrics' })).body
  let sum = 0
  for (const line of body.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue
    sum += Number(line.slice(line.lastIndexOf(' ') + 1))
  }
  return sum
}
const requests = (status: number) => metric('dynamo_frontend_requests_total', { endpoint: '/v1/completions', status: String(status) })

/**
 * The events of an SSE body, each checked the way an SSE client reads it: every event is a
 * `data:` line whose payload is JSON or [DONE], and the body ends with an event's blank line.
 */
function events(t: Test, body: string): unknown[] {
  t.ok(/(\r?\n){2}$/.test(body), 'the body ends at the end of an event')
  const out: unknown[] = []
  for (const block of body.split(/\r?\n\r?\n/)) {
    if (block === '') continue
    t.ok(block.startsWith('data: '), `an event: ${block.slice(0, 60)}`)
    const payload = block.slice('data: '.length)
    if (payload === '[DONE]') out.push('[DONE]')
    else {
      try {
        out.push(JSON.parse(payload))
      } catch {
        t.fail(`an event that is not JSON: ${block}`)
      }
    }
  }
  return out
}

const text = (e: unknown): unknown => (e as { choices?: { text?: unknown }[] } | undefined)?.choices?.[0]?.text
const errorOf = (e: unknown): { code?: string; message?: string } | undefined => (e as { error?: { code?: string; message?: string } } | undefined)?.error

/** Writes `parts` apart in time, so that each reaches the router as a read of its own, then runs `last`. */
function writeApart(res: ServerResponse, parts: string[], last: () => void): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' })
  let i = 0
  const next = (): void => {
    if (res.destroyed) return
    if (i < parts.length) {
      res.write(parts[i++])
      setTimeout(next, 20)
    } else last()
  }
  next()
}

t.test('a 5xx whose body never ends is retried at once, and its upstream request aborted', async (t) => {
  let asked = 0
  let hungClosed = false
  const hang503: Handler = (req, body, res) => {
    if (asked++ === 0) {
      req.socket.on('close', () => (hungClosed = true))
      res.writeHead(503, { 'content-type': 'application/json' })
      res.write('{"error":')
      return
    }
    if ((JSON.parse(body) as { stream?: boolean }).stream === true) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end(sse(chunk('hello')) + 'data: [DONE]\n\n')
    } else {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify(chunk('hello')))
    }
  }
  const f = await fleet([hang503, hang503])
  t.teardown(() => f.close())
  for (const stream of [true, false]) {
    asked = 0
    hungClosed = false
    const started = Date.now()
    // before the fix the retry waited for undici's bodyTimeout (300 s): fail fast instead
    const r = await post({ prompt: tokens(12), stream }, AbortSignal.timeout(4000))
    t.equal(r.status, 200, `stream ${stream}: answered by the other worker`)
    await r.text()
    t.ok(Date.now() - started < 2000, `stream ${stream}: at once (${Date.now() - started} ms)`)
    t.equal(asked, 2)
    await until(() => hungClosed)
    t.pass(`stream ${stream}: the 503's request was aborted`)
    t.equal(booked(), 0)
  }
})
