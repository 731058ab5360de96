// Each worker-rank's engine model, learned online from the requests the router sends it, so the
// latency cost (cost.ts) prices a slower or differently shaped engine as what it is rather than as
// the default model. What it observes, per request it booked:
//
//   time to first token   against x = the prefill tokens booked ahead of it plus its own uncached
//                         tokens, in chunks of k:  ttft ≈ a·x·min(x, k) + b·x + c·steps + steps·step
//                         with steps = max(1, x / k) and step the decode step at its KV usage
//                         (when requests were in flight): the cost's own T(x), linear in a, b, c
//   inter-token time      the stream's mean after its first token, against the KV usage p when it
//                         was booked:  itl ≈ base + rise·shape(p)
//
// Each fit is a weighted least-squares regression in the coefficients' ratios to the default
// model's (γ, 1 = the default), so one set of numbers means the same for every term:
//   - relative errors: each observation weighs 1 / prediction², so a long wait and a short one
//     count alike;
//   - robust: a Huber weight on the relative residual (beyond HUBER × its running spread an
//     observation counts less), so an outlier (a stall, a preemption) moves nothing much;
//   - drift: older observations fade by FORGET a request (memory ~1 / (1 − FORGET)), and the
//     spread widens while the residuals stay large, so a worker that slows down is followed
//     within DRIFT_REQUESTS requests (test/scheduler/engine-estimator.test.ts holds it to it);
//   - prior: a ridge towards the default's ratios worth PRIOR_WEIGHT observations, so a term the
//     traffic does not show (the quadratic one under short prompts) stays at the default's, and
//     a worker-rank with fewer than MIN_SAMPLES observations is priced with the default model.
//
// The cost sees a published model, not the running fit: each ratio taken to the power SHRINK
// (half its distance from the default's, in log terms), snapped to a grid of steps of GRID (so
// worker-ranks of one kind share one model, and the pruned selection's families stay few) and
// moved only when it leaves its cell by a margin (so it does not flap). Why only half: what the
// router sees of an engine mixes its speed with its load (a busy engine's prompts wait behind
// work the router did not book, evictions and preemptions recompute, its tokens share steps with
// other prompts' chunks), so the fit reads busy engines as slower than they are; priced in full,
// the learned differences sent most of a mixed fleet's work to its fast half and queued it there,
// while half of them kept the gain where engines are not saturated and lost nothing where they
// are (docs/cost.md shows the runs). GET /v1/workers shows the fit itself. Everything here is per
// slot in typed arrays; an observation allocates nothing until a published model changes.
import { DECODE_FLOOR_MS, DEFAULT_ENGINE_MODEL, decodeShape, EngineModel } from './engine-model.js'
import { grow } from './typed-arrays.js'

/** Observations fade by this factor each: a memory of ~25 requests. */
export const FORGET = 0.96
/** A worker-rank's estimate is used once it rests on this many observations. */
export const MIN_SAMPLES = 8
/** The prior's weight, in observations, pulling each ratio towards the default's. */
export const PRIOR_WEIGHT = 1
/** The prior's least weight on a term, in units of (term ÷ prediction)²: holds a term the observations do not show. */
const RIDGE_FLOOR = 1e-3
/** Residuals beyond this many spreads count less (Huber). */
export const HUBER = 2.5
/** A step change in speed is followed (within 15% of the new value) within this many requests. */
export const DRIFT_REQUESTS = 60
/** The published ratios' grid: steps of 15%. */
export const GRID = 1.15
/** The published ratio is the fit's to this power. */
export const SHRINK = 0.5
/** The fit moves its published ratio when it is this many grid steps away from it. */
const REPUBLISH_STEPS = 0.75
/** The ratios are kept within [1/RATIO_LIMIT, RATIO_LIMIT] of the default's. */
export const RATIO_LIMIT = 20
/** The relative spread the fits start from, and the least they keep. */
const SPREAD_START = 0.25
const SPREAD_FLOOR = 0.02
/** How fast the spread follows the residuals. */
const SPREAD_RATE = 0.1
/** Requests remembered between booking and their end (a ring; the oldest are forgotten). */
const REQUEST_CAPACITY = 1 << 16
/** A prefill of this many tokens and a decode step at this usage define the speeds shown. */
const SPEED_TOKENS = 1024
const SPEED_USAGE = 0.5

/** What GET /v1/workers, the status page and /metrics show of a worker-rank's model. */
export interface LearnedEngine {
  /** prefill_ms(T) = a·T² + b·T + c for T ≤ the chunk. */
  prefill: { a: number; b: number; c: number }
  /** Decode step ms at KV usage p: max(1, base + rise·shape(p)), shape the default curve's (0 at 0, 1 at 1). */
  decode: { base: number; rise: number }
  /** Against the default model (1 = as fast, 0.5 = takes twice as long): a 1,024-token prefill; a decode step at usage 0.5. */
  prefillSpeed: number
  decodeSpeed: number
  /** Observations taken since the worker-rank registered. */
  ttftSamples: number
  itlSamples: number
  /** Robust relative spread of the observations around the model (0.1 = ±10%): how sure it is. */
  ttftSpread: number
  itlSpread: number
  /** 'prior' until MIN_SAMPLES observations, then 'learned'. */
  prefillSource: 'prior' | 'learned'
  decodeSource: 'prior' | 'learned'
}

const ONES = new Float64Array([1, 1, 1])
const P = 3 // prefill ratios: a, b, c
const D = 2 // decode ratios: base, rise
const LN_GRID = Math.log(GRID)

/**
 * The published models: interned, so worker-ranks with the same one share it (and its id), with
 * the fleet's mean model for the cost's fleet terms. Model 0 is the default.
 */
export class EngineModels {
  /** Per slot: its published model's id. */
  modelOf = new Int32Array(8)
  private models: EngineModel[] = [DEFAULT_ENGINE_MODEL]
  private keys: string[] = ['']
  private refs: number[] = [0]
  private readonly ids = new Map<string, number>([['', 0]])
  private freeIds: number[] = []
  private liveOf = new Uint8Array(8)
  private liveN = 0
  private fleetModel: EngineModel = DEFAULT_ENGINE_MODEL
  private fleetStale = false

  /** The model of a slot (the default one for a slot never published). */
  of(slot: number): EngineModel {
    return this.models[slot < this.modelOf.length ? (this.modelOf[slot] as number) : 0] as EngineModel
  }

  model(id: number): EngineModel {
    return this.models[id] as EngineModel
  }

  /** The model whose coefficients are the live worker-ranks' means: the decode step of the fleet's mean usage. */
  get fleet(): EngineModel {
    if (this.fleetStale) this.fleetModel = this.meanModel()
    this.fleetStale = false
    return this.fleetModel
  }

  /** Models in use (the default one counted). */
  get count(): number {
    return this.models.length - this.freeIds.length
  }

  /** A slot joins (live) or leaves with the default model. */
  reset(slot: number, live: boolean): void {
    this.ensure(slot + 1)
    this.set(slot, '', DEFAULT_ENGINE_MODEL)
    const l = live ? 1 : 0
    if (this.liveOf[slot] !== l) {
      this.liveOf[slot] = l
      this.liveN += live ? 1 : -1
      if (live) this.refs[0] = (this.refs[0] as number) + 1
      else this.refs[0] = (this.refs[0] as number) - 1
    }
    this.fleetStale = true
  }

  /** Publishes a model for a live slot under its grid key; false when it already had it. */
  publish(slot: number, key: string, make: () => EngineModel): boolean {
    const cur = this.modelOf[slot] as number
    if (this.keys[cur] === key) return false
    this.set(slot, key, undefined, make)
    this.fleetStale = true
    return true
  }

  private set(slot: number, key: string, model?: EngineModel, make?: () => EngineModel): void {
    const cur = this.modelOf[slot] as number
    let id = this.ids.get(key)
    if (id === undefined) {
      id = this.freeIds.pop() ?? this.models.length
      const m = model ?? (make as () => EngineModel)()
      this.models[id] = m
      this.keys[id] = key
      this.refs[id] = 0
      this.ids.set(key, id)
    }
    if (this.liveOf[slot] === 1) {
      this.release(cur)
      this.refs[id] = (this.refs[id] as number) + 1
    }
    this.modelOf[slot] = id
  }

  private release(id: number): void {
    const r = (this.refs[id] as number) - 1
    this.refs[id] = r
    if (r === 0 && id !== 0) {
      this.ids.delete(this.keys[id] as string)
      this.freeIds.push(id)
    }
  }

  private meanModel(): EngineModel {
    // one model in use (the default one most of all): that one, bit for bit
    let only = -1
    let n = 0
    for (let i = 0; i < this.models.length; i++) {
      if ((this.refs[i] as number) <= 0) continue
      n++
      only = i
    }
    if (n === 0) return DEFAULT_ENGINE_MODEL
    if (n === 1) return this.models[only] as EngineModel
    let a = 0
    let b = 0
    let c = 0
    let base = 0
    let rise = 0
    for (let i = 0; i < this.models.length; i++) {
      const r = this.refs[i] as number
      if (r <= 0) continue
      const m = this.models[i] as EngineModel
      a += r * m.a
      b += r * m.b
      c += r * m.c
      base += r * m.base
      rise += r * m.rise
    }
    const k = this.liveN
    return new EngineModel(a / k, b / k, c / k, base / k, rise / k)
  }

  private ensure(n: number): void {
    if (this.modelOf.length >= n) return
    this.modelOf = grow(this.modelOf, n)
    this.liveOf = grow(this.liveOf, n)
  }
}

/** Told when a slot's published model changed (the load index refiles it). */
export type ModelListener = (slot: number) => void

export class EngineEstimator {
  readonly models = new EngineModels()
  /** Called after a slot's published model changed. */
  onChange: ModelListener | null = null

  // per slot: the prefill fit (Gram matrix upper triangle, right side, ratios, spread, samples)
  private pS = new Float64Array(8 * 6)
  private pR = new Float64Array(8 * P)
  private pG = new Float64Array(8 * P).fill(1)
  private pPub = new Float64Array(8 * P).fill(1)
  private pSpread = new Float64Array(8).fill(SPREAD_START)
  private pN = new Float64Array(8)
  // the decode fit
  private dS = new Float64Array(8 * 3)
  private dR = new Float64Array(8 * D)
  private dG = new Float64Array(8 * D).fill(1)
  private dPub = new Float64Array(8 * D).fill(1)
  private dSpread = new Float64Array(8).fill(SPREAD_START)
  private dN = new Float64Array(8)
  /** Per slot: bumped at every reset, so an observation of a request booked before it is dropped. */
  private gen = new Int32Array(8)

  // requests between booking and end, in a ring
  private readonly reqIds = new Map<string, number>()
  private readonly reqKey: (string | undefined)[] = new Array(REQUEST_CAPACITY)
  private readonly reqSlot = new Int32Array(REQUEST_CAPACITY)
  private readonly reqGen = new Int32Array(REQUEST_CAPACITY)
  private readonly reqX = new Float64Array(REQUEST_CAPACITY)
  private readonly reqK = new Float64Array(REQUEST_CAPACITY)
  private readonly reqBusy = new Uint8Array(REQUEST_CAPACITY)
  private readonly reqUsage = new Float64Array(REQUEST_CAPACITY)
  private readonly reqAt = new Float64Array(REQUEST_CAPACITY)
  private readonly reqFirst = new Float64Array(REQUEST_CAPACITY)
  private readonly reqOwn = new Float64Array(REQUEST_CAPACITY)
  /** prefillDone of its slot when its first token came: the prefills its decode shared since are the difference. */
  private readonly reqMark = new Float64Array(REQUEST_CAPACITY)
  private reqHead = 0
  /** Per slot: ms of prefill (by the fit) of the requests whose first token came, summed. */
  private prefillDone = new Float64Array(8)

  // scratch for the solves
  private readonly m3 = new Float64Array(9)
  private readonly v3 = new Float64Array(3)
  private readonly f3 = new Float64Array(3)

  constructor(readonly enabled: boolean) {}

  /** A slot registered (live) or was removed: its fit starts again from the prior. */
  reset(slot: number, live: boolean): void {
    this.ensure(slot + 1)
    this.pS.fill(0, slot * 6, slot * 6 + 6)
    this.pR.fill(0, slot * P, slot * P + P)
    this.pG.fill(1, slot * P, slot * P + P)
    this.pPub.fill(1, slot * P, slot * P + P)
    this.pSpread[slot] = SPREAD_START
    this.pN[slot] = 0
    this.dS.fill(0, slot * 3, slot * 3 + 3)
    this.dR.fill(0, slot * D, slot * D + D)
    this.dG.fill(1, slot * D, slot * D + D)
    this.dPub.fill(1, slot * D, slot * D + D)
    this.dSpread[slot] = SPREAD_START
    this.dN[slot] = 0
    this.gen[slot] = ((this.gen[slot] as number) + 1) | 0
    this.prefillDone[slot] = 0
    this.models.reset(slot, live)
  }

  /**
   * A request was booked on `slot`: `queued` prefill tokens ahead of it there, `uncached` of its
   * own, in chunks of `chunk`; `busy` when requests were in flight there (its steps carry
   * decodes), `usage` the KV usage there.
   */
  booked(id: string, slot: number, queued: number, uncached: number, chunk: number, busy: boolean, usage: number, now: number): void {
    if (!this.enabled) return
    const i = this.reqHead
    this.reqHead = (i + 1) & (REQUEST_CAPACITY - 1)
    const old = this.reqKey[i]
    if (old !== undefined && this.reqIds.get(old) === i) this.reqIds.delete(old)
    this.reqKey[i] = id
    this.reqIds.set(id, i)
    this.reqSlot[i] = slot
    this.reqGen[i] = this.gen[slot] as number
    this.reqX[i] = queued + uncached
    this.reqOwn[i] = uncached
    this.reqK[i] = chunk
    this.reqBusy[i] = busy ? 1 : 0
    this.reqUsage[i] = usage
    this.reqAt[i] = now
    this.reqFirst[i] = -1
  }

  /** The request's first token arrived at `now`: an observation of its time to first token. */
  firstToken(id: string, now: number): void {
    const i = this.reqIds.get(id)
    if (i === undefined || (this.reqFirst[i] as number) >= 0) return
    this.reqFirst[i] = now
    const slot = this.reqSlot[i] as number
    if (this.reqGen[i] !== this.gen[slot]) return
    const x = this.reqX[i] as number
    const k = this.reqK[i] as number
    if (x >= 1) this.observeTtft(slot, x, k, this.reqBusy[i] === 1, this.reqUsage[i] as number, now - (this.reqAt[i] as number))
    // its prefill shared the steps of the requests decoding there: their inter-token times carry it
    this.prefillDone[slot] = (this.prefillDone[slot] as number) + this.fitPrefillMs(slot, this.reqOwn[i] as number, k)
    this.reqMark[i] = this.prefillDone[slot] as number
  }

  /** The request ended at `now` after `outputTokens` tokens (0: failed or not streamed, only forgotten): its inter-token time. */
  ended(id: string, outputTokens: number, now: number): void {
    const i = this.reqIds.get(id)
    if (i === undefined) return
    this.reqIds.delete(id)
    this.reqKey[i] = undefined
    const first = this.reqFirst[i] as number
    const slot = this.reqSlot[i] as number
    if (first < 0 || !(outputTokens >= 2) || this.reqGen[i] !== this.gen[slot]) return
    // a step with prompt chunks in it takes their prefill on top of its decodes (cost.ts prices
    // steps so): the decode step is what is left of the stream's time without the prefills it shared
    const decoding = now - first - ((this.prefillDone[slot] as number) - (this.reqMark[i] as number))
    if (decoding > 0) this.observeItl(slot, decoding / (outputTokens - 1), this.reqUsage[i] as number)
  }

  /** One time-to-first-token observation, ms, of x tokens in chunks of k. */
  observeTtft(slot: number, x: number, k: number, busy: boolean, usage: number, ttftMs: number): void {
    // no engine answers in no time: a clock that did not move says nothing of the engine
    if (!(ttftMs > 0) || !Number.isFinite(ttftMs)) return
    const e = DEFAULT_ENGINE_MODEL
    const steps = x > k ? x / k : 1
    const f = this.f3
    f[0] = e.a * x * Math.min(x, k)
    f[1] = e.b * x
    f[2] = e.c * steps
    // the decode steps its prefill shared, at the fit's decode step (the engine's, not the priced one)
    const y = ttftMs - (busy ? steps * this.fitDecodeMs(slot, usage) : 0)
    const n = this.fit(slot, f, P, y, this.pS, this.pR, this.pG, this.pSpread, this.pN)
    if (n >= MIN_SAMPLES && this.snap(slot, this.pG, this.pPub, P)) this.publish(slot)
  }

  /** One inter-token observation, ms, at KV usage p. */
  observeItl(slot: number, itlMs: number, usage: number): void {
    if (!(itlMs > 0) || !Number.isFinite(itlMs)) return
    const e = DEFAULT_ENGINE_MODEL
    const f = this.f3
    f[0] = e.base
    f[1] = e.rise * decodeShape(Math.min(1, Math.max(0, usage)))
    const n = this.fit(slot, f, D, itlMs, this.dS, this.dR, this.dG, this.dSpread, this.dN)
    if (n >= MIN_SAMPLES && this.snap(slot, this.dG, this.dPub, D)) this.publish(slot)
  }

  /** The prefill ms of x tokens in chunks of k by the slot's prefill fit (the prior's until it has enough observations). */
  private fitPrefillMs(slot: number, x: number, k: number): number {
    if (!(x > 0)) return 0
    const d = DEFAULT_ENGINE_MODEL
    const learned = (this.pN[slot] as number) >= MIN_SAMPLES
    const o = slot * P
    const ga = learned ? (this.pG[o] as number) : 1
    const gb = learned ? (this.pG[o + 1] as number) : 1
    const gc = learned ? (this.pG[o + 2] as number) : 1
    return d.a * ga * x * Math.min(x, k) + d.b * gb * x + d.c * gc * (x > k ? x / k : 1)
  }

  /** The decode step ms at KV usage p by the slot's decode fit (the prior's until it has enough observations). */
  private fitDecodeMs(slot: number, p: number): number {
    const d = DEFAULT_ENGINE_MODEL
    if ((this.dN[slot] as number) < MIN_SAMPLES) return d.decodeMs(p)
    const g0 = this.dG[slot * D] as number
    const g1 = this.dG[slot * D + 1] as number
    return Math.max(DECODE_FLOOR_MS, d.base * g0 + d.rise * g1 * decodeShape(p))
  }

  /** What was learned of a slot's engine (the fit; the cost prices it shrunk), with how sure it is; null while learning is off. */
  learned(slot: number): LearnedEngine | null {
    if (!this.enabled || slot < 0 || slot >= this.gen.length) return null
    const d = DEFAULT_ENGINE_MODEL
    const pn = this.pN[slot] as number
    const dn = this.dN[slot] as number
    // each term the prior's until it rests on enough observations, as the cost takes it
    const p = pn >= MIN_SAMPLES ? this.pG.subarray(slot * P, slot * P + P) : ONES
    const q = dn >= MIN_SAMPLES ? this.dG.subarray(slot * D, slot * D + D) : ONES
    const m = new EngineModel(d.a * (p[0] as number), d.b * (p[1] as number), d.c * (p[2] as number), d.base * (q[0] as number), d.rise * (q[1] as number))
    return {
      prefill: { a: m.a, b: m.b, c: m.c },
      decode: { base: m.base, rise: m.rise },
      prefillSpeed: d.prefillMs(SPEED_TOKENS) / m.prefillMs(SPEED_TOKENS),
      decodeSpeed: d.decodeMs(SPEED_USAGE) / m.decodeMs(SPEED_USAGE),
      ttftSamples: Math.round(this.pN[slot] as number),
      itlSamples: Math.round(this.dN[slot] as number),
      ttftSpread: this.pSpread[slot] as number,
      itlSpread: this.dSpread[slot] as number,
      prefillSource: pn >= MIN_SAMPLES ? 'learned' : 'prior',
      decodeSource: dn >= MIN_SAMPLES ? 'learned' : 'prior',
    }
  }

  /** The running fit's ratios of a slot (tests): prefill a, b, c then decode base, rise. */
  ratios(slot: number): number[] {
    return [...this.pG.subarray(slot * P, slot * P + P), ...this.dG.subarray(slot * D, slot * D + D)]
  }

  /**
   * Adds one observation y ≈ Σ γ_j f_j to a slot's fit of n (2 or 3) ratios and solves it again;
   * returns the observations counted so far.
   */
  private fit(
    slot: number,
    f: Float64Array,
    n: number,
    y: number,
    S: Float64Array,
    R: Float64Array,
    G: Float64Array,
    spread: Float64Array,
    count: Float64Array,
  ): number {
    const tri = n === 3 ? 6 : 3
    const so = slot * tri
    const go = slot * n
    let pred = 0
    let prior = 0
    for (let j = 0; j < n; j++) {
      pred += (G[go + j] as number) * (f[j] as number)
      prior += f[j] as number
    }
    if (!(pred > 0) || !(prior > 0)) return count[slot] as number
    const rho = (y - pred) / pred
    const s = spread[slot] as number
    const abs = Math.abs(rho)
    const huber = abs <= HUBER * s ? 1 : (HUBER * s) / abs
    // the spread follows |ρ|, each step limited so one outlier cannot blow it up
    spread[slot] = Math.max(SPREAD_FLOOR, s + SPREAD_RATE * (Math.min(abs, 4 * s) - s))
    const w = huber / (pred * pred)
    // fade, then add: S = FORGET·S + w·f·fᵀ, R = FORGET·R + w·f·y (S's upper triangle, row by row)
    let t = so
    for (let j = 0; j < n; j++) {
      const fj = f[j] as number
      for (let l = j; l < n; l++) {
        S[t] = FORGET * (S[t] as number) + w * fj * (f[l] as number)
        t++
      }
      R[go + j] = FORGET * (R[go + j] as number) + w * fj * y
    }
    count[slot] = (count[slot] as number) + 1
    // the prior: PRIOR_WEIGHT observations at ratio 1, each term as large as in the observations
    // so far (their faded mean, S_jj / their faded count), plus a little for a term they hardly show
    const perObservation = (PRIOR_WEIGHT * (1 - FORGET)) / (1 - FORGET ** (count[slot] as number))
    const m = this.m3
    const v = this.v3
    t = so
    for (let j = 0; j < n; j++) {
      for (let l = j; l < n; l++) {
        const x = S[t++] as number
        m[j * n + l] = x
        m[l * n + j] = x
      }
      // S and R are in units of the prediction (w = 1 / pred²), so the ridge is in ratios directly
      const ridge = perObservation * (m[j * n + j] as number) + RIDGE_FLOOR
      m[j * n + j] = (m[j * n + j] as number) + ridge
      v[j] = (R[go + j] as number) + ridge
    }
    if (solve(m, v, n)) {
      for (let j = 0; j < n; j++) G[go + j] = Math.min(RATIO_LIMIT, Math.max(1 / RATIO_LIMIT, v[j] as number))
    }
    return count[slot] as number
  }

  /** Moves the published ratios that left their grid cell by the margin; true when one moved. */
  private snap(slot: number, G: Float64Array, pub: Float64Array, n: number): boolean {
    let moved = false
    for (let j = 0; j < n; j++) {
      const i = slot * n + j
      const g = (SHRINK * Math.log(G[i] as number)) / LN_GRID
      const p = Math.log(pub[i] as number) / LN_GRID
      if (Math.abs(g - p) < REPUBLISH_STEPS) continue
      const snapped = GRID ** Math.round(g)
      if (snapped !== pub[i]) {
        pub[i] = snapped
        moved = true
      }
    }
    return moved
  }

  private publish(slot: number): void {
    const pa = this.pPub[slot * P] as number
    const pb = this.pPub[slot * P + 1] as number
    const pc = this.pPub[slot * P + 2] as number
    const db = this.dPub[slot * D] as number
    const dr = this.dPub[slot * D + 1] as number
    const key = pa === 1 && pb === 1 && pc === 1 && db === 1 && dr === 1 ? '' : `${exp(pa)},${exp(pb)},${exp(pc)},${exp(db)},${exp(dr)}`
    const d = DEFAULT_ENGINE_MODEL
    if (this.models.publish(slot, key, () => new EngineModel(d.a * pa, d.b * pb, d.c * pc, d.base * db, d.rise * dr))) this.onChange?.(slot)
  }

  private ensure(n: number): void {
    if (this.gen.length >= n) return
    const cap = Math.max(n, this.gen.length * 2)
    this.pS = grow(this.pS, cap * 6)
    this.pR = grow(this.pR, cap * P)
    this.pG = grow(this.pG, cap * P)
    this.pPub = grow(this.pPub, cap * P)
    this.pSpread = grow(this.pSpread, cap)
    this.pN = grow(this.pN, cap)
    this.dS = grow(this.dS, cap * 3)
    this.dR = grow(this.dR, cap * D)
    this.dG = grow(this.dG, cap * D)
    this.dPub = grow(this.dPub, cap * D)
    this.dSpread = grow(this.dSpread, cap)
    this.dN = grow(this.dN, cap)
    this.gen = grow(this.gen, cap)
    this.prefillDone = grow(this.prefillDone, cap)
  }
}

/** The grid exponent of a published ratio. */
function exp(r: number): number {
  return Math.round(Math.log(r) / LN_GRID)
}

/** Solves m·x = v in place (x into v) for n ≤ 3 by Gaussian elimination with pivoting; false when singular. */
function solve(m: Float64Array, v: Float64Array, n: number): boolean {
  for (let c = 0; c < n; c++) {
    let p = c
    for (let r = c + 1; r < n; r++) if (Math.abs(m[r * n + c] as number) > Math.abs(m[p * n + c] as number)) p = r
    const piv = m[p * n + c] as number
    if (!(Math.abs(piv) > 0)) return false
    if (p !== c) {
      for (let k = 0; k < n; k++) {
        const t = m[c * n + k] as number
        m[c * n + k] = m[p * n + k] as number
        m[p * n + k] = t
      }
      const t = v[c] as number
      v[c] = v[p] as number
      v[p] = t
    }
    for (let r = c + 1; r < n; r++) {
      const k = (m[r * n + c] as number) / piv
      if (k === 0) continue
      for (let j = c; j < n; j++) m[r * n + j] = (m[r * n + j] as number) - k * (m[c * n + j] as number)
      v[r] = (v[r] as number) - k * (v[c] as number)
    }
  }
  for (let c = n - 1; c >= 0; c--) {
    let s = v[c] as number
    for (let j = c + 1; j < n; j++) s -= (m[c * n + j] as number) * (v[j] as number)
    v[c] = s / (m[c * n + c] as number)
  }
  return true
}
