// Gap detection's other half, and the first look at a new worker (docs/operations.md, "Recovery
// of missed events"): a router that misses a worker's KV events (a NATS outage, a router started
// after the worker cached blocks) would route on a stale index and call it exact.
//
// A worker that answers the worker query is recoverable: over HTTP, `POST {url}/v1/kv/query`, as
// `kv-router mocker` engines do; over Dynamo's TCP request plane, its `worker_kv_indexer_query_dp{rank}`
// endpoint (src/request-plane/worker-query.ts), for a worker whose instance record is a TCP address
// (urlOf gives it as `tcp://host:port/…`). Both answer the same way:
// - when it registers, its cached set is fetched as a tree dump and replaces what the index
//   holds for it, its live events held meanwhile (a router that starts late catches up);
// - when a shard sees its event ids skip (workers/shard/parking.ts), the shard holds that worker-rank's
//   events and this module asks for the missing range (a dump when the range is older than the
//   worker's ring), then the shard applies it and the held events in order.
// Whether a worker answers is probed once at registration, with a start id no worker has yet
// (TooNew); a worker that does not (a plain vLLM or SGLang) has its gaps counted and accepted,
// as Dynamo does when recovery fails. A failed recovery lets the held events go and leaves
// the worker-rank `degraded` until a recovery succeeds.
import { request } from 'undici'
import type { Dispatcher } from 'undici'
import type { ShardPool, EventGap } from './pool.js'
import { RecoveryKind } from '../thread/protocol.js'
import { limited } from '../runtime/log.js'
import type { RequestPlaneClient } from '../request-plane/client.js'
import { parseWorkerQueryAnswer, queryWorkerOverTcp, workerQueryJson } from '../request-plane/worker-query.js'
import type { WorkerQuery, WorkerQueryAnswer } from '../request-plane/worker-query.js'

export type IndexState = 'exact' | 'recovering' | 'degraded'

export interface IndexRecoveryOptions {
  /**
   * The worker's HTTP endpoint, or its request-plane address as `tcp://host:port/…`, or undefined
   * when it is not registered (its gaps are then accepted).
   */
  urlOf(workerId: bigint): string | undefined
  /** The client for workers reached over the request plane; without it they are not recoverable. */
  requestPlane?: RequestPlaneClient
  /**
   * The worker answered the worker query: it publishes KV events, and its dumps are about to
   * replace what the index holds of it. Called before the rebuild's records are queued.
   */
  onAnswers?(workerId: bigint): void
  /** Per attempt: connect, headers and body (ms). Default 5000. */
  timeoutMs?: number
  /** Attempts per recovery, with 100 ms, 400 ms… between them. Default 3. */
  attempts?: number
  dispatcher?: Dispatcher
}

export interface IndexRecoveryCounters {
  /** Gaps reported by the shards for recoverable workers. */
  gaps: number
  /** Recoveries answered with the missing events. */
  ranges: number
  /** Recoveries answered with a tree dump (registration, or a range older than the worker's ring). */
  dumps: number
  /** Recoveries that failed (no answer, an error, an answer that is not one): the held events went on with a hole. */
  failed: number
  /** Answers of a variant this router does not read (a newer Dynamo's): ignored, the query failed. */
  ignored: number
  /** Losses a transport reported that the shard saw in the event ids too: recovered once, by the shard's range. */
  covered: number
}

const QUERY_PATH = '/v1/kv/query'
/** A start id no worker reaches: the probe's answer is TooNew from any worker that answers queries. */
const PROBE_START = 0xffffffffffffffffn

/** A refusal is final when asking again cannot help (a 404, a bad answer), not when the worker was not reached. */
type Answer = WorkerQueryAnswer
/** A worker's answer larger than this is refused (it is parsed whole). */
const MAX_ANSWER_BYTES = 256 * 1024 * 1024
/** First wait before probing an unreachable worker again, and the longest. */
const PROBE_RETRY_MS = 1000
const PROBE_RETRY_MAX_MS = 30_000

export class IndexRecovery {
  readonly counters: IndexRecoveryCounters = { gaps: 0, ranges: 0, dumps: 0, failed: 0, ignored: 0, covered: 0 }
  private readonly opts: Required<Omit<IndexRecoveryOptions, 'dispatcher' | 'onAnswers' | 'requestPlane'>> &
    Pick<IndexRecoveryOptions, 'dispatcher' | 'onAnswers' | 'requestPlane'>
  /** Worker-ranks ("id:rank") recovering now, or left degraded by a failed recovery. */
  private readonly states = new Map<string, IndexState>()
  /** Workers that answered the probe. */
  private readonly recoverable = new Set<bigint>()
  /** Gaps the shards reported per worker-rank ("id:rank"), so a transport's report of the same loss is known as such. */
  private readonly shardGaps = new Map<string, number>()
  /**
   * The registration each worker is in, numbered from one counter: work begun for a registration
   * that was removed or replaced meanwhile leaves no state behind (and a removed worker's entry
   * goes, so the map holds registered workers only).
   */
  private readonly epochs = new Map<bigint, number>()
  private epochSeq = 0
  private readonly inFlight = new Set<AbortController>()
  private closed = false

  constructor(
    private readonly pool: ShardPool,
    options: IndexRecoveryOptions,
  ) {
    this.opts = {
      timeoutMs: options.timeoutMs ?? 5000,
      attempts: options.attempts ?? 3,
      urlOf: options.urlOf,
      ...(options.onAnswers === undefined ? {} : { onAnswers: options.onAnswers }),
      ...(options.dispatcher === undefined ? {} : { dispatcher: options.dispatcher }),
      ...(options.requestPlane === undefined ? {} : { requestPlane: options.requestPlane }),
    }
    // kept after close(): a gap reported later is answered at once (as failed), so no hold waits
    pool.on('gap', (g: EventGap) => void this.recoverGap(g))
  }

  /** The index's state for a worker-rank. */
  stateOf(workerId: bigint, dpRank: number): IndexState {
    return this.states.get(`${workerId}:${dpRank}`) ?? 'exact'
  }

  private current(workerId: bigint, epoch: number): boolean {
    return !this.closed && this.epochs.get(workerId) === epoch
  }

  /**
   * A worker registered (or re-registered with a new URL, or its shard restarted empty): probe
   * it, and when it answers, rebuild each of its ranks from a dump. A worker that cannot be
   * reached yet (not up, busy) is probed again, 1 s later and doubling up to 30 s, for as long as
   * it stays registered: one failed probe must not leave it unrecoverable for good. One
   * that answers 404 (or any answer but TooNew or, from a worker with nothing buffered, a dump)
   * does not serve the query. Resolves to true when every rank was rebuilt; never rejects.
   */
  async workerAdded(workerId: bigint, dpRanks: number, maxProbes = Infinity): Promise<boolean> {
    const epoch = ++this.epochSeq
    this.epochs.set(workerId, epoch)
    for (let wait = PROBE_RETRY_MS, probes = 0; ; wait = Math.min(PROBE_RETRY_MAX_MS, wait * 2)) {
      const url = this.opts.urlOf(workerId)
      if (url === undefined || !this.current(workerId, epoch)) return false
      const probe = await this.query(url, workerId, 0, PROBE_START, null, 1)
      if (!this.current(workerId, epoch)) return false
      if (probe.kind === 'refused' && !probe.final) {
        // out of patience: the caller goes on without it, and the probing goes on behind it
        if (++probes >= maxProbes) {
          void this.workerAdded(workerId, dpRanks)
          return false
        }
        await new Promise((r) => setTimeout(r, wait).unref())
        continue
      }
      // a worker with no event buffered yet answers any start id with an empty dump
      // (lib/kv-router/src/indexer/local.rs@fb5e6949, classify_query): it serves the query too
      const answers = probe.kind === 'TooNew' || probe.kind === 'TreeDump'
      if (answers !== this.recoverable.has(workerId)) {
        if (answers) this.recoverable.add(workerId)
        else this.recoverable.delete(workerId)
        this.pool.setRecoverable(workerId, answers)
      }
      if (!answers) return false
      this.opts.onAnswers?.(workerId)
      const newest = probe.kind === 'TooNew' ? probe.newest : probe.lastEventId
      const done = await Promise.all(Array.from({ length: dpRanks }, (_, rank) => this.rebuild(url, workerId, epoch, rank, rank === 0 ? newest : null)))
      return done.every((x) => x)
    }
  }

  /**
   * A shard restarted empty: its workers' recoverability is told to it again with the rebuild.
   * A worker not reached in three probes does not hold the shard up (it is rebuilt when reached).
   */
  async rebuildWorker(workerId: bigint, dpRanks: number): Promise<boolean> {
    if (this.recoverable.delete(workerId)) this.pool.setRecoverable(workerId, false)
    return this.workerAdded(workerId, dpRanks, 3)
  }

  /** A worker-rank whose blocks were lost with no way to fetch them back (a shard restart). */
  markLost(workerId: bigint, dpRanks: number): void {
    if (!this.epochs.has(workerId)) return
    for (let r = 0; r < dpRanks; r++) this.states.set(`${workerId}:${r}`, 'degraded')
  }

  /**
   * A transport saw a worker-rank's events go missing (the event plane's per-publisher sequence
   * numbers skipped) and has pushed the message that showed it. The shard may see the same loss
   * in that message's event ids and recover the missing range itself: that one recovery is
   * enough. Otherwise (ids that do not tell, a rank with no event yet) a recoverable worker's
   * rank is rebuilt from a dump; another's gap is counted and accepted, as the shards do with
   * event-id gaps. Never rejects.
   */
  async rankLost(workerId: bigint, dpRank: number): Promise<boolean> {
    const key = `${workerId}:${dpRank}`
    const seen = this.shardGaps.get(key) ?? 0
    if (this.recoverable.has(workerId) && !this.closed) {
      try {
        await this.pool.settled(workerId)
      } catch {
        // a shard that restarted is rebuilt from dumps anyway
        return false
      }
      if ((this.shardGaps.get(key) ?? 0) !== seen) {
        this.counters.covered++
        return false
      }
    }
    this.counters.gaps++
    const epoch = this.epochs.get(workerId)
    const url = this.opts.urlOf(workerId)
    if (epoch === undefined || url === undefined || !this.recoverable.has(workerId) || this.closed) return false
    // one recovery of the rank at a time: a dump or range already on its way covers this loss too
    if (this.states.get(key) === 'recovering') return false
    return this.rebuild(url, workerId, epoch, dpRank, null)
  }

  /** A worker left: nothing more is asked of it. */
  workerRemoved(workerId: bigint): void {
    this.epochs.delete(workerId)
    this.recoverable.delete(workerId)
    for (const m of [this.states, this.shardGaps]) for (const key of [...m.keys()]) if (key.startsWith(`${workerId}:`)) m.delete(key)
  }

  /** Stops asking: queries in flight are aborted, and their holds let go (as failures). */
  close(): void {
    this.closed = true
    for (const ac of this.inFlight) ac.abort()
  }

  /**
   * Replaces a worker-rank's blocks with the worker's dump. The dump stands for the events up to
   * at least the newest id the worker reported before it (`newest`, asked for when not given):
   * the next live event after a later one is then a gap, recovered in turn.
   */
  private async rebuild(url: string, workerId: bigint, epoch: number, rank: number, newest: bigint | null): Promise<boolean> {
    if (newest === null) {
      const p = await this.query(url, workerId, rank, PROBE_START, null, this.opts.attempts)
      if (p.kind === 'TooNew') newest = p.newest
      else if (p.kind === 'TreeDump') newest = p.lastEventId
    }
    // a removal during the probe: no hold is opened for a worker that is gone
    if (!this.current(workerId, epoch)) return false
    const key = `${workerId}:${rank}`
    this.states.set(key, 'recovering')
    const ticket = this.pool.park(workerId, rank)
    limited.info(
      'recovery_started',
      { worker_id: workerId.toString(), dp_rank: rank, what: 'dump' },
      "a worker-rank's cached blocks are fetched from the worker",
    )
    const a = await this.query(url, workerId, rank, null, null, this.opts.attempts)
    return this.finish(workerId, rank, ticket, epoch, a, newest)
  }

  private async recoverGap(g: EventGap): Promise<void> {
    this.counters.gaps++
    const rk = `${g.workerId}:${g.dpRank}`
    this.shardGaps.set(rk, (this.shardGaps.get(rk) ?? 0) + 1)
    const epoch = this.epochs.get(g.workerId)
    const url = this.opts.urlOf(g.workerId)
    if (epoch !== undefined && !this.closed) this.states.set(`${g.workerId}:${g.dpRank}`, 'recovering')
    limited.info(
      'recovery_started',
      { worker_id: g.workerId.toString(), dp_rank: g.dpRank, what: 'range', from: g.from.toString(), to: g.to.toString() },
      "a gap in a worker-rank's event ids: the missing events are fetched from the worker",
    )
    const a: Answer =
      url === undefined || epoch === undefined || this.closed
        ? { kind: 'refused', why: this.closed ? 'the router is stopping' : 'not registered', final: true }
        : await this.query(url, g.workerId, g.dpRank, g.from, g.to, this.opts.attempts)
    // a range older than the worker's ring comes as a dump: it stands for the events up to the
    // gap's end, and the held events follow it
    this.finish(g.workerId, g.dpRank, g.ticket, epoch, a, g.to)
  }

  /**
   * Ends a hold with its recovery (every hold opened is ended, whatever became of its worker: a
   * hold that ended otherwise drops it by its ticket). True when it was the events or a dump.
   */
  private finish(workerId: bigint, rank: number, ticket: number, epoch: number | undefined, a: Answer, dumpLastId: bigint | null): boolean {
    const key = `${workerId}:${rank}`
    const mine = epoch !== undefined && this.current(workerId, epoch)
    if (a.kind === 'Events' || a.kind === 'TreeDump') {
      if (a.kind === 'Events') this.counters.ranges++
      else this.counters.dumps++
      limited.info(
        'recovery_finished',
        { worker_id: workerId.toString(), dp_rank: rank, what: a.kind === 'Events' ? 'range' : 'dump', bytes: a.events.length },
        "a worker-rank's missed events were recovered",
      )
      this.pool.deliverRecovery(
        workerId,
        rank,
        ticket,
        a.kind === 'Events' ? RecoveryKind.Events : RecoveryKind.TreeDump,
        a.events,
        a.kind === 'TreeDump' ? dumpLastId : null,
      )
      if (mine) this.states.delete(key)
      return true
    }
    this.counters.failed++
    this.pool.deliverRecovery(workerId, rank, ticket, RecoveryKind.Failed, null)
    const why = a.kind === 'refused' ? a.why : `the worker answered ${a.kind}`
    if (mine) this.states.set(key, 'degraded')
    // one whose worker left, or whose router stops, degrades nothing
    limited.log(
      mine ? 'warn' : 'info',
      'recovery_failed',
      { ...(mine ? { code: 'KVR_INDEX_DEGRADED' } : {}), worker_id: workerId.toString(), dp_rank: rank, why },
      mine
        ? `worker ${workerId} rank ${rank}: its KV events could not be recovered (${why}); its index may miss blocks until it recovers`
        : `a recovery of worker ${workerId} rank ${rank} ended unanswered (${why}); the worker left or registered again meanwhile`,
    )
    return false
  }

  /** One worker query with retries; never rejects. */
  private async query(url: string, workerId: bigint, rank: number, start: bigint | null, end: bigint | null, attempts: number): Promise<Answer> {
    const q: WorkerQuery = { workerId, dpRank: rank, start, end }
    let last: Answer = { kind: 'refused', why: 'no attempt', final: false }
    for (let i = 0; i < attempts && !this.closed; i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 100 * 4 ** (i - 1)))
      last = url.startsWith('tcp://') ? await this.overTcp(url, q) : await this.once(url + QUERY_PATH, workerQueryJson(q))
      if (last.kind === 'refused' && last.ignored !== undefined) this.counters.ignored++
      // an answer, or a worker that plainly does not serve the query: no point asking again
      if (last.kind !== 'refused' || last.final) return last
    }
    return last
  }

  private async overTcp(address: string, q: WorkerQuery): Promise<Answer> {
    const client = this.opts.requestPlane
    if (client === undefined) return { kind: 'refused', why: 'no request-plane client for a TCP worker', final: true }
    const ac = new AbortController()
    this.inFlight.add(ac)
    try {
      return await queryWorkerOverTcp(client, address, q, ac.signal)
    } finally {
      this.inFlight.delete(ac)
    }
  }

  private async once(url: string, body: string): Promise<Answer> {
    const ac = new AbortController()
    this.inFlight.add(ac)
    try {
      const res = await request(url, {
        method: 'POST',
        body,
        headers: { 'content-type': 'application/json' },
        signal: ac.signal,
        headersTimeout: this.opts.timeoutMs,
        bodyTimeout: this.opts.timeoutMs,
        ...(this.opts.dispatcher === undefined ? {} : { dispatcher: this.opts.dispatcher }),
      })
      // read with a bound: the answer is parsed whole on the event loop
      const parts: Buffer[] = []
      let size = 0
      for await (const chunk of res.body) {
        size += (chunk as Buffer).length
        if (size > MAX_ANSWER_BYTES) {
          ac.abort()
          return { kind: 'refused', why: `the answer is larger than ${MAX_ANSWER_BYTES} bytes`, final: true }
        }
        parts.push(chunk as Buffer)
      }
      const text = Buffer.concat(parts).toString('utf8')
      // a worker that does not serve the query, or refuses it: final
      if (res.statusCode !== 200)
        return { kind: 'refused', why: `HTTP ${res.statusCode}: ${text.slice(0, 200)}`, final: res.statusCode < 500 || res.statusCode === 501 }
      return answerOf(text)
    } catch (err) {
      return { kind: 'refused', why: (err as Error).message, final: false }
    } finally {
      this.inFlight.delete(ac)
    }
  }
}

/** The query's answer over HTTP, as src/request-plane/worker-query.ts reads it. */
export function answerOf(text: string): Answer {
  return parseWorkerQueryAnswer(Buffer.from(text, 'utf8'))
}
