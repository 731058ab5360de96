// Log output in tests: the JSON lines of a process's stderr, and a destination stream that keeps
// what a logger writes.
import { createLogger, configureLog } from '../../src/runtime/log.js'
import type { Logger, LogLevel } from '../../src/runtime/log.js'

export type LogRecord = Record<string, unknown> & { level: string; msg: string }

/** Every line of `text` that is a JSON object; other lines (a fatal line, the listening line) are skipped. */
export function logRecords(text: string): LogRecord[] {
  const out: LogRecord[] = []
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue
    try {
      out.push(JSON.parse(line) as LogRecord)
    } catch {
      // a line cut by a kill: not a record
    }
  }
  return out
}

/** A destination that keeps its lines. */
export class Capture {
  text = ''
  write(line: string): boolean {
    this.text += line
    return true
  }
  get records(): LogRecord[] {
    return logRecords(this.text)
  }
  clear(): void {
    this.text = ''
  }
}

/** A logger of its own writing JSON into a Capture. */
export function captured(level: LogLevel = 'info'): { logger: Logger; capture: Capture } {
  const capture = new Capture()
  return { logger: createLogger({ level, format: 'json', destination: capture }), capture }
}

/** Points the process's logger (and its limiter) at a Capture for this test file. */
export function captureProcessLog(level: LogLevel = 'info', periodMs = 10_000): Capture {
  const capture = new Capture()
  configureLog({ level, format: 'json', destination: capture, periodMs })
  return capture
}

/** The messages of the warn lines a capture holds, of one code when given. */
export function warnings(capture: Capture, code?: string): string[] {
  return capture.records.filter((x) => x.level === 'warn' && (code === undefined || x.code === code)).map((x) => x.msg)
}
