// --router-cost dynamo is Dynamo's cost bit for bit: seeded workloads through the scheduler give
// exactly the decisions, overlaps and explained terms (prefill blocks, decode blocks, logit) that
// the router gave before the latency cost existed.
//
// Two sets of digests. With the random draws pinned (every draw 0, every draw just below 1) the
// tie-break's draws cannot differ, so those digests were recorded from the router before exact
// ties took a single draw (commit 2be3ea1; its own arithmetic was that of commit 71deae8): they
// hold the arithmetic and the order of choice to that router's, through the full scan (explained
// decisions) and through the pruned selection (the others). The seeded digests were recorded
// after the single draw (a tie among k takes one draw where the reservoir took k − 1): any change
// to the arithmetic, the tie-breaking or the order of the draws changes them.
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
function workload(
  options: SchedulerOptionsInput,
  seed: number,
  info: WorkerRankInfo,
  pinned?: number,
  explain = true,
): { digest: string; decisions: number; waits: number; sample: string[] } {
  const deps = pinned === undefined ? {} : { rng: { next: () => pinned, int: (n: number) => Math.floor(pinned * n) } }
  const { s } = makeScheduler({ blockSize: 16, ...options }, 4, info, deps)
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
    const req: ScheduleRequest = { id, isl, overlapBlocks: overlap, seqLo: hashes.lo, seqHi: hashes.hi, explain }
    const o = rng.next()
    if (o < 0.1) req.overrides = { overlapScoreWeight: 2 * rng.next(), overlapScoreCredit: 3 * rng.next() }
    else if (o < 0.15) req.overrides = { trackPrefillTokens: false }
    else if (o < 0.2) req.overrides = { assumeKvReuse: false, temperature: 0.5 }
    else if (o < 0.25) req.updateStates = false
    let d: RouteDecision | null
    try {
      d = s.tryRoute(req)
    } catch (err) {
      // pinned draws can load every worker past the shedding threshold
      h.update(`${(err as { code?: string }).code}\n`)
      continue
    }
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
const CASES: { name: string; options: SchedulerOptionsInput; seed: number; info?: WorkerRankInfo; digest: string; pinned: string[] }[] = [
  {
    name: 'defaults',
    options: {},
    seed: 1,
    digest: 'b00f0f597471ee278ce48cb93310a7b9afc07787293b9763fbdea0eb65a00fd7',
    pinned: [
      'c5d3d2fd080a6b2414b990441dc0b98e44df47bb9eaa7ab962578f9a5a50673a',
      'c2a2cf2156bd4b2d8671d633a207506564c0a0bde412e90c92013826b2308667',
      'f89f46a0f126979bd69b9e4a97daa47b1004c584fe6aad8d197f166978278af5',
      'a9f116bc7caef5e44dc8555f23aff83ba446e774e57d7389ad2c20a68d0f29b9',
    ],
  },
  {
    name: 'Era C terms',
    options: { overlapScoreWeight: 2.5, overlapScoreCredit: 3, overlapScoreCreditDecay: 0.7, decodeActiveRequestWeight: 0.3 },
    seed: 2,
    digest: '41259ace473d9fd57035f9d00222073dd614edc11257fd639606060db6db08f1',
    pinned: [
      'ec1b88f5414bca5c087d8e71c29941c459988fb26a940a72d014ca42e674b4b1',
      '69fa1b7e2d320528f100f5c33d36b0a23e83f0deeb8ac1625adc5f5347fc6bf2',
      '5a48bda6e0905de753b7e36b4851ef0c8652948a79b4e786d77b9b45d7c1bf73',
      'abd0ffc87c9e7eb5c668769f8bff81e805c2bf6b803aff98f34e73f54e27dd88',
    ],
  },
  {
    name: 'softmax',
    options: { temperature: 0.8, queueThreshold: null },
    seed: 3,
    digest: '5cf4d9eab891bf6b8e582b0503c50d7d1b487232939dd47b0af8fdbcc02dad5c',
    pinned: [
      'bcf76d783f1adc5c091c9af7b4ea1714e578a7cdbb8d26ed53cf97bca674bf91',
      'b1ce8a886fa0384765fe7fe1f6db83b8dcbd2801901ce31f56ab83b9690379f6',
      '4f6776be3eae4d92830a7c31aaad079e5ecf1e0f0c613ea80b68efec8b581f37',
      '1d69f51974b20b1bf87ab2061f351dd589660b94f800f9415a9665be1e9c1bab',
    ],
  },
  {
    name: 'no prefill tracking, no kv reuse',
    options: { trackPrefillTokens: false, assumeKvReuse: false },
    seed: 4,
    digest: 'bf6acdf100f7b2221344cb3c4564e7389f9487bc702d0af39776d127329c9c4a',
    pinned: [
      'f3cb6dbb7b9b0dfd097692b281aa1cdacf59258217d2d17576dcf46dd62aa95e',
      '784c2578246327131a45111a7851d822ec1a42fc254868dce00115e8c346c5aa',
      'c18a4ef14ec79d6b721882fd01cf6d007d03f05253f06205f3176d8f282b57f2',
      'ad45710b114c845edd349603018db348ff045d89d70174362628f86958b932e4',
    ],
  },
  {
    name: 'no active-block tracking',
    options: { trackActiveBlocks: false, overlapScoreWeight: 0.5 },
    seed: 5,
    digest: 'b46e271e75da27eadfd215782fea39e8ab8cfdde63f4efcaa51991578650b756',
    pinned: [
      'e489d07d5d8e7d85ce36811d5f76e53a68dfb6e8d7f73622c60bc0f9e30ca628',
      '5aa0ed9fc2292f990c0099ef929486189682f557cb755236a88a6ae88b926a7d',
      'd6b47ba1dbe14ece16387d4cb9852c90d05f6228329a65b4c9257e3997b29580',
      '6d7e4de993ae948c87bfe8c315ddc26e66e3062b156d92d8b53c05add2dfd823',
    ],
  },
  {
    name: 'queue and load shedding',
    options: { queueThreshold: 1, activePrefillTokensThreshold: 600 },
    seed: 6,
    info: { maxNumBatchedTokens: 256, totalKvBlocks: 400 },
    digest: '74407732c5e86e0913d2ffa0c97a5216b8486f9a2e1eaa1758054798d7a5da4b',
    pinned: [
      '36addb43e550e89766deb3928daf4b6bef96bf39ee342151c839b30f032af6b5',
      '2629265e261920c3fc25c6189e1a29093bbb53b0ec01fac450346a9e9882dc35',
      'e522bc14f3dc79f8936ba3e224df7144b7fc4d610a60c8e9acef56b9a050f551',
      '6250cc091a1904753d6e3e813c731a9de69933d0ef7a0cba08281dcf665da0d8',
    ],
  },
]

for (const c of CASES) {
  t.test(c.name, async (t) => {
    const got = workload({ ...c.options, cost: 'dynamo' }, c.seed, c.info ?? {})
    t.equal(got.digest, c.digest, `${got.decisions} decisions (${got.waits} waited) and their explained terms as before; the first: ${got.sample.join(' | ')}`)
    // pinned draws, explained (full scan) and not (pruned selection): the router before the single draw
    const runs = [0, 1 - 2 ** -32].flatMap((pin) =>
      [true, false].map((explain) => workload({ ...c.options, cost: 'dynamo' }, c.seed, c.info ?? {}, pin, explain)),
    )
    t.same(
      runs.map((r) => r.digest),
      c.pinned,
      'with pinned draws, the decisions of the router before the single-draw tie-break',
    )
  })
}

t.test('the latency cost decides otherwise on the same workload', async (t) => {
  const c = CASES[0] as (typeof CASES)[number]
  const got = workload({ ...c.options, cost: 'latency' }, c.seed, {})
  t.not(got.digest, c.digest, 'a digest that every cost matched would prove nothing')
})
