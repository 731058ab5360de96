// --router-cost dynamo is Dynamo's cost bit for bit: seeded workloads through the scheduler give
// exactly the decisions, overlaps and explained terms (prefill blocks, decode blocks, logit) that
// the router gave before the latency cost existed. The digests below were recorded from that
// router (commit 71deae8); any change to Dynamo's arithmetic, its tie-breaking or the order in
// which it draws random numbers changes them.
import t from 'tap'
import { createHash } from 'node:crypto'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import type { SchedulerOptionsInput } from '../../src/scheduler/options.js'
import type { RouteDecision, ScheduleRequest } from '../../src/scheduler/scheduler.js'
import type { WorkerRankInfo } from '../../src/scheduler/worker-ranks.js'
import { chain, makeScheduler } from './fixtures.js'

/** One decision as text: every number printed with all its digits, so a changed bit shows. */
function line(d: RouteDecision | null): string {
  if (d === null) return 'wait'
  const rows = (d.candidates ?? []).map((c) => `${c.workerId}/${c.dpRank}:${c.overlapBlocks},${c.prefillBlocks},${c.decodeBlocks},${c.logit},${c.inFlight}`)
  return `${d.workerId}/${d.dpRank} ov=${d.overlapBlocks} [${rows.join(' ')}]`
}

/**
 * 600 operations on 5 workers (one with two dp ranks): conversations that grow turn by turn
 * (shared chained prefixes, overlaps as an index would report them for the workers that served
 * earlier turns), interleaved with prefill completions, frees and per-request overrides.
 */
function workload(options: SchedulerOptionsInput, seed: number, info: WorkerRankInfo): { digest: string; decisions: number; waits: number; sample: string[] } {
  const { s } = makeScheduler({ blockSize: 16, ...options }, 4, info)
  s.addWorkerRank(5n, 0, info)
  s.addWorkerRank(5n, 1, info)
  const rng = new Xoshiro128(seed)
  const convs: { content: number[]; served: Set<number> }[] = []
  const live: string[] = []
  const h = createHash('sha256')
  const sample: string[] = []
  let decisions = 0
  let waits = 0
  for (let op = 0; op < 600; op++) {
    const r = rng.next()
    if (r < 0.2 && live.length > 0) {
      const id = live.splice(rng.int(live.length), 1)[0] as string
      s.free(id)
      continue
    }
    if (r < 0.35 && live.length > 0) {
      s.markPrefillComplete(live[rng.int(live.length)] as string)
      continue
    }
    let conv = convs[rng.int(convs.length + 1)]
    if (conv === undefined || rng.next() < 0.25) {
      conv = { content: [0, 1, 2, 1000 + op], served: new Set() }
      convs.push(conv)
    }
    const add = 1 + rng.int(12)
    for (let k = 0; k < add; k++) conv.content.push(op * 100 + k)
    const hashes = chain(conv.content)
    const overlap = new Float64Array(8)
    // the shared system prefix is everywhere; a conversation's earlier turns where they went
    for (let slot = 0; slot < 6; slot++) overlap[slot] = conv.served.has(slot) ? conv.content.length - add : 3
    const isl = conv.content.length * 16 - rng.int(16)
    const id = `r${op}`
    const req: ScheduleRequest = { id, isl, overlapBlocks: overlap, seqLo: hashes.lo, seqHi: hashes.hi, explain: true }
    const o = rng.next()
    if (o < 0.1) req.overrides = { overlapScoreWeight: 2 * rng.next(), overlapScoreCredit: 3 * rng.next() }
    else if (o < 0.15) req.overrides = { trackPrefillTokens: false }
    else if (o < 0.2) req.overrides = { assumeKvReuse: false, temperature: 0.5 }
    else if (o < 0.25) req.updateStates = false
    const d = s.tryRoute(req)
    decisions++
    const text = line(d)
    h.update(`${text}\n`)
    if (sample.length < 3) sample.push(text)
    if (d === null) waits++
    else {
      conv.served.add(d.slot)
      if (d.booked) live.push(id)
    }
  }
  return { digest: h.digest('hex'), decisions, waits, sample }
}

/** Option sets covering every term of Dynamo's cost and its selection. */
const CASES: { name: string; options: SchedulerOptionsInput; seed: number; info?: WorkerRankInfo; digest: string }[] = [
  { name: 'defaults', options: {}, seed: 1, digest: '4bf7074855cc9df6e349b84f16b83b1aacd3fa90a7fcddd2e2a46b0aefebe4a1' },
  {
    name: 'Era C terms',
    options: { overlapScoreWeight: 2.5, overlapScoreCredit: 3, overlapScoreCreditDecay: 0.7, decodeActiveRequestWeight: 0.3 },
    seed: 2,
    digest: 'a76ee3509c927e26e0b37a3d873b81b60fbcf19f2a1ad7419c4160db0c1264e6',
  },
  { name: 'softmax', options: { temperature: 0.8, queueThreshold: null }, seed: 3, digest: '5cf4d9eab891bf6b8e582b0503c50d7d1b487232939dd47b0af8fdbcc02dad5c' },
  {
    name: 'no prefill tracking, no kv reuse',
    options: { trackPrefillTokens: false, assumeKvReuse: false },
    seed: 4,
    digest: '01b00880a69a0eb26babaaf3bcdbe3fdd400ffbbea3e25de98630f7ae4ca0b3e',
  },
  {
    name: 'no active-block tracking',
    options: { trackActiveBlocks: false, overlapScoreWeight: 0.5 },
    seed: 5,
    digest: 'f2344cb8742aea467f66fc66f6241f460d2b678e6fd2ce071d738cf2586818a8',
  },
  {
    name: 'queue and load shedding',
    options: { queueThreshold: 1, activePrefillTokensThreshold: 600 },
    seed: 6,
    info: { maxNumBatchedTokens: 256, totalKvBlocks: 400 },
    digest: '0922397bc2e8cfd6a18eebb3325bf1e4d3583c400a2a966ee8f11657063187b3',
  },
]

for (const c of CASES) {
  t.test(c.name, async (t) => {
    const got = workload({ ...c.options, cost: 'dynamo' }, c.seed, c.info ?? {})
    t.equal(got.digest, c.digest, `${got.decisions} decisions (${got.waits} waited) and their explained terms as before; the first: ${got.sample.join(' | ')}`)
  })
}

t.test('the latency cost decides otherwise on the same workload', async (t) => {
  const c = CASES[0] as (typeof CASES)[number]
  const got = workload({ ...c.options, cost: 'latency' }, c.seed, {})
  t.not(got.digest, c.digest, 'a digest that every cost matched would prove nothing')
})
