// Queue ordering keys (Dynamo's queue policies). The key is computed once, when the request starts to wait,
// and the highest key is dispatched first. priority_jump = max(nvext.agent_hints.priority, 0).
//
//   fcfs  priority_jump − arrival_offset_secs          (earlier arrival or bigger jump first)
//   lcfs  priority_jump + arrival_offset_secs          (comparison experiments only)
//   wspt  (1 + priority_jump) / max(1, new_tokens)     (Smith's rule: short jobs first)
//
// new_tokens = isl − the best cached prefix (in tokens) among the request's eligible workers.
import type { QueuePolicy } from './options.js'

export function priorityJump(priority: number | undefined): number {
  return priority !== undefined && priority > 0 && Number.isFinite(priority) ? priority : 0
}

export function policyKey(policy: QueuePolicy, priority: number | undefined, arrivalOffsetSecs: number, newTokens: number): number {
  const jump = priorityJump(priority)
  switch (policy) {
    case 'fcfs':
      return jump - arrivalOffsetSecs
    case 'lcfs':
      return jump + arrivalOffsetSecs
    case 'wspt':
      return (1 + jump) / Math.max(1, newTokens)
  }
}
