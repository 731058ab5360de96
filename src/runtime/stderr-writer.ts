// The log's way out: text written to a file descriptor (stderr) without ever waiting for its
// reader. Node makes a stderr pipe non-blocking, so a write the pipe cannot take fails with
// EAGAIN; a synchronous writer would have to wait it out (sonic-boom's sync mode sleeps 100 ms a
// time, and with the reader stopped the router answers nothing), and an asynchronous one holds a
// write in flight that a process exit loses. Here each write goes out at once as far as the
// descriptor takes it; the rest waits in order, bounded, and is tried again on a short timer and
// at exit (for a bounded time). Past the bound whole writes are dropped and their lines counted.
import { writeSync } from 'node:fs'

/** How often what waits is tried again while the reader lags (ms). */
const RETRY_MS = 10

function countLines(b: Uint8Array): number {
  let n = 0
  for (let i = b.indexOf(10); i !== -1; i = b.indexOf(10, i + 1)) n++
  return n
}

export class StderrWriter {
  private readonly waiting: Buffer[] = []
  private waitingBytes = 0
  private timer: NodeJS.Timeout | null = null
  /** The reader is gone (EPIPE, a closed descriptor): nothing more is written. */
  private gone = false
  /** Lines dropped: `maxBytes` were already waiting, or the reader is gone. */
  droppedLines = 0

  constructor(
    private readonly fd: number,
    /** Bytes that may wait for a reader that lags; a write beyond them is dropped whole. */
    private readonly maxBytes: number,
  ) {}

  /** Writes `text` (whole lines) as far as the descriptor takes it now; the rest waits. */
  write(text: string): boolean {
    const b = Buffer.from(text)
    if (this.gone) {
      this.droppedLines += countLines(b)
      return false
    }
    if (this.waiting.length === 0) {
      const n = this.tryWrite(b)
      if (n === b.length) return true
      // the rest of a line begun must follow it, whatever waits already
      if (n > 0) {
        this.hold(b.subarray(n))
        return true
      }
    }
    if (this.waitingBytes + b.length > this.maxBytes) {
      this.droppedLines += countLines(b)
      return false
    }
    this.hold(b)
    return true
  }

  /** Writes what waits, retrying until it is out or `deadlineMs` (Date.now()) has passed: for exit. */
  flushSync(deadlineMs: number): void {
    const pause = new Int32Array(new SharedArrayBuffer(4))
    while (this.waiting.length > 0 && !this.gone) {
      this.drain()
      if (this.waiting.length === 0 || Date.now() >= deadlineMs) break
      Atomics.wait(pause, 0, 0, RETRY_MS)
    }
    if (this.timer !== null) clearTimeout(this.timer)
    this.timer = null
  }

  private hold(b: Buffer): void {
    this.waiting.push(b)
    this.waitingBytes += b.length
    if (this.timer === null) {
      this.timer = setTimeout(this.retry, RETRY_MS)
      // a lagging reader does not keep the process alive; exit flushes what waits
      this.timer.unref()
    }
  }

  private readonly retry = (): void => {
    this.timer = null
    this.drain()
    if (this.waiting.length > 0 && !this.gone) {
      this.timer = setTimeout(this.retry, RETRY_MS)
      this.timer.unref()
    }
  }

  /** Writes waiting buffers in order until the descriptor takes no more. */
  private drain(): void {
    while (this.waiting.length > 0) {
      const b = this.waiting[0] as Buffer
      const n = this.tryWrite(b)
      if (this.gone) return
      this.waitingBytes -= n
      if (n < b.length) {
        this.waiting[0] = b.subarray(n)
        return
      }
      this.waiting.shift()
    }
  }

  /** Bytes of `b` written; 0 when the descriptor is full, all of them when the reader is gone. */
  private tryWrite(b: Buffer): number {
    if (this.gone) return b.length
    try {
      return writeSync(this.fd, b)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EAGAIN') return 0
      this.gone = true
      // what waits, and `b` unless it is the first of those
      for (const w of this.waiting) this.droppedLines += countLines(w)
      if (this.waiting[0] !== b) this.droppedLines += countLines(b)
      this.waiting.length = 0
      this.waitingBytes = 0
      return b.length
    }
  }
}
