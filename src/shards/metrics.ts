// The index shards' series in the router's registry: shared-memory counters read at scrape time.
import { Counter, Gauge } from 'prom-client'
import type { Registry } from 'prom-client'
import type { ShardPool } from './pool.js'
import type { IndexRecovery } from './recovery.js'

const EVENT_TYPES = ['stored', 'removed', 'cleared'] as const

export function registerShardMetrics(r: Registry, pool: ShardPool, recovery: IndexRecovery | null): void {
  const shardCounter = (name: string, help: string, pick: (c: ReturnType<typeof pool.counters>[number]) => number): void => {
    new Counter({
      name,
      help,
      labelNames: ['shard'],
      registers: [r],
      collect() {
        this.reset()
        for (const c of pool.counters()) this.inc({ shard: String(c.shard) }, pick(c))
      },
    })
  }
  shardCounter('kvrouter_shard_events_received_total', 'Event messages the shard took from its ring', (c) => c.received)
  shardCounter('kvrouter_shard_events_applied_total', "Events applied to the shard's index", (c) => c.applied)
  shardCounter('kvrouter_shard_events_malformed_total', 'Event messages that did not decode', (c) => c.malformed)
  shardCounter('kvrouter_shard_event_gaps_total', "Gaps in a worker-rank's event ids: events it published that never arrived", (c) => c.gaps)
  shardCounter(
    'kvrouter_shard_events_misplaced_total',
    'Event messages whose worker belongs to another shard (the intake read another worker id than the decoder), sent on to that shard',
    (c) => c.misplaced,
  )
  shardCounter('kvrouter_shard_queries_total', 'Overlap queries answered', (c) => c.queries)
  shardCounter('kvrouter_shard_ring_full_total', "Pushes that found the shard's ring full (queued, never dropped)", (c) => c.ringFull)
  shardCounter('kvrouter_shard_ring_waits_total', 'Times the event producer slept until the shard had freed half its ring', (c) => c.ringWaits)
  shardCounter('kvrouter_shard_restarts_total', 'Shard thread restarts', (c) => c.restarts)
  shardCounter('kvrouter_shard_events_lost_total', 'Events lost with a dead shard thread', (c) => c.lost)
  new Counter({
    name: 'kvrouter_index_recovery_total',
    help:
      'Recovery of missed KV events through worker queries: gaps reported, recoveries answered with the missing range or a tree dump, ' +
      "recoveries failed (the gap stays a hole), answers of a variant not read, a transport's losses the shard's own gap covered",
    labelNames: ['what'],
    registers: [r],
    collect() {
      this.reset()
      const c = recovery?.counters
      if (c === undefined) return
      for (const [what, v] of [
        ['gaps', c.gaps],
        ['ranges', c.ranges],
        ['dumps', c.dumps],
        ['failed', c.failed],
        ['ignored', c.ignored],
        ['covered', c.covered],
      ] as const)
        this.inc({ what }, v)
    },
  })
  new Counter({
    name: 'kvrouter_events_dropped_total',
    help: 'Event messages from NATS dropped because the backlog waiting for the shards held its maximum (256 MiB)',
    registers: [r],
    collect() {
      this.reset()
      this.inc(pool.dropped)
    },
  })
  new Counter({
    name: 'kvrouter_shard_events_rejected_total',
    help: 'Events the index refused, by reason',
    labelNames: ['shard', 'reason'],
    registers: [r],
    collect() {
      this.reset()
      for (const c of pool.counters()) for (const [reason, v] of Object.entries(c.rejected)) this.inc({ shard: String(c.shard), reason }, v)
    },
  })
  new Counter({
    name: 'dynamo_component_kv_cache_events_applied',
    help: 'KV events by type and outcome, all shards: status ok or the reason it was rejected (a malformed message has no type: event_type "unknown")',
    labelNames: ['event_type', 'status'],
    registers: [r],
    collect() {
      this.reset()
      let bad = 0
      for (const c of pool.counters()) {
        bad += c.malformed
        for (const type of EVENT_TYPES) {
          this.inc({ event_type: type, status: 'ok' }, c.appliedByType[type])
          for (const [reason, v] of Object.entries(c.rejectedByType[type])) if (v > 0) this.inc({ event_type: type, status: reason }, v)
        }
      }
      // and the messages refused before any shard saw them (empty, or a NUL first byte)
      this.inc({ event_type: 'unknown', status: 'malformed' }, bad + pool.rejectedAtIntake)
    },
  })
  const shardGauge = (name: string, help: string, pick: (c: ReturnType<typeof pool.counters>[number]) => number): void => {
    new Gauge({
      name,
      help,
      labelNames: ['shard'],
      registers: [r],
      collect() {
        for (const c of pool.counters()) this.set({ shard: String(c.shard) }, pick(c))
      },
    })
  }
  // per worker-rank: what the index holds for it, asked of the shards at scrape time; a shard
  // that stalls (until it is restarted) leaves the series out rather than hold the scrape
  const treeSizes = () => Promise.race([pool.treeSizesNow(), new Promise<[]>((resolve) => setTimeout(resolve, 1000, []).unref())]).catch(() => [])
  new Gauge({
    name: 'kvrouter_worker_cached_blocks',
    help: 'Blocks the index holds for the worker-rank: what its KV events (or predictions) say it has cached',
    labelNames: ['worker_id', 'dp_rank'],
    registers: [r],
    async collect() {
      this.reset()
      for (const t of await treeSizes()) this.set({ worker_id: t.worker_id.toString(), dp_rank: String(t.dp_rank) }, t.tree_size)
    },
  })
  shardGauge('kvrouter_shard_blocks', "(block, worker-rank) entries in the shard's index", (c) => c.blocks)
  shardGauge(
    'kvrouter_shard_lower_tier_blocks',
    "(block, worker-rank) entries of host_pinned, disk and external tiers in the shard's index",
    (c) => c.lowerBlocks,
  )
  shardGauge('kvrouter_shard_nodes', "Radix-tree nodes in the shard's index", (c) => c.nodes)
  shardGauge('kvrouter_shard_worker_ranks', 'Worker-ranks the shard holds', (c) => c.workerRanks)
  shardGauge('kvrouter_shard_exact', "1 when the shard's answers are exact, 0 while it recovers", (c) => (c.health === 'exact' ? 1 : 0))
  shardGauge('kvrouter_shard_pending_messages', 'Messages queued behind a full ring', (c) => c.pendingMessages)
}
