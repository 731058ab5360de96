// A client disconnect runs every cleanup listener even when one throws, and a dispatcher that
// throws when asked to abort does not leave the request's booking held or crash the router.
import t from 'tap'
import type { AddressInfo } from 'node:net'
import { Dispatcher } from 'undici'
import { ClientGone } from '../../src/http/proxy/client-gone.js'
import { harness, tokens, until } from './helpers.js'

t.test('every listener runs; the errors are thrown once all have', async (t) => {
  const g = new ClientGone()
  const ran: string[] = []
  g.addEventListener('abort', () => {
    ran.push('a')
    throw new Error('first fails')
  })
  g.addEventListener('abort', () => {
    ran.push('b')
  })
  t.throws(() => g.abort(), /first fails/)
  t.same(ran, ['a', 'b'])
  t.equal(g.aborted, true)
  t.doesNotThrow(() => g.abort(), 'a second abort does nothing')
  t.same(ran, ['a', 'b'])

  const two = new ClientGone()
  two.addEventListener('abort', () => {
    throw new Error('one')
  })
  two.addEventListener('abort', () => {
    throw new Error('two')
  })
  t.throws(() => two.abort(), AggregateError)
})

/** Accepts every request, never answers, and throws when asked to abort one. */
class Unabortable extends Dispatcher {
  dispatched = 0
  override dispatch(_opts: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    this.dispatched++
    handler.onConnect?.(() => {
      throw new Error('this dispatcher cannot abort')
    })
    return true
  }
  override close(): Promise<void> {
    return Promise.resolve()
  }
  override destroy(): Promise<void> {
    return Promise.resolve()
  }
}

t.test('a dispatcher that throws on abort: the booking is released and the router keeps serving', async (t) => {
  const d = new Unabortable()
  const h = await harness(['--router-block-size', '4'], null, d)
  t.teardown(() => h.close())
  await h.router.addWorker({ id: 7n, url: 'http://127.0.0.1:9' })
  await h.app.fastify.listen({ host: '127.0.0.1', port: 0 })
  const base = `http://127.0.0.1:${(h.app.fastify.server.address() as AddressInfo).port}`
  const released = h.app.proxy.releasedTotal
  const ac = new AbortController()
  const pending = fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: tokens(8), stream: true }),
    signal: ac.signal,
  })
  await until(() => d.dispatched === 1 && h.router.scheduler.stats().bookedRequests === 1)
  ac.abort()
  await t.rejects(pending)
  await until(() => h.router.scheduler.stats().bookedRequests === 0 && h.app.proxy.inFlight === 0)
  t.equal(h.app.proxy.releasedTotal, released + 1, 'released exactly once')
  const health = await fetch(`${base}/health`)
  t.equal(health.status, 200, 'the router still answers')
})
