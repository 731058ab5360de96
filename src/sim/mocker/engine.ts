// One simulated vLLM-like engine: a waiting and a running queue, one token budget per
// step spent on running requests first, chunked prefill, a sequence cap, preemption with
// recompute under memory pressure, and the paged KV pool with prefix caching whose Stored /
// Removed events are the engine's KV events. Steps take the time of the timing model.
//
// KV memory. The BlockPool holds full blocks only (each named by its chained hash, shareable,
// cacheable). A running request whose computed tokens end inside a block also occupies one
// partial block, which vLLM allocates but never caches; the engine counts those itself, and
// every scheduling decision requires
//
//     pool.activeBlocks + partial blocks + (what the step adds) ≤ num_gpu_blocks
//
// where "what the step adds" counts the request's next full blocks that are not already held by
// a running request (an inactive cached block must become active, a miss needs a slot) plus the
// change in its partial block. That is stricter than the pool's own room check, so the pool's
// allocation never fails after it; the pool evicts inactive blocks (LRU, Removed events) as it
// needs slots.
//
// Scheduling follows vLLM v1. Running requests are visited in admission order: a decoding one
// needs 1 token of budget, one still in (chunked) prefill gets min(remaining, budget). When a
// request's next blocks do not fit, the scheduler preempts another running request not yet
// scheduled in this step (lifo: the most recently admitted; fifo: the oldest such one) and
// tries again; when none is left it preempts the request itself and stops visiting. A preempted
// request frees its blocks (they stay cached, inactive), forgets its computed tokens and goes to
// the front of the waiting queue: later its prompt and the tokens it generated so far are
// recomputed, mostly from the prefix cache. Waiting requests are admitted only in steps without
// preemption, in order, while budget, sequence slots and memory allow; a waiting request's
// cached prefix (the pool's prefix hits when it is scheduled) is skipped, and the first time
// that count is its reported cached_tokens. Blocks are allocated when tokens are scheduled (as
// vLLM does), so a Stored event precedes the step that computes the block; a decoded token that
// completes a block extends the request's allocation, so decode blocks are stored too.
//
// Time. Steps run back to back against a monotonic clock: step n+1 starts at the ideal end of
// step n (start + modelled duration), not whenever the timer happened to fire, so timer
// lateness never accumulates; a late timer makes the following steps run with shorter waits (or
// none) until the schedule is caught up. After a stall longer than MAX_LAG_MS the backlog is
// dropped rather than replayed as a burst.
import { BlockPool } from './block-pool.js'
import type { RouterEvent } from '../../codec/events.js'
import { KvrError } from '../../errors.js'
import { blockHashesInto, sequenceHashesInto } from '../../codec/hashing.js'
import { MAX_TIMER_MS } from '../../runtime/timers.js'
import { EventRing } from './event-ring.js'
import { stepMs } from './timing.js'
import { PROFILES, PROFILE_NAMES } from './profiles.js'
import type { EngineProfile, ProfileName } from './profiles.js'

export type PreemptionMode = 'lifo' | 'fifo'

export interface EngineConfig {
  /** Worker id of the engine: its KV events carry it (an etcd lease id in distributed mode). */
  workerId: bigint
  /** Tokens per KV block (`--block-size`). */
  blockSize: number
  /** KV blocks of the engine (`--num-gpu-blocks-override`). */
  numGpuBlocks: number
  /** Blocks of the host (CPU) offload tier; 0 = none (`--num-cpu-blocks`). */
  numCpuBlocks: number
  /** Running requests at most (`--max-num-seqs`). */
  maxNumSeqs: number
  /** Token budget of one step (`--max-num-batched-tokens`). */
  maxNumBatchedTokens: number
  /** Split long prompts over steps (`--enable-chunked-prefill`). */
  enableChunkedPrefill: boolean
  /** Which running request gives way under memory pressure (`--preemption-mode`). */
  preemptionMode: PreemptionMode
  /** Divides every step duration; 0 = no sleep at all (`--speedup-ratio`). */
  speedupRatio: number
  /** Further divides decode time (`--decode-speedup-ratio`). */
  decodeSpeedupRatio: number
  /** Timing profile of the engine's steps (`--engine-profile`). */
  profile: ProfileName
  /** Divides the profile's durations: 0.5 is an engine at half speed (`--engine-profile NAME@SPEED`). */
  speed: number
}

export const ENGINE_DEFAULTS: Readonly<Omit<EngineConfig, 'workerId'>> = Object.freeze({
  blockSize: 64,
  numGpuBlocks: 16384,
  numCpuBlocks: 0,
  maxNumSeqs: 256,
  maxNumBatchedTokens: 8192,
  enableChunkedPrefill: true,
  preemptionMode: 'lifo',
  speedupRatio: 1,
  decodeSpeedupRatio: 1,
  profile: 'default',
  speed: 1,
})

/**
 * The engines' `--block-size` option and the range an engine takes; `kv-router mocker` and `npm
 * run cluster` (which hands its value on to the engines) each add their default and words.
 */
export const BLOCK_SIZE_OPTION = { flag: '--block-size', key: 'blockSize', kind: 'int', min: 1, max: 65536 } as const

export interface EngineOptions extends Partial<Omit<EngineConfig, 'workerId'>> {
  workerId: bigint
  /**
   * Every KV event, in order, after the local ring recorded it; a Stored event comes with its
   * blocks' token ids (prompt or generated), a view that stays valid (see BlockPoolSink).
   */
  onEvent?: (ev: RouterEvent, tokens?: Uint32Array) => void
  /** Called after every step (load reporting). */
  onStep?: (report: StepReport) => void
  /**
   * true (default): steps run by themselves in real time. false: only step() runs them, with
   * no waiting (tests drive the scheduler step by step).
   */
  autoStep?: boolean
  /** Monotonic clock in ms; performance.now by default. */
  now?: () => number
  ringSize?: number
}

/** Receives a request's output as it is generated. */
export interface RequestListener {
  /** A token other than the last was generated (r.outputTokens counts it). */
  onToken(r: EngineRequest): void
  /** The last token was generated; the request released its blocks. */
  onFinish(r: EngineRequest): void
}

export type RequestState = 'waiting' | 'running' | 'finished' | 'aborted'

/** Token ids the engine "generates": output position k is OUTPUT_TOKEN_BASE + k mod OUTPUT_TOKEN_CYCLE. */
export const OUTPUT_TOKEN_BASE = 100_000
export const OUTPUT_TOKEN_CYCLE = 10

export function outputToken(k: number): number {
  return OUTPUT_TOKEN_BASE + (k % OUTPUT_TOKEN_CYCLE)
}

/** Longest backlog the step loop catches up on after a stall (see the top of the file). */
export const MAX_LAG_MS = 1000
/** Steps run in one turn of the event loop at most, so I/O is never starved. */
const STEPS_PER_TURN = 32

export class EngineRequest {
  readonly id: number
  readonly isl: number
  readonly maxTokens: number
  /** Prompt, then the generated tokens. */
  readonly tokens: Uint32Array
  /** Tokens known so far: isl + outputTokens. */
  known: number
  /** Tokens whose KV is computed (or scheduled to be, within the current step). */
  computed = 0
  outputTokens = 0
  /** Prompt tokens found in the prefix cache when the prefill was first scheduled; -1 before. */
  cachedTokens = -1
  state: RequestState = 'waiting'
  preemptions = 0
  readonly arrivedAt: number
  firstTokenAt = -1
  finishedAt = -1
  listener: RequestListener | null
  /** Free for the owner (the HTTP server keeps its response here). */
  context: unknown = null

  // local and sequence hashes of the complete blocks, as halves
  readonly lo: Uint32Array
  readonly hi: Uint32Array
  readonly sLo: Uint32Array
  readonly sHi: Uint32Array
  /** Complete blocks hashed so far. */
  hashed = 0
  /** Full blocks allocated in the pool: floor(computed / block size) while running. */
  held = 0
  /** Holds a partial block (computed does not end on a block boundary). */
  partial = false
  /** Prefill finished since the last (re)admission: the request decodes one token per step. */
  decoding = false

  constructor(id: number, tokens: Uint32Array, isl: number, maxTokens: number, blockSize: number, at: number, listener: RequestListener | null) {
    this.id = id
    this.isl = isl
    this.maxTokens = maxTokens
    this.tokens = tokens
    this.known = isl
    this.arrivedAt = at
    this.listener = listener
    const blocks = Math.floor(tokens.length / blockSize)
    this.lo = new Uint32Array(blocks)
    this.hi = new Uint32Array(blocks)
    this.sLo = new Uint32Array(blocks)
    this.sHi = new Uint32Array(blocks)
  }
}

export interface ScheduledEntry {
  id: number
  /** Tokens computed for the request in the step (0 for a fully cached prompt). */
  tokens: number
  decode: boolean
}

export interface StepReport {
  step: number
  /** Modelled duration in wall-clock ms (after the speedup ratios). */
  durationMs: number
  /** Prefill tokens computed (T of the timing model). */
  prefillTokens: number
  /** Prompt tokens loaded from the host tier instead (charged at HOST_LOAD_COST each). */
  loadedTokens: number
  /** Context tokens before each of them, summed (the profile's attention term). */
  prefillPairs: number
  prefills: number
  decodes: number
  /** Budget spent: prefill tokens + decodes (+1 per fully cached prefill). */
  budgetUsed: number
  /** KV usage at the step: (active + partial blocks) / capacity. */
  kvUsage: number
  preempted: number[]
  scheduled: ScheduledEntry[]
  running: number
  waiting: number
}

export interface EngineStats {
  steps: number
  requests: number
  finished: number
  aborted: number
  preemptions: number
  promptTokens: number
  cachedTokens: number
  generatedTokens: number
  /** Simulated time the engine spent in steps (ms, after speedup). */
  busyMs: number
}

export interface EngineLoad {
  workerId: bigint
  /** Blocks held by running requests, partial ones included. */
  activeBlocks: number
  totalBlocks: number
  waiting: number
  running: number
  maxNumSeqs: number
  /** Cached prompt tokens / prompt tokens over every scheduled request. */
  prefixHitRate: number
}

/** Context tokens before each of k new tokens that start at position `from`, summed. */
function contextPairs(from: number, k: number): number {
  return k * from + (k * (k - 1)) / 2
}

function checkInt(name: string, v: number, min: number, max: number): void {
  if (!Number.isInteger(v) || v < min || v > max)
    throw new KvrError('KVR_ERR_INVALID_OPTION', `${name} must be an integer in [${min}, ${max}], got ${String(v)}`)
}

export class MockEngine {
  readonly config: Readonly<EngineConfig>
  private readonly profile: EngineProfile
  readonly pool: BlockPool
  readonly ring: EventRing
  readonly stats: EngineStats = {
    steps: 0,
    requests: 0,
    finished: 0,
    aborted: 0,
    preemptions: 0,
    promptTokens: 0,
    cachedTokens: 0,
    generatedTokens: 0,
    busyMs: 0,
  }

  private readonly waiting: EngineRequest[] = []
  private readonly running: EngineRequest[] = []
  private partialBlocks = 0
  private nextId = 1
  private readonly onEvent: ((ev: RouterEvent, tokens?: Uint32Array) => void) | undefined
  private readonly onStep: ((report: StepReport) => void) | undefined
  private readonly auto: boolean
  private readonly now: () => number
  private closed = false

  // the step in flight (auto mode)
  private inFlight: { end: number; sched: EngineRequest[]; report: StepReport } | null = null
  private nextStart = 0
  private idle = true
  private timeout: NodeJS.Timeout | null = null
  private immediate: NodeJS.Immediate | null = null

  // scratch for hashing one block chain link
  private readonly linkLo = new Uint32Array(2)
  private readonly linkHi = new Uint32Array(2)
  private readonly linkOutLo = new Uint32Array(2)
  private readonly linkOutHi = new Uint32Array(2)

  constructor(o: EngineOptions) {
    const c: EngineConfig = { ...ENGINE_DEFAULTS, workerId: o.workerId }
    for (const k of Object.keys(ENGINE_DEFAULTS) as (keyof typeof ENGINE_DEFAULTS)[]) {
      if (o[k] !== undefined) (c as unknown as Record<string, unknown>)[k] = o[k]
    }
    checkInt('block size', c.blockSize, BLOCK_SIZE_OPTION.min, BLOCK_SIZE_OPTION.max)
    checkInt('num_gpu_blocks', c.numGpuBlocks, 1, 1 << 26)
    checkInt('num_cpu_blocks', c.numCpuBlocks, 0, 1 << 26)
    checkInt('max_num_seqs', c.maxNumSeqs, 1, 1 << 20)
    checkInt('max_num_batched_tokens', c.maxNumBatchedTokens, 1, 1 << 30)
    if (c.preemptionMode !== 'lifo' && c.preemptionMode !== 'fifo')
      throw new KvrError('KVR_ERR_INVALID_OPTION', `preemption mode must be lifo or fifo, got ${String(c.preemptionMode)}`)
    if (!(c.speedupRatio >= 0) || !Number.isFinite(c.speedupRatio))
      throw new KvrError('KVR_ERR_INVALID_OPTION', `speedup ratio must be a finite number ≥ 0, got ${String(c.speedupRatio)}`)
    if (!(c.decodeSpeedupRatio > 0) || !Number.isFinite(c.decodeSpeedupRatio))
      throw new KvrError('KVR_ERR_INVALID_OPTION', `decode speedup ratio must be a finite number > 0, got ${String(c.decodeSpeedupRatio)}`)
    if (!(PROFILE_NAMES as readonly string[]).includes(c.profile))
      throw new KvrError('KVR_ERR_INVALID_OPTION', `engine profile must be one of ${PROFILE_NAMES.join(', ')}, got ${String(c.profile)}`)
    if (!(c.speed > 0) || !Number.isFinite(c.speed))
      throw new KvrError('KVR_ERR_INVALID_OPTION', `engine speed must be a finite number > 0, got ${String(c.speed)}`)
    this.config = Object.freeze(c)
    this.profile = PROFILES[c.profile]
    this.ring = new EventRing(o.ringSize)
    this.onEvent = o.onEvent
    this.onStep = o.onStep
    this.auto = o.autoStep ?? true
    this.now = o.now ?? (() => performance.now())
    this.pool = new BlockPool({
      capacity: c.numGpuBlocks,
      blockSize: c.blockSize,
      workerId: c.workerId,
      dpRank: 0,
      hostCapacity: c.numCpuBlocks,
      sink: (ev, tokens) => {
        this.ring.push(ev)
        this.onEvent?.(ev, tokens)
      },
    })
  }

  get workerId(): bigint {
    return this.config.workerId
  }
  get waitingCount(): number {
    return this.waiting.length
  }
  get runningCount(): number {
    return this.running.length
  }
  /** Running requests' partial blocks (not in the pool). */
  get partialBlockCount(): number {
    return this.partialBlocks
  }
  /** KV blocks in use by running requests, partial blocks included. */
  get activeBlocks(): number {
    return this.pool.activeBlocks + this.partialBlocks
  }

  load(): EngineLoad {
    return {
      workerId: this.config.workerId,
      activeBlocks: this.activeBlocks,
      totalBlocks: this.config.numGpuBlocks,
      waiting: this.waiting.length,
      running: this.running.length,
      maxNumSeqs: this.config.maxNumSeqs,
      prefixHitRate: this.stats.promptTokens > 0 ? this.stats.cachedTokens / this.stats.promptTokens : 0,
    }
  }

  /**
   * Queues a request: `prompt` token ids, `maxTokens` tokens to generate (the engine never stops
   * early, as with ignore_eos). Throws KvrError when the request could never run: an empty
   * prompt, a token outside u32, more KV than the engine has, or (chunked prefill off) more
   * tokens than one step's budget.
   */
  submit(prompt: ArrayLike<number>, maxTokens: number, listener: RequestListener | null = null): EngineRequest {
    if (this.closed) throw new KvrError('KVR_ERR_SHUTTING_DOWN', 'the engine is shutting down')
    const c = this.config
    const isl = prompt.length
    if (isl === 0) throw new KvrError('KVR_ERR_EMPTY_PROMPT', 'the prompt is empty')
    if (!Number.isInteger(maxTokens) || maxTokens < 1)
      throw new KvrError('KVR_ERR_INVALID_REQUEST', `max_tokens must be a positive integer, got ${String(maxTokens)}`)
    const total = isl + maxTokens
    const blocks = Math.ceil(total / c.blockSize)
    if (blocks > c.numGpuBlocks) {
      throw new KvrError(
        'KVR_ERR_INVALID_REQUEST',
        `prompt (${isl} tokens) + max_tokens (${maxTokens}) need ${blocks} KV blocks of ${c.blockSize} tokens; this engine has ${c.numGpuBlocks}`,
      )
    }
    if (!c.enableChunkedPrefill && total > c.maxNumBatchedTokens) {
      throw new KvrError(
        'KVR_ERR_INVALID_REQUEST',
        `prompt (${isl} tokens) + max_tokens (${maxTokens}) exceed max_num_batched_tokens (${c.maxNumBatchedTokens}) and chunked prefill is off`,
      )
    }
    const tokens = new Uint32Array(total)
    for (let i = 0; i < isl; i++) {
      const t = prompt[i] as number
      if (t >>> 0 !== t) throw new KvrError('KVR_ERR_TOKEN_OUT_OF_RANGE', `token at index ${i} is ${String(t)}; token ids must be integers in [0, 4294967295]`)
      tokens[i] = t
    }
    const r = new EngineRequest(this.nextId++, tokens, isl, maxTokens, c.blockSize, this.now(), listener)
    this.hashTo(r, Math.floor(isl / c.blockSize))
    this.waiting.push(r)
    this.stats.requests++
    this.kick()
    return r
  }

  /** Drops a request wherever it is and frees its blocks; false when it already ended. */
  abort(r: EngineRequest): boolean {
    if (r.state === 'finished' || r.state === 'aborted') return false
    if (r.state === 'waiting') {
      const i = this.waiting.indexOf(r)
      if (i >= 0) this.waiting.splice(i, 1)
    } else {
      const i = this.running.indexOf(r)
      if (i >= 0) this.running.splice(i, 1)
      this.freeBlocks(r)
    }
    r.state = 'aborted'
    r.finishedAt = this.now()
    this.stats.aborted++
    return true
  }

  /**
   * Runs one whole step now, without waiting for its modelled duration; null when there is
   * nothing to do. Only for an engine created with autoStep: false.
   */
  step(): StepReport | null {
    if (this.auto) throw new Error('step() drives an engine created with autoStep: false')
    const sched: EngineRequest[] = []
    const report = this.schedule(sched)
    if (report === null) return null
    this.complete(sched, report)
    return report
  }

  /** Steps until nothing is left (manual mode); returns the reports. */
  runUntilIdle(maxSteps = 1_000_000): StepReport[] {
    const out: StepReport[] = []
    for (let i = 0; i < maxSteps; i++) {
      const r = this.step()
      if (r === null) return out
      out.push(r)
    }
    throw new Error(`engine still busy after ${maxSteps} steps`)
  }

  /** Stops the loop and aborts every request. */
  close(): void {
    if (this.closed) return
    this.closed = true
    if (this.timeout !== null) clearTimeout(this.timeout)
    if (this.immediate !== null) clearImmediate(this.immediate)
    this.timeout = null
    this.immediate = null
    for (const r of [...this.running, ...this.waiting]) this.abort(r)
    this.inFlight = null
  }

  // ------------------------------------------------------------------------------------------
  // the real-time loop

  private kick(): void {
    if (!this.auto || this.closed || this.inFlight !== null || this.timeout !== null || this.immediate !== null) return
    this.immediate = setImmediate(this.loop)
  }

  private readonly loop = (): void => {
    this.timeout = null
    this.immediate = null
    for (let n = 0; n < STEPS_PER_TURN; n++) {
      if (this.closed) return
      const now = this.now()
      const f = this.inFlight
      if (f !== null) {
        if (now < f.end) {
          // a step slowed past Node's timer range (a tiny --speedup-ratio, a huge prefill)
          // would fire after 1 ms and spin; capped, the loop wakes early and waits again
          this.timeout = setTimeout(this.loop, Math.min(f.end - now, MAX_TIMER_MS))
          return
        }
        this.inFlight = null
        this.complete(f.sched, f.report)
      }
      if (this.idle || now - this.nextStart > MAX_LAG_MS) this.nextStart = now
      const sched: EngineRequest[] = []
      const report = this.schedule(sched)
      if (report === null) {
        this.idle = true
        return
      }
      this.idle = false
      const end = this.nextStart + report.durationMs
      this.nextStart = end
      this.inFlight = { end, sched, report }
    }
    this.immediate = setImmediate(this.loop)
  }

  // ------------------------------------------------------------------------------------------
  // scheduling

  /** Picks the step's work (allocating its blocks); null when there is nothing to run. */
  private schedule(sched: EngineRequest[]): StepReport | null {
    if (this.running.length === 0 && this.waiting.length === 0) return null
    const c = this.config
    const bs = c.blockSize
    const chunked = c.enableChunkedPrefill
    let budget = c.maxNumBatchedTokens
    const entries: ScheduledEntry[] = []
    const preempted: number[] = []
    let prefillTokens = 0
    let loadedTokens = 0
    let prefillPairs = 0
    let prefills = 0
    let decodes = 0

    let i = 0
    while (i < this.running.length && budget > 0) {
      const r = this.running[i] as EngineRequest
      const remaining = r.known - r.computed
      let k: number
      if (r.decoding) k = 1
      else if (chunked) k = Math.min(remaining, budget)
      else if (remaining <= budget) k = remaining
      else {
        i++
        continue
      }
      let selfPreempted = false
      while (!this.fits(r, r.computed + k)) {
        const v = this.victimAfter(i)
        if (v < 0) {
          this.preempt(i)
          preempted.push(r.id)
          selfPreempted = true
          break
        }
        preempted.push((this.running[v] as EngineRequest).id)
        this.preempt(v)
      }
      if (selfPreempted) break
      this.allocateTo(r, r.computed + k)
      const from = r.computed
      r.computed += k
      sched.push(r)
      budget -= k
      if (r.decoding) decodes++
      else {
        prefills++
        prefillTokens += k
        prefillPairs += contextPairs(from, k)
      }
      entries.push({ id: r.id, tokens: k, decode: r.decoding })
      i++
    }

    if (preempted.length === 0) {
      while (this.waiting.length > 0 && budget > 0 && this.running.length < c.maxNumSeqs) {
        const r = this.waiting[0] as EngineRequest
        const full = Math.floor(r.known / bs)
        this.hashTo(r, full)
        let hits = full > 0 ? this.pool.prefixHits(r.lo, r.hi, full) : 0
        // the device match continued in the host tier: those blocks are loaded, not computed
        const loaded = hits < full ? this.pool.hostRun(r.sLo, r.sHi, hits, full) : 0
        hits += loaded
        const start = hits * bs
        const remaining = r.known - start
        let k: number
        if (chunked) k = Math.min(remaining, budget)
        else if (remaining <= budget) k = remaining
        else break
        if (!this.fits(r, start + k)) break
        this.waiting.shift()
        if (r.cachedTokens < 0) {
          r.cachedTokens = Math.min(start, r.isl)
          this.stats.promptTokens += r.isl
          this.stats.cachedTokens += r.cachedTokens
        }
        this.allocateTo(r, start + k)
        r.computed = start + k
        r.state = 'running'
        this.running.push(r)
        sched.push(r)
        // a fully cached prompt still takes a slot in the batch to sample its first token
        budget -= Math.max(k, 1)
        prefills++
        prefillTokens += k
        loadedTokens += loaded * bs
        prefillPairs += contextPairs(start, k)
        entries.push({ id: r.id, tokens: k, decode: false })
      }
    }

    // Not reachable with the checks of submit() (a request alone always fits, and a running
    // request that preempts itself had others scheduled before it); an empty step of no
    // duration keeps the loop alive rather than stalling it, should that ever change.
    if (sched.length === 0) return this.emptyReport(preempted)
    const kvUsage = this.activeBlocks / c.numGpuBlocks
    const durationMs = stepMs({ prefillTokens, prefillPairs, decodes, kvUsage, loadedTokens }, c, this.profile, c.speed)
    this.stats.steps++
    this.stats.busyMs += durationMs
    return {
      step: this.stats.steps,
      durationMs,
      prefillTokens,
      loadedTokens,
      prefillPairs,
      prefills,
      decodes,
      budgetUsed: c.maxNumBatchedTokens - budget,
      kvUsage,
      preempted,
      scheduled: entries,
      running: this.running.length,
      waiting: this.waiting.length,
    }
  }

  private emptyReport(preempted: number[]): StepReport {
    this.stats.steps++
    return {
      step: this.stats.steps,
      durationMs: 0,
      prefillTokens: 0,
      loadedTokens: 0,
      prefillPairs: 0,
      prefills: 0,
      decodes: 0,
      budgetUsed: 0,
      kvUsage: this.activeBlocks / this.config.numGpuBlocks,
      preempted,
      scheduled: [],
      running: this.running.length,
      waiting: this.waiting.length,
    }
  }

  /** Applies a step's results: every request that caught up samples its next token. */
  private complete(sched: EngineRequest[], report: StepReport): void {
    const now = this.now()
    for (const r of sched) {
      if (r.state !== 'running' || r.computed !== r.known) continue
      if (!r.decoding) {
        r.decoding = true
        if (r.firstTokenAt < 0) r.firstTokenAt = now
      }
      r.tokens[r.known] = outputToken(r.outputTokens)
      r.known++
      r.outputTokens++
      this.stats.generatedTokens++
      if (r.outputTokens >= r.maxTokens) this.finish(r, now)
      else r.listener?.onToken(r)
    }
    this.onStep?.(report)
  }

  private finish(r: EngineRequest, now: number): void {
    const i = this.running.indexOf(r)
    if (i >= 0) this.running.splice(i, 1)
    this.freeBlocks(r)
    r.state = 'finished'
    r.finishedAt = now
    this.stats.finished++
    r.listener?.onFinish(r)
  }

  /** Index of the running request to preempt for the one at i, or -1 when none is left. */
  private victimAfter(i: number): number {
    const n = this.running.length
    if (n - 1 <= i) return -1
    return this.config.preemptionMode === 'lifo' ? n - 1 : i + 1
  }

  private preempt(index: number): void {
    const r = this.running[index] as EngineRequest
    this.running.splice(index, 1)
    this.freeBlocks(r)
    r.computed = 0
    r.decoding = false
    r.state = 'waiting'
    r.preemptions++
    this.stats.preemptions++
    this.waiting.unshift(r)
  }

  private freeBlocks(r: EngineRequest): void {
    if (r.held > 0) this.pool.release(r.id)
    r.held = 0
    if (r.partial) {
      r.partial = false
      this.partialBlocks--
    }
  }

  /** Would advancing r to `to` computed tokens fit in KV memory? */
  private fits(r: EngineRequest, to: number): boolean {
    const bs = this.config.blockSize
    const fa = Math.floor(to / bs)
    this.hashTo(r, fa)
    let add = 0
    for (let j = r.held; j < fa; j++) if (this.pool.refCount(r.sLo[j] as number, r.sHi[j] as number) <= 0) add++
    const delta = add + (to % bs !== 0 ? 1 : 0) - (r.partial ? 1 : 0)
    return delta <= this.config.numGpuBlocks - this.pool.activeBlocks - this.partialBlocks
  }

  private allocateTo(r: EngineRequest, to: number): void {
    const bs = this.config.blockSize
    const fa = Math.floor(to / bs)
    if (fa > r.held) {
      // the tokens are only read when a sink takes the Stored event; positions below `known` never change
      const res = this.pool.allocate(r.id, r.lo, r.hi, fa, r.tokens)
      // fits() is stricter than the pool's own check (see the top of the file)
      if (!res.ok) throw new Error(`mocker invariant broken: allocation of ${fa} blocks refused after the memory check`)
      r.held = fa
    }
    const p = to % bs !== 0
    if (p !== r.partial) {
      r.partial = p
      this.partialBlocks += p ? 1 : -1
    }
  }

  /** Hashes r's complete blocks up to n (local and chained sequence hashes). */
  private hashTo(r: EngineRequest, n: number): void {
    if (n <= r.hashed) return
    const bs = this.config.blockSize
    const from = r.hashed
    blockHashesInto(r.tokens.subarray(from * bs, n * bs), bs, r.lo.subarray(from, n), r.hi.subarray(from, n))
    if (from === 0) sequenceHashesInto(r.lo, r.hi, n, r.sLo, r.sHi)
    else {
      const lLo = this.linkLo
      const lHi = this.linkHi
      const oLo = this.linkOutLo
      const oHi = this.linkOutHi
      for (let j = from; j < n; j++) {
        lLo[0] = r.sLo[j - 1] as number
        lHi[0] = r.sHi[j - 1] as number
        lLo[1] = r.lo[j] as number
        lHi[1] = r.hi[j] as number
        sequenceHashesInto(lLo, lHi, 2, oLo, oHi)
        r.sLo[j] = oLo[1] as number
        r.sHi[j] = oHi[1] as number
      }
    }
    r.hashed = n
  }
}
