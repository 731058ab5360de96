// A Prometheus histogram of one fixed label set whose observe() allocates nothing.
//
// prom-client's Histogram builds a label object, a closure and a hash string on every observe;
// the proxy observes once per streamed chunk (inter-token latency) and the router six times per
// request, which under 200 open streams is ~6 KB of garbage per request and a steady share of
// the young-generation scavenges behind the proxy's tail latency. This keeps plain counters and
// hands prom-client's registry the same exposition shape (name_bucket{…,le}, _sum, _count) at
// scrape time, so dashboards see no difference (series exist, at zero, before the first
// observation, which prom-client omits).
import type { Registry } from 'prom-client'

export interface HistogramValue {
  labels: Record<string, string | number>
  value: number
  metricName: string
}

export class BoundHistogram {
  readonly type = 'histogram'
  readonly aggregator = 'sum'
  private readonly counts: Float64Array
  private sum = 0
  private count = 0

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly labels: Readonly<Record<string, string>>,
    private readonly bounds: readonly number[],
    registry: Registry,
  ) {
    for (let i = 1; i < bounds.length; i++) if (!((bounds[i] as number) > (bounds[i - 1] as number))) throw new Error(`${name}: bucket bounds must increase`)
    this.counts = new Float64Array(bounds.length + 1)
    registry.registerMetric(this as unknown as Parameters<Registry['registerMetric']>[0])
  }

  observe(v: number): void {
    // NaN would poison the sum; it is counted in +Inf like any value above the last bound
    const b = this.bounds
    let i = 0
    while (i < b.length && !(v <= (b[i] as number))) i++
    this.counts[i] = (this.counts[i] as number) + 1
    if (v === v) this.sum += v
    this.count++
  }

  get(): { name: string; help: string; type: string; aggregator: string; values: HistogramValue[] } {
    const values: HistogramValue[] = []
    let acc = 0
    for (let i = 0; i <= this.bounds.length; i++) {
      acc += this.counts[i] as number
      values.push({
        labels: { le: i < this.bounds.length ? (this.bounds[i] as number) : '+Inf', ...this.labels },
        value: acc,
        metricName: `${this.name}_bucket`,
      })
    }
    values.push({ labels: { ...this.labels }, value: this.sum, metricName: `${this.name}_sum` })
    values.push({ labels: { ...this.labels }, value: this.count, metricName: `${this.name}_count` })
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values }
  }

  reset(): void {
    this.counts.fill(0)
    this.sum = 0
    this.count = 0
  }
}
