// Simulated engines that publish their KV events over ZMQ as vLLM does, and traffic for them:
// shared by the publisher's tests and the router's engine-intake tests.
import type { Test } from 'tap'
import { parseJsonExact } from '../../src/codec/json.js'
import { isKvrError } from '../../src/errors.js'
import { MockerFleet } from '../../src/sim/mocker/fleet.js'
import type { FleetOptions } from '../../src/sim/mocker/fleet.js'
import type { Rng } from './rng.js'
import { waitUntil } from './wait.js'

export interface ZmqFleet {
  fleet: MockerFleet
  /** The first engine's PUB port (engine i publishes on base + i). */
  base: number
  pub: string
  replay: string | null
}

/**
 * A fleet whose PUB ports start at `base`, or at a random even base retried when taken (a ZMQ
 * endpoint needs a port to offset); replay sockets follow the PUB ones. A given base is waited
 * for (a fleet that just closed may still hold it).
 */
export async function zmqFleet(t: Test, o: FleetOptions & { blockSize: number }, opts: { base?: number; replay?: boolean } = {}): Promise<ZmqFleet> {
  const n = o.numWorkers ?? 1
  for (let attempt = 0; ; attempt++) {
    const base = opts.base ?? 20000 + Math.floor(Math.random() * 20000) * 2
    const pub = `tcp://127.0.0.1:${base}`
    const replay = opts.replay === false ? null : `tcp://127.0.0.1:${base + n}`
    try {
      const fleet = await MockerFleet.start({ ...o, kvEventsZmq: pub, ...(replay === null ? {} : { kvEventsReplayZmq: replay }), speedupRatio: 0 })
      t.teardown(() => fleet.close())
      return { fleet, base, pub, replay }
    } catch (err) {
      if (attempt > 10 || !isKvrError(err) || !/cannot bind/.test(err.message)) throw err
      if (opts.base !== undefined) await new Promise((r) => setTimeout(r, 200))
    }
  }
}

/** Requests with shared prefixes into every engine, then waits until all are done and published. */
export async function drive(fleet: MockerFleet, rng: Rng, requests: number): Promise<void> {
  let tok = 1 + rng.int(1000)
  const fresh = (n: number): number[] => Array.from({ length: n }, () => tok++)
  const prefixes = Array.from({ length: 4 }, () => fresh(6 + rng.int(12)))
  for (let i = 0; i < requests; i++) {
    const w = fleet.workers[i % fleet.workers.length]
    const base = rng.next() < 0.75 ? rng.pick(prefixes) : []
    w?.engine.submit([...base, ...fresh(1 + rng.int(14))], 1 + rng.int(14))
    if (i % 5 === 4) await new Promise((r) => setImmediate(r))
  }
  await waitUntil('the engines are idle', () => fleet.workers.every((w) => w.engine.runningCount + w.engine.waitingCount === 0), 20_000)
  await fleet.flushEvents()
}

/** A map ordered by key, so two maps of the same entries compare equal. */
export function sortedByKey(m: Map<bigint, bigint>): Map<bigint, bigint> {
  return new Map([...m].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)))
}

/** A block of the index as GET /v1/kv/dump shows it. */
export interface DumpedBlock {
  tokensHash: bigint
  parent: bigint | null
  dpRank: number
}

/** block_hash → its tokens_hash, parent and rank, from the text of a GET /v1/kv/dump answer (u64s read exactly). */
export function dumpedBlocks(json: string): Map<bigint, DumpedBlock> {
  const out = new Map<bigint, DumpedBlock>()
  const u64 = (v: unknown): bigint => BigInt(String(v))
  type Stored = { parent_hash: unknown; blocks: { block_hash: unknown; tokens_hash: unknown }[] }
  const body = parseJsonExact(json) as { events: { event: { dp_rank: number; data: { stored?: Stored; removed?: { block_hashes: unknown[] } } } }[] }
  for (const ev of body.events) {
    // the dump removes again the stand-in blocks it stores to rebuild a detached subtree
    for (const h of ev.event.data.removed?.block_hashes ?? []) out.delete(u64(h))
    const s = ev.event.data.stored
    if (s === undefined) continue
    let parent = s.parent_hash === null ? null : u64(s.parent_hash)
    for (const b of s.blocks) {
      const h = u64(b.block_hash)
      out.set(h, { tokensHash: u64(b.tokens_hash), parent, dpRank: ev.event.dp_rank })
      parent = h
    }
  }
  return out
}

/** block_hash → tokens_hash of a dump, ordered as sortedByKey orders a pool's. */
export function dumpedTokens(json: string): Map<bigint, bigint> {
  return sortedByKey(new Map([...dumpedBlocks(json)].map(([h, b]) => [h, b.tokensHash])))
}
