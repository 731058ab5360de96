// Text prompts to token ids. Three choices (--tokenizer): none (text prompts are refused with a
// clear 400 in kv mode), `bytes` (the UTF-8 bytes are the tokens: demos and simulated engines)
// or a Hugging Face tokenizer.json, run on piscina threads so tokenizing never blocks the event
// loop. Chat messages become one text with a fixed template (below) that the simulated engine
// uses too, so router and engine hash the same tokens.
import { existsSync, readFileSync } from 'node:fs'
import { Piscina } from 'piscina'
import { KvrError } from './shared/errors.js'

export interface ChatMessage {
  role: string
  content: unknown
}

/** The text the router and the simulated engine tokenize for a chat request. */
export function chatPromptText(messages: readonly ChatMessage[]): string {
  let out = ''
  for (const m of messages) out += `<|${m.role}|>\n${contentText(m.content)}\n`
  return out + '<|assistant|>\n'
}

function contentText(c: unknown): string {
  if (typeof c === 'string') return c
  if (Array.isArray(c)) return c.map((p) => (p !== null && typeof p === 'object' && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : '')).join('')
  return ''
}

export interface TextTokenizer {
  readonly kind: 'bytes' | 'hf'
  encode(text: string): Promise<Uint32Array | Uint8Array>
  close(): Promise<void>
}

export class BytesTokenizer implements TextTokenizer {
  readonly kind = 'bytes' as const
  encode(text: string): Promise<Uint8Array> {
    return Promise.resolve(Buffer.from(text, 'utf8'))
  }
  close(): Promise<void> {
    return Promise.resolve()
  }
}

const taskUrl = new URL(`../workers/tokenize${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url)

export class HfTokenizer implements TextTokenizer {
  readonly kind = 'hf' as const
  private readonly pool: Piscina<string, Uint32Array>

  private constructor(path: string, threads: number) {
    // no execArgv: a worker inherits the parent's Node options by default, while one given them
    // explicitly refuses V8 flags, and the router always runs with some (src/v8-flags.ts)
    this.pool = new Piscina({ filename: taskUrl.href, workerData: { path }, maxThreads: threads, minThreads: 1 })
  }

  /** Loads and checks the tokenizer (one warm-up call), so a bad file fails at startup. */
  static async load(path: string, threads = 1): Promise<HfTokenizer> {
    if (!existsSync(path)) throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: no such file ${path}`)
    try {
      JSON.parse(readFileSync(path, 'utf8'))
    } catch (err) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: ${path} is not a JSON tokenizer file (${(err as Error).message})`)
    }
    const t = new HfTokenizer(path, threads)
    try {
      await t.encode('warm up')
    } catch (err) {
      await t.close()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: ${path} could not be loaded (${(err as Error).message})`)
    }
    return t
  }

  encode(text: string): Promise<Uint32Array> {
    return this.pool.run(text)
  }

  close(): Promise<void> {
    return this.pool.destroy()
  }
}

export async function loadTokenizer(spec: string | null, threads = 1): Promise<TextTokenizer | null> {
  if (spec === null) return null
  if (spec === 'bytes') return new BytesTokenizer()
  return HfTokenizer.load(spec, threads)
}
