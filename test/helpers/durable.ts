// Shared by the durable-intake tests: a nats-server and a client, shard pools and durable intakes
// torn down last-first, the index as a map per worker; router processes in durable mode and
// the comparison of their index with the engines' pools.
import type { Test } from 'tap'
import { connect } from 'nats'
import type { NatsConnection } from 'nats'
import { startNats } from '../../src/deploy/services.js'
import type { NatsServer } from '../../src/deploy/services.js'
import { encodeRouterEvent } from '../../src/codec/events.js'
import type { RouterEvent } from '../../src/codec/events.js'
import { ShardPool } from '../../src/shards/pool.js'
import { DurableKvEvents } from '../../src/transport/durable.js'
import type { DurableKvEventsOptions } from '../../src/transport/durable.js'
import type { MockerFleet } from '../../src/sim/mocker/fleet.js'
import { runCli, waitForOutput } from './cli.js'
import type { CliProcess } from './cli.js'
import { dumpedTokens, sortedByKey } from './zmq-fleet.js'

const enc = new TextEncoder()
export const STREAM = 'namespace-dynamo-component-backend-kv-events'
export const SUBJECT = `${STREAM}.queue`

/** Teardowns run last-first: a replica stops before its pool, and both before the server. */
const stacks = new WeakMap<Test, (() => Promise<unknown>)[]>()
export function later(t: Test, fn: () => Promise<unknown>): void {
  let s = stacks.get(t)
  if (s === undefined) {
    stacks.set(t, (s = []))
    const stack = s
    t.teardown(async () => {
      for (const f of stack.reverse()) await f()
    })
  }
  s.push(fn)
}

export async function natsAndClient(t: Test): Promise<{ nats: NatsServer; nc: NatsConnection }> {
  const nats = await startNats()
  later(t, () => nats.stop())
  const nc = await connect({ servers: nats.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 })
  later(t, () => nc.close())
  return { nats, nc }
}

export async function startPool(t: Test, shards = 1): Promise<ShardPool> {
  const pool = await ShardPool.start({ shards })
  later(t, () => pool.close())
  return pool
}

export async function startDurable(t: Test, o: Partial<DurableKvEventsOptions> & Pick<DurableKvEventsOptions, 'nc' | 'pool'>): Promise<DurableKvEvents> {
  const d = await DurableKvEvents.start({
    namespace: 'dynamo',
    component: 'backend',
    instanceId: 7n,
    snapshotThreshold: 1_000_000,
    resetStates: false,
    warn: () => undefined,
    ...o,
  })
  later(t, () => d.close())
  return d
}

/** block_hash → tokens_hash of everything the pool holds, per worker. */
export async function indexOf(pool: ShardPool): Promise<Map<bigint, Map<bigint, bigint>>> {
  const out = new Map<bigint, Map<bigint, bigint>>()
  for (const ev of await pool.dump()) {
    let m = out.get(ev.worker_id)
    if (m === undefined) out.set(ev.worker_id, (m = new Map()))
    const d = ev.event.data
    if (d === 'cleared') continue
    if ('removed' in d) for (const h of d.removed.block_hashes) m.delete(h)
    else for (const b of d.stored.blocks) m.set(b.block_hash, b.tokens_hash)
  }
  return out
}

/** An index as text, entries in order: two indexes compare equal when they hold the same. */
export function indexText(index: Map<bigint, Map<bigint, bigint>>): string {
  const cmp = (a: bigint, b: bigint): number => (a < b ? -1 : a > b ? 1 : 0)
  return [...index]
    .sort((x, y) => cmp(x[0], y[0]))
    .map(([w, m]) => `${w}:${[...m].sort((x, y) => cmp(x[0], y[0])).join(';')}`)
    .join('|')
}

export const publishAll = async (nc: NatsConnection, events: (RouterEvent | Uint8Array)[]): Promise<number> => {
  const js = nc.jetstream()
  let seq = 0
  for (const ev of events) seq = (await js.publish(SUBJECT, ev instanceof Uint8Array ? ev : enc.encode(encodeRouterEvent(ev)))).seq
  return seq
}

// ---- `kv-router serve` processes in durable mode, and what their index holds ----

export interface RouterProcess {
  cli: CliProcess
  base: string
  /** Its consumer's name, from the start-up line. */
  consumer: string
  /** SIGTERM (a clean stop) or SIGKILL (a crash); resolves once it exited. */
  stop(signal?: NodeJS.Signals): Promise<void>
}

/** A router reading the durable stream (and nothing else: no worker query), on a free port. */
export async function durableRouter(t: Test, natsUrl: string, blockSize: number, extra: string[] = []): Promise<RouterProcess> {
  const args = ['serve', '--http-host', '127.0.0.1', '--http-port', '0', '--router-block-size', String(blockSize), '--router-event-threads', '1']
  const cli = runCli([...args, '--nats-url', natsUrl, '--router-durable-kv-events', '--no-router-event-recovery', ...extra])
  let running = true
  const stop = async (signal: NodeJS.Signals = 'SIGTERM'): Promise<void> => {
    if (!running) return
    running = false
    cli.p.kill(signal)
    await cli.exited
  }
  later(t, () => stop())
  const m = await waitForOutput(cli, /listening on (http:\/\/\S+) \(.*durable consumer (\d+)/)
  if (m === null) throw new Error(`the router did not start: ${cli.err()}`)
  return { cli, base: m[1] as string, consumer: m[2] as string, stop }
}

/** '' when the router's index holds, per engine, exactly the blocks the engine's pool holds; else what differs. */
export async function mismatch(base: string, fleet: MockerFleet): Promise<string> {
  for (const w of fleet.workers) {
    const want = sortedByKey(w.engine.pool.cachedTokensHashes())
    const got = dumpedTokens(await (await fetch(`${base}/v1/kv/dump?worker_id=${w.workerId}`)).text())
    if (want.size !== got.size || [...want].some(([h, tok]) => got.get(h) !== tok)) return `worker ${w.workerId}: pool ${want.size} blocks, index ${got.size}`
  }
  return ''
}

/** A counter or gauge of GET /metrics, by its one label's value ('' for none); -1 when absent. */
export async function metric(base: string, name: string, label = ''): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text()
  const re = label === '' ? new RegExp(`^${name} (\\S+)$`, 'm') : new RegExp(`^${name}\\{[a-z_]+="${label}"\\} (\\S+)$`, 'm')
  const m = re.exec(text)
  return m === null ? -1 : Number(m[1])
}
