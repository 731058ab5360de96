// Property: whatever the interleaving of add / prefill-complete / free / cancel / abort /
// stale expiry / worker removal, the per-slot loads always equal what the booked requests
// imply, and once everything has ended every worker is back to zero.
import t from 'tap'
import { Xoshiro128 } from '../../src/scheduler/rng.js'
import { ROUTER_MODES } from '../../src/scheduler/options.js'
import type { RouteDecision } from '../../src/scheduler/scheduler.js'
import { chain, makeScheduler } from './fixtures.js'

interface Req {
  id: string
  lo: Uint32Array
  hi: Uint32Array
  n: number
  ac: AbortController | undefined
}

const SEEDS = 24
const OPS = 400
const seen = { queued: 0, cancelled: 0, expired: 0, queueFull: 0, allBusy: 0, decisions: 0, sharedPrefixChecks: 0 }

for (let seed = 1; seed <= SEEDS; seed++) {
  t.test(`seed ${seed}`, async (t) => {
    const rng = new Xoshiro128(seed)
    const modes = ROUTER_MODES.filter((m) => m !== 'direct')
    const trackActiveBlocks = rng.next() < 0.85
    const assumeKvReuse = rng.next() < 0.7
    const opts = {
      mode: modes[rng.int(modes.length)],
      blockSize: 4,
      queueThreshold: rng.next() < 0.8 ? rng.next() * 2 : null,
      queueMaxPending: 5 + rng.int(20),
      trackActiveBlocks,
      assumeKvReuse,
      trackPrefillTokens: rng.next() < 0.8,
      staleRequestSecs: 30,
      activePrefillTokensThreshold: rng.next() < 0.35 ? 20 + rng.int(40) : null,
      temperature: rng.next() < 0.3 ? 0.7 : 0,
      seed,
    } as const
    const W = 2 + rng.int(4)
    const { s, clock } = makeScheduler(opts, W, () => ({ maxNumBatchedTokens: 40 + rng.int(60) }))
    const all = new Map<string, Req>()
    const settled = new Set<string>()
    let next = 0
    let removed: bigint | undefined

    const check = (where: string): void => {
      const seqs = s.sequences
      for (let i = 0; i < s.workers.liveCount; i++) {
        const slot = s.workers.liveSlots[i] as number
        let inFlight = 0
        let prefill = 0
        let sum = 0
        const union = new Set<string>()
        for (const r of all.values()) {
          const info = seqs.requestInfo(r.id)
          if (info === undefined || info.slot !== slot) continue
          inFlight++
          prefill += info.prefillTokens
          sum += r.n
          for (let k = 0; k < r.n; k++) union.add(`${r.lo[k]}:${r.hi[k]}`)
        }
        const blocks = !trackActiveBlocks ? 0 : assumeKvReuse ? union.size : sum
        if (seqs.inFlight[slot] !== inFlight || seqs.prefillTokens[slot] !== prefill || seqs.activeBlocks[slot] !== blocks) {
          t.fail(
            `${where}: slot ${slot} has ${seqs.inFlight[slot]}/${seqs.prefillTokens[slot]}/${seqs.activeBlocks[slot]}, model ${inFlight}/${prefill}/${blocks}`,
          )
          return
        }
      }
    }

    // the decode term's "blocks already active" must equal plain set membership per slot
    const checkPresent = (where: string): void => {
      const q = pick()
      if (q === undefined || !trackActiveBlocks || !assumeKvReuse) return
      const present = new Int32Array(s.workers.slotCapacity)
      s.sequences.countPresent(q.lo, q.hi, q.n, present)
      for (let i = 0; i < s.workers.liveCount; i++) {
        const slot = s.workers.liveSlots[i] as number
        const active = new Set<string>()
        for (const r of all.values()) {
          if (s.sequences.requestInfo(r.id)?.slot !== slot) continue
          for (let k = 0; k < r.n; k++) active.add(`${r.lo[k]}:${r.hi[k]}`)
        }
        let expected = 0
        for (let k = 0; k < q.n; k++) if (active.has(`${q.lo[k]}:${q.hi[k]}`)) expected++
        if (expected > 0 && expected < q.n) seen.sharedPrefixChecks++
        if (present[slot] !== expected) t.fail(`${where}: slot ${slot} present ${present[slot]}, expected ${expected}`)
      }
    }

    const pick = (): Req | undefined => {
      const ids = [...all.keys()]
      return ids.length === 0 ? undefined : all.get(ids[rng.int(ids.length)] as string)
    }

    for (let op = 0; op < OPS; op++) {
      const r = rng.next()
      if (r < 0.4) {
        const id = `r${next++}`
        // prompts share one of three prefixes, so blocks are shared across requests
        const prefix = rng.int(3)
        const len = 1 + rng.int(12)
        const contents = Array.from({ length: len }, (_, k) => (k < 4 ? prefix * 1000 + k : id.length * 7919 + next * 31 + k))
        const h = chain(contents)
        const ac = rng.next() < 0.3 ? new AbortController() : undefined
        const req: Req = { id, lo: h.lo, hi: h.hi, n: len, ac }
        all.set(id, req)
        const ov = new Float64Array(W).map(() => rng.int(len + 1))
        const pinned = rng.next() < 0.1
        s.schedule({
          id,
          isl: len * 4 + rng.int(4),
          seqLo: h.lo,
          seqHi: h.hi,
          overlapBlocks: ov,
          priority: rng.int(5) - 2,
          signal: ac?.signal,
          ...(pinned ? { workerId: BigInt(1 + rng.int(W)) } : {}),
        }).then(
          (_d: RouteDecision) => settled.add(id),
          () => {
            settled.add(id)
            all.delete(id)
          },
        )
      } else if (r < 0.6) {
        const q = pick()
        if (q !== undefined) s.markPrefillComplete(q.id)
      } else if (r < 0.75) {
        const q = pick()
        if (q !== undefined && s.free(q.id)) all.delete(q.id)
      } else if (r < 0.82) {
        const q = pick()
        if (q !== undefined) {
          const wasBooked = s.sequences.has(q.id)
          if (s.cancel(q.id) && wasBooked) all.delete(q.id)
        }
      } else if (r < 0.86) {
        const q = pick()
        q?.ac?.abort()
      } else if (r < 0.93) {
        clock.advance(rng.int(20_000))
        s.recheck()
        for (const q of [...all.values()]) if (!s.sequences.has(q.id) && !s.isWaiting(q.id) && settled.has(q.id)) all.delete(q.id)
      } else if (r < 0.96) {
        if (removed === undefined) {
          removed = BigInt(1 + rng.int(W))
          for (const id of s.removeWorker(removed)) all.delete(id)
        } else {
          s.addWorkerRank(removed, 0, { maxNumBatchedTokens: 50 })
          removed = undefined
        }
      } else {
        s.free(`unknown${op}`)
        s.markPrefillComplete(`unknown${op}`)
      }
      await Promise.resolve()
      check(`op ${op}`)
      if (op % 5 === 0) checkPresent(`op ${op}`)
    }

    // end everything: waiting ones are cancelled, booked ones freed
    for (const id of [...all.keys()]) s.cancel(id)
    for (const id of [...all.keys()]) s.free(id)
    s.recheck()
    await new Promise((resolve) => setImmediate(resolve))
    const seqs = s.sequences
    for (let slot = 0; slot < s.workers.slotCapacity; slot++) {
      t.equal(seqs.activeBlocks[slot], 0, `slot ${slot} active blocks`)
      t.equal(seqs.prefillTokens[slot], 0, `slot ${slot} prefill tokens`)
      t.equal(seqs.inFlight[slot], 0, `slot ${slot} in flight`)
    }
    t.equal(seqs.size, 0)
    t.equal(seqs.trackedPairs, 0, 'no block reference left behind')
    const st = s.stats()
    t.equal(st.queueDepth, 0)
    seen.queued += st.queuedTotal
    seen.cancelled += st.cancelledTotal
    seen.expired += st.staleExpiredTotal
    seen.queueFull += st.queueFullTotal
    seen.allBusy += st.allBusyTotal
    seen.decisions += st.decisionsTotal
  })
}

t.test('the interleavings reached every path', async (t) => {
  for (const [k, v] of Object.entries(seen)) t.ok(v > 0, `${k}: ${v}`)
})
