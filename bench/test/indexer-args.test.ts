// bench:indexer's command line without its processes.
import t from 'tap'
import { ArgError, INDEXER_DEFAULTS, parseIndexerArgs } from '../lib/indexer.js'

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
