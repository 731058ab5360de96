// The log probabilities a worker sends with its tokens (`log_probs`, `top_logprobs`, the token
// texts in `tokens`) in the two OpenAI shapes, as Dynamo's delta generators build them
// (lib/llm/src/protocols/openai/{chat_completions,completions}/delta.rs, create_logprobs):
//   chat         {"content":[{"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}]}
//                the chosen token is added to its alternatives when the worker left it out
//   completions  {"tokens":[…],"token_logprobs":[…],"top_logprobs":[{token: logprob}],"text_offset":[…]}
// A token the worker sent no text for is decoded alone (special tokens kept: the answer shows
// what the model chose).
import type { TokenDecoder } from '../tokenizer/token-decoder.js'
import type { EngineOutput } from './engine-output.js'

export interface LogprobEntry {
  token: string
  logprob: number
  top: { token: string; logprob: number }[]
}

function tokenText(id: number, text: string | null | undefined, decoder: TokenDecoder | null): string {
  if (typeof text === 'string') return text
  return decoder === null ? '' : decoder.decode([id], false)
}

/** The entries of the first `count` tokens of an output; none when the worker sent no log_probs. */
export function logprobEntries(out: EngineOutput, count: number, decoder: TokenDecoder | null): LogprobEntry[] {
  const lps = out.logProbs
  if (lps === null) return []
  const n = Math.min(count, lps.length, out.tokenIds.length)
  const entries: LogprobEntry[] = []
  for (let i = 0; i < n; i++) {
    const id = out.tokenIds[i] as number
    const top = (out.topLogprobs?.[i] ?? []).map((e) => ({ token: tokenText(e.tokenId, e.token, decoder), logprob: e.logprob }))
    entries.push({ token: tokenText(id, out.tokens?.[i], decoder), logprob: lps[i] as number, top })
  }
  return entries
}

const bytesOf = (s: string): number[] => [...Buffer.from(s, 'utf8')]

/** A chat choice's `logprobs`. */
export function chatLogprobs(entries: readonly LogprobEntry[]): object {
  return {
    content: entries.map((e) => {
      const top = e.top.map((x) => ({ token: x.token, logprob: x.logprob, bytes: bytesOf(x.token) }))
      if (top.length > 0 && !e.top.some((x) => x.token === e.token)) top.push({ token: e.token, logprob: e.logprob, bytes: bytesOf(e.token) })
      return { token: e.token, logprob: e.logprob, bytes: bytesOf(e.token), top_logprobs: top }
    }),
  }
}

/** A completion choice's `logprobs`; `offset` is where the first entry's text starts in the answer. */
export function completionLogprobs(entries: readonly LogprobEntry[], offset: number): object {
  const textOffset: number[] = []
  let at = offset
  for (const e of entries) {
    textOffset.push(at)
    at += e.token.length
  }
  return {
    tokens: entries.map((e) => e.token),
    token_logprobs: entries.map((e) => e.logprob),
    top_logprobs: entries.map((e) => Object.fromEntries(e.top.map((x) => [x.token, x.logprob]))),
    text_offset: textOffset,
  }
}
