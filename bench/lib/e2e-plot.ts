// The end-to-end benchmark's figure, as a hand-written SVG (no plotting dependency): on the left
// the TTFT distribution of every router mode as a CDF on a log-ms axis (queueing shows as a
// long right tail, so a CDF says more than three percentiles), on the right the achieved prefix
// hit rate per mode as bars, with the infinite-cache bound as a dashed line.

export interface PlotSeries {
  mode: string
  /** TTFT samples, ms (any order); empty when every request failed. */
  ttftMs: ArrayLike<number>
  /** Achieved hit rate in [0, 1]; null when unknown. */
  hitRate: number | null
  /** Shown after the mode in the legend (e.g. its percentiles). */
  note?: string
}

export interface PlotInput {
  title: string
  subtitle?: string
  series: readonly PlotSeries[]
  /** The infinite-cache hit-rate bound in [0, 1]; null to omit the line. */
  bound: number | null
  /** Axis label of the TTFT panel (e.g. that times are simulated). */
  ttftLabel?: string
}

const COLORS: Record<string, string> = {
  kv: '#1b9e77',
  'kv-static': '#1f78b4',
  'kv-tuned': '#0b5d1e',
  'round-robin': '#d95f02',
  random: '#7570b3',
  'least-loaded': '#e7298a',
}
const EXTRA = ['#66a61e', '#e6ab02', '#a6761d', '#666666']

export function modeColor(mode: string, i: number): string {
  return COLORS[mode] ?? (EXTRA[i % EXTRA.length] as string)
}

export function escapeXml(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;')
}

const W = 1100
const LEGEND_Y = 484
const CDF = { x0: 80, x1: 640, y0: 420, y1: 90 }
const BAR = { x0: 730, x1: 1070, y0: 420, y1: 90 }
const CDF_POINTS = 300

const r1 = (v: number): string => (Math.round(v * 10) / 10).toString()

function text(x: number, y: number, s: string, attrs = ''): string {
  return `<text x="${r1(x)}" y="${r1(y)}"${attrs === '' ? '' : ` ${attrs}`}>${escapeXml(s)}</text>`
}

function msLabel(v: number): string {
  if (v >= 1000) return `${v / 1000} s`
  return `${v} ms`
}

export function renderE2eSvg(input: PlotInput): string {
  const H = LEGEND_Y + Math.ceil(input.series.length / 2) * 18 + 6
  const out: string[] = []
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="12">`,
  )
  out.push(`<title>${escapeXml(input.title)}</title>`)
  out.push(`<rect x="0" y="0" width="${W}" height="${H}" fill="white"/>`)
  out.push(text(W / 2, 28, input.title, 'text-anchor="middle" font-size="16" font-weight="bold"'))
  if (input.subtitle !== undefined) out.push(text(W / 2, 50, input.subtitle, 'text-anchor="middle" font-size="12" fill="#444"'))

  // --- left: TTFT CDF on a log axis
  const sorted = input.series.map((s) =>
    Float64Array.from(s.ttftMs)
      .filter((v) => Number.isFinite(v) && v > 0)
      .sort(),
  )
  let lo = Infinity
  let hi = -Infinity
  for (const s of sorted) {
    if (s.length === 0) continue
    lo = Math.min(lo, s[0] as number)
    hi = Math.max(hi, s[s.length - 1] as number)
  }
  if (!Number.isFinite(lo)) {
    lo = 1
    hi = 1000
  }
  const d0 = Math.floor(Math.log10(lo))
  const d1 = Math.max(d0 + 1, Math.ceil(Math.log10(hi)))
  const xOf = (v: number): number => CDF.x0 + ((Math.log10(v) - d0) / (d1 - d0)) * (CDF.x1 - CDF.x0)
  const yOf = (f: number): number => CDF.y0 - f * (CDF.y0 - CDF.y1)
  out.push(`<g class="ttft-cdf">`)
  out.push(
    text((CDF.x0 + CDF.x1) / 2, CDF.y1 - 14, 'Time to first token: cumulative share of requests', 'text-anchor="middle" font-size="13" font-weight="bold"'),
  )
  for (let d = d0; d <= d1; d++) {
    const v = 10 ** d
    const x = xOf(v)
    out.push(`<line x1="${r1(x)}" y1="${CDF.y0}" x2="${r1(x)}" y2="${CDF.y1}" stroke="#ccc"/>`)
    out.push(text(x, CDF.y0 + 16, msLabel(v), 'text-anchor="middle"'))
    if (d < d1) {
      for (const m of [2, 5]) {
        const xm = xOf(m * v)
        out.push(`<line x1="${r1(xm)}" y1="${CDF.y0}" x2="${r1(xm)}" y2="${CDF.y1}" stroke="#eee"/>`)
      }
    }
  }
  for (const f of [0, 0.25, 0.5, 0.75, 0.9, 1]) {
    const y = yOf(f)
    out.push(
      `<line x1="${CDF.x0}" y1="${r1(y)}" x2="${CDF.x1}" y2="${r1(y)}" stroke="${f === 0.9 ? '#999' : '#ddd'}"${f === 0.9 ? ' stroke-dasharray="4 3"' : ''}/>`,
    )
    out.push(text(CDF.x0 - 6, y + 4, f === 0.9 ? 'p90' : f.toFixed(2), 'text-anchor="end"'))
  }
  out.push(`<rect x="${CDF.x0}" y="${CDF.y1}" width="${CDF.x1 - CDF.x0}" height="${CDF.y0 - CDF.y1}" fill="none" stroke="#333"/>`)
  out.push(text((CDF.x0 + CDF.x1) / 2, CDF.y0 + 36, input.ttftLabel ?? 'TTFT (log scale)', 'text-anchor="middle"'))
  out.push(
    text(CDF.x0 - 52, (CDF.y0 + CDF.y1) / 2, 'share of requests', `text-anchor="middle" transform="rotate(-90 ${CDF.x0 - 52} ${(CDF.y0 + CDF.y1) / 2})"`),
  )
  input.series.forEach((s, i) => {
    const v = sorted[i] as Float64Array
    if (v.length === 0) return
    const n = v.length
    const pts: string[] = []
    const k = Math.min(CDF_POINTS, n)
    for (let j = 0; j < k; j++) {
      const idx = k === 1 ? n - 1 : Math.round((j * (n - 1)) / (k - 1))
      pts.push(`${r1(xOf(v[idx] as number))},${r1(yOf((idx + 1) / n))}`)
    }
    out.push(`<polyline data-mode="${escapeXml(s.mode)}" points="${pts.join(' ')}" fill="none" stroke="${modeColor(s.mode, i)}" stroke-width="2"/>`)
  })
  // legend under the panel, two entries per row: inside, it would hide some curve whatever the
  // data (CDFs of very different spreads leave no corner reliably empty)
  input.series.forEach((s, i) => {
    const x = CDF.x0 + (i % 2) * 340
    const y = LEGEND_Y + Math.floor(i / 2) * 18
    out.push(`<line x1="${x}" y1="${r1(y - 4)}" x2="${x + 24}" y2="${r1(y - 4)}" stroke="${modeColor(s.mode, i)}" stroke-width="3"/>`)
    out.push(text(x + 30, y, s.mode + (sorted[i]?.length === 0 ? ' (no data)' : '')))
    if (s.note !== undefined) out.push(text(x + 112, y, s.note, 'fill="#333"'))
  })
  out.push(`</g>`)

  // --- right: hit rate bars
  const rates = input.series.map((s) => s.hitRate ?? 0)
  const top = Math.min(1, Math.max(0.1, ...rates, input.bound ?? 0) * 1.2)
  const yR = (v: number): number => BAR.y0 - (v / top) * (BAR.y0 - BAR.y1)
  out.push(`<g class="hit-rate">`)
  out.push(text((BAR.x0 + BAR.x1) / 2, BAR.y1 - 14, 'Prefix-cache hit rate (cached / prompt tokens)', 'text-anchor="middle" font-size="13" font-weight="bold"'))
  const step = top > 0.5 ? 0.2 : top > 0.2 ? 0.1 : 0.05
  for (let v = 0; v <= top + 1e-9; v += step) {
    const y = yR(v)
    out.push(`<line x1="${BAR.x0}" y1="${r1(y)}" x2="${BAR.x1}" y2="${r1(y)}" stroke="#ddd"/>`)
    out.push(text(BAR.x0 - 6, y + 4, `${Math.round(v * 100)}%`, 'text-anchor="end"'))
  }
  const n = Math.max(1, input.series.length)
  const slot = (BAR.x1 - BAR.x0) / n
  input.series.forEach((s, i) => {
    const x = BAR.x0 + i * slot + slot * 0.15
    const w = slot * 0.7
    const v = s.hitRate ?? 0
    const y = yR(v)
    out.push(`<rect data-mode="${escapeXml(s.mode)}" x="${r1(x)}" y="${r1(y)}" width="${r1(w)}" height="${r1(BAR.y0 - y)}" fill="${modeColor(s.mode, i)}"/>`)
    out.push(text(x + w / 2, y - 5, s.hitRate === null ? 'n/a' : `${(v * 100).toFixed(1)}%`, 'text-anchor="middle"'))
    out.push(text(x + w / 2, BAR.y0 + 16, s.mode, 'text-anchor="middle"'))
  })
  if (input.bound !== null) {
    const y = yR(input.bound)
    out.push(`<line class="bound" x1="${BAR.x0}" y1="${r1(y)}" x2="${BAR.x1}" y2="${r1(y)}" stroke="#000" stroke-width="1.5" stroke-dasharray="6 4"/>`)
    out.push(text(BAR.x1 - 4, y - 6, `infinite-cache bound ${(input.bound * 100).toFixed(1)}%`, 'text-anchor="end" font-style="italic"'))
  }
  out.push(`<rect x="${BAR.x0}" y="${BAR.y1}" width="${BAR.x1 - BAR.x0}" height="${BAR.y0 - BAR.y1}" fill="none" stroke="#333"/>`)
  out.push(text((BAR.x0 + BAR.x1) / 2, BAR.y0 + 36, 'router mode', 'text-anchor="middle"'))
  out.push(`</g>`)
  out.push(`</svg>`)
  return `${out.join('\n')}\n`
}
