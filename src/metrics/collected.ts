// Series computed at scrape time: a prom-client counter or gauge that empties itself and is
// filled again from its source on every collect, so it shows the source's own counts and no
// series at all while the source is not configured.
import { Counter, Gauge } from 'prom-client'
import type { Registry } from 'prom-client'

/** Rows of (label value, value), or null while the source is absent (then no series). */
export type LabelTable = Iterable<readonly [string, number]> | null

/** A counter with one label, one series per row of `table()`, in its order. */
export function labelledCounter(r: Registry, name: string, help: string, label: string, table: () => LabelTable): void {
  collectedCounter(r, name, help, [label], (c) => {
    const rows = table()
    if (rows !== null) for (const [value, n] of rows) c.inc({ [label]: value }, n)
  })
}

/** A metric's options that reset it and let `fill` set it afresh at every scrape. */
function refilled<M extends Counter | Gauge>(r: Registry, name: string, help: string, labelNames: readonly string[], fill: (m: M) => void) {
  return {
    name,
    help,
    labelNames,
    registers: [r],
    collect(this: M) {
      this.reset()
      fill(this)
    },
  }
}

/** A counter that `fill` sets afresh at every scrape (after a reset). */
export function collectedCounter(r: Registry, name: string, help: string, labelNames: readonly string[], fill: (c: Counter) => void): void {
  new Counter(refilled(r, name, help, labelNames, fill))
}

/** A gauge that `fill` sets afresh at every scrape (after a reset). */
export function collectedGauge(r: Registry, name: string, help: string, labelNames: readonly string[], fill: (g: Gauge) => void): void {
  new Gauge(refilled(r, name, help, labelNames, fill))
}

/** A gauge without labels holding `value()`, absent while it is null. */
export function valueGauge(r: Registry, name: string, help: string, value: () => number | null): void {
  collectedGauge(r, name, help, [], (g) => {
    const v = value()
    if (v !== null) g.set(v)
  })
}
