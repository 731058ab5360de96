// Piscina task: tokenizes text, or a chat request rendered by the model's chat template, with a
// Hugging Face tokenizer.json off the main event loop. The tokenizer and template are loaded once
// per thread, on its first task, from workerData.path (so a bad file rejects that task instead of
// killing the thread); nothing is downloaded.
import { readFileSync } from 'node:fs'
import { workerData } from 'node:worker_threads'
import { Tokenizer } from '@huggingface/tokenizers'
import { ChatTemplate, findChatTemplate, TEMPLATE_REFUSED, tokenizerConfig } from '../src/tokenizer/chat-template.js'
import type { TokenizeTask } from '../src/tokenizer/chat-template.js'

let tokenizer: Tokenizer | undefined
let template: ChatTemplate | null | undefined

function load(): Tokenizer {
  const path = (workerData as { path: string }).path
  const json = JSON.parse(readFileSync(path, 'utf8')) as object
  const config = tokenizerConfig(path)
  const source = findChatTemplate(path, config)
  template = source === null ? null : new ChatTemplate(source)
  return new Tokenizer(json, config)
}

export default function tokenize(task: TokenizeTask): Uint32Array {
  tokenizer ??= load()
  let text: string
  if ('text' in task) text = task.text
  else {
    // the main thread sends chat here only when the model has a template (HfTokenizer.encodeChat)
    if (template == null) throw new Error('no chat template')
    try {
      text = template.render(task.chat)
    } catch (err) {
      throw new Error(`${TEMPLATE_REFUSED}${(err as Error).message}`)
    }
  }
  return Uint32Array.from(tokenizer.encode(text, { add_special_tokens: task.addSpecialTokens }).ids)
}
