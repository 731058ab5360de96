// Heap a router holds per open stream: what each scavenge has to copy while streams are open, so
// it sets the length of the GC pauses that reach the proxy's TTFT tail (README, Benchmarks,
// "where the tail comes from"). The router and its app run in this process; the upstream (it
// sends the first token, then holds the stream open) and the client run in a child process, so
// the heap measured is the router's alone. One figure per prompt length: with long prompts,
// anything that keeps the prompt reachable for the life of a stream dominates.
//
//   node dist/bench/stream-heap.js          (also part of `npm run bench:route`)
import { fork } from 'node:child_process'
import { Agent } from 'undici'
import { median } from './common.js'
import { fullGc } from '../src/runtime/heap-settle.js'

export interface StreamHeapRow {
  promptTokens: number
  streams: number
  /** Heap used with the streams open minus before, after full GCs, per stream; one per round. */
  bytesPerStream: number[]
  bytesPerStreamMedian: number
  /**
   * ArrayBuffer memory (outside the V8 heap, so no scavenge copies it) held per open stream, same
   * readings: mostly undici's copy of the request body, which it keeps until the response ends.
   */
  externalBytesPerStream: number[]
  externalBytesPerStreamMedian: number
}

type ToChild = { open: number; router: string; prompt: number } | { finish: true } | { exit: true }
type FromChild = { url: string } | { ready: true }

async function childMain(): Promise<void> {
  const { createServer } = await import('node:http')
  const held: import('node:http').ServerResponse[] = []
  const srv = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('data: {"id":"u","object":"text_completion","choices":[{"index":0,"text":"t1","finish_reason":null}]}\n\n')
      held.push(res)
    })
  })
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r))
  const send = (m: FromChild): void => void process.send?.(m)
  send({ url: `http://127.0.0.1:${(srv.address() as { port: number }).port}` })
  // one agent for every round, so later rounds reuse the connections and measure streams only
  const agent = new Agent({ connections: 4096 })
  process.on('message', (m: ToChild) => {
    if ('open' in m) {
      const u = new URL(m.router)
      let firsts = 0
      for (let i = 0; i < m.open; i++) {
        const ids = Array.from({ length: m.prompt }, (_, k) => (k * 7 + i * 1_000_003) % 150_000)
        agent.dispatch(
          {
            origin: u.origin,
            path: '/v1/completions',
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'mock', prompt: ids, max_tokens: 16, stream: true }),
          },
          {
            onConnect() {},
            onHeaders: () => true,
            onData: () => {
              if (++firsts === m.open) send({ ready: true })
              return true
            },
            onComplete() {},
            onError() {},
          },
        )
      }
    } else if ('finish' in m) {
      for (const r of held.splice(0)) r.end('data: [DONE]\n\n')
    } else process.exit(0)
  })
}

export async function benchStreamHeap(opts: { prompts?: number[]; streams?: number; rounds?: number } = {}): Promise<StreamHeapRow[]> {
  const prompts = opts.prompts ?? [64, 4096]
  const streams = opts.streams ?? 200
  const rounds = opts.rounds ?? 3
  const gc = fullGc()
  const settled = (): { heap: number; external: number } => {
    for (let i = 0; i < 4; i++) gc()
    const m = process.memoryUsage()
    return { heap: m.heapUsed, external: m.arrayBuffers }
  }
  const { Router } = await import('../src/core/router.js')
  const { buildApp } = await import('../src/http/server.js')
  const { parseServeConfig } = await import('../src/config.js')
  const cfg = parseServeConfig(['--router-event-threads', '1', '--router-mode', 'round-robin', '--router-queue-threshold', 'none', '--router-block-size', '64'], {})
  if (cfg === 'help') throw new Error('unexpected help')
  const router = await Router.start(cfg)
  const app = await buildApp({ router, tokenizer: null })
  const c = fork(new URL(import.meta.url).pathname, ['--child'])
  try {
    await app.fastify.listen({ host: '127.0.0.1', port: 0 })
    const routerUrl = `http://127.0.0.1:${(app.fastify.server.address() as { port: number }).port}`
    const next = (): Promise<FromChild> => new Promise((r) => c.once('message', (m: FromChild) => r(m)))
    const first = (await next()) as { url: string }
    await router.addWorker({ id: 1n, url: first.url })
    const settle = (): Promise<void> => new Promise((r) => setTimeout(r, 300))
    const out: StreamHeapRow[] = []
    for (const prompt of prompts) {
      // a round first to open the connections and compile the code paths
      c.send({ open: streams, router: routerUrl, prompt })
      await next()
      c.send({ finish: true })
      await settle()
      const per: number[] = []
      const ext: number[] = []
      for (let k = 0; k < rounds; k++) {
        const before = settled()
        c.send({ open: streams, router: routerUrl, prompt })
        await next()
        const open = settled()
        per.push((open.heap - before.heap) / streams)
        ext.push((open.external - before.external) / streams)
        c.send({ finish: true })
        await settle()
      }
      out.push({ promptTokens: prompt, streams, bytesPerStream: per, bytesPerStreamMedian: median(per), externalBytesPerStream: ext, externalBytesPerStreamMedian: median(ext) })
    }
    return out
  } finally {
    c.send({ exit: true })
    await app.shutdown(1000)
    await router.close()
  }
}

export function printStreamHeap(rows: StreamHeapRow[]): void {
  console.log('\nheap the router holds per open stream (after the first token; full GCs before each reading)')
  console.log('prompt tokens | streams | KB per stream, by round | median KB | outside the heap (ArrayBuffers), median KB')
  for (const r of rows)
    console.log(
      `${String(r.promptTokens).padStart(13)} | ${String(r.streams).padStart(7)} | ${r.bytesPerStream
        .map((x) => (x / 1024).toFixed(2))
        .join(', ')
        .padStart(23)} | ${(r.bytesPerStreamMedian / 1024).toFixed(2).padStart(9)} | ${(r.externalBytesPerStreamMedian / 1024).toFixed(2).padStart(10)}`,
    )
}

if (process.argv[2] === '--child') {
  await childMain()
} else if (process.argv[1]?.endsWith('stream-heap.js') === true) {
  printStreamHeap(await benchStreamHeap())
}
