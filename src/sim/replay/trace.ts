// Mooncake-format request traces: one JSON object per line with `timestamp` (ms),
// `input_length`, `output_length` and `hash_ids`, where each id names one 512-token block of
// prompt and equal ids mean equal content. The trace carries no tokens, so a request is turned
// into tokens deterministically from its ids; two requests sharing a prefix of ids then share
// the same tokens, and therefore the same router block hashes, exactly as far as the trace says.
//
// The replay client, the index benchmark and the simulated engines all need the router's local
// block hashes of trace requests. Hashing every prompt from tokens would redo the same work for
// every request that shares a block: a router block never straddles two trace blocks when the
// block size divides 512, so the hashes inside one trace block depend on its id alone and are
// computed once per (id, block size).
import { createReadStream, readFileSync } from 'node:fs'
import { basename } from 'node:path'
import { createInterface } from 'node:readline'
import { fmix32 } from '../../codec/hash-mix.js'
import { blockHashesInto, checkBlockSize, completeBlocks, joinHalves } from '../../codec/hashing.js'

/** Tokens per trace block (Mooncake's block size; every published trace uses it). */
export const TRACE_BLOCK_TOKENS = 512
/**
 * Synthetic tokens are drawn from [0, TRACE_VOCAB_SIZE), the order of magnitude of current LLM
 * vocabularies, so they look like token ids to anything that inspects them (a tokenizer
 * decode, a vocabulary check) while still being distinct enough that blocks never collide.
 */
export const TRACE_VOCAB_SIZE = 150000

export interface TraceRequest {
  /** Arrival time in ms, relative to the start of the trace. */
  timestamp: number
  input_length: number
  output_length: number
  /** One id per 512-token block of the prompt; equal ids mean equal content. */
  hash_ids: number[]
}

/** The part of a request that determines its prompt. */
export type TracePrompt = Pick<TraceRequest, 'input_length' | 'hash_ids'>

/** A malformed trace line; `line` is 1-based, `source` names the file (or "trace"). */
export class TraceFormatError extends Error {
  readonly line: number
  readonly source: string
  constructor(source: string, line: number, message: string) {
    super(`${source} line ${line}: ${message}`)
    this.name = 'TraceFormatError'
    this.source = source
    this.line = line
  }
}

// ----------------------------------------------------------------------------------------------
// parsing

function isNonNegativeInteger(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0
}

function describe(v: unknown): string {
  if (v === undefined) return 'missing'
  const s = JSON.stringify(v)
  return s.length > 40 ? `${s.slice(0, 40)}…` : s
}

/** Trace blocks a prompt of `inputLength` tokens needs. */
export function traceBlocksFor(inputLength: number): number {
  return Math.ceil(inputLength / TRACE_BLOCK_TOKENS)
}

/**
 * Parses and validates one line. Unknown fields are ignored (other Mooncake traces add some);
 * extra ids beyond the prompt are allowed and ignored, too few are an error because the prompt
 * could not be built.
 */
export function parseTraceLine(text: string, line: number, source = 'trace'): TraceRequest {
  let v: unknown
  try {
    v = JSON.parse(text)
  } catch (err) {
    throw new TraceFormatError(source, line, `not valid JSON (${(err as Error).message})`)
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new TraceFormatError(source, line, 'expected a JSON object')
  const o = v as Record<string, unknown>
  const ts = o.timestamp
  if (typeof ts !== 'number' || !Number.isFinite(ts) || ts < 0) {
    throw new TraceFormatError(source, line, `"timestamp" must be a non-negative number of ms, got ${describe(ts)}`)
  }
  for (const f of ['input_length', 'output_length'] as const) {
    if (!isNonNegativeInteger(o[f])) throw new TraceFormatError(source, line, `"${f}" must be a non-negative integer, got ${describe(o[f])}`)
  }
  const ids = o.hash_ids
  if (!Array.isArray(ids)) throw new TraceFormatError(source, line, `"hash_ids" must be an array of non-negative integers, got ${describe(ids)}`)
  for (let i = 0; i < ids.length; i++) {
    if (!isNonNegativeInteger(ids[i])) {
      throw new TraceFormatError(source, line, `"hash_ids[${i}]" must be a non-negative integer, got ${describe(ids[i])}`)
    }
  }
  const input = o.input_length as number
  const need = traceBlocksFor(input)
  if (ids.length < need) {
    throw new TraceFormatError(
      source,
      line,
      `"hash_ids" has ${ids.length} block(s) (${ids.length * TRACE_BLOCK_TOKENS} tokens) but "input_length" ${input} needs ${need}`,
    )
  }
  return { timestamp: ts, input_length: input, output_length: o.output_length as number, hash_ids: ids as number[] }
}

/** Parses a whole JSONL text; blank lines are skipped but still counted for line numbers. */
export function parseTrace(text: string, source = 'trace', limit = Infinity): TraceRequest[] {
  const out: TraceRequest[] = []
  let line = 0
  let start = 0
  while (start < text.length && out.length < limit) {
    let end = text.indexOf('\n', start)
    if (end === -1) end = text.length
    line++
    const s = text.slice(start, end)
    if (s.trim() !== '') out.push(parseTraceLine(s, line, source))
    start = end + 1
  }
  return out
}

export interface ReadTraceOptions {
  /** Stop after this many requests. */
  limit?: number
}

/** Reads a whole trace file (the published ones are a few MB). */
export function readTrace(path: string, options: ReadTraceOptions = {}): TraceRequest[] {
  return parseTrace(readFileSync(path, 'utf8'), basename(path), options.limit ?? Infinity)
}

/** Streams a trace file line by line, for traces too long to hold or to start replaying early. */
export async function* streamTrace(path: string, options: ReadTraceOptions = {}): AsyncGenerator<TraceRequest> {
  const limit = options.limit ?? Infinity
  if (limit <= 0) return
  const source = basename(path)
  const rl = createInterface({ input: createReadStream(path, 'utf8'), crlfDelay: Infinity })
  let line = 0
  let n = 0
  try {
    for await (const s of rl) {
      line++
      if (s.trim() === '') continue
      yield parseTraceLine(s, line, source)
      if (++n >= limit) return
    }
  } finally {
    rl.close()
  }
}

// ----------------------------------------------------------------------------------------------
// tokens

const TWO32 = 4294967296
// Scaling a uniform u32 into the vocabulary with one float multiply: a `%` on values above 2^31
// leaves int32 arithmetic and costs several times more, over ~10^8 tokens for a whole trace.
const VOCAB_SCALE = TRACE_VOCAB_SIZE / TWO32

// Ids may exceed 32 bits in other traces, so both halves feed the seed.
function idSeed(id: number): number {
  const lo = id % TWO32
  const hi = (id - lo) / TWO32
  return fmix32((lo ^ fmix32(hi + 0x27d4eb2f)) >>> 0)
}

function checkId(id: number): void {
  if (!isNonNegativeInteger(id)) throw new RangeError(`trace block id must be a non-negative safe integer, got ${String(id)}`)
}

/** Token `pos` (0..511) of trace block `id`: a function of (id, pos) only. */
export function traceToken(id: number, pos: number): number {
  checkId(id)
  return Math.floor(fmix32((idSeed(id) ^ Math.imul(pos + 1, 0x9e3779b1)) >>> 0) * VOCAB_SCALE)
}

/** Writes the 512 tokens of trace block `id` into `out` from `offset`, at most `count` of them. */
export function fillTraceBlock(id: number, out: Uint32Array, offset = 0, count = TRACE_BLOCK_TOKENS): void {
  checkId(id)
  const seed = idSeed(id)
  const n = Math.min(count, TRACE_BLOCK_TOKENS)
  for (let p = 0; p < n; p++) out[offset + p] = Math.floor(fmix32((seed ^ Math.imul(p + 1, 0x9e3779b1)) >>> 0) * VOCAB_SCALE)
}

function checkPrompt(req: TracePrompt): void {
  if (!isNonNegativeInteger(req.input_length)) throw new RangeError(`input_length must be a non-negative integer, got ${String(req.input_length)}`)
  if (req.hash_ids.length < traceBlocksFor(req.input_length)) {
    throw new RangeError(`hash_ids has ${req.hash_ids.length} block(s), input_length ${req.input_length} needs ${traceBlocksFor(req.input_length)}`)
  }
}

/** The prompt of a request: its blocks' tokens, truncated to `input_length`. */
export function expandTokens(req: TracePrompt): Uint32Array {
  checkPrompt(req)
  const len = req.input_length
  const out = new Uint32Array(len)
  for (let k = 0, off = 0; off < len; k++, off += TRACE_BLOCK_TOKENS) {
    fillTraceBlock(req.hash_ids[k] as number, out, off, len - off)
  }
  return out
}

// ----------------------------------------------------------------------------------------------
// router block hashes

export interface LocalHashes {
  lo: Uint32Array
  hi: Uint32Array
  n: number
}

/**
 * Local block hashes (`tokens_hash`) of trace requests at one router block size,
 * with a cache per trace block id. Only complete router blocks count, so the truncated last
 * trace block contributes the complete blocks of its first `input_length mod 512` tokens: a
 * prefix of the id's cached list, since those tokens are a prefix of the id's 512.
 *
 * When the block size does not divide 512 a router block spans two trace blocks and nothing
 * can be cached per id; requests are then expanded and hashed whole (correct, just slower).
 */
export class TraceBlockHasher {
  readonly blockSize: number
  /** Router blocks per trace block when the block size divides 512, else 0 (no cache). */
  readonly perTraceBlock: number
  private slots = new Map<number, number>()
  private cacheLo: Uint32Array
  private cacheHi: Uint32Array
  private used = 0
  private tokens = new Uint32Array(TRACE_BLOCK_TOKENS)
  /** Trace blocks hashed so far (cache misses); with the cache, once per distinct id. */
  hashedTraceBlocks = 0

  constructor(blockSize: number) {
    checkBlockSize(blockSize)
    this.blockSize = blockSize
    this.perTraceBlock = TRACE_BLOCK_TOKENS % blockSize === 0 ? TRACE_BLOCK_TOKENS / blockSize : 0
    const initial = this.perTraceBlock * 1024
    this.cacheLo = new Uint32Array(initial)
    this.cacheHi = new Uint32Array(initial)
  }

  /** Distinct trace block ids cached. */
  get cachedTraceBlocks(): number {
    return this.slots.size
  }

  /** Router blocks of a prompt: its complete blocks only. */
  blockCount(req: TracePrompt): number {
    return completeBlocks(req.input_length, this.blockSize)
  }

  /** Offset of id's hashes in the cache, hashing the trace block the first time it is seen. */
  private offsetOf(id: number): number {
    const slot = this.slots.get(id)
    const per = this.perTraceBlock
    if (slot !== undefined) return slot * per
    const s = this.used++
    const off = s * per
    if (off + per > this.cacheLo.length) {
      const cap = Math.max(this.cacheLo.length * 2, off + per)
      const lo = new Uint32Array(cap)
      const hi = new Uint32Array(cap)
      lo.set(this.cacheLo)
      hi.set(this.cacheHi)
      this.cacheLo = lo
      this.cacheHi = hi
    }
    fillTraceBlock(id, this.tokens)
    blockHashesInto(this.tokens, this.blockSize, this.cacheLo.subarray(off, off + per), this.cacheHi.subarray(off, off + per))
    this.slots.set(id, s)
    this.hashedTraceBlocks++
    return off
  }

  /**
   * Writes the prompt's local hashes into lo/hi (which must hold `blockCount(req)` entries)
   * and returns how many were written.
   */
  hashesInto(req: TracePrompt, lo: Uint32Array, hi: Uint32Array): number {
    checkPrompt(req)
    const n = this.blockCount(req)
    if (lo.length < n || hi.length < n) throw new RangeError(`output arrays hold ${Math.min(lo.length, hi.length)} hashes, the prompt has ${n} blocks`)
    const per = this.perTraceBlock
    if (per === 0) {
      this.hashedTraceBlocks += traceBlocksFor(req.input_length)
      return blockHashesInto(expandTokens(req), this.blockSize, lo, hi)
    }
    let w = 0
    for (let k = 0; w < n; k++) {
      const off = this.offsetOf(req.hash_ids[k] as number)
      const take = Math.min(per, n - w)
      // Read the cache arrays after offsetOf: it may have replaced them while growing.
      lo.set(this.cacheLo.subarray(off, off + take), w)
      hi.set(this.cacheHi.subarray(off, off + take), w)
      w += take
    }
    return n
  }

  /** The prompt's local hashes in freshly allocated arrays. */
  hashes(req: TracePrompt): LocalHashes {
    const n = this.blockCount(req)
    const lo = new Uint32Array(n)
    const hi = new Uint32Array(n)
    this.hashesInto(req, lo, hi)
    return { lo, hi, n }
  }

  /** The prompt's local hashes as u64 values (for tests and tools). */
  hashesU64(req: TracePrompt): BigUint64Array {
    const h = this.hashes(req)
    return joinHalves(h.lo, h.hi, h.n)
  }
}
