// Where a kv run's cache hits went (diagnosis for bench:e2e): for every replayed request, the
// longest prefix it shares with an earlier request of the slice is what an infinite cache would
// serve. Each such request is put in one of three classes by where that earlier request ran and
// whether its prefill had finished when this one was sent:
//   same worker   — sent to the worker that computed the prefix: what is lost there is eviction;
//   other worker  — sent elsewhere: the routing decision gave up the prefix;
//   in prefill    — the prefix was still being computed: no cache could have served it yet.
// Among earlier requests sharing the longest prefix, the holder is one whose prefill had finished
// (on this request's worker if there is one). Requests sharing no more than the universal first
// 512-token block, and failed requests, are counted apart.
//
// Run: node dist/bench/e2e-misses.js RECORDS.jsonl [--minutes M] [--trace FILE]
//      (RECORDS from `npm run bench:e2e -- --records DIR`, one file per mode)
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { readTrace } from '../src/sim/replay/trace.js'
import type { TraceRequest } from '../src/sim/replay/trace.js'
import type { ReplayRecord } from '../src/sim/replay/client.js'
import { repoRoot } from './common.js'

const BLOCK = 64
const TRACE_BLOCK = 512
/** How far back to look for the longest shared prefix; conversations recur within minutes. */
const WINDOW = 2000

function sharedBlocks(a: TraceRequest, b: TraceRequest): number {
  let k = 0
  while (k < a.hash_ids.length && k < b.hash_ids.length && a.hash_ids[k] === b.hash_ids[k]) k++
  // equal ids mean equal tokens, also when one of the two prompts ends inside the block
  return Math.floor(Math.min(k * TRACE_BLOCK, a.input_length, b.input_length) / BLOCK)
}

function main(): void {
  const argv = process.argv.slice(2)
  const file = argv.find((a) => !a.startsWith('--'))
  if (file === undefined) {
    process.stderr.write('usage: node dist/bench/e2e-misses.js RECORDS.jsonl [--minutes M] [--trace FILE]\n')
    process.exit(2)
  }
  const opt = (name: string): string | undefined => {
    const i = argv.indexOf(name)
    return i < 0 ? undefined : argv[i + 1]
  }
  const minutes = Number(opt('--minutes') ?? 20)
  const trace = readTrace(opt('--trace') ?? join(repoRoot(), '..', 'shared', 'data', 'conversation_trace.jsonl')).filter((r) => r.timestamp < minutes * 60_000)
  const recs = readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as ReplayRecord)
    .sort((x, y) => x.id - y.id)
  const classes = { 'same worker': { n: 0, lost: 0 }, 'other worker': { n: 0, lost: 0 }, 'in prefill': { n: 0, lost: 0 } }
  let firstBlockOnly = 0
  let failed = 0
  let prompt = 0
  let cached = 0
  let possible = 0
  for (let i = 0; i < recs.length; i++) {
    const r = recs[i] as ReplayRecord
    const t = trace[r.id]
    if (t === undefined || t.timestamp !== r.timestamp) throw new Error(`record ${r.id} is not request ${r.id} of the ${minutes}-minute slice of this trace: pass --minutes or --trace`)
    prompt += r.prompt_tokens
    cached += r.cached_tokens
    let best = 0
    let from = -1
    let rank = -1
    for (let j = Math.max(0, i - WINDOW); j < i; j++) {
      const h = recs[j] as ReplayRecord
      const c = sharedBlocks(trace[h.id] as TraceRequest, t)
      if (c === 0 || c < best) continue
      // prefer a holder that had finished its prefill, then one on this request's worker
      const ready = h.ttft_ms !== null && h.sent_ms + h.ttft_ms <= r.sent_ms
      const k = (ready ? 2 : 0) + (h.worker === r.worker ? 1 : 0)
      if (c > best || k > rank) {
        best = c
        from = j
        rank = k
      }
    }
    possible += best * BLOCK
    if (r.error !== null) {
      failed++
      continue
    }
    if (best <= TRACE_BLOCK / BLOCK) {
      firstBlockOnly++
      continue
    }
    const holder = recs[from] as ReplayRecord
    const ready = holder.ttft_ms !== null && holder.sent_ms + holder.ttft_ms <= r.sent_ms
    const cls = !ready ? classes['in prefill'] : holder.worker === r.worker ? classes['same worker'] : classes['other worker']
    cls.n++
    cls.lost += Math.max(0, best * BLOCK - r.cached_tokens)
  }
  const pct = (x: number): string => `${((x / prompt) * 100).toFixed(1)}%`
  console.log(`${file}: ${recs.length} requests; cached ${pct(cached)} of prompt tokens; longest earlier shared prefix ${pct(possible)} (window ${WINDOW})`)
  console.log(`requests sharing at most the first ${TRACE_BLOCK}-token block: ${firstBlockOnly}; failed requests: ${failed}`)
  console.log('prefix holder          requests   prompt tokens lost')
  for (const [name, c] of Object.entries(classes)) console.log(`${name.padEnd(22)} ${String(c.n).padStart(8)}   ${pct(c.lost).padStart(18)}`)
}

main()
