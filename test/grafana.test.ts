// deploy/grafana/kv-router.json against the registry the router builds: every PromQL expression
// (panels and template variables) names only series the code registers (a histogram only as its
// _bucket, _sum and _count), with label names those metrics have; the panels the dashboard is for
// are there; and it is a dashboard Grafana can lay out (unique ids, the data-source variable,
// panels inside the 24-column grid, none on top of another).
import t from 'tap'
import { readFileSync } from 'node:fs'
import { parseServeConfig } from '../src/config.js'
import { Router } from '../src/core/router.js'
import { fromRoot } from './helpers/paths.js'

interface Target {
  expr?: string
  refId: string
  datasource?: { uid?: string }
}
interface Panel {
  id: number
  type: string
  title: string
  gridPos: { h: number; w: number; x: number; y: number }
  datasource?: { type?: string; uid?: string }
  targets?: Target[]
  panels?: Panel[]
}
interface Dashboard {
  uid: string
  title: string
  panels: Panel[]
  templating: { list: { name: string; type: string; query?: string | { query: string }; definition?: string }[] }
}

const dash = JSON.parse(readFileSync(fromRoot('deploy', 'grafana', 'kv-router.json'), 'utf8')) as Dashboard
const panels = dash.panels.flatMap((p) => [p, ...(p.panels ?? [])])
const graphs = panels.filter((p) => p.type !== 'row')

/** The series names a Prometheus query can match in the router's /metrics, with their labels. */
async function registeredSeries(): Promise<Map<string, Set<string>>> {
  const cfg = parseServeConfig(['--router-event-threads', '1', '--no-router-event-recovery'], {})
  if (cfg === 'help') throw new Error('unexpected help')
  const router = await Router.start(cfg)
  try {
    const reg = router.metrics.registry
    const out = new Map<string, Set<string>>()
    for (const m of await reg.getMetricsAsJSON()) {
      const metric = reg.getSingleMetric(m.name) as unknown as { labelNames?: readonly string[] }
      const labels = new Set<string>([...(metric.labelNames ?? []), ...m.values.flatMap((v) => Object.keys(v.labels))])
      labels.delete('le')
      if (String(m.type) === 'histogram') {
        out.set(`${m.name}_bucket`, new Set([...labels, 'le']))
        out.set(`${m.name}_sum`, labels)
        out.set(`${m.name}_count`, labels)
      } else out.set(m.name, labels)
    }
    return out
  } finally {
    await router.close()
  }
}

/** Labels Prometheus adds to every scraped series. */
const TARGET_LABELS = ['instance', 'job']
const KEYWORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'bool', 'and', 'or', 'unless', 'offset', 'inf', 'nan'])

interface Selector {
  name: string
  matchers: string[]
}
/**
 * The series selectors of a PromQL expression, and the label names of its grouping clauses: the
 * subset of the language the dashboard uses (functions, aggregations with by, binary operators,
 * selectors with matchers, range vectors).
 */
function parse(expr: string): { selectors: Selector[]; grouping: string[] } {
  const text = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""').replace(/\[[^\]]*\]/g, '')
  const grouping: string[] = []
  const rest = text.replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g, (_m, _k, labels: string) => {
    for (const l of labels.split(',')) if (l.trim() !== '') grouping.push(l.trim())
    return ' '
  })
  const selectors: Selector[] = []
  // selectors with matchers first (a brace with no name before it selects by labels alone)
  const bare = rest.replace(/([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}/g, (_m, name: string | undefined, inner: string) => {
    selectors.push({ name: name ?? '(no metric name)', matchers: [...inner.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)/g)].map((x) => x[1] as string) })
    return ' '
  })
  // then names alone: those followed by a parenthesis are functions or aggregations
  for (const m of bare.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?/g)) {
    const name = m[1] as string
    if (m[2] === undefined && !KEYWORDS.has(name.toLowerCase())) selectors.push({ name, matchers: [] })
  }
  return { selectors, grouping }
}

const exprs: { where: string; expr: string }[] = [
  ...graphs.flatMap((p) => (p.targets ?? []).map((x) => ({ where: `${p.title} ${x.refId}`, expr: x.expr ?? '' }))),
  ...dash.templating.list
    .filter((v) => v.type === 'query')
    .map((v) => {
      const q = typeof v.query === 'string' ? v.query : (v.query?.query ?? '')
      // label_values(metric, label): the metric as a selector, the label as a grouping
      const lv = /^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$/.exec(q)
      return { where: `variable ${v.name}`, expr: lv === null ? q : `sum by (${lv[2]}) (${lv[1]})` }
    }),
]

t.test('the parser reads what the dashboard writes', async (t) => {
  const p = parse('histogram_quantile(0.9, sum by (le) (rate(a_bucket{instance=~"$x",b!="c}"}[$__rate_interval]))) / on (d) group_left max(e)')
  t.same(
    p.selectors.map((s) => s.name),
    ['a_bucket', 'e'],
  )
  t.same(p.selectors[0]?.matchers, ['instance', 'b'])
  t.same(p.grouping, ['le', 'd'])
  t.same(
    parse('{job="x"}').selectors.map((s) => s.name),
    ['(no metric name)'],
  )
})

t.test('every expression names series the router registers, with their labels', async (t) => {
  const series = await registeredSeries()
  t.ok(series.size > 60, 'the registry was read')
  t.ok(exprs.length > 30, `${exprs.length} expressions`)
  const used = new Set<string>()
  for (const { where, expr } of exprs) {
    t.ok(expr.length > 0, `${where} has an expression`)
    const { selectors, grouping } = parse(expr)
    t.ok(selectors.length > 0, `${where} selects a series`)
    const labels = new Set<string>(TARGET_LABELS)
    for (const s of selectors) {
      used.add(s.name)
      const known = series.get(s.name)
      if (known === undefined) {
        t.fail(`${where}: ${s.name} is not a series the router exposes`)
        continue
      }
      for (const l of known) labels.add(l)
      for (const m of s.matchers) t.ok(known.has(m) || TARGET_LABELS.includes(m), `${where}: ${s.name} has label ${m}`)
    }
    for (const g of grouping) t.ok(labels.has(g), `${where}: grouped by ${g}, a label of what it reads`)
  }
  // what the dashboard is for (issue #39): each of these is read by some panel
  for (const name of [
    'dynamo_component_router_requests_total',
    'dynamo_component_router_time_to_first_token_seconds_bucket',
    'dynamo_component_router_inter_token_latency_seconds_bucket',
    'dynamo_component_router_kv_hit_rate_sum',
    'dynamo_component_router_kv_hit_rate_count',
    'dynamo_frontend_worker_active_decode_blocks',
    'dynamo_frontend_worker_active_prefill_tokens',
    'kvrouter_worker_cached_blocks',
    'dynamo_frontend_router_queue_pending_requests',
    'dynamo_component_kv_cache_events_applied',
    'kvrouter_events_dropped_total',
    'kvrouter_index_recovery_total',
    'kvrouter_shard_event_gaps_total',
  ])
    t.ok(used.has(name), `a panel reads ${name}`)
})

t.test('a dashboard Grafana can lay out', async (t) => {
  t.equal(dash.uid, 'kv-router')
  const ids = panels.map((p) => p.id)
  t.same(ids, [...new Set(ids)], 'panel ids are unique')
  const dsVar = dash.templating.list.find((v) => v.type === 'datasource')
  t.equal(dsVar?.query, 'prometheus', 'a Prometheus data-source variable')
  for (const p of graphs) {
    t.equal(p.datasource?.uid, `\${${dsVar?.name}}`, `${p.title}: reads the chosen data source`)
    t.ok((p.targets ?? []).length > 0, `${p.title}: has queries`)
  }
  for (const p of panels) {
    const g = p.gridPos
    t.ok(g.x >= 0 && g.w > 0 && g.x + g.w <= 24 && g.h > 0 && g.y >= 0, `${p.title}: inside the 24-column grid`)
  }
  for (let i = 0; i < panels.length; i++)
    for (let j = i + 1; j < panels.length; j++) {
      const a = (panels[i] as Panel).gridPos
      const b = (panels[j] as Panel).gridPos
      const overlap = a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h
      t.notOk(overlap, `${panels[i]?.title} and ${panels[j]?.title} do not overlap`)
    }
})
