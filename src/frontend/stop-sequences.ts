// The request's stop strings, applied to the text the router decodes itself (a worker that sends
// only token ids cannot apply them: it has no text). Text that could be the start of a stop
// string is held back until the next tokens show whether it is one; a match ends the answer,
// without the stop string unless include_stop_str_in_output asks for it (Dynamo's decoder in
// lib/llm/src/backend.rs does the same).

export interface StopStep {
  /** Text to release now. */
  text: string
  /** The stop string that ended the answer; null while none has. */
  matched: string | null
}

export class StopSequences {
  private held = ''
  private readonly longest: number

  constructor(
    private readonly stops: readonly string[],
    private readonly includeStop: boolean,
  ) {
    this.longest = stops.reduce((m, s) => Math.max(m, s.length), 0)
  }

  get active(): boolean {
    return this.longest > 0
  }

  /** Feeds newly decoded text; after a match, nothing more should be fed. */
  feed(text: string): StopStep {
    if (this.longest === 0) return { text, matched: null }
    const buf = this.held + text
    let at = -1
    let matched: string | null = null
    for (const s of this.stops) {
      if (s.length === 0) continue
      const i = buf.indexOf(s)
      // the earliest match wins; at one position, the longer stop string
      if (i >= 0 && (at < 0 || i < at || (i === at && s.length > (matched as string).length))) {
        at = i
        matched = s
      }
    }
    if (matched !== null) {
      this.held = ''
      return { text: buf.slice(0, this.includeStop ? at + matched.length : at), matched }
    }
    const keep = this.partialSuffix(buf)
    this.held = buf.slice(buf.length - keep)
    return { text: buf.slice(0, buf.length - keep), matched: null }
  }

  /** The held text, released as it is: for an answer that ended without a match. */
  flush(): string {
    const h = this.held
    this.held = ''
    return h
  }

  /** Length of the longest end of `buf` that some stop string starts with. */
  private partialSuffix(buf: string): number {
    for (let k = Math.min(this.longest - 1, buf.length); k > 0; k--) {
      const tail = buf.slice(buf.length - k)
      for (const s of this.stops) if (s.length > k && s.startsWith(tail)) return k
    }
    return 0
  }
}
