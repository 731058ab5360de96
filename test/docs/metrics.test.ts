// docs/metrics.md lists every metric the router registers once, and nothing else.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { parseServeConfig } from '../../src/config.js'
import { Router } from '../../src/core/router.js'

t.test('the table is the registry', async (t) => {
  const doc = readFileSync(new URL('../../docs/metrics.md', import.meta.url), 'utf8')
  const listed = [...doc.matchAll(/^\| `([a-z_:][a-z0-9_:]*)` \|/gm)].map((m) => m[1] as string)
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
