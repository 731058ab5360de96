// Text prompts to token ids. Three choices (--tokenizer): none (text prompts are refused with a
// clear 400 in kv mode), `bytes` (the UTF-8 bytes are the tokens: demos and simulated engines)
// or a Hugging Face tokenizer.json, run on piscina threads so tokenizing never blocks the event
// loop. A chat request is tokenized as the engine tokenizes it: rendered by the model's chat
// template (src/tokenizer/chat-template.ts) when the tokenizer's folder has one, else by the fixed
// template below, which the simulated engine uses too.
import { existsSync, readFileSync } from 'node:fs'
import { Piscina } from 'piscina'
import { KvrError } from '../errors.js'
import { ChatTemplate, findChatTemplate, TEMPLATE_REFUSED } from './chat-template.js'
import type { ChatRequest, ChatTemplateSource } from './chat-template.js'
import { TOKENIZE_ENTRY } from '../thread/protocol.js'
import type { TokenizeTask } from './chat-template.js'

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
  if (Array.isArray(c))
    return c
      .map((p) => (p !== null && typeof p === 'object' && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : ''))
      .join('')
  return ''
}

export interface TextTokenizer {
  readonly kind: 'bytes' | 'hf'
  /** Where the model's chat template came from; null when chat uses the fixed template. */
  readonly chatTemplate: string | null
  /**
   * A prompt's tokens. `addSpecialTokens` is what vLLM and SGLang do by default for a completion
   * (true: a BOS where the tokenizer adds one) and for a rendered chat (false: the template
   * writes its own).
   */
  encode(text: string, addSpecialTokens: boolean): Promise<Uint32Array | Uint8Array>
  /** A chat request's tokens; a template that refuses the messages is a KVR_ERR_INVALID_REQUEST. */
  encodeChat(chat: ChatRequest, addSpecialTokens: boolean): Promise<Uint32Array | Uint8Array>
  close(): Promise<void>
}

export class BytesTokenizer implements TextTokenizer {
  readonly kind = 'bytes' as const
  readonly chatTemplate = null
  encode(text: string): Promise<Uint8Array> {
    return Promise.resolve(Buffer.from(text, 'utf8'))
  }
  encodeChat(chat: ChatRequest): Promise<Uint8Array> {
    return this.encode(chatPromptText(chat.messages as ChatMessage[]))
  }
  close(): Promise<void> {
    return Promise.resolve()
  }
}

export class HfTokenizer implements TextTokenizer {
  readonly kind = 'hf' as const
  private readonly pool: Piscina<TokenizeTask, Uint32Array>

  private constructor(
    path: string,
    threads: number,
    readonly chatTemplate: string | null,
  ) {
    // no execArgv: a worker inherits the parent's Node options by default, while one given them
    // explicitly refuses V8 flags, and the router always runs with some (src/runtime/v8-flags.ts)
    this.pool = new Piscina({ filename: TOKENIZE_ENTRY.href, workerData: { path }, maxThreads: threads, minThreads: 1 })
  }

  /** Loads and checks the tokenizer (one warm-up call), so a bad file fails at startup. */
  static async load(path: string, threads = 1): Promise<HfTokenizer> {
    if (!existsSync(path)) throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: no such file ${path}`)
    try {
      JSON.parse(readFileSync(path, 'utf8'))
    } catch (err) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: ${path} is not a JSON tokenizer file (${(err as Error).message})`)
    }
    // checked here, once, so that a template that does not parse stops the start rather than every chat request
    let source: ChatTemplateSource | null
    try {
      source = findChatTemplate(path)
      if (source !== null) new ChatTemplate(source)
    } catch (err) {
      throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: the chat template beside ${path} could not be read (${(err as Error).message})`)
    }
    const t = new HfTokenizer(path, threads, source?.from ?? null)
    try {
      await t.encode('warm up', true)
    } catch (err) {
      await t.close()
      throw new KvrError('KVR_ERR_INVALID_OPTION', `--tokenizer: ${path} could not be loaded (${(err as Error).message})`)
    }
    return t
  }

  encode(text: string, addSpecialTokens: boolean): Promise<Uint32Array> {
    return this.pool.run({ text, addSpecialTokens })
  }

  async encodeChat(chat: ChatRequest, addSpecialTokens: boolean): Promise<Uint32Array> {
    if (this.chatTemplate === null) return this.encode(chatPromptText(chat.messages as ChatMessage[]), addSpecialTokens)
    try {
      return await this.pool.run({ chat, addSpecialTokens })
    } catch (err) {
      const m = (err as Error).message
      if (m.startsWith(TEMPLATE_REFUSED))
        throw new KvrError('KVR_ERR_INVALID_REQUEST', `the model's chat template refused the messages: ${m.slice(TEMPLATE_REFUSED.length)}`)
      throw err
    }
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
