// The proxy's request-plane attempt against a scripted Dynamo worker on a real TCP socket
// (test/helpers/dynamo-tcp-worker.ts, written from Dynamo's source, none of our codecs): the
// request it receives, a worker that dies after its first token (an error event ends the
// client's stream), an answer the router ends by a stop string (the worker is told "stop"), and
// a worker's retryable error before the first token (the request goes to the next worker).
import t from 'tap'
import type { Test } from 'tap'
import type { AddressInfo } from 'node:net'
import { harness } from './helpers.js'
import type { Harness } from './helpers.js'
import { startTestWorker } from '../helpers/dynamo-tcp-worker.js'
import type { CallHome, TestWorker, WorkerRequest } from '../helpers/dynamo-tcp-worker.js'
import { waitUntil } from '../helpers/wait.js'

type Script = (req: WorkerRequest, ack: (text?: string) => void, dial: () => Promise<CallHome>) => void

const item = (text: string, finish: string | null = null): Record<string, unknown> => ({
  data: { token_ids: [7], tokens: null, text, cum_log_probs: null, log_probs: null, top_logprobs: null, finish_reason: finish, index: null },
})

/** An item of token ids only (`--tokenizer bytes`: one byte each), for the router to decode. */
const tokens = (text: string): Record<string, unknown> => ({
  data: {
    token_ids: [...Buffer.from(text)],
    tokens: null,
    text: null,
    cum_log_probs: null,
    log_probs: null,
    top_logprobs: null,
    finish_reason: null,
    index: null,
  },
})

async function setup(t: Test, scripts: Script[]): Promise<{ h: Harness; base: string; workers: TestWorker[] }> {
  const h = await harness(['--router-block-size', '4', '--router-mode', 'round-robin', '--tokenizer', 'bytes'])
  t.teardown(() => h.close())
  const workers: TestWorker[] = []
  for (const [i, script] of scripts.entries()) {
    const w = await startTestWorker((req, ack, dial) => script(req, ack, () => dial()))
    t.teardown(() => w.close())
    workers.push(w)
    await h.router.addWorker({ id: BigInt(10 + i), url: '', requestPlane: `127.0.0.1:${w.port}/${(10 + i).toString(16)}/generate` })
  }
  await h.app.fastify.listen({ port: 0, host: '127.0.0.1' })
  const base = `http://127.0.0.1:${(h.app.fastify.server.address() as AddressInfo).port}`
  return { h, base, workers }
}

const post = (base: string, body: unknown): Promise<Response> =>
  fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

t.test('the request a worker receives; a worker that dies after its first token', async (t) => {
  let home: CallHome | undefined
  const { h, base, workers } = await setup(t, [
    (_req, ack, dial) => {
      ack()
      void dial().then((c) => {
        home = c
        c.data(item('Hello'))
        // then the worker dies
        setTimeout(() => c.socket.destroy(), 50)
      })
    },
  ])
  const res = await post(base, { model: 'm', prompt: [1, 2, 3, 4, 5], max_tokens: 8, stream: true })
  t.equal(res.status, 200)
  t.equal(res.headers.get('x-worker-id'), '10')
  const text = await res.text()
  const events = text.split('\n\n').filter((e) => e !== '')
  t.equal(events.length, 2, 'the first token, then the error event')
  t.match(events[0], /"text":"Hello"/)
  t.match(events[0], /"nvext":\{"worker_id":\{"prefill_worker_id":10,/)
  t.match(events[1], /^data: \{"error":\{.*"code":"KVR_ERR_UPSTREAM".*"type":"upstream_error"/)
  const req = workers[0]?.requests[0] as WorkerRequest
  t.equal(req.path, 'a/generate', 'the endpoint path of the instance address')
  t.equal(req.headers['request-id'], req.control.id, 'the request id in the header and the control message')
  const body = JSON.parse(req.body.toString()) as { model: string; token_ids: number[]; stop_conditions: { max_tokens: number }; routing: unknown }
  t.same(body.token_ids, [1, 2, 3, 4, 5], "the router's token ids")
  t.equal(body.stop_conditions.max_tokens, 8)
  t.match(req.body.toString(), /"routing":\{"backend_instance_id":10,"dp_rank":0\}/, 'the routing hints name the chosen worker-rank')
  t.ok(home !== undefined)
  await waitUntil('the booking released', () => h.app.proxy.releasedTotal === 1)
  t.equal(h.app.proxy.inFlight, 0)
})

t.test('a stop string ends the answer, and the worker is told to stop', async (t) => {
  let home: CallHome | undefined
  const { h, base } = await setup(t, [
    (_req, ack, dial) => {
      ack()
      void dial().then((c) => {
        home = c
        // the router decodes, so it applies the stop strings (a worker that sends text applies them itself)
        c.data(tokens('one '))
        c.data(tokens('two '))
        c.data(tokens('three '))
      })
    },
  ])
  const res = await post(base, { model: 'm', prompt: [1, 2, 3], max_tokens: 50, stop: ['two'] })
  t.equal(res.status, 200)
  const answer = (await res.json()) as { choices: { text: string; finish_reason: string }[]; nvext: { worker_id: { decode_worker_id: number } } }
  t.equal(answer.choices[0]?.text, 'one ', 'the text before the stop string')
  t.equal(answer.choices[0]?.finish_reason, 'stop')
  t.equal(answer.nvext.worker_id.decode_worker_id, 10)
  await waitUntil('"stop" reached the worker', () => home?.received.includes('"stop"') === true)
  t.equal(h.app.proxy.releasedTotal, 1)
})

t.test("a worker's retryable error before its first token: the request goes to the next worker", async (t) => {
  const { h, base } = await setup(t, [
    (_req, ack, dial) => {
      ack()
      void dial().then((c) => {
        // Annotated error: event "error", a DynamoError of a retryable class (annotated.rs newest form)
        c.data({ event: 'error', error: { error_type: 'Unavailable', class: 'Unavailable', reason: 'full', message: 'no KV space' } })
        c.finish()
      })
    },
    (_req, ack, dial) => {
      ack()
      void dial().then((c) => {
        c.data(item('served', 'length'))
        c.finish()
      })
    },
  ])
  // round-robin: the first request goes to worker 10
  const res = await post(base, { model: 'm', prompt: [1, 2, 3], max_tokens: 1 })
  const answer = (await res.json()) as { choices: { text: string }[]; nvext: { worker_id: { decode_worker_id: number } } }
  t.equal(res.status, 200)
  t.equal(answer.choices[0]?.text, 'served')
  t.equal(answer.nvext.worker_id.decode_worker_id, 11, 'answered by the second worker')
  t.equal(h.app.proxy.releasedTotal, 2, 'both bookings released once')
})
