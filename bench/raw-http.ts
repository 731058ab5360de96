// Measuring sticks for `BENCH_PROXY_HOPS` (bench/proxy.ts): proxies that speak HTTP/1.1 on raw
// sockets instead of through Node's `http` server or undici, one side at a time or both. They say
// how much of a proxy's p99 overhead on this machine is Node's HTTP stack: the bare fastify +
// undici proxy is the stack's floor, the relay the floor of any process hop, and these sit
// between. They understand exactly what the benchmark's client and upstreams send (a POST with a
// Content-Length body; a 200 with a chunked SSE body) and nothing else. Not for use in front of
// anything: a client-facing parser this loose is what request smuggling is made of.
import { connect, createServer } from 'node:net'
import type { Socket } from 'node:net'
import type { Agent } from 'undici'
import { chunkFrame } from '../src/http/proxy/chunked.js'
import { announceReady, bytesApp, standInAgent } from './common.js'

interface Answer {
  /** The response's headers are in; its body follows. */
  head(status: number): void
  /** Each chunk's data, unframed, as it comes. */
  data(b: Buffer): void
  /** The last chunk came: the connection is free again. */
  end(): void
  /** The connection failed or was cut before the end. */
  error(): void
}

/** Chunked decoder states (positive values: data bytes left in the current chunk). */
const SIZE = -1
const DATA_END = -2
const LAST_END = -3

/**
 * A keep-alive client, round-robin over `urls`, that sends the request head and body in one write
 * and decodes the chunked body as it comes. Returns the send function; a send returns its abort.
 */
export function rawClient(urls: string[]): (body: Uint8Array, answer: Answer) => () => void {
  const targets = urls.map((u) => new URL(u))
  const idle: Socket[][] = targets.map(() => [])
  let next = 0
  return (body, answer) => {
    const i = next++ % targets.length
    const t = targets[i] as URL
    const pool = idle[i] as Socket[]
    let sock = pool.pop()
    if (sock === undefined) {
      const fresh = connect(Number(t.port), t.hostname)
      fresh.setNoDelay(true)
      // an idle connection the upstream closes (its keep-alive timeout) leaves the pool
      fresh.on('close', () => {
        const k = pool.indexOf(fresh)
        if (k >= 0) pool.splice(k, 1)
      })
      fresh.on('error', () => {})
      sock = fresh
    }
    const s = sock
    const head = Buffer.from(`POST /v1/completions HTTP/1.1\r\nhost: ${t.host}\r\ncontent-type: application/json\r\ncontent-length: ${body.byteLength}\r\n\r\n`, 'latin1')
    s.write(Buffer.concat([head, body]))
    let pending: Buffer | null = Buffer.alloc(0)
    let left = SIZE
    let size = 0
    let over = false
    const release = (): void => {
      s.off('data', onData)
      s.off('close', failed)
    }
    const failed = (): void => {
      if (over) return
      over = true
      release()
      s.destroy()
      answer.error()
    }
    const onData = (chunk: Buffer): void => {
      let b = chunk
      let p = 0
      if (pending !== null) {
        b = pending.length === 0 ? chunk : Buffer.concat([pending, chunk])
        const e = b.indexOf('\r\n\r\n')
        if (e < 0) {
          pending = b
          return
        }
        pending = null
        answer.head(Number(b.toString('latin1', 9, 12)))
        p = e + 4
      }
      while (p < b.length) {
        if (left > 0) {
          const n = Math.min(left, b.length - p)
          answer.data(b.subarray(p, p + n))
          p += n
          left -= n
          if (left === 0) left = DATA_END
          continue
        }
        const c = b[p++] as number
        if (left === SIZE) {
          if (c === 10) {
            left = size === 0 ? LAST_END : size
            size = 0
          } else if (c !== 13) size = size * 16 + (c <= 57 ? c - 48 : (c | 32) - 87)
        } else if (c === 10) {
          if (left === DATA_END) left = SIZE
          else {
            over = true
            release()
            pool.push(s)
            answer.end()
            return
          }
        }
      }
    }
    s.on('data', onData)
    s.on('close', failed)
    return failed
  }
}

/** Child process: fastify (Node's `http` server) in front, the raw client behind. */
export async function rawClientProxy(urls: string[]): Promise<void> {
  const send = rawClient(urls)
  const app = await bytesApp()
  app.post('/v1/completions', (req, reply) => {
    const res = reply.raw
    reply.hijack()
    const sock = res.socket as Socket
    const abort = send(req.body as Buffer, {
      head(status) {
        res.writeHead(status, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
        res.flushHeaders()
      },
      data(b) {
        sock.write(chunkFrame(b))
      },
      end() {
        res.end()
      },
      error() {
        res.destroy()
      },
    })
    res.on('close', () => {
      if (!res.writableFinished) abort()
    })
  })
  announceReady('raw-client', await app.listen({ port: 0, host: '127.0.0.1' }))
}

const RESPONSE_HEAD = Buffer.from('HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n', 'latin1')
const LAST_CHUNK = Buffer.from('0\r\n\r\n', 'latin1')

/**
 * Child process: a raw server in front (one request at a time per connection, its head read up to
 * the blank line, its body by Content-Length), undici or the raw client behind.
 */
export async function rawServerProxy(urls: string[], behind: 'undici' | 'raw'): Promise<void> {
  const send = behind === 'raw' ? rawClient(urls) : null
  let upstream: Agent | null = null
  let next = 0
  const server = createServer((c) => {
    c.setNoDelay(true)
    let buf: Buffer = Buffer.alloc(0)
    let busy = false
    let abort: (() => void) | null = null
    const answered = (): void => {
      c.write(LAST_CHUNK)
      busy = false
      abort = null
      serve()
    }
    const serve = (): void => {
      if (busy) return
      const e = buf.indexOf('\r\n\r\n')
      if (e < 0) return
      const m = /content-length:\s*(\d+)/i.exec(buf.toString('latin1', 0, e))
      const end = e + 4 + (m === null ? 0 : Number(m[1]))
      if (buf.length < end) return
      const body = Buffer.from(buf.subarray(e + 4, end))
      buf = buf.subarray(end)
      busy = true
      if (send !== null) {
        abort = send(body, { head: () => c.write(RESPONSE_HEAD), data: (b) => c.write(chunkFrame(b)), end: answered, error: () => c.destroy() })
        return
      }
      ;(upstream ??= standInAgent()).dispatch(
        { origin: urls[next++ % urls.length] as string, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' }, body },
        {
          onConnect(a: (err?: Error) => void) {
            abort = () => a(new Error('client gone'))
          },
          onHeaders() {
            c.write(RESPONSE_HEAD)
            return true
          },
          onData(b: Buffer) {
            c.write(chunkFrame(b))
            return true
          },
          onComplete: answered,
          onError() {
            c.destroy()
          },
        },
      )
    }
    c.on('data', (d: Buffer) => {
      buf = buf.length === 0 ? d : Buffer.concat([buf, d])
      serve()
    })
    c.on('error', () => {})
    c.on('close', () => {
      if (busy) abort?.()
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  announceReady(behind === 'raw' ? 'raw-both' : 'raw-server', `http://127.0.0.1:${(server.address() as { port: number }).port}`)
}
