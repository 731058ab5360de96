// The one way every `kv-router` command refuses its flags: one line on stderr naming the flag
// and what it accepts, and exit status 2. And the value readers of every command (`serve`'s
// src/config.ts, `mocker`, `replay`), so a value one command takes is not refused by another, or
// the other way round.
import { redactSecrets } from '../runtime/redact.js'

const dying: (() => void)[] = []

/** Runs `f` before die() writes its line: the log writes out what it holds, so that line comes last. */
export function beforeDie(f: () => void): void {
  dying.push(f)
}

export function die(line: string): never {
  for (const f of dying) f()
  process.stderr.write(`kv-router: ${redactSecrets(line)}\n`)
  process.exit(2)
}

/**
 * Decimal digits with an optional "-", in [min, max]; undefined otherwise. Number() alone would
 * also take "0x10", "0b11", "1e3" and "", which no flag means.
 */
export function parseIntArg(text: string, min: number, max: number): number | undefined {
  const t = text.trim()
  if (!/^-?[0-9]+$/.test(t)) return undefined
  const v = Number(t)
  return Number.isSafeInteger(v) && v >= min && v <= max ? v : undefined
}

/** A finite decimal number (sign, digits, ".", exponent) in [min, max]; undefined otherwise. */
export function parseNumArg(text: string, min: number, max: number): number | undefined {
  const t = text.trim()
  if (t === '' || !/^[-+0-9.eE]+$/.test(t)) return undefined
  const v = Number(t)
  return Number.isFinite(v) && v >= min && v <= max ? v : undefined
}

/**
 * An http: or https: URL the WHATWG parser takes, as fetch and undici will read it: a regex
 * would let `http://h:99999` through, to fail only at the first request.
 */
export function isHttpUrl(text: string): boolean {
  // the parser drops spaces and tabs it finds, so "exa mple" would not reach it as written
  if (/\s/.test(text)) return false
  try {
    const u = new URL(text)
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== ''
  } catch {
    return false
  }
}
