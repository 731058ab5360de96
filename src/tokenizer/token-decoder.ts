// Token ids back to text, for the answers the router builds itself from a worker's token stream
// (src/frontend/). Decoding runs on the main thread: one call decodes the few tokens of a stream
// step, far less work than a round trip to a tokenizer thread would be. Two choices, matching
// --tokenizer: `bytes` (a token is one UTF-8 byte) or a Hugging Face tokenizer.json, read again
// here with @huggingface/tokenizers, the library the tokenizer threads encode with. The model's
// end-of-sequence ids come from the configuration files beside tokenizer.json, where vLLM and
// Dynamo read them.
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { Tokenizer } from '@huggingface/tokenizers'
import { KvrError } from '../errors.js'
import { tokenizerConfig } from './chat-template.js'

export interface TokenDecoder {
  /**
   * The text of a run of tokens. A character whose bytes are not all in the run comes out as
   * U+FFFD, which is how the incremental detokenizer (src/frontend/detokenizer.ts) knows to wait.
   */
  decode(ids: readonly number[], skipSpecialTokens: boolean): string
  /** The model's end-of-sequence token ids; empty when unknown. */
  readonly eosTokenIds: readonly number[]
}

/** `--tokenizer bytes`: token ids 0–255 are UTF-8 bytes; any other id has no text. */
export class BytesDecoder implements TokenDecoder {
  readonly eosTokenIds: readonly number[] = []
  decode(ids: readonly number[]): string {
    const bytes = Buffer.allocUnsafe(ids.length)
    let n = 0
    for (const id of ids) if (id >= 0 && id < 256) bytes[n++] = id
    return bytes.toString('utf8', 0, n)
  }
}

export class HfDecoder implements TokenDecoder {
  private constructor(
    private readonly tokenizer: Tokenizer,
    readonly eosTokenIds: readonly number[],
  ) {}

  /** The decoder of the tokenizer.json at `path`; a file that does not load is a KVR_ERR_INVALID_OPTION. */
  static load(path: string): HfDecoder {
    let tokenizer: Tokenizer
    try {
      tokenizer = new Tokenizer(JSON.parse(readFileSync(path, 'utf8')) as object, tokenizerConfig(path))
    } catch (err) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: ${path} could not be loaded for decoding (${(err as Error).message})`)
    }
    return new HfDecoder(tokenizer, eosTokenIds(path, tokenizer))
  }

  decode(ids: readonly number[], skipSpecialTokens: boolean): string {
    if (ids.length === 0) return ''
    // no clean-up of spaces before punctuation: engines and Dynamo's decoder do none either
    return this.tokenizer.decode(ids as number[], { skip_special_tokens: skipSpecialTokens, clean_up_tokenization_spaces: false })
  }
}

/** The decoder for a --tokenizer value: null (no tokenizer), `bytes`, or a tokenizer.json path. */
export function tokenDecoderFor(spec: string | null): TokenDecoder | null {
  if (spec === null) return null
  if (spec === 'bytes') return new BytesDecoder()
  if (!existsSync(spec)) throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: no such file ${spec}`)
  return HfDecoder.load(spec)
}

function readJson(path: string): Record<string, unknown> | null {
  if (!existsSync(path)) return null
  try {
    const v: unknown = JSON.parse(readFileSync(path, 'utf8'))
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null
  } catch {
    return null
  }
}

function idList(v: unknown): number[] {
  const list = Array.isArray(v) ? v : [v]
  return list.filter((x): x is number => typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= 0xffffffff)
}

/**
 * End-of-sequence ids: `eos_token_id` of generation_config.json, else of config.json (a number or
 * a list, as models write it), else the id of tokenizer_config.json's `eos_token`.
 */
function eosTokenIds(path: string, tokenizer: Tokenizer): number[] {
  const dir = dirname(path)
  for (const file of ['generation_config.json', 'config.json']) {
    const ids = idList(readJson(join(dir, file))?.eos_token_id)
    if (ids.length > 0) return ids
  }
  const eos = tokenizerConfig(path).eos_token
  const text = typeof eos === 'string' ? eos : (eos as { content?: unknown } | null | undefined)?.content
  if (typeof text !== 'string') return []
  const id = tokenizer.token_to_id(text)
  return id === undefined ? [] : [id]
}
