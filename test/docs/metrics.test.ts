// docs/metrics.md lists every metric the router registers once, and nothing else; its indexer section, the indexer's.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { parseServeConfig } from '../../src/config.js'
import { Router } from '../../src/core/router.js'
import { ShardPool } from '../../src/shards/pool.js'
import { IndexerRegistry } from '../../src/indexer/registry.js'
import { IndexerMetrics } from '../../src/indexer/metrics.js'
import { fromRoot } from '../helpers/paths.js'

const INDEXER_SECTION = '\n## kv-router indexer\n'

/** The metric names of a table's rows. */
function names(text: string): string[] {
  return [...text.matchAll(/^\| `([a-z_:][a-z0-9_:]*)` \|/gm)].map((m) => m[1] as string)
}

/** The router's part of the document, and the indexer's section. */
function parts(doc: string): { router: string; indexer: string } {
  const at = doc.indexOf(INDEXER_SECTION)
  if (at < 0) throw new Error('docs/metrics.md has no "## kv-router indexer" section')
  const end = doc.indexOf('\n## ', at + 1)
  return { router: doc.slice(0, at) + (end < 0 ? '' : doc.slice(end)), indexer: doc.slice(at, end < 0 ? undefined : end) }
}

t.test('the table is the registry', async (t) => {
  const doc = readFileSync(fromRoot('docs', 'metrics.md'), 'utf8')
  const listed = names(parts(doc).router)
  t.equal(new Set(listed).size, listed.length, 'each metric is listed once')
  // with a remote index, so that its series are registered too (nothing listens on port 9: its probe fails, harmlessly)
  const cfg = parseServeConfig(['--router-event-threads', '1', '--no-router-event-recovery', '--indexer-url', 'http://127.0.0.1:9'], {})
  if (cfg === 'help') throw new Error('unexpected help')
  const router = await Router.start(cfg)
  t.teardown(() => router.close())
  const registered = (await router.metrics.registry.getMetricsAsJSON()).map((m) => m.name)
  t.ok(registered.length > 40, 'the registry was read')
  t.same([...listed].sort(), [...registered].sort())
})

t.test("the indexer's section is the indexer's registry", async (t) => {
  const doc = readFileSync(fromRoot('docs', 'metrics.md'), 'utf8')
  const section = parts(doc).indexer
  // its own series in its table; the router's, named in its list, are documented above once
  const shared = [...section.matchAll(/^- `([a-z_:][a-z0-9_:]*)`/gm)].map((m) => m[1] as string)
  const routerListed = names(parts(doc).router)
  for (const n of shared) t.ok(routerListed.includes(n), `${n} is the router's, documented in its table`)
  const listed = [...names(section), ...shared]
  t.equal(new Set(listed).size, listed.length, 'each metric is listed once')
  const pool = await ShardPool.start({ shards: 1 })
  t.teardown(() => pool.close())
  const registered = (await new IndexerMetrics(new IndexerRegistry(pool), pool).registry.getMetricsAsJSON()).map((m) => m.name)
  t.ok(registered.length >= 5, 'the registry was read')
  t.same([...listed].sort(), [...registered].sort())
})
