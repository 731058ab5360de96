// A request's "the client went away" signal, which the scheduler's queue and the proxy's
// exchanges listen to (proxy.ts).
import type { CancelSignal } from '../../scheduler/scheduler.js'

/**
 * Fires when the client goes away. AbortController would do, but each one builds an EventTarget
 * (a Map, listener records, an Event on abort) for the one listener a request ever has: the
 * queue's, while it waits. (Its upstream exchange hears it from the run directly.)
 */
export class ClientGone implements CancelSignal {
  aborted = false
  private listeners: (() => void)[] | null = null

  addEventListener(_type: 'abort', listener: () => void): void {
    ;(this.listeners ??= []).push(listener)
  }

  removeEventListener(_type: 'abort', listener: () => void): void {
    const ls = this.listeners
    const i = ls === null ? -1 : ls.indexOf(listener)
    if (i >= 0) (ls as (() => void)[]).splice(i, 1)
  }

  /**
   * Runs every listener even when one throws: each holds a booking or an upstream request, and a
   * listener skipped would leave its booking held until the router restarts. The errors are
   * thrown together once all have run.
   */
  abort(): void {
    if (this.aborted) return
    this.aborted = true
    const ls = this.listeners
    this.listeners = null
    if (ls === null) return
    let failed: unknown[] | undefined
    for (const l of ls) {
      try {
        l()
      } catch (err) {
        ;(failed ??= []).push(err)
      }
    }
    if (failed !== undefined) throw failed.length === 1 ? failed[0] : new AggregateError(failed, 'cleaning up after a client disconnect failed')
  }
}
