// The model's chat template, found beside its tokenizer.json where vLLM and SGLang find it, and
// the prompt text it makes of a chat request. Engines tokenize a chat request as the template
// renders it; a router that tokenized the messages any other way would hash tokens no engine
// holds, and chat prompts would never match a cached prefix. Used by the tokenizer threads (to
// render) and the main thread (to check the template at start-up).
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { Template } from '@huggingface/jinja'

/** What a chat request gives the template besides its messages (vLLM's request fields of the same names). */
export interface ChatRequest {
  messages: unknown[]
  addGenerationPrompt: boolean
  /** `chat_template_kwargs`: extra variables, e.g. `enable_thinking`. */
  kwargs: Record<string, unknown> | null
  tools: unknown[] | null
}

/** A tokenizer thread's task: text, or a chat request for the model's template to render first. */

/** The start of the message of a task the chat template refused: the client's error, not the router's. */
/** One tokenizer-thread task: a text to encode, or a chat to render with the model's template and encode. */
export type TokenizeTask = { text: string; addSpecialTokens: boolean } | { chat: ChatRequest; addSpecialTokens: boolean }

export const TEMPLATE_REFUSED = 'chat template: '

export interface ChatTemplateSource {
  text: string
  /** The file it came from, for the start-up log and error messages. */
  from: string
  bosToken: string
  eosToken: string
}

/** A special token as tokenizer_config.json writes it: a string, or an object with its text in `content`. */
function tokenText(v: unknown): string {
  if (typeof v === 'string') return v
  if (v !== null && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content
  return ''
}

/** tokenizer_config.json beside a tokenizer.json, parsed; {} when there is none. */
export function tokenizerConfig(tokenizerPath: string): Record<string, unknown> {
  const configPath = join(dirname(tokenizerPath), 'tokenizer_config.json')
  return existsSync(configPath) ? (JSON.parse(readFileSync(configPath, 'utf8')) as Record<string, unknown>) : {}
}

/**
 * The chat template of the model whose tokenizer.json is at `tokenizerPath`: `chat_template.jinja`
 * beside it (where recent Hugging Face releases keep it), else `chat_template` in
 * tokenizer_config.json (a string, or a list of named templates, of which `default` is the one a
 * chat request gets). Null when the model has none.
 */
export function findChatTemplate(tokenizerPath: string, config: Record<string, unknown> = tokenizerConfig(tokenizerPath)): ChatTemplateSource | null {
  const dir = dirname(tokenizerPath)
  const configPath = join(dir, 'tokenizer_config.json')
  const specials = { bosToken: tokenText(config.bos_token), eosToken: tokenText(config.eos_token) }
  const jinjaPath = join(dir, 'chat_template.jinja')
  if (existsSync(jinjaPath)) return { text: readFileSync(jinjaPath, 'utf8'), from: jinjaPath, ...specials }
  const t = config.chat_template
  if (typeof t === 'string') return { text: t, from: configPath, ...specials }
  if (Array.isArray(t)) {
    const named = t.find((x) => (x as { name?: unknown }).name === 'default') as { template?: unknown } | undefined
    if (typeof named?.template === 'string') return { text: named.template, from: `${configPath} (default)`, ...specials }
  }
  return null
}

/** A compiled template; compiling throws on a template that does not parse. */
export class ChatTemplate {
  private readonly template: Template

  constructor(readonly source: ChatTemplateSource) {
    this.template = new Template(source.text)
  }

  /** The prompt text; throws what the template raises (roles out of order, say) as an Error. */
  render(r: ChatRequest): string {
    return this.template.render({
      ...r.kwargs,
      messages: r.messages,
      add_generation_prompt: r.addGenerationPrompt,
      bos_token: this.source.bosToken,
      eos_token: this.source.eosToken,
      ...(r.tools === null ? {} : { tools: r.tools }),
    })
  }
}
