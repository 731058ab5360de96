// The e2e figure: a well-formed SVG (balanced tags, one root) with a CDF and a bar per mode.
import t from 'tap'
import { escapeXml, renderE2eSvg } from '../lib/e2e-plot.js'

/** Checks tag nesting with a stack; returns the element names in document order. */
function parseTags(svg: string): string[] {
  const names: string[] = []
  const stack: string[] = []
  // text and title content may hold anything escaped
  const body = svg.replace(/<(text|title)\b[^>]*>[^<]*<\/(text|title)>/g, (m) => m.replace(/>[^<]*</, '><'))
  for (const m of body.matchAll(/<(\/?)([a-zA-Z][\w-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>/g)) {
    const [, close, name, , self] = m as unknown as [string, string, string, string, string]
    if (close === '/') {
      const top = stack.pop()
      if (top !== name) throw new Error(`</${name}> closes <${top}>`)
    } else {
      names.push(name)
      if (self !== '/') stack.push(name)
    }
  }
  if (stack.length !== 0) throw new Error(`unclosed: ${stack.join(',')}`)
  // nothing but tags and whitespace outside them once every tag is removed
  const rest = body.replace(/<(\/?)([a-zA-Z][\w-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(\/?)>/g, '').trim()
  if (rest !== '') throw new Error(`stray text or malformed tag: ${rest.slice(0, 80)}`)
  return names
}

const modes = ['kv', 'round-robin', 'random', 'least-loaded']

t.test('one CDF line and one bar per mode, the bound line, axes and title', async (t) => {
  const series = modes.map((mode, i) => ({
    mode,
    ttftMs: Array.from({ length: 500 }, (_, k) => (k + 1) * (i + 1) * 3),
    hitRate: 0.3 - i * 0.05,
    note: `p90 ${i + 1}.5 s`,
  }))
  const svg = renderE2eSvg({ title: 'e2e: 8 workers <load ×4 & speed ×3>', subtitle: 'K = 1000', series, bound: 0.33, ttftLabel: 'TTFT, simulated ms' })
  const names = parseTags(svg)
  t.equal(names[0], 'svg')
  t.match(svg, /^<svg xmlns="http:\/\/www\.w3\.org\/2000\/svg"/)
  t.equal(names.filter((n) => n === 'svg').length, 1)
  for (const mode of modes) {
    t.match(svg, new RegExp(`<polyline data-mode="${mode}" points="[\\d., ]+"`), `${mode} has a CDF`)
    t.match(svg, new RegExp(`<rect data-mode="${mode}" `), `${mode} has a bar`)
    t.match(svg, new RegExp(`>${mode}</text>`), `${mode} is labelled`)
  }
  t.match(svg, />p90 1\.5 s<\/text>/, 'legend notes')
  t.match(svg, /class="bound"[^>]*stroke-dasharray/)
  t.match(svg, /infinite-cache bound 33\.0%/)
  t.match(svg, /e2e: 8 workers &lt;load ×4 &amp; speed ×3&gt;/, 'the title is escaped')
  t.equal(names[1], 'title', 'the SVG names itself for screen readers')
  t.match(svg, /<title>e2e: 8 workers &lt;load ×4 &amp; speed ×3&gt;<\/title>/)
  t.match(svg, /TTFT, simulated ms/)
  t.match(svg, />1 s<\/text>/, 'decade labels on the log axis')
  // a CDF ends at the share 1 (top of the panel) at its largest sample
  const pts = /<polyline data-mode="kv" points="([^"]+)"/.exec(svg)?.[1]?.split(' ') ?? []
  t.equal(pts.length, 300, 'downsampled to 300 points')
  t.equal(pts.at(-1)?.split(',')[1], '90')
})

t.test('a mode without data is drawn as such; no bound line when unknown', async (t) => {
  const svg = renderE2eSvg({
    title: 'x',
    series: [
      { mode: 'kv', ttftMs: [], hitRate: null },
      { mode: 'custom', ttftMs: [5], hitRate: 0.5 },
    ],
    bound: null,
  })
  parseTags(svg)
  t.notMatch(svg, /polyline data-mode="kv"/)
  t.match(svg, /kv \(no data\)/)
  t.match(svg, />n\/a</)
  t.match(svg, /polyline data-mode="custom"/)
  t.notMatch(svg, /class="bound"/)
  const none = renderE2eSvg({ title: 'empty', series: [], bound: 0.2 })
  t.same(
    parseTags(none).filter((n) => n === 'polyline'),
    [],
  )
})

t.test('the structure check itself rejects malformed documents', async (t) => {
  t.throws(() => parseTags('<svg><g></svg>'), /closes/)
  t.throws(() => parseTags('<svg><g>'), /unclosed/)
  t.throws(() => parseTags('<svg>stray</svg>'), /stray/)
  t.same(parseTags('<svg><g><line x1="1"/></g></svg>'), ['svg', 'g', 'line'])
})

t.test('escapeXml', async (t) => {
  t.equal(escapeXml('a<b>&"c"'), 'a&lt;b&gt;&amp;&quot;c&quot;')
})
