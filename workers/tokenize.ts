// Piscina task: tokenizes text with a Hugging Face tokenizer.json off the main event loop.
// The tokenizer is loaded once per thread, on its first task, from workerData.path (so a bad
// file rejects that task instead of killing the thread); nothing is downloaded.
import { readFileSync, existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { workerData } from 'node:worker_threads'
import { Tokenizer } from '@huggingface/tokenizers'

let tokenizer: Tokenizer | undefined

function load(): Tokenizer {
  const path = (workerData as { path: string }).path
  const json = JSON.parse(readFileSync(path, 'utf8')) as object
  const configPath = join(dirname(path), 'tokenizer_config.json')
  const config = existsSync(configPath) ? (JSON.parse(readFileSync(configPath, 'utf8')) as object) : {}
  return new Tokenizer(json, config)
}

export default function tokenize(text: string): Uint32Array {
  tokenizer ??= load()
  return Uint32Array.from(tokenizer.encode(text, { add_special_tokens: false }).ids)
}
