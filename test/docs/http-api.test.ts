// docs/http-api.md's example answers are live answers' shapes: a router started in this process
// answers POST /v1/route and GET /v1/workers (a worker-rank of it), and the example's keys equal the
// answer's, at every level.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { computeBlockHashes, computeSequenceHashes } from '../../src/codec/hashing.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import { harness, tokens } from '../http/helpers.js'
import { fromRoot } from '../helpers/paths.js'

const doc = readFileSync(fromRoot('docs', 'http-api.md'), 'utf8')

/** The first ```json block after `marker` in the section titled `title`, parsed. */
function example(title: string, marker: string): unknown {
  const start = doc.indexOf(`\n## ${title}\n`)
  if (start < 0) throw new Error(`no section ${title}`)
  const end = doc.indexOf('\n## ', start + 1)
  const section = doc.slice(start, end < 0 ? undefined : end)
  const at = section.indexOf(marker)
  if (at < 0) throw new Error(`no ${marker} in ${title}`)
  const m = /```json\n([\s\S]*?)```/.exec(section.slice(at))
  if (m === null) throw new Error(`no json example after ${marker} in ${title}`)
  return JSON.parse(m[1] as string)
}

/**
 * Where the two values' shapes differ, as paths: objects must have the same keys, each compared in
 * turn; every element of an array is compared with the other array's first.
 */
function shapeDiff(docValue: unknown, live: unknown, path = '$'): string[] {
  if (Array.isArray(docValue) || Array.isArray(live)) {
    if (!Array.isArray(docValue) || !Array.isArray(live)) return [`${path}: an array on one side only`]
    if (docValue.length === 0 || live.length === 0) return docValue.length === live.length ? [] : [`${path}: empty on one side only`]
    return docValue.flatMap((d, i) => shapeDiff(d, live[0], `${path}[${i}]`))
  }
  const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null
  if (isObj(docValue) || isObj(live)) {
    if (!isObj(docValue) || !isObj(live)) return [`${path}: an object on one side only`]
    const out: string[] = []
    for (const k of Object.keys(docValue)) if (!(k in live)) out.push(`${path}.${k}: in the doc, not in the answer`)
    for (const k of Object.keys(live)) if (!(k in docValue)) out.push(`${path}.${k}: in the answer, not in the doc`)
    for (const k of Object.keys(docValue)) if (k in live) out.push(...shapeDiff(docValue[k], live[k], `${path}.${k}`))
    return out
  }
  return []
}

t.test('the comparison sees a missing, an extra and a nested key', async (t) => {
  t.same(shapeDiff({ a: 1, b: [{ c: 1 }] }, { a: 2, b: [{ c: 3 }] }), [])
  t.same(shapeDiff({ a: 1 }, { a: 1, b: 2 }), ['$.b: in the answer, not in the doc'])
  t.same(shapeDiff({ a: 1, z: 0 }, { a: 1 }), ['$.z: in the doc, not in the answer'])
  t.same(shapeDiff({ b: [{ c: 1 }, { d: 1 }] }, { b: [{ c: 1 }] }), ['$.b[1].d: in the doc, not in the answer', '$.b[1].c: in the answer, not in the doc'])
})

t.test("POST /v1/route: the doc's answer has the live answer's keys", async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  const inject = (url: string, payload: unknown) =>
    h.app.fastify.inject({ method: 'POST', url, payload: JSON.stringify(payload), headers: { 'content-type': 'application/json' } })
  const prompt = tokens(16, 100)
  // two workers, each holding part of the prompt, so that every candidate field is present
  const local = computeBlockHashes(prompt, 4)
  const seq = computeSequenceHashes(local)
  for (const [id, held] of [
    [7n, 3],
    [9n, 1],
  ] as const) {
    t.equal((await inject('/v1/workers', { id: id.toString(), url: `http://127.0.0.1:${Number(id) + 10}` })).statusCode, 201)
    const blocks = Array.from({ length: held }, (_, i) => ({ block_hash: seq[i] as bigint, tokens_hash: local[i] as bigint }))
    const ev = encodeRouterEvent({ worker_id: id, event: { event_id: 1n, dp_rank: 0, data: { stored: { parent_hash: null, blocks } } } })
    t.equal(
      (await h.app.fastify.inject({ method: 'POST', url: '/v1/kv-events', payload: `[${ev}]`, headers: { 'content-type': 'application/json' } })).statusCode,
      202,
    )
  }
  await h.router.pool.flush()
  const r = await inject('/v1/route', { token_ids: prompt, update_states: true })
  t.equal(r.statusCode, 200)
  const live = r.json() as { candidates: unknown[]; request_id?: string }
  t.equal(live.candidates.length, 2, 'both workers are candidates')
  t.type(live.request_id, 'string', 'the request was booked')
  const documented = example('POST /v1/route', 'Answer (200):')
  t.same(shapeDiff(documented, live), [], 'the doc example and the live answer have the same keys')
})

t.test("GET /v1/workers: the doc's worker-rank, engine model included, has the live one's keys", async (t) => {
  const h = await harness(['--router-block-size', '4'])
  t.teardown(() => h.close())
  await h.router.addWorker({ id: 7n, url: 'http://127.0.0.1:17' })
  const r = await h.app.fastify.inject({ method: 'GET', url: '/v1/workers' })
  const live = (r.json() as { workers: { ranks: unknown[] }[] }).workers[0]?.ranks[0]
  t.ok(live, 'a rank')
  const documented = (example('GET /v1/workers', '```json') as { workers: { ranks: unknown[] }[] }).workers[0]?.ranks[0]
  t.same(shapeDiff(documented, live), [], 'the doc example and the live rank have the same keys')
})
