// The scheduler's series in the router's registry, read at scrape time.
import { Gauge } from 'prom-client'
import type { Registry } from 'prom-client'
import { labelledCounter } from '../metrics/collected.js'
import type { Scheduler } from './scheduler.js'

export function registerSchedulerMetrics(r: Registry, sched: Scheduler): void {
  new Gauge({
    name: 'dynamo_frontend_router_queue_pending_requests',
    help: 'Requests waiting in the router queue',
    labelNames: ['worker_type'],
    registers: [r],
    collect() {
      this.set({ worker_type: 'decode' }, sched.stats().queueDepth)
    },
  })
  const slotGauge = (name: string, help: string, pick: (s: ReturnType<typeof sched.stats>['slots'][number]) => number): void => {
    new Gauge({
      name,
      help,
      labelNames: ['worker_id', 'dp_rank', 'worker_type'],
      registers: [r],
      collect() {
        this.reset()
        for (const s of sched.stats().slots) this.set({ worker_id: s.workerId.toString(), dp_rank: String(s.dpRank), worker_type: 'decode' }, pick(s))
      },
    })
  }
  labelledCounter(
    r,
    'kvrouter_route_selections_total',
    'Route decisions by how the worker-rank was chosen: pruned (the load index, without scoring every worker-rank) or full_scan',
    'selection',
    () => {
      const s = sched.stats()
      return [
        ['pruned', s.prunedTotal],
        ['full_scan', s.decisionsTotal - s.prunedTotal],
      ]
    },
  )
  labelledCounter(
    r,
    'kvrouter_objective_requests_total',
    'Requests with latency objectives by what the router predicted: predicted_met, none_predicted (sent to the least predicted TTFT), ' +
      'shed (refused, priority < 0), not_predicted (another mode or cost, or pinned)',
    'outcome',
    () => {
      const o = sched.stats().objectives
      return [
        ['predicted_met', o.predictedMet],
        ['none_predicted', o.nonePredicted],
        ['shed', o.shed],
        ['not_predicted', o.notPredicted],
      ]
    },
  )
  slotGauge('dynamo_frontend_worker_active_decode_blocks', "KV blocks held by the worker-rank's active requests", (s) => s.activeBlocks)
  slotGauge('dynamo_frontend_worker_active_prefill_tokens', 'Prefill tokens not yet computed on the worker-rank', (s) => s.prefillTokens)
  slotGauge('kvrouter_worker_inflight_requests', 'Requests booked on the worker-rank', (s) => s.inFlight)
}
