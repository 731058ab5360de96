// The replay engine against a local SSE server: requests leave on the trace's schedule scaled
// by speedup and overlap (open loop); each record carries what the stream said.
import t from 'tap'
import { expandTokens } from '../../../src/sim/replay/trace.js'
import type { TraceRequest } from '../../../src/sim/replay/trace.js'
import { replayTrace, requestBody, startReplay } from '../../../src/sim/replay/client.js'
import { sleep, sseScript, sseServer } from '../../fixtures/sse-server.js'

function req(timestamp: number, input = 600, output = 3, ids: number[] = [1, 2]): TraceRequest {
  return { timestamp, input_length: input, output_length: output, hash_ids: ids }
}

t.test('requestBody: the expanded tokens, max_tokens, streaming with usage', async (t) => {
  const r = req(0, 700, 9, [5, 6])
  const b = JSON.parse(requestBody(r, 'm1')) as Record<string, unknown>
  t.same(b.prompt, Array.from(expandTokens(r)))
  t.equal((b.prompt as number[]).length, 700)
  t.equal(b.model, 'm1')
  t.equal(b.max_tokens, 9)
  t.equal(b.stream, true)
  t.same(b.stream_options, { include_usage: true })
})

t.test('sends on the trace schedule divided by speedup, without waiting for responses', async (t) => {
  // every response takes 400 ms, longer than the gaps between sends: a client that waited for
  // each response would send the last request ≥ 1.6 s late
  const srv = await sseServer(sseScript({ ttftMs: 400, gapMs: 5 }))
  t.teardown(() => srv.close())
  const ts = [0, 200, 400, 600, 800, 2000]
  const speedup = 4
  const { records, itlGaps } = await replayTrace({ url: srv.url, requests: ts.map((x) => req(x)), speedup, model: 'm' })
  t.equal(srv.seen.length, ts.length)
  // the server's clock also counts its own and the connections' delays: the schedule itself is
  // held by the client's send times below; here, that the sends were spread as the trace says
  const arrivals = srv.seen.map((s) => s.at)
  t.same(
    arrivals.map((_, i) => i),
    [...arrivals.keys()].sort((x, y) => (arrivals[x] as number) - (arrivals[y] as number)),
    'they arrived in the order of the trace',
  )
  const span = (arrivals[arrivals.length - 1] as number) - (arrivals[0] as number)
  t.ok(span > 0.5 * ((ts[ts.length - 1] as number) / speedup), `the last arrived ${span.toFixed(1)} ms after the first, due 500 ms after it`)
  t.ok(srv.maxOpen >= 4, `requests overlapped (${srv.maxOpen} open at once)`)
  for (const r of records) {
    t.equal(r.error, null)
    t.ok(Math.abs(r.scheduled_ms - r.timestamp / speedup) < 1e-9)
    // a client that waited for each 400-ms answer would send the last one over 1.6 s late
    t.ok(r.sent_ms - r.scheduled_ms < 200, `sent on time (lag ${(r.sent_ms - r.scheduled_ms).toFixed(1)} ms)`)
    t.ok((r.ttft_ms as number) >= 390 && (r.ttft_ms as number) < 600, `ttft ${r.ttft_ms}`)
  }
  // one ITL sample per read after the first: tokens 5 ms apart mostly come in reads of their own
  t.ok(itlGaps.length > 0 && itlGaps.length <= ts.length * 2, `at most two ITL samples per 3-token stream, pooled (${itlGaps.length})`)
})

t.test('records: tokens, usage, cached tokens, worker from the header or from nvext', async (t) => {
  const srv = await sseServer(
    sseScript({ gapMs: 20, worker: '18446744073709551557', header: false, cached: (b) => ((b.prompt as number[]).length >= 600 ? 512 : 0) }),
  )
  t.teardown(() => srv.close())
  const seen: number[] = []
  const { records, itlGaps } = await replayTrace({ url: srv.url, requests: [req(0, 640, 4), req(10, 100, 2)], apiKey: 'k1', onRecord: (r) => seen.push(r.id) })
  t.same(seen.sort(), [0, 1], 'onRecord once per request')
  const [a, b] = records
  t.equal(a?.worker, '18446744073709551557', 'u64 worker id read exactly from nvext.worker_id')
  t.equal(a?.output_tokens, 4)
  t.equal(a?.prompt_tokens, 640)
  t.equal(a?.cached_tokens, 512)
  t.equal(a?.status, 200)
  t.ok((a?.tpot_ms as number) >= 15 && (a?.tpot_ms as number) < 80, `tpot ${a?.tpot_ms}`)
  t.ok((a?.e2e_ms as number) >= (a?.ttft_ms as number))
  t.equal(b?.cached_tokens, 0)
  t.equal(b?.output_tokens, 2)
  t.equal(itlGaps.length, 3 + 1)
  t.equal(srv.seen[0]?.headers.authorization, 'Bearer k1')
  t.equal(srv.seen[0]?.headers['content-type'], 'application/json')
})

t.test('TPOT and ITL: spaced tokens, tokens in bursts, a whole answer in one write', async (t) => {
  const event = (k: number): string => `data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"t${k}","finish_reason":null}]}\n\n`
  const tail = 'data: [DONE]\n\n'
  const srv = await sseServer(async (body, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'x-worker-id': '1' })
    const kind = body.max_tokens as number
    if (kind === 5) {
      // five tokens 30 ms apart, each in a write of its own
      for (let k = 0; k < 5; k++) {
        if (k > 0) await sleep(30)
        res.write(event(k))
      }
      res.end(tail)
    } else if (kind === 6) {
      // two bursts of three tokens, 90 ms apart: what an engine running overdue steps back to back sends
      res.write(event(0) + event(1) + event(2))
      await sleep(90)
      res.end(event(3) + event(4) + event(5) + tail)
    } else {
      res.end(event(0) + event(1) + event(2) + event(3) + tail)
    }
  })
  t.teardown(() => srv.close())
  const { records, itlGaps } = await replayTrace({ url: srv.url, requests: [req(0, 64, 5), req(0, 64, 6), req(0, 64, 4)] })
  const [spaced, bursts, whole] = records
  for (const r of records) t.equal(r?.error, null)
  t.ok((spaced?.tpot_ms as number) >= 25 && (spaced?.tpot_ms as number) < 60, `spaced: TPOT ${spaced?.tpot_ms} ms, the 30 ms between tokens`)
  // 90 ms over the five tokens after the first
  t.ok((bursts?.tpot_ms as number) >= 15 && (bursts?.tpot_ms as number) < 40, `bursts: TPOT ${bursts?.tpot_ms} ms, 90 ms / 5`)
  t.equal(whole?.tpot_ms, 0, 'one write: every token arrived at once')
  t.equal(whole?.output_tokens, 4)
  const gaps = Array.from(itlGaps).sort((a, b) => a - b)
  t.equal(gaps.length, 4 + 1, 'ITL: four gaps of the spaced stream, one between the two bursts, none within a read')
  // each read is stamped when the client gets to it: a late one shortens the gap after it
  for (const g of gaps.slice(0, 4)) t.ok(g >= 15 && g < 70, `a spaced gap of ${g.toFixed(1)} ms`)
  t.ok((gaps[4] as number) >= 70 && (gaps[4] as number) < 150, `the gap between the bursts, ${gaps[4]?.toFixed(1)} ms`)
})

t.test('failures are recorded, not thrown: HTTP errors, stream errors, truncated streams, timeouts', async (t) => {
  const srv = await sseServer(async (body, res) => {
    const kind = body.max_tokens as number
    if (kind === 1) {
      res.writeHead(503, { 'content-type': 'application/json' })
      res.end('{"error":{"code":"KVR_ERR_ALL_WORKERS_BUSY","message":"all busy"}}')
    } else if (kind === 2) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('data: {"choices":[{"text":"a"}]}\n\n')
      res.end('data: {"error":{"code":"KVR_ERR_UPSTREAM","message":"worker died"}}\n\n')
    } else if (kind === 3) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end('data: {"choices":[{"text":"a"}]}\n\n')
    } else if (kind === 4) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      await sleep(2000)
      res.end()
    } else {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end('data: not json\n\n')
    }
  })
  t.teardown(() => srv.close())
  const { records } = await replayTrace({ url: srv.url, requests: [1, 2, 3, 4, 5].map((k) => req(0, 64, k)), timeoutMs: 300 })
  t.equal(records[0]?.status, 503)
  t.equal(records[0]?.error, 'HTTP 503: KVR_ERR_ALL_WORKERS_BUSY: all busy')
  t.match(records[1]?.error, /stream error: worker died/)
  t.ok(records[1]?.ttft_ms !== null, 'the first token still has its time')
  t.match(records[2]?.error, /without data: \[DONE\]/)
  t.match(records[3]?.error, /timed out after 0.3 s/)
  t.match(records[4]?.error, /malformed stream event/)
})

t.test('maxInFlight caps outstanding requests; the lateness shows in sent_ms', async (t) => {
  const srv = await sseServer(sseScript({ ttftMs: 100 }))
  t.teardown(() => srv.close())
  const { records } = await replayTrace({ url: srv.url, requests: [0, 0, 0, 0].map((x) => req(x, 64, 1)), maxInFlight: 2 })
  t.equal(srv.maxOpen, 2)
  const lags = records.map((r) => r.sent_ms - r.scheduled_ms).sort((a, b) => a - b)
  t.ok((lags[3] as number) >= 90, `the last two waited for a slot (lags ${lags.map((x) => x.toFixed(0)).join(',')})`)
})

t.test('abort: in-flight requests fail, unsent ones are recorded as not sent', async (t) => {
  const srv = await sseServer(sseScript({ ttftMs: 5000 }))
  t.teardown(() => srv.close())
  const ac = new AbortController()
  const run = startReplay({ url: srv.url, requests: [req(0, 64, 1), req(60_000, 64, 1)], signal: ac.signal })
  while (run.progress().inFlight < 1) await sleep(5)
  const p = run.progress()
  t.equal(p.total, 2)
  t.equal(p.sent, 1)
  t.equal(p.scheduleS, 60)
  ac.abort()
  const { records } = await run.done
  t.equal(records[0]?.error, 'replay aborted')
  t.equal(records[1]?.error, 'not sent: replay aborted')
  t.equal(run.progress().failed, 2)
})

t.test("a wait beyond Node's timer range is kept, not cut to 1 ms", async (t) => {
  const warnings: string[] = []
  const onWarning = (w: Error): void => void warnings.push(w.name)
  process.on('warning', onWarning)
  t.teardown(() => void process.off('warning', onWarning))
  const srv = await sseServer(sseScript())
  t.teardown(() => srv.close())
  const ac = new AbortController()
  // the second request is due 3 s / 1e-6 = 3·10^9 ms (about 35 days) after the first
  const run = startReplay({ url: srv.url, requests: [req(0, 64, 1), req(3000, 64, 1)], speedup: 1e-6, signal: ac.signal })
  while (run.progress().done < 1) await sleep(5)
  await sleep(200)
  t.equal(run.progress().sent, 1, 'the second request still waits')
  ac.abort()
  const { records } = await run.done
  t.equal(records[0]?.error, null)
  t.equal(records[1]?.error, 'not sent: replay aborted')
  t.same(
    warnings.filter((w) => w === 'TimeoutOverflowWarning'),
    [],
    'no timer overflowed',
  )
})

t.test('invalid options are refused', async (t) => {
  t.throws(() => startReplay({ url: 'http://127.0.0.1:1', requests: [], speedup: 0 }), RangeError)
  t.throws(() => startReplay({ url: 'http://127.0.0.1:1', requests: [], timeoutMs: 2 ** 31 }), {
    name: 'RangeError',
    message: /timeoutMs must be in \(0, 2147483647\]/,
  })
  t.throws(() => startReplay({ url: 'http://127.0.0.1:1', requests: [], timeoutMs: 0 }), RangeError)
  t.throws(() => startReplay({ url: 'http://127.0.0.1:1', requests: [], maxInFlight: 0 }), RangeError)
  const r = await replayTrace({ url: 'http://127.0.0.1:1', requests: [] })
  t.same(r.records, [])
})

t.test('a trace request whose prompt cannot be built fails alone', async (t) => {
  const srv = await sseServer(sseScript())
  t.teardown(() => srv.close())
  // 1,000 tokens need two 512-token blocks; one id is not enough
  const { records } = await replayTrace({ url: srv.url, requests: [req(0, 1000, 1, [1]), req(0, 64, 1, [1])] })
  t.match(records[0]?.error, /^invalid trace request: hash_ids has 1 block/)
  t.equal(records[1]?.error, null)
  t.equal(srv.seen.length, 1)
})

t.test('a refused connection is an error with status 0', async (t) => {
  const { records } = await replayTrace({ url: 'http://127.0.0.1:1', requests: [req(0, 64, 1)] })
  t.equal(records[0]?.status, 0)
  t.ok(records[0]?.error !== null && records[0]?.error !== '', String(records[0]?.error))
})
