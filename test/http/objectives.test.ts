// Latency objectives over HTTP: x-slo-ttft-ms / x-slo-tpot-ms and nvext.slo on the completion
// routes (headers win), slo on /v1/route, the 400s for values out of range, the 503 of a
// sheddable request no worker is predicted to serve in time, and the two metrics.
import t from 'tap'
import type { Test } from 'tap'
import type { ScheduleRequest } from '../../src/scheduler/scheduler.js'
import { chunk, harness, metricSum, sse, tokens, workerFleet } from './helpers.js'
import type { Harness } from './helpers.js'

/** A router with one streaming worker; `seen` collects what reaches the scheduler. */
async function setup(t: Test): Promise<{ h: Harness; seen: ScheduleRequest[] }> {
  const h = await harness()
  const fleet = await workerFleet(h, [
    async (_req, body, res) => {
      const stream = (JSON.parse(body) as { stream?: boolean }).stream === true
      if (!stream) {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ choices: [{ text: 'x' }], usage: { completion_tokens: 1 } }))
        return
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      for (let i = 0; i < 4; i++) {
        res.write(sse(chunk(`t${i}`)))
        await new Promise((r) => setTimeout(r, 5))
      }
      res.end('data: [DONE]\n\n')
    },
  ])
  t.teardown(async () => {
    await fleet.close()
    await h.close()
  })
  const seen: ScheduleRequest[] = []
  const sched = h.router.scheduler
  const schedule = sched.schedule.bind(sched)
  sched.schedule = (req) => {
    seen.push({ ...req })
    return schedule(req)
  }
  return { h, seen }
}

t.test('nvext.slo and the headers reach the scheduler; a header wins over the field', async (t) => {
  const { h, seen } = await setup(t)
  const post = (url: string, payload: object, headers: Record<string, string> = {}) =>
    h.app.fastify.inject({ method: 'POST', url, payload, headers: { 'content-type': 'application/json', ...headers } })
  let r = await post('/v1/completions', { prompt: tokens(8), nvext: { slo: { ttft_ms: 1500, tpot_ms: 40 } } })
  t.equal(r.statusCode, 200, r.body)
  t.match(seen.at(-1), { ttftObjectiveMs: 1500, tpotObjectiveMs: 40 })
  r = await post('/v1/completions', { prompt: tokens(8), nvext: { slo: { ttft_ms: 1500, tpot_ms: 40 } } }, { 'x-slo-ttft-ms': '250.5' })
  t.equal(r.statusCode, 200, r.body)
  t.match(seen.at(-1), { ttftObjectiveMs: 250.5, tpotObjectiveMs: 40 })
  r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], nvext: { token_data: tokens(8) } }, { 'x-slo-tpot-ms': '25' })
  t.equal(r.statusCode, 200, r.body)
  t.equal(seen.at(-1)?.tpotObjectiveMs, 25)
  t.equal(seen.at(-1)?.ttftObjectiveMs, undefined)
  r = await post('/v1/completions', { prompt: tokens(8) })
  t.equal(seen.at(-1)?.ttftObjectiveMs, undefined, 'none without them')
  t.equal(seen.at(-1)?.tpotObjectiveMs, undefined)
  r = await h.app.fastify.inject({ method: 'POST', url: '/v1/route', payload: { token_ids: tokens(8), slo: { ttft_ms: 900 } } })
  t.equal(r.statusCode, 200, r.body)
  t.equal(seen.at(-1)?.ttftObjectiveMs, 900, '/v1/route reads slo')
  const rows = (JSON.parse(r.body) as { candidates: { meets_objectives?: boolean; tpot_secs?: number }[] }).candidates
  t.equal(rows.length, 1)
  t.equal(rows[0]?.meets_objectives, true, 'an idle worker meets 900 ms')
  t.ok((rows[0]?.tpot_secs ?? 0) > 0)
})

t.test('objectives out of range are 400 KVR_ERR_INVALID_REQUEST', async (t) => {
  const { h, seen } = await setup(t)
  const bad: [string, object, Record<string, string>, RegExp][] = [
    ['/v1/completions', { nvext: { slo: { ttft_ms: 0 } } }, {}, /nvext\.slo\.ttft_ms must be a number of milliseconds in \(0, 10\^7\]/],
    ['/v1/completions', { nvext: { slo: { tpot_ms: -3 } } }, {}, /nvext\.slo\.tpot_ms must be/],
    ['/v1/completions', { nvext: { slo: { ttft_ms: 1e7 + 1 } } }, {}, /ttft_ms must be/],
    ['/v1/completions', { nvext: { slo: { ttft_ms: 'fast' } } }, {}, /ttft_ms/],
    ['/v1/completions', { nvext: { slo: 5 } }, {}, /slo/],
    ['/v1/completions', {}, { 'x-slo-ttft-ms': 'abc' }, /x-slo-ttft-ms must be a number of milliseconds/],
    ['/v1/completions', {}, { 'x-slo-ttft-ms': '0x10' }, /x-slo-ttft-ms must be/],
    ['/v1/completions', {}, { 'x-slo-tpot-ms': '0' }, /x-slo-tpot-ms must be/],
    ['/v1/chat/completions', {}, { 'x-slo-tpot-ms': '20000000' }, /x-slo-tpot-ms must be/],
    ['/v1/route', { slo: { ttft_ms: -1 } }, {}, /slo\.ttft_ms must be/],
    ['/v1/route', { slo: [1] }, {}, /slo must be an object/],
  ]
  for (const [url, extra, headers, message] of bad) {
    const base =
      url === '/v1/route'
        ? { token_ids: tokens(8) }
        : url === '/v1/chat/completions'
          ? { messages: [{ role: 'user', content: 'hi' }], nvext: { token_data: tokens(8) } }
          : { prompt: tokens(8) }
    const r = await h.app.fastify.inject({ method: 'POST', url, payload: { ...base, ...extra }, headers: { 'content-type': 'application/json', ...headers } })
    t.equal(r.statusCode, 400, `${url} ${JSON.stringify(extra)} ${JSON.stringify(headers)}`)
    const e = (JSON.parse(r.body) as { error: { code: string; message: string } }).error
    t.equal(e.code, 'KVR_ERR_INVALID_REQUEST')
    t.match(e.message, message)
  }
  t.equal(seen.length, 0, 'none reached the scheduler')
})

t.test('a sheddable request no worker is predicted to serve in time: 503 with Retry-After, counted', async (t) => {
  const { h } = await setup(t)
  const r = await h.app.fastify.inject({ method: 'POST', url: '/v1/route', payload: { token_ids: tokens(8), slo: { tpot_ms: 1 }, priority: -1 } })
  t.equal(r.statusCode, 503, r.body)
  t.equal(r.headers['retry-after'], '1')
  t.equal((JSON.parse(r.body) as { error: { code: string } }).error.code, 'KVR_ERR_OBJECTIVE_UNMET')
  // priority 0: routed all the same
  const ok = await h.app.fastify.inject({ method: 'POST', url: '/v1/route', payload: { token_ids: tokens(8), slo: { tpot_ms: 1 } } })
  t.equal(ok.statusCode, 200, ok.body)
  const met = await h.app.fastify.inject({ method: 'POST', url: '/v1/route', payload: { token_ids: tokens(8), slo: { ttft_ms: 5000 } } })
  t.equal(met.statusCode, 200, met.body)
  t.equal(await metricSum(h, 'kvrouter_objective_requests_total', { outcome: 'shed' }), 1)
  t.equal(await metricSum(h, 'kvrouter_objective_requests_total', { outcome: 'none_predicted' }), 1)
  t.equal(await metricSum(h, 'kvrouter_objective_requests_total', { outcome: 'predicted_met' }), 1)
  t.equal(await metricSum(h, 'kvrouter_objective_requests_total', { outcome: 'not_predicted' }), 0)
})

t.test("the proxy counts each request's actual TTFT and (streams) TPOT against its objectives", async (t) => {
  const { h } = await setup(t)
  const post = (payload: object, headers: Record<string, string> = {}) =>
    h.app.fastify.inject({ method: 'POST', url: '/v1/completions', payload, headers: { 'content-type': 'application/json', ...headers } })
  // a loose TTFT, a TPOT no stream with 5 ms between events meets
  let r = await post({ prompt: tokens(8), stream: true }, { 'x-slo-ttft-ms': '60000', 'x-slo-tpot-ms': '0.001' })
  t.equal(r.statusCode, 200)
  t.equal(await metricSum(h, 'kvrouter_objective_results_total', { objective: 'ttft', met: 'true' }), 1)
  t.equal(await metricSum(h, 'kvrouter_objective_results_total', { objective: 'tpot', met: 'false' }), 1)
  // a TTFT nothing meets, on a whole answer: no TPOT counted
  r = await post({ prompt: tokens(8), nvext: { slo: { ttft_ms: 0.001, tpot_ms: 60000 } } })
  t.equal(r.statusCode, 200)
  t.equal(await metricSum(h, 'kvrouter_objective_results_total', { objective: 'ttft', met: 'false' }), 1)
  t.equal(await metricSum(h, 'kvrouter_objective_results_total', { objective: 'tpot' }), 1, 'a whole answer has no TPOT')
  // a stream meeting a loose TPOT
  r = await post({ prompt: tokens(8), stream: true, nvext: { slo: { tpot_ms: 60000 } } })
  t.equal(await metricSum(h, 'kvrouter_objective_results_total', { objective: 'tpot', met: 'true' }), 1)
  // without objectives nothing is counted
  r = await post({ prompt: tokens(8), stream: true })
  t.equal(await metricSum(h, 'kvrouter_objective_results_total'), 4)
})
