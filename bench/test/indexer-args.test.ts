// bench:indexer's command line without its processes.
import t from 'tap'
import { ArgError, bucketQuantile, histogramBuckets, INDEXER_DEFAULTS, parseIndexerArgs } from '../lib/indexer.js'

t.test('parseIndexerArgs: defaults, both option forms, one message per mistake', async (t) => {
  t.same(parseIndexerArgs([]), INDEXER_DEFAULTS)
  const a = parseIndexerArgs(['--seconds', '5', '--workers=4', '--rate', '12.5', '--concurrency', '3', '--query-tokens=1024', '--threads', '2'])
  t.same([a.seconds, a.workers, a.rate, a.concurrency, a.queryTokens, a.threads, a.gpuBlocks], [5, 4, 12.5, 3, 1024, 2, INDEXER_DEFAULTS.gpuBlocks])
  t.throws(() => parseIndexerArgs(['--nope', '1']), /unknown option "--nope"/)
  t.ok(
    (() => {
      try {
        parseIndexerArgs(['--nope'])
      } catch (e) {
        return e instanceof ArgError
      }
      return false
    })(),
  )
  t.throws(() => parseIndexerArgs(['--seconds']), /--seconds needs a value/)
  t.throws(() => parseIndexerArgs(['--workers', '2.5']), /--workers must be a positive integer/)
  t.throws(() => parseIndexerArgs(['--rate', '0']), /--rate must be a positive number/)
  t.throws(() => parseIndexerArgs(['--rate', ' ']), /--rate must be a positive number/)
})

t.test('bucketQuantile: the bucket a quantile of the observations between two scrapes falls in', async (t) => {
  const scrape = (counts: number[]): string =>
    ['0.001', '0.002', '0.005', '+Inf'].map((le, i) => `x_seconds_bucket{le="${le}",route="query"} ${counts[i]}`).join('\n') + '\nx_seconds_count 1\n'
  const before = histogramBuckets(scrape([10, 10, 10, 10]), 'x_seconds', 'route="query"')
  t.equal(before.get(0.001), 10)
  // 100 more: 90 under 1 ms, 9 under 2 ms, 1 under 5 ms
  const after = histogramBuckets(scrape([100, 109, 110, 110]), 'x_seconds', 'route="query"')
  t.equal(bucketQuantile(before, after, 0.5), 0.001)
  t.equal(bucketQuantile(before, after, 0.99), 0.002)
  t.equal(bucketQuantile(before, after, 1), 0.005)
  t.equal(bucketQuantile(after, after, 0.5), null)
  t.equal(histogramBuckets(scrape([1, 2, 3, 4]), 'x_seconds', 'route="other"').size, 0)
})
