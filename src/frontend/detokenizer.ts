// A worker's output tokens to text, one stream step at a time. Decoding each token alone is
// wrong twice over: a character split across byte tokens would come out broken, and tokenizers
// whose tokens carry a leading-space marker (SentencePiece's ▁) decode a lone token without its
// space. So the decoder keeps a short window: the text of tokens [prefix, end) minus the text
// of [prefix, read) is what the new tokens add, and it is released only once it does not end
// in U+FFFD (an incomplete character). The window starts on the prompt's last tokens, so the
// first output token decodes in context too.
import type { TokenDecoder } from '../tokenizer/token-decoder.js'

/** Prompt tokens the window starts with: enough for any tokenizer's context rules. */
const PROMPT_CONTEXT = 5
/**
 * Tokens held without releasing text before they are released anyway: a model can emit bytes
 * that never form a character, or a run of special tokens that decode to nothing, and a window
 * that only grew would cost more to decode at every token.
 */
const MAX_HELD = 16
const REPLACEMENT = '\uFFFD'

export class IncrementalDetokenizer {
  private ids: number[]
  private prefix = 0
  private read: number

  constructor(
    private readonly decoder: TokenDecoder,
    private readonly skipSpecialTokens: boolean,
    promptTokens: ArrayLike<number> = [],
  ) {
    const from = Math.max(0, promptTokens.length - PROMPT_CONTEXT)
    this.ids = Array.prototype.slice.call(promptTokens, from) as number[]
    this.read = this.ids.length
  }

  /** The text one more token adds; '' while it ends in the middle of a character. */
  push(id: number): string {
    this.ids.push(id)
    const before = this.decoder.decode(this.ids.slice(this.prefix, this.read), this.skipSpecialTokens)
    const now = this.decoder.decode(this.ids.slice(this.prefix), this.skipSpecialTokens)
    const grew = now.length > before.length
    // held: nothing new yet (a skipped special token), or a character not yet whole
    if (this.ids.length - this.read < MAX_HELD && (!grew || now.endsWith(REPLACEMENT))) return ''
    this.advance()
    return grew ? now.slice(before.length) : ''
  }

  /** Whatever the held tokens decode to, incomplete characters included: for the end of a stream. */
  flush(): string {
    if (this.read === this.ids.length) return ''
    const before = this.decoder.decode(this.ids.slice(this.prefix, this.read), this.skipSpecialTokens)
    const now = this.decoder.decode(this.ids.slice(this.prefix), this.skipSpecialTokens)
    this.advance()
    return now.length > before.length ? now.slice(before.length) : ''
  }

  private advance(): void {
    this.prefix = this.read
    this.read = this.ids.length
    // only [prefix, end) is ever decoded again: drop the rest so a long answer keeps a short array
    if (this.prefix > 64) {
      this.ids = this.ids.slice(this.prefix)
      this.read -= this.prefix
      this.prefix = 0
    }
  }
}
