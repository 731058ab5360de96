// A child process of bench:indexer: sends the trace's prompts to the engines round robin at a
// fixed rate, so the engines' KV events load the indexer. A process of its own, at the lowest CPU
// priority as the engines are, so that building and sending those bodies (12,000 tokens on
// average) never delays the /query clients or the indexer: in a deployment the clients of the
// engines and the engines themselves run on other machines.
import { join } from 'node:path'
import { Pool } from 'undici'
import { expandTokens, readTrace } from '../../src/sim/replay/trace.js'
import type { TraceRequest } from '../../src/sim/replay/trace.js'
import { repoRoot } from './common.js'

export interface DriverData {
  engines: string[]
  /** Requests per second. */
  rate: number
  model: string
  /** Index of the first trace request sent. */
  from: number
}

const d = JSON.parse(process.argv[2] ?? '{}') as DriverData
const requests = readTrace(join(repoRoot(), 'data', 'conversation_trace.jsonl')).slice(d.from)
const pools = d.engines.map((u) => new Pool(u, { connections: 16 }))
let i = 0
let done = 0
let stopped = false
const inFlight = new Set<Promise<void>>()
const t0 = performance.now()

function tick(): void {
  if (stopped) return
  const due = Math.floor(((performance.now() - t0) / 1000) * d.rate)
  for (; i < due && inFlight.size < 256; i++) {
    const r = requests[i % requests.length] as TraceRequest
    const body = `{"model":${JSON.stringify(d.model)},"prompt":[${Array.prototype.join.call(expandTokens(r), ',')}],"max_tokens":1}`
    const p = (pools[i % pools.length] as Pool)
      .request({ path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' }, body })
      .then(async (res) => {
        await res.body.dump()
        if (res.statusCode === 200) done++
      })
      .catch(() => {})
      .finally(() => inFlight.delete(p))
    inFlight.add(p)
  }
  setTimeout(tick, 5)
}

process.on('message', (m: string) => {
  if (m === 'count') process.send?.({ done })
  else if (m === 'stop') {
    stopped = true
    void Promise.all([...inFlight])
      .then(() => Promise.all(pools.map((p) => p.close())))
      .then(() => process.send?.({ done, stopped: true }))
      .then(() => process.exit(0))
  }
})
tick()
