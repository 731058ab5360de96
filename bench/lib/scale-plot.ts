// The fleet-scale figure, as a hand-written SVG: each cost the router pays per request or per
// event against the number of worker-ranks, both axes logarithmic, so a cost that grows linearly
// with the fleet is a line of slope 1 and one that does not grow is flat.
import { escapeXml } from './e2e-plot.js'

const COLORS = ['#1b9e77', '#66c2a5', '#d95f02', '#fc8d62', '#7570b3', '#e7298a', '#a6761d', '#666666']

export interface ScaleSeries {
  name: string
  unit: string
  /** [worker-ranks, value] pairs; non-finite or non-positive values are left out. */
  points: readonly (readonly [number, number])[]
}

const W = 900
const H = 520
const P = { x0: 90, x1: 620, y0: 440, y1: 80 }
const r1 = (v: number): string => (Math.round(v * 10) / 10).toString()

function decades(lo: number, hi: number): number[] {
  const out: number[] = []
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) out.push(10 ** e)
  return out
}

export function renderScaleSvg(title: string, subtitle: string, series: readonly ScaleSeries[]): string {
  const pts = series.flatMap((s) => s.points.filter(([x, y]) => x > 0 && y > 0 && Number.isFinite(y)))
  const xs = pts.map(([x]) => x)
  const ys = pts.map(([, y]) => y)
  const xlo = Math.min(...xs, 8) / 1.5
  const xhi = Math.max(...xs, 16) * 1.5
  const ylo = Math.min(...ys, 1) / 2
  const yhi = Math.max(...ys, 10) * 2
  const X = (x: number): number => P.x0 + ((Math.log10(x) - Math.log10(xlo)) / (Math.log10(xhi) - Math.log10(xlo))) * (P.x1 - P.x0)
  const Y = (y: number): number => P.y0 - ((Math.log10(y) - Math.log10(ylo)) / (Math.log10(yhi) - Math.log10(ylo))) * (P.y0 - P.y1)
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="12">`,
    `<title>${escapeXml(title)}</title>`,
    `<rect x="0" y="0" width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2}" y="28" text-anchor="middle" font-size="16" font-weight="bold">${escapeXml(title)}</text>`,
    `<text x="${W / 2}" y="50" text-anchor="middle" fill="#444">${escapeXml(subtitle)}</text>`,
  ]
  for (const v of decades(ylo, yhi)) {
    if (v < ylo || v > yhi) continue
    out.push(`<line x1="${P.x0}" x2="${P.x1}" y1="${r1(Y(v))}" y2="${r1(Y(v))}" stroke="#ddd"/>`)
    out.push(`<text x="${P.x0 - 6}" y="${r1(Y(v) + 4)}" text-anchor="end">${v.toLocaleString('en-US')}</text>`)
  }
  const ticks = [...new Set(xs)].sort((a, b) => a - b)
  for (const v of ticks) {
    out.push(`<line x1="${r1(X(v))}" x2="${r1(X(v))}" y1="${P.y0}" y2="${P.y1}" stroke="#eee"/>`)
    out.push(`<text x="${r1(X(v))}" y="${P.y0 + 18}" text-anchor="middle">${v.toLocaleString('en-US')}</text>`)
  }
  out.push(`<rect x="${P.x0}" y="${P.y1}" width="${P.x1 - P.x0}" height="${P.y0 - P.y1}" fill="none" stroke="#888"/>`)
  out.push(`<text x="${(P.x0 + P.x1) / 2}" y="${P.y0 + 40}" text-anchor="middle">worker-ranks (log)</text>`)
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length] as string
    const ok = s.points.filter(([x, y]) => x > 0 && y > 0 && Number.isFinite(y))
    if (ok.length > 1)
      out.push(`<polyline fill="none" stroke="${color}" stroke-width="2" points="${ok.map(([x, y]) => `${r1(X(x))},${r1(Y(y))}`).join(' ')}"/>`)
    for (const [x, y] of ok) out.push(`<circle cx="${r1(X(x))}" cy="${r1(Y(y))}" r="3.5" fill="${color}"/>`)
    const ly = P.y1 + 10 + i * 22
    out.push(`<line x1="${P.x1 + 20}" x2="${P.x1 + 44}" y1="${ly}" y2="${ly}" stroke="${color}" stroke-width="2"/>`)
    out.push(`<text x="${P.x1 + 50}" y="${ly + 4}">${escapeXml(`${s.name} (${s.unit})`)}</text>`)
  })
  out.push('</svg>')
  return `${out.join('\n')}\n`
}
