// A new indexer started with --peers takes a running one's state: its registrations (GET
// /workers), whose streams it then follows itself, and its index as the binary snapshot the
// router's recovery uses (GET /snapshot, src/index/snapshot-format.ts). The registrations come
// first, so the listeners are connected before the snapshot is taken; the snapshot then replaces
// what the first replays brought of each worker-rank, and the streams carry on from there.
// Internal worker ids are derived from the registration (registry.ts), so the peer's snapshot
// names the same workers here.
import { parseJsonExact, readU64 } from '../codec/json.js'
import { isKvrError } from '../errors.js'
import type { ShardPool } from '../shards/pool.js'
import { log } from '../runtime/log.js'
import type { IndexerRegistry } from './registry.js'

const TIMEOUT_MS = 10_000

interface PeerWorker {
  instance_id: unknown
  model_name: string
  routing_group: string
  block_size: number
  endpoints: Record<string, string>
  replay_endpoints?: Record<string, string>
}

async function get(url: string): Promise<Response> {
  const r = await fetch(url, { signal: AbortSignal.timeout(TIMEOUT_MS) })
  if (r.status !== 200) throw new Error(`${url} answered ${r.status}`)
  return r
}

/** The first peer that answers, with what was taken from it; null when none did. */
export async function recoverFromPeers(
  peers: readonly string[],
  registry: IndexerRegistry,
  pool: ShardPool,
): Promise<{ peer: string; workers: number; entries: number } | null> {
  for (const peer of peers) {
    try {
      const workers = parseJsonExact(await (await get(`${peer}/workers`)).text()) as PeerWorker[]
      let n = 0
      for (const w of workers) {
        for (const [rank, endpoint] of Object.entries(w.endpoints)) {
          try {
            await registry.register({
              instanceId: readU64(w.instance_id, 'instance_id'),
              dpRank: Number(rank),
              modelName: w.model_name,
              routingGroup: w.routing_group,
              blockSize: w.block_size,
              endpoint,
              replayEndpoint: w.replay_endpoints?.[rank] ?? null,
            })
            n++
          } catch (err) {
            // one the indexer holds already (registered meanwhile) is kept as it is
            if (!isKvrError(err, 'KVR_ERR_INDEXER_CONFLICT')) throw err
          }
        }
      }
      const snap = new Uint8Array(await (await get(`${peer}/snapshot`)).arrayBuffer())
      const loaded = await pool.loadSnapshot(snap)
      return { peer, workers: n, entries: loaded.entries }
    } catch (err) {
      log.warn({ peer, err: (err as Error).message }, 'recovery from a peer failed; trying the next')
    }
  }
  return null
}
