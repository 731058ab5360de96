// Server-sent events as the proxy relays them: where an event ends, whether a chunk closes the
// stream, and nvext.worker_id added to the first event. Every streamed read goes through these,
// so they compare bytes and allocate nothing on the common path.
import { serializeJson } from '../../codec/json.js'
import type { WorkerRankRef } from '../../scheduler/scheduler.js'

/** Index just past the blank line that ends the first SSE event (LF or CRLF lines); -1 if none yet. */
export function eventEnd(text: string | Buffer): number {
  const lf = text.indexOf('\n\n')
  const crlf = text.indexOf('\r\n\r\n')
  if (crlf >= 0 && (lf < 0 || crlf < lf)) return crlf + 4
  return lf < 0 ? -1 : lf + 2
}

/**
 * Whether a chunk ends where an SSE event does (a blank line, LF or CRLF). Every streamed read
 * takes this test, and nearly all pass it: a few byte compares, nothing allocated.
 */
export function endsEvent(b: Uint8Array): boolean {
  const n = b.length
  if (n < 2 || b[n - 1] !== 10) return false
  const c = b[n - 2]
  return c === 10 || (c === 13 && n >= 4 && b[n - 3] === 10 && b[n - 4] === 13)
}

/** Index just past the blank line that ends the last SSE event (LF or CRLF lines); 0 if none. */
export function lastEventEnd(b: Buffer): number {
  const lf = b.lastIndexOf('\n\n')
  const crlf = b.lastIndexOf('\r\n\r\n')
  return Math.max(lf < 0 ? 0 : lf + 2, crlf < 0 ? 0 : crlf + 4)
}

const DONE = Buffer.from('[DONE]', 'latin1')

/**
 * Whether a chunk ends with the `[DONE]` event that closes an OpenAI-style stream (`data: [DONE]`
 * and its blank line, LF or CRLF). Inside an event's JSON a line end is always escaped, so a raw
 * `[DONE]` before the blank line can only be the event itself.
 */
export function endsWithDone(b: Uint8Array): boolean {
  let e = b.length
  for (let lines = 0; lines < 2; lines++) {
    if (e === 0 || b[e - 1] !== 10) return false
    e--
    if (e > 0 && b[e - 1] === 13) e--
  }
  if (e < DONE.length) return false
  for (let i = 0; i < DONE.length; i++) if (b[e - DONE.length + i] !== DONE[i]) return false
  return true
}

/** nvext.worker_id (the same worker does prefill and decode): built when a response needs it. */
export function workerIdObject(r: WorkerRankRef): object {
  const s = r.workerId.toString()
  return {
    prefill_worker_id: r.workerId,
    prefill_worker_id_str: s,
    prefill_dp_rank: r.dpRank,
    decode_worker_id: r.workerId,
    decode_worker_id_str: s,
    decode_dp_rank: r.dpRank,
  }
}

/**
 * The first SSE event with nvext.worker_id added. The common event carries no nvext of its own:
 * the field is spliced in before the object's closing brace, without parsing and re-serializing
 * the event (serializeJson's replacer made that the costliest step of a stream's first token).
 * An event with an nvext already, over several lines, or with \u escapes (which could spell
 * one) is parsed and merged instead; one that is not a JSON object passes unchanged.
 */
export function injectWorkerId(event: string, rank: WorkerRankRef): string {
  const at = event.indexOf('data:')
  if (at < 0) return event
  const json = event.slice(at + 5).trim()
  if (json.charCodeAt(0) !== 123 /* { */) return event
  const end = json.length - 1
  // one line, no nvext of its own, no escapes that could spell one
  if (end > 0 && json.charCodeAt(end) === 125 /* } */ && json.indexOf('\n') < 0 && !json.includes('nvext') && !json.includes('\\u')) {
    const comma = json.slice(1, end).trim().length === 0 ? '' : ','
    const w = rank.workerId.toString()
    const id =
      `{"prefill_worker_id":${w},"prefill_worker_id_str":"${w}","prefill_dp_rank":${rank.dpRank},"decode_worker_id":${w},` +
      `"decode_worker_id_str":"${w}","decode_dp_rank":${rank.dpRank}}`
    return `${event.slice(0, at)}data: ${json.slice(0, end)}${comma}"nvext":{"worker_id":${id}}}\n\n`
  }
  try {
    const obj = JSON.parse(json) as Record<string, unknown>
    obj.nvext = { ...(typeof obj.nvext === 'object' && obj.nvext !== null ? obj.nvext : {}), worker_id: workerIdObject(rank) }
    return `${event.slice(0, at)}data: ${serializeJson(obj)}\n\n`
  } catch {
    return event
  }
}
